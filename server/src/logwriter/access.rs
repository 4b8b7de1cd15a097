//! The per-request access line: what it holds ([`AccessRecord`]) and its fast format
//! ([`AccessSink`]), which reads as `tracing_subscriber`'s text or JSON line.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use super::LogWriter;
use crate::decimal::bytes as decimal;

/// The target of the per-request access line.
pub const ACCESS_TARGET: &str = "tern::access";

/// What an access line says of the tenant that served a request.
pub trait Named: Send + Sync {
    /// The tenant's name.
    fn name(&self) -> &str;

    /// The version that answered (12 digits), if the tenant has versions.
    fn version(&self) -> Option<&str> {
        None
    }
}

/// One request's access line: gathered as the request goes (only when access lines are on:
/// [`access_enabled`]) and written when its response ends — its body sent, cut short, or
/// never sent — so it can say how many body bytes left and how long the whole exchange took.
#[derive(Clone)]
pub struct AccessRecord {
    /// The request id (the `x-request-id` response header).
    pub request_id: http::HeaderValue,
    /// The tenant it was routed to, if any.
    pub tenant: Option<std::sync::Arc<dyn Named>>,
    /// The method.
    pub method: http::Method,
    /// The target as the client sent it (its path; the query with `with_query`).
    pub target: http::Uri,
    /// Whether the query string is written (`[server] access_log_query`).
    pub with_query: bool,
    /// The HTTP version.
    pub version: http::Version,
    /// The host asked for (`Host`, or the target's authority).
    pub host: Option<http::HeaderValue>,
    /// The connection's peer, as the listener saw it.
    pub remote: std::net::SocketAddr,
    /// The client: the peer, or the address a trusted proxy forwarded.
    pub client: std::net::IpAddr,
    /// `User-Agent`.
    pub user_agent: Option<http::HeaderValue>,
    /// `Referer`.
    pub referer: Option<http::HeaderValue>,
    /// The trace id (hex), when the request is traced.
    pub trace_id: Option<[u8; 32]>,
    /// When it arrived.
    pub arrived: std::time::Instant,
    /// The response status (set when the head is ready).
    pub status: u16,
    /// What made it: a scheduled run's line says `trigger=schedule` (a client's says nothing).
    pub trigger: crate::trigger::Trigger,
}

/// Whether access lines are written (the log filter lets `tern::access` through at info): one
/// check per request, so a server logging none gathers nothing.
pub fn access_enabled() -> bool {
    tracing::enabled!(target: ACCESS_TARGET, tracing::Level::INFO)
}

/// A header value as text for the log (a value that is not UTF-8 is left out).
fn header_text(v: Option<&http::HeaderValue>) -> Option<&str> {
    v.and_then(|v| std::str::from_utf8(v.as_bytes()).ok())
}

impl AccessRecord {
    /// Writes the line (target [`ACCESS_TARGET`], level info): `bytes` of body sent, and
    /// whether the body reached its end (`incomplete=true` when it did not). Through the
    /// process's [`AccessSink`] when [`subscriber`](super::subscriber) installed one
    /// (formatted here, directly), else as an ordinary `tracing` event with the same fields.
    pub fn write(&self, bytes: u64, complete: bool) {
        let total_us = u64::try_from(self.arrived.elapsed().as_micros()).unwrap_or(u64::MAX);
        if let Some(sink) = &*ACCESS_SINK.load() {
            LINE.with_borrow_mut(|line| {
                line.clear();
                line.reserve(1024);
                sink.format(line, self, bytes, complete, total_us);
                sink.writer.append(line);
            });
            return;
        }
        self.event(bytes, complete, total_us);
    }

