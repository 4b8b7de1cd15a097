//! Configuration: the TOML schema, its defaults, and validation with `file:line` errors.
//!
//! `tern serve` with no `--config` uses [`DEMO_CONFIG`], which routes the built-in demo tenants.
//!
//! One file per section: `server.rs` (`[server]`), `pool.rs` (`[pool]`), `tenant.rs`
//! (`[[tenant]]` and its validation; `tenant_table.rs` reads a table's keys with their places in
//! the file), `tls.rs` (`[[certificate]]`, `[tls]`), `registry.rs` (`[registry]`). The other
//! sections' schemas live with what they configure: `[kv.NAME]` in [`crate::kv`], `[tracing]`
//! in [`crate::trace`], `[tenant.outbound]` in [`crate::outbound`]. This file holds the whole
//! file's schema, its loading and the checks that span sections (route clashes).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

/// The built-in configuration: the demo tenants on `127.0.0.1:8080`.
pub const DEMO_CONFIG: &str = include_str!("../../../config/tern.toml");

/// Name shown in errors for [`DEMO_CONFIG`].
pub const DEMO_CONFIG_NAME: &str = "<built-in config/tern.toml>";

mod invalid;
mod pool;
mod registry;
mod server;
mod tenant;
mod tenant_table;
mod tls;

pub use crate::outbound::{BackendConfig, OutboundConfig};
pub use invalid::Invalid;
pub use pool::{MAX_MEMORY_SLOTS, PoolConfig};
pub use registry::RegistryConfig;
pub use server::{LiveLogsConfig, RuntimeMode, ServerConfig, default_data_dir};
pub use tenant::{
    ErrorDetail, GuestKind, HstsConfig, LimitsConfig, MAX_HSTS_SECONDS, TenantConfig,
    TenantSettings, validate_tenant,
};
pub use tenant_table::settings_keys;
pub use tls::{AcmeChallenge, AcmeConfig, CertificateConfig, TlsConfig, acme_name};

/// A configuration that cannot be used, with where in which file the problem is.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{file}: cannot read: {source}")]
    Read {
        /// The configuration file.
        file: String,
        /// Why it could not be read.
        source: std::io::Error,
    },
    /// The file is not valid TOML or does not match the schema, or a value is invalid.
    #[error("{file}:{line}:{column}: {message}")]
    Invalid {
        /// The configuration file.
        file: String,
        /// 1-based line of the offending value.
        line: usize,
        /// 1-based column of the offending value.
        column: usize,
        /// What is wrong, naming the field.
        message: String,
    },
}

/// The whole configuration file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Listeners, threads, caches.
    #[serde(default)]
    pub server: ServerConfig,
    /// Sizing of the preallocated instance pool.
    #[serde(default)]
    pub pool: PoolConfig,
    /// The tenants and their routes.
    #[serde(default, rename = "tenant")]
    pub tenants: Vec<TenantConfig>,
    /// The certificates the TLS listener serves (`server.tls_listen`).
    #[serde(default, rename = "certificate")]
    pub certificates: Vec<CertificateConfig>,
    /// `[tls]`: certificates obtained automatically.
    #[serde(default)]
    pub tls: TlsConfig,
    /// `[registry]`: where API-deployed tenants live (this data directory, or a store shared by
    /// a fleet).
    #[serde(default)]
    pub registry: RegistryConfig,
    /// `[kv.NAME]`: guests' key-value stores (`default` exists without a section).
    #[serde(default)]
    pub kv: BTreeMap<String, crate::kv::StoreConfig>,
    /// `[tracing]`: every request's phases as OpenTelemetry spans, exported over OTLP/HTTP
    /// (off unless an endpoint is set here or in the `OTEL_*` environment).
    #[serde(default)]
    pub tracing: crate::trace::TracingConfig,
    /// Directory relative module paths are resolved against (the config file's directory).
    #[serde(skip)]
    pub base_dir: PathBuf,
}

impl Config {
    /// Uses the shared registry at `url` (`tern serve --registry`).
    ///
    /// # Errors
    /// If it is not a registry URL.
    pub fn set_registry(&mut self, url: String) -> anyhow::Result<()> {
        self.registry.url = url;
        self.registry
            .validate()
            .map_err(|e| anyhow::anyhow!("--registry: {}", e.message))
    }

