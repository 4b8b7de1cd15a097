//! The admin API's view of tenants: their routes, versions, limits and request counts as JSON.

use serde_json::{Value, json};

use super::state::Registry;
use crate::change::ChangeError;
use crate::config::{PoolConfig, TenantConfig};
use crate::datadir::StoredTenant;
use crate::tenant::{self, TenantRef};

impl Registry {
    /// JSON description of one tenant or of all (`GET /admin/v1/tenants[/{name}]`).
    ///
    /// # Errors
    /// `404` for an unknown name.
    pub async fn describe(&self, name: Option<&str>) -> Result<Value, ChangeError> {
        let state = self.state.lock().await;
        let live = self.live.load();
        let pool = &self.loader.runtime().pool;
        let mut out = Vec::new();
        for t in &state.config.tenants {
            let n = t.name.get_ref();
            if name.is_none_or(|x| x == n) {
                out.push(describe_tenant(n, live.tenants.get(n), None, pool, t));
            }
        }
        for (n, stored) in &state.manifest.tenants {
            if name.is_none_or(|x| x == n) {
                let config = stored.spec.to_config(n, "");
                let mut t = describe_tenant(n, live.tenants.get(n), Some(stored), pool, &config);
                t["candidate"] = describe_candidate(stored, live.candidates.get(n));
                // What a conditional change compares against: the entry changes start from
                // (a fleet's registry), which a replica may serve a moment later.
                t["etag"] = json!(state.truth().tenants.get(n).map(StoredTenant::etag));
                out.push(t);
            }
        }
        match name {
            None => Ok(json!({ "tenants": out })),
            Some(n) => out
                .pop()
                .ok_or_else(|| ChangeError::NotFound(format!("no tenant {n:?}"))),
        }
    }
}

/// A tenant's candidate: its version, its rollout as stored, the share in effect here, and
/// what each version answered since it began serving here.
fn describe_candidate(
    stored: &StoredTenant,
    live: Option<&std::sync::Arc<crate::registry::Candidate>>,
) -> Value {
    use crate::rollout::Role;
    let Some(c) = &stored.candidate else {
        return Value::Null;
    };
    let plan = &c.plan;
    let next_stage_at = plan
        .stages
        .get(plan.stage)
        .and_then(|s| s.secs)
        .filter(|_| plan.aborted.is_none())
        .map(|secs| plan.since_ms + secs * 1000);
    json!({
        "version": c.version,
        "percent": if plan.aborted.is_some() { "0%".to_string() } else { plan.percent() },
        "state": if plan.aborted.is_some() { "aborted" } else { "serving" },
        "plan": plan,
        "next_stage_at_ms": next_stage_at,
        // Only on the replica answering: each judges its own requests.
        "serving_here": live.is_some_and(|l| *l.tenant.version_label == *c.version.id),
        "answered_here": live.map(|l| json!({
            "current": l.judge.counts(Role::Current),
            "candidate": l.judge.counts(Role::Candidate),
        })),
    })
}

fn describe_tenant(
    name: &str,
    live: Option<&TenantRef>,
    stored: Option<&StoredTenant>,
    pool: &PoolConfig,
    config: &TenantConfig,
) -> Value {
    let limits = tenant::Limits::from_config(&config.settings.limits, pool);
    let served = live.map(|t| t.served.get()).unwrap_or_default();
    let (source, module) = match stored {
        None => ("config", Some(config.module.get_ref().clone())),
        Some(_) => ("api", None),
    };
    json!({
        "name": name,
        "source": source,
        "serving": live.is_some(),
        "kind": live.map(|t| t.kind().name()),
        "hosts": config.settings.hosts.iter().map(|h| h.get_ref()).collect::<Vec<_>>(),
        "paths": config.settings.paths.iter().map(|p| p.get_ref()).collect::<Vec<_>>(),
        // Values may be secrets: the API shows only the names.
        "env": config.settings.env.keys().collect::<Vec<_>>(),
        "limits": {
            "timeout_ms": limits.timeout.as_millis() as u64,
            "max_memory_mib": limits.max_memory / (1024 * 1024),
            "max_request_bytes": limits.max_request_bytes,
            "max_response_bytes": limits.max_response_bytes,
            "max_concurrency": limits.max_concurrency,
        },
        "module": module,
        "current": stored.and_then(|s| s.current.as_ref()),
        "previous": stored.and_then(|s| s.previous.as_ref()),
        "created_at": stored.map(|s| s.created_at),
        "spec": stored.map(|s| &s.spec),
        "assets": live.and_then(|t| t.assets.as_ref()).map(|a| json!({
            "entries": a.entries(),
            "bytes": a.bytes(),
        })),
        "requests": {
            "total": served.iter().sum::<u64>(),
            "1xx": served[0], "2xx": served[1], "3xx": served[2], "4xx": served[3],
            "5xx": served[4],
        },
    })
}
