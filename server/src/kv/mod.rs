//! Guests' key-value stores: named stores (`[kv.NAME]`, and `default` without configuration),
//! granted per tenant (`kv = ["default"]`), each tenant's keys apart from every other's.
//!
//! A store is a backend behind a bounded queue: [`sqlite`] (embedded, one file per store in the
//! data directory) runs its operations on a thread of its own, so a guest waiting for one is
//! suspended like a guest waiting for a backend, and the reactor never waits on a disk;
//! [`redis`] (a Redis or Valkey server a fleet shares) sends them on one multiplexed
//! connection, its writes as Lua scripts that check the quotas where the data is. The guest
//! kinds map [`KvError`] to their own errors (`guest::module::tern::kv`, `guest::wasi_http::kv`).

#[cfg(test)]
mod conformance;
pub mod redis;
pub mod sqlite;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// The store every tenant may be granted without configuring one.
pub const DEFAULT_STORE: &str = "default";

/// `[kv.NAME]`: one store.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StoreConfig {
    /// `sqlite` (the default): a file in the data directory, or at `path`.
    #[serde(default)]
    pub backend: Backend,
    /// The SQLite file (absolute, or relative to the data directory). Default:
    /// `kv/NAME.sqlite` in the data directory. `sqlite` only.
    #[serde(default)]
    pub path: Option<String>,
    /// The Redis (or Valkey) server: `redis://[:PASSWORD@]HOST[:PORT][/DB]`. `redis` only,
    /// and required there.
    #[serde(default)]
    pub url: Option<String>,
    /// What the store's keys start with on the Redis server (several stores, or several
    /// fleets, may share one server). Default: `tern:NAME:`. `redis` only.
    #[serde(default)]
    pub prefix: Option<String>,
    /// Longest wait for the Redis server to answer one operation (or to connect), in ms;
    /// past it the guest gets an error. `redis` only.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Longest key, in bytes.
    #[serde(default = "default_max_key_bytes")]
    pub max_key_bytes: usize,
    /// Largest value, in bytes.
    #[serde(default = "default_max_value_bytes")]
    pub max_value_bytes: usize,
    /// Most keys one tenant may hold in this store.
    #[serde(default = "default_max_keys")]
    pub max_keys_per_tenant: u64,
    /// Most bytes (keys and values) one tenant may hold in this store.
    #[serde(default = "default_max_bytes")]
    pub max_bytes_per_tenant: u64,
}

fn default_timeout_ms() -> u64 {
    1000
}
fn default_max_key_bytes() -> usize {
    1024
}
fn default_max_value_bytes() -> usize {
    1 << 20
}
fn default_max_keys() -> u64 {
    100_000
}
fn default_max_bytes() -> u64 {
    256 << 20
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            backend: Backend::default(),
            path: None,
            url: None,
            prefix: None,
            timeout_ms: default_timeout_ms(),
            max_key_bytes: default_max_key_bytes(),
            max_value_bytes: default_max_value_bytes(),
            max_keys_per_tenant: default_max_keys(),
            max_bytes_per_tenant: default_max_bytes(),
        }
    }
}

/// Where a store keeps its data.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// Embedded SQLite (WAL), nothing to set up; each server has its own.
    #[default]
    Sqlite,
    /// A Redis or Valkey server: one store shared by every server pointed at it (a fleet).
    Redis,
}

/// Largest key the ABI lets a store be configured with (a listing buffer of this plus two bytes
/// always holds one key).
pub const KEY_BYTES_CEILING: usize = 65_535;

