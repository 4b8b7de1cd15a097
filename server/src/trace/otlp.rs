//! Kept requests as spans, encoded as an OTLP `ExportTraceServiceRequest` in protobuf
//! (opentelemetry-proto's `collector/trace/v1` and `trace/v1`): the few messages and fields
//! Tern sends, written by hand, off the request path.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use http::Version;

use super::{CallKind, PHASES, Record, span_id};

/// A protobuf message being written.
#[derive(Default)]
struct Pb(Vec<u8>);

const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;

impl Pb {
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }

    fn key(&mut self, field: u32, wire: u8) {
        self.varint(u64::from(field << 3 | u32::from(wire)));
    }

    fn bytes(&mut self, field: u32, b: &[u8]) {
        self.key(field, LEN);
        self.varint(b.len() as u64);
        self.0.extend_from_slice(b);
    }

    fn string(&mut self, field: u32, s: &str) {
        self.bytes(field, s.as_bytes());
    }

    fn uint(&mut self, field: u32, v: u64) {
        self.key(field, VARINT);
        self.varint(v);
    }

    fn fixed64(&mut self, field: u32, v: u64) {
        self.key(field, FIXED64);
        self.0.extend_from_slice(&v.to_le_bytes());
    }

    /// A length-delimited sub-message written by `f`. Its length goes before it: one byte is
    /// kept for it (most sub-messages are shorter than 128 bytes), and only a longer one moves
    /// its body to make room for the rest of the varint.
    fn message(&mut self, field: u32, f: impl FnOnce(&mut Self)) {
        self.key(field, LEN);
        let at = self.0.len();
        self.0.push(0);
        f(self);
        let mut len = (self.0.len() - at - 1) as u64;
        let mut prefix = [0u8; 10];
        let mut n = 0;
        while len >= 0x80 {
            prefix[n] = (len as u8) | 0x80;
            len >>= 7;
            n += 1;
        }
        prefix[n] = len as u8;
        self.0[at] = prefix[0];
        if n > 0 {
            self.0.splice(at + 1..at + 1, prefix[1..=n].iter().copied());
        }
    }

    /// A `KeyValue` (field `field`) with a string value.
    fn attr(&mut self, field: u32, key: &str, value: &str) {
        self.message(field, |kv| {
            kv.string(1, key);
            kv.message(2, |v| v.string(1, value));
        });
    }

    /// A `KeyValue` with an integer value.
    fn attr_int(&mut self, field: u32, key: &str, value: i64) {
        self.message(field, |kv| {
            kv.string(1, key);
            kv.message(2, |v| v.uint(3, value as u64));
        });
    }
}

/// `Span.SpanKind`.
#[derive(Clone, Copy)]
enum Kind {
    Internal = 1,
    Server = 2,
    Client = 3,
}

/// `Status.StatusCode`: error.
const STATUS_ERROR: u64 = 2;

/// The fields every span has.
struct Head<'a> {
    trace_id: &'a [u8; 16],
    span_id: [u8; 8],
    /// The W3C `tracestate` (the server span's: the caller's, passed on).
    trace_state: Option<&'a str>,
    parent: Option<[u8; 8]>,
    name: &'a str,
    kind: Kind,
    start: u64,
    end: u64,
}

/// Writes one span (field 2 of `ScopeSpans`): its head, then what `rest` adds (attributes
/// field 9, events 11, status 15).
fn span(out: &mut Pb, head: &Head<'_>, rest: impl FnOnce(&mut Pb)) {
    out.message(2, |s| {
        s.bytes(1, head.trace_id);
        s.bytes(2, &head.span_id);
        if let Some(ts) = head.trace_state {
            s.string(3, ts);
        }
        if let Some(p) = head.parent {
            s.bytes(4, &p);
        }
        s.string(5, head.name);
        s.uint(6, head.kind as u64);
        s.fixed64(7, head.start);
        s.fixed64(8, head.end.max(head.start));
        rest(s);
    });
}

fn error_status(s: &mut Pb, message: &str) {
    s.message(15, |st| {
        if !message.is_empty() {
            st.string(2, message);
        }
        st.uint(3, STATUS_ERROR);
    });
}

