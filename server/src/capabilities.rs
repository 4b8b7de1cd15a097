//! The host capabilities of one request, prepared once whatever its guest's kind: what its
//! tenant is granted (outbound calls, key-value stores, variables, its cache), bound to this request (its id, its
//! trace, what it hands on, the operations it made, the time it waited).
//!
//! A tenant's [`Grants`] are prepared when it is loaded, from its settings; each request's
//! [`Capabilities`] are made from them once, whatever its guest's kind. Every kind's store
//! state holds them and gives them out through [`HostView`]; each host API reaches its part
//! there, and only its handles (the `tern` ABI's) or bindings (the components') are the
//! kind's own. A new host API is a part of both here (its grant from the tenant's settings,
//! its per-request state), a module of its own with its link functions, and one line for each
//! kind in the linkers' composition root ([`crate::guest::link`]).

use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;

/// What a tenant's guests are granted, prepared when it is loaded.
#[derive(Clone)]
pub struct Grants {
    /// What its guests may call, with the metric handles of those calls.
    pub outbound: Arc<crate::outbound::Calls>,
    /// The key-value stores its guests may open.
    pub kv: Arc<crate::kv::Grants>,
    /// Its variables.
    pub variables: Arc<crate::variables::Granted>,
    /// Its cache, for its guests' own entries (when it has one).
    pub cache: Option<Arc<crate::cache::guest::GuestCache>>,
}

impl Grants {
    /// A tenant's grants, from its settings.
    ///
    /// # Errors
    /// Why a setting cannot be granted (a bad outbound policy, an unknown store), in words
    /// for the operator.
    pub fn prepare(g: &crate::prepare::Preparing<'_>) -> Result<Self, String> {
        let policy = crate::outbound::Policy::from_config(&g.settings.outbound)
            .map_err(|e| format!("outbound: {e}"))?;
        let readthrough = g.cache.clone().and_then(|cache| {
            crate::outbound::Readthrough::new(cache, policy.cached_backends(), g.metrics, g.label)
        });
        let outbound = Arc::new(crate::outbound::Calls {
            readthrough,
            policy,
            log_budget: g.log_budget.clone(),
            label: g.label.to_string(),
            requests: g.metrics.outbound_requests.clone(),
            duration: g.metrics.outbound_duration.with_label_values(&[g.label]),
            opened: g.metrics.outbound_connections.clone(),
        });
        let kv = Arc::new(crate::kv::Grants {
            tenant: g.tenant.into(),
            stores: g.stores.grant(&g.settings.kv)?,
            max_ops: g.settings.limits.max_kv_ops,
        });
        let variables = Arc::new(crate::variables::Granted::new(
            g.tenant,
            g.variables.clone(),
        ));
        let cache = g.cache.clone().map(|cache| {
            Arc::new(crate::cache::guest::GuestCache::new(
                cache, g.metrics, g.label,
            ))
        });
        Ok(Self {
            outbound,
            kv,
            variables,
            cache,
        })
    }
}

/// One request's host capabilities (see the module docs).
pub struct Capabilities {
    /// Outbound HTTP under the tenant's policy.
    pub outbound: crate::outbound::Session,
    /// The tenant's key-value stores.
    pub kv: crate::kv::Session,
    /// The tenant's variables.
    pub variables: Arc<crate::variables::Granted>,
    /// The tenant's cache, for the guest's own entries.
    pub cache: crate::cache::guest::CacheSession,
}

impl Capabilities {
    /// Nothing used yet: what the tenant is `granted`, for the request `request_id` (with its
    /// `trace`, when tracing is on).
    pub fn new(
        granted: &Grants,
        request_id: HeaderValue,
        trace: Option<Arc<crate::trace::Active>>,
    ) -> Self {
        Self {
            outbound: crate::outbound::Session::new(granted.outbound.clone(), request_id),
            kv: crate::kv::Session::new(granted.kv.clone(), trace),
            variables: granted.variables.clone(),
            cache: crate::cache::guest::CacheSession::new(granted.cache.clone()),
        }
    }

    /// Time the guest waited for outbound requests and for key-value stores.
    pub fn waited(&self) -> (Duration, Duration) {
        (self.outbound.waited(), self.kv.waited)
    }
}

/// A store state that holds its request's [`Capabilities`].
pub trait HostView {
    /// The request's capabilities.
    fn host(&mut self) -> &mut Capabilities;
}