    /// The line as an ordinary `tracing` event, for a process without an [`AccessSink`].
    fn event(&self, bytes: u64, complete: bool, total_us: u64) {
        tracing::info!(
            target: ACCESS_TARGET,
            request_id = self.request_id.to_str().unwrap_or("-"),
            tenant = self.tenant.as_ref().map_or("-", |t| t.name()),
            tenant_version = self.tenant.as_ref().and_then(|t| t.version()),
            method = self.method.as_str(),
            path = self.path(),
            version = self.version_text(),
            host = header_text(self.host.as_ref()),
            client = %self.client,
            remote = %self.remote,
            status = self.status,
            bytes,
            total_ms = total_us as f64 / 1e3,
            user_agent = header_text(self.user_agent.as_ref()),
            referer = header_text(self.referer.as_ref()),
            trace_id = self.trace_id.as_ref().and_then(|t| std::str::from_utf8(t).ok()),
            incomplete = (!complete).then_some(true),
            trigger = (self.trigger != crate::trigger::Trigger::Request).then(|| self.trigger.name()),
            "request"
        );
    }

    /// The path as sent, with the query when it is to be written.
    fn path(&self) -> &str {
        if self.with_query {
            self.target
                .path_and_query()
                .map_or(self.target.path(), |pq| pq.as_str())
        } else {
            self.target.path()
        }
    }

    fn version_text(&self) -> &'static str {
        match self.version {
            http::Version::HTTP_09 => "HTTP/0.9",
            http::Version::HTTP_10 => "HTTP/1.0",
            http::Version::HTTP_11 => "HTTP/1.1",
            http::Version::HTTP_2 => "HTTP/2.0",
            http::Version::HTTP_3 => "HTTP/3.0",
            _ => "HTTP",
        }
    }
}

thread_local! {
    /// The line being formatted (kept, so a line costs no allocation).
    static LINE: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Where access lines go, and in which format: set by [`subscriber`].
static ACCESS_SINK: arc_swap::ArcSwapOption<AccessSink> = arc_swap::ArcSwapOption::const_empty();

/// The writer and format of the process's access lines. They are formatted by
/// [`AccessSink::format`] directly, not field by field through `tracing`'s visitors (2.5x
/// the cost for the fifteen fields of a line), and read exactly as `tracing_subscriber`'s
/// text or JSON format writes an event (same prefix, field order and quoting).
pub struct AccessSink {
    writer: LogWriter,
    json: bool,
    ansi: bool,
}

/// One field of a line being written: its separator and name, then its value.
struct Line<'a> {
    out: &'a mut Vec<u8>,
    json: bool,
    first: bool,
}

/// Appends `bytes` to `out`: short pieces (most of a line's) byte by byte, which costs less
/// than a call to `memcpy`.
#[inline]
fn put(out: &mut Vec<u8>, bytes: &[u8]) {
    if bytes.len() <= 16 {
        for &b in bytes {
            out.push(b);
        }
    } else {
        out.extend_from_slice(bytes);
    }
}

impl Line<'_> {
    #[inline(always)]
    fn key(&mut self, name: &str) {
        let first = std::mem::take(&mut self.first);
        if self.json {
            if !first {
                self.out.push(b',');
            }
            self.out.push(b'"');
            put(self.out, name.as_bytes());
            self.out.push(b'"');
            self.out.push(b':');
        } else {
            self.out.push(b' ');
            put(self.out, name.as_bytes());
            self.out.push(b'=');
        }
    }

    /// A text field: quoted and escaped (`Debug` in text, a JSON string in JSON).
    #[inline(always)]
    fn str(&mut self, name: &str, value: &[u8]) {
        self.key(name);
        quoted(self.out, value, self.json);
    }

    /// A field that is a number or a word: as it is (quoted in JSON when `quote`).
    #[inline(always)]
    fn raw(&mut self, name: &str, value: &[u8], quote: bool) {
        self.key(name);
        let q = quote && self.json;
        if q {
            self.out.push(b'"');
        }
        put(self.out, value);
        if q {
            self.out.push(b'"');
        }
    }

    #[inline(always)]
    fn num(&mut self, name: &str, n: u64) {
        let mut digits = [0u8; 20];
        let text = decimal(n, &mut digits);
        self.raw(name, text, false);
    }
}

