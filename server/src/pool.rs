//! Admission to the region pool: a request takes a slot before it may instantiate a guest.
//!
//! wasmtime's pooling allocator preallocates every instance slot, memory, table and fiber stack
//! at start-up and fails an instantiation when none is free. A semaphore with one permit per
//! slot turns that failure into a bounded wait (the `queue` phase) and then a clean `503`.

use std::sync::Arc;
use std::time::Duration;

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

    /// Takes one of the tenant's permits (`tenant`, its concurrency cap of `tenant_limit`) and
    /// then a pool slot, waiting up to the queue timeout for both together.
    ///
    /// # Errors
    /// [`Overloaded`] if either stayed unavailable for the whole timeout.
    pub async fn admit(
        &self,
        tenant: &Arc<Semaphore>,
        tenant_limit: usize,
    ) -> Result<Admitted, Overloaded> {
        // Fast path without arming a timer: usually both are free.
        if let Ok(tenant_permit) = tenant.clone().try_acquire_owned() {
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
