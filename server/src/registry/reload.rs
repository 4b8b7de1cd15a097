//! The tenants loaded at start-up (the config file's and the API's) and by `reload` (the
//! config file read again); stored versions are made pre-linked tenants by `loader`.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::config::Config;
use crate::datadir::{Manifest, StoredTenant, Version};
use crate::tenant::{self, Carried, Origin, Tenant, TenantRef};

/// A stored version to load: its tenant, the tenant's spec, the version, and what it carries
/// over from the version serving.
pub(super) type Stored = (String, StoredTenant, Version, Carried);

use super::error::internal;
use super::loader::ModuleCache;
use super::state::{Live, Registry, collect, one_owner, parallel};
use crate::change::ChangeError;

impl Registry {
    pub(super) async fn load_config_tenants(
        &self,
        config: &Config,
    ) -> Result<BTreeMap<String, TenantRef>, anyhow::Error> {
        let (rt, metrics) = (self.loader.runtime(), self.loader.metrics.clone());
        let resources = self.loader.resources.clone();
        let (tenants, base) = (config.tenants.clone(), config.base_dir.clone());
        // Metric labels go to tenants in the file's order (loading below is parallel).
        for t in &tenants {
            self.loader.metrics.tenant_label(t.name.get_ref());
        }
        let cache = config.server.cache_dir();
        let max = config.server.max_upload_bytes;
        let live = self.live.load_full();
        let results = tokio::task::spawn_blocking(move || {
            parallel(&tenants, |t| {
                let loaded = tenant::load_module(&rt.engine, t, &base, &cache, &rt.pool)?;
                if let Some(d) = loaded.compiled_in {
                    metrics.compile.observe(d.as_secs_f64());
                }
                let assets = tenant::load_assets(t, &base, max)?;
                let carried = live.carried(t.name.get_ref());
                tenant::prepare(
                    rt.server_parts(&metrics, &resources),
                    &loaded.module,
                    t,
                    Origin::Config,
                    assets,
                    carried,
                )
            })
        })
        .await?;
        for (r, t) in results.iter().zip(&config.tenants) {
            self.count_deploy(t.name.get_ref(), r.is_ok());
        }
        collect(results, "tenant(s) failed to load")
    }

    /// Loads the API tenants of `manifest` that have a version. On a single server every one
    /// must load; with a shared registry those that do not are left out (and logged).
    pub(super) async fn load_api_tenants(
        &self,
        manifest: &Manifest,
    ) -> Result<BTreeMap<String, TenantRef>, anyhow::Error> {
        let items: Vec<Stored> = manifest
            .tenants
            .iter()
            .filter_map(|(n, t)| {
                Some((n.clone(), t.clone(), t.current.clone()?, Carried::default()))
            })
            .collect();
        let results = self.load_stored(items).await;
        if self.fleet.is_some() {
            let mut loaded = BTreeMap::new();
            for (name, r) in results {
                match r {
                    Ok(t) => {
                        loaded.insert(name, Arc::new(t));
                    }
                    Err(e) => tracing::error!(
                        tenant = %name,
                        "not served: its version in the registry cannot be loaded: {e}"
                    ),
                }
            }
            return Ok(loaded);
        }
        let what = format!(
            "deployed tenant(s) failed to load from {}",
            self.loader.store.root().display()
        );
        collect(results.into_iter().map(|(_, r)| r).collect(), &what)
    }

