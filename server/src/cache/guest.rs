//! The guests' own entries in their tenant's cache: what a guest computed and keeps for a
//! while (a token, a rendered fragment, a looked-up value) under a key of its own, through the
//! `tern` ABI's `cache_*` calls and components' `tern:cache`.
//!
//! An entry is kept as the cache keeps an answer, so it has everything the tenant's cache
//! has: its budget (`max_mib`, `max_object_kib`) and eviction, its purges (everything or by
//! tag, from the admin API and through the fleet), freshness with `stale-while-revalidate`,
//! variants of one key by request headers (`Vary`), and collapsing. The entries are a space
//! of their own in the tenant's own cache, keyed by the guest's bytes (a purge by path prefix
//! never names them): no other tenant reaches them.
//!
//! A lookup gives an [`Entry`]: found or not, fresh or stale, and whether this request is to
//! insert it. A **transactional** lookup of a missing entry makes its request the one that
//! fills it: the same lookup from other requests waits (at most [`super::COLLAPSE_WAIT`])
//! until it inserts, or gives up (closes the entry, fails, traps: its place is dropped with
//! its instance), and finds what was stored or takes its place. A stale entry within its
//! `stale-while-revalidate` is found, and one request at a time is asked to insert anew.
//!
//! The request headers a lookup gives are what its variants are told apart by: an entry
//! inserted with `vary` names is found only by lookups with the same values of those headers
//! (and, as every answer of the cache, of `Authorization`). Headers that steer a cache or
//! frame a message (`Cache-Control`, `Pragma`, conditionals, `Range`, `Content-Length`,
//! `Transfer-Encoding`) are left out, so a guest may give all of its request's.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode};
use prometheus::IntCounter;

use super::answer::{Asks, CACHE_STATUS};
use super::config::Purge;
use super::space::{Counts, Space};
use super::store::{Asking, Cache, Fill, Lookup, Storing};
use crate::body::ResponseBody;

/// The longest key, in bytes.
pub const MAX_KEY_BYTES: usize = 4096;
/// Most request headers one lookup gives.
pub const MAX_HEADERS: usize = 64;
/// Most headers an entry varies on.
pub const MAX_VARY: usize = 16;
/// Most tags of one entry.
pub const MAX_TAGS: usize = 16;
/// The longest tag.
pub const MAX_TAG_LEN: usize = 128;
/// The longest freshness an entry is given: a year.
pub const MAX_TTL: u32 = 365 * 86_400;
/// The longest `stale-while-revalidate`: a day (the cache's longest stale window).
pub const MAX_STALE: u32 = 86_400;
/// Most lookups one request makes (each entry it holds is host memory).
const MAX_LOOKUPS: u32 = 1000;

/// Request headers that are not told apart by: they steer caches or frame messages.
const LEFT_OUT: [HeaderName; 10] = [
    header::CACHE_CONTROL,
    header::PRAGMA,
    header::IF_NONE_MATCH,
    header::IF_MODIFIED_SINCE,
    header::IF_MATCH,
    header::IF_UNMODIFIED_SINCE,
    header::IF_RANGE,
    header::RANGE,
    header::CONTENT_LENGTH,
    header::TRANSFER_ENCODING,
];

/// Why a cache call failed, in words for the guest's developer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheError {
    /// A bad key, header, option or tag.
    Invalid(String),
    /// A limit: an entry over `max_object_kib`, too many lookups.
    Limit(String),
    /// The tenant has no cache.
    Unavailable(String),
}

impl std::fmt::Display for CacheError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Invalid(why) | Self::Limit(why) | Self::Unavailable(why) => f.write_str(why),
        }
    }
}

/// A tenant's cache as its guests use it, prepared when it is loaded.
#[derive(Debug)]
pub struct Grant {
    cache: Arc<Cache>,
    counts: Arc<Counts>,
    purges: IntCounter,
}