    /// `tern serve --tls-listen --tls-cert --tls-key`: a TLS listener on `at` whose default
    /// certificate is `cert` and `key` (paths as given, from the working directory).
    ///
    /// # Errors
    /// If the config has a default certificate already, or the paths are not UTF-8.
    pub fn serve_tls_from_command_line(
        &mut self,
        at: SocketAddr,
        cert: &Path,
        key: &Path,
    ) -> anyhow::Result<()> {
        let absolute = |p: &Path| -> anyhow::Result<Spanned<String>> {
            let p = std::path::absolute(p)?;
            let text = p
                .to_str()
                .ok_or_else(|| anyhow::anyhow!("{}: not a UTF-8 path", p.display()))?;
            Ok(Spanned::new(0..0, text.to_string()))
        };
        self.server.tls_listen = Some(at);
        self.certificates.push(CertificateConfig {
            hosts: Vec::new(),
            cert: absolute(cert)?,
            key: absolute(key)?,
            from_command_line: true,
        });
        tls::validate(&self.server, &self.certificates, &self.tls)
            .map_err(|e| anyhow::anyhow!("--tls-cert: {}", e.message))
    }

    /// Reads and validates a configuration file.
    ///
    /// # Errors
    /// If the file cannot be read, is not valid TOML, or fails validation; the error names the
    /// file, line and field.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            file: path.display().to_string(),
            source,
        })?;
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Self::parse(&text, &path.display().to_string(), base)
    }

    /// The built-in demo configuration.
    ///
    /// # Panics
    /// Never: a test checks that the built-in configuration is valid.
    pub fn demo() -> Self {
        Self::parse(DEMO_CONFIG, DEMO_CONFIG_NAME, PathBuf::from("."))
            .expect("built-in config is valid")
    }

    /// Parses and validates configuration text; `file` names it in errors.
    ///
    /// # Errors
    /// If the text is not valid TOML or fails validation.
    pub fn parse(text: &str, file: &str, base_dir: PathBuf) -> Result<Self, ConfigError> {
        let invalid = |span: Option<std::ops::Range<usize>>, message: String| {
            let (line, column) = line_col(text, span.map_or(0, |s| s.start));
            ConfigError::Invalid {
                file: file.to_string(),
                line,
                column,
                message,
            }
        };
        let mut config: Config =
            toml::from_str(text).map_err(|e| invalid(e.span(), e.message().trim().to_string()))?;
        config.base_dir = base_dir;
        config.validate().map_err(|e| invalid(e.span, e.message))?;
        Ok(config)
    }

    /// Checks what the schema alone cannot: value ranges, names, routes and their clashes.
    fn validate(&self) -> Result<(), Invalid> {
        let pool = &self.pool;
        let whole = |m: &str| {
            Err(Invalid {
                span: None,
                message: m.to_string(),
            })
        };
        if pool.instances == 0 {
            return whole("pool.instances must be at least 1");
        }
        if pool.memory_slots != 0
            && !(pool.instances..=MAX_MEMORY_SLOTS).contains(&pool.memory_slots)
        {
            return whole(&format!(
                "pool.memory_slots must be 0 (as many as pool.instances) or between \
                 pool.instances ({}) and {MAX_MEMORY_SLOTS}",
                pool.instances
            ));
        }
        if pool.max_memory_mib == 0 || pool.max_memory_mib > 4096 {
            return whole("pool.max_memory_mib must be between 1 and 4096");
        }
        if self.server.max_header_bytes < 8192 {
            return whole("server.max_header_bytes must be at least 8192");
        }
        if let Err(e) = crate::context::TrustedProxies::parse(&self.server.trusted_proxies) {
            return whole(&format!("server.trusted_proxies: {e}"));
        }
        if let Err(e) = crate::ratelimit::config::check_all(&self.server.rate_limit) {
            return whole(&format!("server.rate_limit: {e}"));
        }
        if self.server.max_websockets == 0 {
            return whole("server.max_websockets must be > 0");
        }
        if self.server.max_connections == 0 || self.server.header_read_timeout_ms == 0 {
            return whole("server.max_connections and server.header_read_timeout_ms must be > 0");
        }
        let logs = &self.server.live_logs;
        if let Err(e) = crate::ceilings::check(&[
            (
                "server.send_timeout_ms",
                self.server.send_timeout_ms,
                100,
                crate::ceilings::MAX_TIMEOUT_MS,
            ),
            (
                "server.live_logs.history",
                logs.history as u64,
                0,
                1_000_000,
            ),
            (
                "server.live_logs.history_kib",
                logs.history_kib as u64,
                0,
                1 << 20,
            ),
            (
                "server.live_logs.max_tailers",
                logs.max_tailers as u64,
                1,
                1000,
            ),
            (
                "server.live_logs.records_per_second",
                u64::from(logs.records_per_second),
                0,
                1_000_000,
            ),
        ]) {
            return whole(&e);
        }
        if pool.component_core_instances == 0 || pool.component_core_instances > 1000 {
            return whole("pool.component_core_instances must be between 1 and 1000");
        }
        if pool.max_wasm_stack_kib < 64 {
            return whole("pool.max_wasm_stack_kib must be at least 64");
        }
        if pool.async_stack_kib < pool.max_wasm_stack_kib + 256 {
            return whole(
                "pool.async_stack_kib must exceed pool.max_wasm_stack_kib by at least 256 \
                 (host calls run on the rest of the fiber stack)",
            );
        }
        tls::validate(&self.server, &self.certificates, &self.tls)?;
        self.registry.validate()?;
        let mut names = std::collections::HashSet::new();
        for t in &self.tenants {
            let name = t.name.get_ref();
            validate_tenant(t, pool)?;
            if t.settings.https_redirect && self.server.tls_listen.is_none() {
                return Err(Invalid {
                    span: Some(t.name.span()),
                    message: format!(
                        "tenant {name:?}: https_redirect needs the TLS listener: set \
                         server.tls_listen"
                    ),
                });
            }
            if !names.insert(name.clone()) {
                return Err(Invalid {
                    span: Some(t.name.span()),
                    message: format!("tenant.name {name:?} is used by two tenants"),
                });
            }
        }
        // The tenants' cache shares fit in the server's cache budget.
        let mut reserved = 0;
        for t in &self.tenants {
            reserved += ServerConfig::cache_shares([&t.settings]);
            if reserved > self.server.cache_max_mib {
                return Err(Invalid {
                    span: Some(t.name.span()),
                    message: format!(
                        "tenant {:?}: the tenants' caches reserve {reserved} MiB up to it \
                         (cache.max_mib), over the server's cache budget of {} MiB: raise \
                         server.cache_max_mib or lower a tenant's cache.max_mib",
                        t.name.get_ref(),
                        self.server.cache_max_mib
                    ),
                });
            }
        }
        // Every (host, prefix) pair must belong to one tenant: the router's rule.
        let routes = self.tenants.iter().map(|t| {
            crate::router::Route::new(
                t.name.get_ref().as_str(),
                t.settings.hosts.iter().map(|h| h.get_ref().as_str()),
                t.settings.paths.iter().map(|p| p.get_ref().as_str()),
                (),
            )
        });
        if let Err(clash) = crate::router::Router::build(routes) {
            let t = self
                .tenants
                .iter()
                .find(|t| *t.name.get_ref() == clash.other)
                .expect("the clash names a tenant");
            let span = t
                .settings
                .paths
                .iter()
                .find(|p| crate::router::normalise_prefix(p.get_ref()) == clash.prefix)
                .map_or_else(|| t.name.span(), Spanned::span);
            return Err(Invalid {
                span: Some(span),
                message: format!("tenant {:?}: {clash}", clash.other),
            });
        }
        Ok(())
    }
}

/// 1-based line and column of byte `offset` in `text`.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before
        .rfind('\n')
        .map_or(before.len(), |i| before.len() - i - 1)
        + 1;
    (line, column)
}

#[cfg(test)]
mod tests;
