//! Key-value stores: state that outlives the request (ABI `kv_*`).
//!
//! A guest remembers nothing between requests; a store does. The tenant's configuration grants
//! it stores by name (`kv = ["default"]`; the server has a `default` store without any setup),
//! and each tenant sees only its own keys, even in a store another tenant uses too.
//!
//! ```no_run
//! use tern_sdk::kv::Store;
//! let store = Store::open("default")?;
//! let visits = store.increment("visits", 1)?;
//! store.set("last-visit", b"now")?;
//! assert_eq!(store.get("last-visit")?.as_deref(), Some(&b"now"[..]));
//! // Set only if nobody else did meanwhile:
//! let swapped = store.compare_and_swap("owner", None, b"me")?;
//! for key in store.keys() {
//!     let key = key?;
//! }
//! # Ok::<(), tern_sdk::kv::KvError>(())
//! ```
//!
//! Every call waits for the store (the guest is suspended, the wait counts against its
//! deadline). A request may make `limits.max_kv_ops` calls (1,000 by default); keys and values
//! have the sizes the store allows (1 KiB and 1 MiB by default).
//!
//! **A failed write may have been applied.** A store on another server (Redis) can apply a
//! write and lose its answer (the connection drops, the answer is late): such a call fails
//! with `UNKNOWN_OUTCOME` ([`KvError::may_have_been_applied`]), never with `IO`, which means
//! nothing was sent. Before retrying a write that is not idempotent (an increment), read the
//! value back, or make it one with [`Store::compare_and_swap`].
#![allow(unsafe_code)]

use crate::abi::{self, errno};
use crate::sys;

interface_error!(
    /// Why a key-value call failed: the host's error code and its message.
    KvError,
    "key-value call",
    kv_last_error,
    "The ABI error code ([`abi::errno`]): `DENIED` (store not granted), `LIMIT_EXCEEDED`, \
     `INVALID_ARGUMENT`, `IO` (the store failed before the call was sent: nothing was \
     written; try again later), `UNKNOWN_OUTCOME` (a write was sent and never answered: it \
     may have been applied — see [`KvError::may_have_been_applied`])."
);

impl KvError {
    /// Whether the failed call was a write that reached the store without an answer, so that
    /// it may have been applied: an increment retried after it may count twice, a `set`
    /// retried is harmless. A call failing with any other code wrote nothing.
    pub fn may_have_been_applied(&self) -> bool {
        self.code == errno::UNKNOWN_OUTCOME
    }
}

/// An open store of the tenant.
#[derive(Debug, Clone, Copy)]
pub struct Store(i32);

impl Store {
    /// Opens the store `name` (one the tenant is granted).
    ///
    /// # Errors
    /// `DENIED` if the tenant is not granted it.
    pub fn open(name: &str) -> Result<Self, KvError> {
        // SAFETY: the host reads `name.len()` bytes at `name`.
        let h = check(unsafe { sys::kv_open(name.as_ptr(), name.len()) })?;
        Ok(Self(i32::try_from(h).unwrap_or(i32::MAX)))
    }

    /// The value of `key`, `None` if it has none.
    ///
    /// # Errors
    /// [`KvError`].
    pub fn get(&self, key: impl AsRef<[u8]>) -> Result<Option<Vec<u8>>, KvError> {
        let key = key.as_ref();
        crate::copy_out_found(
            // SAFETY: the host reads the key and writes at most `len` bytes at `buf`.
            |buf, len| unsafe { sys::kv_get(self.0, key.as_ptr(), key.len(), buf, len) },
            1024,
        )
        .map_err(failure)
    }

