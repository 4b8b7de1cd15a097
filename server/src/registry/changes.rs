//! The admin API's changes: a tenant's settings, assets, a deploy, a rollback, a delete; each
//! checked, then written and published by `Registry::commit`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use sha2::{Digest, Sha256};
use wasmtime::Engine;

use crate::artifact;
use crate::assets::Assets;
use crate::config::{self};
use crate::datadir::{self, StoredTenant, Version};
use crate::fleet::objects::RemoteError;
use crate::tenant::{self, Carried, Origin, Tenant, TenantError};

use super::error::internal;
use super::loader::ModuleCache;
use super::precondition::Precondition;
use super::shared;
use super::spec::SpecChange;
use super::state::{Change, Deployed, Registry, State, check_cache_budget, check_routes};
use super::upload::check_wasm_header;
use crate::change::ChangeError;

impl Registry {
    /// Creates a tenant or changes its routes, env and limits (`PUT` or `PATCH
    /// /admin/v1/tenants/{name}`: [`SpecChange`]).
    ///
    /// # Errors
    /// `400` for invalid values, `404` for a `PATCH` of no tenant, `409` for a route clash, a
    /// config-owned tenant or a `PUT` that leaves out a field the tenant has set, `412` if the
    /// tenant is not in the state `pre` requires. Returns whether it was created, and its
    /// entity tag.
    pub async fn put_spec(
        &self,
        name: &str,
        change: SpecChange,
        pre: &Precondition,
        who: crate::access::Principal<'_>,
    ) -> Result<(bool, String), ChangeError> {
        let mut state = self.lock().await?;
        Self::check_api_owned(&state, name)?;
        // Under the lock: two changes at once each apply to the other's result.
        let base = state.truth().tenants.get(name).cloned();
        pre.check(name, base.as_ref())?;
        let current = base.as_ref().map(|t| &t.spec);
        let spec = change.apply(name, current)?;
        let mut entry = (base.clone()).unwrap_or_else(|| StoredTenant::created(spec.clone()));
        entry.spec = spec.clone();
        let as_config = entry.to_config(name, "(admin API)");
        let rt = self.loader.runtime();
        config::validate_tenant(&as_config, &rt.pool)
            .map_err(|e| ChangeError::Invalid(e.message))?;
        if spec.https_redirect && state.config.server.tls_listen.is_none() {
            return Err(ChangeError::Invalid(
                "https_redirect needs the TLS listener: this server has no server.tls_listen"
                    .into(),
            ));
        }
        let created = base.is_none();
        let live = self.live.load_full();
        // A tenant that serves is rebuilt with the new spec around the module it runs.
        let respecced = match live.tenants.get(name) {
            Some(old) => Some(Arc::new(self.loader.respec(
                &rt,
                old,
                &old.compiled,
                &as_config,
            )?)),
            None => None,
        };
        // So is its candidate, sharing what it shares with the new current one.
        let stored_candidate = base.as_ref().and_then(|b| b.candidate.as_ref());
        let candidate = match (&respecced, live.candidates.get(name), stored_candidate) {
            (Some(current), Some(c), Some(stored)) => {
                let carried = Carried::for_candidate(current);
                let t = (self.loader).respec_carrying(
                    &rt,
                    &c.tenant,
                    &c.tenant.compiled,
                    &as_config,
                    carried,
                )?;
                Some(super::rollout::serve(Arc::new(t), stored, c.judge.clone())?)
            }
            _ => None,
        };
        check_routes(&live, state.truth(), name, &spec, who)?;
        check_cache_budget(&state, name, &spec)?;
        let etag = entry.etag();
        let change = Change::Tenant {
            name: name.to_string(),
            base,
            entry: Some(entry),
            // A tenant with no module yet is not routed: only the manifest changes.
            serve: respecced.map(|t| Some((t, candidate))),
        };
        self.commit_as(&mut state, change, who).await?;
        tracing::info!(tenant = name, created, "tenant spec saved");
        Ok((created, etag))
    }

