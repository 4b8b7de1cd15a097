//! The tenant registry: the live routing table, and every change to it.
//!
//! Requests read [`Live`] through an atomically swapped pointer: one load per request, no
//! lock. A change (deploy, rollback, delete, a new or changed tenant, a config reload) builds
//! a complete new table beside the old one and swaps it in, so every request sees the old
//! table or the new one, never a mix; a request that started on a version finishes on it
//! (it holds an `Arc` of its tenant). Changes are serialised by one mutex, compile off the
//! async reactor, and are written to the [`DataDir`] before they are published: a change the
//! client saw succeed survives a crash, and a failed change leaves the running version
//! serving.
//!
//! This file holds the table, the registry and the one path every change is committed by
//! (`commit`: checked, written, published). Beside it: `changes` (the admin API's changes:
//! settings, assets, deploy, rollback, delete), `reload` (the tenants loaded at start-up and
//! when the config file is read again), `loader` (stored versions into pre-linked tenants, off
//! the reactor), `shared` (a replica kept in step with a fleet's registry),
//! `precondition` (If-Match / If-None-Match), `spec` (a partial settings change), `error`
//! (why a change was refused, its status), `describe` (the admin API's JSON), `upload` (an
//! upload's first bytes), `reset` (every tenant moved to a swap-safe engine).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use wasmtime::Engine;

use crate::config::{self, Config};
use crate::datadir::{DataDir, Manifest, StoredTenant};
use crate::engine::EpochTicker;
use crate::fleet::Fleet;
use crate::fleet::objects::RemoteError;
use crate::metrics::Metrics;

mod changes;
mod describe;
mod error;
mod loader;
mod precondition;
mod purges;
mod reload;
mod reset;
mod rollout;
mod serving;
mod shared;
mod spec;
mod state;
mod tokens;
mod upload;
mod variables;

pub use tokens::{NewToken, TokenRefused};
pub use variables::Listed;

pub use crate::change::ChangeError;
use error::internal;
use loader::{Loader, Runtime};
pub use precondition::Precondition;
pub use rollout::{RolloutChanged, Taken};
pub use serving::{Candidate, Serving};
pub use spec::SpecChange;
use state::{Change, State, check_cache_budget, check_routes, one_owner};
pub use state::{Deployed, Live, Registry};

/// How long a change that keeps losing the race to the shared registry is tried again before
/// the client is told to retry (`409`).
const CONFLICT_PATIENCE: Duration = Duration::from_secs(20);

impl Registry {
    /// The server's key-value stores (`[kv]`), which shared rate limits count in too.
    pub fn stores(&self) -> &crate::kv::Stores {
        &self.loader.resources.stores
    }

