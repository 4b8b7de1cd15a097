//! Kept requests as spans, encoded as an OTLP `ExportTraceServiceRequest` in protobuf
//! (opentelemetry-proto's `collector/trace/v1` and `trace/v1`): the few messages and fields
//! Tern sends, written by hand. A request's spans are written where it ends (the `spans` of a
//! `ScopeSpans`, which concatenate); the exporter puts the [`Envelope`] in front of a batch.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use http::Version;

use super::record::{PHASES, Record, route_of};
use super::span::{CallKind, span_id};

/// A protobuf message being written.
#[derive(Default)]
pub(super) struct Pb(pub Vec<u8>);

const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;

impl Pb {
    #[inline(always)]
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }

    #[inline(always)]
    fn key(&mut self, field: u32, wire: u8) {
        self.varint(u64::from(field << 3 | u32::from(wire)));
    }

    #[inline(always)]
    fn bytes(&mut self, field: u32, b: &[u8]) {
        self.key(field, LEN);
        self.varint(b.len() as u64);
        self.0.extend_from_slice(b);
    }

    #[inline(always)]
    fn string(&mut self, field: u32, s: &str) {
        self.bytes(field, s.as_bytes());
    }

    /// A string field made of `parts`, written one after another.
    #[inline(always)]
    fn string_of(&mut self, field: u32, parts: &[&str]) {
        self.key(field, LEN);
        self.varint(parts.iter().map(|p| p.len() as u64).sum());
        for p in parts {
            self.0.extend_from_slice(p.as_bytes());
        }
    }

    #[inline(always)]
    fn uint(&mut self, field: u32, v: u64) {
        self.key(field, VARINT);
        self.varint(v);
    }

    #[inline(always)]
    fn fixed64(&mut self, field: u32, v: u64) {
        self.key(field, FIXED64);
        self.0.extend_from_slice(&v.to_le_bytes());
    }

    /// A length-delimited sub-message written by `f`, most likely shorter than 128 bytes.
    fn message(&mut self, field: u32, f: impl FnOnce(&mut Self)) {
        self.message_in(field, 1, f);
    }

    /// A length-delimited sub-message written by `f`. Its length goes before it: `room` bytes
    /// are kept for it (1 for a body shorter than 128 bytes, 2 for one shorter than 16 KiB),
    /// and only a body whose length needs another count of bytes is moved, once.
    #[inline(always)]
    fn message_in(&mut self, field: u32, room: usize, f: impl FnOnce(&mut Self)) {
        self.key(field, LEN);
        let at = self.0.len();
        self.0.resize(at + room, 0);
        f(self);
        let end = self.0.len();
        let mut len = (end - at - room) as u64;
        let need = varint_len(len) as usize;
        if need > room {
            self.0.resize(end + need - room, 0);
            self.0.copy_within(at + room..end, at + need);
        } else if need < room {
            self.0.copy_within(at + room..end, at + need);
            self.0.truncate(end - (room - need));
        }
        let mut i = at;
        while len >= 0x80 {
            self.0[i] = (len as u8) | 0x80;
            len >>= 7;
            i += 1;
        }
        self.0[i] = len as u8;
    }

    /// A `KeyValue` (field `field`) with a string value.
    #[inline(always)]
    fn attr(&mut self, field: u32, key: &str, value: &str) {
        self.attr_of(field, key, &[value]);
    }

    /// A `KeyValue` with a string value made of `parts`. Its lengths are known before it is
    /// written: no room kept and filled in afterwards.
    #[inline(always)]
    fn attr_of(&mut self, field: u32, key: &str, parts: &[&str]) {
        let value: u64 = parts.iter().map(|p| p.len() as u64).sum();
        // AnyValue { string_value (1) }
        let any = 1 + varint_len(value) + value;
        self.key_value(field, key, any);
        self.string_of(1, parts);
    }

    /// A `KeyValue` with an integer value.
    #[inline(always)]
    fn attr_int(&mut self, field: u32, key: &str, value: i64) {
        // AnyValue { int_value (3) }
        let any = 1 + varint_len(value as u64);
        self.key_value(field, key, any);
        self.uint(3, value as u64);
    }

    /// The head of a `KeyValue` named `key` up to its value, an `AnyValue` of `any` bytes that
    /// the caller writes next.
    #[inline(always)]
    fn key_value(&mut self, field: u32, key: &str, any: u64) {
        let key_len = key.len() as u64;
        let kv = 1 + varint_len(key_len) + key_len + 1 + varint_len(any) + any;
        self.0.reserve(kv as usize + 5);
        self.key(field, LEN);
        self.varint(kv);
        self.string(1, key);
        self.key(2, LEN);
        self.varint(any);
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
    /// The name, in parts (`GET`, ` `, `/shop`).
    name: &'a [&'a str],
    kind: Kind,
    start: u64,
    end: u64,
}

