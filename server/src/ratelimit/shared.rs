//! Shared limits (`shared = true`): one count for the whole fleet, kept in a Redis key-value
//! store (`[kv.NAME]`, the connection its guests' keys go through) instead of each replica's
//! memory. Every request is one script on the Redis server (nginx's arithmetic on the
//! server's clock, so replicas' clocks do not matter): exact across replicas, at the cost of
//! a round trip. A key is a hash of its parts every replica computes alike (SHA-256), under
//! `rl:TENANT:LIMIT:` in the store's prefix, and expires once it has drained.
//!
//! When the store cannot be reached the limit does what its `when_unreachable` says: `allow`
//! (the default: the request goes on, uncounted) or `refuse` (`429`); either way
//! `tern_rate_limit_unreachable_total` counts it and the log says why (at most every 10 s).

use std::hash::Hasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use sha2::Digest;

use super::config::{LimitConfig, Unreachable};

/// Seconds between two log lines of one limit's unreachable store.
const LOG_EVERY_SECS: u64 = 10;

/// Where a shared limit counts.
#[derive(Debug)]
pub struct Shared {
    store: Arc<crate::kv::Store>,
    /// `rl:TENANT:LIMIT:`.
    base: String,
    /// What it does when the store cannot be reached.
    pub unreachable: Unreachable,
    failed: prometheus::IntCounter,
    started: Instant,
    /// When it last logged a failure (s since `started`, plus one; 0: never).
    logged: AtomicU64,
}

impl Shared {
    /// Where `config` (a shared limit of `tenant`) counts: its store, which must be a Redis one.
    ///
    /// # Errors
    /// No such store, or not a Redis one.
    pub fn new(
        config: &LimitConfig,
        tenant: &str,
        stores: &crate::kv::Stores,
        failed: prometheus::IntCounter,
    ) -> Result<Self, String> {
        let name = config.store.as_deref().unwrap_or(crate::kv::DEFAULT_STORE);
        let store = stores.get(name).ok_or_else(|| {
            format!(
                "rate_limit {:?}: shared = true counts in a Redis store; there is no [kv.{name}] \
                 (stores: {})",
                config.name,
                stores.names().join(", ")
            )
        })?;
        if store.redis().is_none() {
            return Err(format!(
                "rate_limit {:?}: shared = true counts in a Redis store, and [kv.{name}] is {} \
                 (name a Redis store with store = \"...\")",
                config.name,
                store.system()
            ));
        }
        Ok(Self {
            store: store.clone(),
            base: format!("rl:{tenant}:{}:", config.name),
            unreachable: config.when_unreachable,
            failed,
            started: Instant::now(),
            logged: AtomicU64::new(0),
        })
    }

    /// The excess of `key` with one more request and whether the key was new (see
    /// [`crate::kv::redis::Redis::leaky_bucket`]), or `None` when the store could not be
    /// reached (counted and logged).
    pub async fn excess(&self, key: u64, rate: u64, burst: u64) -> Option<(u64, bool)> {
        let redis = self.store.redis()?;
        let key = format!("{}{key:016x}", self.base);
        match redis.leaky_bucket(&key, rate, burst, None).await {
            Ok(answer) => Some(answer),
            Err(why) => {
                self.unreachable_now(&why);
                None
            }
        }
    }

    /// Gives back one request charged to `key` (another limit refused it; `new`: that
    /// request made the key).
    pub async fn refund(&self, key: u64, new: bool) {
        let Some(redis) = self.store.redis() else {
            return;
        };
        let key = format!("{}{key:016x}", self.base);
        if let Err(why) = redis.leaky_bucket(&key, 1, 0, Some(new)).await {
            self.unreachable_now(&why);
        }
    }

    /// Counts and (at most every 10 s) logs a failure to reach the store.
    fn unreachable_now(&self, why: &str) {
        self.failed.inc();
        let now = self.started.elapsed().as_secs() + 1;
        let last = self.logged.load(Ordering::Relaxed);
        if (last == 0 || now >= last + LOG_EVERY_SECS)
            && self
                .logged
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(
                limit = %self.base,
                "a shared rate limit cannot count ({why}): its requests are {}",
                match self.unreachable {
                    Unreachable::Allow => "let through (when_unreachable = \"allow\")",
                    Unreachable::Refuse => "refused (when_unreachable = \"refuse\")",
                }
            );
        }
    }
}

/// A hasher every replica computes alike (the first 8 bytes of SHA-256), for shared keys.
#[derive(Default)]
pub struct Stable(sha2::Sha256);

impl Hasher for Stable {
    fn finish(&self) -> u64 {
        let digest = self.0.clone().finalize();
        u64::from_be_bytes(digest[..8].try_into().expect("8 bytes"))
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
}
