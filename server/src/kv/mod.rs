//! Guests' key-value stores: named stores (`[kv.NAME]`, and `default` without configuration),
//! granted per tenant (`kv = ["default"]`), each tenant's keys apart from every other's.
//!
//! A store is a backend behind a bounded queue: [`sqlite`] (embedded, one file per store in the
//! data directory) runs its operations on a thread of its own, so a guest waiting for one is
//! suspended like a guest waiting for a backend, and the reactor never waits on a disk;
//! [`redis`] (a Redis or Valkey server a fleet shares) sends them on one multiplexed
//! connection, its writes as Lua scripts that check the quotas where the data is. The guest
//! kinds map [`KvError`] to their own errors (`guest::module::tern::kv`, `guest::wasi_http::kv`).

mod config;
#[cfg(test)]
mod conformance;
mod op;
pub mod redis;
pub mod sqlite;
mod store;

pub use config::{Backend, DEFAULT_STORE, KEY_BYTES_CEILING, StoreConfig, valid_name};
pub use op::{KvError, Op, Reply};
pub use store::{Store, Stores};

use std::sync::Arc;
use std::time::{Duration, Instant};

/// What one tenant's guests may use: its stores, in the order granted, and how many
/// operations a request may make.
#[derive(Debug)]
pub struct Grant {
    /// Whose keys they are: the tenant's name, or its name and id (a tenant created again
    /// under a deleted one's name reaches none of the old one's).
    pub tenant: Arc<str>,
    /// The stores granted (`[tenant] kv`).
    pub stores: Vec<Arc<Store>>,
    /// `limits.max_kv_ops`.
    pub max_ops: u32,
}

impl Grant {
    /// The stores `p`'s tenant is granted (its `[tenant] kv`, `names`) among the server's
    /// `stores`, `max_ops` operations per request (`limits.max_kv_ops`).
    ///
    /// # Errors
    /// A store the server does not have, in words for the operator.
    pub fn prepare(
        p: &crate::prepare::Preparing<'_>,
        names: &[String],
        max_ops: u32,
        stores: &Stores,
    ) -> Result<Self, String> {
        Ok(Self {
            tenant: p.data.clone(),
            stores: stores.grant(names)?,
            max_ops,
        })
    }

    /// The granted store named `name`.
    pub fn store(&self, name: &str) -> Option<&Arc<Store>> {
        self.stores.iter().find(|s| s.name == name)
    }
}

/// One request's use of its tenant's stores, whichever guest kind makes it: the stores it may
/// open, the operations it made (`limits.max_kv_ops`) and the time it waited for them (the
/// request's `kv` phase).
#[derive(Debug)]
pub struct Session {
    grant: Arc<Grant>,
    ops: u32,
    /// The request's trace, when tracing is on: each operation is a span.
    trace: Option<Arc<crate::trace::Active>>,
    /// Time the guest spent waiting for its stores.
    pub waited: Duration,
}

impl Session {
    /// No operation made yet, under the tenant's `grant`, for the request of `context`.
    pub fn new(grant: Arc<Grant>, context: &crate::context::RequestContext) -> Self {
        Self {
            grant,
            ops: 0,
            trace: context.trace.clone(),
            waited: Duration::ZERO,
        }
    }

    /// What the tenant is granted.
    pub fn grant(&self) -> &Arc<Grant> {
        &self.grant
    }

    /// The granted store named `name`.
    ///
    /// # Errors
    /// Why not, for the guest: the store is not granted to this tenant.
    pub fn open(&self, name: &str) -> Result<Arc<Store>, String> {
        if let Some(store) = self.grant.store(name) {
            return Ok(store.clone());
        }
        let granted: Vec<&str> = self.grant.stores.iter().map(|s| s.name.as_str()).collect();
        Err(format!(
            "the tenant is not granted a key-value store {name:?} (granted: {}; [tenant] kv = \
             [...] in the config)",
            if granted.is_empty() {
                "none".to_string()
            } else {
                granted.join(", ")
            }
        ))
    }

    /// Counts one more operation.
    ///
    /// # Errors
    /// [`KvError::Limit`] past `limits.max_kv_ops`.
    pub fn count(&mut self) -> Result<(), KvError> {
        if self.ops >= self.grant.max_ops {
            return Err(KvError::Limit(format!(
                "more than {} key-value operations in one request (limits.max_kv_ops)",
                self.grant.max_ops
            )));
        }
        self.ops += 1;
        Ok(())
    }

    /// Runs `op` on `store` (counted, and its wait timed).
    ///
    /// # Errors
    /// [`KvError`].
    pub async fn run(&mut self, store: &Store, op: Op) -> Result<Reply, KvError> {
        self.count()?;
        let op_name = op.name();
        let started = Instant::now();
        let answer = store.run(&self.grant.tenant, op).await;
        self.waited += started.elapsed();
        self.traced(store, op_name, started, answer.as_ref().err());
        answer
    }

    /// Records operation `op` on `store`, begun at `started` and just ended, as a span of the
    /// request's trace (when it has one).
    pub fn traced(
        &self,
        store: &Store,
        op: &'static str,
        started: Instant,
        error: Option<&KvError>,
    ) {
        if let Some(trace) = &self.trace {
            trace.record(crate::trace::Call {
                span_id: crate::trace::span_id(),
                start: started,
                end: Instant::now(),
                what: crate::trace::CallKind::Kv {
                    store: store.name.clone(),
                    system: store.system(),
                    op,
                    error: error.map(ToString::to_string),
                },
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(toml_text: &str) -> Result<(), String> {
        let config: StoreConfig = toml::from_str(toml_text).map_err(|e| e.to_string())?;
        config.check("s")
    }

    #[test]
    fn backend_settings_are_checked() {
        assert_eq!(check(""), Ok(()));
        assert_eq!(
            check("backend = \"redis\"\nurl = \"redis://127.0.0.1:6379/2\""),
            Ok(())
        );
        for (text, why) in [
            ("backend = \"redis\"", "needs url"),
            ("backend = \"redis\"\nurl = \"http://x\"", "kv.s.url"),
            ("backend = \"redis\"\nurl = \"rediss://x\"", "TLS to Redis"),
            (
                "backend = \"redis\"\nurl = \"redis://x\"\npath = \"a\"",
                "kv.s.path is for",
            ),
            (
                "backend = \"redis\"\nurl = \"redis://x\"\ntimeout_ms = 0",
                "timeout_ms",
            ),
            ("url = \"redis://x\"", "kv.s.url is for backend = \"redis\""),
            ("prefix = \"x\"", "kv.s.prefix is for"),
            ("backend = \"memcached\"", "unknown variant"),
        ] {
            let e = check(text).expect_err(text);
            assert!(e.contains(why), "{text}: {e}");
        }
    }
}
