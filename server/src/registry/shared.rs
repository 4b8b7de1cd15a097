//! Keeping a replica in step with a fleet's shared registry: the first read at start-up (or
//! the data directory's snapshot when the registry cannot be reached), the watch that applies
//! what other replicas changed, and the report of what this replica serves.
//!
//! Applying a new revision is a change like a deploy: under the change lock, every tenant it
//! changed is loaded beside the running table (its artifact downloaded, not compiled, when
//! another replica published one), and one new table is swapped in; requests that started on
//! a version finish on it. A tenant whose new version cannot be loaded (an object missing or
//! refused by its digest) keeps serving its running version and is tried again later.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::state::{Live, Read, Registry, State};
use crate::change::ChangeError;
use crate::config::Config;
use crate::datadir::Manifest;
use crate::fleet::Fleet;
use crate::fleet::objects::RemoteError;
use crate::metrics::Metrics;
use crate::shutdown::Shutdown;
use crate::tenant::{Carried, Origin, TenantRef};

/// How soon tenants that failed to load from the registry are tried again.
pub(super) const RETRY_FAILED: Duration = Duration::from_secs(30);

/// How often a replica rewrites its report even when nothing changed (its heartbeat).
const REPORT_EVERY: Duration = Duration::from_secs(10);

/// A report older than this is shown as stale in the fleet view (the replica is gone or
/// cannot reach the registry).
const STALE_AFTER: Duration = Duration::from_secs(30);

/// The admin API's answer when the registry could not be used.
pub(super) fn unavailable(fleet: &Fleet, e: &RemoteError) -> ChangeError {
    match e {
        RemoteError::Unreachable(m) => ChangeError::Unavailable(format!(
            "the shared registry {} cannot be reached ({m}); nothing was changed: retry when \
             it is back (this replica keeps serving what it has)",
            fleet.url
        )),
        RemoteError::Conflict(m) => ChangeError::Conflict(m.clone()),
        RemoteError::Unknown(m) => ChangeError::Unavailable(format!(
            "the shared registry {} did not confirm this change and cannot be read back: it \
             may have been applied or not ({m}). Read the tenant again once the registry \
             answers (GET /admin/v1/tenants/NAME, `tern tenants NAME`); to retry, send the \
             change with If-Match: the ETag you read before it, which is refused (412) if the \
             change was applied",
            fleet.url
        )),
        RemoteError::Damaged(m) | RemoteError::NotFound(m) => {
            ChangeError::Internal(format!("the shared registry {}: {m}", fleet.url))
        }
    }
}

/// The manifest a replica starts serving, and the registry's as read: the registry's if it can
/// be read, else the data directory's snapshot of it (`snapshot`). Tenants the config file
/// declares are served from the file, not the registry.
pub(super) async fn first_read(
    fleet: &Fleet,
    snapshot: Manifest,
    config: &Config,
    metrics: &Metrics,
) -> (Manifest, Option<Read>) {
    // The records of the snapshot this replica served before a restart need not be fetched.
    fleet.remote.remember(&snapshot).await;
    let (mut serve, read) = match fleet.remote.manifest().await {
        Ok(Some((manifest, version))) => (
            manifest.clone(),
            Some(Read {
                manifest,
                version: Some(version),
            }),
        ),
        Ok(None) => (
            Manifest::default(),
            Some(Read {
                manifest: Manifest::default(),
                version: None,
            }),
        ),
        Err(e) => {
            metrics
                .registry_syncs
                .with_label_values(&[outcome(&e)])
                .inc();
            tracing::warn!(
                registry = %fleet.url,
                tenants = snapshot.tenants.len(),
                "cannot read the shared registry ({e}); serving the data directory's snapshot \
                 of it (revision {}) until it can be read",
                snapshot.revision
            );
            (snapshot, None)
        }
    };
    for t in &config.tenants {
        if serve.tenants.remove(t.name.get_ref()).is_some() {
            tracing::warn!(
                tenant = t.name.get_ref(),
                "the shared registry has a tenant the config file declares too: the file's \
                 serves here"
            );
        }
    }
    if let Some(r) = &read {
        metrics.registry_revision.set(r.manifest.revision as i64);
    }
    (serve, read)
}

fn outcome(e: &RemoteError) -> &'static str {
    match e {
        RemoteError::Unreachable(_) => "unreachable",
        _ => "failed",
    }
}

