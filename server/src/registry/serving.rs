//! What a route leads to: a tenant's current version, and its candidate when it has one.

use std::net::IpAddr;
use std::sync::Arc;

use http::HeaderMap;

use crate::rollout::{Judge, Plan, Role, Split};
use crate::tenant::TenantRef;

/// A candidate as it serves: its pre-linked version, its split of the tenant's clients, its
/// plan as stored, and the judge counting both versions' answers (kept while the candidate
/// stays the same version and keeps its share).
#[derive(Debug)]
pub struct Candidate {
    /// The candidate version, prepared like any tenant (sharing the current version's
    /// concurrency, counts, limits' state, live log and cache).
    pub tenant: TenantRef,
    /// Which requests it gets.
    pub split: Split,
    /// Its rollout as the registry stores it.
    pub plan: Plan,
    /// Both versions' answers since it began serving here.
    pub judge: Arc<Judge>,
}

/// One tenant's entry in the routing table.
#[derive(Debug)]
pub struct Serving {
    /// The version serving what the candidate does not.
    pub current: TenantRef,
    /// The version in rollout, if any.
    pub candidate: Option<Arc<Candidate>>,
}

impl Serving {
    /// The version a request with `headers` from `client` gets by the split (no override).
    pub fn pick(&self, headers: &HeaderMap, client: IpAddr) -> (&TenantRef, Role) {
        match &self.candidate {
            None => (&self.current, Role::Current),
            Some(c) => match c.split.role(headers, client) {
                Role::Current => (&self.current, Role::Current),
                Role::Candidate => (&c.tenant, Role::Candidate),
            },
        }
    }

    /// The version a `Tern-Version` value names: `current`, `candidate`, or the start (at
    /// least 8 digits) of either's id.
    pub fn named(&self, asked: &str) -> Option<(&TenantRef, Role)> {
        let c = self.candidate.as_ref()?;
        let is = |t: &TenantRef| asked.len() >= 8 && t.version_label.starts_with(asked);
        match asked {
            "current" => Some((&self.current, Role::Current)),
            "candidate" => Some((&c.tenant, Role::Candidate)),
            _ if is(&c.tenant) => Some((&c.tenant, Role::Candidate)),
            _ if is(&self.current) => Some((&self.current, Role::Current)),
            _ => None,
        }
    }
}
