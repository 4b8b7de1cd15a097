//! Admission to the region pool: a request takes a slot before it may instantiate a guest.
//!
//! wasmtime's pooling allocator preallocates every instance slot, memory, table and fiber stack
//! at start-up and fails an instantiation when none is free. A semaphore with one permit per
//! slot turns that failure into a bounded wait (the `queue` phase) and then a clean `503`.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Every slot stayed busy for the whole queue timeout.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("all {slots} instance slots are busy; try again shortly")]
pub struct Overloaded {
    /// Pool size, for the message.
    pub slots: u32,
}

/// The admission gate in front of the pool.
#[derive(Debug, Clone)]
pub struct Pool {
    slots: Arc<Semaphore>,
    size: u32,
    queue_timeout: Duration,
}

/// A held pool slot; returned when dropped (after teardown).
pub type Slot = OwnedSemaphorePermit;

impl Pool {
    /// A gate for `size` slots where requests wait at most `queue_timeout`.
    pub fn new(size: u32, queue_timeout: Duration) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(size as usize)),
            size,
            queue_timeout,
        }
    }

    /// Takes a slot, waiting up to the queue timeout.
    ///
    /// # Errors
    /// [`Overloaded`] if no slot came free in time.
    pub async fn admit(&self) -> Result<Slot, Overloaded> {
        // Fast path without arming a timer: a slot is usually free.
        if let Ok(slot) = self.slots.clone().try_acquire_owned() {
            return Ok(slot);
        }
        match tokio::time::timeout(self.queue_timeout, self.slots.clone().acquire_owned()).await {
            Ok(Ok(slot)) => Ok(slot),
            _ => Err(Overloaded { slots: self.size }),
        }
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
