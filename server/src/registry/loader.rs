//! The loading half of the registry: stored versions become pre-linked tenants (artifacts
//! mapped, compiled again only when this engine cannot use them), on blocking threads.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use wasmtime::Engine;

use super::error::internal;
use crate::artifact::{self, Compiled};
use crate::assets::Assets;
use crate::change::ChangeError;
use crate::config::{PoolConfig, TenantConfig};
use crate::datadir::{DataDir, StoredTenant, Version};
use crate::guest::Linkers;
use crate::metrics::Metrics;
use crate::tenant::{self, Carried, Origin, Tenant, TenantError};

/// Modules already loaded in this batch, by SHA-256, so tenants deploying the same module
/// share one mapping and one copy-on-write image.
pub(super) type ModuleCache = Mutex<HashMap<String, Compiled>>;

/// The engine tenants are linked on and what is built with it: replaced as a whole when the
/// engine is ([`super::Registry::use_memset_reset`]).
pub(super) struct Runtime {
    pub(super) engine: Engine,
    pub(super) linkers: Linkers,
    /// The pool settings the engine was built with (and tenants' default limits).
    pub(super) pool: PoolConfig,
}

impl Runtime {
    /// The runtime over `engine`, which was built with `pool`.
    ///
    /// # Errors
    /// Only if wasmtime rejects a linker definition (a bug).
    pub(super) fn new(engine: Engine, pool: PoolConfig) -> anyhow::Result<Self> {
        let linkers = Linkers::new(&engine, pool.wasi_p3).map_err(|e| anyhow::anyhow!("{e:#}"))?;
        Ok(Self {
            engine,
            linkers,
            pool,
        })
    }

    /// The server's parts every tenant prepared on this runtime is prepared with.
    pub(super) fn server_parts<'a>(
        &'a self,
        metrics: &'a Metrics,
        resources: &'a crate::capabilities::Resources,
    ) -> tenant::ServerParts<'a> {
        tenant::ServerParts {
            linkers: &self.linkers,
            pool: &self.pool,
            metrics,
            resources,
        }
    }
}

/// The loading half of a deploy, rollback or start-up, shared with blocking threads.
pub(super) struct Loader {
    /// Module hashes stored by deploys that have not committed (or failed) yet, with how many
    /// deploys hold each: [`Registry::forget`] leaves them alone.
    pub(super) in_flight: std::sync::Mutex<HashMap<String, usize>>,
    pub(super) store: DataDir,
    /// Replaced only under the registry's change lock.
    pub(super) runtime: ArcSwap<Runtime>,
    pub(super) metrics: Metrics,
    pub(super) max_upload: u64,
    /// What the server holds for tenants' capabilities: the key-value stores (opened at
    /// start-up) and every tenant's variables (following the registry).
    pub(super) resources: Arc<crate::capabilities::Resources>,
}

/// A deploy's hold on a module hash it stored and has not committed yet.
pub(super) struct InFlight {
    loader: Arc<Loader>,
    hash: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut held = self
            .loader
            .in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(n) = held.get_mut(&self.hash) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.hash);
            }
        }
    }
}

impl Loader {
    /// The runtime new tenants are prepared on.
    pub(super) fn runtime(&self) -> Arc<Runtime> {
        self.runtime.load_full()
    }

    /// Holds `hash` against [`Registry::forget`] until the returned guard is dropped.
    pub(super) fn hold(self: &Arc<Self>, hash: &str) -> InFlight {
        *self
            .in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(hash.to_string())
            .or_default() += 1;
        InFlight {
            loader: self.clone(),
            hash: hash.to_string(),
        }
    }

    /// Loads a stored version: its artifact by mmap (compiled again from the stored `.wasm`
    /// only if this engine cannot use it) and its assets into memory.
    pub(super) fn load_version(
        &self,
        name: &str,
        stored: &StoredTenant,
        version: &Version,
        carried: Carried,
        cache: &ModuleCache,
    ) -> Result<Tenant, ChangeError> {
        let rt = self.runtime();
        let module = self.module(&rt, name, &version.module, cache)?;
        self.prepare_version(&rt, name, stored, version, &module, carried)
    }

