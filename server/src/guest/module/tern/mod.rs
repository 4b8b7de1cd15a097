//! The `tern` guest kind: Tern's own ABI v1, a core module importing from `tern`.
//!
//! One file per interface of the ABI (guest-sdk/ABI.md): [`request`] (what the guest reads),
//! [`response`] (what it writes), [`outbound`] (the requests it sends), [`kv`] (its
//! key-value stores), [`config`] (its tenant's variables), [`cache`] (its own entries in
//! its tenant's cache), [`rate`] (its tenant's rate counters and penalty boxes) and
//! [`websocket`] (publishes to its tenant's WebSocket connections). Each maps the shared request, response and outbound errors to the
//! ABI's errnos. The store state, the linker and
//! the driver are the core modules' ([`crate::guest::module`]); the CGI kind links these
//! functions too.

pub mod cache;
pub mod config;
pub mod handles;
pub mod kv;
pub mod outbound;
pub mod rate;
pub mod request;
pub mod response;
pub mod websocket;

pub use cache::{CacheEntries, CacheView};
pub use config::ConfigView;
pub use kv::{Kv, KvView};
pub use outbound::{Outbound, OutboundCalls, OutboundView};
pub use rate::RateView;
pub use request::RequestView;
pub use response::ResponseView;
pub use websocket::WebsocketView;

/// The handles a request holds through the `tern` ABI's interfaces, a table each (a new
/// interface with handles adds its own here).
#[derive(Default)]
pub struct Tables {
    /// Outbound requests.
    pub outbound: Outbound,
    /// Open key-value stores.
    pub kv: Kv,
    /// Cache entries looked up.
    pub cache: CacheEntries,
    /// The message of the last rate counter or penalty box call that failed (they have no
    /// handles).
    pub rate_error: String,
    /// The message of the last publish that failed.
    pub websocket_error: String,
}

use wasmtime::Linker;

/// Adds the `tern` ABI v1 functions of the request and the response to a core module linker
/// (those of the capabilities, [`outbound`] and [`kv`], are linked by
/// [`crate::guest::link`]).
///
/// # Errors
/// Only if wasmtime rejects a definition (a bug).
pub fn add_to_linker<T: RequestView + ResponseView>(
    linker: &mut Linker<T>,
) -> wasmtime::Result<()> {
    request::add_to_linker(linker)?;
    response::add_to_linker(linker)
}
