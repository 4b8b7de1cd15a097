//! A finished request the tracer kept: what its spans are written from.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use http::{HeaderValue, Method, Uri, Version};

use super::span::Active;

/// A finished request the tracer kept, as its spans are written from.
#[derive(Debug)]
pub struct Record {
    /// Its ids and calls.
    pub active: Arc<Active>,
    /// When it arrived.
    pub arrived: Instant,
    /// When it ended: how long after it arrived, and the wall-clock time then (span times are
    /// wall-clock times, placed back from this one).
    pub end: (Duration, SystemTime),
    /// The request line.
    pub method: Method,
    /// See `method`.
    pub uri: Uri,
    /// The HTTP version.
    pub version: Version,
    /// `http` or `https`.
    pub scheme: &'static str,
    /// The client's address.
    pub client: SocketAddr,
    /// Its `User-Agent`.
    pub user_agent: Option<HeaderValue>,
    /// The response status.
    pub status: u16,
    /// The request id, when it is not the trace id (a client's own).
    pub request_id: Option<HeaderValue>,
    /// The tenant it was routed to, and the length of the route prefix it matched.
    pub tenant: Option<(Arc<dyn SpanTenant>, usize)>,
    /// Phases it reached: queue, instantiate, run, teardown (start and end, after it
    /// arrived).
    pub phases: [Option<(Duration, Duration)>; 4],
    /// How the guest failed: its outcome's name and the message.
    pub failure: Option<(&'static str, String)>,
    /// What the tenant's cache did (its `Cache-Status`), when it has one.
    pub cache_status: Option<HeaderValue>,
    /// The request opened a WebSocket: its close code and the bytes sent to the client (the
    /// span then lasts until the connection closed).
    pub websocket: Option<(u16, u64)>,
    /// What made it: a scheduled run's span says `tern.trigger = "schedule"`.
    pub trigger: crate::trigger::Trigger,
}

/// What the server span says of the tenant a request was routed to (the tenant itself, so a
/// kept request costs no copies of these).
pub trait SpanTenant: Send + Sync + std::fmt::Debug {
    /// Its name.
    fn name(&self) -> &str;
    /// The version serving (`config` for a tenant of the config file).
    fn version(&self) -> &str;
    /// The guest kind.
    fn kind(&self) -> &'static str;
}

/// The names of the phase spans, in `Record::phases` order.
pub const PHASES: [&str; 4] = ["queue", "instantiate", "run", "teardown"];

impl Record {
    /// How many spans this record makes (the calls not yet taken are counted too).
    pub fn span_count(&self) -> usize {
        let calls = self.active.calls.lock().map_or(0, |c| c.spans.len());
        1 + self.phases.iter().flatten().count() + calls
    }
}

/// The first `n` bytes of `path` (the tenant's route prefix), `/` for none.
pub fn route_of(path: &str, n: usize) -> &str {
    path.get(..n).filter(|p| !p.is_empty()).unwrap_or("/")
}
