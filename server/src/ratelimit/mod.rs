//! Rate limits at the edge (`[[tenant.rate_limit]]`): checked for a routed request before the
//! tenant's cache and before a slot is taken, so a refused request costs no guest.
//!
//! Each limit counts requests by a key (the client's address through `trusted_proxies`, a
//! header, a query parameter, the tenant, or a list of these) with nginx's `limit_req`
//! algorithm ([`table`]): a rate, a `burst` taken over it, and of the burst a `delay` answered at
//! once (the rest wait until the rate lets them through); past the burst, `429` with
//! `Retry-After` and the `RateLimit-Policy` / `RateLimit` fields
//! (draft-ietf-httpapi-ratelimit-headers). A `dry_run` limit counts what it would refuse and
//! refuses nothing. Counts live in this process (each replica of a fleet counts its own).
//!
//! A limit's counts survive a redeploy of its tenant that leaves the limit as it was.

use std::hash::{BuildHasher, Hash, Hasher};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{HeaderMap, HeaderValue, Method};

pub mod config;
pub mod counters;
pub mod shards;
pub mod table;

pub use config::{KeyConfig, LimitConfig, Mode};
use config::{KeyPart, Rate};
use table::{Table, Verdict};

/// One limit, ready to count.
#[derive(Debug)]
pub struct Limit {
    /// As written (a redeploy with the same settings keeps the counts).
    pub config: LimitConfig,
    key: Vec<KeyPart>,
    hasher: std::hash::RandomState,
    table: Table,
    /// When its table started (its clock's zero).
    epoch: Instant,
    /// `RateLimit-Policy`'s value.
    policy: HeaderValue,
    /// `RateLimit`'s value when one more request fits within a second (most refusals).
    ratelimit_t1: HeaderValue,
    refused: prometheus::IntCounter,
    delayed: prometheus::IntCounter,
}

/// Why a request was refused.
#[derive(Debug)]
pub struct Refused {
    /// The limit that refused it.
    pub limit: Arc<Limit>,
    /// Seconds until one more request fits (at least 1).
    pub retry_after: u64,
}

impl Refused {
    /// The answer's `Retry-After`, `RateLimit-Policy` and `RateLimit`.
    pub fn headers(&self) -> Box<[(http::HeaderName, HeaderValue)]> {
        let (retry, ratelimit) = if self.retry_after == 1 {
            (
                HeaderValue::from_static("1"),
                self.limit.ratelimit_t1.clone(),
            )
        } else {
            (
                HeaderValue::from(self.retry_after),
                HeaderValue::from_str(&format!(
                    "\"{}\";r=0;t={}",
                    self.limit.config.name, self.retry_after
                ))
                .unwrap_or_else(|_| self.limit.ratelimit_t1.clone()),
            )
        };
        Box::new([
            (http::header::RETRY_AFTER, retry),
            (RATELIMIT_POLICY.clone(), self.limit.policy.clone()),
            (RATELIMIT.clone(), ratelimit),
        ])
    }
}

/// The request a limit looks at.
pub struct Asked<'a> {
    /// Its method.
    pub method: &'a Method,
    /// Its path.
    pub path: &'a str,
    /// Its query, if any.
    pub query: Option<&'a str>,
    /// Its headers.
    pub headers: &'a HeaderMap,
    /// The client (through `trusted_proxies`).
    pub client: IpAddr,
    /// Its tenant's name (the `tenant` key of a server-wide limit).
    pub tenant: &'a str,
    /// When it came.
    pub at: Instant,
}

