//! The cache in front of a tenant's guests (`[tenant.cache]`): a request that matches a fresh
//! stored answer is answered from memory before admission, with no slot, instance or guest.
//!
//! What may be stored and for how long is RFC 9111's shared-cache rules as
//! `http-cache-semantics` reads them (`no-store`, `private`, `Authorization`, `s-maxage`,
//! `max-age`, `Expires`), with `CDN-Cache-Control` (RFC 9213) in place of `Cache-Control` and
//! `Expires` when the guest sends it. Only explicit freshness is used: an answer without it
//! (heuristics, error statuses by default) is not stored. Nor is an answer with `Set-Cookie`
//! (unless `store_set_cookie`), `Vary: *`, a body over `max_object_kib`, or one that streamed
//! past the buffer, nor the answer to a request with a body or to `HEAD`.
//!
//! The key is the scheme, host and normal path with its query (the tenant's cache is its own);
//! `Vary` makes variants of one key, matched on the request header values they were stored
//! with. A stored `GET` answers `HEAD` too. A conditional request (`If-None-Match`,
//! `If-Modified-Since`) is answered `304` from the stored answer; on a miss the guest gets the
//! request without them, so its full answer can be stored, and the client still gets its `304`.
//! A non-error answer to an unsafe method (`POST`, `PUT`, `PATCH`, `DELETE`) invalidates its
//! key (RFC 9111 §4.4). Every answer says what the cache did in `Cache-Status` (RFC 9211).
//!
//! The store is `moka`'s (bounded by bytes, TinyLFU admission, so one-off scans do not flush
//! what is asked often); an entry leaves when its freshest variant goes stale. A tenant's cache
//! is made with it, so a deploy, a rollback or a change of its settings starts it empty.

use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri};
use http_cache_semantics::{BeforeRequest, CacheOptions, CachePolicy, RequestLike, ResponseLike};
use prometheus::{IntCounter, IntGauge};

use crate::body::ResponseBody;

mod answer;
mod config;

use answer::{CACHE_TAG, SURROGATE_KEY, append_param, hit, not_modified, respond, take_tags};
pub use config::{CacheConfig, MAX_CACHE_MIB, Purge};

/// Most variants (`Vary`) kept of one key; a new one replaces the oldest.
const MAX_VARIANTS: usize = 8;
/// How long a key whose fill was not storable is not collapsed (its misses run side by side).
const PASS_FOR: Duration = Duration::from_secs(10);
/// Most keys remembered as not storable.
const PASSES: u64 = 100_000;
/// The longest a miss waits for another request filling its key (then its guest runs).
pub const COLLAPSE_WAIT: Duration = Duration::from_secs(30);
/// `Cache-Status` (RFC 9211).
pub static CACHE_STATUS: HeaderName = HeaderName::from_static("cache-status");
static CDN_CACHE_CONTROL: HeaderName = HeaderName::from_static("cdn-cache-control");
/// Request headers that proxies and web frameworks read as the request's host, scheme, URL or
/// method, which the key does not hold. The answer to a request carrying one from a peer that
/// is not a trusted proxy (`server.trusted_proxies`) is served and not stored: a guest that
/// reflects one (a link to `X-Forwarded-Host`, say) would otherwise give every client the
/// answer one client shaped.
const UNKEYED: [&str; 8] = [
    "x-forwarded-host",
    "x-forwarded-proto",
    "x-forwarded-scheme",
    "x-forwarded-port",
    "x-original-url",
    "x-rewrite-url",
    "x-http-method-override",
    "forwarded",
];

/// The counters of one tenant's cache.
struct Counts {
    hit: IntCounter,
    collapsed: IntCounter,
    miss: IntCounter,
    bypass: IntCounter,
    stored_bytes: IntGauge,
}

/// One tenant's cache.
pub struct Cache {
    entries: moka::sync::Cache<u64, Arc<Entry>>,
    /// Keys a guest is filling now: later misses of the key wait for its answer.
    filling: std::sync::Mutex<std::collections::HashMap<u64, tokio::sync::watch::Sender<()>>>,
    /// Keys whose last fill proved not storable: their misses run at once, side by side
    /// (hit-for-pass), for [`PASS_FOR`].
    passes: moka::sync::Cache<u64, ()>,
    /// Keys are hashed with a per-cache random key: a client cannot aim at one slot.
    hasher: std::hash::RandomState,
    max_object: usize,
    store_set_cookie: bool,
    counts: Counts,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache")
            .field("entries", &self.entries.entry_count())
            .field("bytes", &self.entries.weighted_size())
            .finish_non_exhaustive()
    }
}