/// `value` quoted: as `Debug` writes a `str` (text), or as a JSON string. Bytes that are not
/// UTF-8 (a header value may hold any) are written as `String::from_utf8_lossy` gives them.
fn quoted(out: &mut Vec<u8>, value: &[u8], json: bool) {
    // Printable ASCII but `"` and `\\`: what needs no escaping, the common case (checked
    // without an early exit, which lets the compiler check many bytes at once).
    let plain = value.iter().fold(true, |ok, &b| {
        ok & (b.wrapping_sub(b' ') < 95) & (b != b'"') & (b != b'\\')
    });
    out.push(b'"');
    if plain {
        out.extend_from_slice(value);
    } else {
        let text = String::from_utf8_lossy(value);
        if json {
            let mut s = String::new();
            let _ = write!(JsonEscape(&mut s), "{text}");
            out.extend_from_slice(s.as_bytes());
        } else {
            let debugged = format!("{text:?}");
            out.extend_from_slice(&debugged.as_bytes()[1..debugged.len() - 1]);
        }
    }
    out.push(b'"');
}

/// An IP address as `Display` writes it (IPv4 digit by digit; IPv6 through `Display`).
fn ip_text(out: &mut Vec<u8>, ip: std::net::IpAddr) {
    match ip {
        std::net::IpAddr::V4(v4) => {
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push(b'.');
                }
                let mut d = [0u8; 20];
                out.extend_from_slice(decimal(u64::from(octet), &mut d));
            }
        }
        std::net::IpAddr::V6(v6) => {
            let _ = std::io::Write::write_fmt(out, format_args!("{v6}"));
        }
    }
}

impl AccessSink {
    /// Formats `r`'s line into `out`.
    fn format(
        &self,
        out: &mut Vec<u8>,
        r: &AccessRecord,
        bytes: u64,
        complete: bool,
        total_us: u64,
    ) {
        if self.json {
            out.extend_from_slice(b"{\"timestamp\":\"");
            timestamp(out);
            out.extend_from_slice(b"\",\"level\":\"INFO\",\"fields\":{\"message\":\"request\"");
        } else if self.ansi {
            out.extend_from_slice(b"\x1b[2m");
            timestamp(out);
            out.extend_from_slice(
                b"\x1b[0m \x1b[32m INFO\x1b[0m \x1b[2mtern::access\x1b[0m\x1b[2m:\x1b[0m request",
            );
        } else {
            timestamp(out);
            out.extend_from_slice(b"  INFO tern::access: request");
        }
        let mut l = Line {
            out,
            json: self.json,
            first: false,
        };
        l.str("request_id", r.request_id.as_bytes());
        let tenant = r.tenant.as_ref().map_or("-", |t| t.name());
        l.str("tenant", tenant.as_bytes());
        if let Some(v) = r.tenant.as_ref().and_then(|t| t.version()) {
            l.str("tenant_version", v.as_bytes());
        }
        l.str("method", r.method.as_str().as_bytes());
        l.str("path", r.path().as_bytes());
        l.str("version", r.version_text().as_bytes());
        if let Some(host) = &r.host {
            l.str("host", host.as_bytes());
        }
        l.key("client");
        if l.json {
            l.out.push(b'"');
        }
        ip_text(l.out, r.client);
        if l.json {
            l.out.push(b'"');
        }
        l.key("remote");
        if l.json {
            l.out.push(b'"');
        }
        match r.remote.ip() {
            std::net::IpAddr::V4(v4) => ip_text(l.out, v4.into()),
            std::net::IpAddr::V6(v6) => {
                l.out.push(b'[');
                ip_text(l.out, v6.into());
                l.out.push(b']');
            }
        }
        l.out.push(b':');
        let mut d = [0u8; 20];
        l.out
            .extend_from_slice(decimal(u64::from(r.remote.port()), &mut d));
        if l.json {
            l.out.push(b'"');
        }
        l.num("status", u64::from(r.status));
        l.num("bytes", bytes);
        // Milliseconds with three decimals.
        let mut ms = [0u8; 24];
        let whole = decimal(total_us / 1000, &mut d);
        let n = whole.len();
        ms[..n].copy_from_slice(whole);
        let frac = total_us % 1000;
        ms[n] = b'.';
        ms[n + 1] = b'0' + (frac / 100) as u8;
        ms[n + 2] = b'0' + (frac / 10 % 10) as u8;
        ms[n + 3] = b'0' + (frac % 10) as u8;
        l.raw("total_ms", &ms[..n + 4], false);
        if let Some(ua) = &r.user_agent {
            l.str("user_agent", ua.as_bytes());
        }
        if let Some(referer) = &r.referer {
            l.str("referer", referer.as_bytes());
        }
        if let Some(t) = &r.trace_id {
            l.str("trace_id", t);
        }
        if !complete {
            l.raw("incomplete", b"true", false);
        }
        if r.trigger != crate::trigger::Trigger::Request {
            l.str("trigger", r.trigger.name().as_bytes());
        }
        if self.json {
            out.extend_from_slice(b"},\"target\":\"tern::access\"}");
        }
        out.push(b'\n');
    }
}