/// Wall-clock nanoseconds of instants, placed relative to one instant whose wall time is known.
struct Clock {
    at: Instant,
    wall: u64,
}

impl Clock {
    fn new(at: Instant, wall: SystemTime) -> Self {
        let wall = wall
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Self { at, wall }
    }

    fn nanos(&self, i: Instant) -> u64 {
        if i <= self.at {
            self.wall.saturating_sub((self.at - i).as_nanos() as u64)
        } else {
            self.wall + (i - self.at).as_nanos() as u64
        }
    }
}

fn protocol(v: Version) -> &'static str {
    match v {
        Version::HTTP_09 => "0.9",
        Version::HTTP_10 => "1.0",
        Version::HTTP_2 => "2",
        Version::HTTP_3 => "3",
        _ => "1.1",
    }
}

/// The `ExportTraceServiceRequest` of `records` with the resource attributes `resource`, and
/// the number of spans in it.
pub fn encode(records: &[Record], resource: &[(String, String)]) -> (Vec<u8>, usize) {
    // About 1 KiB per request of 5 spans: sized once, not grown (and copied) as it fills.
    let mut out = Pb(Vec::with_capacity(512 + records.len() * 1536));
    let mut spans = 0;
    out.message(1, |rs| {
        rs.message(1, |r| {
            for (k, v) in resource {
                r.attr(1, k, v);
            }
        });
        rs.message(2, |ss| {
            ss.message(1, |scope| {
                scope.string(1, "tern");
                scope.string(2, env!("CARGO_PKG_VERSION"));
            });
            for record in records {
                spans += request_spans(ss, record);
            }
        });
    });
    (out.0, spans)
}

