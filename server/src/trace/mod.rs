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
mod record;
mod span;

use std::sync::Arc;
use std::time::Duration;

pub use config::{Sampler, Settings, TracingConfig};
pub use export::TraceMetrics;
use http::HeaderMap;
use queue::Queue;
pub use record::{PHASES, Record, SpanTenant, route_of};
use span::trace_id;
pub use span::{
    Active, Call, CallKind, MAX_CALL_SPANS, Parent, TRACEPARENT, TRACESTATE, parse_traceparent,
    span_id,
};

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

impl Tracer {
    /// Starts the exporter task (on the current runtime) and returns the tracer of the
    /// request path, and the exporter's handle. When `stop` fires the exporter goes on
    /// exporting until `in_flight` (the requests not yet answered, read) is zero or `grace` has
    /// passed.
    pub fn start(
        settings: Settings,
        metrics: TraceMetrics,
        stop: crate::shutdown::Shutdown,
        in_flight: impl Fn() -> i64 + Send + Sync + 'static,
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
        let draining = export::Draining {
            in_flight: Box::new(in_flight),
            grace,
        };
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

#[cfg(test)]
mod tests {
    use std::time::Instant;

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
