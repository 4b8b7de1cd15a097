//! `[server]`: listeners, threads, the data and cache directories.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

/// `[server]`: process-wide settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Public cleartext (HTTP) listener for tenant traffic; `"off"`: none, the TLS listener
    /// serves alone (then ACME answers TLS-ALPN-01 only).
    #[serde(deserialize_with = "listen_or_off")]
    pub listen: Option<SocketAddr>,
    /// Admin listener (`/metrics`, `/healthz`, `/readyz`); keep it off the public network.
    pub admin_listen: SocketAddr,
    /// Threads serving tenant traffic; `0` means one per CPU core.
    pub worker_threads: usize,
    /// `per-core`: each worker thread runs its own single-threaded runtime with its own
    /// `SO_REUSEPORT` listener, so a request stays on one core from accept to teardown (no
    /// work stealing, no cross-core wake-ups). `shared`: one multi-threaded runtime.
    pub runtime: RuntimeMode,
    /// Where compiled modules are cached; empty means `$TERN_CACHE_DIR`, else
    /// `$XDG_CACHE_HOME/tern`, else `~/.cache/tern`.
    pub cache_dir: String,
    /// How long in-flight requests may take to finish after SIGTERM/SIGINT.
    pub shutdown_grace_ms: u64,
    /// At most this many tenants get their own metrics label; the rest count as `other`,
    /// which keeps the metrics' cardinality bounded.
    pub max_tenant_labels: usize,
    /// Most open client connections; further clients wait in the kernel's accept backlog.
    pub max_connections: usize,
    /// Most WebSocket connections open at once, every tenant's together (each tenant's own
    /// limit is its `websocket.max_connections`); an upgrade past it is answered `503`.
    pub max_websockets: u32,
    /// A client must send a request's complete headers within this time (slowloris);
    /// it also closes keep-alive connections that stay idle this long.
    pub header_read_timeout_ms: u64,
    /// Largest request head (request line + headers) in bytes; larger gets `431`.
    pub max_header_bytes: usize,
    /// A client that takes none of its answer's bytes for this long is cut off: its
    /// connection closed (HTTP/1.1, HTTP/2) or its stream reset (HTTP/3), as nginx's
    /// `send_timeout`. The guest's slot is never held for it: a guest that cannot write
    /// ends at its own time limit.
    pub send_timeout_ms: u64,
    /// Where deployed modules, their compiled artifacts, assets and the tenant manifest are
    /// kept; empty means `$TERN_DATA_DIR`, else `$XDG_DATA_HOME/tern`, else
    /// `~/.local/share/tern`. `--data-dir` overrides it.
    pub data_dir: String,
    /// Bearer token of the admin API. `TERN_ADMIN_TOKEN` overrides it; with neither, a random
    /// token is generated at start-up and written to `<data_dir>/admin-token` (mode 0600).
    pub admin_token: String,
    /// Largest module or assets archive the admin API accepts, in bytes; larger gets `413`.
    pub max_upload_bytes: u64,
    /// TLS listener for tenant traffic (HTTPS; HTTP/2 or HTTP/1.1 as the client's ALPN asks),
    /// beside `listen`, with the same tenants, limits and connection cap. It serves the
    /// `[[certificate]]`s, at least one. Unset: no TLS.
    pub tls_listen: Option<SocketAddr>,
    /// A client must complete its TLS handshake within this time, or its connection is closed.
    pub tls_handshake_timeout_ms: u64,
    /// Most TLS handshakes in progress at once; a connection past it is closed at once, so a
    /// flood of handshakes (each costs a signature) cannot take every core.
    pub max_tls_handshakes: usize,
    /// HTTP/3: a QUIC listener on `tls_listen`'s address over UDP, with the same certificates,
    /// tenants, limits and connection cap, advertised on the TLS listener's answers with
    /// `Alt-Svc`. Off by default: the HTTP/3 library Tern uses (`h3`) calls itself
    /// experimental, and UDP on the port must be let through the firewall first.
    pub http3: bool,
    /// How long clients may remember the `Alt-Svc` advertisement of HTTP/3 (its `ma`), in
    /// seconds; `0` sends `Alt-Svc: clear`, which tells clients to forget an earlier one (how
    /// HTTP/3 is withdrawn: set `0`, wait out the old value, then turn `http3` off).
    pub http3_alt_svc_max_age_secs: u64,
    /// Most request streams open at once on one HTTP/3 connection (HTTP/2's default is the
    /// same 200); the client is told, and waits for a stream to end before opening another.
    pub http3_max_streams: u64,
    /// The UDP socket's receive and send buffers the QUIC listener asks the kernel for, in KiB
    /// (the kernel caps them at `net.core.rmem_max` / `wmem_max`; the size granted is logged).
    pub http3_socket_buffer_kib: usize,
    /// The port in the `Location` of a tenant's `https_redirect`, where clients reach the TLS
    /// listener (a load balancer's 443 in front of `tls_listen`'s 8443), and in HTTP/3's
    /// `Alt-Svc`; `0`: `tls_listen`'s port (left out of the URL when it is 443).
    pub public_https_port: u16,
    /// Proxies (addresses and networks, `10.0.0.0/8`) whose connections may name their client
    /// in `Forwarded` or `X-Forwarded-For`: the client address of the access line, traces and
    /// what guests see. Empty: the connection's peer is the client, whatever the headers say.
    pub trusted_proxies: Vec<String>,
    /// Whether the access line's `path` includes the query string (off: queries often carry
    /// tokens, and the log is not the place for them).
    pub access_log_query: bool,
    /// The memory every tenant's cache in front of its guests may hold together, in MiB.
    /// Each tenant with a cache reserves its `cache.max_mib` from it, so one tenant's traffic
    /// never evicts another's answers; a tenant whose share does not fit is refused.
    pub cache_max_mib: u64,
    /// A file holding the secrets key (64 hex digits) that seals tenants' secret variables
    /// at rest; `TERN_SECRETS_KEY` overrides it. With neither, a single server makes one in
    /// its data directory (`secrets-key`, mode 0600); a fleet needs one.
    pub secrets_key_file: String,
    /// During a rotation of the secrets key, a file holding the previous key (what it sealed
    /// still opens until `tern secret reseal`); `TERN_SECRETS_KEY_PREVIOUS` overrides it.
    pub secrets_previous_key_file: String,
    /// `[[server.rate_limit]]`: limits every tenant's requests count against, checked before
    /// each tenant's own (`[[tenant.rate_limit]]`'s settings; the key is the client's address
    /// unless one is named, and `tenant` counts per tenant). Changed at a restart.
    pub rate_limit: Vec<crate::ratelimit::LimitConfig>,
    /// `[server.live_logs]`: what `tern logs` reads (each tenant's recent requests).
    pub live_logs: LiveLogsConfig,
    /// A Redis key-value store (`[kv.NAME]` with `backend = "redis"`) that keeps the ledgers of
    /// tenants' schedules, through which the servers sharing it take each tick once; empty:
    /// the fleet's registry, or a lone server's data directory.
    pub schedule_store: String,
}

