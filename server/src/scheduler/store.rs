//! Where schedules' ledgers are kept: in a Redis key-value store when one is named
//! (`server.schedule_store`: one key per schedule, changed by a compare-and-swap script), else
//! in a fleet's registry (one object per schedule, `schedules/<tenant>/<id>.json`, changed by
//! compare-and-swap), or for a lone server in its data directory (`schedules.json`, written
//! whole and atomically after each change, off the reactor).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use object_store::UpdateVersion;
use sha2::Digest;

use crate::fleet::Fleet;
use crate::fleet::objects::{RemoteError, change_id, record_change};
use crate::schedule::{Ledger, State};

/// The data directory's file of ledgers.
const LOCAL_FILE: &str = "schedules.json";

/// How often a change that lost the race is computed again.
const TRIES: usize = 8;

/// Why a ledger could not be changed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The registry cannot be reached (or the file written): nothing is known to be written.
    #[error("{0}")]
    Unreachable(String),
    /// Others kept changing it first.
    #[error("the schedule's ledger kept changing under this replica")]
    Busy,
}

/// Where ledgers are kept.
#[derive(Debug)]
pub enum Store {
    /// A lone server: in memory, saved to the data directory.
    Local {
        /// The data directory's `schedules.json`.
        file: PathBuf,
        /// Every schedule's ledger, by key.
        ledgers: tokio::sync::Mutex<BTreeMap<String, Ledger>>,
    },
    /// A fleet's registry.
    Shared(Arc<Fleet>),
    /// A Redis key-value store (`server.schedule_store`): the server's own keys there, under
    /// the store's prefix.
    Redis(Arc<crate::kv::Store>),
}

/// The key of tenant `tenant`'s schedule `name`: its object's name in the registry.
pub fn key(tenant: &str, name: &str) -> String {
    let digest = sha2::Sha256::digest(name.as_bytes());
    format!(
        "{}{}.json",
        tenant_dir(tenant),
        crate::hex::encode(&digest[..8])
    )
}

/// What the keys of tenant `tenant`'s ledgers start with.
fn tenant_dir(tenant: &str) -> String {
    format!("schedules/{tenant}/")
}

impl Store {
    /// The Redis store `redis` (a `[kv.NAME]` with `backend = "redis"`), else the fleet's
    /// registry, else the data directory's file (read now; runs it records as running are
    /// lost: the process that ran them is gone).
    ///
    /// # Errors
    /// `redis` is not a Redis store.
    pub fn open(
        redis: Option<Arc<crate::kv::Store>>,
        fleet: Option<Arc<Fleet>>,
        data_dir: &std::path::Path,
    ) -> Result<Self, String> {
        if let Some(kv) = redis {
            if kv.redis().is_none() {
                return Err(format!(
                    "the store is a {} one; schedules' ledgers are kept in a Redis store \
                     (backend = \"redis\")",
                    kv.system()
                ));
            }
            return Ok(Self::Redis(kv));
        }
        if let Some(f) = fleet {
            return Ok(Self::Shared(f));
        }
        let file = data_dir.join(LOCAL_FILE);
        let mut ledgers: BTreeMap<String, Ledger> = std::fs::read(&file)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        for l in ledgers.values_mut() {
            for r in &mut l.runs {
                if r.state == State::Running {
                    r.state = State::Lost;
                }
            }
        }
        Ok(Self::Local {
            file,
            ledgers: tokio::sync::Mutex::new(ledgers),
        })
    }

    /// The ledger of `key` as kept, tenant `data`'s ([`Ledger::of`]: another's reads as
    /// empty).
    ///
    /// # Errors
    /// [`StoreError::Unreachable`].
    pub async fn read(&self, key: &str, data: &str) -> Result<Ledger, StoreError> {
        let mut ledger = match self {
            Self::Local { ledgers, .. } => {
                ledgers.lock().await.get(key).cloned().unwrap_or_default()
            }
            Self::Shared(f) => read_shared(f, key).await?.0,
            Self::Redis(kv) => read_redis(kv, key).await?.0,
        };
        ledger.of(data);
        Ok(ledger)
    }

    /// Applies `change` to the ledger of `key`, tenant `data`'s ([`Ledger::of`]), and writes
    /// it back, computing it again from the ledger read anew when another replica changed it
    /// first; `change` returns what to answer and whether it changed the ledger (nothing is
    /// written when it did not).
    ///
    /// # Errors
    /// [`StoreError`]: nothing was written (or, registry unreachable, it is unknown).
    pub async fn update<T>(
        &self,
        (key, data): (&str, &str),
        mut change: impl FnMut(&mut Ledger) -> (T, bool),
    ) -> Result<T, StoreError> {
        self.change(key, |ledger: &mut Ledger| {
            ledger.of(data);
            change(ledger)
        })
        .await
    }

