//! One request as its tenant's live log keeps it, and how it becomes a line of JSON.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Method};

use crate::guest::Output;
use crate::metrics::{Phase, Timings};

/// How a request ended, as its record says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Its guest ran, or it was refused for it, with this outcome.
    Guest(crate::outcome::Outcome),
    /// Answered from the tenant's cache (`stale`: a stale answer standing in).
    Cached {
        /// A stale answer (revalidated in the background, or standing in for an error).
        stale: bool,
    },
}

impl Ended {
    /// Its name (`outcome` in records and filters).
    pub fn name(self) -> &'static str {
        match self {
            Self::Guest(o) => o.name(),
            Self::Cached { stale: false } => "cache_hit",
            Self::Cached { stale: true } => "cache_stale",
        }
    }

    /// Whether a request that ended so and answered `status` is kept whatever the sampling:
    /// a failure of the guest or the server, or a 5xx.
    pub(super) fn always_kept(self, status: u16) -> bool {
        status >= 500 || matches!(self, Self::Guest(o) if o != crate::outcome::Outcome::Ok)
    }
}

/// One request of a tenant, as its live log keeps it (nothing formatted: [`Record::json`]
/// makes it JSON when a tailer reads it).
pub struct Record {
    /// Its place in the ring (set when kept).
    pub(super) seq: u64,
    /// When it ended (Unix milliseconds); it arrived `total` before.
    pub ended_ms: u64,
    /// How long it took, arrival to answer.
    pub total: Duration,
    /// Its phases, up to `reached`.
    pub timings: Timings,
    /// The last phase it reached.
    pub reached: Phase,
    /// Its id (`x-request-id`, the access line's, the trace's).
    pub request_id: Box<str>,
    /// The tenant's version that served it.
    pub version: Arc<str>,
    /// The client (through trusted proxies).
    pub client: IpAddr,
    /// What made it (a scheduled run's record says `"trigger": "schedule"`).
    pub trigger: crate::trigger::Trigger,
    /// Its method.
    pub method: Method,
    /// Its target: the normal path and the query (shown only with `access_log_query`). (A
    /// copy: the request's own would hold the connection's read buffer as long as the ring
    /// holds the record.)
    pub target: Box<str>,
    /// The HTTP version it came in.
    pub http: http::Version,
    /// The status answered.
    pub status: u16,
    /// How it ended.
    pub outcome: Ended,
    /// The cache's word on it (`Cache-Status`), for a tenant with a cache.
    pub cache: Option<HeaderValue>,
    /// What its guest wrote, if it ran with a WASI context.
    pub output: Option<Output>,
    /// Why it failed, and a trap's backtrace.
    pub error: Option<Box<(String, Option<Box<str>>)>>,
    /// One in this many records was kept when it was (1: every one).
    pub(super) sample: u32,
    /// Its JSON, made by the first reader for every other (the readers of a ring all write
    /// it alike: one replica, one tenant, one setting of `access_log_query`).
    pub(super) json: std::sync::OnceLock<Box<[u8]>>,
}

impl Record {
    /// What it weighs against `history_kib`.
    pub(super) fn weight(&self) -> usize {
        self.output
            .as_ref()
            .map_or(0, |o| o.stdout.len() + o.stderr.len())
            + self
                .error
                .as_ref()
                .map_or(0, |e| e.0.len() + e.1.as_ref().map_or(0, |b| b.len()))
    }

    /// When it arrived (Unix milliseconds).
    pub fn arrived_ms(&self) -> u64 {
        self.ended_ms
            .saturating_sub(u64::try_from(self.total.as_millis()).unwrap_or(u64::MAX))
    }

    /// Its path, with the query when `with_query`.
    pub fn path(&self, with_query: bool) -> &str {
        match self.target.split_once('?') {
            Some((path, _)) if !with_query => path,
            _ => &self.target,
        }
    }

    /// Its guest output's lines on `stream` (`stdout`, `stderr`).
    fn lines(&self, stdout: bool) -> Vec<String> {
        let Some(o) = &self.output else {
            return Vec::new();
        };
        lines(if stdout { &o.stdout } else { &o.stderr })
    }

    /// Its JSON, as `replica` gives it for `tenant` (made once, by its first reader).
    pub fn json(&self, replica: &str, tenant: &str, with_query: bool) -> &[u8] {
        self.json.get_or_init(|| {
            let mut out = Vec::with_capacity(512);
            self.write_json(replica, tenant, with_query, &mut out);
            out.into_boxed_slice()
        })
    }

