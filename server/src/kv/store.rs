//! The server's stores ([`Stores`], opened at start-up from `[kv]`), each a [`Store`] in
//! front of its backend.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use super::config::{Backend, DEFAULT_STORE, KEY_BYTES_CEILING, StoreConfig, valid_name};
use super::op::{KvError, Op, Reply};
use super::{redis, sqlite};

debug_fields!(Store: name);

/// One store: its settings and its backend's queue.
pub struct Store {
    /// Its name (`[kv.NAME]`).
    pub name: String,
    /// Its settings.
    pub config: StoreConfig,
    backend: Opened,
    /// `tern_kv_operations_total` by result: ok, limit, invalid, unavailable.
    counts: [prometheus::IntCounter; 5],
}

impl Store {
    /// Its backend's name in traces (`db.system.name`).
    pub fn system(&self) -> &'static str {
        match &self.backend {
            Opened::Sqlite(_) => "sqlite",
            Opened::Redis(_) => "redis",
        }
    }

    /// Its Redis server, when it is on one (what a shared rate limit counts through).
    pub fn redis(&self) -> Option<&redis::Redis> {
        match &self.backend {
            Opened::Sqlite(_) => None,
            Opened::Redis(r) => Some(r),
        }
    }

    /// Gets the store ready for its first operation: a SQLite store's thread opens its file
    /// (a Redis store connects on its first operation).
    pub fn start(&self) {
        if let Opened::Sqlite(s) = &self.backend {
            s.start();
        }
    }

    /// Runs `op` on `tenant`'s keys. Sizes are checked here, before the backend sees it.
    ///
    /// # Errors
    /// [`KvError`].
    pub async fn run(&self, tenant: &Arc<str>, op: Op) -> Result<Reply, KvError> {
        let answer = match self.check(&op) {
            Ok(()) => match &self.backend {
                Opened::Sqlite(b) => b.run(tenant.clone(), op).await,
                Opened::Redis(b) => b.run(tenant, op).await,
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

    /// Removes every key of `tenant` (a tenant deleted, or created again under its name: see
    /// [`crate::datadir::StoredTenant::data_key`]). A SQLite store never opened is left as
    /// it is (it holds nothing). Not counted among the guests' operations.
    ///
    /// # Errors
    /// [`KvError`]: the store failing or not answering (the keys are then still there).
    pub async fn forget(&self, tenant: &Arc<str>) -> Result<(), KvError> {
        match &self.backend {
            Opened::Sqlite(b) if !b.exists() => Ok(()),
            Opened::Sqlite(b) => b.run(tenant.clone(), Op::Forget).await.map(drop),
            Opened::Redis(b) => b.run(tenant, Op::Forget).await.map(drop),
        }
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
            Op::Forget => return Ok(()),
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
enum Opened {
    Sqlite(sqlite::Sqlite),
    Redis(Box<redis::Redis>),
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
    /// under `data_dir` unless their config says otherwise. A store's file is opened when a
    /// tenant granted it is loaded ([`Self::grant`]), so a server whose tenants use no store
    /// creates none.
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
                    Opened::Sqlite(sqlite::Sqlite::new(&name, path, &config))
                }
                Backend::Redis => Opened::Redis(Box::new(redis::Redis::new(&name, &config)?)),
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

    /// Every store.
    pub fn all(&self) -> impl Iterator<Item = &Arc<Store>> {
        self.0.values()
    }

    /// The names of every store, for error messages.
    pub fn names(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }

    /// The stores a tenant is granted, by `names`, each started ([`Store::start`]): the
    /// tenant's first request finds its files open.
    ///
    /// # Errors
    /// A name that is no store of this server.
    pub fn grant(&self, names: &[String]) -> Result<Vec<Arc<Store>>, String> {
        let granted = names
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
            .collect::<Result<Vec<_>, _>>()?;
        for store in &granted {
            store.start();
        }
        Ok(granted)
    }
}

impl StoreConfig {
    /// What is wrong with this store's settings, if anything.
    pub(super) fn check(&self, name: &str) -> Result<(), String> {
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