/// The stored answers of one key (scheme, host, path and query).
struct Entry {
    https: bool,
    host: Box<str>,
    target: Box<str>,
    variants: Vec<Arc<Variant>>,
}

/// One stored answer.
struct Variant {
    status: StatusCode,
    /// Its headers as the client gets them (without framing).
    headers: HeaderMap,
    body: Bytes,
    /// The request's values of the fields its `Vary` names.
    vary: Vec<(HeaderName, Option<HeaderValue>)>,
    /// When it was stored, and its age then (`Age`, `Date`).
    stored: Instant,
    age_at_store: Duration,
    /// How long it was fresh for when stored.
    fresh_for: Duration,
    /// For requests with their own `Cache-Control` (`no-cache`, `max-age`, `min-fresh`,
    /// `max-stale`): RFC 9111's answer, from the policy it was stored with.
    policy: CachePolicy,
    /// The tags it was stored with (`Surrogate-Key`, `Cache-Tag`), for purges by tag.
    tags: Vec<Box<str>>,
}

impl Variant {
    fn age(&self, now: Instant) -> Duration {
        self.age_at_store + now.saturating_duration_since(self.stored)
    }

    fn fresh_at(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.stored) < self.fresh_for
    }

    fn vary_matches(&self, headers: &HeaderMap) -> bool {
        self.vary
            .iter()
            .all(|(name, value)| headers.get(name) == value.as_ref())
    }
}

/// What the cache did with a request.
pub enum Lookup {
    /// Answered from the cache.
    Hit(Response<ResponseBody>),
    /// The guest answers; [`Fill::answered`] then stores what may be stored.
    Miss(Fill),
}

/// A request the guest answers, and what the cache does with the answer.
pub struct Fill {
    cache: Arc<Cache>,
    /// `Cache-Status`'s forward reason.
    fwd: &'static str,
    then: Then,
    /// Other misses of the key wait for this one (it holds the key's place in `filling`).
    leads: bool,
    /// It waited for another request's fill first.
    collapsed: bool,
    /// Why it is not stored, when the request decided it (`Cache-Status`'s `detail`).
    detail: Option<&'static str>,
}

impl Drop for Fill {
    fn drop(&mut self) {
        if self.leads
            && let Then::Store(s) = &self.then
        {
            // Ends the wait of the misses behind it, answered or not (a failure, a client
            // that left): they look up again.
            self.cache
                .filling
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .remove(&s.hash);
        }
    }
}

enum Then {
    /// Nothing is stored.
    Pass,
    /// A non-error answer invalidates the key.
    Invalidate(u64),
    /// A storable answer is stored under the key.
    Store(Box<Storing>),
}

struct Storing {
    hash: u64,
    https: bool,
    host: Box<str>,
    target: Box<str>,
    /// The request as the policy reads it.
    uri: Uri,
    headers: HeaderMap,
    /// The client's own validators, taken off the guest's request.
    if_none_match: Option<HeaderValue>,
    if_modified_since: Option<HeaderValue>,
}

/// Where a request came from, as the cache keys and trusts it.
#[derive(Debug, Clone, Copy)]
pub struct Asking<'a> {
    /// It came over TLS.
    pub https: bool,
    /// The host it is for, as routed (without its port).
    pub host: &'a str,
    /// Its peer is a trusted proxy, whose forwarding headers stand.
    pub trusted: bool,
}

/// The request as `http-cache-semantics` reads it.
struct Asked<'a> {
    method: &'a Method,
    uri: &'a Uri,
    headers: &'a HeaderMap,
}

impl RequestLike for Asked<'_> {
    fn uri(&self) -> Uri {
        self.uri.clone()
    }
    fn is_same_uri(&self, other: &Uri) -> bool {
        self.uri == other
    }
    fn method(&self) -> &Method {
        self.method
    }
    fn headers(&self) -> &HeaderMap {
        self.headers
    }
}

