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
    /// and, unless `forwarded` (it came from another replica), on every other replica of a
    /// fleet. What it did here.
    ///
    /// # Errors
    /// No such tenant; its WebSockets are not in events mode (it has no channels).
    pub fn publish(
        &self,
        name: &str,
        items: &[(crate::websocket::Target, crate::websocket::Push)],
        forwarded: bool,
    ) -> Result<crate::websocket::channels::Published, crate::change::ChangeError> {
        use crate::change::ChangeError;
        let tenant = self
            .registry
            .live()
            .tenants
            .get(name)
            .cloned()
            .ok_or_else(|| ChangeError::NotFound(format!("no tenant {name:?}")))?;
        let channels = &tenant.grants.channels;
        if !channels.events() {
            return Err(ChangeError::Conflict(
                crate::websocket::channels::PublishError::NotEvents.to_string(),
            ));
        }
        Ok(channels.publish(items, forwarded))
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