impl StoreConfig {
    /// What is wrong with this store's settings, if anything.
    fn check(&self, name: &str) -> Result<(), String> {
        if !(1..=KEY_BYTES_CEILING).contains(&self.max_key_bytes) {
            return Err(format!(
                "kv.{name}.max_key_bytes must be 1-{KEY_BYTES_CEILING}, not {}",
                self.max_key_bytes
            ));
        }
        match self.backend {
            Backend::Sqlite => {
                for (key, set) in [
                    ("url", self.url.is_some()),
                    ("prefix", self.prefix.is_some()),
                ] {
                    if set {
                        return Err(format!(
                            "kv.{name}.{key} is for backend = \"redis\"; this store is SQLite"
                        ));
                    }
                }
            }
            Backend::Redis => {
                if self.path.is_some() {
                    return Err(format!(
                        "kv.{name}.path is for backend = \"sqlite\"; a Redis store has a url"
                    ));
                }
                let Some(url) = &self.url else {
                    return Err(format!(
                        "kv.{name}: backend = \"redis\" needs url = \"redis://HOST:PORT\""
                    ));
                };
                redis::check_url(url).map_err(|e| format!("kv.{name}.url: {e}"))?;
                if !(1..=60_000).contains(&self.timeout_ms) {
                    return Err(format!(
                        "kv.{name}.timeout_ms must be 1-60000, not {}",
                        self.timeout_ms
                    ));
                }
            }
        }
        if self.max_value_bytes == 0 || self.max_value_bytes > 64 << 20 {
            return Err(format!(
                "kv.{name}.max_value_bytes must be 1-{} (64 MiB), not {}",
                64 << 20,
                self.max_value_bytes
            ));
        }
        Ok(())
    }
}

/// Whether `name` may name a store: 1-64 of `a-z 0-9 - _`.
pub fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

/// Why a key-value operation failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum KvError {
    /// A key or value the store refuses (empty or too long key, a value that is not an integer
    /// to an increment).
    #[error("{0}")]
    Invalid(String),
    /// A limit: key or value size, the tenant's keys or bytes in the store.
    #[error("{0}")]
    Limit(String),
    /// The store could not do it (its file, its thread, a server refusing the connection):
    /// nothing was written; the guest may try again later.
    #[error("{0}")]
    Unavailable(String),
    /// A write was sent to the store and no answer came (the connection dropped, the answer
    /// was late): it may have been applied or not. Retrying an increment may count it twice.
    #[error("{0}")]
    Unknown(String),
}

/// An operation on one tenant's keys.
#[derive(Debug)]
pub enum Op {
    /// The key's value, if it has one.
    Get(Vec<u8>),
    /// Whether the key has a value.
    Exists(Vec<u8>),
    /// Sets the key's value.
    Set(Vec<u8>, Vec<u8>),
    /// Removes the key (a missing key is no error).
    Delete(Vec<u8>),
    /// Adds to the key's value (decimal text; a missing key counts as 0).
    Increment(Vec<u8>, i64),
    /// Sets the key to the new value if its value is `expected` (`None`: if it is absent).
    CompareAndSwap {
        /// The key.
        key: Vec<u8>,
        /// The value it must have (`None`: it must have none).
        expected: Option<Vec<u8>>,
        /// Its value if it had.
        new: Vec<u8>,
    },
    /// Up to `limit` keys after `after` (bytewise order), from the first with `None`.
    List {
        /// The last key already seen.
        after: Option<Vec<u8>>,
        /// Most keys answered.
        limit: usize,
    },
}

impl Op {
    /// Its name in traces.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Get(_) => "get",
            Op::Exists(_) => "exists",
            Op::Set(..) => "set",
            Op::Delete(_) => "delete",
            Op::Increment(..) => "increment",
            Op::CompareAndSwap { .. } => "compare_and_swap",
            Op::List { .. } => "list",
        }
    }
}

/// What an operation answered.
#[derive(Debug, PartialEq, Eq)]
pub enum Answer {
    /// `Get`: the value, if any.
    Value(Option<Vec<u8>>),
    /// `Exists`; `CompareAndSwap`: whether it swapped.
    Bool(bool),
    /// `Set`, `Delete`.
    Done,
    /// `Increment`: the new value.
    Integer(i64),
    /// `List`: the keys, in order.
    Keys(Vec<Vec<u8>>),
}