/// The answer as the policy reads it: `CDN-Cache-Control` standing for `Cache-Control` (and
/// `Expires`) when the guest sends it.
struct Answered<'a> {
    status: StatusCode,
    headers: std::borrow::Cow<'a, HeaderMap>,
}

impl ResponseLike for Answered<'_> {
    fn status(&self) -> StatusCode {
        self.status
    }
    fn headers(&self) -> &HeaderMap {
        &self.headers
    }
}

/// What the policy is asked with: only explicit freshness, a shared cache's rules.
fn options() -> CacheOptions {
    CacheOptions {
        shared: true,
        cache_heuristic: 0.0,
        immutable_min_time_to_live: Duration::ZERO,
        ignore_cargo_cult: false,
    }
}

impl Cache {
    /// A tenant's empty cache, counted under its metrics `label`.
    pub fn new(config: &CacheConfig, metrics: &crate::metrics::Metrics, label: &str) -> Self {
        let evictions = metrics.cache_evictions.with_label_values(&[label]);
        let stored_bytes = metrics.cache_stored_bytes.with_label_values(&[label]);
        // Every entry that leaves (replaced, stale, evicted, purged) gives its bytes back.
        let held = stored_bytes.clone();
        let entries = moka::sync::Cache::builder()
            .max_capacity(config.max_mib * 1024 * 1024)
            .weigher(|_, entry: &Arc<Entry>| entry.weight())
            .expire_after(Expire)
            .eviction_listener(move |_, entry: Arc<Entry>, cause| {
                held.sub(i64::from(entry.weight()));
                if cause == moka::notification::RemovalCause::Size {
                    evictions.inc();
                }
            })
            .build();
        let result = |r| metrics.cache_requests.with_label_values(&[label, r]);
        Self {
            entries,
            filling: std::sync::Mutex::default(),
            passes: moka::sync::Cache::builder()
                .max_capacity(PASSES)
                .time_to_live(PASS_FOR)
                .build(),
            hasher: std::hash::RandomState::new(),
            max_object: usize::try_from(config.max_object_kib * 1024).unwrap_or(usize::MAX),
            store_set_cookie: config.store_set_cookie,
            counts: Counts {
                hit: result("hit"),
                collapsed: result("collapsed"),
                miss: result("miss"),
                bypass: result("bypass"),
                stored_bytes,
            },
        }
    }

    fn hash(&self, https: bool, host: &str, target: &str) -> u64 {
        let mut h = self.hasher.build_hasher();
        h.write_u8(u8::from(https));
        for b in host.bytes() {
            h.write_u8(b.to_ascii_lowercase());
        }
        h.write_u8(0xff);
        h.write(target.as_bytes());
        h.finish()
    }

    /// Looks `req` up: a fresh stored answer, or what to do with the guest's. A storable miss of a key
    /// another request is filling waits for that answer (at most [`COLLAPSE_WAIT`]) and is
    /// answered with it when it was stored.
    pub async fn lookup<B>(self: &Arc<Self>, req: &Request<B>, asked: Asking<'_>) -> Lookup {
        let Asking {
            https,
            host,
            trusted,
        } = asked;
        let mut looked = self.look(req, https, host, false);
        if let Lookup::Miss(fill) = &mut looked
            && !trusted
            && matches!(fill.then, Then::Store(_))
            && UNKEYED.iter().any(|h| req.headers().contains_key(*h))
        {
            fill.then = Then::Pass;
            fill.detail = Some("unkeyed-header");
        }
        let mut waited = false;
        if let Lookup::Miss(fill) = &mut looked
            && let Then::Store(s) = &fill.then
            && !self.passes.contains_key(&s.hash)
        {
            let hash = s.hash;
            let follow = {
                let mut filling = self
                    .filling
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                match filling.entry(hash) {
                    std::collections::hash_map::Entry::Occupied(f) => Some(f.get().subscribe()),
                    std::collections::hash_map::Entry::Vacant(v) => {
                        v.insert(tokio::sync::watch::channel(()).0);
                        None
                    }
                }
            };
            match follow {
                // This one fills the key; the misses behind it wait until its fill ends.
                None => fill.leads = true,
                Some(mut filled) => {
                    // The one filling drops its sender when it ends: `changed` returns.
                    let _ = tokio::time::timeout(COLLAPSE_WAIT, filled.changed()).await;
                    waited = true;
                    looked = self.look(req, https, host, true);
                }
            }
        }
        match &looked {
            Lookup::Hit(_) if waited => self.counts.collapsed.inc(),
            Lookup::Hit(_) => self.counts.hit.inc(),
            Lookup::Miss(f) if f.fwd == "method" => self.counts.bypass.inc(),
            Lookup::Miss(_) => self.counts.miss.inc(),
        }
        looked
    }

