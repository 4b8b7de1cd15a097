//! The host capabilities of one request, prepared once whatever its guest's kind: what its
//! tenant is granted (outbound calls, key-value stores, variables, its cache), bound to this
//! request (its id, its trace, what it hands on, the operations it made, the time it waited).
//!
//! Every capability has one shape, in its own module: a `Grant`, prepared when its tenant is
//! loaded (`Grant::prepare`, from the tenant's [`Preparing`], its own section of the tenant's
//! settings and the server resource it needs, held in [`Resources`]), and a `Session` per request (`Session::new`, from the grant and the
//! request's [`RequestContext`]). [`Grants`] and [`Capabilities`] compose them, a line each.
//! Every kind's store state holds a request's capabilities and gives them out through
//! [`CapabilitiesView`]; each host API reaches its part there, and only its handles (the `tern` ABI's)
//! or bindings (the components') are the kind's own. A new host API is its module (grant,
//! session, link functions), a line in each of [`Resources`] (when it needs a server
//! resource), [`Grants`] and [`Capabilities`], and a line per kind in the linkers' composition
//! root ([`crate::guest::link`]).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::context::RequestContext;
use crate::prepare::Preparing;

/// What the server holds for every tenant's capabilities, built once at start-up: the
/// key-value stores (opened from `[kv]`) and every tenant's variables (which follow the
/// registry). A capability with a server-wide resource adds it here.
pub struct Resources {
    /// The key-value stores tenants may be granted.
    pub stores: crate::kv::Stores,
    /// Every tenant's variables.
    pub variables: Arc<crate::variables::Table>,
    /// The channels of events-mode WebSocket connections, every tenant's.
    pub hub: Arc<crate::websocket::Hub>,
    /// Where publishes go beyond this server (a fleet's other replicas).
    pub forward: Option<Arc<dyn crate::websocket::channels::Forward>>,
    /// How every tenant's live log keeps its records (`[server.live_logs]`).
    pub live_logs: crate::config::LiveLogsConfig,
}

impl Resources {
    /// Opens the stores of `config` (file stores under `root`); no variables yet, no
    /// channels; publishes forwarded through `forward`.
    ///
    /// # Errors
    /// A store that cannot be opened, in words for the operator.
    pub fn open(
        config: &crate::config::Config,
        root: &Path,
        metrics: &crate::metrics::Metrics,
        forward: Option<Arc<dyn crate::websocket::channels::Forward>>,
    ) -> Result<Self, String> {
        Ok(Self {
            stores: crate::kv::Stores::open(&config.kv, root, &metrics.kv_operations)?,
            variables: Arc::default(),
            hub: crate::websocket::Hub::new(),
            forward,
            live_logs: config.server.live_logs.clone(),
        })
    }
}

/// What a tenant's guests are granted, prepared when it is loaded.
#[derive(Clone)]
pub struct Grants {
    /// What its guests may call, with the metric handles of those calls.
    pub outbound: Arc<crate::outbound::Grant>,
    /// The key-value stores its guests may open.
    pub kv: Arc<crate::kv::Grant>,
    /// Its variables.
    pub variables: Arc<crate::variables::Grant>,
    /// Its cache, for its guests' own entries (when it has one).
    pub cache: Option<Arc<crate::cache::guest::Grant>>,
    /// Its rate counters and penalty boxes.
    pub counters: Arc<crate::ratelimit::counters::Grant>,
    /// Its WebSocket channels.
    pub channels: Arc<crate::websocket::channels::Grant>,
}

impl Grants {
    /// A tenant's grants, from its `settings`, the server's `resources`, and its `cache`
    /// (when it has one; shared with its front end); the counters its guests kept in the
    /// version it replaces are `carried.0`, its channels `carried.1`.
    ///
    /// # Errors
    /// Why a setting cannot be granted (a bad outbound policy, an unknown store), in words
    /// for the operator.
    pub fn prepare(
        p: &Preparing<'_>,
        settings: &crate::config::TenantSettings<toml::Spanned<String>>,
        resources: &Resources,
        cache: Option<&Arc<crate::cache::Cache>>,
        carried: (
            Option<&crate::ratelimit::counters::Grant>,
            Option<&crate::websocket::channels::Grant>,
        ),
    ) -> Result<Self, String> {
        let s = settings;
        Ok(Self {
            outbound: Arc::new(crate::outbound::Grant::prepare(p, &s.outbound, cache)?),
            kv: Arc::new(crate::kv::Grant::prepare(
                p,
                &s.kv,
                s.limits.max_kv_ops,
                &resources.stores,
            )?),
            variables: Arc::new(crate::variables::Grant::prepare(p, &resources.variables)),
            cache: crate::cache::guest::Grant::prepare(p, cache).map(Arc::new),
            counters: Arc::new(crate::ratelimit::counters::Grant::prepare(
                &s.rate_counter,
                &s.penalty_box,
                carried.0,
                &p.metrics.rate_counter_entries,
                p.label,
            )),
            channels: Arc::new(crate::websocket::channels::Grant::prepare(
                p,
                s.websocket.mode,
                &resources.hub,
                resources.forward.as_ref(),
                carried.1,
            )),
        })
    }
}

/// One request's host capabilities (see the module docs).
pub struct Capabilities {
    /// Outbound HTTP under the tenant's policy.
    pub outbound: crate::outbound::Session,
    /// The tenant's key-value stores.
    pub kv: crate::kv::Session,
    /// The tenant's variables (read as they are now; nothing of them is per request).
    pub variables: Arc<crate::variables::Grant>,
    /// The tenant's cache, for the guest's own entries.
    pub cache: crate::cache::guest::Session,
    /// The tenant's rate counters and penalty boxes.
    pub counters: crate::ratelimit::counters::Session,
    /// The tenant's WebSocket channels, to publish to.
    pub channels: crate::websocket::channels::Session,
}

impl Capabilities {
    /// Nothing used yet: what the tenant is `granted`, for the request of `context`.
    pub fn new(granted: &Grants, context: &RequestContext) -> Self {
        Self {
            outbound: crate::outbound::Session::new(granted.outbound.clone(), context),
            kv: crate::kv::Session::new(granted.kv.clone(), context),
            variables: granted.variables.clone(),
            cache: crate::cache::guest::Session::new(granted.cache.clone(), context),
            counters: crate::ratelimit::counters::Session::new(granted.counters.clone()),
            channels: crate::websocket::channels::Session::new(granted.channels.clone()),
        }
    }

    /// Time the guest waited for outbound requests and for key-value stores.
    pub fn waited(&self) -> (Duration, Duration) {
        (self.outbound.waited(), self.kv.waited)
    }
}

/// A store state that holds its request's [`Capabilities`].
pub trait CapabilitiesView {
    /// The request's capabilities.
    fn capabilities(&mut self) -> &mut Capabilities;
}