/// Writes one span (field 2 of `ScopeSpans`): its head, then what `rest` adds (attributes
/// field 9, events 11, status 15); `room` bytes kept for its length (see [`Pb::message_in`]).
fn span(out: &mut Pb, head: &Head<'_>, room: usize, rest: impl FnOnce(&mut Pb)) {
    out.message_in(2, room, |s| {
        s.bytes(1, head.trace_id);
        s.bytes(2, &head.span_id);
        if let Some(ts) = head.trace_state {
            s.string(3, ts);
        }
        if let Some(p) = head.parent {
            s.bytes(4, &p);
        }
        s.string_of(5, head.name);
        s.uint(6, head.kind as u64);
        s.fixed64(7, head.start);
        s.fixed64(8, head.end.max(head.start));
        rest(s);
    });
}

/// Writes a span with no trace state, attributes, events or status (a phase's): the same
/// bytes as [`span`] writes, at fixed places, at once.
fn plain_span(out: &mut Pb, head: &Head<'_>) {
    let [name] = head.name else {
        return span(out, head, 1, |_| {});
    };
    let (Some(parent), None, n @ ..64) = (head.parent, head.trace_state, name.len()) else {
        return span(out, head, 1, |_| {});
    };
    let at = out.0.len();
    out.0.resize(at + 62 + n, 0);
    let b = &mut out.0[at..];
    b[..2].copy_from_slice(&[2 << 3 | LEN, 60 + n as u8]);
    b[2..4].copy_from_slice(&[1 << 3 | LEN, 16]);
    b[4..20].copy_from_slice(head.trace_id);
    b[20..22].copy_from_slice(&[2 << 3 | LEN, 8]);
    b[22..30].copy_from_slice(&head.span_id);
    b[30..32].copy_from_slice(&[4 << 3 | LEN, 8]);
    b[32..40].copy_from_slice(&parent);
    b[40..42].copy_from_slice(&[5 << 3 | LEN, n as u8]);
    b[42..42 + n].copy_from_slice(name.as_bytes());
    let b = &mut b[42 + n..];
    b[..3].copy_from_slice(&[6 << 3 | VARINT, head.kind as u8, 7 << 3 | FIXED64]);
    b[3..11].copy_from_slice(&head.start.to_le_bytes());
    b[11] = 8 << 3 | FIXED64;
    b[12..20].copy_from_slice(&head.end.max(head.start).to_le_bytes());
}

fn error_status(s: &mut Pb, message: &str) {
    s.message(15, |st| {
        if !message.is_empty() {
            st.string(2, message);
        }
        st.uint(3, STATUS_ERROR);
    });
}

/// Wall-clock nanoseconds of a request's moments, placed after its arrival (whose wall time is
/// its end's less how long it took).
struct Clock {
    arrived: Instant,
    wall: u64,
}

fn nanos(d: Duration) -> u64 {
    d.as_secs()
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::from(d.subsec_nanos()))
}

impl Clock {
    fn new(arrived: Instant, (took, end): (Duration, SystemTime)) -> Self {
        let end = end.duration_since(UNIX_EPOCH).map_or(0, nanos);
        Self {
            arrived,
            wall: end.saturating_sub(nanos(took)),
        }
    }

    /// `d` after arrival.
    fn after(&self, d: Duration) -> u64 {
        self.wall.saturating_add(nanos(d))
    }

    /// At `i` (a call's start or end).
    fn at(&self, i: Instant) -> u64 {
        self.after(i.saturating_duration_since(self.arrived))
    }
}

/// `ip` as text (an IPv4-mapped IPv6 address as IPv4), written into `buf`; IPv4 addresses
/// digit by digit (the formatting machinery costs more than the rest of a span).
fn ip_text(ip: std::net::IpAddr, buf: &mut [u8; 48]) -> &str {
    use std::io::Write;
    let n = match ip.to_canonical() {
        std::net::IpAddr::V4(v4) => {
            let mut n = 0;
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    buf[n] = b'.';
                    n += 1;
                }
                if octet >= 100 {
                    buf[n] = b'0' + octet / 100;
                    n += 1;
                }
                if octet >= 10 {
                    buf[n] = b'0' + octet / 10 % 10;
                    n += 1;
                }
                buf[n] = b'0' + octet % 10;
                n += 1;
            }
            n
        }
        v6 => {
            let mut w = &mut buf[..];
            let _ = write!(w, "{v6}");
            48 - w.len()
        }
    };
    std::str::from_utf8(&buf[..n]).unwrap_or_default()
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

/// What goes in front of a batch of spans to make it an `ExportTraceServiceRequest`: one
/// `ResourceSpans` (the resource's attributes) holding one `ScopeSpans` (scope `tern`) whose
/// `spans` are the batch.
#[derive(Debug)]
pub(super) struct Envelope {
    /// `ResourceSpans.resource`, with its key and length.
    resource: Vec<u8>,
    /// `ScopeSpans.scope`, with its key and length.
    scope: Vec<u8>,
}