impl Limit {
    /// A limit from its (checked) settings, counted for tenant `label` in `metrics`.
    ///
    /// # Panics
    /// If the settings were not checked ([`LimitConfig::check`]).
    pub fn new(config: &LimitConfig, metrics: &crate::metrics::Metrics, label: &str) -> Self {
        let rate = Rate::parse(&config.rate).expect("a checked rate");
        let key = config
            .key
            .parts()
            .iter()
            .map(|p| KeyPart::parse(p).expect("a checked key"))
            .collect();
        let policy = HeaderValue::from_str(&format!(
            "\"{}\";q={};w={}",
            config.name,
            rate.count + u64::from(config.burst),
            rate.window
        ))
        .expect("a name of token characters");
        let ratelimit_t1 = HeaderValue::from_str(&format!("\"{}\";r=0;t=1", config.name))
            .expect("a name of token characters");
        let labels = [label, config.name.as_str(), config.mode.name()];
        Self {
            key,
            hasher: std::hash::RandomState::new(),
            table: Table::new(
                rate.milli_per_sec,
                config.burst,
                config.delay.unwrap_or(config.burst),
                config.max_keys,
                metrics
                    .rate_limit_keys
                    .with_label_values(&[label, config.name.as_str()]),
            ),
            epoch: Instant::now(),
            policy,
            ratelimit_t1,
            refused: metrics.rate_limited.with_label_values(&labels),
            delayed: metrics
                .rate_limit_delayed
                .with_label_values(&[label, config.name.as_str()]),
            config: config.clone(),
        }
    }

    /// Whether it looks at `r` (its paths and methods).
    fn covers(&self, r: &Asked<'_>) -> bool {
        (self.config.methods.is_empty()
            || self.config.methods.iter().any(|m| m == r.method.as_str()))
            && (self.config.paths.is_empty()
                || self
                    .config
                    .paths
                    .iter()
                    .any(|p| r.path.starts_with(p.as_str())))
    }

    /// The key of `r` (`None`: every part of it is absent, as nginx's empty key: not counted).
    fn key_of(&self, r: &Asked<'_>) -> Option<u64> {
        let mut h = self.hasher.build_hasher();
        let mut any = false;
        for part in &self.key {
            // Each part is framed (a tag and a length), so parts cannot run into each other.
            match part {
                KeyPart::ClientIp => {
                    any = true;
                    0u8.hash(&mut h);
                    r.client.hash(&mut h);
                }
                KeyPart::Tenant => {
                    any = true;
                    1u8.hash(&mut h);
                    r.tenant.hash(&mut h);
                }
                KeyPart::Header(name) => {
                    2u8.hash(&mut h);
                    match r.headers.get(name) {
                        Some(v) if !v.is_empty() => {
                            any = true;
                            v.as_bytes().hash(&mut h);
                        }
                        _ => 0usize.hash(&mut h),
                    }
                }
                KeyPart::Query(name) => {
                    3u8.hash(&mut h);
                    match query_value(r.query, name) {
                        Some(v) if !v.is_empty() => {
                            any = true;
                            let mut n = 0usize;
                            for b in decoded(v) {
                                h.write_u8(b);
                                n += 1;
                            }
                            n.hash(&mut h);
                        }
                        _ => 0usize.hash(&mut h),
                    }
                }
            }
        }
        any.then(|| h.finish())
    }

    /// Accounts `r` (with `commit` false: only says what accounting would decide).
    fn account(&self, r: &Asked<'_>, commit: bool) -> Option<Verdict> {
        if !self.covers(r) {
            return None;
        }
        let key = self.key_of(r)?;
        let now = r.at.saturating_duration_since(self.epoch).as_millis() as u64;
        Some(self.table.account(key, now, commit))
    }
}

/// The value of query parameter `name` in `query`, as written (the name is compared decoded:
/// `us%65r=1` is `user`'s).
fn query_value<'a>(query: Option<&'a str>, name: &str) -> Option<&'a str> {
    query?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        decoded(k).eq(name.bytes()).then_some(v)
    })
}

/// The bytes `text` stands for in a query (`%XX` and `+` decoded), so `user=%31` counts as
/// `user=1`: a client cannot make itself new keys by spelling its value another way.
fn decoded(text: &str) -> impl Iterator<Item = u8> + '_ {
    let b = text.as_bytes();
    let mut i = 0;
    std::iter::from_fn(move || {
        let c = *b.get(i)?;
        let hex = |d: u8| (d as char).to_digit(16);
        if c == b'%'
            && let (Some(h), Some(l)) = (
                b.get(i + 1).and_then(|d| hex(*d)),
                b.get(i + 2).and_then(|d| hex(*d)),
            )
        {
            i += 3;
            return Some((h * 16 + l) as u8);
        }
        i += 1;
        Some(if c == b'+' { b' ' } else { c })
    })
}