impl Registry {
    /// The change lock, with the shared registry read first (if there is one), so a change
    /// starts from its latest revision.
    ///
    /// # Errors
    /// `503` if the registry cannot be reached.
    pub(super) async fn lock(&self) -> Result<tokio::sync::MutexGuard<'_, State>, ChangeError> {
        let mut state = self.state.lock().await;
        self.sync(&mut state).await?;
        Ok(state)
    }

    /// Whether there is something consistent to serve (`/readyz`): with a shared registry,
    /// once it was read, or a non-empty snapshot of it was loaded.
    pub fn ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    /// The fleet's shared registry, if this server is a replica of one.
    pub fn fleet(&self) -> Option<&Arc<Fleet>> {
        self.fleet.as_ref()
    }

    /// The shared registry's URL, if this server is a replica of a fleet.
    pub fn shared_url(&self) -> Option<&str> {
        self.fleet.as_ref().map(|f| f.url.as_str())
    }

    /// Reads the shared registry (one conditional read) and applies a new revision. Tenants
    /// that failed to load are tried again once [`RETRY_FAILED`] has passed.
    ///
    /// # Errors
    /// `503` if it cannot be reached (what serves keeps serving), `500` if its manifest is
    /// not one.
    pub(super) async fn sync(&self, state: &mut State) -> Result<(), ChangeError> {
        let Some(fleet) = self.fleet.clone() else {
            return Ok(());
        };
        let metrics = &self.loader.metrics;
        let seen = state.shared.as_ref().and_then(|r| r.version.clone());
        let got = match &state.shared {
            None => fleet.remote.manifest().await,
            Some(_) => fleet.remote.manifest_if_changed(seen.as_ref()).await,
        };
        let read = match got {
            Err(e) => {
                metrics
                    .registry_syncs
                    .with_label_values(&[outcome(&e)])
                    .inc();
                return Err(unavailable(&fleet, &e));
            }
            Ok(Some((manifest, version))) => Read {
                manifest,
                version: Some(version),
            },
            Ok(None) if state.shared.is_none() => Read {
                manifest: Manifest::default(),
                version: None,
            },
            Ok(None) => {
                metrics
                    .registry_syncs
                    .with_label_values(&["unchanged"])
                    .inc();
                if state.retry_at.is_some_and(|at| at <= Instant::now()) {
                    let truth = state.truth().clone();
                    self.apply(state, &truth).await;
                }
                return Ok(());
            }
        };
        metrics.registry_syncs.with_label_values(&["changed"]).inc();
        self.apply(state, &read.manifest).await;
        metrics.registry_revision.set(read.manifest.revision as i64);
        state.shared = Some(read);
        self.ready.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Serves the registry's `target` manifest: loads the tenants it changed, swaps one new
    /// table in, and saves what now serves as the data directory's snapshot.
    async fn apply(&self, state: &mut State, target: &Manifest) {
        let served = state.manifest.clone();
        let live = self.live.load_full();
        let owned_by_file: HashSet<&str> = state
            .config
            .tenants
            .iter()
            .map(|t| t.name.get_ref().as_str())
            .collect();
        let mut next = served.clone();
        next.revision = target.revision;
        // Tokens are used as the registry holds them, whatever else fails to apply.
        if next.tokens != target.tokens {
            next.tokens = target.tokens.clone();
            self.tokens.store(Arc::new(target.tokens.clone()));
        }
        next.tenants.retain(|n, _| target.tenants.contains_key(n));
        let mut tenants: BTreeMap<String, TenantRef> = live
            .tenants
            .iter()
            .filter(|(n, t)| {
                !matches!(t.origin, Origin::Api { .. }) || target.tenants.contains_key(*n)
            })
            .map(|(n, t)| (n.clone(), t.clone()))
            .collect();
        let mut to_load: Vec<super::reload::Stored> = Vec::new();
        let rt = self.loader.runtime();
        for (name, t) in &target.tenants {
            if owned_by_file.contains(name.as_str()) || served.tenants.get(name) == Some(t) {
                continue;
            }
            // The tenant that serves here, if the record is still its own (not one deleted and
            // created again under its name: that one starts anew, its data its own).
            let same = served.tenants.get(name).is_some_and(|s| s.id == t.id);
            if !same {
                // The one deleted serves no more, even if the new one fails to load here.
                tenants.remove(name);
            }
            let running =
                (live.tenants.get(name)).filter(|r| same && matches!(r.origin, Origin::Api { .. }));
            let running_version = running.and_then(|r| match &r.origin {
                Origin::Api { version } => Some(version),
                Origin::Config => None,
            });
            match (&t.current, running) {
                (None, _) => {
                    // Created, no module yet: not routed.
                    tenants.remove(name);
                    next.set(name, Some(t.clone()));
                }
                (Some(v), Some(_))
                    if running_version == Some(v)
                        && served.tenants.get(name).is_some_and(|s| s.spec == t.spec) =>
                {
                    // Only its variables changed: they follow the record, nothing is loaded.
                    next.set(name, Some(t.clone()));
                }
                (Some(v), Some(r)) if running_version == Some(v) => {
                    // Only the spec changed: the running module with the new spec.
                    let config = t.to_config(name, "(admin API)");
                    match self.loader.respec(&rt, r, &r.compiled, &config) {
                        Ok(new) => {
                            tenants.insert(name.clone(), Arc::new(new));
                            next.set(name, Some(t.clone()));
                        }
                        Err(e) => self.failed_to_apply(name, &e.to_string()),
                    }
                }
                (Some(v), _)
                    if same
                        && live
                            .candidates
                            .get(name)
                            .is_some_and(|c| *c.tenant.version_label == *v.id)
                        && served.tenants.get(name).is_some_and(|s| s.spec == t.spec) =>
                {
                    // Its candidate was promoted: it serves as it is, its cache and all.
                    tenants.insert(name.clone(), live.candidates[name].tenant.clone());
                    next.set(name, Some(t.clone()));
                }
                (Some(v), _) => {
                    let carried = if same {
                        live.carried(name)
                    } else {
                        Carried::default()
                    };
                    to_load.push((name.clone(), t.clone(), v.clone(), carried));
                }
            }
        }
        let mut failed = false;
        for (name, loaded) in self.load_stored(to_load).await {
            match loaded {
                Ok(t) => {
                    tenants.insert(name.clone(), Arc::new(t));
                    next.set(&name, target.tenants.get(&name).cloned());
                }
                Err(e) => {
                    failed = true;
                    self.failed_to_apply(&name, &e.to_string());
                }
            }
        }
        // Candidates beside the versions that now serve. One that cannot be loaded here is
        // tried again as a tenant is (its record is the registry's: no later change may come
        // to make this replica try again).
        let (candidates, unloaded) = self
            .load_candidates(Self::wanted(&next, &tenants), &live)
            .await;
        for name in &unloaded {
            failed = true;
            self.failed_to_apply(name, "its candidate cannot be loaded (logged above)");
        }
        // Routes another replica's config file does not have can clash with this one's: the
        // registry's tenant is left out here.
        let table = loop {
            match Live::build(tenants.values().cloned(), candidates.clone()) {
                Ok(table) => break table,
                Err(clash) => {
                    let api = [&clash.other, &clash.existing].into_iter().find(|n| {
                        tenants
                            .get(*n)
                            .is_some_and(|t| matches!(t.origin, Origin::Api { .. }))
                    });
                    let Some(name) = api.cloned() else {
                        tracing::error!("cannot apply the registry's revision: {clash}");
                        return;
                    };
                    failed = true;
                    self.failed_to_apply(&name, &clash.to_string());
                    tenants.remove(&name);
                    next.tenants.remove(&name);
                }
            }
        };
        state.retry_at = failed.then(|| Instant::now() + RETRY_FAILED);
        if let Err(e) = self.save_manifest(&next).await {
            tracing::error!("cannot save the registry's snapshot in the data directory: {e}");
        }
        let dropped: Vec<String> = served
            .referenced()
            .difference(&next.referenced())
            .cloned()
            .collect();
        let changed = next.tenants.len() != served.tenants.len()
            || next
                .tenants
                .iter()
                .any(|(n, t)| served.tenants.get(n) != Some(t));
        state.manifest = next;
        self.follow_variables(state, false);
        self.live.store(Arc::new(table));
        self.forget(state, dropped).await;
        self.changed();
        if changed {
            tracing::info!(
                revision = target.revision,
                tenants = state.manifest.tenants.len(),
                "applied the shared registry's revision"
            );
        }
    }

    fn failed_to_apply(&self, name: &str, error: &str) {
        self.loader
            .metrics
            .registry_syncs
            .with_label_values(&["failed"])
            .inc();
        tracing::error!(
            tenant = name,
            "the shared registry's version of this tenant cannot be served here (its running \
             version, if any, keeps serving; tried again in {}s): {error}",
            RETRY_FAILED.as_secs()
        );
    }

    /// After start-up: with a shared registry, the snapshot names only what serves (tenants
    /// that failed to load are tried again later, as are candidates when `unloaded_candidates`)
    /// and is saved.
    pub(super) async fn served_after_start(
        &self,
        state: &mut State,
        api: &BTreeMap<String, TenantRef>,
        unloaded_candidates: bool,
    ) {
        if self.fleet.is_none() {
            return;
        }
        let mut served = state.manifest.clone();
        let before = served.tenants.len();
        served
            .tenants
            .retain(|n, t| t.current.is_none() || api.contains_key(n));
        if served.tenants.len() != before || unloaded_candidates {
            state.retry_at = Some(Instant::now() + RETRY_FAILED);
        }
        if let Some(read) = &state.shared {
            served.revision = read.manifest.revision;
        }
        if let Err(e) = self.save_manifest(&served).await {
            tracing::error!("cannot save the registry's snapshot in the data directory: {e}");
        }
        state.manifest = served;
        self.follow_variables(state, false);
        self.changed();
    }

    /// Marks this replica's report as due (what it serves changed).
    pub(super) fn changed(&self) {
        self.report_due.store(true, Ordering::Relaxed);
    }

    /// Keeps this replica in step with the shared registry until `shutdown`: reads it every
    /// `[registry] poll_interval_ms`, applies what changed, and writes this replica's report.
    /// Returns at once on a single server.
    pub async fn watch_shared(&self, shutdown: Shutdown) {
        let Some(fleet) = self.fleet.clone() else {
            return;
        };
        let mut reachable = true;
        let mut reported_at: Option<Instant> = None;
        let mut peers_read: Option<Instant> = None;
        loop {
            let result = {
                let mut state = self.state.lock().await;
                self.sync(&mut state).await
            };
            if result.is_ok() {
                self.apply_purges(&fleet).await;
            }
            match result {
                Ok(()) if !reachable => {
                    reachable = true;
                    tracing::info!(registry = %fleet.url, "the shared registry can be read again");
                }
                Err(e) if reachable => {
                    reachable = false;
                    tracing::warn!("{e}");
                }
                _ => {}
            }
            let due = self.report_due.load(Ordering::Relaxed)
                || reported_at.is_none_or(|at| at.elapsed() >= REPORT_EVERY);
            if reachable && due {
                self.report_due.store(false, Ordering::Relaxed);
                match self.report(&fleet).await {
                    Ok(()) => {
                        let first = reported_at.is_none();
                        reported_at = Some(Instant::now());
                        // Who to nudge after a change made here: read from the reports every
                        // REPORT_EVERY (stale ones leave), learnt at once from a joining
                        // replica's nudge.
                        let read_due = peers_read.is_none_or(|at| at.elapsed() >= REPORT_EVERY);
                        if read_due && let Ok(reports) = live_reports(&fleet).await {
                            peers_read = Some(Instant::now());
                            fleet.set_peers(
                                reports
                                    .iter()
                                    .filter_map(|r| r["admin"].as_str().map(String::from))
                                    .collect(),
                                &self.loader.metrics,
                            );
                        }
                        if first {
                            // The others learn of this replica (and nudge it too) now rather
                            // than at their next report.
                            fleet.nudge_peers(&self.loader.metrics);
                        }
                    }
                    Err(e) => {
                        self.report_due.store(true, Ordering::Relaxed);
                        tracing::debug!("cannot write this replica's report: {e}");
                    }
                }
            }
            tokio::select! {
                more = shutdown.sleep(fleet.poll) => if !more { break },
                () = fleet.wake.notified() => {}
            }
        }
        // A replica that stops leaves the fleet view.
        let _ = fleet
            .remote
            .delete_object(&report_object(&fleet.replica))
            .await;
    }

    /// A nudge from another replica (`from`: its admin URL): read the registry now, and nudge
    /// that replica too from now on.
    ///
    /// # Errors
    /// `404` if this server is not part of a fleet.
    pub fn nudged(&self, from: Option<&str>) -> Result<(), ChangeError> {
        let Some(fleet) = &self.fleet else {
            return Err(ChangeError::NotFound(
                "this server has no shared registry ([registry] url): it is not part of a fleet"
                    .into(),
            ));
        };
        self.loader
            .metrics
            .registry_nudges
            .with_label_values(&["received"])
            .inc();
        if let Some(url) = from {
            fleet.add_peer(url, &self.loader.metrics);
        }
        fleet.wake.notify_one();
        Ok(())
    }

    /// Writes what this replica serves to `replicas/<name>.json`.
    async fn report(&self, fleet: &Fleet) -> Result<(), RemoteError> {
        let report = {
            let state = self.state.lock().await;
            let live = self.live.load();
            let names = || (state.truth().tenants.keys()).chain(state.manifest.tenants.keys());
            let serving: BTreeMap<&String, Option<&str>> = names()
                .map(|n| {
                    let v = live.tenants.get(n).and_then(|t| match &t.origin {
                        Origin::Api { version } => Some(version.id.as_str()),
                        Origin::Config => None,
                    });
                    (n, v)
                })
                .collect();
            // Whose tenant each is (a replica serving a deleted tenant's version under a name
            // made again does not serve the new one's, whatever its version).
            let keys: BTreeMap<&String, &str> = names()
                .filter_map(|n| live.tenants.get(n).map(|t| (n, &*t.data)))
                .collect();
            json!({
                "replica": fleet.replica,
                "admin": fleet.advertise.get(),
                "revision": state.manifest.revision,
                "updated_at": crate::datadir::now(),
                "tenants": serving,
                "keys": keys,
                "tokens_used": self.token_used(),
            })
        };
        let text = serde_json::to_vec_pretty(&report).unwrap_or_default();
        fleet
            .remote
            .put_object(&report_object(&fleet.replica), text.into(), false)
            .await
    }

    /// Which version of each tenant every replica serves (`GET /admin/v1/fleet`), read from
    /// the replicas' reports in the shared registry.
    ///
    /// # Errors
    /// `404` on a single server, `503` if the registry cannot be reached.
    pub async fn fleet_view(&self) -> Result<Value, ChangeError> {
        let Some(fleet) = self.fleet.clone() else {
            return Err(ChangeError::NotFound(
                "this server has no shared registry ([registry] url): it is not part of a fleet"
                    .into(),
            ));
        };
        let truth = self.lock().await?.truth().clone();
        let replicas = reports(&fleet).await.map_err(|e| unavailable(&fleet, &e))?;
        let live: Vec<&Value> = replicas
            .iter()
            .filter(|r| r["stale"] == json!(false))
            .collect();
        let mut tenants = serde_json::Map::new();
        for (name, t) in &truth.tenants {
            let want = t.current.as_ref().map(|v| v.id.clone());
            let key = t.data_key(name);
            // (A report naming no key comes from a replica of a version before keys.)
            let serving = live
                .iter()
                .filter(|r| {
                    r["tenants"][name].as_str().map(String::from) == want
                        && r["keys"][name].as_str().is_none_or(|k| *k == *key)
                })
                .count();
            tenants.insert(
                name.clone(),
                json!({
                    "version": want,
                    "replicas": live.len(),
                    "serving": serving,
                    "converged": serving == live.len(),
                }),
            );
        }
        Ok(json!({
            "registry": fleet.url,
            "revision": truth.revision,
            "replicas": replicas,
            "tenants": tenants,
        }))
    }
}

fn report_object(replica: &str) -> String {
    format!("replicas/{replica}.json")
}

/// Every replica's report, each with `stale` (not rewritten for [`STALE_AFTER`]).
pub(super) async fn reports(fleet: &Fleet) -> Result<Vec<Value>, RemoteError> {
    let names = fleet.remote.list("replicas").await?;
    let mut replicas = Vec::new();
    let now = crate::datadir::now();
    for name in names {
        let Ok(Some(bytes)) = fleet.remote.get_object(&name).await else {
            continue;
        };
        let Ok(mut report) = serde_json::from_slice::<Value>(&bytes) else {
            continue;
        };
        let updated = report["updated_at"].as_u64().unwrap_or(0);
        report["stale"] = json!(now.saturating_sub(updated) > STALE_AFTER.as_secs());
        replicas.push(report);
    }
    Ok(replicas)
}

/// The reports of the replicas that are not stale.
async fn live_reports(fleet: &Fleet) -> Result<Vec<Value>, RemoteError> {
    let mut all = reports(fleet).await?;
    all.retain(|r| r["stale"] == json!(false));
    Ok(all)
}