    /// Stores an assets archive after checking it (`POST /admin/v1/assets`); returns its hash
    /// and what it holds.
    ///
    /// # Errors
    /// `422` if it is not a tar archive of plain files and directories.
    pub async fn put_assets(&self, archive: Bytes) -> Result<(String, Arc<Assets>), ChangeError> {
        let (store, max) = (self.loader.store.clone(), self.loader.max_upload);
        let bytes = archive.clone();
        let (hash, assets) = tokio::task::spawn_blocking(move || {
            let assets = Assets::from_tar(&bytes, max)
                .map_err(|e| ChangeError::Unprocessable(e.to_string()))?;
            let hash = store.put_blob(&bytes)?;
            Ok::<_, ChangeError>((hash, Arc::new(assets)))
        })
        .await
        .map_err(internal)??;
        // With a shared registry, a deploy on any replica can name it.
        if let Some(f) = &self.fleet {
            f.remote
                .put_blob(archive)
                .await
                .map_err(|e| shared::unavailable(f, &e))?;
        }
        Ok((hash, assets))
    }

    /// Deploys a module (with optionally a stored assets archive) as the tenant's new version
    /// (`PUT /admin/v1/tenants/{name}/module`), or with `rollout` as its candidate, serving
    /// the rollout's share beside the current version.
    ///
    /// # Errors
    /// `404` unknown tenant or assets, `409` config-owned, a candidate without a current
    /// version or a new current version while a candidate is in rollout, `400` not a valid
    /// module, `422` a module Tern cannot run, `412` if the tenant is not in the state `pre`
    /// requires (when the deploy starts, and again when it is committed); the running version
    /// keeps serving on any error.
    pub async fn deploy(
        &self,
        name: &str,
        wasm: Bytes,
        (assets, kind): (Option<String>, Option<crate::config::GuestKind>),
        rollout: Option<crate::rollout::Plan>,
        pre: &Precondition,
    ) -> Result<Deployed, ChangeError> {
        // Counted and logged however it ends.
        let result = async {
            check_wasm_header(&wasm)?;
            if let (Some(a), Some(f)) = (&assets, &self.fleet)
                && datadir::is_hash(a)
            {
                // Uploaded on another replica: in the registry.
                match f.fetch_blob(&self.loader.store, a).await {
                    Ok(()) | Err(RemoteError::NotFound(_)) => {}
                    Err(e) => return Err(shared::unavailable(f, &e)),
                }
            }
            if let Some(a) = &assets
                && !self.loader.store.has_blob(a)
            {
                return Err(ChangeError::NotFound(format!(
                    "no assets archive {a:?} is stored; upload it with POST /admin/v1/assets first"
                )));
            }
            let base = {
                let state = self.lock().await?;
                Self::check_api_owned(&state, name)?;
                let stored = state.truth().tenants.get(name);
                pre.check(name, stored)?;
                if let Some(t) = stored {
                    check_rollout(name, t, rollout.is_some())?;
                }
                stored.cloned()
            }
            .ok_or_else(|| {
                ChangeError::NotFound(format!(
                    "no tenant {name:?}; create it first with PUT /admin/v1/tenants/{name}"
                ))
            })?;

            // Check, compile and prepare off the reactor, outside the change lock; the upload is
            // stored only once it is known to load, and held until it is committed or forgotten.
            let this = self.loader();
            let (n, live, base2) = (name.to_string(), self.live.load_full(), base.clone());
            let as_candidate = rollout.is_some();
            let (module_hash, prepared) = tokio::task::spawn_blocking(move || {
                let base = base2;
                let started = Instant::now();
                let module_hash = crate::hex::encode(&Sha256::digest(&wasm));
                let rt = this.runtime();
                let prepared = (|| {
                    let limits = tenant::Limits::from_config(&base.spec.limits, &rt.pool);
                    if !artifact::is_component(&wasm) {
                        tenant::check_fits(&wasm, &limits).map_err(|reason| {
                            TenantError::DoesNotFit {
                                tenant: n.clone(),
                                reason,
                            }
                        })?;
                    }
                    let loaded = artifact::load_wasm(
                        &rt.engine,
                        &wasm,
                        "the uploaded module",
                        &this.store.artifacts(),
                    )
                    .map_err(|source| TenantError::Artifact {
                        tenant: n.clone(),
                        source,
                    })?;
                    let compiled = loaded.compiled_in.unwrap_or(Duration::ZERO);
                    if loaded.compiled_in.is_some() {
                        this.metrics.compile.observe(compiled.as_secs_f64());
                    }
                    let version = Version {
                        id: Version::id_of(&module_hash, assets.as_deref()),
                        module: module_hash.clone(),
                        module_bytes: wasm.len() as u64,
                        assets: assets.clone(),
                        deployed_at: datadir::now(),
                        compile_ms: compiled.as_secs_f64() * 1e3,
                        kind,
                    };
                    // A candidate shares its current version's cache (and what every new
                    // version keeps).
                    let carried = match live.tenants.get(&n) {
                        Some(current) if as_candidate => Carried::for_candidate(current),
                        _ => live.carried(&n),
                    };
                    let t =
                        this.prepare_version(&rt, &n, &base, &version, &loaded.module, carried)?;
                    let held = this.hold(&module_hash);
                    this.store.put_blob(&wasm)?;
                    tracing::debug!(tenant = %n, "deploy prepared in {:?}", started.elapsed());
                    Ok::<_, ChangeError>((t, held))
                })();
                (module_hash, prepared)
            })
            .await
            .map_err(internal)?;

            // With a shared registry, the module and its artifact are there before the manifest
            // that names them.
            let prepared = match (prepared, &self.fleet) {
                (Ok(p), Some(f)) => {
                    let engine = p.0.compiled.engine().clone();
                    f.publish(
                        &self.loader.store,
                        &engine,
                        &module_hash,
                        &self.loader.metrics,
                    )
                    .await
                    .map(|()| p)
                    .map_err(|e| shared::unavailable(f, &e))
                }
                (p, _) => p,
            };
            let locked = match prepared {
                Ok(p) => self.lock().await.map(|s| (s, p)),
                Err(e) => Err(e),
            };
            let (state, committed) = match locked {
                Ok((mut state, (tenant, held))) => {
                    let result = self
                        .commit_deploy(&mut state, name, (&base, tenant), rollout, pre)
                        .await;
                    drop(held);
                    (state, result)
                }
                Err(e) => (self.state.lock().await, Err(e)),
            };
            if committed.is_err() {
                // Nothing refused is kept: the upload and an artifact compiled for it.
                self.forget(&state, vec![module_hash]).await;
            }
            committed
        }
        .await;
        self.count_deploy(name, result.is_ok());
        if let Err(e) = &result {
            tracing::warn!(tenant = name, "deploy refused: {e}");
        }
        result
    }