    /// Loads the config's tenants and the store's, checks that their names and routes do not
    /// clash, and publishes them. With a shared registry (`fleet`), the API tenants come from
    /// it, or from the data directory's snapshot of it if it cannot be reached.
    ///
    /// # Errors
    /// If a tenant cannot be loaded (every failing tenant is named), a name or route clashes,
    /// or the store cannot be read. With a shared registry, a tenant of it that cannot be
    /// loaded is left out (logged, tried again later) rather than stopping the replica.
    pub async fn start(
        config: Config,
        config_path: Option<PathBuf>,
        store: DataDir,
        engine: Engine,
        metrics: Metrics,
        fleet: Option<Arc<Fleet>>,
    ) -> anyhow::Result<Self> {
        let runtime = Runtime::new(engine.clone(), config.pool.clone())?;
        let forward = fleet.as_ref().map(|f| {
            Arc::new(crate::fleet::Forwarder {
                fleet: f.clone(),
                sent: metrics.websocket_fleet_publishes.clone(),
            }) as Arc<dyn crate::websocket::channels::Forward>
        });
        let resources =
            crate::capabilities::Resources::open(&config, store.root(), &metrics, forward)
                .map_err(anyhow::Error::msg)?;
        let secrets = crate::variables::SecretsKey::load(
            &config.server.secrets_key_file,
            &config.server.secrets_previous_key_file,
            store.root(),
            fleet.is_some(),
        )?
        .map(Arc::new);
        match &secrets {
            Some(key) => tracing::info!(key = key.id(), from = %key.source, "secrets key"),
            None => tracing::warn!("{}", crate::variables::seal::NO_KEY),
        }
        let snapshot = store.load_manifest()?;
        let (manifest, shared) = match &fleet {
            None => {
                one_owner(&config, &snapshot, None).map_err(|e| anyhow::anyhow!("{e}"))?;
                (snapshot, None)
            }
            Some(f) => shared::first_read(f, snapshot, &config, &metrics).await,
        };
        let ready = fleet.is_none() || shared.is_some() || !manifest.tenants.is_empty();
        let registry = Self {
            fleet,
            ready: std::sync::atomic::AtomicBool::new(ready),
            report_due: std::sync::atomic::AtomicBool::new(true),
            purges: tokio::sync::Mutex::default(),
            started_at: crate::datadir::now(),
            tokens: ArcSwap::from_pointee(crate::access::Tokens::new()),
            used: Mutex::new(tokens::load_use(store.root())),
            used_dirty: std::sync::atomic::AtomicBool::new(false),
            tickers: Mutex::new(vec![EpochTicker::start(&engine)]),
            memset: tokio::sync::watch::Sender::new(!config.pool.pagemap_scan),
            live: ArcSwap::from_pointee(Live::default()),
            state: tokio::sync::Mutex::new(State {
                config: config.clone(),
                config_path,
                manifest: manifest.clone(),
                shared,
                retry_at: None,
            }),
            loader: Arc::new(Loader {
                in_flight: Default::default(),
                max_upload: config.server.max_upload_bytes,
                store,
                runtime: ArcSwap::from_pointee(runtime),
                metrics,
                resources: Arc::new(resources),
            }),
            secrets,
        };
        let started = Instant::now();
        {
            let state = registry.state.lock().await;
            registry.follow_variables(&state, true);
        }
        let mut tenants = registry.load_config_tenants(&config).await?;
        let api = registry.load_api_tenants(&manifest).await?;
        let (n_config, n_api) = (tenants.len(), api.len());
        tenants.extend(api.iter().map(|(n, t)| (n.clone(), t.clone())));
        let wanted = Self::wanted(&manifest, &api);
        let (candidates, unloaded) = registry.load_candidates(wanted, &Live::default()).await;
        let live = Live::build(tenants.into_values(), candidates)?;
        registry.live.store(Arc::new(live));
        let manifest = {
            let mut state = registry.state.lock().await;
            registry
                .served_after_start(&mut state, &api, !unloaded.is_empty())
                .await;
            state.manifest.clone()
        };
        registry.tokens.store(Arc::new(manifest.tokens.clone()));
        let reserved =
            crate::config::ServerConfig::cache_shares(config.tenants.iter().map(|t| &t.settings))
                + crate::config::ServerConfig::cache_shares(
                    manifest.tenants.values().map(|t| &t.spec),
                );
        if reserved > config.server.cache_max_mib {
            // Lowered since the API's tenants reserved their shares: they keep them (nothing
            // deployed is dropped), and no tenant can reserve more until it fits again.
            tracing::warn!(
                "the tenants' caches reserve {reserved} MiB, over server.cache_max_mib = {} MiB; \
                 raise it or lower a tenant's cache.max_mib",
                config.server.cache_max_mib
            );
        }
        let removed = registry.loader.store.collect_garbage(&manifest);
        tracing::info!(
            config_tenants = n_config,
            api_tenants = n_api,
            data_dir = %registry.loader.store.root().display(),
            removed_unused_files = removed,
            "tenants loaded in {:.1} ms",
            started.elapsed().as_secs_f64() * 1e3
        );
        Ok(registry)
    }

    /// The current table (one atomic load).
    pub fn live(&self) -> arc_swap::Guard<Arc<Live>> {
        self.live.load()
    }

    /// Largest upload the admin API accepts.
    pub fn max_upload(&self) -> u64 {
        self.loader.max_upload
    }

    /// The engine new tenants are linked on (for the pool's metrics).
    pub fn engine(&self) -> Engine {
        self.loader.runtime().engine.clone()
    }

    /// Makes a change durable, then visible: the manifest is written before the new table, if
    /// any, is swapped in, so a change a client saw succeed survives a crash and a failed write
    /// changes nothing. On a single server the manifest is the data directory's (written
    /// atomically). With a shared registry it is the registry's, replaced by compare-and-swap:
    /// if another replica changed the registry first, its change is applied here and this one
    /// is made again on top of it, unless it changed this same tenant (then `409`, nothing
    /// written). The write records a change id, so a write whose reply was lost is recognised
    /// when the registry is read back (`Remote::put_if`); one whose fate the registry's answers
    /// never settled is a `503` that says so.
    ///
    /// A change of no route, or the server's own: [`Self::commit_as`] the operator.
    async fn commit(&self, state: &mut State, change: Change) -> Result<(), ChangeError> {
        self.commit_as(state, change, crate::access::Principal::Operator)
            .await
    }

