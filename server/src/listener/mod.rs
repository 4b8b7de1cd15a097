//! The listeners: every transport hands the front end its requests. TCP ([`tcp`]: HTTP/1.1
//! and HTTP/2, over TLS or not) through hyper, HTTP/3 over QUIC ([`quic`]); what they share
//! ([`options`]: limits, timeouts, the connection cap, a request task's panic caught), the
//! `Alt-Svc` advertisement of HTTP/3 ([`alt_svc`]) and an HTTP/1 connection's header-read
//! timer ([`head_timer`]).

mod alt_svc;
mod head_timer;
mod options;
pub mod quic;
mod tcp;

pub use alt_svc::AltSvc;
pub use options::{Caught, ListenOptions, caught};
pub use tcp::{Prefixed, serve};
