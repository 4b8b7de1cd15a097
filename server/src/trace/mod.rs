//! Traces: every request's phases as OpenTelemetry spans, joined with the caller's trace.
//!
//! Nothing new is timed during a request: the front end already keeps when each phase began
//! and ended. A request only gets its ids (the trace's, continued from an incoming W3C
//! `traceparent` or new, and the ids of its server and `run` spans, which guests and backends
//! see) and, when its guest calls a backend or a key-value store, one record per call. When the
//! request ends, the [`Tracer`] decides whether to keep it (head sampling, parent-based with a
//! ratio, then tail rules: errors and slow requests are kept whatever the head decided); a kept
//! request becomes one [`Record`], encoded at once as OTLP protobuf spans into its thread's
//! buffer (`queue`, `otlp`), and the exporter task posts the buffers in batches to the
//! collector (`export`). A full queue drops the request's spans and counts them; nothing
//! waits.

mod config;
mod export;
mod otlp;
mod queue;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

pub use config::{Sampler, Settings, TracingConfig};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Uri, Version};
use queue::Queue;

/// W3C trace context: the trace a request belongs to and the span that sent it.
pub static TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
/// W3C trace context: vendors' trace state, passed on unchanged.
pub static TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// Most calls (outbound requests, key-value operations) recorded as spans per request; the
/// rest are counted on the server span (`tern.spans_dropped`).
pub const MAX_CALL_SPANS: usize = 128;

/// A caller's span context from a `traceparent` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parent {
    /// The trace.
    pub trace_id: [u8; 16],
    /// The caller's span.
    pub span_id: [u8; 8],
    /// The caller sampled it (trace flag `01`).
    pub sampled: bool,
}

/// Parses a W3C `traceparent` (`00-<trace id>-<parent id>-<flags>`, lower-case hex; a later
/// version may append fields after another `-`). `None` for anything malformed, version `ff`,
/// or all-zero ids: the request then starts a new trace.
pub fn parse_traceparent(v: &[u8]) -> Option<Parent> {
    if v.len() < 55 || (v.len() > 55 && (v[55] != b'-' || &v[..2] == b"00")) {
        return None;
    }
    let [version] = crate::hex::decode::<1>(&v[0..2])?;
    if version == 0xff || v[2] != b'-' || v[35] != b'-' || v[52] != b'-' {
        return None;
    }
    let trace_id = crate::hex::decode::<16>(&v[3..35])?;
    let span_id = crate::hex::decode::<8>(&v[36..52])?;
    let [flags] = crate::hex::decode::<1>(&v[53..55])?;
    if trace_id == [0; 16] || span_id == [0; 8] {
        return None;
    }
    Some(Parent {
        trace_id,
        span_id,
        sampled: flags & 1 == 1,
    })
}

/// A new span id (never all zeros).
pub fn span_id() -> [u8; 8] {
    loop {
        let id = crate::random_u64();
        if id != 0 {
            return id.to_be_bytes();
        }
    }
}

fn trace_id() -> [u8; 16] {
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&crate::random_u64().to_be_bytes());
    id[8..].copy_from_slice(&span_id());
    id
}

/// One traced request while it runs: its ids, and the calls its guest made.
#[derive(Debug)]
pub struct Active {
    /// The trace (the caller's, or new).
    pub trace_id: [u8; 16],
    /// `trace_id` in hex, written once: the request id, the access line and the spans use it.
    trace_hex: [u8; 32],
    /// The caller's span, when the request came with a valid `traceparent`.
    pub parent: Option<[u8; 8]>,
    /// The request's server span.
    pub server_span: [u8; 8],
    /// The guest's `run` span: the parent guests see, and of the calls they make.
    pub run_span: [u8; 8],
    /// The head sampling decision (the flag passed on).
    pub sampled: bool,
    /// The caller's `tracestate`, passed on unchanged.
    pub tracestate: Option<HeaderValue>,
    calls: Mutex<Calls>,
}

#[derive(Debug, Default)]
struct Calls {
    spans: Vec<Call>,
    dropped: u32,
}

/// A call the guest made, recorded as a span under its `run` span.
#[derive(Debug)]
pub struct Call {
    /// The span's id (for an outbound request, the parent the backend saw).
    pub span_id: [u8; 8],
    /// When it began and ended.
    pub start: Instant,
    /// See `start`.
    pub end: Instant,
    /// What it was.
    pub what: CallKind,
}

