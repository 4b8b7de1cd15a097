//! A request's trace context: W3C `traceparent`, its ids, and the calls its guest made, kept
//! while it runs.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use http::{HeaderMap, HeaderName, HeaderValue, Method, Uri};

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

pub(super) fn trace_id() -> [u8; 16] {
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
    pub(super) calls: Mutex<Calls>,
}

/// The calls a request's guest made, as spans (at most [`MAX_CALL_SPANS`]; the rest counted).
#[derive(Debug, Default)]
pub(super) struct Calls {
    pub(super) spans: Vec<Call>,
    pub(super) dropped: u32,
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
    pub(super) fn new(
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

    pub(super) fn take_calls(&self) -> Calls {
        std::mem::take(
            &mut *self
                .calls
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }
}
