//! The cache itself: its entries (one per key, with up to [`MAX_VARIANTS`] variants), the fills
//! in flight (one per key; the others wait for it), and the lookups and stores that every space
//! shares. Filling and revalidating are `fill.rs`'s, a guest's own entries `guest.rs`'s.

use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri};
use http_cache_semantics::{BeforeRequest, CacheOptions, RequestLike, ResponseLike};
use prometheus::IntGauge;

use crate::body::ResponseBody;
use crate::hashed::Hashed;

use super::answer::{Asks, append_param, hit};
use super::config::{CacheConfig, Purge};
use super::entries::{Changes, Entries, Keyed};
use super::space::{Counted, Counts, Space};
use super::variant::Variant;
use super::{key, purged};

/// Most variants (`Vary`) kept of one key; a new one replaces the oldest.
pub(super) const MAX_VARIANTS: usize = 8;
/// How long a key whose fill was not storable is not collapsed (its misses run side by side).
pub(super) const PASS_FOR: Duration = Duration::from_secs(10);
/// Most keys remembered as not storable.
pub(super) const PASSES: u64 = 100_000;
/// The longest a miss waits for another request filling its key (then its guest runs).
pub const COLLAPSE_WAIT: Duration = Duration::from_secs(30);
pub(super) static CDN_CACHE_CONTROL: HeaderName = HeaderName::from_static("cdn-cache-control");
/// One tenant's cache.
pub struct Cache {
    /// The stored entries, and each thread's copies of those it hits.
    pub(super) entries: Entries,
    /// Keys a guest is filling now: later misses of the key wait for its answer.
    pub(super) filling:
        std::sync::Mutex<std::collections::HashMap<u64, tokio::sync::watch::Sender<()>, Hashed>>,
    /// Keys whose last fill proved not storable: their misses run at once, side by side
    /// (hit-for-pass), for [`PASS_FOR`].
    pub(super) passes: moka::sync::Cache<u64, (), Hashed>,
    /// Keys are hashed with a per-cache random key: a client cannot aim at one slot.
    pub(super) hasher: std::hash::RandomState,
    /// How requests are keyed (`ignore_query`, `sort_query`, `key_headers`).
    pub(super) keying: key::Keying,
    pub(super) max_object: usize,
    pub(super) store_set_cookie: bool,
    pub(super) store_cookie_requests: bool,
    /// Its front's counts (its backends' are their own).
    pub(super) counts: Counts,
    /// Purges, against the fills in flight that they name.
    pub(super) purges: purged::Purges,
    pub(super) stored_bytes: IntGauge,
    /// Bytes its entries hold now, given back to `tern_cache_stored_bytes` when a deploy or
    /// a change of settings drops the cache.
    pub(super) held: Arc<std::sync::atomic::AtomicI64>,
    /// The versions its front answers for ([`Space::Front`]), each while a tenant version
    /// holds it ([`Serving`]): the current one and its candidate's, which share the cache, and
    /// one replaced until its last request ends. A write through one invalidates the others'
    /// keys too.
    pub(super) versions: std::sync::Mutex<Vec<std::sync::Weak<u64>>>,
}

/// Held by a tenant version while it answers from a cache's front: a write through any
/// version sharing the cache invalidates this one's keys too (see [`Cache::serves_version`]).
#[derive(Debug)]
pub struct Serving(#[allow(dead_code, reason = "held for its count")] Arc<u64>);

/// A key's bytes before its host: its space, version and scheme.
const KEY_HEAD: usize = 10;
/// Room on the stack for a key hashed in one write (see [`Cache::hash`]).
const KEY_ON_STACK: usize = 256;

impl Drop for Cache {
    fn drop(&mut self) {
        let held = self
            .held
            .swap(i64::MIN / 2, std::sync::atomic::Ordering::Relaxed);
        self.stored_bytes.sub(held.max(0));
    }
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache")
            .field("entries", &self.entries.entry_count())
            .field("bytes", &self.entries.weighted_size())
            .finish_non_exhaustive()
    }
}

/// What the cache did with a request.
pub enum Lookup {
    /// Answered from the cache.
    Hit(Response<ResponseBody>),
    /// Answered with a stale stored answer (`stale-while-revalidate`); the guest is asked
    /// for a new one in the background, with [`Fill`] storing it (see [`Fill::refresh`]).
    Refresh(Response<ResponseBody>, Fill),
    /// The guest answers; [`Fill::answered`] then stores what may be stored.
    Miss(Fill),
}