/// The kinds of calls.
#[derive(Debug)]
pub enum CallKind {
    /// An outbound HTTP request (a client span), until its response head.
    Outbound {
        /// The request's method.
        method: Method,
        /// The URL asked for.
        url: Uri,
        /// The backend's name (`url` for URL requests).
        backend: Arc<str>,
        /// The response's status, or why there was none.
        result: Result<u16, String>,
    },
    /// A key-value operation.
    Kv {
        /// The store's name.
        store: String,
        /// Its backend (`sqlite`, `redis`).
        system: &'static str,
        /// The operation (`get`, `set`, ...).
        op: &'static str,
        /// Why it failed, if it did.
        error: Option<String>,
    },
}

impl Active {
    /// A request of trace `trace_id` (its caller's span `parent`), head decision `sampled`.
    fn new(
        trace_id: [u8; 16],
        parent: Option<[u8; 8]>,
        sampled: bool,
        tracestate: Option<HeaderValue>,
    ) -> Self {
        let mut trace_hex = [0u8; 32];
        crate::hex::encode_into(&trace_id, &mut trace_hex);
        Self {
            trace_id,
            trace_hex,
            parent,
            server_span: span_id(),
            run_span: span_id(),
            sampled,
            tracestate,
            calls: Mutex::new(Calls::default()),
        }
    }

    /// The `traceparent` of span `span` of this trace, with this request's sampling flag.
    pub fn traceparent(&self, span: [u8; 8]) -> HeaderValue {
        let mut v = *b"00-00000000000000000000000000000000-0000000000000000-00";
        v[3..35].copy_from_slice(&self.trace_hex);
        crate::hex::encode_into(&span, &mut v[36..52]);
        if self.sampled {
            v[54] = b'1';
        }
        HeaderValue::from_bytes(&v).expect("hex is a valid header value")
    }

    /// The trace id as hex.
    pub fn trace_id_hex(&self) -> &[u8; 32] {
        &self.trace_hex
    }

    /// The trace id as hex text.
    pub fn trace_id_text(&self) -> &str {
        std::str::from_utf8(&self.trace_hex).expect("hex is ASCII")
    }

    /// The trace id as a header value (the request id of a request that came without one).
    pub fn trace_id_header(&self) -> HeaderValue {
        HeaderValue::from_bytes(&self.trace_hex).expect("hex is a valid header value")
    }

    /// Records a call the guest made.
    pub fn record(&self, call: Call) {
        let mut calls = self
            .calls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if calls.spans.len() < MAX_CALL_SPANS {
            calls.spans.push(call);
        } else {
            calls.dropped += 1;
        }
    }

    /// Sets the trace headers a guest sees or a backend gets: `traceparent` naming `span` as
    /// the parent, and the caller's `tracestate` (a stale one removed).
    pub fn stamp(&self, headers: &mut HeaderMap, span: [u8; 8]) {
        headers.insert(TRACEPARENT.clone(), self.traceparent(span));
        match &self.tracestate {
            Some(ts) => {
                headers.insert(TRACESTATE.clone(), ts.clone());
            }
            None => {
                headers.remove(&TRACESTATE);
            }
        }
    }

    fn take_calls(&self) -> Calls {
        std::mem::take(
            &mut *self
                .calls
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }
}

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

/// The request side of tracing: ids and sampling per request, the bounded queue to the
/// exporter.
#[derive(Debug)]
pub struct Tracer {
    sampler: Sampler,
    keep_errors: bool,
    keep_slower_than: Option<Duration>,
    queue: Arc<Queue>,
    dropped: prometheus::IntCounter,
}

/// The metric handles of tracing.
#[derive(Debug, Clone)]
pub struct TraceMetrics {
    /// Spans the collector accepted.
    pub exported: prometheus::IntCounter,
    /// Spans dropped because the queue was full.
    pub dropped_queue: prometheus::IntCounter,
    /// Spans dropped because their batch could not be exported.
    pub dropped_export: prometheus::IntCounter,
}

impl Tracer {
    /// Starts the exporter task (on the current runtime) and returns the tracer of the
    /// request path, and the exporter's handle. When `stop` fires the exporter goes on
    /// exporting until `in_flight` (requests not yet answered) is zero or `grace` has passed.
    pub fn start(
        settings: Settings,
        metrics: TraceMetrics,
        stop: crate::shutdown::Shutdown,
        in_flight: prometheus::IntGauge,
        grace: Duration,
    ) -> (Arc<Self>, tokio::task::JoinHandle<()>) {
        let envelope = otlp::Envelope::new(&settings.resource);
        let queue = Arc::new(Queue::new(
            settings.max_queue,
            settings.max_batch,
            envelope.reserve(),
        ));
        let tracer = Arc::new(Self {
            sampler: settings.sampler,
            keep_errors: settings.keep_errors,
            keep_slower_than: settings.keep_slower_than,
            queue: queue.clone(),
            dropped: metrics.dropped_queue.clone(),
        });
        let draining = export::Draining { in_flight, grace };
        let task = tokio::spawn(export::run(
            settings, envelope, queue, metrics, stop, draining,
        ));
        (tracer, task)
    }