/// Writes what is written to it as the inside of a JSON string (quotes, backslashes and control
/// characters escaped).
struct JsonEscape<'a>(&'a mut String);

impl std::fmt::Write for JsonEscape<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let mut rest = s;
        while let Some(i) = rest.find(|c: char| c == '"' || c == '\\' || c < ' ') {
            self.0.push_str(&rest[..i]);
            let c = rest[i..].chars().next().expect("found above");
            match c {
                '"' => self.0.push_str("\\\""),
                '\\' => self.0.push_str("\\\\"),
                '\n' => self.0.push_str("\\n"),
                c => write!(self.0, "\\u{:04x}", c as u32)?,
            }
            rest = &rest[i + c.len_utf8()..];
        }
        self.0.push_str(rest);
        Ok(())
    }
}

/// The time now as RFC 3339 UTC with microseconds (`2026-11-23T03:36:42.942409Z`), the date
/// and time of day computed once per second per thread.
fn timestamp(out: &mut Vec<u8>) {
    thread_local! {
        static SECOND: std::cell::RefCell<(u64, String)> = const {
            std::cell::RefCell::new((u64::MAX, String::new()))
        };
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let secs = now.as_secs();
    SECOND.with_borrow_mut(|(cached, text)| {
        if *cached != secs {
            *cached = secs;
            text.clear();
            write_utc(text, secs);
        }
        out.extend_from_slice(text.as_bytes());
        out.push(b'.');
        let micros = now.subsec_micros();
        let mut d = [0u8; 20];
        let digits = decimal(u64::from(micros), &mut d);
        out.extend(std::iter::repeat_n(b'0', 6 - digits.len()));
        out.extend_from_slice(digits);
        out.push(b'Z');
    });
}

/// `secs` since 1970 as a UTC date and time to the second, `2026-11-27T08:55:01`.
fn write_utc(text: &mut String, secs: u64) {
    let (y, m, d) = civil_date(secs / 86_400);
    let t = secs % 86_400;
    let _ = write!(
        text,
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}",
        t / 3600,
        t / 60 % 60,
        t % 60
    );
}

/// `secs` since 1970 as RFC 3339 UTC to the second, `2026-11-27T08:55:01Z` (for people).
pub fn utc_seconds(secs: u64) -> String {
    let mut text = String::with_capacity(20);
    write_utc(&mut text, secs);
    text.push('Z');
    text
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil_date(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + u64::from(m <= 2), m, d)
}