    /// Loads stored versions (`(tenant, spec, version, what it carries over)`) in parallel off
    /// the reactor. With a shared registry, what they need is fetched first, and artifacts
    /// compiled here are published after.
    pub(super) async fn load_stored(
        &self,
        items: Vec<Stored>,
    ) -> Vec<(String, Result<Tenant, ChangeError>)> {
        for (name, ..) in &items {
            self.loader.metrics.tenant_label(name);
        }
        let fetched = match &self.fleet {
            Some(f) => {
                let versions: Vec<Version> = items.iter().map(|(_, _, v, _)| v.clone()).collect();
                let engine = self.loader.runtime().engine.clone();
                Some(
                    f.fetch(&self.loader.store, &engine, &versions, &self.loader.metrics)
                        .await,
                )
            }
            None => None,
        };
        let failed: BTreeMap<String, String> = fetched
            .iter()
            .flat_map(|f| f.failed.iter())
            .map(|(id, e)| (id.clone(), e.to_string()))
            .collect();
        let this = self.loader();
        let results = tokio::task::spawn_blocking(move || {
            let cache = ModuleCache::default();
            let results = parallel(&items, |(name, spec, version, carried)| {
                if let Some(e) = failed.get(&version.id) {
                    return Err(ChangeError::Unavailable(format!(
                        "version {} of tenant {name:?}: {e}",
                        version.id
                    )));
                }
                this.load_version(name, spec, version, carried.clone(), &cache)
            });
            items
                .into_iter()
                .map(|(n, ..)| n)
                .zip(results)
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
        if let (Some(f), Some(fetched)) = (&self.fleet, fetched) {
            let engine = self.loader.runtime().engine.clone();
            for module in fetched.compile_here {
                if let Err(e) = f
                    .publish(&self.loader.store, &engine, &module, &self.loader.metrics)
                    .await
                {
                    tracing::warn!(module = %module, "cannot publish a compiled artifact: {e}");
                }
            }
        }
        results
    }

    /// Re-reads the config file and swaps in its tenants (routes, limits, env, modules) and, if
    /// the server has a TLS listener, its `certificates` (the next handshake sees them; open
    /// connections keep theirs). Returns how many config tenants now serve.
    ///
    /// # Errors
    /// If the file is invalid, a tenant or certificate fails to load, or a name or route
    /// clashes with an API tenant; the running tenants and certificates then keep serving.
    pub async fn reload(
        &self,
        certificates: Option<&crate::tls::Certificates>,
    ) -> Result<usize, ChangeError> {
        let mut state = self.state.lock().await;
        let Some(path) = state.config_path.clone() else {
            return Err(ChangeError::Conflict(
                "the server runs the built-in demo config; start it with --config to reload".into(),
            ));
        };
        // The certificate given on the command line is not in the file: it stays.
        let kept: Vec<_> = state
            .config
            .certificates
            .iter()
            .filter(|c| c.from_command_line)
            .cloned()
            .collect();
        let (serves_tls, file) = (certificates.is_some(), path.clone());
        // The file and the certificates (read, parsed, keys checked) are read off the reactor.
        let (config, table) = tokio::task::spawn_blocking(move || {
            let mut config =
                Config::load(&file).map_err(|e| ChangeError::Invalid(e.to_string()))?;
            config.certificates.extend(kept);
            // Without [[certificate]]s the listener serves what the data directory holds.
            let table = serves_tls
                .then(|| crate::tls::Table::load(&config.certificates, &config.base_dir))
                .transpose()
                .map_err(|e| ChangeError::Unprocessable(e.to_string()))?;
            Ok::<_, ChangeError>((config, table))
        })
        .await
        .map_err(internal)??;
        one_owner(&config, &state.manifest, self.shared_url())?;
        let mut tenants = self.load_config_tenants(&config).await.map_err(|e| {
            // One line for the JSON error: "2 tenant(s) failed to load: a: ...; b: ...".
            let text = format!("{e:#}").replacen(":\n  ", ": ", 1);
            ChangeError::Unprocessable(text.replace("\n  ", "; "))
        })?;
        let n = tenants.len();
        for (name, t) in self.live.load().tenants.iter() {
            if matches!(t.origin, Origin::Api { .. }) {
                tenants.insert(name.clone(), t.clone());
            }
        }
        let candidates = self.live.load().candidates.clone();
        self.live
            .store(Arc::new(Live::build(tenants.into_values(), candidates)?));
        if let (Some(served), Some(table)) = (certificates, table) {
            served.replace(table);
        }
        state.config.tenants = config.tenants;
        state.config.certificates = config.certificates;
        state.config.base_dir = config.base_dir;
        self.follow_variables(&state, true);
        if config.kv != state.config.kv {
            tracing::warn!(
                "the config's [kv] stores changed: they take effect at the next restart"
            );
        }
        if config.tracing != state.config.tracing {
            tracing::warn!("the config's [tracing] changed: it takes effect at the next restart");
        }
        tracing::info!(
            config = %path.display(),
            tenants = n,
            "config reloaded (its tenants and certificates; [server], [pool], [kv] and [tracing] take effect at the next restart)"
        );
        Ok(n)
    }
}