/// A request the guest answers, and what the cache does with the answer.
pub struct Fill {
    pub(super) cache: Arc<Cache>,
    /// Whose answer it fills (where it is counted).
    pub(super) space: Space,
    /// `Cache-Status`'s forward reason.
    pub(super) fwd: &'static str,
    pub(super) then: Then,
    /// Other misses of the key wait for this one while it holds the key's place in `filling`
    /// (until the answer is stored, or proves not to be).
    pub(super) lead: Option<Lead>,
    /// It waited for another request's fill first.
    pub(super) collapsed: bool,
    /// Why it is not stored, when the request decided it (`Cache-Status`'s `detail`).
    pub(super) detail: Option<&'static str>,
    /// What it is counted as (when it is dropped).
    pub(super) counted: Counted,
}

impl Drop for Fill {
    fn drop(&mut self) {
        let counts = self.space.counts(&self.cache.counts);
        match self.counted {
            Counted::Miss => counts.miss.inc(),
            Counted::Bypass => counts.bypass.inc(),
            Counted::Revalidated => counts.revalidated.inc(),
            Counted::Stale => counts.stale.inc(),
            Counted::Uncounted => {}
        }
    }
}

/// The place of the request filling a key: the misses of the key wait until it is dropped.
pub(super) struct Lead {
    pub(super) cache: Arc<Cache>,
    pub(super) hash: u64,
}

impl Drop for Lead {
    fn drop(&mut self) {
        // Ends the wait of the misses behind it, answered or not (a failure, a client that
        // left): they look up again.
        self.cache
            .filling
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&self.hash);
    }
}

pub(super) enum Then {
    /// Nothing is stored.
    Pass,
    /// A non-error answer invalidates the key, for every version that answers in front of
    /// the cache (a write through one version makes the other's stored answer stale too).
    Invalidate(Box<[u64]>),
    /// A storable answer is stored under the key.
    Store(Box<Storing>),
}

#[derive(Clone)]
pub(super) struct Storing {
    pub(super) hash: u64,
    pub(super) space: u8,
    /// [`Space::version`].
    pub(super) version: u64,
    pub(super) https: bool,
    pub(super) host: Box<str>,
    pub(super) target: Box<str>,
    /// The request as the policy reads it.
    pub(super) uri: Uri,
    pub(super) headers: HeaderMap,
    /// The client's own validators, taken off the guest's request.
    pub(super) if_none_match: Option<HeaderValue>,
    pub(super) if_modified_since: Option<HeaderValue>,
    /// The client's `Range` and `If-Range`, taken off too: the guest answers whole, and the
    /// range is cut from the stored answer.
    pub(super) range: Option<HeaderValue>,
    pub(super) if_range: Option<HeaderValue>,
    /// Its key's last fill proved not storable (hit-for-pass): it ran without waiting.
    pub(super) passing: bool,
    /// The cache's purge generation when the request was looked up: a purge since then that
    /// names the answer keeps it from being stored.
    pub(super) generation: u64,
    /// Its key's invalidations when the request was looked up ([`Cache::since`]): a `POST`,
    /// `PUT`, `PATCH` or `DELETE` answered since then keeps the answer from being stored.
    pub(super) invalidations: u64,
    /// The stale answer this request revalidates (its validators go to the guest; a `304`
    /// keeps its body) and serves if the guest fails within its `stale-if-error`.
    pub(super) stale: Option<Arc<Variant>>,
    /// The freshness the requester set (`max-age=N`), standing for the answer's own
    /// `Cache-Control` and `Expires` as a `CDN-Cache-Control` would.
    pub(super) ttl: Option<HeaderValue>,
    /// Tags the requester added to the answer's own.
    pub(super) tags: Vec<Box<str>>,
}

impl Storing {
    /// What storing the answer to `req` under key `hash` (of `space` and `key`: scheme, host
    /// and target) needs, before the request's validators and the requester's overrides.
    pub(super) fn new<B>(
        hash: u64,
        (space, version): (u8, u64),
        key: (bool, &str, &str),
        req: &Request<B>,
        (generation, invalidations): (u64, u64),
    ) -> Self {
        let (https, host, target) = key;
        Self {
            hash,
            space,
            version,
            https,
            host: host.into(),
            target: target.into(),
            uri: req.uri().clone(),
            headers: req.headers().clone(),
            if_none_match: None,
            if_modified_since: None,
            range: None,
            if_range: None,
            passing: false,
            generation,
            invalidations,
            stale: None,
            ttl: None,
            tags: Vec::new(),
        }
    }
}

