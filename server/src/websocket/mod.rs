//! WebSockets through a server that makes a fresh instance per request, two ways (a tenant's
//! `[tenant.websocket] mode`):
//!
//! - **handoff** (the default): a guest looks at the opening request (its path, its headers,
//!   who asks) and hands the connection to one of its tenant's backends; the guest is then
//!   done, and Tern holds the two sockets and relays the frames both ways ([`relay`]) under
//!   the tenant's `[tenant.websocket]` limits.
//! - **events** ([`session`]): Tern terminates the WebSocket ([`endpoint`] reads and writes
//!   its frames) and sends each batch of its events to the guest as a request, in Pushpin's
//!   WebSocket-over-HTTP format ([`events`]); the guest subscribes connections to channels,
//!   and publishes reach them ([`channels`]).
//!
//! - **Opening** ([`opening`]): an HTTP/1.1 `GET` with `Upgrade: websocket` (RFC 6455 §4), or
//!   an HTTP/2 extended `CONNECT` with `:protocol = websocket` (RFC 8441). Every guest sees
//!   both as the same `GET` with `Upgrade: websocket`. Openings pass the rate limits like any
//!   request, never the cache; a tenant or the server at its connection limit answers `503`
//!   before a guest runs.
//! - **Handoff** ([`handoff`]): the guest's answer names a backend of its tenant in a
//!   [`HANDOFF`] header (the Tern ABI's `handoff_websocket` sets it, after checking the name;
//!   components and CGI programs answer with it); the other headers of its answer go to the
//!   backend with the client's request (an identity it checked, say). Tern opens the backend's
//!   WebSocket, and only when the backend accepts does the client get its `101` (or `200` over
//!   HTTP/2); otherwise `502`.
//! - **Relay** ([`relay`]): frames pass as they came (masking, extensions such as
//!   permessage-deflate are the two ends' business); their heads are read on the way, for
//!   the limits (message size, a client's frame rate, idle time, lifetime), the counts and the
//!   close code. Shutdown sends each open connection a `1001` close.

pub mod channels;
pub mod config;
mod endpoint;
mod events;
mod frame;
mod handoff;
mod opening;
mod relay;
mod session;
mod sockets;

pub use channels::{Hub, Push, Target};
pub use config::{Mode, WebsocketConfig};
pub use handoff::{Client, Failed, Handoff, Tenant, WhenClosed, handoff};
pub use opening::{BadOpening, HandoffTo, Opening, is_opening, opening};
pub use session::{Origin, Refused, Session, start as start_events};
pub use sockets::{Full, Place, Sockets};

pub use crate::body::HANDOFF;
