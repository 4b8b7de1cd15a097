//! `tern::rate_*` and `tern::penalty_*`: a guest counts its clients in its tenant's rate
//! counters and keeps them out in its penalty boxes ([`crate::ratelimit::counters`]).
//!
//! Counters and boxes are named in each call (those the tenant declares); nothing waits. Each
//! failing call returns an error code; `rate_last_error` then explains it in words.

use tern_sdk::abi::{self, errno, func};
use wasmtime::{Caller, Linker};

use crate::guest::module::memory::{GuestMemory, add_text_call, read_guest};
use crate::ratelimit::counters::{CheckRate, CounterError, Grant, Session};

/// What these functions reach of a request's store.
pub trait RateView: GuestMemory {
    /// The request's counters session ([`crate::capabilities::Capabilities::counters`]) and
    /// where its last error is kept.
    fn rate(&mut self) -> (&mut Session, &mut String);
    /// The message of its last failed call.
    fn rate_last_error(&self) -> &str;
}

/// A count as an ABI result (at most `i32::MAX`).
fn result(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// An `i32` argument that must not be negative.
fn unsigned(n: i32, what: &str) -> Result<u32, CounterError> {
    u32::try_from(n).map_err(|_| CounterError::Invalid(format!("{what} {n} is negative")))
}

/// Runs `call` on the tenant's counters (as one more call of the request): its result, or the
/// error code (with `rate_last_error` set).
fn run<T: RateView>(
    caller: &mut Caller<'_, T>,
    call: impl FnOnce(&Grant) -> Result<i32, CounterError>,
) -> i32 {
    let (session, last_error) = caller.data_mut().rate();
    match session.call().and_then(call) {
        Ok(n) => n,
        Err(e) => {
            *last_error = e.to_string();
            match e {
                CounterError::Invalid(_) => errno::INVALID_ARGUMENT,
                CounterError::Limit(_) => errno::LIMIT_EXCEEDED,
            }
        }
    }
}

/// Links these functions (the composition root, [`crate::guest::link`], calls it).
///
/// # Errors
/// Only if wasmtime rejects a definition (a bug).
pub fn add_to_linker<T: RateView>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    let m = abi::IMPORT_MODULE;
    linker.func_wrap(
        m,
        func::RATE_CHECK,
        |mut caller: Caller<'_, T>,
         counter: i32,
         counter_len: i32,
         entry: i32,
         entry_len: i32,
         delta: i32,
         window: i32,
         limit: i32,
         pbox: i32,
         pbox_len: i32,
         ttl: i32| {
            let counter = read_guest(&caller, counter, counter_len, func::RATE_CHECK)?;
            let entry = read_guest(&caller, entry, entry_len, func::RATE_CHECK)?;
            let pbox = read_guest(&caller, pbox, pbox_len, func::RATE_CHECK)?;
            Ok(run(&mut caller, |g| {
                let blocked = g.check_rate(&CheckRate {
                    counter: &counter,
                    entry: &entry,
                    delta: unsigned(delta, "delta")?,
                    window: unsigned(window, "window")?,
                    limit: unsigned(limit, "limit")?,
                    penalty_box: &pbox,
                    ttl: unsigned(ttl, "ttl")?,
                })?;
                Ok(i32::from(blocked))
            }))
        },
    )?;
    linker.func_wrap(
        m,
        func::RATE_INCREMENT,
        |mut caller: Caller<'_, T>,
         counter: i32,
         counter_len: i32,
         entry: i32,
         entry_len: i32,
         delta: i32| {
            let counter = read_guest(&caller, counter, counter_len, func::RATE_INCREMENT)?;
            let entry = read_guest(&caller, entry, entry_len, func::RATE_INCREMENT)?;
            Ok(run(&mut caller, |g| {
                g.counter(&counter)?
                    .increment(&entry, unsigned(delta, "delta")?)?;
                Ok(0)
            }))
        },
    )?;
    for (name, count) in [(func::RATE_LOOKUP, false), (func::RATE_COUNT, true)] {
        linker.func_wrap(
            m,
            name,
            move |mut caller: Caller<'_, T>,
                  counter: i32,
                  counter_len: i32,
                  entry: i32,
                  entry_len: i32,
                  window: i32| {
                let counter = read_guest(&caller, counter, counter_len, name)?;
                let entry = read_guest(&caller, entry, entry_len, name)?;
                Ok(run(&mut caller, |g| {
                    let c = g.counter(&counter)?;
                    let window = unsigned(window, "window")?;
                    let n = if count {
                        c.lookup_count(&entry, window)?
                    } else {
                        c.lookup_rate(&entry, window)?
                    };
                    Ok(result(n))
                }))
            },
        )?;
    }
    linker.func_wrap(
        m,
        func::PENALTY_ADD,
        |mut caller: Caller<'_, T>,
         pbox: i32,
         pbox_len: i32,
         entry: i32,
         entry_len: i32,
         ttl: i32| {
            let pbox = read_guest(&caller, pbox, pbox_len, func::PENALTY_ADD)?;
            let entry = read_guest(&caller, entry, entry_len, func::PENALTY_ADD)?;
            Ok(run(&mut caller, |g| {
                g.penalty_box(&pbox)?.add(&entry, unsigned(ttl, "ttl")?)?;
                Ok(0)
            }))
        },
    )?;
    linker.func_wrap(
        m,
        func::PENALTY_HAS,
        |mut caller: Caller<'_, T>, pbox: i32, pbox_len: i32, entry: i32, entry_len: i32| {
            let pbox = read_guest(&caller, pbox, pbox_len, func::PENALTY_HAS)?;
            let entry = read_guest(&caller, entry, entry_len, func::PENALTY_HAS)?;
            Ok(run(&mut caller, |g| {
                Ok(i32::from(g.penalty_box(&pbox)?.has(&entry)?))
            }))
        },
    )?;
    add_text_call(linker, m, func::RATE_LAST_ERROR, T::rate_last_error)
}