/// Where a request came from, as the cache keys and trusts it.
#[derive(Debug, Clone)]
pub struct Asking<'a> {
    /// It came over TLS.
    pub https: bool,
    /// The authority it is for, as its guest sees it (a port included when the client sent
    /// one); compared without regard to case.
    pub host: &'a str,
    /// Its peer is a trusted proxy, whose forwarding headers stand (a guest's request to a
    /// backend is trusted: the guest chose what it sent).
    pub trusted: bool,
    /// Whose answers it looks for.
    pub space: Space,
    /// The tenant's compression, and what this request asked of it: a hit is served as the
    /// stored answer's copy in the client's encoding.
    pub compress: Option<(&'a crate::compress::Compression, crate::compress::Asked)>,
    /// The request may carry a body: its stream had not ended with its head (HTTP/2 and
    /// HTTP/3 send a body with no `Content-Length` after a head without END_STREAM / FIN).
    /// Its answer is not stored, since the key does not hold the body.
    pub body: bool,
    /// When it asks: its first look judges freshness and age at this time (a caller that has
    /// just read the clock gives that reading); a look after waiting for another request's
    /// fill reads the clock again.
    pub at: Instant,
    /// Which of the headers a look reads it may carry ([`crate::context::Present::CACHE`]):
    /// a request with none of them is looked up without reading its headers again.
    pub present: crate::context::Present,
}