impl Grant {
    /// `p`'s tenant's `cache` for its guests, counted under its label (none: the tenant has
    /// no cache).
    pub fn prepare(p: &crate::prepare::Preparing<'_>, cache: Option<&Arc<Cache>>) -> Option<Self> {
        cache.map(|cache| Self::new(cache.clone(), p.metrics, p.label))
    }

    /// The tenant's `cache` for its guests, counted under `label`.
    pub fn new(cache: Arc<Cache>, metrics: &crate::metrics::Metrics, label: &str) -> Self {
        let result = |r: &str| match r {
            // A guest's lookup is never a bypass nor a revalidation: no series for them.
            "bypass" | "revalidated" => {
                static UNEXPORTED: std::sync::LazyLock<crate::metrics::Counter> =
                    std::sync::LazyLock::new(crate::metrics::Counter::new);
                UNEXPORTED.clone()
            }
            _ => metrics.guest_cache_requests.with_label_values(&[label, r]),
        };
        Self {
            cache,
            counts: Arc::new(Counts::new(result)),
            purges: metrics.cache_purges.with_label_values(&["guest"]),
        }
    }
}

/// One request's use of its tenant's cache.
#[derive(Debug)]
pub struct Session {
    granted: Option<Arc<Grant>>,
    lookups: u32,
}

/// What an entry is to the request that looked it up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct State {
    /// It was found (fresh, or stale within its `stale-while-revalidate`).
    pub found: bool,
    /// It was found stale.
    pub stale: bool,
    /// This request is to insert it (a transactional lookup that missed, or found it stale
    /// and is the one to refresh it): the same lookups of other requests wait for it.
    pub must_insert: bool,
}

/// How an entry is kept.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Write {
    /// Seconds it is fresh for: 1 to [`MAX_TTL`].
    pub max_age: u32,
    /// Seconds past that it is still found (stale) while one request inserts it anew: 0 to a
    /// day.
    pub stale_while_revalidate: u32,
    /// Tags to purge it by.
    pub tags: Vec<String>,
    /// Request headers it varies on: it is found by lookups with the same values of them as
    /// the lookup that inserted it.
    pub vary: Vec<String>,
}

/// An entry as a lookup found it, and what the request may do with it.
pub struct Entry {
    cache: Arc<Cache>,
    /// The lookup's request (its key as the target, its headers), to insert under.
    req: Request<()>,
    found: Option<Found>,
    /// This request fills the key: others wait until it inserts or drops it.
    fill: Option<Fill>,
    /// The cache's purge generation and its key's invalidations at the lookup.
    since: (u64, u64),
}

struct Found {
    body: Bytes,
    age: Duration,
    stale: bool,
}

impl Session {
    /// Nothing looked up yet, with the tenant's cache if it has one (`granted`), for the
    /// request of `_context`.
    pub fn new(granted: Option<Arc<Grant>>, _context: &crate::context::RequestContext) -> Self {
        Self {
            granted,
            lookups: 0,
        }
    }

    fn granted(&self) -> Result<&Arc<Grant>, CacheError> {
        self.granted.as_ref().ok_or_else(|| {
            CacheError::Unavailable(
                "the tenant has no cache (its [tenant.cache] enabled is false)".into(),
            )
        })
    }