    /// The record as a JSON object, as `replica` gives it for `tenant` (fields in the order
    /// people read them: when, which request, what happened, what the guest said).
    pub fn write_json(&self, replica: &str, tenant: &str, with_query: bool, out: &mut Vec<u8>) {
        let mut ms = Vec::with_capacity(Phase::EVERY.len() + 1);
        for phase in Phase::EVERY {
            let (d, p) = (self.timings.0[phase as usize], phase as usize);
            // The request's phases up to the one it reached; the parts of `run` (and the
            // cache's look-up) when it had them.
            let teardown = Phase::Teardown as usize;
            if (p <= teardown && p <= self.reached as usize) || (p > teardown && !d.is_zero()) {
                ms.push((phase.name(), millis(d)));
            }
        }
        ms.push(("total", millis(self.total)));
        let output = self.output.as_ref();
        let line = Line {
            time: utc_millis(self.arrived_ms()),
            request_id: &self.request_id,
            replica,
            tenant,
            version: &self.version,
            client: self.client.to_string(),
            trigger: (self.trigger != crate::trigger::Trigger::Request)
                .then(|| self.trigger.name()),
            method: self.method.as_str(),
            path: self.path(with_query),
            http: http_version(self.http),
            status: self.status,
            outcome: self.outcome.name(),
            cache: self.cache.as_ref().and_then(|c| c.to_str().ok()),
            ms: Millis(ms),
            error: self.error.as_ref().map(|e| e.0.as_str()),
            backtrace: self
                .error
                .as_ref()
                .and_then(|e| e.1.as_deref())
                .map(|t| t.lines().collect()),
            stdout: self.lines(true),
            stderr: self.lines(false),
            truncated: Truncated {
                stdout: output.is_some_and(|o| o.stdout_truncated),
                stderr: output.is_some_and(|o| o.stderr_truncated),
            },
            sample: (self.sample > 1).then(|| 1.0 / f64::from(self.sample)),
        };
        // (Writing to a `Vec` cannot fail; JSON escapes every control character, so no
        // output of a guest breaks a line or an event.)
        let _ = serde_json::to_writer(out, &line);
    }

    /// Its place in its ring.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Whether `text` is in its path, output or error (ASCII letters in any case).
    pub fn mentions(&self, text: &str) -> bool {
        let has = |hay: &[u8]| contains_ignore_case(hay, text.as_bytes());
        has(self.path(false).as_bytes())
            || self
                .output
                .as_ref()
                .is_some_and(|o| has(&o.stdout) || has(&o.stderr))
            || self.error.as_ref().is_some_and(|e| has(e.0.as_bytes()))
    }
}

/// A record as JSON, its fields in this order.
#[derive(serde::Serialize)]
struct Line<'a> {
    time: String,
    request_id: &'a str,
    replica: &'a str,
    tenant: &'a str,
    version: &'a str,
    client: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    trigger: Option<&'static str>,
    method: &'a str,
    path: &'a str,
    http: &'static str,
    status: u16,
    outcome: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache: Option<&'a str>,
    ms: Millis,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    backtrace: Option<Vec<&'a str>>,
    stdout: Vec<String>,
    stderr: Vec<String>,
    truncated: Truncated,
    #[serde(skip_serializing_if = "Option::is_none")]
    sample: Option<f64>,
}

/// Phase times in milliseconds, in request order.
struct Millis(Vec<(&'static str, f64)>);

impl serde::Serialize for Millis {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (name, ms) in &self.0 {
            map.serialize_entry(name, ms)?;
        }
        map.end()
    }
}

/// Which streams reached `stdio_bytes`.
#[derive(serde::Serialize)]
struct Truncated {
    stdout: bool,
    stderr: bool,
}

/// A stream of output as lines: split at `\n` (a trailing one ends the last line), invalid
/// UTF-8 replaced (U+FFFD); control characters stay, escaped by JSON.
pub(super) fn lines(bytes: &[u8]) -> Vec<String> {
    if bytes.is_empty() {
        return Vec::new();
    }
    let bytes = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    bytes
        .split(|&b| b == b'\n')
        .map(|l| String::from_utf8_lossy(l).into_owned())
        .collect()
}

fn contains_ignore_case(hay: &[u8], needle: &[u8]) -> bool {
    needle.is_empty()
        || hay
            .windows(needle.len())
            .any(|w| w.eq_ignore_ascii_case(needle))
}

/// Milliseconds with microseconds.
fn millis(d: Duration) -> f64 {
    (d.as_micros() as f64) / 1000.0
}

/// `2026-11-29T19:21:21.123Z`.
pub fn utc_millis(ms: u64) -> String {
    let mut text = crate::logwriter::access::utc_seconds(ms / 1000);
    text.pop();
    text.push_str(&format!(".{:03}Z", ms % 1000));
    text
}

fn http_version(v: http::Version) -> &'static str {
    match v {
        http::Version::HTTP_09 => "0.9",
        http::Version::HTTP_10 => "1.0",
        http::Version::HTTP_2 => "2",
        http::Version::HTTP_3 => "3",
        _ => "1.1",
    }
}

/// Unix milliseconds now.
pub fn now_ms() -> u64 {
    crate::audit::now_ms()
}
