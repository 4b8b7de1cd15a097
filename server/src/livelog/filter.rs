//! What a reader of a tenant's live log asks for (the query of `GET .../logs`): which records
//! (status, outcome, method, path prefix, text, version, trigger, since when, a sample), whether to
//! follow, in which format. Filters run on the server: a tailer is sent only what it asked for.

use super::record::Record;
use crate::outcome::Outcome;

/// Which records a reader is sent.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Statuses, as inclusive ranges (`5xx` is 500-599); empty: any.
    statuses: Vec<(u16, u16)>,
    /// Outcome names (`trap`: every `trap_*`); empty: any.
    outcomes: Vec<String>,
    /// Methods; empty: any.
    methods: Vec<http::Method>,
    /// A path prefix.
    path: Option<String>,
    /// Text in the path, the guest's output or the error (ASCII letters in any case).
    search: Option<String>,
    /// The tenant's version that served it (its id, or the first 8 or more of its digits).
    version: Option<String>,
    /// What made it (a client's request or a schedule); `None`: either.
    trigger: Option<crate::trigger::Trigger>,
    /// The share of records sent, 0 to 1 (each chosen by its request id, so every replica
    /// and every reader picks the same ones).
    sample: Option<f64>,
}

/// The outcomes a reader may name besides [`Outcome`]'s.
const OTHER_OUTCOMES: [&str; 4] = ["trap", "cache_hit", "cache_stale", "cached"];

/// What a reader asked for.
#[derive(Debug, Clone, Default)]
pub struct Asked {
    /// The records it is sent.
    pub filter: Filter,
    /// Records that ended at or after this (Unix milliseconds); `None`: with `follow`, only
    /// those to come; without, every record kept.
    pub since_ms: Option<u64>,
    /// Keep the stream open and send records as they come.
    pub follow: bool,
    /// Server-sent events (`text/event-stream`) rather than NDJSON.
    pub sse: bool,
    /// This replica's records only (what replicas ask each other for).
    pub local: bool,
}

impl Asked {
    /// From the query string (`follow`, `status`, `outcome`, `method`, `path`, `search`,
    /// `version`, `trigger`, `sample`, `since`, `format`, `local`); `sse` when the client accepts only
    /// `text/event-stream`.
    ///
    /// # Errors
    /// A value that is not one the parameter takes, or an unknown parameter, in words.
    pub fn parse(query: Option<&str>, accept_sse: bool, now_ms: u64) -> Result<Self, String> {
        let mut asked = Self {
            sse: accept_sse,
            ..Self::default()
        };
        let f = &mut asked.filter;
        for (key, value) in url::form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
            let value = value.trim();
            let list = || value.split(',').map(str::trim).filter(|v| !v.is_empty());
            match &*key {
                "follow" => asked.follow = flag(&key, value)?,
                "local" => asked.local = flag(&key, value)?,
                "format" => {
                    asked.sse = match value {
                        "sse" => true,
                        "ndjson" => false,
                        _ => return Err(format!("format is ndjson or sse, not {value:?}")),
                    }
                }
                "status" => {
                    for s in list() {
                        f.statuses.push(status(s)?);
                    }
                }
                "outcome" => {
                    for o in list() {
                        if !OTHER_OUTCOMES.contains(&o)
                            && !Outcome::ALL.iter().any(|x| x.name() == o)
                        {
                            let known: Vec<&str> = Outcome::ALL
                                .iter()
                                .map(|x| x.name())
                                .chain(OTHER_OUTCOMES)
                                .collect();
                            return Err(format!("outcome {o:?} is none of: {}", known.join(", ")));
                        }
                        f.outcomes.push(o.to_string());
                    }
                }
                "method" => {
                    for m in list() {
                        let m = http::Method::from_bytes(m.to_ascii_uppercase().as_bytes())
                            .map_err(|_| format!("method {m:?} is not an HTTP method"))?;
                        f.methods.push(m);
                    }
                }
                "path" => {
                    if !value.starts_with('/') {
                        return Err(format!("path is a prefix starting with /, not {value:?}"));
                    }
                    f.path = Some(value.to_string());
                }
                "search" if !value.is_empty() => f.search = Some(value.to_string()),
                "search" => {}
                "version" if !value.is_empty() => f.version = Some(value.to_string()),
                "version" => {}
                "trigger" => {
                    use crate::trigger::Trigger;
                    f.trigger = match value {
                        "request" => Some(Trigger::Request),
                        "schedule" => Some(Trigger::Schedule),
                        "" => None,
                        _ => {
                            return Err(format!("trigger is request or schedule, not {value:?}"));
                        }
                    };
                }
                "sample" => {
                    let share: f64 = value
                        .parse()
                        .ok()
                        .filter(|s: &f64| *s > 0.0 && *s <= 1.0)
                        .ok_or_else(|| {
                            format!("sample is a share above 0 and at most 1, not {value:?}")
                        })?;
                    f.sample = (share < 1.0).then_some(share);
                }
                "since" => asked.since_ms = Some(since(value, now_ms)?),
                other => {
                    return Err(format!(
                        "unknown parameter {other:?}: follow, status, outcome, method, path, \
                         search, version, trigger, sample, since, format"
                    ));
                }
            }
        }
        Ok(asked)
    }

    /// The query a replica asks the others with: the same filters, `since` as an instant,
    /// NDJSON, this replica's records only.
    pub fn for_peers(query: Option<&str>, since_ms: Option<u64>) -> String {
        let mut out = url::form_urlencoded::Serializer::new(String::new());
        for (key, value) in url::form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
            if !matches!(&*key, "since" | "format" | "local") {
                out.append_pair(&key, &value);
            }
        }
        if let Some(ms) = since_ms {
            out.append_pair("since", &ms.to_string());
        }
        out.append_pair("local", "1");
        out.finish()
    }
}