/// The request as `http-cache-semantics` reads it.
pub(super) struct Asked<'a> {
    pub(super) method: &'a Method,
    pub(super) uri: &'a Uri,
    pub(super) headers: &'a HeaderMap,
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
pub(super) struct Answered<'a> {
    pub(super) status: StatusCode,
    pub(super) headers: std::borrow::Cow<'a, HeaderMap>,
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
pub(super) fn options() -> CacheOptions {
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
        let held = Arc::new(std::sync::atomic::AtomicI64::new(0));
        let (gauge, left) = (stored_bytes.clone(), held.clone());
        // Every entry that leaves is a change the threads' copies must see.
        let changes = Arc::new(Changes::default());
        let changed = changes.clone();
        let store = moka::sync::Cache::builder()
            .max_capacity(config.max_mib * 1024 * 1024)
            .weigher(|_, entry: &Arc<Keyed>| entry.weight())
            .expire_after(Expire)
            .eviction_listener(move |_, entry: Arc<Keyed>, cause| {
                let weight = i64::from(entry.weight());
                // (Negative once the cache was dropped and gave back what it held.)
                if left.fetch_sub(weight, std::sync::atomic::Ordering::Relaxed) >= 0 {
                    gauge.sub(weight);
                }
                if cause == moka::notification::RemovalCause::Size {
                    evictions.inc();
                }
                changed.changed();
            })
            .build_with_hasher(Hashed::default());
        let result = |r: &str| metrics.cache_requests.with_label_values(&[label, r]);
        Self {
            entries: Entries::new(store, changes),
            filling: std::sync::Mutex::default(),
            passes: moka::sync::Cache::builder()
                .max_capacity(PASSES)
                .time_to_live(PASS_FOR)
                .build_with_hasher(Hashed::default()),
            hasher: std::hash::RandomState::new(),
            keying: key::Keying::new(&config.ignore_query, config.sort_query, &config.key_headers),
            max_object: usize::try_from(config.max_object_kib * 1024).unwrap_or(usize::MAX),
            store_set_cookie: config.store_set_cookie,
            store_cookie_requests: config.store_cookie_requests,
            counts: Counts::new(result),
            purges: purged::Purges::default(),
            versions: std::sync::Mutex::default(),
            stored_bytes,
            held,
        }
    }

    /// Its front answers for `version` too (a tenant's version using it: [`Space::Front`]),
    /// as long as what this returns is held: however many versions come and go beside it, a
    /// write through one of them invalidates its keys.
    pub fn serves_version(&self, version: u64) -> Serving {
        let mut versions = self.versions.lock().unwrap_or_else(|e| e.into_inner());
        versions.retain(|v| v.strong_count() > 0);
        if let Some(held) = (versions.iter())
            .filter_map(std::sync::Weak::upgrade)
            .find(|held| **held == version)
        {
            return Serving(held);
        }
        let held = Arc::new(version);
        versions.push(Arc::downgrade(&held));
        Serving(held)
    }

    /// The versions its front answers for now, but `own`.
    fn other_versions(&self, own: u64) -> Vec<u64> {
        let versions = self.versions.lock().unwrap_or_else(|e| e.into_inner());
        let mut others: Vec<u64> = (versions.iter())
            .filter_map(|v| v.upgrade().map(|held| *held))
            .filter(|v| *v != own)
            .collect();
        others.sort_unstable();
        others.dedup();
        others
    }

    pub(super) fn hash(
        &self,
        (space, version): (u8, u64),
        https: bool,
        host: &str,
        target: &str,
    ) -> u64 {
        let mut h = self.hasher.build_hasher();
        let mut head = [0; KEY_HEAD];
        head[0] = space;
        head[1..9].copy_from_slice(&version.to_le_bytes());
        head[9] = u8::from(https);
        // The hasher streams (pieces hash as their bytes in one write would), but each write
        // costs its own setup: a usual key is laid out on the stack and hashed in one write
        // (700 -> 465 instructions a hit, callgrind), host lower-cased there. The bytes are
        // the same either way: a host is UTF-8 and never holds the 0xff that ends it.
        let len = KEY_HEAD + host.len() + 1 + target.len();
        if len <= KEY_ON_STACK {
            let mut key = [0; KEY_ON_STACK];
            let (at_host, at_target) = (KEY_HEAD, KEY_HEAD + host.len() + 1);
            key[..KEY_HEAD].copy_from_slice(&head);
            key[at_host..at_target - 1].copy_from_slice(host.as_bytes());
            key[at_host..at_target - 1].make_ascii_lowercase();
            key[at_target - 1] = 0xff;
            key[at_target..len].copy_from_slice(target.as_bytes());
            h.write(&key[..len]);
            return h.finish();
        }
        h.write(&head);
        // The host as one write, lower-cased on the stack when it needs to be.
        if host.bytes().any(|b| b.is_ascii_uppercase()) {
            let mut lower = [0u8; 64];
            for chunk in host.as_bytes().chunks(lower.len()) {
                let lower = &mut lower[..chunk.len()];
                lower.copy_from_slice(chunk);
                lower.make_ascii_lowercase();
                h.write(lower);
            }
        } else {
            h.write(host.as_bytes());
        }
        h.write_u8(0xff);
        h.write(target.as_bytes());
        h.finish()
    }

    /// Looks `req` up: a fresh stored answer, or what to do with the guest's. A storable miss
    /// of a key another request is filling waits for that answer (at most [`COLLAPSE_WAIT`])
    /// and is answered with it when it was stored.
    pub async fn lookup<B>(self: &Arc<Self>, req: &Request<B>, asked: Asking<'_>) -> Lookup {
        // The request's headers a look reads, found once for every look below.
        let asks = if asked.present.has(crate::context::Present::CACHE) {
            Asks::of(req.headers())
        } else {
            Asks::default()
        };
        let mut looked = self.look(req, &asked, &asks, None);
        // A miss waits while another request fills its key. If that fill failed (a trap, a
        // deadline, a 5xx: nothing stored, and no pass), one of those waiting fills it next
        // and the rest wait on, so a failing guest is not run by every waiting request at
        // once; all within COLLAPSE_WAIT, after which a request runs the guest itself.
        // (Read off the clock when a miss first waits: a hit never does.)
        let mut patience = None;
        while let Lookup::Miss(fill) = &mut looked
            && let Then::Store(s) = &mut fill.then
        {
            if self.passes.contains_key(&s.hash) {
                // Not storable lately: runs at once (and does not renew the pass).
                s.passing = true;
                break;
            }
            let hash = s.hash;
            let Some(mut filled) = self.lead(hash) else {
                // This one fills the key; the misses behind it wait until its fill ends.
                let lead = Lead {
                    cache: self.clone(),
                    hash,
                };
                // The request that filled it before may have stored its answer and ended its
                // fill between the look above and this one's taking the lead: looked at once
                // more, with the lead held, else both would fill it. (Counted by what that
                // look finds.)
                fill.counted = Counted::Uncounted;
                let waited = fill.collapsed.then(Instant::now);
                looked = self.look(req, &asked, &asks, waited);
                if let Lookup::Miss(fill) = &mut looked
                    && matches!(fill.then, Then::Store(_))
                {
                    fill.lead = Some(lead);
                }
                break;
            };
            let now = Instant::now();
            let patience = *patience.get_or_insert(now + COLLAPSE_WAIT);
            let left = patience.saturating_duration_since(now);
            if left.is_zero() {
                break;
            }
            // The one filling drops its sender when it ends: `changed` returns.
            let _ = tokio::time::timeout(left, filled.changed()).await;
            // Counted by what the next look finds.
            fill.counted = Counted::Uncounted;
            looked = self.look(req, &asked, &asks, Some(Instant::now()));
        }
        looked
    }

    /// What a fill of key `hash` notes before its answer is asked for: the purges' generation
    /// and the key's invalidations (a purge or an invalidation since keeps its answer out).
    pub(super) fn since(&self, hash: u64) -> (u64, u64) {
        (self.purges.generation(), self.entries.invalidations(hash))
    }

    /// Takes the place of the request filling key `hash`, if no other request holds it (then
    /// `None`); else a receiver that changes when that fill ends.
    pub(super) fn lead(&self, hash: u64) -> Option<tokio::sync::watch::Receiver<()>> {
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
    }

    /// One look at the store for `req`, whose headers `asks` read (`waited`: after waiting for
    /// another request's fill, the time it ended; else the look is at `asked.at`).
    pub(super) fn look<B>(
        self: &Arc<Self>,
        req: &Request<B>,
        asked: &Asking<'_>,
        asks: &Asks<'_>,
        waited: Option<Instant>,
    ) -> Lookup {
        let (now, waited) = (waited.unwrap_or(asked.at), waited.is_some());
        // It carries a header that could shape an answer the key does not hold.
        let unkeyed = !asked.trusted && asks.unkeyed;
        let (https, host, compress) = (asked.https, asked.host, asked.compress);
        let space = (asked.space.tag(), asked.space.version());
        let counts = asked.space.counts(&self.counts);
        let method = req.method();
        let (get, head) = (method == Method::GET, method == Method::HEAD);
        let target = req
            .uri()
            .path_and_query()
            .map_or("/", http::uri::PathAndQuery::as_str);
        // A backend's answers are keyed by what was sent to it, a guest's entries by the key
        // it gave; the tenant's keying settings are for its clients' requests.
        let key = match asked.space {
            Space::Front(_) => self.keying.key(target, req.headers()),
            Space::Backend(_) | Space::Guest(_) => std::borrow::Cow::Borrowed(target),
        };
        let target = &*key;
        let hash = self.hash(space, https, host, target);
        let fill = |fwd, then, counted| Fill {
            cache: self.clone(),
            space: asked.space.clone(),
            fwd,
            then,
            lead: None,
            collapsed: waited,
            detail: None,
            counted,
        };
        if !get && !head {
            let unsafe_method = method == Method::POST
                || method == Method::PUT
                || method == Method::PATCH
                || method == Method::DELETE;
            let then = if unsafe_method {
                let mut hashes = vec![hash];
                if let Space::Front(own) = asked.space {
                    hashes.extend(
                        (self.other_versions(own).into_iter())
                            .map(|v| self.hash((space.0, v), https, host, target)),
                    );
                }
                Then::Invalidate(hashes.into())
            } else {
                Then::Pass
            };
            return Lookup::Miss(fill("method", then, Counted::Bypass));
        }
        // Only a bodiless GET's answer is stored: a body the key does not hold must not
        // choose what others are answered.
        let has_body = asked.body
            || crate::body::length_of(asks.content_length).is_some_and(|n| n > 0)
            || asks.transfer_encoding;
        let storing = |stale: Option<Arc<Variant>>| {
            let mut s = Storing::new(hash, space, (https, host, target), req, self.since(hash));
            s.stale = stale;
            Then::Store(Box::new(s))
        };
        let mut fwd = "uri-miss";
        let mut stale = None;
        if let Some(entry) = self.entries.look(hash, now)
            && entry.is_for(space, https, host, target)
        {
            fwd = "vary-miss";
            // The request's own directives are RFC 9111's to weigh; without them a variant is
            // fresh for what it was stored with.
            let directives = asks.directives;
            if let Some(v) = entry
                .variants
                .iter()
                .find(|v| v.vary_matches(req.headers()))
            {
                let fresh = if directives {
                    let asked = Asked {
                        method: &Method::GET,
                        uri: req.uri(),
                        headers: req.headers(),
                    };
                    !v.purged
                        && matches!(
                            v.policy.before_request(&asked, SystemTime::now()),
                            BeforeRequest::Fresh(_)
                        )
                } else {
                    v.fresh_at(now)
                };
                if fresh {
                    let mut resp = self.compressed(hash, v, hit(v, asks, now), compress);
                    if waited {
                        append_param(&mut resp, "collapsed");
                        counts.collapsed.inc();
                    } else {
                        counts.hit.inc();
                    }
                    return Lookup::Hit(resp);
                }
                if !directives && v.serves_while_revalidating(now) {
                    // Served stale at once; one request at a time refreshes it in the
                    // background (none for a request whose headers could shape the answer).
                    let mut resp = self.compressed(hash, v, hit(v, asks, now), compress);
                    append_param(&mut resp, "detail=stale-while-revalidate");
                    counts.stale.inc();
                    if get && !has_body && !unkeyed && self.lead(hash).is_none() {
                        let mut refresh =
                            fill("stale", storing(Some(v.clone())), Counted::Uncounted);
                        refresh.lead = Some(Lead {
                            cache: self.clone(),
                            hash,
                        });
                        return Lookup::Refresh(resp, refresh);
                    }
                    return Lookup::Hit(resp);
                }
                fwd = if directives { "request" } else { "stale" };
                stale = Some(v.clone());
            }
        }
        if head || has_body {
            return Lookup::Miss(fill(fwd, Then::Pass, Counted::Miss));
        }
        let mut miss = fill(fwd, storing(stale), Counted::Miss);
        if unkeyed {
            miss.then = Then::Pass;
            miss.detail = Some("unkeyed-header");
        }
        Lookup::Miss(miss)
    }

    /// Drops the stored answers `purge` names, or with `soft` makes them stale; how many
    /// keys it named (every key for `all`, else those whose path starts with a prefix or
    /// whose answers carry a tag).
    ///
    /// # Errors
    /// A purge naming nothing, or more than one way ([`Purge::check`]).
    pub fn purge(&self, purge: &Purge) -> Result<u64, String> {
        purge.check()?;
        // Prefixes in the normal form the keys are in (`/caf%c3%a9` is `/caf%C3%A9`).
        let prefixes = purge
            .prefixes
            .iter()
            .map(|p| crate::target::normalize(p).map(std::borrow::Cow::into_owned))
            .collect::<Result<Vec<String>, _>>()
            .map_err(|why| format!("a purge prefix: {why}"))?;
        let named = purged::Named {
            all: purge.all,
            prefixes,
            tags: purge.tags.clone(),
            soft: purge.soft,
        };
        Ok(self.purges.purge(named, |named, generation| {
            self.drop_named(named, generation)
        }))
    }

    /// Drops the entries `named` (the purge of `generation`) names, or makes them stale if it
    /// is soft; how many.
    pub(super) fn drop_named(&self, named: &purged::Named, generation: u64) -> u64 {
        if named.all && !named.soft {
            let count = self.entries.iter().count() as u64;
            self.entries.invalidate_all();
            // Their bytes are given back now, not at the store's next upkeep.
            self.entries.run_pending_tasks();
            return count;
        }
        let now = Instant::now();
        let mut purged = 0;
        for (hash, entry) in self.entries.iter() {
            if !named.names(entry.space, &entry.target, entry.tags()) {
                continue;
            }
            if !named.soft {
                self.entries.invalidate(*hash);
                purged += 1;
            } else if self.mark_stale(*hash, &stored_before(&entry.variants, generation), now) {
                // (Not counted: an entry whose every answer was asked for after the purge.)
                purged += 1;
            }
        }
        self.entries.run_pending_tasks();
        purged
    }

    /// Marks stale, as of `now`, the variants a soft purge `found` under `hash` that are still
    /// stored there; one stored beside them since is left fresh (it came after the purge: a
    /// fill looked up before it is not stored, or is one the purge does not name). Whether it
    /// marked any.
    pub(super) fn mark_stale(&self, hash: u64, found: &[Arc<Variant>], now: Instant) -> bool {
        if found.is_empty() {
            return false;
        }
        self.update(hash, |stored| {
            let stored = stored?;
            let mut marked = false;
            let variants = (stored.variants.iter())
                .map(|v| {
                    if is_among(found, v) {
                        marked = true;
                        Arc::new(v.made_stale(now))
                    } else {
                        v.clone()
                    }
                })
                .collect();
            marked.then(|| stored.with(variants))
        })
    }

    /// Stores what `make` makes of the entry under `hash` as it is now (`None`: there is
    /// none; making `None` leaves it as it is), counting its bytes (the one it replaces gives
    /// its own back when it leaves); whether it stored one. No other store or invalidation of
    /// `hash` comes between the read and the store ([`Entries::update`]).
    pub(super) fn update(
        &self,
        hash: u64,
        make: impl FnOnce(Option<Arc<Keyed>>) -> Option<Arc<Keyed>>,
    ) -> bool {
        self.entries.update(hash, |stored| {
            let entry = make(stored)?;
            let weight = i64::from(entry.weight());
            self.held
                .fetch_add(weight, std::sync::atomic::Ordering::Relaxed);
            self.stored_bytes.add(weight);
            Some(entry)
        })
    }

    /// The hit `resp` from the stored `v` (under `hash`) as its client takes it: in the
    /// client's encoding, from `v`'s copy in it, made now by the first client to take it and
    /// then counted in the cache's bytes.
    pub(super) fn compressed(
        &self,
        hash: u64,
        v: &Arc<Variant>,
        resp: Response<ResponseBody>,
        compress: Option<(&crate::compress::Compression, crate::compress::Asked)>,
    ) -> Response<ResponseBody> {
        let Some((compression, asked)) = compress else {
            return resp;
        };
        let (resp, made) = compression.apply_stored(asked, resp, &v.copies, &v.own);
        if made.is_some() {
            self.grew(hash, v);
        }
        resp
    }

    /// Counts a copy made for the stored `v` under `hash`, if `v` is still stored there (a
    /// new answer may have replaced it, or an invalidation dropped it; its copies then leave
    /// with it, uncounted) and the entry does not count it yet: the entry is stored anew with
    /// its copies' bytes in its weight, so the store weighs it and the cache's bytes count it.
    pub(super) fn grew(&self, hash: u64, v: &Arc<Variant>) {
        self.grew_since(self.purges.generation(), hash, v);
    }

    /// [`Self::grew`], begun at purge generation `since`.
    pub(super) fn grew_since(&self, since: u64, hash: u64, v: &Arc<Variant>) {
        let mut kept = None;
        self.update(hash, |stored| {
            // (`v` may be a thread's copy of the stored variant: the two share their copies.)
            let stored = stored.filter(|s| is_among(&s.variants, v))?;
            let grown = stored.with(stored.variants.clone());
            // (A store since the copy was made, of an answer beside it, counted it already.)
            if grown.copied == stored.copied {
                return None;
            }
            kept = Some(grown.clone());
            Some(grown)
        });
        // A purge going through the entries as it was stored again may have missed it: done
        // here instead, as its pass does it. A hard one drops the key (every answer in it: one
        // asked for after the purge may be a revalidation carrying the purged body) and counts
        // an invalidation of it (a fill under way is not stored); a soft one marks stale what
        // was stored before it (one asked for after it stays fresh).
        if let Some(entry) = kept {
            let named = |n: &purged::Named| n.names(entry.space, &entry.target, entry.tags());
            let did = self.purges.since(since, named);
            if did.dropped.is_some() {
                self.entries.invalidate(hash);
            } else if let Some(purge) = did.staled {
                self.mark_stale(hash, &stored_before(&entry.variants, purge), Instant::now());
            }
        }
    }
}