    /// Looks the entry `key` up for a request with `headers` ([`request_headers`]); with
    /// `transaction`, a miss waits while another request fills the key, then fills it itself.
    ///
    /// # Errors
    /// No cache, a bad key, too many lookups.
    pub async fn lookup(
        &mut self,
        key: &[u8],
        headers: HeaderMap,
        transaction: bool,
    ) -> Result<Entry, CacheError> {
        let granted = self.granted()?.clone();
        if key.is_empty() || key.len() > MAX_KEY_BYTES {
            return Err(CacheError::Invalid(format!(
                "a key is 1 to {MAX_KEY_BYTES} bytes, not {}",
                key.len()
            )));
        }
        if self.lookups == MAX_LOOKUPS {
            return Err(CacheError::Limit(format!(
                "{MAX_LOOKUPS} cache lookups in one request"
            )));
        }
        self.lookups += 1;
        let target = format!("/{}", crate::hex::encode(key));
        let mut req = Request::new(());
        *req.uri_mut() = http::Uri::try_from(target)
            .map_err(|_| CacheError::Invalid("the key cannot be stored".into()))?;
        *req.headers_mut() = headers;
        let cache = &granted.cache;
        // A purge from here on that names what this request inserts keeps it out: the
        // guest may have made it from what the purge meant to drop.
        let since = cache.since(key_hash(cache, req.uri().path()));
        let asking = Asking {
            https: false,
            host: "",
            trusted: true,
            space: Space::Guest(granted.counts.clone()),
            compress: None,
            body: false,
            at: std::time::Instant::now(),
            present: crate::context::Present::ALL,
        };
        let looked = if transaction {
            cache.lookup(&req, asking).await
        } else {
            cache.look(&req, &asking, &Asks::of(req.headers()), None)
        };
        let (found, fill) = match looked {
            Lookup::Hit(resp) => (Some(Found::from(resp)), None),
            Lookup::Refresh(resp, fill) => (Some(Found::from(resp)), Some(fill)),
            Lookup::Miss(fill) => (None, Some(fill)),
        };
        // Only a transaction's own place in line makes it the one to insert; a plain lookup
        // drops it at once (then counted as what it found).
        let fill = fill.filter(|f| transaction && f.lead.is_some());
        Ok(Entry {
            cache: cache.clone(),
            req,
            found,
            fill,
            since,
        })
    }

    /// Drops (or with `soft` makes stale) the entries and answers of the tenant's cache on
    /// this server tagged `tag`; how many keys it named.
    ///
    /// # Errors
    /// No cache, a bad tag.
    pub fn purge_tag(&self, tag: &str, soft: bool) -> Result<u64, CacheError> {
        let granted = self.granted()?;
        check_tag(tag).map_err(CacheError::Invalid)?;
        let purge = Purge {
            tags: vec![tag.to_string()],
            soft,
            ..Purge::default()
        };
        let purged = granted.cache.purge(&purge).map_err(CacheError::Invalid)?;
        granted.purges.inc();
        Ok(purged)
    }
}

impl From<Response<ResponseBody>> for Found {
    /// A stored entry as the cache served it (with its `Age`, and `Cache-Status` saying
    /// whether it was stale).
    fn from(resp: Response<ResponseBody>) -> Self {
        let headers = resp.headers();
        let age = headers
            .get(header::AGE)
            .and_then(|a| a.to_str().ok()?.parse().ok())
            .map_or(Duration::ZERO, Duration::from_secs);
        let stale = headers
            .get(&CACHE_STATUS)
            .and_then(|s| s.to_str().ok())
            .is_some_and(|s| s.contains("stale-while-revalidate"));
        let body = match resp.into_body() {
            ResponseBody::Full(Some(body)) => body,
            _ => Bytes::new(),
        };
        Self { body, age, stale }
    }
}

/// The store's key of a guest's entry under `target`.
fn key_hash(cache: &Cache, target: &str) -> u64 {
    cache.hash((Space::GUEST, 0), false, "", target)
}

impl Entry {
    /// What it is to this request.
    pub fn state(&self) -> State {
        State {
            found: self.found.is_some(),
            stale: self.found.as_ref().is_some_and(|f| f.stale),
            must_insert: self.fill.is_some(),
        }
    }

    /// Its bytes, when found.
    pub fn body(&self) -> Option<&Bytes> {
        self.found.as_ref().map(|f| &f.body)
    }

    /// How long ago it was inserted, when found.
    pub fn age(&self) -> Option<Duration> {
        self.found.as_ref().map(|f| f.age)
    }

    /// Gives up this request's turn to insert it (if it had one): the next request waiting
    /// for it takes the turn.
    pub fn give_up(&mut self) {
        self.fill = None;
    }

