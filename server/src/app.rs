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
    /// Channels of events-mode WebSocket connections (publishes reach them here).
    pub hub: std::sync::Arc<crate::websocket::Hub>,
}

/// A tenant's key in the channels' hub: its name and its lineage (what its versions carry
/// from one to the next, new when a tenant of that name is created again), so a tenant made
/// anew under an old name never reaches the old one's connections.
pub fn channels_key(tenant: &crate::tenant::Tenant) -> String {
    format!(
        "{}#{:x}",
        tenant.name,
        std::sync::Arc::as_ptr(&tenant.served) as usize
    )
}

impl App {
    /// Publishes `items` to tenant `name`'s events-mode WebSocket connections on this server
    /// and, unless `forwarded` (it came from another replica), on every other replica of a
    /// fleet. What it did here, or `None` when there is no such tenant.
    pub fn publish(
        &self,
        name: &str,
        items: &[(crate::websocket::Target, crate::websocket::Push)],
        forwarded: bool,
    ) -> Option<crate::websocket::channels::Published> {
        let (label, key) = {
            let live = self.registry.live();
            let tenant = live.tenants.get(name)?;
            (tenant.label.clone(), channels_key(tenant))
        };
        let mut done = crate::websocket::channels::Published::default();
        for (to, push) in items {
            let p = self.hub.publish(&key, to, push);
            done.delivered += p.delivered;
            done.dropped += p.dropped;
        }
        let m = &self.metrics.websocket_published;
        m.with_label_values(&[label.as_str(), "delivered"])
            .inc_by(done.delivered);
        m.with_label_values(&[label.as_str(), "dropped"])
            .inc_by(done.dropped);
        if !forwarded && let Some(fleet) = self.registry.fleet() {
            let body = crate::websocket::channels::to_json(items).to_string();
            fleet.publish_to_peers(name, body.into(), &self.metrics);
        }
        Some(done)
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
