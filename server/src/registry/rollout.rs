//! A tenant's candidate in the registry: loaded beside its current version, its share moved,
//! promoted, dropped, and tended (stages advanced by time, the abort rule applied) once for a
//! fleet: each automatic step is a change of the tenant computed from its record as read, so
//! when several replicas take the same step, the registry's compare-and-swap applies one and
//! refuses the others (`409`, left alone: they read the result).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::serving::Candidate;
use crate::change::ChangeError;
use crate::datadir::{self, StoredTenant};
use crate::rollout::{Aborted, Advanced, Judge, Plan, now_ms};
use crate::tenant::{Carried, Tenant, TenantRef};

use super::precondition::Precondition;
use super::state::{Change, Live, Registry, State};

/// A candidate to serve: its tenant, the stored candidate, the current version it serves
/// beside.
pub(super) type Wanted = (String, StoredTenant, datadir::Candidate, TenantRef);

/// What a change of a rollout did, for the admin API's answer.
#[derive(Debug, Clone)]
pub struct RolloutChanged {
    /// The tenant's record after it.
    pub entry: StoredTenant,
    /// Its entity tag.
    pub etag: String,
}

/// The serving candidate of `tenant` (prepared as `version` of it) under `stored`'s plan.
///
/// # Errors
/// `400`: the plan's `override_from` is not a list of networks.
pub(super) fn serve(
    tenant: TenantRef,
    stored: &datadir::Candidate,
    judge: Arc<Judge>,
) -> Result<Arc<Candidate>, ChangeError> {
    let split = crate::rollout::Split::new(&tenant.name, &stored.version.id, &stored.plan)
        .map_err(ChangeError::Invalid)?;
    Ok(Arc::new(Candidate {
        tenant,
        split,
        plan: stored.plan.clone(),
        judge,
    }))
}

/// The judge a candidate keeps: its old one while it stays the same version judged since the
/// same time (a share given again after an abort starts counting anew, on every replica).
fn judge_of(old: Option<&Arc<Candidate>>, stored: &datadir::Candidate) -> Arc<Judge> {
    match old {
        Some(o)
            if *o.tenant.version_label == *stored.version.id
                && o.plan.judged_since_ms == stored.plan.judged_since_ms =>
        {
            o.judge.clone()
        }
        _ => Arc::default(),
    }
}

impl Registry {
    /// Serves the candidates `wanted`: one serving in `old` beside the same current version
    /// keeps its prepared tenant (a new split and plan), the others are loaded. One that cannot
    /// be loaded is left out (logged, and named in the second part): its current version
    /// serves all its clients until it is loaded (in a fleet, tried again as a tenant that
    /// failed to load is).
    pub(super) async fn load_candidates(
        &self,
        wanted: Vec<Wanted>,
        old: &Live,
    ) -> (BTreeMap<String, Arc<Candidate>>, Vec<String>) {
        let mut out = BTreeMap::new();
        let mut failed = Vec::new();
        let mut to_load = Vec::new();
        let mut pending = BTreeMap::new();
        for (name, spec, stored, current) in wanted {
            let was = old.candidates.get(&name);
            let judge = judge_of(was, &stored);
            let same_current = old
                .tenants
                .get(&name)
                .is_some_and(|t| Arc::ptr_eq(t, &current));
            match was {
                Some(w) if same_current && *w.tenant.version_label == *stored.version.id => {
                    match serve(w.tenant.clone(), &stored, judge) {
                        Ok(c) => {
                            out.insert(name, c);
                        }
                        Err(e) => {
                            tracing::error!(tenant = %name, "candidate not served: {e}");
                            failed.push(name);
                        }
                    }
                }
                _ => {
                    let carried = Carried::for_candidate(&current);
                    to_load.push((name.clone(), spec, stored.version.clone(), carried));
                    pending.insert(name, (stored, judge));
                }
            }
        }
        for (name, loaded) in self.load_stored(to_load).await {
            let (stored, judge) = pending.remove(&name).expect("asked for");
            match loaded.and_then(|t| serve(Arc::new(t), &stored, judge)) {
                Ok(c) => {
                    out.insert(name, c);
                }
                Err(e) => {
                    tracing::error!(
                        tenant = %name,
                        version = %stored.version.id,
                        "candidate not served (its current version serves every client): {e}"
                    );
                    failed.push(name);
                }
            }
        }
        (out, failed)
    }