/// Makes `writer` the process's access sink, writing JSON or text (with colours when `ansi`).
pub(super) fn install(writer: LogWriter, json: bool, ansi: bool) {
    ACCESS_SINK.store(Some(Arc::new(AccessSink { writer, json, ansi })));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logwriter::start;
    use crate::logwriter::tests::Sink;
    use tracing::Subscriber;

    #[test]
    fn dates_are_the_calendar_dates_of_their_day_counts() {
        assert_eq!(civil_date(0), (1970, 1, 1));
        assert_eq!(civil_date(59), (1970, 3, 1));
        assert_eq!(civil_date(11_016), (2000, 2, 29));
        assert_eq!(civil_date(20_780), (2026, 11, 23));
        assert_eq!(civil_date(2_932_896), (9999, 12, 31));
        assert_eq!(utc_seconds(1_795_769_701), "2026-11-27T08:55:01Z");
    }

    #[test]
    fn text_values_are_written_as_debug_writes_them() {
        for v in [
            "",
            "4bf92f3577b34da6a3ce929d0e0e4736",
            "shop-1",
            "a b~c",
            "say \"hi\"",
            "back\\slash",
            "tab\there",
            "é",
            "\u{7f}",
            "line\n",
        ] {
            let mut out = Vec::new();
            quoted(&mut out, v.as_bytes(), false);
            assert_eq!(String::from_utf8(out).unwrap(), format!("{v:?}"));
        }
    }

    #[test]
    fn json_strings_escape_quotes_backslashes_and_controls() {
        let mut out = Vec::new();
        quoted(&mut out, "a\"b\\c\nd\u{1}é".as_bytes(), true);
        assert_eq!(String::from_utf8(out).unwrap(), r#""a\"b\\c\nd\u0001é""#);
    }

    /// A request's record, as the front end fills it.
    fn record(v6: bool) -> AccessRecord {
        struct T;
        impl Named for T {
            fn name(&self) -> &str {
                "shop-1"
            }
        }
        AccessRecord {
            request_id: http::HeaderValue::from_static("abc-123"),
            tenant: Some(Arc::new(T)),
            method: http::Method::POST,
            target: http::Uri::from_static("/api/x%20y?token=secret"),
            with_query: false,
            version: http::Version::HTTP_2,
            host: Some(http::HeaderValue::from_static("shop.example:8443")),
            remote: if v6 {
                "[2001:db8::7]:5555".parse().unwrap()
            } else {
                "10.0.0.5:40000".parse().unwrap()
            },
            client: if v6 {
                "2001:db8::7".parse().unwrap()
            } else {
                "198.51.100.1".parse().unwrap()
            },
            user_agent: Some(http::HeaderValue::from_static("Mozilla/5.0 \"x\"")),
            referer: None,
            trace_id: Some(*b"4bf92f3577b34da6a3ce929d0e0e4736"),
            arrived: std::time::Instant::now(),
            status: 201,
            // (A scheduled run's line in one of the two.)
            trigger: if v6 {
                crate::trigger::Trigger::Schedule
            } else {
                crate::trigger::Trigger::Request
            },
        }
    }

    /// The line formatted directly reads exactly as `tracing_subscriber` writes the same
    /// event (text and JSON), but for the timestamp.
    #[test]
    fn direct_lines_read_as_the_tracing_event_of_the_same_fields() {
        for json in [false, true] {
            for v6 in [false, true] {
                let r = record(v6);
                let sink = AccessSink {
                    writer: start(std::io::sink()).0,
                    json,
                    ansi: false,
                };
                let mut direct = Vec::new();
                sink.format(&mut direct, &r, 17, false, 1234);
                let out = Sink::default();
                let captured = out.clone();
                let logs = tracing_subscriber::fmt()
                    .with_writer(move || captured.clone())
                    .with_ansi(false);
                let subscriber: Box<dyn Subscriber + Send + Sync> = if json {
                    Box::new(logs.json().finish())
                } else {
                    Box::new(logs.finish())
                };
                tracing::subscriber::with_default(subscriber, || r.event(17, false, 1234));
                let evented = String::from_utf8(out.0.lock().unwrap().0.clone()).unwrap();
                let direct = String::from_utf8(direct).unwrap();
                let strip = |line: &str| {
                    let at = line.find("Z").unwrap();
                    line[at..].to_string()
                };
                assert_eq!(strip(&direct), strip(&evented), "json={json}");
                assert!(direct.contains("incomplete"), "{direct}");
                assert_eq!(direct.contains("\"schedule\""), v6, "{direct}");
                assert!(!direct.contains("secret"), "no query: {direct}");
            }
        }
    }

    #[test]
    fn the_timestamp_has_microseconds() {
        // (Its numbers' digits: `crate::decimal`'s tests.)
        let mut out = Vec::new();
        timestamp(&mut out);
        let t = String::from_utf8(out).unwrap();
        assert_eq!(t.len(), "2026-11-23T03:36:42.942409Z".len(), "{t}");
        assert!(t.ends_with('Z') && t.as_bytes()[19] == b'.', "{t}");
    }
}