    /// `old` again (same module, assets and version) with the routes, env and limits of
    /// `config`, linked on `rt` with `compiled` (`old`'s module, loaded on `rt`'s engine).
    pub(super) fn respec(
        &self,
        rt: &Runtime,
        old: &Tenant,
        compiled: &Compiled,
        config: &TenantConfig,
    ) -> Result<Tenant, ChangeError> {
        self.respec_carrying(rt, old, compiled, config, Carried::from(old))
    }

    /// [`Self::respec`], carrying over `carried` (a candidate: what it shares with its current
    /// version).
    pub(super) fn respec_carrying(
        &self,
        rt: &Runtime,
        old: &Tenant,
        compiled: &Compiled,
        config: &TenantConfig,
        carried: Carried,
    ) -> Result<Tenant, ChangeError> {
        // The module is the same, so is its kind.
        let mut config = config.clone();
        config.kind = Some(old.kind());
        Ok(tenant::prepare(
            rt.server_parts(&self.metrics, &self.resources),
            compiled,
            &config,
            old.origin.clone(),
            old.assets.clone(),
            carried,
        )?)
    }

    /// Pre-links `module` (loaded on `rt`'s engine) as `version` of the tenant `stored`, with
    /// the version's assets in memory.
    pub(super) fn prepare_version(
        &self,
        rt: &Runtime,
        name: &str,
        stored: &StoredTenant,
        version: &Version,
        module: &Compiled,
        carried: Carried,
    ) -> Result<Tenant, ChangeError> {
        let assets = match &version.assets {
            None => None,
            Some(hash) => {
                let archive = self.store.read_blob(hash).map_err(internal)?;
                let assets = Assets::from_tar(&archive, self.max_upload).map_err(|source| {
                    TenantError::Assets {
                        tenant: name.to_string(),
                        source,
                    }
                })?;
                Some(Arc::new(assets))
            }
        };
        let mut config = stored.to_config(name, &format!("sha256:{}", version.module));
        config.kind = version.kind;
        let origin = Origin::Api {
            version: version.clone(),
        };
        Ok(tenant::prepare(
            rt.server_parts(&self.metrics, &self.resources),
            module,
            &config,
            origin,
            assets,
            carried,
        )?)
    }