    /// Sets the value of `key`.
    ///
    /// # Errors
    /// `LIMIT_EXCEEDED` past a size or the tenant's quota in the store; [`KvError`].
    pub fn set(&self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Result<(), KvError> {
        let (key, value) = (key.as_ref(), value.as_ref());
        // SAFETY: the host reads the key and the value.
        check(unsafe { sys::kv_set(self.0, key.as_ptr(), key.len(), value.as_ptr(), value.len()) })
            .map(drop)
    }

    /// Removes `key` (a key that has no value is no error).
    ///
    /// # Errors
    /// [`KvError`].
    pub fn delete(&self, key: impl AsRef<[u8]>) -> Result<(), KvError> {
        let key = key.as_ref();
        // SAFETY: the host reads the key.
        check(unsafe { sys::kv_delete(self.0, key.as_ptr(), key.len()) }).map(drop)
    }

    /// Whether `key` has a value.
    ///
    /// # Errors
    /// [`KvError`].
    pub fn exists(&self, key: impl AsRef<[u8]>) -> Result<bool, KvError> {
        let key = key.as_ref();
        // SAFETY: the host reads the key.
        check(unsafe { sys::kv_exists(self.0, key.as_ptr(), key.len()) }).map(|n| n == 1)
    }

    /// Adds `delta` to the integer value of `key` (a key without one counts as 0) and returns
    /// the new value, atomically: concurrent increments all count. The value is stored as
    /// decimal text (`get` reads `b"42"`).
    ///
    /// # Errors
    /// `INVALID_ARGUMENT` if the value is not a decimal 64-bit integer or the sum overflows.
    pub fn increment(&self, key: impl AsRef<[u8]>, delta: i64) -> Result<i64, KvError> {
        let key = key.as_ref();
        let mut value = delta;
        // SAFETY: the host reads the key and reads and writes the 8 bytes at `value`.
        check(unsafe { sys::kv_increment(self.0, key.as_ptr(), key.len(), &raw mut value) })?;
        Ok(value)
    }

    /// Sets `key` to `new` if its value is `expected` (`None`: if it has none), atomically;
    /// returns whether it did.
    ///
    /// # Errors
    /// [`KvError`].
    pub fn compare_and_swap(
        &self,
        key: impl AsRef<[u8]>,
        expected: Option<&[u8]>,
        new: impl AsRef<[u8]>,
    ) -> Result<bool, KvError> {
        let (key, new) = (key.as_ref(), new.as_ref());
        let (old, flags) = expected.map_or((&[][..], abi::KV_CAS_ABSENT), |e| (e, 0));
        // SAFETY: the host reads the key, the old and the new value.
        let ret = unsafe {
            sys::kv_compare_and_swap(
                self.0,
                key.as_ptr(),
                key.len(),
                old.as_ptr(),
                old.len(),
                new.as_ptr(),
                new.len(),
                flags,
            )
        };
        check(ret).map(|n| n == 1)
    }

    /// Every key of the tenant in this store, in bytewise order, fetched a batch at a time.
    pub fn keys(&self) -> Keys {
        Keys {
            store: *self,
            cursor: Vec::new(),
            batch: Vec::new(),
            at: 0,
            done: false,
        }
    }
}

/// The keys of a store ([`Store::keys`]).
#[derive(Debug)]
pub struct Keys {
    store: Store,
    cursor: Vec<u8>,
    batch: Vec<u8>,
    at: usize,
    done: bool,
}

/// Bytes asked for per `kv_list` call: room for many keys, and always for the largest one.
const LIST_BUFFER: usize = 64 * 1024 + 2;

impl Iterator for Keys {
    type Item = Result<Vec<u8>, KvError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.at >= self.batch.len() {
            if self.done {
                return None;
            }
            self.batch.clear();
            self.batch.reserve_exact(LIST_BUFFER);
            // SAFETY: the host reads the cursor and writes at most `capacity` bytes.
            let ret = unsafe {
                sys::kv_list(
                    self.store.0,
                    self.cursor.as_ptr(),
                    self.cursor.len(),
                    self.batch.as_mut_ptr(),
                    self.batch.capacity(),
                )
            };
            let n = match check(ret) {
                Ok(n) => n,
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            };
            // SAFETY: the host initialised the first `n` bytes.
            unsafe { self.batch.set_len(n) };
            self.at = 0;
            if n == 0 {
                self.done = true;
                return None;
            }
        }
        let len_bytes = self.batch.get(self.at..self.at + 2)?;
        let len = usize::from(u16::from_le_bytes([len_bytes[0], len_bytes[1]]));
        let key = self.batch.get(self.at + 2..self.at + 2 + len)?.to_vec();
        self.at += 2 + len;
        self.cursor.clone_from(&key);
        Some(Ok(key))
    }
}