    /// Applies `change` to the whole ledger of `key` (every tenant's runs in it) and writes
    /// it back as [`Store::update`] does.
    async fn change<T>(
        &self,
        key: &str,
        mut change: impl FnMut(&mut Ledger) -> (T, bool),
    ) -> Result<T, StoreError> {
        match self {
            Self::Local { file, ledgers } => {
                let mut all = ledgers.lock().await;
                let mut ledger = all.get(key).cloned().unwrap_or_default();
                let (out, changed) = change(&mut ledger);
                if changed {
                    all.insert(key.to_string(), ledger);
                    save_local(file, &all).await?;
                }
                Ok(out)
            }
            Self::Shared(f) => {
                for _ in 0..TRIES {
                    let (mut ledger, version) = read_shared(f, key).await?;
                    let (out, changed) = change(&mut ledger);
                    if !changed {
                        return Ok(out);
                    }
                    let id = change_id();
                    record_change(&mut ledger.changes, &id);
                    let bytes = serde_json::to_vec(&ledger).expect("serialisable");
                    match f
                        .remote
                        .put_if(key, bytes.into(), version.as_ref(), &id)
                        .await
                    {
                        Ok(_) => return Ok(out),
                        Err(RemoteError::Conflict(_)) => {}
                        Err(e) => return Err(StoreError::Unreachable(e.to_string())),
                    }
                }
                Err(StoreError::Busy)
            }
            Self::Redis(kv) => {
                for _ in 0..TRIES {
                    let (mut ledger, raw) = read_redis(kv, key).await?;
                    let (out, changed) = change(&mut ledger);
                    if !changed {
                        return Ok(out);
                    }
                    let bytes = serde_json::to_vec(&ledger).expect("serialisable");
                    let redis = kv.redis().expect("a Redis store (checked when opened)");
                    if redis
                        .swap_own(key, raw.as_deref(), &bytes)
                        .await
                        .map_err(StoreError::Unreachable)?
                    {
                        return Ok(out);
                    }
                }
                Err(StoreError::Busy)
            }
        }
    }

    /// Removes deleted tenant `data`'s runs (`tenant`'s, of its name) from every ledger of
    /// its name; another tenant's of the name (one created again, or a replica's behind) stay.
    /// A lone server's ledgers left with no run are removed; a fleet's and a Redis store's
    /// stay, empty (removing one is not conditional: a claim written meanwhile would go).
    ///
    /// # Errors
    /// [`StoreError`]: some runs may remain.
    pub async fn remove_tenant(&self, tenant: &str, data: &str) -> Result<(), StoreError> {
        let unreachable = |e: &dyn std::fmt::Display| StoreError::Unreachable(e.to_string());
        let dir = tenant_dir(tenant);
        let keys = match self {
            Self::Local { file, ledgers } => {
                let mut all = ledgers.lock().await;
                let mut changed = false;
                all.retain(|k, l| {
                    if !k.starts_with(&dir) || !l.forget(data) {
                        return true;
                    }
                    changed = true;
                    !l.is_empty()
                });
                if changed {
                    save_local(file, &all).await?;
                }
                return Ok(());
            }
            Self::Shared(f) => f
                .remote
                .list(dir.trim_end_matches('/'))
                .await
                .map_err(|e| unreachable(&e))?,
            Self::Redis(kv) => kv
                .redis()
                .expect("a Redis store (checked when opened)")
                .own_keys_under(&dir)
                .await
                .map_err(StoreError::Unreachable)?,
        };
        for key in keys {
            self.change(&key, |l| ((), l.forget(data))).await?;
        }
        Ok(())
    }
}

/// Writes a lone server's ledgers `all` to `file`, whole and atomically, off the reactor.
async fn save_local(
    file: &std::path::Path,
    all: &BTreeMap<String, Ledger>,
) -> Result<(), StoreError> {
    let unreachable = |e: &dyn std::fmt::Display| StoreError::Unreachable(e.to_string());
    let bytes = serde_json::to_vec(all).expect("serialisable");
    let file = file.to_path_buf();
    tokio::task::spawn_blocking(move || crate::artifact::write_atomic(&file, &bytes))
        .await
        .map_err(|e| unreachable(&e))?
        .map_err(|e| unreachable(&e))
}

/// The ledger of `key` in a Redis store, and its bytes as read (`None`: there is none yet).
async fn read_redis(
    kv: &crate::kv::Store,
    key: &str,
) -> Result<(Ledger, Option<Vec<u8>>), StoreError> {
    let redis = kv.redis().expect("a Redis store (checked when opened)");
    let raw = redis.get_own(key).await.map_err(StoreError::Unreachable)?;
    let ledger = match &raw {
        Some(bytes) => serde_json::from_slice(bytes).map_err(|e| {
            StoreError::Unreachable(format!("the schedule's ledger {key} is damaged: {e}"))
        })?,
        None => Ledger::default(),
    };
    Ok((ledger, raw))
}

/// The ledger of `key` in the registry and its version (`None`: there is none yet).
async fn read_shared(f: &Fleet, key: &str) -> Result<(Ledger, Option<UpdateVersion>), StoreError> {
    match f.remote.get_if_changed(key, None).await {
        Ok(None) => Ok((Ledger::default(), None)),
        Ok(Some((bytes, version))) => {
            let ledger = serde_json::from_slice(&bytes).map_err(|e| {
                StoreError::Unreachable(format!("the schedule's ledger {key} is damaged: {e}"))
            })?;
            Ok((ledger, Some(version)))
        }
        Err(e) => Err(StoreError::Unreachable(e.to_string())),
    }
}
