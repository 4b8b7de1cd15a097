//! `[[tenant.rate_limit]]`: one limit's settings as written (in the config file and in the
//! admin API's tenant spec), and their checks.

use serde::{Deserialize, Serialize};

/// Most limits one tenant declares.
pub const MAX_LIMITS: usize = 16;

/// Most parts of one key.
pub const MAX_KEY_PARTS: usize = 4;

/// Keys a limit tracks unless it says otherwise (about 64 bytes each at most: 6.4 MB).
pub const DEFAULT_MAX_KEYS: usize = 100_000;

/// Most keys one limit may track.
pub const MAX_KEYS: usize = 10_000_000;

/// Largest `burst`.
pub const MAX_BURST: u32 = 1_000_000;

/// One limit as written.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LimitConfig {
    /// Its name (in metrics, the access line and the `RateLimit` fields).
    pub name: String,
    /// What a client is counted by: `client_ip`, `header:NAME`, `query:NAME`, `tenant`, or a
    /// list of these (default `client_ip`).
    #[serde(default)]
    pub key: KeyConfig,
    /// The rate: `10/s`, `600/min`, `3600/h` (nginx's `10r/s`, `600r/m` too).
    pub rate: String,
    /// Requests over the rate taken at once (nginx's `burst`); past them, refused.
    #[serde(default)]
    pub burst: u32,
    /// Of the `burst`, how many are answered without waiting; the rest wait until the rate
    /// lets them through (nginx's `delay=N`; `0` is nginx's default, none `nodelay`). Default:
    /// all of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay: Option<u32>,
    /// Only requests under these path prefixes (default: every path).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
    /// Only requests of these methods (default: every method).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
    /// `enforce` (refuse with `429`) or `dry_run` (count what would be refused, refuse nothing).
    #[serde(default)]
    pub mode: Mode,
    /// Keys it tracks at most; past it the least recently seen are forgotten.
    #[serde(default = "default_max_keys")]
    pub max_keys: usize,
    /// Counted for the whole fleet in a Redis key-value store (`store`), not by each replica.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shared: bool,
    /// The `[kv.NAME]` store (a Redis one) a shared limit counts in (default `default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<String>,
    /// What a shared limit does when its store cannot be reached: `allow` (the request goes
    /// on, uncounted) or `refuse` (`429`).
    #[serde(default, skip_serializing_if = "Unreachable::is_allow")]
    pub when_unreachable: Unreachable,
}

/// What a shared limit does when its store cannot be reached.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Unreachable {
    /// Let the request through, uncounted (fail open).
    #[default]
    Allow,
    /// Refuse it with `429` (fail closed).
    Refuse,
}

impl Unreachable {
    fn is_allow(&self) -> bool {
        *self == Self::Allow
    }
}

fn default_max_keys() -> usize {
    DEFAULT_MAX_KEYS
}

/// `enforce` or `dry_run`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Refuse what is over the limit.
    #[default]
    Enforce,
    /// Count what would be refused; refuse and delay nothing.
    DryRun,
}

impl Mode {
    /// The metric label.
    pub fn name(self) -> &'static str {
        match self {
            Self::Enforce => "enforce",
            Self::DryRun => "dry_run",
        }
    }
}

/// A key: one part, or a list.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum KeyConfig {
    /// One part.
    One(String),
    /// Several parts, counted together.
    Many(Vec<String>),
}

impl Default for KeyConfig {
    fn default() -> Self {
        Self::One("client_ip".into())
    }
}

impl KeyConfig {
    /// Its parts as written.
    pub fn parts(&self) -> &[String] {
        match self {
            Self::One(p) => std::slice::from_ref(p),
            Self::Many(ps) => ps,
        }
    }
}

/// One part of a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPart {
    /// The client's address (through `trusted_proxies`).
    ClientIp,
    /// A request header's value.
    Header(http::HeaderName),
    /// A query parameter's value.
    Query(String),
    /// The tenant: one count for all its clients.
    Tenant,
}

