//! `tern::cache_*`: a guest keeps entries of its own in its tenant's cache
//! ([`crate::cache::guest`]).
//!
//! A lookup gives a handle (valid for this request) whatever it found; the entry's state says
//! what. A transactional lookup's wait for another request inserting the entry suspends the
//! guest. A turn to insert the guest does not use (it closes the handle, ends, traps, runs out
//! of time) is given up with its handle or its instance: the requests waiting for it go on.
//! Each failing call returns an error code; `cache_last_error` then explains it in words.

use bytes::Bytes;
use tern_sdk::abi::{self, errno, func};
use wasmtime::{Caller, Linker};

use super::handles::Handles;
use crate::cache::guest::{CacheError, Entry, Session, Write, request_headers};
use crate::guest::module::memory::{
    GuestFault, GuestMemory, add_text_call, copy_to_guest, guest_range, host_call, memory,
    read_guest,
};

/// The entries a request looked up through the `tern` ABI, by handle.
pub type CacheEntries = Handles<Entry>;

impl CacheEntries {
    fn error(&mut self, e: &CacheError) -> i32 {
        let code = match e {
            CacheError::Invalid(_) => errno::INVALID_ARGUMENT,
            CacheError::Limit(_) => errno::LIMIT_EXCEEDED,
            CacheError::Unavailable(_) => errno::UNAVAILABLE,
        };
        self.fail(code, e.to_string())
    }

    /// The entry behind `handle` when it was found, or the code to return (`NOT_FOUND`).
    fn found(&mut self, handle: i32) -> Result<&Entry, i32> {
        if !self.get(handle)?.state().found {
            return Err(self.fail(errno::NOT_FOUND, "the entry was not found"));
        }
        Ok(self.get(handle)?)
    }
}

/// What these functions reach of a request's store.
pub trait CacheView: GuestMemory {
    /// The entries the request looked up, and its cache session
    /// ([`crate::capabilities::Capabilities::cache`]).
    fn cache(&mut self) -> (&mut CacheEntries, &mut Session);
    /// The entries the request looked up (their last error).
    fn cache_entries(&self) -> &CacheEntries;
}

/// A header's name and value, as bytes.
type Pair<'a> = (&'a [u8], &'a [u8]);

/// `name NUL value NUL` pairs, as `request_headers` gives them.
fn pairs(blob: &[u8]) -> Result<Vec<Pair<'_>>, CacheError> {
    let mut fields = blob.split(|b| *b == 0);
    let mut out = Vec::new();
    while let Some(name) = fields.next() {
        match fields.next() {
            Some(value) => out.push((name, value)),
            // The blob ends with NUL: the split's last field is empty.
            None if name.is_empty() => break,
            None => {
                return Err(CacheError::Invalid(
                    "headers are name NUL value NUL pairs: a value is missing".into(),
                ));
            }
        }
    }
    Ok(out)
}

/// A comma- or space-separated list.
fn list(text: &[u8]) -> Result<Vec<String>, CacheError> {
    let text = std::str::from_utf8(text)
        .map_err(|_| CacheError::Invalid("a list of tags or names is not UTF-8".into()))?;
    Ok(text
        .split([',', ' '])
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect())
}