    /// One look at the store for `req` (`waited`: after waiting for another request's fill).
    fn look<B>(
        self: &Arc<Self>,
        req: &Request<B>,
        https: bool,
        host: &str,
        waited: bool,
    ) -> Lookup {
        let method = req.method();
        let (get, head) = (method == Method::GET, method == Method::HEAD);
        let target = req
            .uri()
            .path_and_query()
            .map_or("/", http::uri::PathAndQuery::as_str);
        let hash = self.hash(https, host, target);
        let miss = |fwd, then| {
            Lookup::Miss(Fill {
                cache: self.clone(),
                fwd,
                then,
                leads: false,
                collapsed: waited,
                detail: None,
            })
        };
        if !get && !head {
            let unsafe_method = method == Method::POST
                || method == Method::PUT
                || method == Method::PATCH
                || method == Method::DELETE;
            let then = if unsafe_method {
                Then::Invalidate(hash)
            } else {
                Then::Pass
            };
            return miss("method", then);
        }
        let mut fwd = "uri-miss";
        if let Some(entry) = self.entries.get(&hash)
            && entry.is_for(https, host, target)
        {
            fwd = "vary-miss";
            let now = Instant::now();
            // The request's own directives are RFC 9111's to weigh; without them a variant is
            // fresh for what it was stored with.
            let directives = req.headers().contains_key(header::CACHE_CONTROL)
                || req.headers().contains_key(header::PRAGMA);
            for v in &entry.variants {
                if !v.vary_matches(req.headers()) {
                    continue;
                }
                let fresh = if directives {
                    let asked = Asked {
                        method: &Method::GET,
                        uri: req.uri(),
                        headers: req.headers(),
                    };
                    matches!(
                        v.policy.before_request(&asked, SystemTime::now()),
                        BeforeRequest::Fresh(_)
                    )
                } else {
                    v.fresh_at(now)
                };
                if fresh {
                    let mut resp = hit(v, req.headers(), now);
                    if waited {
                        append_param(&mut resp, "collapsed");
                    }
                    return Lookup::Hit(resp);
                }
                fwd = if directives { "request" } else { "stale" };
                break;
            }
        }
        // Only a bodiless GET's answer is stored: a body the key does not hold must not
        // choose what others are answered.
        let has_body = crate::body::declared_length(req.headers()).is_some_and(|n| n > 0)
            || req.headers().contains_key(header::TRANSFER_ENCODING);
        if head || has_body {
            return miss(fwd, Then::Pass);
        }
        miss(
            fwd,
            Then::Store(Box::new(Storing {
                hash,
                https,
                host: host.into(),
                target: target.into(),
                uri: req.uri().clone(),
                headers: req.headers().clone(),
                if_none_match: None,
                if_modified_since: None,
            })),
        )
    }

