//! Purges of tenants' caches (`POST /admin/v1/tenants/{name}/cache/purge`), and in a fleet
//! their way to every replica.
//!
//! A purge is applied on the replica asked, then appended to the shared registry's purge log
//! (`purges.json`, one compare-and-swap object holding the last [`KEPT`] purges, numbered),
//! and the other replicas are nudged. Each replica applies the log's purges it has not
//! applied yet whenever it reads the registry (a nudge, or its next poll when the nudge was
//! lost): one conditional read per poll while nothing changed. A replica that fell so far
//! behind that purges it never applied left the log drops every stored answer instead; so does
//! one that finds the log restarted.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::state::Registry;
use crate::cache::Purge;
use crate::change::ChangeError;
use crate::fleet::Fleet;
use crate::fleet::objects::{RemoteError, change_id, record_change};

/// The purge log's object in the shared registry.
const LOG: &str = "purges.json";

/// How many purges the log keeps (a replica further behind drops everything).
const KEPT: usize = 512;

/// How many times a purge is appended again after another replica appended first.
const APPEND_TRIES: usize = 8;

/// A purge asked of a replica before this one started is not applied by it (its cache was
/// empty then); this much of clock difference between replicas is allowed for.
const CLOCK_SLACK: u64 = 5;

/// The shared registry's purge log.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Log {
    /// The number of the last purge appended.
    #[serde(default)]
    last: u64,
    #[serde(default)]
    purges: Vec<Logged>,
    /// The change ids of the writes that made it ([`record_change`]).
    #[serde(default)]
    changes: Vec<String>,
}

/// One purge in the log.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Logged {
    seq: u64,
    tenant: String,
    /// Whose tenant ([`crate::tenant::Tenant::data`]): a replica serving another tenant of
    /// the name leaves its cache be. (`None`: logged by a version before it.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    data: Option<String>,
    /// When it was asked (Unix seconds).
    at: u64,
    purge: Purge,
}

impl Registry {
    /// Purges tenant `name`'s cache here, then (in a fleet) on every replica through the
    /// shared registry.
    ///
    /// # Errors
    /// `404` no such tenant, `400` no cache or a purge naming nothing; `503` when the shared
    /// registry cannot be written (the purge was applied here only: retry).
    pub async fn purge(&self, name: &str, purge: &Purge) -> Result<Value, ChangeError> {
        let (purged, data) = {
            let live = self.live();
            let tenant = live
                .tenants
                .get(name)
                .ok_or_else(|| ChangeError::NotFound(format!("no tenant {name:?}")))?;
            let cache = tenant.front.cache.as_ref().ok_or_else(|| {
                ChangeError::Invalid(format!(
                    "tenant {name:?} has no cache (cache.enabled is false)"
                ))
            })?;
            let purged = cache.purge(purge).map_err(ChangeError::Invalid)?;
            (purged, tenant.data.to_string())
        };
        let metrics = &self.loader.metrics;
        metrics.cache_purges.with_label_values(&["api"]).inc();
        let Some(fleet) = self.fleet.clone() else {
            return Ok(json!({
                "tenant": name,
                "purged": purged,
                "soft": purge.soft,
                "replicas": "this one",
            }));
        };
        let seq = self
            .append(&fleet, (name, data), purge)
            .await
            .map_err(|e| {
                ChangeError::Unavailable(format!(
                    "purged on this replica ({purged} stored URL(s)), but the shared registry {} \
                 could not be written ({e}), so the other replicas still serve theirs: send \
                 the purge again",
                    fleet.url
                ))
            })?;
        fleet.nudge_peers(metrics);
        Ok(json!({
            "tenant": name,
            "purged": purged,
            "soft": purge.soft,
            "replicas": "every replica (through the shared registry)",
            "purge_seq": seq,
        }))
    }