impl Envelope {
    pub(super) fn new(resource: &[(String, String)]) -> Self {
        let mut r = Pb::default();
        r.message(1, |r| {
            for (k, v) in resource {
                r.attr(1, k, v);
            }
        });
        let mut s = Pb::default();
        s.message(1, |scope| {
            scope.string(1, "tern");
            scope.string(2, env!("CARGO_PKG_VERSION"));
        });
        Self {
            resource: r.0,
            scope: s.0,
        }
    }

    /// The room a batch keeps in front of its spans for the envelope: its bytes and two keys
    /// with the longest lengths.
    pub(super) fn reserve(&self) -> usize {
        self.resource.len() + self.scope.len() + 2 * (1 + 10)
    }

    /// Writes the envelope into the room [`Self::reserve`] kept in front of the spans in
    /// `batch`, right before them; answers where the request begins.
    pub(super) fn wrap(&self, batch: &mut [u8]) -> usize {
        let reserve = self.reserve();
        let spans = (batch.len() - reserve) as u64;
        let scope_spans = self.scope.len() as u64 + spans;
        let resource_spans = self.resource.len() as u64 + 1 + varint_len(scope_spans) + scope_spans;
        let mut head = Pb(Vec::with_capacity(reserve));
        head.key(1, LEN);
        head.varint(resource_spans);
        head.0.extend_from_slice(&self.resource);
        head.key(2, LEN);
        head.varint(scope_spans);
        head.0.extend_from_slice(&self.scope);
        let at = reserve - head.0.len();
        batch[at..reserve].copy_from_slice(&head.0);
        at
    }
}

fn varint_len(v: u64) -> u64 {
    u64::from((64 - (v | 1).leading_zeros()).div_ceil(7))
}