    /// Drops the stored answers `purge` names; how many keys it named (every key for
    /// `all`, else those whose path starts with a prefix or whose answers carry a tag).
    ///
    /// # Errors
    /// A purge naming nothing, or more than one way, in words for the API.
    pub fn purge(&self, purge: &Purge) -> Result<u64, String> {
        let ways = usize::from(purge.all)
            + usize::from(!purge.prefixes.is_empty())
            + usize::from(!purge.tags.is_empty());
        if ways != 1 {
            return Err(
                "a purge names one of: {\"all\": true}, {\"prefixes\": [\"/path\", ...]}, \
                 {\"tags\": [\"tag\", ...]}"
                    .into(),
            );
        }
        if let Some(p) = purge.prefixes.iter().find(|p| !p.starts_with('/')) {
            return Err(format!(
                "a purge prefix is a path starting with '/', not {p:?}"
            ));
        }
        if purge.all {
            let count = self.entries.iter().count() as u64;
            self.entries.invalidate_all();
            return Ok(count);
        }
        // Prefixes in the normal form the keys are in (`/caf%c3%a9` is `/caf%C3%A9`).
        let prefixes = purge
            .prefixes
            .iter()
            .map(|p| crate::target::normalize(p).map(std::borrow::Cow::into_owned))
            .collect::<Result<Vec<String>, _>>()
            .map_err(|why| format!("a purge prefix: {why}"))?;
        let mut purged = 0;
        for (hash, entry) in &self.entries {
            let named = prefixes
                .iter()
                .any(|p| entry.target.starts_with(p.as_str()))
                || entry
                    .variants
                    .iter()
                    .any(|v| v.tags.iter().any(|t| purge.tags.iter().any(|n| **t == **n)));
            if named {
                self.entries.invalidate(&*hash);
                purged += 1;
            }
        }
        Ok(purged)
    }
}

/// Entries leave when their freshest variant goes stale.
struct Expire;

impl moka::Expiry<u64, Arc<Entry>> for Expire {
    fn expire_after_create(&self, _: &u64, entry: &Arc<Entry>, now: Instant) -> Option<Duration> {
        entry
            .variants
            .iter()
            .map(|v| {
                v.fresh_for
                    .saturating_sub(now.saturating_duration_since(v.stored))
            })
            .max()
    }

    fn expire_after_update(
        &self,
        key: &u64,
        entry: &Arc<Entry>,
        now: Instant,
        _: Option<Duration>,
    ) -> Option<Duration> {
        self.expire_after_create(key, entry, now)
    }
}

impl Entry {
    /// Whether it holds the key `https`, `host`, `target` (its hash may be another key's).
    fn is_for(&self, https: bool, host: &str, target: &str) -> bool {
        self.https == https && self.host.eq_ignore_ascii_case(host) && &*self.target == target
    }

    /// Bytes it holds, roughly: what the cache's size counts.
    fn weight(&self) -> u32 {
        let key = self.host.len() + self.target.len() + 64;
        let bytes = self.variants.iter().fold(key, |n, v| {
            let headers: usize = v
                .headers
                .iter()
                .map(|(k, v)| k.as_str().len() + v.len() + 32)
                .sum();
            n + v.body.len() + headers + 256
        });
        u32::try_from(bytes).unwrap_or(u32::MAX)
    }
}

impl Fill {
    /// Takes the client's validators (`If-None-Match`, `If-Modified-Since`) off `req` when its
    /// answer may be stored: the guest answers in full, and [`Fill::answered`] answers them.
    pub fn take_validators<B>(&mut self, req: &mut Request<B>) {
        if let Then::Store(s) = &mut self.then {
            let headers = req.headers_mut();
            s.if_none_match = headers.remove(header::IF_NONE_MATCH);
            s.if_modified_since = headers.remove(header::IF_MODIFIED_SINCE);
            s.headers.remove(header::IF_NONE_MATCH);
            s.headers.remove(header::IF_MODIFIED_SINCE);
        }
    }

    /// The guest's answer `resp`, as the client gets it: stored when it may be (then a `304`
    /// if the client's validators match it), its key invalidated after an unsafe method, and
    /// `Cache-Status` saying which.
    pub fn answered(self, mut resp: Response<ResponseBody>) -> Response<ResponseBody> {
        let cache = &self.cache;
        let mut stored = false;
        match &self.then {
            Then::Pass => {}
            Then::Invalidate(hash) => {
                if resp.status().is_success() || resp.status().is_redirection() {
                    cache.entries.invalidate(hash);
                }
            }
            Then::Store(storing) => {
                if let ResponseBody::Full(Some(body)) = resp.body()
                    && let Some(variant) = cache.storable(storing, &resp, body)
                {
                    let variant = Arc::new(variant);
                    cache.insert(storing, variant.clone());
                    stored = true;
                    if not_modified(
                        &variant.headers,
                        storing.if_none_match.as_ref(),
                        storing.if_modified_since.as_ref(),
                    ) {
                        resp = respond(&variant, true, variant.stored);
                    }
                }
                // A fill that proved not storable by its headers (not a failure of the
                // moment): its key's misses stop waiting in line for a while.
                if !stored && !resp.status().is_server_error() {
                    cache.passes.insert(storing.hash, ());
                }
            }
        }
        // Tags are for the edge's purges, not the client (stored ones were taken off already).
        resp.headers_mut().remove(&SURROGATE_KEY);
        resp.headers_mut().remove(&CACHE_TAG);
        let mut status = format!("tern; fwd={}", self.fwd);
        if self.collapsed {
            status.push_str("; collapsed");
        }
        if let Some(detail) = self.detail {
            status.push_str("; detail=");
            status.push_str(detail);
        }
        if stored {
            status.push_str("; stored");
        }
        if let Ok(value) = HeaderValue::from_str(&status) {
            resp.headers_mut().insert(CACHE_STATUS.clone(), value);
        }
        resp
    }
}