/// Writes the spans of one request; returns how many.
fn request_spans(out: &mut Pb, r: &Record) -> usize {
    let a = &r.active;
    let clock = Clock::new(r.end.0, r.end.1);
    let calls = a.take_calls();
    let method = r.method.as_str();
    let route = r
        .tenant
        .as_ref()
        .map(|(_, prefix_len)| super::route_of(r.uri.path(), *prefix_len));
    let name = match &route {
        Some(route) => format!("{method} {route}"),
        None => method.to_string(),
    };
    let server = Head {
        trace_id: &a.trace_id,
        span_id: a.server_span,
        trace_state: a.tracestate.as_ref().and_then(|t| t.to_str().ok()),
        parent: a.parent,
        name: &name,
        kind: Kind::Server,
        start: clock.nanos(r.arrived),
        end: clock.nanos(r.end.0),
    };
    span(out, &server, |s| {
        s.attr(9, "http.request.method", method);
        s.attr(9, "url.path", r.uri.path());
        s.attr(9, "url.scheme", r.scheme);
        s.attr_int(9, "http.response.status_code", i64::from(r.status));
        s.attr(9, "network.protocol.version", protocol(r.version));
        s.attr(
            9,
            "client.address",
            &r.client.ip().to_canonical().to_string(),
        );
        s.attr_int(9, "client.port", i64::from(r.client.port()));
        if let Some(ua) = r.user_agent.as_ref().and_then(|v| v.to_str().ok()) {
            s.attr(9, "user_agent.original", ua);
        }
        match &r.request_id {
            Some(id) => s.attr(9, "tern.request_id", id.to_str().unwrap_or_default()),
            None => s.attr(9, "tern.request_id", &super::hex(&a.trace_id)),
        }
        if let (Some((t, _)), Some(route)) = (&r.tenant, &route) {
            s.attr(9, "http.route", route);
            s.attr(9, "tern.tenant", t.name());
            s.attr(9, "tern.tenant.version", t.version());
            s.attr(9, "tern.guest.kind", t.kind());
        }
        if calls.dropped > 0 {
            s.attr_int(9, "tern.spans_dropped", i64::from(calls.dropped));
        }
        if let Some((outcome, message)) = &r.failure {
            s.attr(9, "tern.outcome", outcome);
            s.message(11, |e| {
                e.fixed64(1, server.end);
                e.string(2, outcome);
                e.attr(3, "message", message);
            });
        }
        if r.status >= 500 {
            error_status(s, r.failure.as_ref().map_or("", |(_, m)| m.as_str()));
        }
    });
    let mut n = 1;
    for (i, phase) in r.phases.iter().enumerate() {
        let Some((start, end)) = phase else { continue };
        let is_run = PHASES[i] == "run";
        let head = Head {
            trace_id: &a.trace_id,
            span_id: if is_run { a.run_span } else { span_id() },
            trace_state: None,
            parent: Some(a.server_span),
            name: PHASES[i],
            kind: Kind::Internal,
            start: clock.nanos(*start),
            end: clock.nanos(*end),
        };
        span(out, &head, |s| {
            if is_run && let Some((outcome, message)) = &r.failure {
                error_status(s, &format!("{outcome}: {message}"));
            }
        });
        n += 1;
    }
    for call in &calls.spans {
        let (name, kind) = match &call.what {
            CallKind::Outbound { method, .. } => (method.as_str().to_string(), Kind::Client),
            CallKind::Kv { store, op, .. } => (format!("{op} {store}"), Kind::Client),
        };
        let head = Head {
            trace_id: &a.trace_id,
            span_id: call.span_id,
            trace_state: None,
            parent: Some(a.run_span),
            name: &name,
            kind,
            start: clock.nanos(call.start),
            end: clock.nanos(call.end),
        };
        span(out, &head, |s| match &call.what {
            CallKind::Outbound {
                method,
                url,
                backend,
                result,
            } => {
                s.attr(9, "http.request.method", method.as_str());
                if let Some(host) = url.host() {
                    s.attr(9, "server.address", host);
                }
                if let Some(port) = url.port_u16() {
                    s.attr_int(9, "server.port", i64::from(port));
                }
                let full = format!(
                    "{}://{}{}",
                    url.scheme_str().unwrap_or("http"),
                    url.authority().map_or("", |a| a.as_str()),
                    url.path()
                );
                s.attr(9, "url.full", &full);
                s.attr(9, "tern.backend", backend);
                match result {
                    Ok(status) => {
                        s.attr_int(9, "http.response.status_code", i64::from(*status));
                        if *status >= 400 {
                            error_status(s, "");
                        }
                    }
                    Err(why) => {
                        s.attr(9, "error.type", "tern.outbound");
                        error_status(s, why);
                    }
                }
            }
            CallKind::Kv {
                store,
                system,
                op,
                error,
            } => {
                s.attr(9, "db.system.name", system);
                s.attr(9, "db.namespace", store);
                s.attr(9, "db.operation.name", op);
                if let Some(why) = error {
                    s.attr(9, "error.type", "tern.kv");
                    error_status(s, why);
                }
            }
        });
        n += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_and_lengths_are_protobufs() {
        let mut p = Pb::default();
        p.varint(300);
        assert_eq!(p.0, [0xac, 0x02]);
        let mut p = Pb::default();
        // A sub-message longer than 127 bytes gets a two-byte length.
        p.message(1, |m| m.bytes(2, &[7u8; 200]));
        assert_eq!(&p.0[..3], &[0x0a, 0xcb, 0x01]);
        assert_eq!(p.0.len(), 3 + 3 + 200);
        // A short one, a one-byte length; a long one, three, and its body intact.
        let mut p = Pb::default();
        p.message(1, |m| m.bytes(2, &[7u8; 2]));
        assert_eq!(p.0, [0x0a, 0x04, 0x12, 0x02, 7, 7]);
        let mut p = Pb::default();
        p.message(1, |m| m.bytes(2, &[7u8; 20_000]));
        let (mut len, mut shift, mut i) = (0usize, 0, 1);
        loop {
            let b = p.0[i];
            len |= usize::from(b & 0x7f) << shift;
            shift += 7;
            i += 1;
            if b < 0x80 {
                break;
            }
        }
        assert_eq!(i, 4, "a three-byte length");
        assert_eq!(len, p.0.len() - i);
        assert_eq!(&p.0[i..i + 4], &[0x12, 0xa0, 0x9c, 0x01]);
        assert!(p.0[i + 4..].iter().all(|&b| b == 7));
    }
}