    /// [`Self::commit`] of a change `who` asked for: a tenant's routes checked again after
    /// another replica's change was applied are checked for `who`, as they were before the
    /// first attempt (a scoped token's change takes no request from a tenant it does not
    /// reach, whichever replica made that tenant first; its refusal names none).
    async fn commit_as(
        &self,
        state: &mut State,
        change: Change,
        who: crate::access::Principal<'_>,
    ) -> Result<(), ChangeError> {
        // The table to swap in, from the one serving now (rebuilt after another replica's
        // change was applied); none for a change that routes nothing differently.
        let table_now = || match &change {
            Change::Tenant {
                name,
                serve: Some(serve),
                ..
            } => self.live.load().with(name, serve.clone()).map(Some),
            _ => Ok(None),
        };
        let mut table = table_now()?;
        if let Some(fleet) = self.fleet.clone() {
            // A replica whose change lost the race to the registry reads the winner's and
            // tries again after a random pause that grows with each loss: a replica making
            // many changes in a row (one round trip each) would otherwise win every race
            // against one that must read before it writes. It gives up after a while.
            let mut attempts: u32 = 0;
            let started = Instant::now();
            // One id for every attempt of this change: whichever attempt the registry applied
            // is recognised by it.
            let id = crate::fleet::objects::change_id();
            loop {
                let read = state.shared.as_ref().ok_or_else(|| {
                    ChangeError::Unavailable("the shared registry has not been read yet".into())
                })?;
                let mut next = read.manifest.clone();
                change.apply_to(&mut next);
                next.revision = read.manifest.revision + 1;
                crate::fleet::objects::record_change(&mut next.changes, &id);
                match fleet
                    .remote
                    .put_manifest(&next, read.version.as_ref(), &id)
                    .await
                {
                    Ok(written) => {
                        let version = written.version();
                        if version.is_none() {
                            // Others wrote after it: the next read fetches the whole index.
                            fleet.wake.notify_one();
                        }
                        state.shared = Some(state::Read {
                            manifest: next,
                            version,
                        });
                        fleet.nudge_peers(&self.loader.metrics);
                        break;
                    }
                    Err(RemoteError::Conflict(_)) if started.elapsed() < CONFLICT_PATIENCE => {
                        attempts += 1;
                        let ceiling = 10u64 << attempts.min(5);
                        let pause = crate::random_below(ceiling + 1);
                        tokio::time::sleep(Duration::from_millis(pause)).await;
                        self.sync(state).await?;
                        change.still_applies(state.truth())?;
                        if let Change::Tenant {
                            name,
                            entry: Some(e),
                            ..
                        } = &change
                        {
                            // Checked again as before the first attempt, on what the other
                            // replica's change made of the registry.
                            check_routes(&self.live.load(), state.truth(), name, &e.spec, who)?;
                            check_cache_budget(state, name, &e.spec)?;
                        }
                        table = table_now()?;
                    }
                    Err(RemoteError::Conflict(_)) => {
                        return Err(ChangeError::Conflict(
                            "the shared registry kept changing during this change; nothing was \
                             written: retry"
                                .into(),
                        ));
                    }
                    Err(e) => return Err(shared::unavailable(&fleet, &e)),
                }
            }
        }
        let mut manifest = state.manifest.clone();
        change.apply_to(&mut manifest);
        if let Some(read) = &state.shared {
            manifest.revision = read.manifest.revision;
            // Tokens serve as the registry holds them (this change, and any other replica's
            // read on the way).
            manifest.tokens = read.manifest.tokens.clone();
        }
        if let Err(e) = self.save_manifest(&manifest).await {
            if self.fleet.is_none() {
                return Err(e);
            }
            // The registry holds the change; only the local snapshot is behind.
            tracing::error!("cannot save the registry's snapshot in the data directory: {e}");
        }
        let dropped: Vec<String> = state
            .manifest
            .referenced()
            .difference(&manifest.referenced())
            .cloned()
            .collect();
        state.manifest = manifest;
        match change {
            Change::Tenant { .. } => {
                self.follow_variables(state, false);
                if let Some(live) = table {
                    self.live.store(Arc::new(live));
                }
                self.forget(state, dropped).await;
                self.changed();
            }
            Change::Token { .. } => self.tokens.store(Arc::new(state.manifest.tokens.clone())),
        }
        Ok(())
    }