/// `[server.live_logs]`: each tenant's recent requests, kept for `tern logs`
/// (`GET /admin/v1/tenants/{name}/logs`). Changed at a restart.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LiveLogsConfig {
    /// Records kept per tenant on this server: what `tern logs --since` shows and how far a
    /// tailer may fall behind before it loses records. `0`: live logs are off.
    pub history: usize,
    /// KiB of guest output (stdout and stderr) those records keep per tenant; the oldest
    /// records go first past it.
    pub history_kib: usize,
    /// Tailers a tenant may have attached at once on this server (`429` past it). A fleet's
    /// merged stream counts once on every replica.
    pub max_tailers: usize,
    /// Records per second a tenant keeps before its requests are sampled (each record then
    /// says its `sample` rate); answers of 5xx and guest failures are always kept. `0`:
    /// never sampled.
    pub records_per_second: u32,
}

impl Default for LiveLogsConfig {
    fn default() -> Self {
        Self {
            history: 1000,
            history_kib: 1024,
            max_tailers: 10,
            records_per_second: 1000,
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: Some(SocketAddr::from(([127, 0, 0, 1], 8080))),
            admin_listen: SocketAddr::from(([127, 0, 0, 1], 9090)),
            worker_threads: 0,
            runtime: RuntimeMode::PerCore,
            cache_dir: String::new(),
            shutdown_grace_ms: 10_000,
            max_tenant_labels: 1000,
            max_connections: 10_000,
            max_websockets: 10_000,
            header_read_timeout_ms: 10_000,
            max_header_bytes: 64 * 1024,
            send_timeout_ms: 60_000,
            data_dir: String::new(),
            admin_token: String::new(),
            max_upload_bytes: 64 * 1024 * 1024,
            tls_listen: None,
            tls_handshake_timeout_ms: 10_000,
            max_tls_handshakes: 1024,
            http3: false,
            http3_alt_svc_max_age_secs: 86_400,
            http3_max_streams: 200,
            http3_socket_buffer_kib: 8 * 1024,
            public_https_port: 0,
            trusted_proxies: Vec::new(),
            access_log_query: false,
            cache_max_mib: 1024,
            secrets_key_file: String::new(),
            secrets_previous_key_file: String::new(),
            rate_limit: Vec::new(),
            live_logs: LiveLogsConfig::default(),
            schedule_store: String::new(),
        }
    }
}