    /// Makes a prepared deploy the tenant's current version, or its candidate under `rollout`.
    async fn commit_deploy(
        &self,
        state: &mut State,
        name: &str,
        (base, tenant): (&StoredTenant, Tenant),
        rollout: Option<crate::rollout::Plan>,
        pre: &Precondition,
    ) -> Result<Deployed, ChangeError> {
        let Some(stored) = state.truth().tenants.get(name).cloned() else {
            return Err(ChangeError::NotFound(format!(
                "tenant {name:?} was deleted during the deploy"
            )));
        };
        if stored.id != base.id {
            // Not the tenant it was prepared for (it carries that one's counts and logs).
            return Err(ChangeError::Conflict(format!(
                "tenant {name:?} was deleted and created again during the deploy: deploy again"
            )));
        }
        // Another change while this one compiled: a conditional deploy was computed from the
        // state it names, and that state is gone.
        pre.check(name, Some(&stored))?;
        check_rollout(name, &stored, rollout.is_some())?;
        // Its first stage (and its judge) count from now, when it begins to serve.
        let rollout = rollout.map(|mut plan| {
            plan.starts(crate::rollout::now_ms());
            plan
        });
        let rt = self.loader.runtime();
        let current_now = self.live.load().tenants.get(name).cloned();
        // What it is prepared again with: a candidate shares with its current version.
        let carried_again = |t: &Tenant| match (&rollout, &current_now) {
            (Some(_), Some(current)) => Carried::for_candidate(current),
            _ => Carried::from(t),
        };
        let tenant = if !Engine::same(tenant.compiled.engine(), &rt.engine) {
            // The engine was replaced while this compiled (`use_memset_reset`): the stored
            // version is loaded on the new one, with the latest spec.
            let (this, n, latest) = (self.loader(), name.to_string(), stored.clone());
            let Origin::Api { version } = tenant.origin.clone() else {
                unreachable!("loaded as an API tenant")
            };
            let carried = carried_again(&tenant);
            tokio::task::spawn_blocking(move || {
                this.load_version(&n, &latest, &version, carried, &ModuleCache::default())
            })
            .await
            .map_err(internal)??
        } else if stored.spec != base.spec {
            // The routes changed while this compiled: rebuild around the latest spec.
            let config = stored.to_config(name, "(admin API)");
            let carried = carried_again(&tenant);
            self.loader
                .respec_carrying(&rt, &tenant, &tenant.compiled, &config, carried)?
        } else {
            tenant
        };
        let Origin::Api { version } = tenant.origin.clone() else {
            unreachable!("loaded as an API tenant")
        };
        let warnings: Vec<String> = tenant.warning.iter().cloned().collect();
        let kind = tenant.kind();
        let mut entry = stored.clone();
        let (serve, previous) = match rollout.clone() {
            Some(plan) => {
                let (Some(current), Some(at)) = (current_now, &entry.current) else {
                    return Err(no_current(name));
                };
                if at.id == version.id {
                    return Err(ChangeError::Conflict(format!(
                        "version {} already serves tenant {name:?}: a candidate is another \
                         version",
                        &version.id[..12]
                    )));
                }
                let stored_candidate = datadir::Candidate {
                    version: version.clone(),
                    plan,
                };
                let candidate =
                    super::rollout::serve(Arc::new(tenant), &stored_candidate, Arc::default())?;
                entry.candidate = Some(stored_candidate);
                ((current, Some(candidate)), entry.current.clone())
            }
            None => {
                // Deploying the version that serves again keeps the one before it for rollback.
                match entry.current.take() {
                    Some(replaced) if replaced.id == version.id => {}
                    replaced => entry.previous = replaced,
                }
                entry.current = Some(version.clone());
                ((Arc::new(tenant), None), entry.previous.clone())
            }
        };
        let etag = entry.etag();
        let change = Change::Tenant {
            name: name.to_string(),
            base: Some(stored),
            entry: Some(entry),
            serve: Some(Some(serve)),
        };
        self.commit(state, change).await?;
        tracing::info!(
            tenant = name,
            version = %version.id,
            bytes = version.module_bytes,
            compile_ms = version.compile_ms,
            candidate = rollout.as_ref().map(|p| p.percent()),
            "deployed"
        );
        Ok(Deployed {
            version,
            previous,
            warnings,
            kind,
            etag,
            rollout,
            dropped: None,
        })
    }

