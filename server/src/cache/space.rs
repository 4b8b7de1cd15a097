//! Whose answers a request is to ([`Space`]: the tenant's front, one of its backends, its
//! guests' own entries) and how each space's requests ended ([`Counts`]).

use std::sync::Arc;

use crate::metrics::Counter;

/// How the requests of one space of a tenant's cache ended: its front's
/// (`tern_cache_requests_total`), one backend's (`tern_outbound_cache_requests_total`) or its
/// guests' own entries' (`tern_guest_cache_requests_total`).
#[derive(Debug)]
pub struct Counts {
    pub(super) hit: Counter,
    pub(super) collapsed: Counter,
    pub(super) stale: Counter,
    pub(super) revalidated: Counter,
    pub(super) miss: Counter,
    pub(super) bypass: Counter,
}

impl Counts {
    /// Counts a request that did not use the cache.
    pub fn bypassed(&self) {
        self.bypass.inc();
    }

    /// The counters of each result, from `result(name)`.
    pub fn new(result: impl Fn(&str) -> Counter) -> Self {
        Self {
            hit: result("hit"),
            collapsed: result("collapsed"),
            stale: result("stale"),
            revalidated: result("revalidated"),
            miss: result("miss"),
            bypass: result("bypass"),
        }
    }
}

/// Whose answers a key holds. One tenant's cache keeps them apart: the answers of its guests
/// to clients (its front), those of each of its backends that has `cache = true`
/// (readthrough) and the entries its guests store themselves (the cache API), each counted
/// in its own metric, all within the one budget and purged alike.
#[derive(Debug, Clone)]
pub enum Space {
    /// Requests to the tenant's guests, keyed by scheme, host and target (as `[tenant.cache]`
    /// keys them) and by the version answering (`Tenant::cache_version`: a candidate shares
    /// its current version's cache, and neither is given the other's answers).
    Front(u64),
    /// A backend's answers to the tenant's guests' requests, keyed by the backend's name
    /// and the target sent to it.
    Backend(Arc<Counts>),
    /// What the tenant's guests store under keys of their own ([`guest::Grant`]).
    Guest(Arc<Counts>),
}

impl Space {
    /// The guests' own entries: not paths, so no purge by prefix names them.
    pub(super) const GUEST: u8 = 2;

    pub(super) fn tag(&self) -> u8 {
        match self {
            Self::Front(_) => 0,
            Self::Backend(_) => 1,
            Self::Guest(_) => Self::GUEST,
        }
    }

    /// The version its keys are for: the front's version; 0 for what the versions share
    /// (their backends' answers, their guests' own entries).
    pub(super) fn version(&self) -> u64 {
        match self {
            Self::Front(v) => *v,
            Self::Backend(_) | Self::Guest(_) => 0,
        }
    }

    /// Where its requests are counted (`front`: the cache's own counts).
    pub(super) fn counts<'a>(&'a self, front: &'a Counts) -> &'a Counts {
        match self {
            Self::Front(_) => front,
            Self::Backend(counts) | Self::Guest(counts) => counts,
        }
    }
}

/// What a request that went to the guest is counted as, once its answer is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Counted {
    Miss,
    Bypass,
    /// The guest answered `304` to the stored validators: the stored body served again.
    Revalidated,
    /// The guest failed and the stored answer was served (`stale-if-error`).
    Stale,
    /// Counted otherwise: a background refresh (the request it serves was counted as
    /// `stale`), or a miss that waited and looked again.
    Uncounted,
}
