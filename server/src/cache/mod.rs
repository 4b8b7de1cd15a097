//! The cache in front of a tenant's guests (`[tenant.cache]`): a request that matches a fresh
//! stored answer is answered from memory before admission, with no slot, instance or guest.
//!
//! What may be stored and for how long is RFC 9111's shared-cache rules as
//! `http-cache-semantics` reads them (`no-store`, `private`, `Authorization`, `s-maxage`,
//! `max-age`, `Expires`), with `CDN-Cache-Control` (RFC 9213) in place of `Cache-Control` and
//! `Expires` when the guest sends it. Only explicit freshness is used: an answer without it
//! (heuristics, error statuses by default) is not stored. Nor is an answer with `Set-Cookie`
//! (unless `store_set_cookie`), `Vary: *`, a body over `max_object_kib` or cut mid-stream, nor
//! the answer to a request with a body or to `HEAD`. A streamed body is stored once it has
//! reached the client whole.
//!
//! The key is the scheme, host and normal path with its query, the query's parameters left
//! out or sorted and request headers added as the tenant asks (`key`; the tenant's cache is
//! its own);
//! `Vary` makes variants of one key, matched on the request header values they were stored
//! with. A stored `GET` answers `HEAD` too. A conditional request (`If-None-Match`,
//! `If-Modified-Since`) is answered `304` from the stored answer; on a miss the guest gets the
//! request without them, so its full answer can be stored, and the client still gets its `304`.
//! A non-error answer to an unsafe method (`POST`, `PUT`, `PATCH`, `DELETE`) invalidates its
//! key (RFC 9111 §4.4). Every answer says what the cache did in `Cache-Status` (RFC 9211).
//! Stale answers are served within their `stale-while-revalidate` (one background refresh at
//! a time) and `stale-if-error`, and revalidated with their validators (`fill`, `variant`).
//!
//! The store is `moka`'s (bounded by bytes, TinyLFU admission, so one-off scans do not flush
//! what is asked often); an entry leaves when none of its variants can be used, fresh or
//! stale. Each thread answers hits from its own copies of the entries it hits (`entries`).
//! A tenant's cache is made with it, so a deploy, a rollback or a change of its settings
//! starts it empty.

mod answer;
mod config;
mod entries;
mod fill;
pub mod guest;
mod key;
mod purged;
mod space;
mod store;
mod variant;

pub use answer::CACHE_STATUS;
pub use config::{CacheConfig, MAX_CACHE_MIB, Purge};
pub use space::{Counts, Space};
pub use store::{Asking, COLLAPSE_WAIT, Cache, Fill, Lookup, Serving};