    /// The candidates of `manifest`'s tenants that serve in `currents` (API tenants at the
    /// version the manifest names).
    pub(super) fn wanted(
        manifest: &datadir::Manifest,
        currents: &BTreeMap<String, TenantRef>,
    ) -> Vec<Wanted> {
        manifest
            .tenants
            .iter()
            .filter_map(|(name, t)| {
                let c = t.candidate.clone()?;
                let current = currents.get(name)?;
                let at = t.current.as_ref()?;
                (*current.version_label == *at.id)
                    .then(|| (name.clone(), t.clone(), c, current.clone()))
            })
            .collect()
    }

    /// The tenant's record and its candidate, checked for a change of its rollout.
    fn with_candidate(
        state: &State,
        name: &str,
        pre: &Precondition,
    ) -> Result<(StoredTenant, datadir::Candidate), ChangeError> {
        Self::check_api_owned(state, name)?;
        let stored = state.truth().tenants.get(name).cloned();
        pre.check(name, stored.as_ref())?;
        let stored = stored.ok_or_else(|| ChangeError::NotFound(format!("no tenant {name:?}")))?;
        let candidate = stored.candidate.clone().ok_or_else(|| {
            ChangeError::Conflict(format!(
                "tenant {name:?} has no candidate: deploy one with `tern deploy {name} app.wasm \
                 --percent N`"
            ))
        })?;
        Ok((stored, candidate))
    }

    /// Commits `entry` (from `stored`) with the candidate serving under its new plan: the
    /// prepared candidate serving here, with a new split (none serving here: the table is
    /// left as it is, and the change is written).
    async fn commit_plan(
        &self,
        state: &mut State,
        name: &str,
        stored: StoredTenant,
        entry: StoredTenant,
    ) -> Result<RolloutChanged, ChangeError> {
        let live = self.live.load_full();
        let candidate = entry.candidate.as_ref().expect("a candidate");
        let serve_now = match (live.tenants.get(name), live.candidates.get(name)) {
            (Some(current), Some(was)) if *was.tenant.version_label == *candidate.version.id => {
                let judge = judge_of(Some(was), candidate);
                Some(Some((
                    current.clone(),
                    Some(serve(was.tenant.clone(), candidate, judge)?),
                )))
            }
            _ => None,
        };
        let etag = entry.etag();
        let change = Change::Tenant {
            name: name.to_string(),
            base: Some(stored),
            entry: Some(entry.clone()),
            serve: serve_now,
        };
        self.commit(state, change).await?;
        Ok(RolloutChanged { entry, etag })
    }

    /// Gives the candidate `share` (hundredths of a percent) from now: its stages end (the
    /// share is the operator's from here), and an aborted candidate serves again, judged anew.
    ///
    /// # Errors
    /// `404` no tenant, `409` no candidate or config-owned, `412` precondition.
    pub async fn set_share(
        &self,
        name: &str,
        share: u16,
        pre: &Precondition,
    ) -> Result<RolloutChanged, ChangeError> {
        let mut state = self.lock().await?;
        let (stored, mut candidate) = Self::with_candidate(&state, name, pre)?;
        let plan = &mut candidate.plan;
        plan.share = share;
        plan.stages.clear();
        plan.stage = 0;
        plan.since_ms = now_ms();
        if plan.aborted.take().is_some() {
            plan.judged_since_ms = plan.since_ms;
        }
        let mut entry = stored.clone();
        entry.candidate = Some(candidate);
        let changed = self.commit_plan(&mut state, name, stored, entry).await?;
        tracing::info!(tenant = name, share = %crate::rollout::percent_text(share), "rollout share set");
        Ok(changed)
    }