impl Cache {
    /// The variant `resp` (whose whole body is `body`) makes for the request `s`, when it may
    /// be stored.
    fn storable(
        &self,
        s: &Storing,
        resp: &Response<ResponseBody>,
        body: &Bytes,
    ) -> Option<Variant> {
        if body.len() > self.max_object {
            return None;
        }
        let headers = resp.headers();
        if !self.store_set_cookie && headers.contains_key(header::SET_COOKIE) {
            return None;
        }
        // The fields the answer varies on, and always `Authorization`: an answer to one
        // client's credentials (stored only when it says it may be) is served to the same
        // credentials only, and an anonymous one never to a request that has them.
        // `Vary: *` (no request matches it) and names that are not header names: not stored.
        let mut vary_names = vec![header::AUTHORIZATION];
        for name in headers
            .get_all(header::VARY)
            .iter()
            .map(|v| v.to_str().ok())
            .collect::<Option<Vec<_>>>()?
            .into_iter()
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|n| !n.is_empty())
        {
            if name == "*" {
                return None;
            }
            let name = HeaderName::from_bytes(name.as_bytes()).ok()?;
            if !vary_names.contains(&name) {
                vary_names.push(name);
            }
        }
        let answered = Answered {
            status: resp.status(),
            headers: match headers.get(&CDN_CACHE_CONTROL) {
                Some(cdn) => {
                    let mut h = headers.clone();
                    h.insert(header::CACHE_CONTROL, cdn.clone());
                    h.remove(header::EXPIRES);
                    std::borrow::Cow::Owned(h)
                }
                None => std::borrow::Cow::Borrowed(headers),
            },
        };
        let asked = Asked {
            method: &Method::GET,
            uri: &s.uri,
            headers: &s.headers,
        };
        let now = SystemTime::now();
        let policy = CachePolicy::new_options(&asked, &answered, now, options());
        let fresh_for = policy.time_to_live(now);
        if !policy.is_storable() || fresh_for.is_zero() {
            return None;
        }
        let mut stored_headers = headers.clone();
        stored_headers.remove(header::CONTENT_LENGTH);
        stored_headers.remove(CACHE_STATUS.clone());
        let tags = take_tags(&mut stored_headers);
        Some(Variant {
            status: resp.status(),
            headers: stored_headers,
            body: body.clone(),
            vary: vary_names
                .into_iter()
                .map(|n| {
                    let value = s.headers.get(&n).cloned();
                    (n, value)
                })
                .collect(),
            stored: Instant::now(),
            age_at_store: policy.age(now),
            fresh_for,
            policy,
            tags,
        })
    }

    /// Stores `variant` under `s`'s key, beside the key's other variants.
    fn insert(&self, s: &Storing, variant: Arc<Variant>) {
        let mut variants: Vec<Arc<Variant>> = match self.entries.get(&s.hash) {
            Some(e) if e.is_for(s.https, &s.host, &s.target) => e
                .variants
                .iter()
                .filter(|v| v.vary != variant.vary)
                .cloned()
                .collect(),
            _ => Vec::new(),
        };
        if variants.len() >= MAX_VARIANTS {
            variants.remove(0);
        }
        variants.push(variant);
        let entry = Arc::new(Entry {
            https: s.https,
            host: s.host.clone(),
            target: s.target.clone(),
            variants,
        });
        self.counts.stored_bytes.add(i64::from(entry.weight()));
        self.entries.insert(s.hash, entry);
    }
}
