//! What the request path and the admin listener share: the tenants, the certificates, the
//! pool, the metrics.

use crate::metrics::Metrics;
use crate::pool::Pool;
use crate::registry::Registry;

/// Everything the request path shares.
#[derive(Debug)]
pub struct App {
    /// The live tenants and routing table, and the way to change them.
    pub registry: Registry,
    /// The TLS listener's certificates (set once it is made; unset without one).
    pub certificates: std::sync::OnceLock<std::sync::Arc<crate::tls::Certificates>>,
    /// Bearer token of the admin API.
    pub admin_token: String,
    /// Where admin changes and refused attempts are recorded.
    pub audit: crate::audit::AuditLog,
    /// Failed admin attempts by client address (answered `429` past a rate).
    pub failures: crate::access::Failures,
    /// Admission to the instance pool.
    pub pool: Pool,
    /// Metric handles.
    pub metrics: Metrics,
    /// Where tenants' `https_redirect` sends clients: the TLS listener's public port (set once
    /// it is bound; unset without one).
    pub https_port: std::sync::OnceLock<u16>,
    /// Traces (`[tracing]`), when they are on.
    pub tracer: Option<std::sync::Arc<crate::trace::Tracer>>,
    /// Proxies whose connections may name their client (`[server] trusted_proxies`).
    pub trusted_proxies: crate::context::TrustedProxies,
    /// Whether access lines show the query string (`[server] access_log_query`).
    pub access_log_query: bool,
    /// The limits every tenant's requests count against (`[[server.rate_limit]]`).
    pub rate_limits: Option<crate::ratelimit::RateLimits>,
    /// Open WebSocket connections (`[server] max_websockets`), closed at shutdown.
    pub sockets: std::sync::Arc<crate::websocket::Sockets>,
    /// What live log streams share (`tern logs`).
    pub live_logs: crate::livelog::Readers,
    /// The runner of tenants' schedules and their ledgers (`[[tenant.schedule]]`).
    pub scheduler: crate::scheduler::Scheduler,
}

impl App {
    /// Publishes `items` to tenant `name`'s events-mode WebSocket connections on this server
    /// and, unless `forwarded` (it came from another replica, naming whose tenant it is), on
    /// every other replica of a fleet. What it did here.
    ///
    /// # Errors
    /// No such tenant; forwarded for another tenant of its name ([`asked_of`]); its
    /// WebSockets are not in events mode (it has no channels).
    pub fn publish(
        &self,
        name: &str,
        items: &[(crate::websocket::Target, crate::websocket::Push)],
        forwarded: Option<Option<&[u8]>>,
    ) -> Result<crate::websocket::channels::Published, crate::change::ChangeError> {
        use crate::change::ChangeError;
        let tenant = self
            .registry
            .live()
            .tenants
            .get(name)
            .cloned()
            .ok_or_else(|| ChangeError::NotFound(format!("no tenant {name:?}")))?;
        if let Some(key) = forwarded {
            asked_of(&tenant, key)?;
        }
        let channels = &tenant.grants.channels;
        if !channels.events() {
            return Err(ChangeError::Conflict(
                crate::websocket::channels::PublishError::NotEvents.to_string(),
            ));
        }
        Ok(channels.publish(items, forwarded.is_some()))
    }

    /// The TLS listener's certificates, if there is one.
    pub fn certificates(&self) -> Option<&std::sync::Arc<crate::tls::Certificates>> {
        self.certificates.get()
    }

    /// Re-reads the config file: its tenants and certificates (see
    /// [`Registry::reload`](crate::registry::Registry::reload)).
    ///
    /// # Errors
    /// Why the reload was refused; what runs keeps serving.
    pub async fn reload(&self) -> Result<usize, crate::change::ChangeError> {
        self.registry
            .reload(self.certificates().map(|c| &**c))
            .await
    }
}

/// Whether `tenant` is the one another replica's request about it names (`key`, the
/// [`crate::fleet::TENANT_KEY`] header: its [`crate::tenant::Tenant::data`]; a request naming
/// none, from a replica of a version before it, is taken as it is).
///
/// # Errors
/// `409`: the two replicas know different tenants of that name (one of them has not applied
/// a delete and a create again yet): what is asked belongs to the other.
pub fn asked_of(
    tenant: &crate::tenant::Tenant,
    key: Option<&(impl AsRef<[u8]> + ?Sized)>,
) -> Result<(), crate::change::ChangeError> {
    match key {
        Some(key) if key.as_ref() != tenant.data.as_bytes() => {
            Err(crate::change::ChangeError::Conflict(format!(
                "the replica asking and this one know different tenants named {:?} (one of them \
                 has not applied the registry's latest change yet): nothing was done",
                tenant.name
            )))
        }
        _ => Ok(()),
    }
}