/// Writes the spans of one request (`ScopeSpans.spans` entries); returns how many.
pub(super) fn request_spans(out: &mut Pb, r: &Record) -> usize {
    let a = &r.active;
    let clock = Clock::new(r.arrived, r.end);
    let calls = a.take_calls();
    let method = r.method.as_str();
    let route = r
        .tenant
        .as_ref()
        .map(|(_, prefix_len)| route_of(r.uri.path(), *prefix_len));
    let with_route;
    let name: &[&str] = match route {
        Some(route) => {
            with_route = [method, " ", route];
            &with_route
        }
        None => std::slice::from_ref(&method),
    };
    let server = Head {
        trace_id: &a.trace_id,
        span_id: a.server_span,
        trace_state: a.tracestate.as_ref().and_then(|t| t.to_str().ok()),
        parent: a.parent,
        name,
        kind: Kind::Server,
        start: clock.after(Duration::ZERO),
        end: clock.after(r.end.0),
    };
    // The server span is longer than 127 bytes, shorter than 16 KiB: room for a 2-byte length.
    span(out, &server, 2, |s| {
        s.attr(9, "http.request.method", method);
        s.attr(9, "url.path", r.uri.path());
        s.attr(9, "url.scheme", r.scheme);
        s.attr_int(9, "http.response.status_code", i64::from(r.status));
        s.attr(9, "network.protocol.version", protocol(r.version));
        let mut ip = [0u8; 48];
        s.attr(9, "client.address", ip_text(r.client.ip(), &mut ip));
        s.attr_int(9, "client.port", i64::from(r.client.port()));
        if let Some(ua) = r.user_agent.as_ref().and_then(|v| v.to_str().ok()) {
            s.attr(9, "user_agent.original", ua);
        }
        match &r.request_id {
            Some(id) => s.attr(9, "tern.request_id", id.to_str().unwrap_or_default()),
            None => s.attr(9, "tern.request_id", a.trace_id_text()),
        }
        if let (Some((t, _)), Some(route)) = (&r.tenant, route) {
            s.attr(9, "http.route", route);
            s.attr(9, "tern.tenant", t.name());
            s.attr(9, "tern.tenant.version", t.version());
            s.attr(9, "tern.guest.kind", t.kind());
        }
        if let Some(cache) = r.cache_status.as_ref().and_then(|v| v.to_str().ok()) {
            s.attr(9, "tern.cache_status", cache);
        }
        if r.trigger != crate::trigger::Trigger::Request {
            s.attr(9, "tern.trigger", r.trigger.name());
        }
        if let Some((code, bytes)) = r.websocket {
            s.attr_int(9, "tern.websocket.close_code", i64::from(code));
            s.attr_int(
                9,
                "tern.websocket.bytes_sent",
                i64::try_from(bytes).unwrap_or(i64::MAX),
            );
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
            name: std::slice::from_ref(&PHASES[i]),
            kind: Kind::Internal,
            start: clock.after(*start),
            end: clock.after(*end),
        };
        match &r.failure {
            Some((outcome, message)) if is_run => span(out, &head, 1, |s| {
                error_status(s, &format!("{outcome}: {message}"));
            }),
            _ => plain_span(out, &head),
        }
        n += 1;
    }
    for call in &calls.spans {
        let (op_name, kv_name);
        let name: &[&str] = match &call.what {
            CallKind::Outbound { method, .. } => {
                op_name = method.as_str();
                std::slice::from_ref(&op_name)
            }
            CallKind::Kv { store, op, .. } => {
                kv_name = [*op, " ", store.as_str()];
                &kv_name
            }
        };
        let head = Head {
            trace_id: &a.trace_id,
            span_id: call.span_id,
            trace_state: None,
            parent: Some(a.run_span),
            name,
            kind: Kind::Client,
            start: clock.at(call.start),
            end: clock.at(call.end),
        };
        span(out, &head, 1, |s| match &call.what {
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
                let full = [
                    url.scheme_str().unwrap_or("http"),
                    "://",
                    url.authority().map_or("", |a| a.as_str()),
                    url.path(),
                ];
                s.attr_of(9, "url.full", &full);
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
    fn attributes_written_with_known_lengths_are_the_nested_messages() {
        for n in [0, 1, 110, 127, 128, 200, 20_000] {
            let value = "v".repeat(n);
            let mut direct = Pb::default();
            direct.attr(9, "a.key", &value);
            let mut nested = Pb::default();
            nested.message(9, |kv| {
                kv.string(1, "a.key");
                kv.message(2, |v| v.string(1, &value));
            });
            assert_eq!(direct.0, nested.0, "a value of {n} bytes");
        }
        for i in [0i64, 1, 127, 128, 300, -1, i64::MAX] {
            let mut direct = Pb::default();
            direct.attr_int(9, "n", i);
            let mut nested = Pb::default();
            nested.message(9, |kv| {
                kv.string(1, "n");
                kv.message(2, |v| v.uint(3, i as u64));
            });
            assert_eq!(direct.0, nested.0, "{i}");
        }
        for v in [0u64, 1, 127, 128, 16_383, 16_384, u64::MAX] {
            let mut p = Pb::default();
            p.varint(v);
            assert_eq!(p.0.len() as u64, varint_len(v), "{v}");
        }
    }

    #[test]
    fn lengths_kept_in_two_bytes_are_moved_only_when_they_must_be() {
        for n in [0, 1, 125, 126, 127, 128, 16_380, 16_381, 16_382, 20_000] {
            let mut one = Pb::default();
            one.message_in(3, 1, |m| m.0.extend(std::iter::repeat_n(7u8, n)));
            let mut two = Pb(vec![9]);
            two.message_in(3, 2, |m| m.0.extend(std::iter::repeat_n(7u8, n)));
            assert_eq!(two.0[0], 9);
            assert_eq!(one.0, two.0[1..], "a body of {n} bytes");
            assert_eq!(
                one.0.len() as u64,
                1 + varint_len(n as u64) + n as u64,
                "minimal length of {n}"
            );
        }
    }

    #[test]
    fn phase_spans_written_at_once_are_the_spans() {
        let trace_id = [0xabu8; 16];
        for (i, name) in PHASES
            .iter()
            .chain(&[
                "",
                "a-name-of-sixty-three-bytes-long-enough-to-test-the-limit-here!",
            ])
            .enumerate()
        {
            let head = Head {
                trace_id: &trace_id,
                span_id: span_id(),
                trace_state: None,
                parent: Some(span_id()),
                name: &[name],
                kind: Kind::Internal,
                start: 1_700_000_000_000_000_000 + i as u64,
                // An end before the start is written as the start, both ways.
                end: if i == 1 { 5 } else { u64::MAX - i as u64 },
            };
            let mut fast = Pb::default();
            plain_span(&mut fast, &head);
            let mut slow = Pb::default();
            span(&mut slow, &head, 1, |_| {});
            assert_eq!(fast.0, slow.0, "{name}");
        }
    }

    #[test]
    fn addresses_read_as_their_display() {
        for ip in [
            "0.0.0.0",
            "10.1.2.3",
            "127.0.0.1",
            "192.168.100.255",
            "9.99.100.199",
            "::1",
            "2001:db8::8a2e:370:7334",
        ] {
            let ip: std::net::IpAddr = ip.parse().unwrap();
            let mut buf = [0u8; 48];
            assert_eq!(ip_text(ip, &mut buf), ip.to_string());
        }
        let mapped: std::net::IpAddr = "::ffff:10.0.0.7".parse().unwrap();
        assert_eq!(ip_text(mapped, &mut [0u8; 48]), "10.0.0.7");
    }

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
