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
pub mod shared;
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
    /// Where it counts when it is shared (`shared = true`).
    shared: Option<shared::Shared>,
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
                HeaderValue::from_maybe_shared(bytes::Bytes::from(format!(
                    "\"{}\";r=0;t={}",
                    self.limit.config.name, self.retry_after
                )))
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
    /// Its tenant ([`crate::tenant::Tenant::data`]: a tenant created again under a deleted
    /// one's name counts apart from it), the `tenant` key of a server-wide limit.
    pub tenant: &'a str,
    /// When it came.
    pub at: Instant,
}

impl Limit {
    /// A limit from its (checked) settings, counted for tenant `label` in `metrics` (a shared
    /// one in its store of `stores`, under `tenant`'s name).
    ///
    /// # Errors
    /// A shared limit whose store is missing or not a Redis one.
    ///
    /// # Panics
    /// If the settings were not checked ([`LimitConfig::check`]).
    pub fn new(
        config: &LimitConfig,
        metrics: &crate::metrics::Metrics,
        label: &str,
        tenant: &str,
        stores: &crate::kv::Stores,
    ) -> Result<Self, String> {
        let shared = if config.shared {
            let failed = metrics
                .rate_limit_unreachable
                .with_label_values(&[label, config.name.as_str()]);
            Some(shared::Shared::new(config, tenant, stores, failed)?)
        } else {
            None
        };
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
        Ok(Self {
            shared,
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
        })
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

    /// The key of `r` hashed with `h` (`None`: every part of it is absent, as nginx's empty
    /// key: not counted).
    fn key_of(&self, r: &Asked<'_>, mut h: impl Hasher) -> Option<u64> {
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

    /// Accounts `r`: what it decided, the key charged and whether that key was new (`None`:
    /// the limit does not look at `r`, or its key is absent).
    async fn account(&self, r: &Asked<'_>) -> Option<(Verdict, u64, bool)> {
        if !self.covers(r) {
            return None;
        }
        if let Some(shared) = &self.shared {
            let key = self.key_of(r, shared::Stable::default())?;
            let (rate, burst) = self.table.rate_and_burst();
            let (verdict, new) = match shared.excess(key, rate, burst).await {
                Some((excess, new)) => (self.table.verdict(excess), new),
                None => match shared.unreachable {
                    // Nothing was charged: nothing to give back.
                    config::Unreachable::Allow => return None,
                    config::Unreachable::Refuse => (Verdict::Over { retry_after: 1 }, false),
                },
            };
            return Some((verdict, key, new));
        }
        let key = self.key_of(r, self.hasher.build_hasher())?;
        let now = r.at.saturating_duration_since(self.epoch).as_millis() as u64;
        let (verdict, new) = self.table.charge(key, now);
        Some((verdict, key, new))
    }

    /// Gives back the request charged to `key` (another limit refused it); `new`: it made
    /// the key.
    async fn refund(&self, key: u64, new: bool) {
        match &self.shared {
            Some(shared) => shared.refund(key, new).await,
            None => self.table.refund(key, new),
        }
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
    /// Whether any counts in a shared store (then [`check`] waits for it).
    shared: bool,
}

impl RateLimits {
    /// `tenant`'s limits (`*` for the server's) from its (checked) settings, counted under
    /// `label` in `metrics`, the shared ones in `stores`; a limit `carried` from the version
    /// it replaces with the same settings keeps its counts.
    ///
    /// # Errors
    /// A shared limit whose store is missing or not a Redis one.
    pub fn prepare(
        configs: &[LimitConfig],
        carried: Option<&RateLimits>,
        metrics: &crate::metrics::Metrics,
        (label, tenant): (&str, &str),
        stores: &crate::kv::Stores,
    ) -> Result<Option<Self>, String> {
        if configs.is_empty() {
            return Ok(None);
        }
        let limits: Vec<Arc<Limit>> = configs
            .iter()
            .map(
                |c| match carried.and_then(|old| old.limits.iter().find(|l| l.config == *c)) {
                    Some(kept) => Ok(kept.clone()),
                    None => Limit::new(c, metrics, label, tenant, stores).map(Arc::new),
                },
            )
            .collect::<Result<_, _>>()?;
        let shared = limits.iter().any(|l| l.shared.is_some());
        Ok(Some(Self { limits, shared }))
    }

    /// Whether any of them counts in a shared store: [`check`] then waits for it; otherwise it
    /// is ready at once.
    pub fn waits(&self) -> bool {
        self.shared
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
pub async fn check(
    server: Option<&RateLimits>,
    tenant: Option<&RateLimits>,
    r: &Asked<'_>,
) -> Result<Duration, Refused> {
    let all = || server.into_iter().chain(tenant).flat_map(RateLimits::iter);
    // Each limit is asked and charged at once (one step under its lock, or one script on the
    // shared store: concurrent requests never both take the last place). As nginx, a request
    // is charged to its limits only if none refuses it: when one does, what the others were
    // charged is given back. Every dry run sees every request.
    let mut charged: [Option<(&Limit, u64, bool, bool)>; 2 * config::MAX_LIMITS] =
        [None; 2 * config::MAX_LIMITS];
    let mut n = 0;
    let mut wait = Duration::ZERO;
    let mut refused = None;
    for limit in all() {
        let dry = limit.config.mode == Mode::DryRun;
        let Some((verdict, key, new)) = limit.account(r).await else {
            continue;
        };
        match verdict {
            Verdict::Pass | Verdict::Wait(_) => {
                let waits = !dry && verdict != Verdict::Pass;
                if let Verdict::Wait(d) = verdict
                    && !dry
                {
                    wait = wait.max(d);
                }
                if let Some(slot) = charged.get_mut(n) {
                    *slot = Some((&**limit, key, waits, new));
                    n += 1;
                }
            }
            Verdict::Over { retry_after } => {
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
    let charged = charged[..n].iter().flatten();
    if let Some(refused) = refused {
        for &(limit, key, _, new) in charged {
            limit.refund(key, new).await;
        }
        return Err(refused);
    }
    for &(limit, _, waits, _) in charged {
        if waits {
            limit.delayed.inc();
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

    /// `configs` prepared as tenant `t`'s, keeping what `carried` has.
    fn prepare(configs: &[LimitConfig], carried: Option<&RateLimits>) -> RateLimits {
        let metrics = crate::metrics::Metrics::new(10);
        RateLimits::prepare(
            configs,
            carried,
            &metrics,
            ("t", "t"),
            &crate::kv::Stores::default(),
        )
        .unwrap()
        .unwrap()
    }

    /// [`check`], waited for (no limit here waits on anything).
    fn ck(
        server: Option<&RateLimits>,
        tenant: Option<&RateLimits>,
        r: &Asked<'_>,
    ) -> Result<Duration, Refused> {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(check(server, tenant, r))
    }

    fn limits(toml_text: &str) -> RateLimits {
        #[derive(serde::Deserialize)]
        struct Limits {
            rate_limit: Vec<LimitConfig>,
        }
        let parsed: Limits = toml::from_str(toml_text).unwrap();
        config::check_all(&parsed.rate_limit).unwrap();
        prepare(&parsed.rate_limit, None)
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
    fn concurrent_requests_never_both_take_the_last_place() {
        // Two limits (each asked and charged in turn); for each of 100 users, eight threads
        // start at once and one place is free: exactly one request of each user gets in.
        let l = limits(
            "[[rate_limit]]\nname = \"a\"\nkey = \"query:user\"\nrate = \"4/h\"\n\
             [[rate_limit]]\nname = \"b\"\nkey = \"tenant\"\nrate = \"4/h\"\nburst = 100000\n",
        );
        let (h, now, get) = (HeaderMap::new(), Instant::now(), Method::GET);
        let queries: Vec<String> = (0..100).map(|u| format!("user={u}")).collect();
        let admitted = std::sync::atomic::AtomicUsize::new(0);
        let start = std::sync::Barrier::new(8);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .build()
                        .unwrap();
                    for q in &queries {
                        start.wait();
                        let asked = Asked {
                            query: Some(q),
                            ..ask(&h, now, &get)
                        };
                        if rt.block_on(check(None, Some(&l), &asked)).is_ok() {
                            admitted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(admitted.into_inner(), 100);
    }

    #[test]
    fn a_query_value_counts_as_what_it_stands_for() {
        let l = limits("[[rate_limit]]\nname = \"q\"\nkey = \"query:user\"\nrate = \"4/h\"\n");
        let (h, now, get) = (HeaderMap::new(), Instant::now(), Method::GET);
        let q = |q: &'static str| Asked {
            query: Some(q),
            ..ask(&h, now, &get)
        };
        assert!(ck(None, Some(&l), &q("user=a+b1")).is_ok());
        for same in [
            "user=a%20b%31",
            "us%65r=a+b1",
            "x=1&user=%61 b1",
            "user=a%20b1&user=2",
        ] {
            assert!(ck(None, Some(&l), &q(same)).is_err(), "{same}");
        }
        for other in ["user=a%2Bb1", "user=a+b1%", "user=ab1", "users=a+b1"] {
            assert!(ck(None, Some(&l), &q(other)).is_ok(), "{other}");
            let _ = ck(None, Some(&l), &q(other));
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
        assert!(ck(None, Some(&l), &ask(&h, now, &get)).is_ok());
        for _ in 0..5 {
            let e = ck(None, Some(&l), &ask(&h, now, &get)).unwrap_err();
            assert_eq!(e.limit.config.name, "narrow");
        }
        // Another user: "wide" still has its burst (nothing was charged to it meanwhile).
        let other = |q: &'static str| Asked {
            query: Some(q),
            ..ask(&h, now, &get)
        };
        assert!(ck(None, Some(&l), &other("user=2")).is_ok());
        assert!(ck(None, Some(&l), &other("user=3")).is_ok());
        let e = ck(None, Some(&l), &other("user=4")).unwrap_err();
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
        assert!(ck(None, Some(&first), &ask(&h, now, &get)).is_ok());
        let same = prepare(std::slice::from_ref(&first.limits[0].config), Some(&first));
        assert!(
            ck(None, Some(&same), &ask(&h, now, &get)).is_err(),
            "the count came along"
        );
        let mut changed_config = first.limits[0].config.clone();
        changed_config.rate = "5/h".into();
        let changed = prepare(&[changed_config], Some(&first));
        assert!(
            ck(None, Some(&changed), &ask(&h, now, &get)).is_ok(),
            "a new limit, a new count"
        );
    }
}