/// `1`/`true`/empty or `0`/`false`.
fn flag(key: &str, value: &str) -> Result<bool, String> {
    match value {
        "" | "1" | "true" => Ok(true),
        "0" | "false" => Ok(false),
        _ => Err(format!("{key} is 1 or 0, not {value:?}")),
    }
}

/// `404` or `5xx`, as an inclusive range.
fn status(s: &str) -> Result<(u16, u16), String> {
    let bad = || format!("status {s:?} is a status (404) or a class (5xx)");
    match s.as_bytes() {
        [c @ b'1'..=b'5', b'x' | b'X', b'x' | b'X'] => {
            let low = u16::from(c - b'0') * 100;
            Ok((low, low + 99))
        }
        _ => {
            let n: u16 = s.parse().map_err(|_| bad())?;
            if (100..=599).contains(&n) {
                Ok((n, n))
            } else {
                Err(bad())
            }
        }
    }
}

/// `10m` (back from now: s, m, h, d) or an instant in Unix milliseconds.
fn since(value: &str, now_ms: u64) -> Result<u64, String> {
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        return value
            .parse()
            .map_err(|_| format!("since {value:?} is too large"));
    }
    let back = crate::access::parse_lifetime(value).map_err(|_| {
        format!(
            "since is a span back from now (90s, 10m, 2h, 1d) or Unix milliseconds, not {value:?}"
        )
    })?;
    Ok(now_ms.saturating_sub(back.saturating_mul(1000)))
}

impl Filter {
    /// Whether `r` is one the reader asked for.
    pub fn matches(&self, r: &Record) -> bool {
        (self.statuses.is_empty()
            || self
                .statuses
                .iter()
                .any(|&(low, high)| (low..=high).contains(&r.status)))
            && (self.outcomes.is_empty() || self.outcomes.iter().any(|o| outcome_is(o, r)))
            && (self.methods.is_empty() || self.methods.contains(&r.method))
            && self
                .path
                .as_deref()
                .is_none_or(|p| r.path(false).starts_with(p))
            && self
                .version
                .as_deref()
                .is_none_or(|v| *r.version == *v || (v.len() >= 8 && r.version.starts_with(v)))
            && self.trigger.is_none_or(|t| r.trigger == t)
            && self.search.as_deref().is_none_or(|t| r.mentions(t))
            && self.sample.is_none_or(|share| chosen(r, share))
    }
}

/// Whether `r`'s outcome is the one `name` names.
fn outcome_is(name: &str, r: &Record) -> bool {
    let actual = r.outcome.name();
    match name {
        "trap" => actual.starts_with("trap_"),
        "cached" => actual.starts_with("cache_"),
        _ => actual == name,
    }
}

/// Whether `r` is in a sample of `share`: a hash of its request id against the share, so the
/// choice is the same wherever it is made.
fn chosen(r: &Record, share: f64) -> bool {
    // FNV-1a, then a finaliser: cheap and well spread over ids of any shape.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in r.request_id.as_bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    (h as f64) < share * (u64::MAX as f64)
}