/// `server.listen`: an address, or `"off"`.
fn listen_or_off<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<SocketAddr>, D::Error> {
    let text = String::deserialize(d)?;
    if text == "off" {
        return Ok(None);
    }
    text.parse().map(Some).map_err(|_| {
        serde::de::Error::custom(format!(
            "{text:?} is not an address (\"0.0.0.0:8080\", \"[::]:80\") or \"off\""
        ))
    })
}

/// How worker threads are organised (`server.runtime`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RuntimeMode {
    /// One single-threaded runtime and listener per worker thread.
    PerCore,
    /// One multi-threaded runtime with work stealing.
    Shared,
}

/// `$own` if set, else `$xdg/tern`, else `$HOME/<home_sub>`, else `<temp>/<fallback>`.
fn user_dir(own: &str, xdg: &str, home_sub: &str, fallback: &str) -> PathBuf {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(dir) = var(own) {
        return PathBuf::from(dir);
    }
    if let Some(dir) = var(xdg) {
        return PathBuf::from(dir).join("tern");
    }
    match var("HOME") {
        Some(home) => PathBuf::from(home).join(home_sub),
        None => std::env::temp_dir().join(fallback),
    }
}

/// The data directory when neither `--data-dir` nor `server.data_dir` names one:
/// `$TERN_DATA_DIR`, `$XDG_DATA_HOME/tern`, or `~/.local/share/tern`.
pub fn default_data_dir() -> PathBuf {
    user_dir(
        "TERN_DATA_DIR",
        "XDG_DATA_HOME",
        ".local/share/tern",
        "tern-data",
    )
}

impl ServerConfig {
    /// The directory compiled modules of config tenants are cached in: `cache_dir`, else
    /// `$TERN_CACHE_DIR`, `$XDG_CACHE_HOME/tern`, or `~/.cache/tern`.
    pub fn cache_dir(&self) -> PathBuf {
        if !self.cache_dir.is_empty() {
            return PathBuf::from(&self.cache_dir);
        }
        user_dir(
            "TERN_CACHE_DIR",
            "XDG_CACHE_HOME",
            ".cache/tern",
            "tern-cache",
        )
    }

    /// The MiB of cache shares `tenants` reserve (those with a cache enabled).
    pub fn cache_shares<'a, R: 'a>(
        tenants: impl IntoIterator<Item = &'a super::tenant::TenantSettings<R>>,
    ) -> u64 {
        tenants
            .into_iter()
            .filter(|t| t.cache.enabled)
            .map(|t| t.cache.max_mib)
            .sum()
    }

    /// Worker threads to run: the configured number, or one per core.
    pub fn workers(&self) -> usize {
        match self.worker_threads {
            0 => std::thread::available_parallelism().map_or(1, usize::from),
            n => n,
        }
    }
}