impl KeyPart {
    /// `client_ip`, `header:NAME`, `query:NAME` or `tenant`.
    ///
    /// # Errors
    /// What is wrong with it.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.split_once(':') {
            None if s == "client_ip" => Ok(Self::ClientIp),
            None if s == "tenant" => Ok(Self::Tenant),
            Some(("header", name)) => http::HeaderName::from_bytes(name.as_bytes())
                .map(Self::Header)
                .map_err(|_| format!("key {s:?}: {name:?} is not a header name")),
            Some(("query", name)) if !name.is_empty() && !name.contains(['&', '=', '#']) => {
                Ok(Self::Query(name.to_string()))
            }
            _ => Err(format!(
                "unknown key {s:?}: client_ip, header:NAME, query:NAME or tenant (or a list of \
                 these)"
            )),
        }
    }
}

/// A rate: milli-requests per second, and the count and window it was written with (for
/// `RateLimit-Policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// Requests per second × 1000 (nginx's unit).
    pub milli_per_sec: u64,
    /// The count written.
    pub count: u64,
    /// The window written, in seconds.
    pub window: u64,
}

impl Rate {
    /// `N/s`, `N/min`, `N/h` (also `N/sec`, `N/m`, `N/hour`, and nginx's `Nr/s`, `Nr/m`).
    ///
    /// # Errors
    /// What is wrong with it.
    pub fn parse(s: &str) -> Result<Self, String> {
        let bad = || {
            format!("rate {s:?}: a whole number of requests per s, min or h (`10/s`, `600/min`)")
        };
        let (n, unit) = s.trim().split_once('/').ok_or_else(bad)?;
        let n = n.trim().strip_suffix('r').unwrap_or(n.trim());
        let count: u64 = n.parse().map_err(|_| bad())?;
        let window = match unit.trim() {
            "s" | "sec" | "second" => 1,
            "m" | "min" | "minute" => 60,
            "h" | "hour" => 3600,
            _ => return Err(bad()),
        };
        if count == 0 {
            return Err(format!("rate {s:?}: at least one request"));
        }
        if count > 1_000_000_000 {
            return Err(format!("rate {s:?}: at most 1000000000 requests"));
        }
        let milli_per_sec = count * 1000 / window;
        if milli_per_sec == 0 {
            return Err(format!(
                "rate {s:?}: at least one request per 1000 seconds (4/h)"
            ));
        }
        Ok(Self {
            milli_per_sec,
            count,
            window,
        })
    }
}

impl LimitConfig {
    /// Checks it.
    ///
    /// # Errors
    /// What is wrong, naming the limit.
    pub fn check(&self) -> Result<(), String> {
        let name = &self.name;
        if name.is_empty()
            || name.len() > 64
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        {
            return Err(format!(
                "rate_limit name {name:?}: 1-64 of A-Z a-z 0-9 . _ -"
            ));
        }
        let at = |m: String| format!("rate_limit {name:?}: {m}");
        Rate::parse(&self.rate).map_err(at)?;
        let parts = self.key.parts();
        if parts.is_empty() || parts.len() > MAX_KEY_PARTS {
            return Err(at(format!("a key has 1 to {MAX_KEY_PARTS} parts")));
        }
        for p in parts {
            KeyPart::parse(p).map_err(at)?;
        }
        if self.burst > MAX_BURST {
            return Err(at(format!("burst is at most {MAX_BURST}")));
        }
        if let Some(d) = self.delay
            && d > self.burst
        {
            return Err(at(format!(
                "delay = {d} is more than burst = {} (of the burst, how many are answered \
                 without waiting)",
                self.burst
            )));
        }
        for p in &self.paths {
            if !p.starts_with('/') {
                return Err(at(format!("paths: {p:?} does not start with /")));
            }
        }
        for m in &self.methods {
            if m.is_empty() || !m.bytes().all(|b| b.is_ascii_uppercase()) {
                return Err(at(format!(
                    "methods: {m:?} is not a method (GET, POST, ...)"
                )));
            }
        }
        if self.max_keys == 0 || self.max_keys > MAX_KEYS {
            return Err(at(format!("max_keys is 1 to {MAX_KEYS}")));
        }
        if !self.shared && (self.store.is_some() || !self.when_unreachable.is_allow()) {
            return Err(at(
                "store and when_unreachable are for a shared limit (shared = true)".into(),
            ));
        }
        Ok(())
    }
}