    /// Makes the previous version current again (and the current one previous, so a second
    /// rollback undoes the first).
    ///
    /// # Errors
    /// `404` unknown tenant, `409` nothing to roll back to or config-owned, `412` if the
    /// tenant is not in the state `pre` requires.
    pub async fn rollback(&self, name: &str, pre: &Precondition) -> Result<Deployed, ChangeError> {
        let mut state = self.lock().await?;
        Self::check_api_owned(&state, name)?;
        let stored = state.truth().tenants.get(name).cloned();
        pre.check(name, stored.as_ref())?;
        let stored = stored.ok_or_else(|| ChangeError::NotFound(format!("no tenant {name:?}")))?;
        if stored.candidate.is_some() {
            // A rollout is rolled back first: its candidate goes, the current version stays.
            let current = stored.current.clone().ok_or_else(|| no_current(name))?;
            let kind = self.live.load().tenants.get(name).map(|t| t.kind());
            let dropped = stored.candidate.as_ref().map(|c| c.version.clone());
            let changed = self.drop_candidate(&mut state, name, stored).await?;
            return Ok(Deployed {
                previous: changed.entry.previous.clone(),
                version: current,
                warnings: Vec::new(),
                kind: kind.unwrap_or(crate::config::GuestKind::Tern),
                etag: changed.etag,
                rollout: None,
                dropped,
            });
        }
        let Some(target) = stored.previous.clone() else {
            return Err(ChangeError::Conflict(format!(
                "tenant {name:?} has no previous version to roll back to"
            )));
        };
        let carried = self.live.load().carried(name);
        let item = (name.to_string(), stored.clone(), target.clone(), carried);
        let loaded = self
            .load_stored(vec![item])
            .await
            .pop()
            .map_or_else(|| Err(internal("the version was not loaded")), |(_, r)| r);
        let tenant = loaded?;
        let kind = tenant.kind();
        let mut entry = stored.clone();
        entry.previous = entry.current.take();
        entry.current = Some(target.clone());
        let etag = entry.etag();
        let change = Change::Tenant {
            name: name.to_string(),
            base: Some(stored.clone()),
            entry: Some(entry),
            serve: Some(Some((Arc::new(tenant), None))),
        };
        self.commit(&mut state, change).await?;
        tracing::info!(tenant = name, version = %target.id, "rolled back");
        Ok(Deployed {
            version: target,
            previous: stored.current,
            warnings: Vec::new(),
            kind,
            etag,
            rollout: None,
            dropped: None,
        })
    }

