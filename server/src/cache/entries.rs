//! The stored entries, and each thread's own copies of the ones it hits.
//!
//! A hit read through the store alone writes memory every core shares: the store's own
//! bookkeeping of the read, the entry's reference count, and the reference counts of the
//! stored header values and body that the answer clones. On two cores those writes cost more
//! than the rest of the look (see `loadtest/results/hotpath.md`). So each thread keeps, in
//! [`SLOTS`] slots chosen by the key's hash, its own deep copy of an entry it read (at most
//! [`MAX_BYTES`] each), and answers the next hit of that key from it.
//!
//! A copy is used only while it is what the store would give: every change to the store
//! (a store, an invalidation, a purge, an eviction) counts in the store's [`Changes`], which
//! a copy remembers; a copy is not used past the time its entry expires; and every
//! [`RECORD_EVERY`]th hit of a thread reads the store anyway, so the store still sees which
//! entries are asked often (its admission and eviction weigh that). A thread's copies hold at
//! most `SLOTS × MAX_BYTES` (1 MiB), outside the cache's `max_mib`: a copy's compressed
//! bodies, each copied from the stored one the first time the thread serves its encoding,
//! are counted in its `MAX_BYTES` (one that does not fit is served from the store's). A
//! copy of an entry that left the store keeps the entry's shared compressed bodies until the
//! thread looks at that slot again.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Instant;

use http::header::{HeaderMap, HeaderName, HeaderValue};

use crate::hashed::Hashed;

use super::variant::Variant;

/// The stored answers of one key (space, scheme, host, path and query).
pub(super) struct Keyed {
    pub(super) space: u8,
    /// The version whose answers it holds ([`Space::version`]).
    pub(super) version: u64,
    pub(super) https: bool,
    pub(super) host: Box<str>,
    pub(super) target: Box<str>,
    pub(super) variants: Vec<Arc<Variant>>,
    /// Bytes of its variants' compressed copies counted in its weight: fixed when it is
    /// made (a copy made later is counted by storing it anew, [`super::Cache::grew`]), so
    /// what the store and the cache's bytes add when it is stored is what they take back
    /// when it leaves.
    pub(super) copied: usize,
}

impl Keyed {
    /// Whether it holds the key `space`, `https`, `host`, `target` (its hash may be another
    /// key's).
    pub(super) fn is_for(
        &self,
        (space, version): (u8, u64),
        https: bool,
        host: &str,
        target: &str,
    ) -> bool {
        self.space == space
            && self.version == version
            && self.https == https
            // The same bytes first (one `memcmp`): letter by letter without case only when
            // they differ, as a host written in capitals.
            && (*self.host == *host || self.host.eq_ignore_ascii_case(host))
            && &*self.target == target
    }

    /// The same key holding `variants`, counting their compressed copies as they are now.
    pub(super) fn with(&self, variants: Vec<Arc<Variant>>) -> Arc<Self> {
        Arc::new(Self {
            space: self.space,
            version: self.version,
            https: self.https,
            host: self.host.clone(),
            target: self.target.clone(),
            copied: Self::copies_of(&variants),
            variants,
        })
    }

    /// The bytes `variants`' compressed copies hold now: what an entry holding them counts
    /// when it is stored (a copy counted by one store since it was made, as a new variant's
    /// beside it, is not counted again by its own).
    pub(super) fn copies_of(variants: &[Arc<Variant>]) -> usize {
        variants.iter().map(|v| v.copies.bytes()).sum()
    }

    /// The tags its answers were stored with.
    pub(super) fn tags(&self) -> impl Iterator<Item = &str> {
        self.variants
            .iter()
            .flat_map(|v| v.tags.iter().map(|t| &**t))
    }

    /// Bytes it holds, roughly: what the cache's size counts.
    pub(super) fn weight(&self) -> u32 {
        u32::try_from(self.plain_weight() + self.copied).unwrap_or(u32::MAX)
    }

    /// Bytes it holds besides its compressed copies, roughly.
    fn plain_weight(&self) -> usize {
        let key = self.host.len() + self.target.len() + 64;
        self.variants.iter().fold(key, |n, v| {
            let headers: usize = v
                .headers
                .iter()
                .map(|(k, v)| k.as_str().len() + v.len() + 32)
                .sum();
            n + v.body.len() + headers + 256
        })
    }
}

/// A thread's copies, one per slot (`hash % SLOTS`).
const SLOTS: usize = 64;
/// The largest entry (by the store's weight) a thread copies; a larger one is read from the
/// store each time (its answer's body dwarfs what the store's read costs).
pub(super) const MAX_BYTES: u32 = 16 * 1024;
/// One hit in this many (a thread's) reads the store even when the copy is good.
const RECORD_EVERY: u32 = 16;

/// Ids of stores: a slot names the store its copy is of (never reused).
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Locks of the keys' writers, chosen by the key's hash.
const WRITERS: usize = 64;

/// Counts of keys' invalidations, chosen by the key's hash (a multiple of [`WRITERS`]: each
/// count is written and checked under one writer lock).
const INVALIDATIONS: usize = 1024;
const _: () = assert!(INVALIDATIONS.is_multiple_of(WRITERS));

/// The store: `moka`'s, and how many times it has changed.
pub(super) struct Entries {
    store: moka::sync::Cache<u64, Arc<Keyed>, Hashed>,
    changes: Arc<Changes>,
    id: u64,
    /// One writer of a key at a time (its hash's lock): what is stored made from what was
    /// read ([`Entries::update`]) is stored with no other store or invalidation of the key
    /// in between, so it never undoes one. Hits take none.
    writers: Box<[Mutex<()>]>,
    /// How many times the keys of each share of the hashes were invalidated: a fill notes its
    /// key's before it asks for the answer, and is not stored if it changed since
    /// ([`Entries::invalidated_since`]). Read by misses only.
    invalidations: Box<[AtomicU64]>,
}

/// How many times a store has changed (on a line of its own: it is read by every hit, and
/// written only by changes).
#[derive(Debug, Default)]
#[repr(align(128))]
pub(super) struct Changes(AtomicU64);

impl Changes {
    /// One more change, made before this is called (a look that reads the count after this
    /// sees the change in the store).
    pub(super) fn changed(&self) {
        self.0.fetch_add(1, Ordering::Release);
    }

    fn now(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }
}

/// One slot of a thread's copies.
#[derive(Default)]
struct Slot {
    /// The store's id (`0`: empty).
    store: u64,
    hash: u64,
    /// The store's changes when the copy was last found good.
    changes: u64,
    held: Option<Held>,
}

struct Held {
    /// The stored entry it copies (kept by address only: a `Weak` holds the allocation, so
    /// another entry cannot come to have the same address while it is held).
    stored: Weak<Keyed>,
    copy: Arc<Keyed>,
    /// When the stored entry expires (none of its variants usable any more).
    until: Instant,
}

struct Front {
    slots: Vec<Slot>,
    hits: u32,
}

thread_local! {
    static FRONT: RefCell<Front> = RefCell::new(Front {
        slots: std::iter::repeat_with(Slot::default).take(SLOTS).collect(),
        hits: 0,
    });
}

impl Entries {
    /// `store`, whose removals (its eviction listener) count in `changes`.
    pub(super) fn new(
        store: moka::sync::Cache<u64, Arc<Keyed>, Hashed>,
        changes: Arc<Changes>,
    ) -> Self {
        Self {
            store,
            changes,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            writers: std::iter::repeat_with(Mutex::default)
                .take(WRITERS)
                .collect(),
            invalidations: std::iter::repeat_with(AtomicU64::default)
                .take(INVALIDATIONS)
                .collect(),
        }
    }