    /// Makes the variables guests read follow the config file's tenants and the manifest's
    /// (`reread_file`: the config file's secrets are read again from the environment and
    /// files). A tenant whose secrets cannot be opened here is logged, without its values.
    fn follow_variables(&self, state: &State, reread_file: bool) {
        let sources = crate::variables::Sources {
            file: state
                .config
                .tenants
                .iter()
                .map(|t| (t.name.get_ref().as_str(), &t.variables))
                .collect(),
            base_dir: &state.config.base_dir,
            api: state
                .manifest
                .tenants
                .iter()
                .map(|(n, t)| (t.data_key(n), n.as_str(), &t.variables))
                .collect(),
            reread_file,
        };
        for (tenant, why) in self
            .loader
            .resources
            .variables
            .follow(&sources, self.secrets.as_deref())
        {
            tracing::error!(
                tenant,
                "its guests cannot read their variables on this server: {why}"
            );
        }
    }

    /// Writes the data directory's manifest, off the reactor.
    async fn save_manifest(&self, manifest: &Manifest) -> Result<(), ChangeError> {
        let (store, manifest) = (self.loader.store.clone(), manifest.clone());
        Ok(
            tokio::task::spawn_blocking(move || store.save_manifest(&manifest))
                .await
                .map_err(internal)??,
        )
    }

    /// Removes, in every key-value store, the data of tenant `name` (as `stored`), deleted
    /// here. A store failing is logged: the data, reached by no tenant (a tenant created again
    /// under the name has another id, another key), then takes space until it is cleared. A
    /// fleet's replica that reads the deletion from the registry leaves its own SQLite stores
    /// as they are (a registry that reads empty, one misnamed, must never cost data): there
    /// the rows stay, reached by no tenant.
    pub(super) async fn forget_data(&self, name: &str, stored: &StoredTenant) {
        let key = stored.data_key(name);
        for store in self.loader.resources.stores.all() {
            match store.forget(&key).await {
                Ok(()) => tracing::debug!(tenant = name, store = %store.name, "keys removed"),
                Err(e) => tracing::warn!(
                    tenant = name,
                    store = %store.name,
                    "cannot remove a deleted tenant's keys (they take space, reached by no \
                     tenant): {e}"
                ),
            }
        }
    }

    /// Removes the stored files of `hashes` that no version in the manifest refers to and no
    /// deploy in flight holds: versions a change dropped, uploads a deploy refused. The caller
    /// holds the change lock, so the manifest cannot change meanwhile.
    async fn forget(&self, state: &State, hashes: Vec<String>) {
        let referenced = state.manifest.referenced();
        let hashes: Vec<String> = hashes
            .into_iter()
            .filter(|h| !referenced.contains(h))
            .collect();
        if hashes.is_empty() {
            return;
        }
        let loader = self.loader.clone();
        let removed = tokio::task::spawn_blocking(move || {
            // Under the in-flight lock: a deploy cannot store one of these hashes meanwhile.
            let held = loader.in_flight.lock().unwrap_or_else(|e| e.into_inner());
            hashes
                .iter()
                .filter(|h| !held.contains_key(*h))
                .map(|h| loader.store.remove_hash(h))
                .sum::<usize>()
        })
        .await
        .unwrap_or(0);
        if removed > 0 {
            tracing::debug!("removed {removed} stored files no version uses");
        }
    }

    fn count_deploy(&self, name: &str, ok: bool) {
        let label = self.loader.metrics.tenant_label(name);
        let outcome = if ok { "ok" } else { "error" };
        self.loader
            .metrics
            .deploys
            .with_label_values(&[&label, outcome])
            .inc();
    }

    /// What blocking loads need, for `spawn_blocking`.
    fn loader(&self) -> Arc<Loader> {
        self.loader.clone()
    }

    /// Refuses changes to tenants the config file owns.
    fn check_api_owned(state: &State, name: &str) -> Result<(), ChangeError> {
        if state
            .config
            .tenants
            .iter()
            .any(|t| t.name.get_ref() == name)
        {
            return Err(ChangeError::Conflict(match &state.config_path {
                Some(file) => format!(
                    "tenant {name:?} is declared in the config file ({}); change it there and \
                     reload (SIGHUP), or deploy under another name",
                    file.display()
                ),
                None => format!(
                    "tenant {name:?} is a demo tenant of the built-in config ({}); to serve \
                     without the demo tenants start `tern serve --no-demo` (or with --config \
                     FILE listing only your tenants), or deploy under another name",
                    config::DEMO_CONFIG_NAME
                ),
            }));
        }
        Ok(())
    }
}