    /// Makes the candidate the current version (and the current one previous, for
    /// `rollback`).
    ///
    /// # Errors
    /// `404` no tenant, `409` no candidate or config-owned, `412` precondition, and what
    /// loading the candidate here may fail with.
    pub async fn promote(
        &self,
        name: &str,
        pre: &Precondition,
    ) -> Result<RolloutChanged, ChangeError> {
        let mut state = self.lock().await?;
        let changed = self.promote_locked(&mut state, name, pre).await?;
        Ok(changed)
    }

    async fn promote_locked(
        &self,
        state: &mut State,
        name: &str,
        pre: &Precondition,
    ) -> Result<RolloutChanged, ChangeError> {
        let (stored, candidate) = Self::with_candidate(state, name, pre)?;
        let live = self.live.load_full();
        let tenant = match live.candidates.get(name) {
            Some(c) if *c.tenant.version_label == *candidate.version.id => c.tenant.clone(),
            _ => {
                // Not serving here (it failed to load on this replica): loaded now.
                let carried = live.carried(name);
                let item = (
                    name.to_string(),
                    stored.clone(),
                    candidate.version.clone(),
                    carried,
                );
                let loaded = self.load_stored(vec![item]).await.pop();
                let t: Tenant =
                    loaded.map_or_else(|| Err(super::error::internal("not loaded")), |(_, r)| r)?;
                Arc::new(t)
            }
        };
        let mut entry = stored.clone();
        entry.previous = entry.current.take();
        entry.current = Some(candidate.version.clone());
        entry.candidate = None;
        let etag = entry.etag();
        let change = Change::Tenant {
            name: name.to_string(),
            base: Some(stored),
            entry: Some(entry.clone()),
            serve: Some(Some((tenant, None))),
        };
        self.commit(state, change).await?;
        tracing::info!(tenant = name, version = %candidate.version.id, "candidate promoted");
        Ok(RolloutChanged { entry, etag })
    }

    /// Drops the tenant's candidate (`rollback` of a tenant that has one): its current version
    /// serves every client again.
    pub(super) async fn drop_candidate(
        &self,
        state: &mut State,
        name: &str,
        stored: StoredTenant,
    ) -> Result<RolloutChanged, ChangeError> {
        let mut entry = stored.clone();
        let dropped = entry.candidate.take().map(|c| c.version.id);
        let current = self.live.load().tenants.get(name).cloned();
        let etag = entry.etag();
        let change = Change::Tenant {
            name: name.to_string(),
            base: Some(stored),
            entry: Some(entry.clone()),
            serve: current.map(|c| Some((c, None))),
        };
        self.commit(state, change).await?;
        tracing::info!(tenant = name, candidate = ?dropped, "candidate rolled back");
        Ok(RolloutChanged { entry, etag })
    }

    /// One round of every serving candidate's rollout: aborted if its abort rule says so,
    /// else moved to its next stage (or promoted after its last timed one) when that is due.
    /// A step another replica took first is refused here (`409`) and left alone. Each step
    /// this replica took is handed to `taken` (the audit log) once its change is committed
    /// (it serves a moment before: the commit then forgets what it replaced), before the
    /// round goes on to the next candidate and before it is counted.
    /// `watched_since_ms`: when this server began tending them ([`Plan::advance`]).
    pub async fn tend_rollouts(&self, watched_since_ms: u64, taken_here: impl Fn(Taken)) {
        let live = self.live.load_full();
        for (name, c) in &live.candidates {
            let verdict = match (&c.plan.aborted, &c.plan.abort) {
                (None, Some(rule)) if c.split.share() > 0 => c.judge.verdict(rule),
                _ => None,
            };
            let seen = (&*c.tenant.version_label, &c.plan);
            let step = if let Some(reason) = verdict {
                self.step(name, seen, Step::Abort(reason)).await
            } else if c.plan.due(now_ms()).is_some() {
                self.step(name, seen, Step::Advance { watched_since_ms })
                    .await
            } else {
                continue;
            };
            match step {
                Ok(Some(taken)) => {
                    taken_here(Taken {
                        tenant: name.clone(),
                        step: taken,
                        version: c.tenant.version_label.to_string(),
                    });
                    (self.loader.metrics.rollout_steps)
                        .with_label_values(&[&c.tenant.label, taken])
                        .inc();
                }
                Ok(None) => {}
                Err(ChangeError::Conflict(why) | ChangeError::PreconditionFailed(why)) => {
                    tracing::debug!(tenant = %name, "rollout step taken elsewhere: {why}");
                }
                Err(e) => tracing::warn!(tenant = %name, "rollout step failed (tried again): {e}"),
            }
        }
    }