    /// A request with `headers` begins: continue the caller's trace (a valid `traceparent`)
    /// or start one, and make the head sampling decision.
    pub fn begin(&self, headers: &HeaderMap) -> Arc<Active> {
        let parent = headers
            .get(&TRACEPARENT)
            .and_then(|v| parse_traceparent(v.as_bytes()));
        let (trace_id, parent_span, sampled) = match parent {
            Some(p) => (
                p.trace_id,
                Some(p.span_id),
                self.sampler.decide(&p.trace_id, Some(p.sampled)),
            ),
            None => {
                let id = trace_id();
                (id, None, self.sampler.decide(&id, None))
            }
        };
        Arc::new(Active::new(
            trace_id,
            parent_span,
            sampled,
            parent.and_then(|_| headers.get(&TRACESTATE).cloned()),
        ))
    }

    /// Whether a request that ended with `status` after `total` is kept: sampled at its
    /// head, or an error (a 5xx, or a guest that `failed`: trapped, passed its deadline or a
    /// limit) or slow, when those are kept.
    pub fn keeps(&self, active: &Active, status: u16, failed: bool, total: Duration) -> bool {
        active.sampled
            || (self.keep_errors && (failed || status >= 500))
            || self.keep_slower_than.is_some_and(|slow| total >= slow)
    }

    /// Queues a kept request's spans for export; when the queue is full they are dropped and
    /// counted.
    pub fn submit(&self, record: &Record) {
        if let Err(spans) = self.queue.push(record) {
            self.dropped.inc_by(spans as u64);
        }
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparents_parse_as_w3c_says() {
        let ok = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let p = parse_traceparent(ok).expect("valid");
        assert_eq!(
            crate::hex::encode(&p.trace_id),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(crate::hex::encode(&p.span_id), "00f067aa0ba902b7");
        assert!(p.sampled);
        let unsampled = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
        assert!(!parse_traceparent(unsampled).unwrap().sampled);
        // A later version may carry more fields; version 00 may not.
        let later = b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra";
        assert!(parse_traceparent(later).is_some());
        for bad in [
            &b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra"[..],
            b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            b"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            b"00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            b"",
        ] {
            assert_eq!(
                parse_traceparent(bad),
                None,
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    /// A sampled request of a new trace.
    pub(super) fn active() -> Active {
        Active::new(trace_id(), None, true, None)
    }

    /// A key-value `get` the guest made just now.
    pub(super) fn kv_get() -> Call {
        let now = Instant::now();
        Call {
            span_id: span_id(),
            start: now,
            end: now,
            what: CallKind::Kv {
                store: "default".into(),
                system: "sqlite",
                op: "get",
                error: None,
            },
        }
    }

    #[test]
    fn a_traceparent_round_trips() {
        let active = active();
        let tp = active.traceparent(active.run_span);
        let p = parse_traceparent(tp.as_bytes()).expect("ours parse");
        assert_eq!(p.trace_id, active.trace_id);
        assert_eq!(p.span_id, active.run_span);
        assert!(p.sampled);
        assert_ne!(span_id(), span_id());
    }

    #[test]
    fn calls_past_the_cap_are_counted_not_kept() {
        let active = active();
        for _ in 0..MAX_CALL_SPANS + 3 {
            active.record(kv_get());
        }
        let calls = active.take_calls();
        assert_eq!((calls.spans.len(), calls.dropped), (MAX_CALL_SPANS, 3));
    }
}