    fn invalidations_of(&self, hash: u64) -> &AtomicU64 {
        #[allow(clippy::cast_possible_truncation)]
        &self.invalidations[(hash as usize) % INVALIDATIONS]
    }

    /// What a fill of key `hash` notes before it asks for its answer.
    pub(super) fn invalidations(&self, hash: u64) -> u64 {
        self.invalidations_of(hash).load(Ordering::Acquire)
    }

    /// Whether key `hash` may have been invalidated since a fill noted `noted`: exact when
    /// asked inside [`Entries::update`] of `hash` (under its writer lock, which an
    /// invalidation holds); another key sharing its count may make it true (that fill is
    /// then not stored, rarely: one key in 1,024 invalidated while it runs).
    pub(super) fn invalidated_since(&self, hash: u64, noted: u64) -> bool {
        self.invalidations_of(hash).load(Ordering::Acquire) != noted
    }

    /// The lock of `hash`'s writers.
    fn writer(&self, hash: u64) -> MutexGuard<'_, ()> {
        #[allow(clippy::cast_possible_truncation)]
        self.writers[(hash as usize) % WRITERS]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The entry under `hash` for a look at `now`: this thread's copy while it is good, else
    /// the store's (copied for the next look when it is small enough).
    pub(super) fn look(&self, hash: u64, now: Instant) -> Option<Arc<Keyed>> {
        // Read before the store: a change made after this read is seen by the next look.
        let changes = self.changes.now();
        FRONT
            .try_with(|front| {
                let Ok(mut front) = front.try_borrow_mut() else {
                    return self.store.get(&hash);
                };
                let front = &mut *front;
                front.hits = front.hits.wrapping_add(1);
                let record = front.hits.is_multiple_of(RECORD_EVERY);
                #[allow(clippy::cast_possible_truncation)]
                let slot = &mut front.slots[(hash as usize) % SLOTS];
                let mine = slot.store == self.id && slot.hash == hash;
                if mine
                    && !record
                    && slot.changes == changes
                    && let Some(held) = &slot.held
                    && now < held.until
                {
                    return Some(held.copy.clone());
                }
                // (Another key's copy in the slot stays: a miss or a large entry does not
                // take its place.)
                let Some(stored) = self.store.get(&hash) else {
                    if mine {
                        slot.held = None;
                    }
                    return None;
                };
                if mine
                    && let Some(held) = &slot.held
                    && std::ptr::eq(held.stored.as_ptr(), Arc::as_ptr(&stored))
                {
                    // Other keys changed; this one did not. (A compressed copy made for it
                    // stores it anew, to count the copy: copied again below, once.)
                    slot.changes = changes;
                    return Some(held.copy.clone());
                }
                let until = stored
                    .variants
                    .iter()
                    .map(|v| v.usable_for(now))
                    .max()
                    .and_then(|left| now.checked_add(left))
                    .filter(|until| *until > now);
                let plain = stored.plain_weight();
                match until {
                    Some(until) if plain <= MAX_BYTES as usize => {
                        let copy = Arc::new(stored.own_copy(MAX_BYTES as usize - plain));
                        *slot = Slot {
                            store: self.id,
                            hash,
                            changes,
                            held: Some(Held {
                                stored: Arc::downgrade(&stored),
                                copy: copy.clone(),
                                until,
                            }),
                        };
                        Some(copy)
                    }
                    _ => {
                        if mine {
                            slot.held = None;
                        }
                        Some(stored)
                    }
                }
            })
            .unwrap_or_else(|_| self.store.get(&hash))
    }

    /// The stored entry under `hash` (never a copy).
    #[cfg(test)]
    pub(super) fn get(&self, hash: u64) -> Option<Arc<Keyed>> {
        self.store.get(&hash)
    }

    /// Stores what `make` makes of the entry stored under `hash` now (`None`: none is;
    /// making `None` leaves it as it is), with no other store or invalidation of `hash` in
    /// between: a new variant beside the key's others, a compressed copy counted or a soft
    /// purge's stale mark is never made of an entry that was replaced or dropped meanwhile
    /// (which would bring it back, or undo an answer stored since). Whether it stored one.
    pub(super) fn update(
        &self,
        hash: u64,
        make: impl FnOnce(Option<Arc<Keyed>>) -> Option<Arc<Keyed>>,
    ) -> bool {
        let _writing = self.writer(hash);
        let now = self.store.get(&hash);
        #[cfg(test)]
        tests::meanwhile();
        let Some(entry) = make(now) else {
            return false;
        };
        self.store.insert(hash, entry);
        self.changes.changed();
        true
    }

    /// Drops the entry under `hash`, counting an invalidation of it (a fill that noted the
    /// count before is not stored).
    pub(super) fn invalidate(&self, hash: u64) {
        let _writing = self.writer(hash);
        self.invalidations_of(hash).fetch_add(1, Ordering::Release);
        self.store.invalidate(&hash);
        self.changes.changed();
    }

    pub(super) fn invalidate_all(&self) {
        // Every key's writers: an update under way is stored before, and dropped with the
        // rest.
        let _writing: Vec<MutexGuard<'_, ()>> = self
            .writers
            .iter()
            .map(|w| w.lock().unwrap_or_else(PoisonError::into_inner))
            .collect();
        for count in &self.invalidations {
            count.fetch_add(1, Ordering::Release);
        }
        self.store.invalidate_all();
        self.changes.changed();
    }

    /// The store's upkeep now (what left gives its bytes back).
    pub(super) fn run_pending_tasks(&self) {
        self.store.run_pending_tasks();
    }

    /// Every stored entry.
    pub(super) fn iter(&self) -> moka::sync::Iter<'_, u64, Arc<Keyed>> {
        self.store.iter()
    }

    pub(super) fn entry_count(&self) -> u64 {
        self.store.entry_count()
    }

    pub(super) fn weighted_size(&self) -> u64 {
        self.store.weighted_size()
    }
}

impl Keyed {
    /// A copy that shares nothing a hit writes with `self`: its header values and body are
    /// new allocations, and so are the compressed bodies it serves, each copied when first
    /// served while they fit in `room` bytes (it keeps the shared `Copies`: an encoding no
    /// client took yet is made once, for the store, by the first that does).
    fn own_copy(&self, room: usize) -> Self {
        let room = Arc::new(std::sync::atomic::AtomicUsize::new(room));
        Self {
            space: self.space,
            version: self.version,
            https: self.https,
            host: self.host.clone(),
            target: self.target.clone(),
            variants: self
                .variants
                .iter()
                .map(|v| Arc::new(v.own_copy(&room)))
                .collect(),
            copied: 0,
        }
    }
}

impl Variant {
    fn own_copy(&self, room: &Arc<std::sync::atomic::AtomicUsize>) -> Self {
        let mut headers = HeaderMap::with_capacity(self.headers.len());
        for (name, value) in &self.headers {
            headers.append(own_name(name), own_value(value));
        }
        Self {
            hit_head: super::answer::hit_head(&headers),
            headers,
            body: bytes::Bytes::copy_from_slice(&self.body),
            own: crate::compress::Owned::with_room(room),
            ..self.clone()
        }
    }
}

/// `name` in an allocation of its own (a standard name is a constant either way).
fn own_name(name: &HeaderName) -> HeaderName {
    HeaderName::from_bytes(name.as_str().as_bytes()).unwrap_or_else(|_| name.clone())
}