    /// Keeps `body` under its key, for the request headers its lookup gave, as `write` says
    /// (replacing the variant those headers select); ends this request's turn to insert it,
    /// and the entry is then found with `body`.
    ///
    /// # Errors
    /// A bad option, a body over the tenant's `max_object_kib`; nothing is stored then (and a
    /// request whose turn it was keeps it, to insert again or give up).
    pub fn insert(&mut self, body: Bytes, write: &Write) -> Result<(), CacheError> {
        let headers = write.check()?;
        let max = self.cache.max_object;
        if body.len() > max {
            return Err(CacheError::Limit(format!(
                "an entry of {} bytes is over the tenant's cache.max_object_kib ({} KiB)",
                body.len(),
                max / 1024
            )));
        }
        let target = self.req.uri().path();
        let hash = key_hash(&self.cache, target);
        let mut storing = Storing::new(
            hash,
            (Space::GUEST, 0),
            (false, "", target),
            &self.req,
            self.since,
        );
        storing.tags = write.tags.iter().map(|t| t.as_str().into()).collect();
        let variant = self
            .cache
            .storable(&storing, StatusCode::OK, &headers, &body)
            .ok_or_else(|| CacheError::Invalid("the entry cannot be stored".into()))?;
        // Not stored if a purge naming it came since the lookup: as if it had been stored
        // first and purged then.
        let _ = self.cache.insert(&storing, Arc::new(variant), None);
        self.found = Some(Found {
            body,
            age: Duration::ZERO,
            stale: false,
        });
        // Those waiting for it look again, and find it.
        self.fill = None;
        Ok(())
    }
}

impl Write {
    /// The headers of the answer an entry is kept as, when the options are good.
    fn check(&self) -> Result<HeaderMap, CacheError> {
        let invalid = |why: String| Err(CacheError::Invalid(why));
        if !(1..=MAX_TTL).contains(&self.max_age) {
            return invalid(format!(
                "max-age is 1 to {MAX_TTL} seconds, not {}",
                self.max_age
            ));
        }
        if self.stale_while_revalidate > MAX_STALE {
            return invalid(format!(
                "stale-while-revalidate is 0 to {MAX_STALE} seconds, not {}",
                self.stale_while_revalidate
            ));
        }
        if self.tags.len() > MAX_TAGS {
            return invalid(format!("at most {MAX_TAGS} tags, not {}", self.tags.len()));
        }
        for tag in &self.tags {
            check_tag(tag).map_err(CacheError::Invalid)?;
        }
        if self.vary.len() > MAX_VARY {
            return invalid(format!(
                "at most {MAX_VARY} vary headers, not {}",
                self.vary.len()
            ));
        }
        let mut headers = HeaderMap::new();
        let control = format!(
            "public, max-age={}, stale-while-revalidate={}",
            self.max_age, self.stale_while_revalidate
        );
        headers.insert(
            header::CACHE_CONTROL,
            HeaderValue::from_str(&control).expect("digits"),
        );
        for name in &self.vary {
            let Ok(name) = HeaderName::from_bytes(name.as_bytes()) else {
                return invalid(format!("{name:?} is not a header name"));
            };
            if LEFT_OUT.contains(&name) {
                return invalid(format!("{name} is not told apart by (it steers caches)"));
            }
            headers.append(header::VARY, HeaderValue::from(name));
        }
        Ok(headers)
    }
}

/// The request headers a lookup gives from `pairs` (names and values as bytes), without the
/// ones that are not told apart by.
///
/// # Errors
/// A name or value that cannot be a header's, too many.
pub fn request_headers<'a>(
    pairs: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
) -> Result<HeaderMap, CacheError> {
    let mut headers = HeaderMap::new();
    for (count, (name, value)) in pairs.into_iter().enumerate() {
        if count == MAX_HEADERS {
            return Err(CacheError::Invalid(format!(
                "at most {MAX_HEADERS} request headers"
            )));
        }
        let name = HeaderName::from_bytes(name).map_err(|_| {
            CacheError::Invalid(format!(
                "{:?} is not a header name",
                String::from_utf8_lossy(name)
            ))
        })?;
        let value = HeaderValue::from_bytes(value)
            .map_err(|_| CacheError::Invalid(format!("the value of {name} is not a header's")))?;
        if !LEFT_OUT.contains(&name) {
            headers.append(name, value);
        }
    }
    Ok(headers)
}