/// A tenant's limits.
#[derive(Debug, Default, Clone)]
pub struct RateLimits {
    limits: Vec<Arc<Limit>>,
}

impl RateLimits {
    /// A tenant's limits from its (checked) settings; a limit `carried` from the version it
    /// replaces with the same settings keeps its counts.
    pub fn prepare(
        configs: &[LimitConfig],
        carried: Option<&RateLimits>,
        metrics: &crate::metrics::Metrics,
        label: &str,
    ) -> Option<Self> {
        if configs.is_empty() {
            return None;
        }
        let limits = configs
            .iter()
            .map(|c| {
                carried
                    .and_then(|old| old.limits.iter().find(|l| l.config == *c))
                    .cloned()
                    .unwrap_or_else(|| Arc::new(Limit::new(c, metrics, label)))
            })
            .collect();
        Some(Self { limits })
    }

    /// Its limits.
    fn iter(&self) -> std::slice::Iter<'_, Arc<Limit>> {
        self.limits.iter()
    }
}

/// Checks `r` against every limit of the server's (`[[server.rate_limit]]`) and then of its
/// tenant's: refused by the first enforced limit it is over, else how long the most demanding
/// one makes it wait (zero: none).
///
/// # Errors
/// [`Refused`].
pub fn check(
    server: Option<&RateLimits>,
    tenant: Option<&RateLimits>,
    r: &Asked<'_>,
) -> Result<Duration, Refused> {
    let all = || server.into_iter().chain(tenant).flat_map(RateLimits::iter);
    // As nginx, a request is charged to its limits only if none refuses it: with several,
    // each is asked first (every dry run sees it), then each is charged. One limit is asked
    // and charged at once (a refusal is never charged).
    let at_once = server.map_or(0, |l| l.limits.len()) + tenant.map_or(0, |l| l.limits.len()) == 1;
    let mut wait = Duration::ZERO;
    let mut refused = None;
    for limit in all() {
        let dry = limit.config.mode == Mode::DryRun;
        match limit.account(r, at_once) {
            None | Some(Verdict::Pass) => {}
            Some(Verdict::Wait(d)) => {
                if !dry {
                    wait = wait.max(d);
                    if at_once {
                        limit.delayed.inc();
                    }
                }
            }
            Some(Verdict::Over { retry_after }) => {
                limit.refused.inc();
                if !dry && refused.is_none() {
                    refused = Some(Refused {
                        limit: limit.clone(),
                        retry_after,
                    });
                }
            }
        }
    }
    if let Some(refused) = refused {
        return Err(refused);
    }
    if !at_once {
        for limit in all() {
            if let Some(Verdict::Wait(_)) = limit.account(r, true)
                && limit.config.mode == Mode::Enforce
            {
                limit.delayed.inc();
            }
        }
    }
    Ok(wait)
}

/// The `tenant` label of the server's limits' metrics (no tenant's name).
pub const SERVER_LABEL: &str = "*";

/// `RateLimit-Policy` (draft-ietf-httpapi-ratelimit-headers): a limit's quota and window.
pub static RATELIMIT_POLICY: http::HeaderName = http::HeaderName::from_static("ratelimit-policy");

