//! The server's open WebSocket connections, within their limits.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

/// The server's open WebSocket connections: counted against `max_websockets` and each
/// tenant's `websocket.max_connections`, closed with `1001` when the server shuts down, and
/// waited for within its grace.
pub struct Sockets {
    open: AtomicU32,
    max: u32,
    /// Open connections per tenant (its [`crate::tenant::Tenant::data`]: a tenant created
    /// again under a deleted one's name counts its own), taken at an opening, not per frame.
    per_tenant: std::sync::Mutex<HashMap<Arc<str>, u32>>,
    /// Every relay's task, waited for at shutdown.
    pub(super) tasks: tokio_util::task::TaskTracker,
    pub(super) shutdown: crate::shutdown::Shutdown,
    pub(super) metrics: crate::metrics::Metrics,
}

impl std::fmt::Debug for Sockets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sockets")
            .field("open", &self.open())
            .field("max", &self.max)
            .finish_non_exhaustive()
    }
}

/// One open connection's place within the limits, given back when it closes.
pub struct Place {
    sockets: Arc<Sockets>,
    tenant: Arc<str>,
    gauge: prometheus::IntGauge,
}

/// Why an opening found no place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// The tenant's `websocket.max_connections`.
    Tenant,
    /// The server's `max_websockets`.
    Server,
}

impl Sockets {
    /// At most `max` connections, closed when `shutdown` fires.
    pub fn new(
        max: u32,
        shutdown: crate::shutdown::Shutdown,
        metrics: crate::metrics::Metrics,
    ) -> Arc<Self> {
        Arc::new(Self {
            open: AtomicU32::new(0),
            max,
            per_tenant: std::sync::Mutex::default(),
            tasks: tokio_util::task::TaskTracker::new(),
            shutdown,
            metrics,
        })
    }

    /// A place for one more connection of `tenant` (metrics labels `label` and `mode`),
    /// within its `max` and the server's.
    ///
    /// # Errors
    /// Which limit is reached.
    pub fn take(
        self: &Arc<Self>,
        tenant: &Arc<str>,
        label: &str,
        mode: super::config::Mode,
        max: u32,
    ) -> Result<Place, Full> {
        // A server shutting down opens no more: each would be closed at once.
        if self.shutdown.is_triggered() {
            return Err(Full::Server);
        }
        if self
            .open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .is_err()
        {
            return Err(Full::Server);
        }
        let mut per = self.per_tenant.lock().expect("never poisoned");
        let name = tenant.clone();
        let n = per.entry(name.clone()).or_insert(0);
        if *n >= max {
            drop(per);
            self.open.fetch_sub(1, Ordering::AcqRel);
            return Err(Full::Tenant);
        }
        *n += 1;
        drop(per);
        let gauge = self
            .metrics
            .websocket_connections
            .with_label_values(&[label, mode.name()]);
        gauge.inc();
        Ok(Place {
            sockets: self.clone(),
            tenant: name,
            gauge,
        })
    }

    /// Connections open now.
    pub fn open(&self) -> u32 {
        self.open.load(Ordering::Acquire)
    }

    /// Waits until every relay has ended (after shutdown each is sent `1001` and given the
    /// time its peers take to answer it).
    pub async fn closed(&self) {
        self.tasks.close();
        self.tasks.wait().await;
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.gauge.dec();
        let mut per = self.sockets.per_tenant.lock().expect("never poisoned");
        if let Some(n) = per.get_mut(&self.tenant) {
            *n -= 1;
            if *n == 0 {
                per.remove(&self.tenant);
            }
        }
        drop(per);
        self.sockets.open.fetch_sub(1, Ordering::AcqRel);
    }
}