/// One store: its settings and its backend's queue.
pub struct Store {
    /// Its name (`[kv.NAME]`).
    pub name: String,
    /// Its settings.
    pub config: StoreConfig,
    backend: Driver,
    /// `tern_kv_operations_total` by result: ok, limit, invalid, unavailable.
    counts: [prometheus::IntCounter; 5],
}

debug_fields!(Store: name);

impl Store {
    /// Its backend's name in traces (`db.system.name`).
    pub fn system(&self) -> &'static str {
        match &self.backend {
            Driver::Sqlite(_) => "sqlite",
            Driver::Redis(_) => "redis",
        }
    }

    /// Runs `op` on `tenant`'s keys. Sizes are checked here, before the backend sees it.
    ///
    /// # Errors
    /// [`KvError`].
    pub async fn run(&self, tenant: &Arc<str>, op: Op) -> Result<Answer, KvError> {
        let answer = match self.check(&op) {
            Ok(()) => match &self.backend {
                Driver::Sqlite(b) => b.run(tenant.clone(), op).await,
                Driver::Redis(b) => b.run(tenant, op).await,
            },
            Err(e) => Err(e),
        };
        let result = match &answer {
            Ok(_) => 0,
            Err(KvError::Limit(_)) => 1,
            Err(KvError::Invalid(_)) => 2,
            Err(KvError::Unavailable(_)) => 3,
            Err(KvError::Unknown(_)) => 4,
        };
        self.counts[result].inc();
        answer
    }

    fn check(&self, op: &Op) -> Result<(), KvError> {
        let key = match op {
            Op::Get(k)
            | Op::Exists(k)
            | Op::Set(k, _)
            | Op::Delete(k)
            | Op::Increment(k, _)
            | Op::CompareAndSwap { key: k, .. } => k,
            Op::List { after, .. } => return after.as_deref().map_or(Ok(()), |k| self.key(k)),
        };
        self.key(key)?;
        let value = match op {
            Op::Set(_, v) | Op::CompareAndSwap { new: v, .. } => v,
            _ => return Ok(()),
        };
        self.within("value", value, self.config.max_value_bytes)
    }

    fn key(&self, key: &[u8]) -> Result<(), KvError> {
        if key.is_empty() {
            return Err(KvError::Invalid("a key must not be empty".into()));
        }
        self.within("key", key, self.config.max_key_bytes)
    }

    /// A key or value (`what`) of at most `max` bytes (the store's `max_{what}_bytes`).
    fn within(&self, what: &str, bytes: &[u8], max: usize) -> Result<(), KvError> {
        if bytes.len() > max {
            return Err(KvError::Limit(format!(
                "a {what} of {} bytes is over store {:?}'s max_{what}_bytes ({max})",
                bytes.len(),
                self.name,
            )));
        }
        Ok(())
    }
}

/// A store's backend.
enum Driver {
    Sqlite(sqlite::Sqlite),
    Redis(Box<redis::Redis>),
}

/// What one tenant's guests may use: its stores, in the order granted, and how many
/// operations a request may make.
#[derive(Debug)]
pub struct Grants {
    /// Whose keys they are.
    pub tenant: Arc<str>,
    /// The stores granted (`[tenant] kv`).
    pub stores: Vec<Arc<Store>>,
    /// `limits.max_kv_ops`.
    pub max_ops: u32,
}

impl Grants {
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
    grants: Arc<Grants>,
    ops: u32,
    /// The request's trace, when tracing is on: each operation is a span.
    trace: Option<Arc<crate::trace::Active>>,
    /// Time the guest spent waiting for its stores.
    pub waited: Duration,
}

impl Session {
    /// No operation made yet.
    pub fn new(grants: Arc<Grants>, trace: Option<Arc<crate::trace::Active>>) -> Self {
        Self {
            grants,
            ops: 0,
            trace,
            waited: Duration::ZERO,
        }
    }