/// Whether `v` is one of `found`, or made of one: a thread's copy of a stored variant and
/// the variant marked stale from it share its compressed copies with it.
fn is_among(found: &[Arc<Variant>], v: &Variant) -> bool {
    found.iter().any(|f| Arc::ptr_eq(&f.copies, &v.copies))
}

/// Those of `variants` a purge logged at generation `purge` names: those whose fill began
/// before it (one that began before it and ended after it was not stored; one stored beside
/// them since began after it).
fn stored_before(variants: &[Arc<Variant>], purge: u64) -> Vec<Arc<Variant>> {
    (variants.iter())
        .filter(|v| v.begun < purge)
        .cloned()
        .collect()
}

/// Entries leave when none of their variants can be used any more, fresh or stale.
pub(super) struct Expire;

impl moka::Expiry<u64, Arc<Keyed>> for Expire {
    fn expire_after_create(&self, _: &u64, entry: &Arc<Keyed>, now: Instant) -> Option<Duration> {
        entry.variants.iter().map(|v| v.usable_for(now)).max()
    }

    fn expire_after_update(
        &self,
        key: &u64,
        entry: &Arc<Keyed>,
        now: Instant,
        _: Option<Duration>,
    ) -> Option<Duration> {
        self.expire_after_create(key, entry, now)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_key_hashes_its_host_in_any_case_alike_and_other_hosts_apart() {
        let metrics = crate::metrics::Metrics::new(8);
        let cache = super::Cache::new(&crate::cache::CacheConfig::default(), &metrics, "t");
        // A key laid out on the stack, and one past that room (hashed in pieces).
        let long_target = format!("/{}", "t".repeat(super::KEY_ON_STACK));
        for target in ["/a?b", long_target.as_str()] {
            hosts_hash_in_any_case_alike(&cache, target);
        }
        // Both sides of the stack room's end: a key of exactly that length, and one byte more.
        for extra in [0, 1] {
            let host = "Example.COM";
            let fill = super::KEY_ON_STACK - super::KEY_HEAD - host.len() - 1 + extra;
            let target = format!("/{}", "x".repeat(fill - 1));
            let hash = |host: &str| cache.hash((0, 1), false, host, &target);
            assert_eq!(hash(host), hash(&host.to_ascii_lowercase()), "{extra}");
            assert_ne!(hash(host), hash("example.org"), "{extra}");
            assert_ne!(hash(host), cache.hash((0, 1), false, host, &target[1..]));
        }
    }

    /// A write invalidates the keys of every version holding the cache, however many came and
    /// went beside it; a version held twice (a tenant rebuilt around it) counts once, until
    /// its last holder lets go.
    #[test]
    fn a_write_reaches_every_version_held_however_many_came_and_went() {
        let metrics = crate::metrics::Metrics::new(8);
        let cache = super::Cache::new(&crate::cache::CacheConfig::default(), &metrics, "t");
        let current = cache.serves_version(7);
        let mut candidate = cache.serves_version(1);
        for version in 2..=6 {
            candidate = cache.serves_version(version);
        }
        assert_eq!(cache.other_versions(6), [7]);
        assert_eq!(cache.other_versions(7), [6]);
        let rebuilt = cache.serves_version(6);
        drop(candidate);
        assert_eq!(
            cache.other_versions(7),
            [6],
            "still held by its rebuilt tenant"
        );
        drop(rebuilt);
        assert_eq!(cache.other_versions(7), [] as [u64; 0]);
        let again = cache.serves_version(8);
        let held = cache.versions.lock().unwrap().len();
        assert_eq!(held, 2, "the versions let go are forgotten");
        assert_eq!(cache.other_versions(8), [7]);
        drop((current, again));
        assert_eq!(cache.other_versions(1), [] as [u64; 0]);
    }

    fn hosts_hash_in_any_case_alike(cache: &super::Cache, target: &str) {
        let hash = |host: &str| cache.hash((0, 1), false, host, target);
        // Longer than the stack buffer the upper-case path lowers it in, and across its end.
        let long = format!("{}.example.com", "sub".repeat(30));
        for host in ["example.com", "a", "", long.as_str()] {
            // Upper-cased whole, and every other letter from the first or the second.
            let every_other = |from: usize| -> String {
                (host.chars().enumerate())
                    .map(|(i, c)| {
                        if i % 2 == from {
                            c.to_ascii_uppercase()
                        } else {
                            c
                        }
                    })
                    .collect()
            };
            assert_eq!(hash(host), hash(&host.to_ascii_uppercase()), "{host}");
            assert_eq!(hash(host), hash(&every_other(0)), "{host}");
            assert_eq!(hash(host), hash(&every_other(1)), "{host}");
        }
        // Its only capitals past the stack buffer's first chunk.
        let late = format!("{}.EXAMPLE.COM", "sub".repeat(30));
        assert_eq!(hash(&late), hash(&late.to_ascii_lowercase()), "{target}");
        assert_ne!(hash("example.com"), hash("example.org"));
        assert_ne!(hash(&long), hash(&long[1..]));
        // The host ends where the target begins.
        assert_ne!(
            cache.hash((0, 1), false, "a", &format!("b{target}")),
            cache.hash((0, 1), false, "ab", target)
        );
        // The target keeps its case.
        let upper = target.to_ascii_uppercase();
        assert_ne!(
            cache.hash((0, 1), false, "a", target),
            cache.hash((0, 1), false, "a", &upper),
            "{target}"
        );
        // Space, version and scheme are the key's too.
        let one = cache.hash((0, 1), false, "a", target);
        assert_ne!(one, cache.hash((1, 1), false, "a", target));
        assert_ne!(one, cache.hash((0, 2), false, "a", target));
        assert_ne!(one, cache.hash((0, 1), true, "a", target));
    }
}
