//! Admission to the region pool: a request takes a slot before it may instantiate a guest.
//!
//! wasmtime's pooling allocator preallocates every instance slot, memory, table and fiber stack
//! at start-up and fails an instantiation when none is free. A semaphore with one permit per
//! slot turns that failure into a bounded wait (the `queue` phase) and then a clean `503`; the
//! same wait bounds a request's turn in its tenant's line ([`crate::execute::turn`]).

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::metrics::GaugeGuard;

/// No slot came free within the queue timeout.
#[derive(Debug, Clone, Copy, thiserror::Error)]
pub enum Overloaded {
    /// Every slot of the pool stayed busy.
    #[error("all {0} instance slots are busy; try again shortly")]
    Pool(u32),
    /// The tenant stayed at its concurrency limit (`limits.max_concurrency`).
    #[error("this tenant is at its limit of {0} concurrent requests; try again shortly")]
    Tenant(usize),
    /// The tenant's line on its worker did not move (its guests there kept using their time
    /// slices up: [`crate::execute::turn`]).
    #[error("this tenant's requests are waiting in line for a busy worker; try again shortly")]
    Line,
}

/// A request's admission: one of its tenant's concurrency permits and a pool slot, both
/// returned when dropped (after teardown).
#[derive(Debug)]
pub struct Admitted {
    /// One of the tenant's `limits.max_concurrency` permits.
    pub tenant_permit: OwnedSemaphorePermit,
    /// The pool slot.
    pub slot: Slot,
}

/// The admission gate in front of the pool.
#[derive(Debug, Clone)]
pub struct Pool {
    slots: Arc<Semaphore>,
    size: u32,
    queue_timeout: Duration,
    queue_depth: prometheus::IntGauge,
}

/// A held pool slot; returned when dropped (after teardown).
pub type Slot = OwnedSemaphorePermit;

impl Pool {
    /// How long a request waits for a slot at most.
    pub fn queue_timeout(&self) -> Duration {
        self.queue_timeout
    }

    /// A gate for `size` slots where requests wait at most `queue_timeout`; `queue_depth`
    /// counts the requests waiting.
    pub fn new(size: u32, queue_timeout: Duration, queue_depth: prometheus::IntGauge) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(size as usize)),
            size,
            queue_timeout,
            queue_depth,
        }
    }

    /// Waits for the request's turn in its tenant's `line` (see [`crate::execute::turn`]),
    /// then takes one of the tenant's permits (`tenant`, its concurrency cap of `tenant_limit`)
    /// and a pool slot, waiting up to the queue timeout for the three together.
    ///
    /// # Errors
    /// [`Overloaded`] if one stayed unavailable for the whole timeout.
    pub async fn admit(
        &self,
        line: impl Future<Output = ()>,
        tenant: &Arc<Semaphore>,
        tenant_limit: usize,
    ) -> Result<Admitted, Overloaded> {
        let mut line = pin!(line);
        // Fast path without arming a timer: usually the line is empty and both are free.
        let in_turn = line.as_mut().now_or_never().is_some();
        if in_turn && let Ok(tenant_permit) = tenant.clone().try_acquire_owned() {
            if let Ok(slot) = self.slots.clone().try_acquire_owned() {
                return Ok(Admitted {
                    tenant_permit,
                    slot,
                });
            }
            drop(tenant_permit);
        }
        let _waiting = GaugeGuard::new(&self.queue_depth);
        let deadline = tokio::time::Instant::now() + self.queue_timeout;
        if !in_turn {
            tokio::time::timeout_at(deadline, line)
                .await
                .map_err(|_| Overloaded::Line)?;
        }
        let tenant_permit = tokio::time::timeout_at(deadline, tenant.clone().acquire_owned())
            .await
            .ok()
            .and_then(Result::ok)
            .ok_or(Overloaded::Tenant(tenant_limit))?;
        let slot = tokio::time::timeout_at(deadline, self.slots.clone().acquire_owned())
            .await
            .ok()
            .and_then(Result::ok)
            .ok_or(Overloaded::Pool(self.size))?;
        Ok(Admitted {
            tenant_permit,
            slot,
        })
    }

    /// Slots not in use right now.
    pub fn available(&self) -> usize {
        self.slots.available_permits()
    }

    /// Total slots.
    pub fn size(&self) -> u32 {
        self.size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(queue_timeout: Duration) -> Pool {
        let depth = prometheus::IntGauge::new("queue_depth", "requests waiting").unwrap();
        Pool::new(2, queue_timeout, depth)
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_line_that_does_not_move_is_refused_at_the_queue_timeout() {
        let pool = pool(Duration::from_millis(20));
        let tenant = Arc::new(Semaphore::new(2));
        let refused = tokio::time::timeout(
            Duration::from_secs(10),
            pool.admit(std::future::pending(), &tenant, 2),
        )
        .await
        .expect("the wait in line is bounded");
        let Err(refused) = refused else {
            panic!("admitted past a line that never moved")
        };
        assert!(matches!(refused, Overloaded::Line), "{refused}");
        assert!(refused.to_string().contains("waiting in line"), "{refused}");
        // Nothing was taken while it waited.
        assert_eq!((pool.available(), tenant.available_permits()), (2, 2));
        assert_eq!(pool.queue_depth.get(), 0);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_request_whose_turn_comes_is_admitted() {
        let pool = pool(Duration::from_secs(10));
        let tenant = Arc::new(Semaphore::new(2));
        let now = pool.admit(async {}, &tenant, 2).await.expect("at once");
        let later = pool
            .admit(tokio::task::yield_now(), &tenant, 2)
            .await
            .expect("after its turn");
        assert_eq!((pool.available(), tenant.available_permits()), (0, 0));
        drop((now, later));
        assert_eq!((pool.available(), tenant.available_permits()), (2, 2));
    }
}