#[allow(clippy::too_many_lines)] // one registration per ABI function
/// Links these functions (the composition root, [`crate::guest::link`], calls it).
///
/// # Errors
/// Only if wasmtime rejects a definition (a bug).
pub fn add_to_linker<T: CacheView>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    let m = abi::IMPORT_MODULE;
    host_call!(
        linker,
        m,
        func::CACHE_LOOKUP,
        |caller, key, key_len, headers, headers_len, flags| {
            let f = func::CACHE_LOOKUP;
            let key = read_guest(&caller, key, key_len, f)?;
            let blob = read_guest(&caller, headers, headers_len, f)?;
            let (entries, session) = caller.data_mut().cache();
            let flags = match entries.known_flags(flags, abi::CACHE_TRANSACTION) {
                Ok(flags) => flags,
                Err(code) => return Ok(code),
            };
            let headers = match pairs(&blob).and_then(request_headers) {
                Ok(headers) => headers,
                Err(e) => return Ok(entries.error(&e)),
            };
            let transaction = flags & abi::CACHE_TRANSACTION != 0;
            let looked = session.lookup(&key, headers, transaction).await;
            let (entries, _) = caller.data_mut().cache();
            Ok(match looked {
                Ok(entry) => entries.push(entry),
                Err(e) => entries.error(&e),
            })
        }
    )?;
    linker.func_wrap(
        m,
        func::CACHE_STATE,
        |mut caller: Caller<'_, T>, handle: i32| {
            Ok(match caller.data_mut().cache().0.get(handle) {
                Ok(entry) => {
                    let s = entry.state();
                    let flag = |on: bool, flag: i32| if on { flag } else { 0 };
                    flag(s.found, abi::CACHE_FOUND)
                        | flag(s.stale, abi::CACHE_STALE)
                        | flag(s.must_insert, abi::CACHE_MUST_INSERT)
                }
                Err(code) => code,
            })
        },
    )?;
    linker.func_wrap(
        m,
        func::CACHE_BODY,
        |mut caller: Caller<'_, T>, handle: i32, buf: i32, buf_len: i32| {
            let f = func::CACHE_BODY;
            let mem = memory(&caller)?;
            guest_range(buf, buf_len, mem.data(&caller).len()).ok_or(GuestFault::BadPointer(f))?;
            let (data, state) = mem.data_and_store_mut(&mut caller);
            match state.cache().0.found(handle) {
                Ok(entry) => {
                    let body = entry.body().map_or(&[][..], |b| &b[..]);
                    copy_to_guest(data, buf, buf_len, body, f)
                }
                Err(code) => Ok(code),
            }
        },
    )?;
    linker.func_wrap(
        m,
        func::CACHE_AGE,
        |mut caller: Caller<'_, T>, handle: i32| {
            Ok(match caller.data_mut().cache().0.found(handle) {
                Ok(entry) => {
                    let secs = entry.age().unwrap_or_default().as_secs();
                    i32::try_from(secs).unwrap_or(i32::MAX)
                }
                Err(code) => code,
            })
        },
    )?;
    linker.func_wrap(
        m,
        func::CACHE_INSERT,
        |mut caller: Caller<'_, T>,
         handle: i32,
         body: i32,
         body_len: i32,
         max_age: i32,
         swr: i32,
         tags: i32,
         tags_len: i32,
         vary: i32,
         vary_len: i32| {
            let f = func::CACHE_INSERT;
            let body = Bytes::from(read_guest(&caller, body, body_len, f)?);
            let tags = read_guest(&caller, tags, tags_len, f)?;
            let vary = read_guest(&caller, vary, vary_len, f)?;
            let (entries, _) = caller.data_mut().cache();
            let write = list(&tags).and_then(|tags| {
                Ok(Write {
                    max_age: u32::try_from(max_age).unwrap_or(0),
                    stale_while_revalidate: u32::try_from(swr).unwrap_or(u32::MAX),
                    tags,
                    vary: list(&vary)?,
                })
            });
            let inserted = match (write, entries.get(handle)) {
                (_, Err(code)) => return Ok(code),
                (Ok(write), Ok(entry)) => entry.insert(body, &write),
                (Err(e), Ok(_)) => Err(e),
            };
            Ok(match inserted {
                Ok(()) => 0,
                Err(e) => entries.error(&e),
            })
        },
    )?;
    linker.func_wrap(
        m,
        func::CACHE_CLOSE,
        |mut caller: Caller<'_, T>, handle: i32| {
            // Dropped: a turn to insert it is given up.
            Ok(match caller.data_mut().cache().0.close(handle) {
                Ok(()) => 0,
                Err(code) => code,
            })
        },
    )?;
    linker.func_wrap(
        m,
        func::CACHE_PURGE_TAG,
        |mut caller: Caller<'_, T>, tag: i32, tag_len: i32, flags: i32| {
            let tag = read_guest(&caller, tag, tag_len, func::CACHE_PURGE_TAG)?;
            let (entries, session) = caller.data_mut().cache();
            let flags = match entries.known_flags(flags, abi::CACHE_PURGE_SOFT) {
                Ok(flags) => flags,
                Err(code) => return Ok(code),
            };
            let tag = String::from_utf8_lossy(&tag);
            let soft = flags & abi::CACHE_PURGE_SOFT != 0;
            Ok(match session.purge_tag(&tag, soft) {
                Ok(n) => i32::try_from(n).unwrap_or(i32::MAX),
                Err(e) => entries.error(&e),
            })
        },
    )?;
    add_text_call(linker, m, func::CACHE_LAST_ERROR, |s| {
        &s.cache_entries().last_error
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_pairs_and_lists_are_read() {
        let p = pairs(b"accept-language\0fr\0x-a\0\0").unwrap();
        assert_eq!(
            p,
            [
                (&b"accept-language"[..], &b"fr"[..]),
                (&b"x-a"[..], &b""[..])
            ]
        );
        assert!(pairs(b"").unwrap().is_empty());
        assert!(pairs(b"name-without-value").is_err());
        assert_eq!(list(b"a, b c,,").unwrap(), ["a", "b", "c"]);
        assert!(list(b"").unwrap().is_empty());
        assert!(list(&[0xff]).is_err());
    }
}