    /// Appends `purge` of `tenant` (its name, and whose it is) to the registry's log; its
    /// number there.
    async fn append(
        &self,
        fleet: &Fleet,
        (tenant, data): (&str, String),
        purge: &Purge,
    ) -> Result<u64, RemoteError> {
        let change = change_id();
        let mut last_error = None;
        for _ in 0..APPEND_TRIES {
            let (mut log, version) = match fleet.remote.get_if_changed(LOG, None).await? {
                Some((bytes, version)) => (read_log(&bytes), Some(version)),
                None => (Log::default(), None),
            };
            log.last += 1;
            let seq = log.last;
            log.purges.push(Logged {
                seq,
                tenant: tenant.to_string(),
                data: Some(data.clone()),
                at: crate::datadir::now(),
                purge: purge.clone(),
            });
            let over = log.purges.len().saturating_sub(KEPT);
            log.purges.drain(..over);
            record_change(&mut log.changes, &change);
            let bytes = serde_json::to_vec(&log).unwrap_or_default();
            match fleet
                .remote
                .put_if(LOG, bytes.into(), version.as_ref(), &change)
                .await
            {
                Ok(_) => {
                    // Written on top of what this replica had applied: its own purge need
                    // not be applied again when the log is read back.
                    let mut applied = self.purges.lock().await;
                    if applied.through == Some(seq - 1) {
                        applied.through = Some(seq);
                    }
                    return Ok(seq);
                }
                Err(RemoteError::Conflict(m)) => last_error = Some(RemoteError::Conflict(m)),
                Err(e) => return Err(e),
            }
        }
        Err(last_error.unwrap_or_else(|| RemoteError::Conflict("no attempt made".into())))
    }

    /// Applies the registry's purges this replica has not applied yet (one conditional read
    /// when the log did not change).
    pub(super) async fn apply_purges(&self, fleet: &Fleet) {
        let mut applied = self.purges.lock().await;
        let read = match fleet
            .remote
            .get_if_changed(LOG, applied.version.as_ref())
            .await
        {
            Ok(read) => read,
            Err(e) => {
                tracing::debug!("cannot read the registry's purge log: {e}");
                return;
            }
        };
        let Some((bytes, version)) = read else {
            // Unchanged, or no purge ever made.
            applied.through.get_or_insert(0);
            return;
        };
        let log = read_log(&bytes);
        let metrics = &self.loader.metrics;
        let live = self.live();
        let caches = || live.tenants.values().filter_map(|t| t.front.cache.as_ref());
        let first = log.purges.first().map_or(log.last + 1, |p| p.seq);
        match applied.through {
            // The first read: purges asked since this replica started.
            None => {
                for p in &log.purges {
                    if p.at + CLOCK_SLACK >= self.started_at {
                        self.apply_one(p);
                    }
                }
            }
            // Behind by purges the log no longer holds, or the log restarted: everything.
            Some(through) if through + 1 < first || through > log.last => {
                for cache in caches() {
                    let _ = cache.purge(&Purge::everything());
                }
                metrics.cache_purges.with_label_values(&["missed"]).inc();
                tracing::warn!(
                    applied = through,
                    log = log.last,
                    "this replica missed purges of the shared registry's log: every cached \
                     answer was dropped"
                );
            }
            Some(through) => {
                for p in log.purges.iter().filter(|p| p.seq > through) {
                    self.apply_one(p);
                }
            }
        }
        applied.through = Some(log.last);
        applied.version = Some(version);
    }

    /// Applies one purge of the log (read from the registry, asked of another replica).
    fn apply_one(&self, p: &Logged) {
        let live = self.live();
        let Some(cache) = live
            .tenants
            .get(&p.tenant)
            .filter(|t| p.data.as_deref().is_none_or(|d| *d == *t.data))
            .and_then(|t| t.front.cache.as_ref())
        else {
            return;
        };
        match cache.purge(&p.purge) {
            Ok(_) => self
                .loader
                .metrics
                .cache_purges
                .with_label_values(&["fleet"])
                .inc(),
            Err(e) => tracing::warn!(
                tenant = %p.tenant,
                seq = p.seq,
                "a purge in the shared registry's log cannot be applied: {e}"
            ),
        }
    }
}

/// The log in `bytes`; an unreadable one reads as empty with its number past every other, so
/// every replica drops everything once rather than serving what a lost purge named.
fn read_log(bytes: &[u8]) -> Log {
    serde_json::from_slice(bytes).unwrap_or_else(|e| {
        tracing::warn!("the shared registry's purge log is not readable ({e}); starting a new one");
        Log {
            last: u64::MAX / 2,
            ..Log::default()
        }
    })
}
