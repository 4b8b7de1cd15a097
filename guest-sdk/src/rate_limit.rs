//! Rate counters and penalty boxes (ABI `rate_*`, `penalty_*`): a guest keeps nothing between
//! requests, so it counts its clients here, in counters and boxes its tenant declares
//! (`[[tenant.rate_counter]]`, `[[tenant.penalty_box]]`), after Fastly's Edge Rate Limiting.
//! Counts are per server (each replica of a fleet counts its own).
//!
//! ```no_run
//! use tern_sdk::rate_limit::{PenaltyBox, RateCounter};
//! let counter = RateCounter::open("requests");
//! let banned = PenaltyBox::open("banned");
//! // More than 5 requests a second over the last 10 s: kept out for 5 minutes.
//! if counter.check_rate("192.0.2.1", 1, 10, 5, &banned, 300)? {
//!     // answer 429
//! }
//! # Ok::<(), tern_sdk::rate_limit::RateError>(())
//! ```
#![allow(unsafe_code)]

use crate::sys;

interface_error!(
    /// Why a rate counter or penalty box call failed: the host's error code and its message.
    RateError,
    "rate counter call",
    rate_last_error,
    "The ABI error code ([`crate::abi::errno`]): `INVALID_ARGUMENT` (a counter or box the \
     tenant does not declare, an entry of 0 or over 256 bytes, a window outside 1-60 s, a ttl \
     outside 1-86,400 s), `LIMIT_EXCEEDED` (over 1,000 calls in one request)."
);

/// A number the ABI takes as an `i32` (larger ones are refused by the host as negative).
fn arg(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(-1)
}

/// A rate counter the tenant declares (`[[tenant.rate_counter]]`), by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateCounter<'a>(&'a str);

/// A penalty box the tenant declares (`[[tenant.penalty_box]]`), by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PenaltyBox<'a>(&'a str);

impl<'a> RateCounter<'a> {
    /// The counter `name` (whether the tenant declares it is checked by each call).
    pub fn open(name: &'a str) -> Self {
        Self(name)
    }

    /// Blocked (`true`) when `entry` is in `penalty_box` (then not counted), or when `delta`
    /// added to its count makes its rate over the last `window` seconds (1-60) more than
    /// `limit` per second: it then goes in the box for `ttl` seconds (1-86,400).
    ///
    /// # Errors
    /// [`RateError`].
    pub fn check_rate(
        &self,
        entry: &str,
        delta: u32,
        window: u32,
        limit: u32,
        penalty_box: &PenaltyBox<'_>,
        ttl: u32,
    ) -> Result<bool, RateError> {
        let (c, b) = (self.0, penalty_box.0);
        // SAFETY: the host reads each pointer for its length.
        let n = check(unsafe {
            sys::rate_check(
                c.as_ptr(),
                c.len(),
                entry.as_ptr(),
                entry.len(),
                arg(delta),
                arg(window),
                arg(limit),
                b.as_ptr(),
                b.len(),
                arg(ttl),
            )
        })?;
        Ok(n == 1)
    }

    /// Adds `delta` to `entry`'s count.
    ///
    /// # Errors
    /// [`RateError`].
    pub fn increment(&self, entry: &str, delta: u32) -> Result<(), RateError> {
        let c = self.0;
        // SAFETY: the host reads each pointer for its length.
        check(unsafe {
            sys::rate_increment(c.as_ptr(), c.len(), entry.as_ptr(), entry.len(), arg(delta))
        })?;
        Ok(())
    }

    /// `entry`'s rate over the last `window` seconds (1-60), in requests per second.
    ///
    /// # Errors
    /// [`RateError`].
    pub fn lookup_rate(&self, entry: &str, window: u32) -> Result<u32, RateError> {
        let c = self.0;
        // SAFETY: the host reads each pointer for its length.
        let n = check(unsafe {
            sys::rate_lookup(
                c.as_ptr(),
                c.len(),
                entry.as_ptr(),
                entry.len(),
                arg(window),
            )
        })?;
        Ok(u32::try_from(n).unwrap_or(u32::MAX))
    }

    /// `entry`'s count over the last `duration` seconds (1-60).
    ///
    /// # Errors
    /// [`RateError`].
    pub fn lookup_count(&self, entry: &str, duration: u32) -> Result<u32, RateError> {
        let c = self.0;
        // SAFETY: the host reads each pointer for its length.
        let n = check(unsafe {
            sys::rate_count(
                c.as_ptr(),
                c.len(),
                entry.as_ptr(),
                entry.len(),
                arg(duration),
            )
        })?;
        Ok(u32::try_from(n).unwrap_or(u32::MAX))
    }
}

impl<'a> PenaltyBox<'a> {
    /// The box `name` (whether the tenant declares it is checked by each call).
    pub fn open(name: &'a str) -> Self {
        Self(name)
    }

    /// Puts `entry` in the box for `ttl` seconds (1-86,400; a longer stay it has is kept).
    ///
    /// # Errors
    /// [`RateError`].
    pub fn add(&self, entry: &str, ttl: u32) -> Result<(), RateError> {
        let b = self.0;
        // SAFETY: the host reads each pointer for its length.
        check(unsafe {
            sys::penalty_add(b.as_ptr(), b.len(), entry.as_ptr(), entry.len(), arg(ttl))
        })?;
        Ok(())
    }

    /// Whether `entry` is in the box.
    ///
    /// # Errors
    /// [`RateError`].
    pub fn has(&self, entry: &str) -> Result<bool, RateError> {
        let b = self.0;
        // SAFETY: the host reads each pointer for its length.
        let n =
            check(unsafe { sys::penalty_has(b.as_ptr(), b.len(), entry.as_ptr(), entry.len()) })?;
        Ok(n == 1)
    }
}