    /// What the tenant is granted.
    pub fn grants(&self) -> &Arc<Grants> {
        &self.grants
    }

    /// The granted store named `name`.
    ///
    /// # Errors
    /// Why not, for the guest: the store is not granted to this tenant.
    pub fn open(&self, name: &str) -> Result<Arc<Store>, String> {
        if let Some(store) = self.grants.store(name) {
            return Ok(store.clone());
        }
        let granted: Vec<&str> = self.grants.stores.iter().map(|s| s.name.as_str()).collect();
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
        if self.ops >= self.grants.max_ops {
            return Err(KvError::Limit(format!(
                "more than {} key-value operations in one request (limits.max_kv_ops)",
                self.grants.max_ops
            )));
        }
        self.ops += 1;
        Ok(())
    }

    /// Runs `op` on `store` (counted, and its wait timed).
    ///
    /// # Errors
    /// [`KvError`].
    pub async fn run(&mut self, store: &Store, op: Op) -> Result<Answer, KvError> {
        self.count()?;
        let op_name = op.name();
        let started = Instant::now();
        let answer = store.run(&self.grants.tenant, op).await;
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

/// Every store of this server, by name: opened at start-up.
#[derive(Clone, Default)]
pub struct Stores(Arc<BTreeMap<String, Arc<Store>>>);

impl std::fmt::Debug for Stores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.0.keys()).finish()
    }
}

impl Stores {
    /// Opens the stores of `configs` and `default` (configured or not); SQLite files live
    /// under `data_dir` unless their config says otherwise. A store's file is opened on its
    /// first use, so a server whose tenants use no store creates none.
    ///
    /// # Errors
    /// A store name or setting that is not valid.
    pub fn open(
        configs: &BTreeMap<String, StoreConfig>,
        data_dir: &Path,
        operations: &prometheus::IntCounterVec,
    ) -> Result<Self, String> {
        let mut stores = BTreeMap::new();
        let default = (DEFAULT_STORE.to_string(), StoreConfig::default());
        for (name, config) in configs
            .iter()
            .map(|(n, c)| (n.clone(), c.clone()))
            .chain(std::iter::once(default))
        {
            if stores.contains_key(&name) {
                continue;
            }
            if !valid_name(&name) {
                return Err(format!(
                    "kv store name {name:?}: use 1-64 of a-z, 0-9, '-' and '_'"
                ));
            }
            config.check(&name)?;
            let backend = match config.backend {
                Backend::Sqlite => {
                    let path = match &config.path {
                        Some(p) => data_dir.join(p),
                        None => data_dir.join("kv").join(format!("{name}.sqlite")),
                    };
                    Driver::Sqlite(sqlite::Sqlite::new(&name, path, &config))
                }
                Backend::Redis => Driver::Redis(Box::new(redis::Redis::new(&name, &config)?)),
            };
            let counts = ["ok", "limit", "invalid", "unavailable", "unknown"]
                .map(|result| operations.with_label_values(&[name.as_str(), result]));
            stores.insert(
                name.clone(),
                Arc::new(Store {
                    name,
                    config,
                    backend,
                    counts,
                }),
            );
        }
        Ok(Self(Arc::new(stores)))
    }

    /// The store named `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<Store>> {
        self.0.get(name)
    }

    /// The names of every store, for error messages.
    pub fn names(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }

    /// The stores a tenant is granted, by `names`.
    ///
    /// # Errors
    /// A name that is no store of this server.
    pub fn grant(&self, names: &[String]) -> Result<Vec<Arc<Store>>, String> {
        names
            .iter()
            .map(|n| {
                self.get(n).cloned().ok_or_else(|| {
                    format!(
                        "kv: no store named {n:?} (this server's stores: {}; add [kv.{n}] to \
                         the config file)",
                        self.names().join(", ")
                    )
                })
            })
            .collect()
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
