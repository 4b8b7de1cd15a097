//! The guest's own entries in its tenant's cache (ABI `cache_*`): something computed once
//! and kept for a while (a token, a rendered fragment, a looked-up value), in memory on this
//! server, within the tenant's cache budget. Needs `[tenant.cache] enabled = true`.
//!
//! The simple way, [`get_or_set`]: one request computes a missing entry while the others
//! asking for it at the same time wait for it, then all read it.
//!
//! ```no_run
//! use tern_sdk::cache;
//! let token = cache::get_or_set("token", 300, || b"fetched once per 5 minutes".to_vec())?;
//! # Ok::<(), tern_sdk::cache::CacheError>(())
//! ```
//!
//! The whole API: [`lookup`] and [`transaction_lookup`] give an [`Entry`] (found or not,
//! fresh or stale, and whether this request is to insert it); [`Entry::insert`] keeps bytes
//! with a [`Write`]: for how long, for how long stale after that
//! (`stale-while-revalidate`: found stale while one request inserts anew), tags to purge it by
//! ([`purge_tag`]), and the request headers it varies on (found only by lookups giving the
//! same values of them).
//!
//! ```no_run
//! use tern_sdk::cache::{self, Write};
//! let lang = "fr";
//! let entry = cache::transaction_lookup("menu", &[("accept-language", lang)])?;
//! let menu = match entry.body()? {
//!     Some(menu) if !entry.must_insert() => menu,
//!     _ => {
//!         let menu = format!("menu in {lang}").into_bytes();
//!         let write = Write::new(60).stale_while_revalidate(600).tag("menus").vary("accept-language");
//!         entry.insert(&menu, &write)?;
//!         menu
//!     }
//! };
//! # Ok::<(), tern_sdk::cache::CacheError>(())
//! ```
#![allow(unsafe_code)]

use std::time::Duration;

use crate::abi;
use crate::sys;

interface_error!(
    /// Why a cache call failed: the host's error code and its message.
    CacheError,
    "cache call",
    cache_last_error,
    "The ABI error code ([`abi::errno`]): `INVALID_ARGUMENT` (a bad key, header, option or \
     tag), `LIMIT_EXCEEDED` (an entry over the tenant's `max_object_kib`, too many lookups in \
     one request), `UNAVAILABLE` (the tenant has no cache)."
);

/// How an entry is kept ([`Entry::insert`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Write {
    max_age: u32,
    stale_while_revalidate: u32,
    tags: String,
    vary: String,
}

impl Write {
    /// Fresh for `max_age` seconds (1 to a year).
    pub fn new(max_age: u32) -> Self {
        Self {
            max_age,
            ..Self::default()
        }
    }

    /// Then found stale for `seconds` more (up to a day), while one request inserts it anew.
    #[must_use]
    pub fn stale_while_revalidate(mut self, seconds: u32) -> Self {
        self.stale_while_revalidate = seconds;
        self
    }

    /// A tag to purge it by (1-128 visible ASCII characters, no commas or quotes; up to 16).
    #[must_use]
    pub fn tag(mut self, tag: &str) -> Self {
        self.tags.push_str(tag);
        self.tags.push(' ');
        self
    }

    /// A request header it varies on: lookups giving another value of it do not find it.
    #[must_use]
    pub fn vary(mut self, header: &str) -> Self {
        self.vary.push_str(header);
        self.vary.push(',');
        self
    }
}

/// What a lookup found, valid for this request (closed when dropped: a turn to insert that was
/// not used is then given up, and the requests waiting for it go on).
#[derive(Debug)]
pub struct Entry(i32);

/// Looks up the entry `key` (1 to 4,096 bytes) for a request with `headers` (those its
/// variants are told apart by; give all of the request's, or none). A miss is an entry that
/// is not found; nothing waits.
///
/// # Errors
/// [`CacheError`].
pub fn lookup(key: impl AsRef<[u8]>, headers: &[(&str, &str)]) -> Result<Entry, CacheError> {
    look(key.as_ref(), headers, 0)
}

/// [`lookup`] that coordinates with other requests: when the entry is missing and another
/// request is inserting it, this one waits for it and finds it; else this request is the one
/// to insert it ([`Entry::must_insert`]) and the others wait for it. A stale entry is found,
/// and one request at a time is asked to insert it anew.
///
/// # Errors
/// [`CacheError`].
pub fn transaction_lookup(
    key: impl AsRef<[u8]>,
    headers: &[(&str, &str)],
) -> Result<Entry, CacheError> {
    look(key.as_ref(), headers, abi::CACHE_TRANSACTION)
}