/// `RateLimit`: what is left of it (`r`) and when it resets (`t`, seconds).
pub static RATELIMIT: http::HeaderName = http::HeaderName::from_static("ratelimit");

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(toml_text: &str) -> RateLimits {
        #[derive(serde::Deserialize)]
        struct Limits {
            rate_limit: Vec<LimitConfig>,
        }
        let parsed: Limits = toml::from_str(toml_text).unwrap();
        config::check_all(&parsed.rate_limit).unwrap();
        let metrics = crate::metrics::Metrics::new(10);
        RateLimits::prepare(&parsed.rate_limit, None, &metrics, "t").unwrap()
    }

    fn ask<'a>(headers: &'a HeaderMap, at: Instant, method: &'a Method) -> Asked<'a> {
        Asked {
            method,
            path: "/api/x",
            query: Some("user=1&x"),
            headers,
            client: IpAddr::from([192, 0, 2, 1]),
            tenant: "t",
            at,
        }
    }

    #[test]
    fn a_query_value_counts_as_what_it_stands_for() {
        let l = limits("[[rate_limit]]\nname = \"q\"\nkey = \"query:user\"\nrate = \"4/h\"\n");
        let (h, now, get) = (HeaderMap::new(), Instant::now(), Method::GET);
        let q = |q: &'static str| Asked {
            query: Some(q),
            ..ask(&h, now, &get)
        };
        assert!(check(None, Some(&l), &q("user=a+b1")).is_ok());
        for same in [
            "user=a%20b%31",
            "us%65r=a+b1",
            "x=1&user=%61 b1",
            "user=a%20b1&user=2",
        ] {
            assert!(check(None, Some(&l), &q(same)).is_err(), "{same}");
        }
        for other in ["user=a%2Bb1", "user=a+b1%", "user=ab1", "users=a+b1"] {
            assert!(check(None, Some(&l), &q(other)).is_ok(), "{other}");
            let _ = check(None, Some(&l), &q(other));
        }
    }

    #[test]
    fn a_request_another_limit_refuses_is_charged_to_none() {
        // "wide" takes three requests, "narrow" one: the refused second and third requests
        // are not charged to "wide", whose count still has room for two more clients' worth.
        let l = limits(
            "[[rate_limit]]\nname = \"wide\"\nkey = \"tenant\"\nrate = \"4/h\"\nburst = 2\n\
             [[rate_limit]]\nname = \"narrow\"\nkey = \"query:user\"\nrate = \"4/h\"\n",
        );
        let (h, now, get) = (HeaderMap::new(), Instant::now(), Method::GET);
        assert!(check(None, Some(&l), &ask(&h, now, &get)).is_ok());
        for _ in 0..5 {
            let e = check(None, Some(&l), &ask(&h, now, &get)).unwrap_err();
            assert_eq!(e.limit.config.name, "narrow");
        }
        // Another user: "wide" still has its burst (nothing was charged to it meanwhile).
        let other = |q: &'static str| Asked {
            query: Some(q),
            ..ask(&h, now, &get)
        };
        assert!(check(None, Some(&l), &other("user=2")).is_ok());
        assert!(check(None, Some(&l), &other("user=3")).is_ok());
        let e = check(None, Some(&l), &other("user=4")).unwrap_err();
        assert_eq!(
            e.limit.config.name, "wide",
            "its burst of 2 after the first"
        );
    }

    #[test]
    fn a_redeploy_with_the_same_limit_keeps_its_counts_and_a_changed_one_starts_afresh() {
        let text = "[[rate_limit]]\nname = \"l\"\nrate = \"4/h\"\n";
        let first = limits(text);
        let (h, now, get) = (HeaderMap::new(), Instant::now(), Method::GET);
        assert!(check(None, Some(&first), &ask(&h, now, &get)).is_ok());
        let metrics = crate::metrics::Metrics::new(10);
        let same = RateLimits::prepare(
            std::slice::from_ref(&first.limits[0].config),
            Some(&first),
            &metrics,
            "t",
        )
        .unwrap();
        assert!(
            check(None, Some(&same), &ask(&h, now, &get)).is_err(),
            "the count came along"
        );
        let mut changed_config = first.limits[0].config.clone();
        changed_config.rate = "5/h".into();
        let changed = RateLimits::prepare(&[changed_config], Some(&first), &metrics, "t").unwrap();
        assert!(
            check(None, Some(&changed), &ask(&h, now, &get)).is_ok(),
            "a new limit, a new count"
        );
    }
}