/// Checks a tenant's limits: each, how many, and that no name is used twice.
///
/// # Errors
/// What is wrong.
pub fn check_all(limits: &[LimitConfig]) -> Result<(), String> {
    if limits.len() > MAX_LIMITS {
        return Err(format!(
            "at most {MAX_LIMITS} rate limits, not {}",
            limits.len()
        ));
    }
    for (i, l) in limits.iter().enumerate() {
        l.check()?;
        if limits[..i].iter().any(|o| o.name == l.name) {
            return Err(format!("rate_limit name {:?} is used twice", l.name));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(rate: &str) -> LimitConfig {
        LimitConfig {
            name: "l".into(),
            key: KeyConfig::default(),
            rate: rate.into(),
            burst: 0,
            delay: None,
            paths: Vec::new(),
            methods: Vec::new(),
            mode: Mode::Enforce,
            max_keys: DEFAULT_MAX_KEYS,
            shared: false,
            store: None,
            when_unreachable: Unreachable::Allow,
        }
    }

    #[test]
    fn rates_read_as_nginx_and_people_write_them() {
        for (s, milli, count, window) in [
            ("10/s", 10_000, 10, 1),
            ("10r/s", 10_000, 10, 1),
            ("600/min", 10_000, 600, 60),
            ("600r/m", 10_000, 600, 60),
            ("3600/h", 1_000, 3600, 3600),
            ("4/h", 1, 4, 3600),
        ] {
            let r = Rate::parse(s).unwrap();
            assert_eq!(
                (r.milli_per_sec, r.count, r.window),
                (milli, count, window),
                "{s}"
            );
        }
        for (s, says) in [
            ("0/s", "at least one"),
            ("3/h", "1000 seconds"),
            ("10", "a whole number"),
            ("10/day", "a whole number"),
            ("-1/s", "a whole number"),
        ] {
            let e = Rate::parse(s).unwrap_err();
            assert!(e.contains(says), "{s}: {e}");
        }
    }

    #[test]
    fn bad_limits_are_explained() {
        let ok = limit("10/s");
        assert!(ok.check().is_ok());
        let bad = |f: &dyn Fn(&mut LimitConfig), says: &str| {
            let mut l = ok.clone();
            f(&mut l);
            let e = l.check().unwrap_err();
            assert!(e.contains(says), "{e}");
        };
        bad(&|l| l.name = String::new(), "1-64");
        bad(&|l| l.rate = "0/s".into(), "at least one");
        bad(
            &|l| l.key = KeyConfig::One("cookie:x".into()),
            "unknown key",
        );
        bad(&|l| l.key = KeyConfig::Many(Vec::new()), "1 to 4 parts");
        bad(
            &|l| l.key = KeyConfig::One("header:bad name".into()),
            "not a header name",
        );
        bad(&|l| l.burst = MAX_BURST + 1, "burst is at most");
        bad(
            &|l| {
                l.burst = 2;
                l.delay = Some(3);
            },
            "more than burst",
        );
        bad(&|l| l.paths = vec!["api".into()], "does not start with /");
        bad(&|l| l.methods = vec!["get".into()], "not a method");
        bad(&|l| l.max_keys = 0, "max_keys");
        let two = [ok.clone(), ok.clone()];
        assert!(check_all(&two).unwrap_err().contains("used twice"));
        let many: Vec<LimitConfig> = (0..=MAX_LIMITS)
            .map(|i| LimitConfig {
                name: format!("l{i}"),
                ..ok.clone()
            })
            .collect();
        assert!(check_all(&many).unwrap_err().contains("at most 16"));
        assert!(check_all(&many[..MAX_LIMITS]).is_ok());
        // Keys: one part or a list.
        let parsed: LimitConfig = toml::from_str(
            "name = \"k\"\nrate = \"5/s\"\nkey = [\"client_ip\", \"header:x-api-key\", \"query:user\", \"tenant\"]",
        )
        .unwrap();
        assert!(parsed.check().is_ok());
        assert_eq!(parsed.key.parts().len(), 4);
    }
}