fn own_value(value: &HeaderValue) -> HeaderValue {
    let mut own = HeaderValue::from_bytes(value.as_bytes()).unwrap_or_else(|_| value.clone());
    own.set_sensitive(value.is_sensitive());
    own
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::sync::Arc;
    use std::time::Instant;

    use bytes::Bytes;

    use crate::body::ResponseBody;
    use crate::cache::{Asking, Cache, CacheConfig, Lookup, Purge, Space};
    use crate::compress::{Compression, CompressionConfig};

    const HOST: &str = "example.com";

    fn cache() -> Arc<Cache> {
        let metrics = crate::metrics::Metrics::new(8);
        Arc::new(Cache::new(&CacheConfig::default(), &metrics, "t"))
    }

    /// One look at `cache` for `method` `path` (polled once: a hit or a miss never waits here).
    fn look(cache: &Arc<Cache>, method: &str, path: &str) -> Lookup {
        look_with(cache, method, path, None)
    }

    /// [`look`] by a client that takes `compress`'s encodings (`Accept-Encoding: gzip`).
    fn look_with(
        cache: &Arc<Cache>,
        method: &str,
        path: &str,
        compress: Option<&Compression>,
    ) -> Lookup {
        let req = http::Request::builder()
            .method(method)
            .uri(path)
            .header("accept-encoding", "gzip")
            .body(())
            .unwrap();
        look_for(cache, &req, compress)
    }

    /// The body and `Content-Encoding` of a hit on `GET path` by a client taking only
    /// `encoding` through `compress`, never from the look that reads the store anyway.
    fn hit_in(cache: &Arc<Cache>, path: &str, compress: &Compression, encoding: &str) -> Bytes {
        count_from_zero();
        let req = http::Request::builder()
            .uri(path)
            .header("accept-encoding", encoding)
            .body(())
            .unwrap();
        let Lookup::Hit(resp) = look_for(cache, &req, Some(compress)) else {
            panic!("{path} is stored");
        };
        assert_eq!(resp.headers()["content-encoding"], encoding);
        // The stored answer's strong `ETag` (see [`store`]), weak for a compressed body.
        assert_eq!(resp.headers()["etag"], "W/\"v1\"");
        let length = resp.headers()["content-length"].clone();
        match resp.into_body() {
            ResponseBody::Full(Some(body)) => {
                assert_eq!(length, body.len().to_string().as_str());
                body
            }
            _ => panic!("a hit's body is whole"),
        }
    }

    /// One look at `cache` for `req`.
    fn look_for(
        cache: &Arc<Cache>,
        req: &http::Request<()>,
        compress: Option<&Compression>,
    ) -> Lookup {
        let asking = Asking {
            https: false,
            host: HOST,
            trusted: false,
            space: Space::Front(1),
            compress: compress.map(|c| (c, c.ask(req))),
            body: false,
            at: Instant::now(),
            present: crate::context::Present::ALL,
        };
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match std::pin::pin!(cache.lookup(req, asking)).poll(&mut cx) {
            std::task::Poll::Ready(looked) => looked,
            std::task::Poll::Pending => panic!("a look waited"),
        }
    }

    /// Stores `body` as the answer to `GET path`.
    fn store(cache: &Arc<Cache>, path: &str, body: Bytes) {
        let headers = [("etag", "\"v1\""), ("x-tier", "gold")];
        store_with(cache, path, &headers, body);
    }

    /// Stores `body` with `headers` (after `Content-Type: text/plain` and an hour's
    /// `max-age`) as the answer to `GET path`.
    fn store_with(cache: &Arc<Cache>, path: &str, headers: &[(&str, &str)], body: Bytes) {
        let Lookup::Miss(fill) = look(cache, "GET", path) else {
            panic!("{path} was stored already");
        };
        let mut answer = http::Response::builder()
            .header("content-type", "text/plain")
            .header("cache-control", "max-age=3600");
        for (name, value) in headers {
            answer = answer.header(*name, *value);
        }
        let answer = answer.body(ResponseBody::Full(Some(body))).unwrap();
        drop(fill.answered(answer));
    }

    /// Starts this thread's count of hits again: its next looks are not the one in
    /// `RECORD_EVERY` that reads the store whatever the copy (which would hide a copy used
    /// past a change).
    fn count_from_zero() {
        super::FRONT.with(|front| front.borrow_mut().hits = 0);
    }

    /// The body a hit on `path` is answered with (`None`: not a hit), never from the look
    /// that reads the store anyway.
    fn hit(cache: &Arc<Cache>, path: &str) -> Option<Bytes> {
        count_from_zero();
        match look(cache, "GET", path) {
            Lookup::Hit(resp) => match resp.into_body() {
                ResponseBody::Full(body) => body,
                _ => panic!("a hit's body is whole"),
            },
            _ => None,
        }
    }

    fn hash(cache: &Cache, path: &str) -> u64 {
        cache.hash((0, 1), false, HOST, path)
    }

    /// The stored body of `path` (the store's own entry, never a copy).
    fn stored_body(cache: &Cache, path: &str) -> Bytes {
        cache.entries.get(hash(cache, path)).unwrap().variants[0]
            .body
            .clone()
    }

    #[test]
    fn a_hit_from_a_threads_copy_has_the_stored_headers_and_its_own_age_and_status() {
        let cache = cache();
        let headers = [("age", "100"), ("x-tier", "gold"), ("x-tier", "silver")];
        store_with(&cache, "/h", &headers, Bytes::from_static(b"0123456789"));
        for round in 0..3 {
            count_from_zero();
            let Lookup::Hit(resp) = look(&cache, "GET", "/h") else {
                panic!("a hit");
            };
            let h = resp.headers();
            let age: u64 = h["age"].to_str().unwrap().parse().unwrap();
            assert!((100..110).contains(&age), "round {round}: age {age}");
            assert_eq!(h.get_all("age").iter().count(), 1);
            let status: Vec<_> = h.get_all("cache-status").iter().collect();
            assert_eq!(status.len(), 1, "{h:?}");
            let status = status[0].to_str().unwrap();
            assert!(status.starts_with("tern; hit; ttl="), "{status}");
            assert!(
                status["tern; hit; ttl=".len()..]
                    .parse::<u64>()
                    .is_ok_and(|t| t > 3000)
            );
            assert_eq!(h["content-type"], "text/plain");
            assert_eq!(h["cache-control"], "max-age=3600");
            let tiers: Vec<_> = h.get_all("x-tier").iter().collect();
            assert_eq!(tiers, ["gold", "silver"]);
            assert_eq!(h.len(), 6, "{h:?}");
        }
        // A range of it, from the same copy: its own status too.
        count_from_zero();
        let req = http::Request::builder()
            .uri("/h")
            .header("range", "bytes=2-4")
            .body(())
            .unwrap();
        let Lookup::Hit(resp) = look_for(&cache, &req, None) else {
            panic!("a hit");
        };
        assert_eq!(resp.status(), http::StatusCode::PARTIAL_CONTENT);
        assert!(
            resp.headers()["cache-status"]
                .to_str()
                .unwrap()
                .starts_with("tern; hit; ttl=")
        );
        assert!(
            resp.headers()["age"]
                .to_str()
                .unwrap()
                .parse::<u64>()
                .unwrap()
                >= 100
        );
        assert_eq!(resp.headers()["content-range"], "bytes 2-4/10");
    }

    #[test]
    fn a_hit_is_answered_from_its_threads_own_copy_of_the_entry() {
        let cache = cache();
        store(&cache, "/a", Bytes::from(vec![b'a'; 512]));
        let stored = stored_body(&cache, "/a");
        let first = hit(&cache, "/a").unwrap();
        let second = hit(&cache, "/a").unwrap();
        assert_eq!(first, stored);
        // Not the stored bytes: this thread's copy of them, the same for each hit.
        assert_ne!(first.as_ptr(), stored.as_ptr());
        assert_eq!(first.as_ptr(), second.as_ptr());
        let entry = cache
            .entries
            .look(hash(&cache, "/a"), Instant::now())
            .unwrap();
        let own = cache.entries.get(hash(&cache, "/a")).unwrap();
        assert!(!Arc::ptr_eq(&entry, &own));
        // Its header values are its own too.
        let (mine, theirs) = (&entry.variants[0].headers, &own.variants[0].headers);
        assert_eq!(mine, theirs);
        assert_ne!(
            mine["x-tier"].as_bytes().as_ptr(),
            theirs["x-tier"].as_bytes().as_ptr()
        );
        // Another thread has a copy of its own.
        let other = std::thread::scope(|s| s.spawn(|| hit(&cache, "/a").unwrap()).join().unwrap());
        assert_eq!(other, stored);
        assert_ne!(other.as_ptr(), first.as_ptr());
        assert_ne!(other.as_ptr(), stored.as_ptr());
    }

    #[test]
    fn every_change_to_the_cache_reaches_the_copies() {
        let cache = cache();
        let body = |c: u8| Bytes::from(vec![c; 100]);
        store(&cache, "/a", body(b'a'));
        store(&cache, "/b", body(b'b'));
        let copy = hit(&cache, "/a").unwrap();
        // Another key's change leaves this key's copy as it is (looked at again in the store).
        let Lookup::Miss(fill) = look(&cache, "POST", "/b") else {
            panic!("a POST is passed to the guest");
        };
        drop(fill.answered(http::Response::new(ResponseBody::Full(None))));
        assert_eq!(hit(&cache, "/b"), None, "a POST invalidates its key");
        assert_eq!(hit(&cache, "/a").unwrap().as_ptr(), copy.as_ptr());
        // An unsafe method invalidates the key: no copy answers it.
        let Lookup::Miss(fill) = look(&cache, "DELETE", "/a") else {
            panic!("a DELETE is passed to the guest");
        };
        drop(fill.answered(http::Response::new(ResponseBody::Full(None))));
        assert_eq!(hit(&cache, "/a"), None);
        // A new answer is the one a copy is made of.
        store(&cache, "/a", body(b'c'));
        assert_eq!(hit(&cache, "/a"), Some(body(b'c')));
        assert_eq!(hit(&cache, "/a"), Some(body(b'c')));
        // A soft purge makes the stored answer stale: the copy is not served as fresh.
        let soft = Purge {
            prefixes: vec!["/a".into()],
            soft: true,
            ..Purge::default()
        };
        assert_eq!(cache.purge(&soft), Ok(1));
        assert_eq!(hit(&cache, "/a"), None);
        // Purging everything drops every copy's entry.
        store(&cache, "/d", body(b'd'));
        assert_eq!(hit(&cache, "/d"), Some(body(b'd')));
        let all = Purge {
            all: true,
            ..Purge::default()
        };
        assert_eq!(cache.purge(&all), Ok(2), "/a (stale) and /d");
        assert_eq!(hit(&cache, "/d"), None);
        // A change made on another thread reaches this thread's copy.
        store(&cache, "/e", body(b'e'));
        assert_eq!(hit(&cache, "/e"), Some(body(b'e')));
        std::thread::scope(|s| {
            s.spawn(|| {
                let Lookup::Miss(fill) = look(&cache, "DELETE", "/e") else {
                    panic!("a DELETE is passed to the guest");
                };
                drop(fill.answered(http::Response::new(ResponseBody::Full(None))));
                store(&cache, "/e", body(b'f'));
            });
        });
        assert_eq!(hit(&cache, "/e"), Some(body(b'f')));
    }

    #[test]
    fn a_compressed_hit_is_answered_from_its_threads_own_copy() {
        let cache = cache();
        let compress = compression();
        let plain = Bytes::from("a plain answer to compress. ".repeat(80));
        store(&cache, "/a", plain.clone());
        let gzipped = || hit_in(&cache, "/a", &compress, "gzip");
        // The first client to take gzip makes the stored answer's copy: shared by every thread.
        let shared = gzipped();
        let first = shared.clone();
        assert!(shared.len() < plain.len());
        // The next hit makes the thread's own copy of it, served from then on.
        let own = gzipped();
        assert_eq!(own, shared);
        assert_ne!(own.as_ptr(), shared.as_ptr());
        assert_eq!(gzipped().as_ptr(), own.as_ptr());
        // Another thread has one of its own.
        let other = std::thread::scope(|s| {
            s.spawn(|| {
                gzipped();
                gzipped()
            })
            .join()
            .unwrap()
        });
        assert_eq!(other, shared);
        assert_ne!(other.as_ptr(), shared.as_ptr());
        assert_ne!(other.as_ptr(), own.as_ptr());
        // A second encoding: made once, then the thread's own, beside gzip's own.
        let br = hit_in(&cache, "/a", &compress, "br");
        assert_ne!(br, shared);
        let own_br = hit_in(&cache, "/a", &compress, "br");
        assert_eq!(own_br, br);
        assert_ne!(own_br.as_ptr(), br.as_ptr());
        let own = gzipped();
        assert_eq!(own, shared);
        assert_ne!(own.as_ptr(), shared.as_ptr());
        assert_eq!(gzipped().as_ptr(), own.as_ptr());
        assert_eq!(
            hit_in(&cache, "/a", &compress, "br").as_ptr(),
            own_br.as_ptr()
        );
        // A client taking the plain answer still gets it.
        assert_eq!(hit(&cache, "/a"), Some(plain));
        // A new answer under the key: its own copies, of its own body.
        let new = Bytes::from("another answer to compress. ".repeat(80));
        let Lookup::Miss(fill) = look(&cache, "DELETE", "/a") else {
            panic!("a DELETE is passed to the guest");
        };
        drop(fill.answered(http::Response::new(ResponseBody::Full(None))));
        store(&cache, "/a", new.clone());
        let shared = gzipped();
        assert_ne!(shared, first, "the old answer's gzip copy");
        let own = gzipped();
        assert_eq!(own, shared);
        assert_ne!(own.as_ptr(), shared.as_ptr());
        assert_eq!(hit(&cache, "/a"), Some(new));
    }

    /// The default compression settings, prepared.
    fn compression() -> Compression {
        let metrics = crate::metrics::Metrics::new(8);
        Compression::prepare(&CompressionConfig::default(), &metrics, "c").unwrap()
    }

    /// `n` lowercase letters in no order (a compressor saves only a part of them).
    fn letters(n: usize) -> Bytes {
        let mut x = 1u32;
        (0..n)
            .map(|_| {
                x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                b'a' + u8::try_from((x >> 16) % 26).unwrap()
            })
            .collect::<Vec<u8>>()
            .into()
    }

    #[test]
    fn a_threads_compressed_copies_fit_in_its_copys_bound() {
        let cache = cache();
        let compress = compression();
        // Letters in no order (each encoding saves only a part) and a body that leaves the
        // copy room for one compressed body, not two.
        store(&cache, "/a", letters(9_000));
        let entry = cache.entries.get(hash(&cache, "/a")).unwrap();
        let room = super::MAX_BYTES as usize - entry.plain_weight();
        assert!(hit(&cache, "/a").is_some());
        let gzip = hit_in(&cache, "/a", &compress, "gzip");
        let zstd = hit_in(&cache, "/a", &compress, "zstd");
        assert!(gzip.len() <= room && zstd.len() <= room && gzip.len() + zstd.len() > room);
        // gzip's own copy takes the room: zstd is served from the shared copy each time.
        let own_gzip = hit_in(&cache, "/a", &compress, "gzip");
        assert_ne!(own_gzip.as_ptr(), gzip.as_ptr());
        assert_eq!(
            hit_in(&cache, "/a", &compress, "zstd").as_ptr(),
            zstd.as_ptr()
        );
        assert_eq!(
            hit_in(&cache, "/a", &compress, "zstd").as_ptr(),
            zstd.as_ptr()
        );
        assert_eq!(
            hit_in(&cache, "/a", &compress, "gzip").as_ptr(),
            own_gzip.as_ptr()
        );
    }

    #[test]
    fn a_copy_is_kept_when_a_compressed_copy_takes_its_entry_past_the_bound() {
        let cache = cache();
        let gzip = compression();
        // Letters in no order: gzip saves only a quarter, so the stored entry fits the bound
        // plain and not with its gzip copy.
        store(&cache, "/a", letters(10_000));
        let weight = || cache.entries.get(hash(&cache, "/a")).unwrap().weight();
        assert!(weight() <= super::MAX_BYTES);
        assert!(hit(&cache, "/a").is_some());
        count_from_zero();
        assert!(matches!(
            look_with(&cache, "GET", "/a", Some(&gzip)),
            Lookup::Hit(_)
        ));
        assert!(weight() > super::MAX_BYTES);
        // Still a copy of the thread's (not the stored body, read from the store each hit
        // from now on), copied again once the entry was stored anew with its gzip copy.
        let stored = stored_body(&cache, "/a");
        let copy = hit(&cache, "/a").unwrap();
        assert_eq!(copy, stored);
        assert_ne!(copy.as_ptr(), stored.as_ptr());
        assert_eq!(hit(&cache, "/a").unwrap().as_ptr(), copy.as_ptr());
        // And another thread copies it too: the bound weighs what a copy holds, not the
        // store's compressed bodies.
        let other = std::thread::scope(|s| s.spawn(|| hit(&cache, "/a").unwrap()).join().unwrap());
        assert_eq!(other, stored);
        assert_ne!(other.as_ptr(), stored.as_ptr());
    }

    #[test]
    fn the_bytes_an_entry_is_counted_with_are_taken_back_whatever_its_copies_meet() {
        let cache = cache();
        let gzip = compression();
        let plain = Bytes::from("an answer to compress. ".repeat(80));
        let held = || {
            cache.entries.run_pending_tasks();
            (
                cache.held.load(std::sync::atomic::Ordering::Relaxed),
                cache.stored_bytes.get(),
            )
        };
        let delete = || {
            let Lookup::Miss(fill) = look(&cache, "DELETE", "/a") else {
                panic!("a DELETE is passed to the guest");
            };
            drop(fill.answered(http::Response::new(ResponseBody::Full(None))));
        };
        // A compressed copy counted while its entry is stored, then the entry dropped.
        store(&cache, "/a", plain.clone());
        let weight = i64::from(cache.entries.get(hash(&cache, "/a")).unwrap().weight());
        assert_eq!(held(), (weight, weight));
        hit_in(&cache, "/a", &gzip, "gzip");
        let grown = i64::from(cache.entries.get(hash(&cache, "/a")).unwrap().weight());
        assert!(grown > weight);
        assert_eq!(held(), (grown, grown));
        delete();
        assert_eq!(held(), (0, 0));
        // A copy made for an entry that leaves before the copy is counted: neither counted
        // nor taken back.
        store(&cache, "/a", plain);
        count_from_zero();
        let h = hash(&cache, "/a");
        let v = cache.entries.look(h, Instant::now()).unwrap().variants[0].clone();
        let made = gzip_copy_uncounted(&gzip, &v);
        delete();
        assert!(made.is_some(), "the first gzip client makes the copy");
        cache.grew(h, &v);
        assert_eq!(held(), (0, 0));
    }

    #[test]
    fn a_removal_the_store_makes_itself_reaches_the_copies() {
        let cache = cache();
        store(&cache, "/a", Bytes::from(vec![b'a'; 100]));
        assert!(hit(&cache, "/a").is_some());
        // Removed by the store alone (as an eviction or an expiry is), not through
        // `Entries`: only the store's listener can tell the copies.
        cache.entries.store.invalidate(&hash(&cache, "/a"));
        cache.entries.run_pending_tasks();
        assert_eq!(hit(&cache, "/a"), None);
    }

    #[test]
    fn one_hit_in_sixteen_reads_the_store() {
        let cache = cache();
        store(&cache, "/a", Bytes::from(vec![b'a'; 100]));
        let a = hit(&cache, "/a").unwrap();
        // The stored entry replaced behind the copy's back: the store counts the replaced
        // entry's removal as a change, and the copy is told it has seen that count, so only
        // a hit that reads the store anyway finds the new entry.
        let h = hash(&cache, "/a");
        let old = cache.entries.get(h).unwrap();
        let mut variant = (*old.variants[0]).clone();
        variant.body = Bytes::from(vec![b'b'; 100]);
        let replaced = super::Keyed {
            space: old.space,
            version: old.version,
            https: old.https,
            host: old.host.clone(),
            target: old.target.clone(),
            variants: vec![Arc::new(variant)],
            copied: old.copied,
        };
        cache.entries.store.insert(h, Arc::new(replaced));
        cache.entries.run_pending_tasks();
        let now = cache.entries.changes.now();
        super::FRONT.with(|front| {
            for slot in &mut front.borrow_mut().slots {
                if slot.store == cache.entries.id && slot.hash == h {
                    slot.changes = now;
                }
            }
        });
        count_from_zero();
        let bodies: Vec<Bytes> = (1..=super::RECORD_EVERY)
            .map(|_| match look(&cache, "GET", "/a") {
                Lookup::Hit(resp) => match resp.into_body() {
                    ResponseBody::Full(Some(body)) => body,
                    _ => panic!("a hit's body is whole"),
                },
                _ => panic!("/a is stored"),
            })
            .collect();
        let (last, before) = bodies.split_last().unwrap();
        assert!(before.iter().all(|b| b.as_ptr() == a.as_ptr()));
        assert_eq!(*last, Bytes::from(vec![b'b'; 100]));
    }

    #[test]
    fn a_miss_leaves_another_keys_copy_in_its_slot() {
        let cache = cache();
        store(&cache, "/a", Bytes::from(vec![b'a'; 100]));
        let copy = hit(&cache, "/a").unwrap();
        // Paths until one shares /a's slot.
        let slot = |path: &str| hash(&cache, path) % super::SLOTS as u64;
        let other = (0..)
            .map(|n| format!("/other-{n}"))
            .find(|p| slot(p) == slot("/a"))
            .unwrap();
        assert!(matches!(look(&cache, "GET", &other), Lookup::Miss(_)));
        assert_eq!(hit(&cache, "/a").unwrap().as_ptr(), copy.as_ptr());
    }

    #[test]
    fn an_entry_past_the_copies_bound_is_read_from_the_store() {
        let cache = cache();
        let weight = |path: &str| cache.entries.get(hash(&cache, path)).unwrap().weight();
        // Bodies sized so that the stored entries weigh the bound and a byte more (paths of
        // one length, the same headers).
        store(&cache, "/p", Bytes::from(vec![b'p'; 1000]));
        let at = 1000 + (super::MAX_BYTES - weight("/p")) as usize;
        store(&cache, "/e", Bytes::from(vec![b'e'; at]));
        store(&cache, "/o", Bytes::from(vec![b'o'; at + 1]));
        assert_eq!(weight("/e"), super::MAX_BYTES);
        assert_eq!(weight("/o"), super::MAX_BYTES + 1);
        let at_bound = hit(&cache, "/e").unwrap();
        assert_ne!(at_bound.as_ptr(), stored_body(&cache, "/e").as_ptr());
        let over = hit(&cache, "/o").unwrap();
        assert_eq!(over.as_ptr(), stored_body(&cache, "/o").as_ptr());
    }

    thread_local! {
        /// What runs in this thread's next [`super::Entries::update`], between its read and
        /// its store.
        static MEANWHILE: std::cell::RefCell<Option<Box<dyn FnOnce()>>> =
            std::cell::RefCell::new(None);
    }

    /// Runs what a test asked to run in this change (see [`MEANWHILE`]).
    pub(super) fn meanwhile() {
        if let Some(run) = MEANWHILE.with(|m| m.borrow_mut().take()) {
            run();
        }
    }

    /// Sends `DELETE path` through `cache` (an unsafe method: its key is invalidated) from
    /// another thread, inside this thread's next update, giving it `WAIT` to finish; the
    /// thread, to join.
    fn delete_during_next_update(
        cache: &Arc<Cache>,
        path: &'static str,
    ) -> Arc<std::sync::Mutex<Option<std::thread::JoinHandle<()>>>> {
        const WAIT: std::time::Duration = std::time::Duration::from_millis(300);
        let deleter = Arc::new(std::sync::Mutex::new(None));
        let (cache, handle) = (cache.clone(), deleter.clone());
        MEANWHILE.with(|m| {
            *m.borrow_mut() = Some(Box::new(move || {
                let (done, finished) = std::sync::mpsc::channel();
                *handle.lock().unwrap() = Some(std::thread::spawn(move || {
                    let Lookup::Miss(fill) = look(&cache, "DELETE", path) else {
                        panic!("a DELETE is passed to the guest");
                    };
                    drop(fill.answered(http::Response::new(ResponseBody::Full(None))));
                    let _ = done.send(());
                }));
                // Done within it when nothing holds the invalidation back.
                let _ = finished.recv_timeout(WAIT);
            }));
        });
        deleter
    }

    #[test]
    fn a_compressed_copy_counted_never_brings_back_an_answer_invalidated_meanwhile() {
        let cache = cache();
        let gzip = compression();
        store(
            &cache,
            "/a",
            Bytes::from("an answer to compress. ".repeat(80)),
        );
        // The first client taking gzip makes the stored answer's copy and stores the entry
        // again to count it; a DELETE of /a lands between that store's read and its write.
        let deleter = delete_during_next_update(&cache, "/a");
        count_from_zero();
        assert!(matches!(
            look_with(&cache, "GET", "/a", Some(&gzip)),
            Lookup::Hit(_)
        ));
        deleter.lock().unwrap().take().unwrap().join().unwrap();
        assert!(cache.entries.get(hash(&cache, "/a")).is_none());
        assert_eq!(
            hit(&cache, "/a"),
            None,
            "the DELETE's invalidation was undone"
        );
    }

    #[test]
    fn a_purge_that_missed_a_compressed_copys_store_is_done_by_it_soft_or_hard() {
        let gzip = compression();
        for soft in [true, false] {
            let cache = cache();
            store(
                &cache,
                "/a",
                Bytes::from("an answer to compress. ".repeat(80)),
            );
            // The first gzip client stores the entry again to count its copy; a purge of /a
            // is logged meanwhile and goes through the entries without finding it (logged
            // here, not run).
            let purging = cache.clone();
            MEANWHILE.with(|m| {
                *m.borrow_mut() = Some(Box::new(move || {
                    purging.purges.purge(purge_of("/a", soft), |_, _| ());
                }));
            });
            count_from_zero();
            assert!(matches!(
                look_with(&cache, "GET", "/a", Some(&gzip)),
                Lookup::Hit(_)
            ));
            assert!(MEANWHILE.with(|m| m.borrow().is_none()), "the purge ran");
            let stored = cache.entries.get(hash(&cache, "/a"));
            if soft {
                let stored = stored.expect("a soft purge keeps the answer, stale");
                assert!(stored.variants[0].purged, "the soft purge was not done");
                assert_eq!(hit(&cache, "/a"), None, "served fresh after a soft purge");
            } else {
                assert!(stored.is_none(), "the purge was not done");
            }
        }
    }

    #[test]
    fn a_misss_cache_status_is_written_whole_at_any_length() {
        let cache = cache();
        // One that fits the stack's room, one at its end, one past it.
        for len in [
            0,
            160 - "tern; fwd=uri-miss; detail=".len() - "; stored".len(),
            400,
        ] {
            let Lookup::Miss(mut fill) = look(&cache, "GET", "/s") else {
                panic!("/s is not stored");
            };
            let detail: &'static str = Box::leak("d".repeat(len).into_boxed_str());
            if len > 0 {
                fill.detail = Some(detail);
            }
            let resp = fill.answered(answer("s"));
            let expected = if len > 0 {
                format!("tern; fwd=uri-miss; detail={detail}; stored")
            } else {
                "tern; fwd=uri-miss; stored".to_string()
            };
            assert_eq!(cache_status(&resp), expected, "{len}");
            cache.entries.invalidate(hash(&cache, "/s"));
        }
    }

    /// `GET /v` by a client reading `lang`.
    fn asking_in(lang: &str) -> http::Request<()> {
        http::Request::builder()
            .uri("/v")
            .header("accept-language", lang)
            .body(())
            .unwrap()
    }

    /// The answer to [`asking_in`] `lang`, varying on the language.
    fn answer_in(lang: &str) -> http::Response<ResponseBody> {
        http::Response::builder()
            .header("content-type", "text/plain")
            .header("cache-control", "max-age=3600")
            .header("vary", "accept-language")
            .body(ResponseBody::Full(Some(Bytes::from(
                format!("in {lang}, ").repeat(80),
            ))))
            .unwrap()
    }

    /// Stores [`answer_in`] `lang` for `/v`.
    fn store_in(cache: &Arc<Cache>, lang: &str) {
        let Lookup::Miss(fill) = look_for(cache, &asking_in(lang), None) else {
            panic!("/v in {lang} is not stored yet");
        };
        drop(fill.answered(answer_in(lang)));
    }

    /// Whether `/v` in `lang` is a fresh hit.
    fn hit_in_lang(cache: &Arc<Cache>, lang: &str) -> bool {
        count_from_zero();
        matches!(look_for(cache, &asking_in(lang), None), Lookup::Hit(_))
    }

    #[test]
    fn a_new_variant_never_brings_back_the_keys_others_invalidated_meanwhile() {
        let cache = cache();
        store_in(&cache, "en");
        assert!(hit_in_lang(&cache, "en"));
        // The German answer is stored beside the English one; a DELETE of /v lands between
        // that store's read of the key's variants and its write.
        let Lookup::Miss(de) = look_for(&cache, &asking_in("de"), None) else {
            panic!("/v in de is not stored yet");
        };
        let deleter = delete_during_next_update(&cache, "/v");
        drop(de.answered(answer_in("de")));
        deleter.lock().unwrap().take().unwrap().join().unwrap();
        assert!(
            !hit_in_lang(&cache, "en"),
            "the English answer, invalidated by the DELETE, was stored again"
        );
    }

    #[test]
    fn a_soft_purge_marks_what_it_found_when_a_variant_was_stored_beside_it_since() {
        let cache = cache();
        store_in(&cache, "en");
        let h = hash(&cache, "/v");
        let found = cache.entries.get(h).unwrap();
        // A soft purge found /v with its English answer; the German one was stored beside
        // it (a new entry holding both) before the purge marked what it found.
        store_in(&cache, "de");
        cache.mark_stale(h, &found.variants, Instant::now());
        only_english_is_stale(&cache);
    }

    #[test]
    fn a_purge_a_copys_count_slipped_past_is_done_as_its_pass_does_it() {
        let gzip = compression();
        // The purges logged, each of /v (soft or hard) or of another path.
        let (soft, hard, other) = (("/v", true), ("/v", false), ("/w", false));
        for purges in [&[soft][..], &[hard], &[soft, hard], &[hard, soft], &[other]] {
            let cache = cache();
            store_in(&cache, "en");
            let h = hash(&cache, "/v");
            let en = cache.entries.get(h).unwrap().variants[0].clone();
            // The purges are logged (and go through the entries without finding /v: not run
            // here); a German answer, asked after them, is stored beside the English one, a
            // French one is looked up, and the first gzip client of the English answer makes
            // its copy; then the copy's count stores the entry again, the German answer in
            // it, before the French answer is stored.
            let since = cache.purges.generation();
            for (prefix, soft) in purges {
                cache.purges.purge(purge_of(prefix, *soft), |_, _| ());
            }
            store_in(&cache, "de");
            let Lookup::Miss(fr) = look_for(&cache, &asking_in("fr"), None) else {
                panic!("/v in fr is not stored yet");
            };
            assert!(gzip_copy_uncounted(&gzip, &en).is_some_and(|n| n > 0));
            let before = cache.entries.get(h).unwrap();
            cache.grew_since(since, h, &en);
            assert!(
                !cache
                    .entries
                    .get(h)
                    .is_some_and(|e| Arc::ptr_eq(&e, &before)),
                "{purges:?}: the copy's count did not store /v again"
            );
            let dropped = purges.contains(&hard);
            if dropped {
                // As its pass does: the key is dropped (the German answer may be a 304's
                // revalidation of the purged body), ...
                assert!(
                    cache.entries.get(h).is_none(),
                    "{purges:?} left {:?} of /v",
                    cache.entries.get(h).map(|e| e.variants.len())
                );
            }
            drop(fr.answered(answer_in("fr")));
            if dropped {
                // ... and counted as an invalidation of it: a fill under way is not stored.
                assert!(
                    !hit_in_lang(&cache, "fr"),
                    "{purges:?}: a fill begun before the drop is stored"
                );
            } else {
                if purges.contains(&soft) {
                    // As its pass does: stale what was stored before it, the rest fresh.
                    only_english_is_stale(&cache);
                } else {
                    assert!(
                        hit_in_lang(&cache, "en"),
                        "{purges:?}, of another path, took the English answer"
                    );
                    assert!(hit_in_lang(&cache, "de"));
                }
                assert!(
                    hit_in_lang(&cache, "fr"),
                    "{purges:?}: the French answer was not stored"
                );
            }
        }
    }

    /// A hit of a tenant that compresses says `Vary: accept-encoding` once, last, whether the
    /// store or a thread's own copy answers, plain or compressed; a range's answer (never
    /// compressed) does not; and a stored `Vary` that lists it already is not given a second.
    #[test]
    fn a_hit_a_tenant_compresses_says_vary_once() {
        let cache = cache();
        let compress = compression();
        let varies = |resp: &http::Response<ResponseBody>| -> Vec<String> {
            (resp.headers().get_all("vary").iter())
                .map(|v| v.to_str().unwrap().to_string())
                .collect()
        };
        let ask = |path: &str, headers: &[(&str, &str)]| {
            count_from_zero();
            let mut req = http::Request::builder().uri(path);
            for (name, value) in headers {
                req = req.header(*name, *value);
            }
            let Lookup::Hit(resp) = look_for(&cache, &req.body(()).unwrap(), Some(&compress))
            else {
                panic!("{path} is stored");
            };
            resp
        };
        store(
            &cache,
            "/a",
            Bytes::from("a plain answer to compress. ".repeat(80)),
        );
        // The first hit is the store's; the later ones come from the thread's own copy.
        for round in 0..3 {
            let plain = ask("/a", &[]);
            assert_eq!(varies(&plain), ["accept-encoding"], "round {round}");
            let last = plain.headers().iter().last().map(|(name, _)| name.clone());
            assert_eq!(last, Some(http::header::VARY), "round {round}");
            assert_eq!(plain.headers()["x-tier"], "gold");
            assert!(plain.headers().get("content-encoding").is_none());
            let gzip = ask("/a", &[("accept-encoding", "gzip")]);
            assert_eq!(varies(&gzip), ["accept-encoding"], "round {round}");
            assert_eq!(gzip.headers()["content-encoding"], "gzip");
            let range = ask("/a", &[("range", "bytes=0-9")]);
            assert_eq!(range.status(), http::StatusCode::PARTIAL_CONTENT);
            assert!(
                varies(&range).is_empty(),
                "round {round}: {:?}",
                range.headers()
            );
        }
        // An answer whose own `Vary` lists it (a variant per `Accept-Encoding`: stored for
        // `gzip`, as `look` asks).
        let body = Bytes::from("vary listed. ".repeat(80));
        store_with(&cache, "/b", &[("vary", "Accept-Encoding")], body);
        for round in 0..3 {
            let gzip = ask("/b", &[("accept-encoding", "gzip")]);
            assert_eq!(varies(&gzip), ["Accept-Encoding"], "round {round}");
            assert_eq!(gzip.headers()["content-encoding"], "gzip");
        }
    }

    /// Serves the stored `v` to a gzip client as a hit would, without counting the copy it
    /// makes (as the first client does before its count): the bytes of the copy made now.
    fn gzip_copy_uncounted(gzip: &Compression, v: &super::Variant) -> Option<usize> {
        let req = http::Request::builder()
            .header("accept-encoding", "gzip")
            .body(())
            .unwrap();
        let resp = http::Response::builder()
            .header("content-type", "text/plain")
            .body(ResponseBody::Full(Some(v.body.clone())))
            .unwrap();
        gzip.apply_stored(gzip.ask(&req), resp, &v.copies, &v.own).1
    }

    #[test]
    fn an_entry_counts_each_compressed_copy_of_its_answers_once() {
        let cache = cache();
        let gzip = compression();
        let h = hash(&cache, "/v");
        let counted = |e: &super::Keyed| e.variants.iter().map(|v| v.copies.bytes()).sum::<usize>();
        store_in(&cache, "en");
        store_in(&cache, "de");
        // The first gzip client of the German answer makes its copy; the French answer is
        // stored (counting the copy with the others) before the copy's own count.
        let de = cache.entries.get(h).unwrap().variants[1].clone();
        let made = gzip_copy_uncounted(&gzip, &de);
        assert!(made.is_some_and(|n| n > 0));
        store_in(&cache, "fr");
        let counted_by_fr = cache.entries.get(h).unwrap();
        cache.grew(h, &de);
        assert!(
            Arc::ptr_eq(&counted_by_fr, &cache.entries.get(h).unwrap()),
            "a copy counted already was stored again"
        );
        // The English one's first gzip client makes and counts its copy.
        count_from_zero();
        let req = http::Request::builder()
            .uri("/v")
            .header("accept-language", "en")
            .header("accept-encoding", "gzip")
            .body(())
            .unwrap();
        assert!(matches!(
            look_for(&cache, &req, Some(&gzip)),
            Lookup::Hit(_)
        ));
        let all = cache.entries.get(h).unwrap();
        assert_eq!(all.variants.len(), 3);
        assert!(all.variants[0].copies.bytes() > 0, "no English copy made");
        assert_eq!(all.copied, counted(&all), "a copy is counted twice or not");
    }

    #[test]
    fn a_soft_purge_counts_only_the_entries_it_marked() {
        let cache = cache();
        store_in(&cache, "en");
        // /va, under the purged prefix too, is asked for and stored after the purge was asked
        // for, before it goes through the entries: it stays fresh, and is not counted.
        let marked = cache
            .purges
            .purge(purge_of("/v", true), |named, generation| {
                store(&cache, "/va", Bytes::from("a"));
                cache.drop_named(named, generation)
            });
        assert_eq!(marked, 1, "the purge counted an entry it did not mark");
        assert_eq!(hit(&cache, "/va").as_deref(), Some(&b"a"[..]));
        assert!(!hit_in_lang(&cache, "en"));
    }

    #[test]
    fn a_soft_purge_leaves_fresh_a_variant_stored_after_it_was_asked_for() {
        let cache = cache();
        store_in(&cache, "en");
        // The purge is logged; a German answer, asked after it, is stored before the purge
        // goes through the entries.
        let purge = purge_of("/v", true);
        let marked = cache.purges.purge(purge, |named, generation| {
            store_in(&cache, "de");
            cache.drop_named(named, generation)
        });
        assert_eq!(marked, 1);
        only_english_is_stale(&cache);
    }

    /// A purge of the paths under `prefix`, `soft` or not.
    fn purge_of(prefix: &str, soft: bool) -> super::super::purged::Named {
        super::super::purged::Named {
            all: false,
            prefixes: vec![prefix.into()],
            tags: Vec::new(),
            soft,
        }
    }

    /// The English answer to /v was made stale by a soft purge; the German one, stored beside
    /// it after the purge was asked for, is fresh.
    fn only_english_is_stale(cache: &Arc<Cache>) {
        assert!(
            !hit_in_lang(cache, "en"),
            "the English answer the purge named is served fresh"
        );
        assert!(
            hit_in_lang(cache, "de"),
            "the German one, stored after the purge was asked for, was made stale by it"
        );
    }

    /// The guest's answer `body` to `GET`, stored for an hour.
    fn answer(body: &'static str) -> http::Response<ResponseBody> {
        http::Response::builder()
            .header("cache-control", "max-age=3600")
            .header("etag", "\"v1\"")
            .body(ResponseBody::Full(Some(Bytes::from(body))))
            .unwrap()
    }

    /// Sends `DELETE path` through `cache`, answered by the guest.
    fn delete(cache: &Arc<Cache>, path: &str) {
        let Lookup::Miss(fill) = look(cache, "DELETE", path) else {
            panic!("a DELETE is passed to the guest");
        };
        drop(fill.answered(http::Response::new(ResponseBody::Full(None))));
    }

    fn cache_status(resp: &http::Response<ResponseBody>) -> &str {
        resp.headers()["cache-status"].to_str().unwrap()
    }

    #[test]
    fn an_answer_made_while_its_key_was_invalidated_is_served_and_not_stored() {
        let cache = cache();
        // A path whose key counts its invalidations apart from /a's.
        let share = |path: &str| hash(&cache, path) % super::INVALIDATIONS as u64;
        let other = (0..)
            .map(|i| format!("/b{i}"))
            .find(|p| share(p) != share("/a"))
            .unwrap();
        let Lookup::Miss(fill) = look(&cache, "GET", "/a") else {
            panic!("/a is not stored yet");
        };
        let Lookup::Miss(beside) = look(&cache, "GET", &other) else {
            panic!("{other} is not stored yet");
        };
        // While the guest makes the answer to GET /a (from what it held before), a DELETE
        // of /a is answered.
        delete(&cache, "/a");
        let resp = fill.answered(answer("before the DELETE"));
        assert_eq!(
            cache_status(&resp),
            "tern; fwd=uri-miss; detail=invalidated-during-fill"
        );
        assert_eq!(
            hit(&cache, "/a"),
            None,
            "an answer older than the DELETE is stored"
        );
        // Another key's fill is stored (the DELETE named /a only).
        let resp = beside.answered(answer("another page"));
        assert_eq!(cache_status(&resp), "tern; fwd=uri-miss; stored");
        assert_eq!(hit(&cache, &other).unwrap(), "another page");
        // A GET looked up after the DELETE is stored.
        store(&cache, "/a", Bytes::from("after the DELETE"));
        assert_eq!(hit(&cache, "/a").unwrap(), "after the DELETE");
    }

    /// Stores an answer for `path`, then looks it up for a client asking to revalidate it
    /// (`Cache-Control: no-cache`): the fill revalidating it.
    fn stored_then_revalidating(cache: &Arc<Cache>, path: &str) -> crate::cache::Fill {
        store(cache, path, Bytes::from("the stored page"));
        revalidating(cache, path)
    }

    /// The fill revalidating the stored answer for `path` for a client asking to
    /// (`Cache-Control: no-cache`).
    fn revalidating(cache: &Arc<Cache>, path: &str) -> crate::cache::Fill {
        let req = http::Request::builder()
            .uri(path)
            .header("cache-control", "no-cache")
            .body(())
            .unwrap();
        let Lookup::Miss(fill) = look_for(cache, &req, None) else {
            panic!("{path} is revalidated");
        };
        fill
    }

    /// The guest's `304` confirming [`answer`]'s `ETag`, fresh for an hour.
    fn not_modified() -> http::Response<ResponseBody> {
        http::Response::builder()
            .status(http::StatusCode::NOT_MODIFIED)
            .header("cache-control", "max-age=3600")
            .header("etag", "\"v1\"")
            .body(ResponseBody::Full(None))
            .unwrap()
    }

    #[test]
    fn a_hard_purge_drops_an_answer_a_304_confirmed_while_it_ran() {
        // A client revalidates /a after the purge was asked for, before the purge reaches it
        // in the entries; the guest confirms the stored body with a `304` before (`early`) or
        // after the purge went through the entries. The purged body must not be served
        // fresh after the purge answered.
        for early in [true, false] {
            let cache = cache();
            store(&cache, "/a", Bytes::from("the purged page"));
            let mut late = None;
            cache
                .purges
                .purge(purge_of("/a", false), |named, generation| {
                    let fill = revalidating(&cache, "/a");
                    if early {
                        drop(fill.answered(not_modified()));
                    } else {
                        late = Some(fill);
                    }
                    cache.drop_named(named, generation)
                });
            if let Some(fill) = late {
                drop(fill.answered(not_modified()));
            }
            assert_eq!(
                hit(&cache, "/a"),
                None,
                "the purged page is served (early: {early})"
            );
        }
    }

    #[test]
    fn a_revalidation_is_stored_only_while_its_stale_answer_is() {
        let cache = cache();
        // Confirmed by a `304`: stored again, fresh.
        let fill = stored_then_revalidating(&cache, "/a");
        let resp = fill.answered(not_modified());
        assert_eq!(
            cache_status(&resp),
            "tern; fwd=request; fwd-status=304; stored"
        );
        assert_eq!(hit(&cache, "/a").unwrap(), "the stored page");
        // The stale answer left the store while it was being revalidated (here taken out
        // as the store drops an entry itself; a DELETE answered before the fill noted the
        // key's invalidations is the same): the `304` does not bring it back.
        let fill = stored_then_revalidating(&cache, "/b");
        cache.entries.store.invalidate(&hash(&cache, "/b"));
        cache.entries.run_pending_tasks();
        let resp = fill.answered(not_modified());
        assert_eq!(
            cache_status(&resp),
            "tern; fwd=request; fwd-status=304; detail=invalidated-during-fill"
        );
        let ResponseBody::Full(Some(body)) = resp.into_body() else {
            panic!("a revalidated answer is whole");
        };
        assert_eq!(body, "the stored page");
        assert_eq!(hit(&cache, "/b"), None, "the stale answer was brought back");
        // Nor does a `304` to a revalidation that spans a DELETE.
        let fill = stored_then_revalidating(&cache, "/c");
        delete(&cache, "/c");
        let resp = fill.answered(not_modified());
        assert!(cache_status(&resp).ends_with("; detail=invalidated-during-fill"));
        assert_eq!(hit(&cache, "/c"), None, "the DELETE was undone");
    }
}