    /// Removes an API tenant: it stops being routed at once; requests running finish. Its
    /// key-value data is removed before the answer ([`Self::forget_data`]). Its key
    /// ([`crate::datadir::StoredTenant::data_key`]), for what else goes with it.
    ///
    /// # Errors
    /// `404` unknown tenant, `409` config-owned, `412` if the tenant is not in the state `pre`
    /// requires.
    pub async fn delete(
        &self,
        name: &str,
        pre: &Precondition,
    ) -> Result<std::sync::Arc<str>, ChangeError> {
        let mut state = self.lock().await?;
        Self::check_api_owned(&state, name)?;
        pre.check(name, state.truth().tenants.get(name))?;
        let Some(base) = state.truth().tenants.get(name).cloned() else {
            return Err(ChangeError::NotFound(format!("no tenant {name:?}")));
        };
        let change = Change::Tenant {
            name: name.to_string(),
            base: Some(base.clone()),
            entry: None,
            serve: Some(None),
        };
        self.commit(&mut state, change).await?;
        drop(state);
        tracing::info!(tenant = name, "deleted");
        // Its keys go before the answer (the tenant is gone already; other changes go on).
        self.forget_data(name, &base).await;
        Ok(base.data_key(name))
    }
}

/// Whether tenant `name` (as `stored`) may take a deploy, as a candidate or not: a candidate
/// needs a current version to serve beside; a new current version waits for the candidate in
/// rollout to be promoted or rolled back (or is deployed as the new candidate).
fn check_rollout(name: &str, stored: &StoredTenant, as_candidate: bool) -> Result<(), ChangeError> {
    match (&stored.candidate, as_candidate) {
        (_, true) if stored.current.is_none() => Err(no_current(name)),
        (Some(c), false) => Err(ChangeError::Conflict(format!(
            "tenant {name:?} has a candidate in rollout ({} at {}): promote it (tern promote \
             {name}), roll it back (tern rollback {name}), or deploy this version as the new \
             candidate (--percent)",
            &c.version.id[..12.min(c.version.id.len())],
            c.plan.percent()
        ))),
        _ => Ok(()),
    }
}

/// The refusal of a candidate for a tenant with no version serving.
fn no_current(name: &str) -> ChangeError {
    ChangeError::Conflict(format!(
        "tenant {name:?} has no version serving for a candidate to share its traffic with: \
         deploy without --percent first"
    ))
}