/// Checks a tag to purge by: 1 to 128 visible ASCII characters, without commas or quotes.
///
/// # Errors
/// What is wrong with it.
pub fn check_tag(tag: &str) -> Result<(), String> {
    if tag.is_empty()
        || tag.len() > MAX_TAG_LEN
        || !tag
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'"' && b != b',')
    {
        return Err(format!(
            "a tag is 1-{MAX_TAG_LEN} visible ASCII characters without commas or quotes, \
             not {tag:?}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_options_become_the_headers_an_entry_is_kept_with() {
        let write = Write {
            max_age: 60,
            stale_while_revalidate: 30,
            tags: vec!["a".into()],
            vary: vec!["Accept-Language".into(), "x-tier".into()],
        };
        let headers = write.check().unwrap();
        assert_eq!(
            headers[header::CACHE_CONTROL],
            "public, max-age=60, stale-while-revalidate=30"
        );
        let vary: Vec<_> = headers.get_all(header::VARY).iter().collect();
        assert_eq!(vary, ["accept-language", "x-tier"]);
        type Spoil = fn(&mut Write);
        let spoilt: [(Spoil, &str); 8] = [
            (|w| w.max_age = 0, "max-age"),
            (|w| w.max_age = MAX_TTL + 1, "max-age"),
            (
                |w| w.stale_while_revalidate = MAX_STALE + 1,
                "stale-while-revalidate",
            ),
            (|w| w.tags = vec!["a,b".into()], "a tag"),
            (|w| w.tags = vec!["t".into(); MAX_TAGS + 1], "tags"),
            (|w| w.vary = vec!["a b".into()], "header name"),
            (|w| w.vary = vec!["pragma".into()], "steers"),
            (|w| w.vary = vec!["v".into(); MAX_VARY + 1], "vary"),
        ];
        for (spoil, named) in spoilt {
            let mut bad = write.clone();
            spoil(&mut bad);
            let Err(CacheError::Invalid(why)) = bad.check() else {
                panic!("{bad:?} was taken");
            };
            assert!(why.contains(named), "{why}");
        }
    }

    #[test]
    fn request_headers_leave_out_those_that_steer_caches() {
        let pairs: [(&[u8], &[u8]); 4] = [
            (b"Accept-Language", b"fr"),
            (b"cache-control", b"no-cache"),
            (b"range", b"bytes=0-1"),
            (b"x-a", b""),
        ];
        let headers = request_headers(pairs).unwrap();
        assert_eq!(headers.len(), 2);
        assert_eq!(headers["accept-language"], "fr");
        assert!(request_headers([(&b"bad name"[..], &b"v"[..])]).is_err());
        assert!(request_headers([(&b"x"[..], &b"a\nb"[..])]).is_err());
        let many = vec![(&b"x"[..], &b"v"[..]); MAX_HEADERS + 1];
        assert!(request_headers(many).is_err());
        assert!(request_headers(vec![(&b"x"[..], &b"v"[..]); MAX_HEADERS]).is_ok());
    }

    #[test]
    fn tags_are_visible_ascii_without_commas_or_quotes() {
        assert!(check_tag("prices-eu:2").is_ok());
        assert!(check_tag(&"t".repeat(MAX_TAG_LEN)).is_ok());
        for bad in ["", "a b", "a,b", "a\"b", "é"] {
            assert!(check_tag(bad).is_err(), "{bad:?}");
        }
        assert!(check_tag(&"t".repeat(MAX_TAG_LEN + 1)).is_err());
    }
}