    /// Takes `step` of the rollout of `name` if its stored candidate is still the version and
    /// plan `seen`: the step taken (as [`Taken::step`] names it), if any.
    async fn step(
        &self,
        name: &str,
        seen: (&str, &Plan),
        step: Step,
    ) -> Result<Option<&'static str>, ChangeError> {
        let mut state = self.lock().await?;
        let Ok((stored, mut candidate)) =
            Self::with_candidate(&state, name, &Precondition::default())
        else {
            return Ok(None);
        };
        if (candidate.version.id.as_str(), &candidate.plan) != seen {
            // Changed since (by an operator, or another replica): the next round looks again.
            return Ok(None);
        }
        let version = candidate.version.id.clone();
        let plan = &mut candidate.plan;
        let now = now_ms();
        let (taken, done) = match step {
            Step::Abort(reason) => {
                let done = format!(
                    "rollout aborted (the candidate gets no more clients; `tern rollback {name}` \
                     drops it): {reason}"
                );
                plan.aborted = Some(Aborted { at_ms: now, reason });
                ("abort", done)
            }
            Step::Advance { watched_since_ms } => match plan.advance(now, watched_since_ms) {
                Advanced::Not => return Ok(None),
                Advanced::Promote => {
                    self.promote_locked(&mut state, name, &Precondition::default())
                        .await?;
                    return Ok(Some("promote"));
                }
                Advanced::Stage(next) => (
                    "advance",
                    format!(
                        "rollout advanced to its next stage ({} of {}: {})",
                        next + 1,
                        plan.stages.len(),
                        plan.percent()
                    ),
                ),
                Advanced::Again { late_ms } => (
                    "restart",
                    format!(
                        "rollout stage {} of {} ({}) runs again for its full time: it ended {} s \
                         ago, before this server began to tend rollouts, and no replica \
                         advanced it (the server, or the fleet, was down)",
                        plan.stage + 1,
                        plan.stages.len(),
                        plan.percent(),
                        late_ms / 1000
                    ),
                ),
            },
        };
        let mut entry = stored.clone();
        entry.candidate = Some(candidate);
        self.commit_plan(&mut state, name, stored, entry).await?;
        // Logged once it is the fleet's: a replica whose step lost the race logs nothing.
        tracing::warn!(tenant = name, version = %version, "{done}");
        Ok(Some(taken))
    }
}

/// A step a rollout took by itself on this replica.
#[derive(Debug, Clone)]
pub struct Taken {
    /// The tenant.
    pub tenant: String,
    /// `advance`, `promote`, `abort`, or `restart` (a stage found ended long ago, unwatched,
    /// runs again: [`Plan::advance`]).
    pub step: &'static str,
    /// The candidate's version.
    pub version: String,
}

/// An automatic step of a rollout.
enum Step {
    /// The abort rule's verdict.
    Abort(String),
    /// The next stage, or the promotion after the last timed one ([`Plan::advance`]).
    Advance {
        /// When this server began tending rollouts.
        watched_since_ms: u64,
    },
}