fn look(key: &[u8], headers: &[(&str, &str)], flags: i32) -> Result<Entry, CacheError> {
    let mut blob = Vec::new();
    for (name, value) in headers {
        blob.extend_from_slice(name.as_bytes());
        blob.push(0);
        blob.extend_from_slice(value.as_bytes());
        blob.push(0);
    }
    // SAFETY: the host reads the key and the headers, each for its length.
    let h = check(unsafe {
        sys::cache_lookup(key.as_ptr(), key.len(), blob.as_ptr(), blob.len(), flags)
    })?;
    Ok(Entry(i32::try_from(h).unwrap_or(i32::MAX)))
}

impl Entry {
    fn state(&self) -> i32 {
        // SAFETY: no pointers.
        unsafe { sys::cache_state(self.0) }.max(0)
    }

    /// It was found (fresh, or stale within its `stale-while-revalidate`).
    pub fn is_found(&self) -> bool {
        self.state() & abi::CACHE_FOUND != 0
    }

    /// It was found stale.
    pub fn is_stale(&self) -> bool {
        self.state() & abi::CACHE_STALE != 0
    }

    /// This request is to insert it ([`Entry::insert`]): a transactional lookup that missed,
    /// or found it stale first. Others doing the same lookup wait until it does (or drops the
    /// entry, or ends).
    pub fn must_insert(&self) -> bool {
        self.state() & abi::CACHE_MUST_INSERT != 0
    }

    /// Its bytes, `None` when it was not found.
    ///
    /// # Errors
    /// [`CacheError`].
    pub fn body(&self) -> Result<Option<Vec<u8>>, CacheError> {
        crate::copy_out_found(
            // SAFETY: the host writes at most `len` bytes at `buf`.
            |buf, len| unsafe { sys::cache_body(self.0, buf, len) },
            1024,
        )
        .map_err(failure)
    }

    /// How long ago it was inserted, `None` when it was not found.
    pub fn age(&self) -> Option<Duration> {
        // SAFETY: no pointers.
        let secs = unsafe { sys::cache_age(self.0) };
        u64::try_from(secs).ok().map(Duration::from_secs)
    }

    /// Keeps `body` under its key (for the headers its lookup gave) as `write` says, replacing
    /// what was there; this request's turn to insert it ends, and the requests waiting for it
    /// find it.
    ///
    /// # Errors
    /// A bad option, a body over the tenant's `max_object_kib` (nothing is stored; a turn to
    /// insert is kept).
    pub fn insert(&self, body: &[u8], write: &Write) -> Result<(), CacheError> {
        // SAFETY: the host reads each buffer for its length.
        check(unsafe {
            sys::cache_insert(
                self.0,
                body.as_ptr(),
                body.len(),
                i32::try_from(write.max_age).unwrap_or(i32::MAX),
                i32::try_from(write.stale_while_revalidate).unwrap_or(i32::MAX),
                write.tags.as_ptr(),
                write.tags.len(),
                write.vary.as_ptr(),
                write.vary.len(),
            )
        })
        .map(drop)
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        // SAFETY: no pointers.
        unsafe { sys::cache_close(self.0) };
    }
}

/// The entry `key`'s bytes; when it is missing, `make()`'s, kept for `max_age` seconds. Of
/// the requests asking at the same time, one makes it and the others wait for it.
///
/// # Errors
/// [`CacheError`] (`UNAVAILABLE` when the tenant has no cache).
pub fn get_or_set(
    key: impl AsRef<[u8]>,
    max_age: u32,
    make: impl FnOnce() -> Vec<u8>,
) -> Result<Vec<u8>, CacheError> {
    let entry = transaction_lookup(key, &[])?;
    if !entry.must_insert()
        && let Some(body) = entry.body()?
    {
        return Ok(body);
    }
    let body = make();
    entry.insert(&body, &Write::new(max_age))?;
    Ok(body)
}

/// Drops what the tenant's cache holds with `tag` on this server (its own entries and
/// answers alike; the admin API's purge reaches every server of a fleet); how many keys it
/// named.
///
/// # Errors
/// [`CacheError`].
pub fn purge_tag(tag: &str) -> Result<u64, CacheError> {
    purge(tag, 0)
}

/// [`purge_tag`] that makes them stale instead: found stale within their
/// `stale-while-revalidate` while one request inserts them anew.
///
/// # Errors
/// [`CacheError`].
pub fn purge_tag_soft(tag: &str) -> Result<u64, CacheError> {
    purge(tag, abi::CACHE_PURGE_SOFT)
}

fn purge(tag: &str, flags: i32) -> Result<u64, CacheError> {
    // SAFETY: the host reads the tag for its length.
    let n = check(unsafe { sys::cache_purge_tag(tag.as_ptr(), tag.len(), flags) })?;
    Ok(n as u64)
}
