//! `tern:rate-limit` for components: a guest counts its clients in its tenant's rate counters
//! and keeps them out in its penalty boxes ([`crate::ratelimit::counters`]), as the `tern`
//! ABI's `rate_*` and `penalty_*` calls do.

use wasmtime::component::{HasData, Linker};

use crate::ratelimit::counters::{CheckRate, CounterError, Grant, Session};

mod bindings {
    wasmtime::component::bindgen!({
        path: "wit/rate-limit",
        world: "tern:rate-limit/host",
        imports: { default: trappable },
        require_store_data_send: true,
    });
}

use bindings::tern::rate_limit::rate_limit as api;

/// Adds `tern:rate-limit` to `linker`.
///
/// # Errors
/// Only if wasmtime rejects a definition (a bug).
pub fn add_to_linker<T: Send + 'static>(
    linker: &mut Linker<T>,
    view: fn(&mut T) -> RateHost<'_>,
) -> wasmtime::Result<()> {
    bindings::Host_::add_to_linker::<T, HasRate>(linker, view)
}

/// What this interface reaches of a request's store: its counters session.
pub struct RateHost<'a> {
    /// The request's counters ([`crate::capabilities::Capabilities::counters`]).
    pub session: &'a mut Session,
}

/// The [`HasData`] of [`RateHost`].
struct HasRate;

impl HasData for HasRate {
    type Data<'a> = RateHost<'a>;
}

impl From<CounterError> for api::Error {
    fn from(e: CounterError) -> Self {
        match e {
            CounterError::Invalid(why) => Self::InvalidArgument(why),
            CounterError::Limit(why) => Self::LimitExceeded(why),
        }
    }
}

type Answer<T> = wasmtime::Result<Result<T, api::Error>>;

impl RateHost<'_> {
    /// Runs `call` on the tenant's counters, as one more call of the request.
    fn run<T>(&mut self, call: impl FnOnce(&Grant) -> Result<T, CounterError>) -> Answer<T> {
        Ok(self.session.call().and_then(call).map_err(Into::into))
    }
}

impl api::Host for RateHost<'_> {
    fn check_rate(
        &mut self,
        counter: String,
        entry: String,
        delta: u32,
        window_seconds: u32,
        limit: u32,
        penalty_box: String,
        ttl_seconds: u32,
    ) -> Answer<bool> {
        self.run(|g| {
            g.check_rate(&CheckRate {
                counter: counter.as_bytes(),
                entry: entry.as_bytes(),
                delta,
                window: window_seconds,
                limit,
                penalty_box: penalty_box.as_bytes(),
                ttl: ttl_seconds,
            })
        })
    }

    fn increment(&mut self, counter: String, entry: String, delta: u32) -> Answer<()> {
        self.run(|g| {
            g.counter(counter.as_bytes())?
                .increment(entry.as_bytes(), delta)
        })
    }

    fn lookup_rate(&mut self, counter: String, entry: String, window_seconds: u32) -> Answer<u32> {
        self.run(|g| {
            g.counter(counter.as_bytes())?
                .lookup_rate(entry.as_bytes(), window_seconds)
        })
    }

    fn lookup_count(
        &mut self,
        counter: String,
        entry: String,
        duration_seconds: u32,
    ) -> Answer<u32> {
        self.run(|g| {
            g.counter(counter.as_bytes())?
                .lookup_count(entry.as_bytes(), duration_seconds)
        })
    }

    fn penalty_box_add(
        &mut self,
        penalty_box: String,
        entry: String,
        ttl_seconds: u32,
    ) -> Answer<()> {
        self.run(|g| {
            g.penalty_box(penalty_box.as_bytes())?
                .add(entry.as_bytes(), ttl_seconds)
        })
    }

    fn penalty_box_has(&mut self, penalty_box: String, entry: String) -> Answer<bool> {
        self.run(|g| g.penalty_box(penalty_box.as_bytes())?.has(entry.as_bytes()))
    }
}