    fn module(
        &self,
        rt: &Runtime,
        name: &str,
        hash: &str,
        cache: &ModuleCache,
    ) -> Result<Compiled, ChangeError> {
        if let Some(m) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(hash) {
            return Ok(m.clone());
        }
        let path = artifact::artifact_path(&rt.engine, &self.store.artifacts(), hash);
        let module = match artifact::load_cwasm(&rt.engine, &path) {
            Ok(m) => m,
            Err(e) => {
                if path.exists() {
                    tracing::warn!(tenant = name, "recompiling: {e}");
                }
                let wasm = self.store.read_blob(hash).map_err(internal)?;
                let loaded = artifact::load_wasm(
                    &rt.engine,
                    &wasm,
                    &format!("tenant {name:?}"),
                    &self.store.artifacts(),
                )
                .map_err(|source| TenantError::Artifact {
                    tenant: name.to_string(),
                    source,
                })?;
                if let Some(d) = loaded.compiled_in {
                    self.metrics.compile.observe(d.as_secs_f64());
                }
                loaded.module
            }
        };
        cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(hash.to_string(), module.clone());
        Ok(module)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datadir::TenantSpec;

    /// A loader over a fresh data directory, with a small pool.
    fn loader(dir: &std::path::Path) -> Arc<Loader> {
        let pool = PoolConfig {
            instances: 2,
            max_memory_mib: 16,
            ..PoolConfig::default()
        };
        let engine = crate::engine::build(&pool).expect("engine");
        Arc::new(Loader {
            in_flight: Default::default(),
            store: DataDir::open(dir).expect("data dir"),
            runtime: ArcSwap::from_pointee(Runtime::new(engine, pool).expect("runtime")),
            metrics: Metrics::new(10),
            max_upload: 1 << 20,
            resources: Arc::new(crate::capabilities::Resources {
                stores: crate::kv::Stores::default(),
                variables: Arc::default(),
                hub: crate::websocket::Hub::new(),
                forward: None,
                live_logs: crate::config::LiveLogsConfig::default(),
            }),
        })
    }

    /// Stores `wasm` and returns the version that refers to it.
    fn stored(loader: &Loader, wasm: &[u8]) -> Version {
        let module = loader.store.put_blob(wasm).expect("blob");
        Version {
            id: Version::id_of(&module, None),
            module,
            module_bytes: wasm.len() as u64,
            assets: None,
            deployed_at: 0,
            compile_ms: 0.0,
            kind: None,
        }
    }

    /// Loads `v` as tenant `t` with a fresh module cache.
    fn load(l: &Loader, v: &Version) -> Result<Tenant, ChangeError> {
        let stored = StoredTenant::created(TenantSpec::default());
        l.load_version("t", &stored, v, Carried::default(), &Default::default())
    }

    /// A loader over a temporary directory holding the `hello` demo module, and its version.
    fn with_hello() -> (tempfile::TempDir, Arc<Loader>, Version) {
        let dir = tempfile::tempdir().unwrap();
        let l = loader(dir.path());
        let v = stored(&l, crate::demo::module("hello").unwrap());
        (dir, l, v)
    }

    fn compiles(loader: &Loader) -> u64 {
        loader.metrics.compile.get_sample_count()
    }

    #[test]
    fn a_version_compiles_once_then_maps_its_artifact() {
        let (_dir, l, v) = with_hello();
        let t = load(&l, &v).expect("first load");
        assert_eq!((t.name.as_str(), compiles(&l)), ("t", 1));
        // A new load (say, after a restart) maps the stored artifact.
        load(&l, &v).expect("second load");
        assert_eq!(compiles(&l), 1);
    }

    #[test]
    fn a_damaged_artifact_is_compiled_again_from_the_blob() {
        let (_dir, l, v) = with_hello();
        load(&l, &v).expect("first load");
        let path = artifact::artifact_path(&l.runtime().engine, &l.store.artifacts(), &v.module);
        std::fs::write(&path, b"not an artifact").unwrap();
        load(&l, &v).expect("recompiled");
        assert_eq!(compiles(&l), 2);
    }

    #[test]
    fn a_version_without_its_blob_is_refused() {
        let (_dir, l, mut v) = with_hello();
        v.module = "0".repeat(64);
        let e = load(&l, &v).unwrap_err();
        assert!(matches!(e, ChangeError::Internal(_)), "{e}");
    }

    #[test]
    fn loaded_code_moves_to_an_engine_with_another_reset_without_compiling() {
        let (_dir, l, v) = with_hello();
        let t = load(&l, &v).expect("load");
        let mut pool = l.runtime().pool.clone();
        pool.pagemap_scan = !pool.pagemap_scan;
        let engine = crate::engine::build(&pool).expect("engine");
        assert_eq!(
            artifact::engine_fingerprint(&engine),
            artifact::engine_fingerprint(&l.runtime().engine),
            "the pool's reset is not part of what compiled code depends on"
        );
        let moved = t.compiled.rehome(&engine).expect("rehome");
        assert!(Engine::same(moved.engine(), &engine));
        assert_ne!(moved.image_start(), t.compiled.image_start());
        let rt = Runtime::new(engine, pool).expect("runtime");
        let config = TenantSpec::default().to_config("t", "sha256:x");
        let t2 = l
            .respec(&rt, &t, &moved, &config)
            .expect("linked on the new engine");
        assert_eq!((t2.kind(), compiles(&l)), (t.kind(), 1));
        // Code from an engine that compiles differently is refused, not loaded.
        let other = Engine::new(wasmtime::Config::new().consume_fuel(true)).unwrap();
        assert!(t.compiled.rehome(&other).is_err());
    }

    #[test]
    fn a_hold_lasts_until_every_holder_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let l = loader(dir.path());
        let held = |l: &Loader| l.in_flight.lock().unwrap().get("h").copied();
        let a = l.hold("h");
        let b = l.hold("h");
        assert_eq!(held(&l), Some(2));
        drop(a);
        assert_eq!(held(&l), Some(1));
        drop(b);
        assert_eq!(held(&l), None);
    }
}
