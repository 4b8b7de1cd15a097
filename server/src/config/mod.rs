//! Configuration: the TOML schema, its defaults, and validation with `file:line` errors.
//!
//! `tern serve` with no `--config` uses [`DEMO_CONFIG`], which routes the built-in demo tenants.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use toml::Spanned;

/// The built-in configuration: the demo tenants on `127.0.0.1:8080`.
pub const DEMO_CONFIG: &str = include_str!("../../../config/tern.toml");

/// Name shown in errors for [`DEMO_CONFIG`].
pub const DEMO_CONFIG_NAME: &str = "<built-in config/tern.toml>";

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
    /// A client must send a request's complete headers within this time (slowloris);
    /// it also closes keep-alive connections that stay idle this long.
    pub header_read_timeout_ms: u64,
    /// Largest request head (request line + headers) in bytes; larger gets `431`.
    pub max_header_bytes: usize,
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
    /// The port in the `Location` of a tenant's `https_redirect`, where clients reach the TLS
    /// listener (a load balancer's 443 in front of `tls_listen`'s 8443); `0`: `tls_listen`'s
    /// port (left out of the URL when it is 443).
    pub public_https_port: u16,
    /// Proxies (addresses and networks, `10.0.0.0/8`) whose connections may name their client
    /// in `Forwarded` or `X-Forwarded-For`: the client address of the access line, traces and
    /// what guests see. Empty: the connection's peer is the client, whatever the headers say.
    pub trusted_proxies: Vec<String>,
    /// Whether the access line's `path` includes the query string (off: queries often carry
    /// tokens, and the log is not the place for them).
    pub access_log_query: bool,
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
            header_read_timeout_ms: 10_000,
            max_header_bytes: 64 * 1024,
            data_dir: String::new(),
            admin_token: String::new(),
            max_upload_bytes: 64 * 1024 * 1024,
            tls_listen: None,
            tls_handshake_timeout_ms: 10_000,
            max_tls_handshakes: 1024,
            public_https_port: 0,
            trusted_proxies: Vec::new(),
            access_log_query: false,
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

/// `[[certificate]]`: a certificate chain and its private key, PEM files (relative to the
/// config file), served by the TLS listener to clients that ask for one of its `hosts`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CertificateConfig {
    /// Host names it is served for, exact (`api.example.com`) or wildcard (`*.example.com`);
    /// the certificate must cover each. Empty: the default certificate, served to clients that
    /// ask for a name no other certificate has, or for none (at most one default).
    #[serde(default)]
    pub hosts: Vec<Spanned<String>>,
    /// The certificate, then its chain (PEM).
    pub cert: Spanned<String>,
    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: Spanned<String>,
    /// Given by `tern serve --tls-cert/--tls-key`, not the file (a reload keeps it).
    #[serde(skip)]
    pub from_command_line: bool,
}

/// `[registry]`: where the tenants deployed through the admin API are kept. Without `url`, in
/// the data directory (one server). With `url`, in an object store every replica of a fleet
/// shares: a deploy on any replica is served by all of them.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RegistryConfig {
    /// The shared registry: `s3://bucket/prefix` (AWS S3, Cloudflare R2, Ceph RGW, versitygw,
    /// MinIO, ... with the usual `AWS_*` settings from the environment: `AWS_ACCESS_KEY_ID`,
    /// `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP`). Empty: the
    /// data directory alone. `TERN_REGISTRY_URL` and `tern serve --registry` override it.
    pub url: String,
    /// How often each replica checks the registry for changes (one conditional read, which
    /// costs no body when nothing changed).
    pub poll_interval_ms: u64,
    /// This replica's name in the registry's fleet view; empty: `TERN_REPLICA`, else the host
    /// name (a Kubernetes pod's name).
    pub replica: String,
    /// The URL of this replica's admin listener as the other replicas reach it
    /// (`http://10.0.0.5:9090`): a replica that writes a change tells the others at once, so
    /// they read it before their next poll. Empty: `TERN_ADVERTISE_URL`, else the admin address
    /// if it is not a wildcard (0.0.0.0), else the others notice at their next poll.
    pub advertise: String,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            poll_interval_ms: 1000,
            replica: String::new(),
            advertise: String::new(),
        }
    }
}

impl RegistryConfig {
    /// The shared registry's URL, if there is one.
    pub fn shared_url(&self) -> Option<&str> {
        (!self.url.is_empty()).then_some(self.url.as_str())
    }

    /// The admin URL the other replicas reach this one at, if it has one (`admin`: where the
    /// admin listener is bound).
    pub fn advertise_url(&self, admin: std::net::SocketAddr) -> Option<String> {
        [
            Some(self.advertise.clone()),
            std::env::var("TERN_ADVERTISE_URL").ok(),
        ]
        .into_iter()
        .flatten()
        .map(|u| u.trim().trim_end_matches('/').to_string())
        .find(|u| !u.is_empty())
        .or_else(|| (!admin.ip().is_unspecified()).then(|| format!("http://{admin}")))
    }

    /// This replica's name.
    pub fn replica_name(&self) -> String {
        let name = [
            Some(self.replica.clone()),
            std::env::var("TERN_REPLICA").ok(),
            std::fs::read_to_string("/proc/sys/kernel/hostname").ok(),
        ]
        .into_iter()
        .flatten()
        .map(|n| n.trim().to_string())
        .find(|n| !n.is_empty())
        .unwrap_or_else(|| "replica".into());
        // A name safe as an object name.
        name.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                    c
                } else {
                    '-'
                }
            })
            .collect()
    }
}

/// `[tls]`: TLS settings beyond the listener and the certificate files.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// `[tls.acme]`: certificates obtained and renewed from an ACME certificate authority.
    pub acme: Option<AcmeConfig>,
}

/// `[tls.acme]`: obtain a certificate per host name from an ACME CA (RFC 8555: Let's Encrypt,
/// ZeroSSL, a company CA) and renew it before it expires. Setting it agrees to the CA's terms
/// of service.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcmeConfig {
    /// The CA's directory URL, e.g. Let's Encrypt's
    /// `https://acme-v02.api.letsencrypt.org/directory` (its staging CA for trials:
    /// `https://acme-staging-v02.api.letsencrypt.org/directory`).
    pub directory: Spanned<String>,
    /// Contact URLs for the account (`mailto:ops@example.com`); the CA writes about problems.
    #[serde(default)]
    pub contact: Vec<String>,
    /// Host names to obtain certificates for. Empty: every exact name in the tenants' `hosts`
    /// (wildcards need DNS validation, which Tern does not do). Names a `[[certificate]]` or an
    /// uploaded certificate serves are left to it.
    #[serde(default)]
    pub hosts: Vec<Spanned<String>>,
    /// How the CA checks that a name points here: `tls-alpn-01` (on the TLS listener, which
    /// must be reachable on port 443) or `http-01` (on `listen`, reachable on port 80).
    #[serde(default)]
    pub challenge: AcmeChallenge,
    /// A PEM file with the CA certificate to trust for the ACME server's own HTTPS (a private
    /// or test CA); unset: the system's roots.
    #[serde(default)]
    pub ca_root: Option<Spanned<String>>,
    /// How often certificates are checked for renewal and the data directory for certificates
    /// other replicas obtained, in seconds.
    #[serde(default = "default_acme_check")]
    pub check_interval_seconds: u64,
    /// After a failed order, the wait before the next try, in seconds; it doubles with each
    /// failure up to 6 hours.
    #[serde(default = "default_acme_retry")]
    pub retry_seconds: u64,
}

fn default_acme_check() -> u64 {
    60
}

fn default_acme_retry() -> u64 {
    60
}

/// The ACME challenge Tern answers (`tls.acme.challenge`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum AcmeChallenge {
    /// RFC 8737: a special certificate on the TLS listener.
    #[default]
    #[serde(rename = "tls-alpn-01")]
    TlsAlpn01,
    /// RFC 8555 8.3: a token at `/.well-known/acme-challenge/` on the cleartext listener.
    #[serde(rename = "http-01")]
    Http01,
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

    /// Worker threads to run: the configured number, or one per core.
    pub fn workers(&self) -> usize {
        match self.worker_threads {
            0 => std::thread::available_parallelism().map_or(1, usize::from),
            n => n,
        }
    }
}

/// `[pool]`: the region of preallocated instance slots every request takes one of.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PoolConfig {
    /// Instance slots (and memories, tables, fiber stacks): the most guests running at once.
    pub instances: u32,
    /// Memory slots: at least `instances` (0: as many). A freed memory slot keeps its module's
    /// heap image, so that module's next guest maps nothing; more slots than running guests
    /// keep the images of more tenants ready (many-tenant hosts: `docs/configuration.md`).
    pub memory_slots: u32,
    /// Largest linear memory any guest may have, in MiB (a tenant's limit may be lower).
    pub max_memory_mib: u64,
    /// Largest table any guest may have, in elements.
    pub table_elements: usize,
    /// Core instances one `wasi-http` component may create (its modules plus the small shim
    /// modules component tooling adds: a Rust component has 3, JavaScript and Python ones
    /// more). Each slot then reserves this many core instances and tables (address space and
    /// a little bookkeeping; still one memory). A component needing more is refused at deploy.
    pub component_core_instances: u32,
    /// Bytes of each freed memory slot that are reset in place (and kept resident) instead of
    /// returned to the kernel: with the dirty-page reset, the pages a guest dirtied up to this
    /// much (with the gaps the sweep joins between them), so the next request does not fault
    /// them in again. 8 MiB holds what a Python or JavaScript component dirties (1 MiB left a
    /// Python request ~30 % slower); a small guest keeps only what it dirtied. The `memset`
    /// reset copies all of it on every request, so there it is capped at 1 MiB
    /// (`engine::MEMSET_KEEP_RESIDENT_KIB`).
    pub memory_keep_resident_kib: usize,
    /// Likewise for tables: with the dirty-page reset, the table pages a guest dirtied, up to
    /// this much, are zeroed and kept. 256 KiB holds a whole table of 32,768 entries; 16 KiB
    /// left a JavaScript component's lazily filled funcref table faulting 3 pages in (6 faults)
    /// on every request, ~12 % of its CPU.
    pub table_keep_resident_kib: usize,
    /// Bytes at the top of each fiber stack kept resident; the stack is zeroed after every
    /// request, so this part is cleared by `memset` rather than by page faults next time.
    pub stack_keep_resident_kib: usize,
    /// Zero each fiber stack after every request (defence in depth: guest code cannot address
    /// the host stack, so this guards only against a host bug reading stale stack memory).
    pub zero_stacks: bool,
    /// Memory, table and stack pages to hand back to the kernel are queued and returned in
    /// batches of this many slots (one `process_madvise` call); capped at `instances / 8`.
    pub decommit_batch_size: usize,
    /// Find the pages a guest dirtied with Linux's `PAGEMAP_SCAN` ioctl (kernel 6.7+) and reset
    /// only those. One `ioctl` per request: it pays off for guests that dirty a scattered part
    /// of a large `memory_keep_resident_kib`; for small guests a plain `memset` is faster.
    pub pagemap_scan: bool,
    /// Largest stack a guest may use before it traps with a stack overflow, in KiB.
    pub max_wasm_stack_kib: usize,
    /// Size of each guest's fiber stack, in KiB: the guest's stack plus room for host calls,
    /// which must be at least 256 KiB more than `max_wasm_stack_kib`.
    pub async_stack_kib: usize,
    /// How long a request may wait for a free slot before it gets `503`.
    pub queue_timeout_ms: u64,
    /// Serve WASI 0.3 components (component-model async: what spin-sdk 6 and later build).
    /// Off by default: wasmtime 48 marks its WASI 0.3 `wasi:http` experimental (not for
    /// production, no security fixes backported to this release), and the engine's concurrency
    /// support adds bookkeeping to every component request.
    pub wasi_p3: bool,
}

/// The most memory slots a pool may have. Each reserves 4 GiB of address space (and a guard
/// region): what a host can reserve decides the real limit (about 20,000 slots in the 128 TiB
/// of x86-64 with 4-level page tables; engine creation names it when it is exceeded).
pub const MAX_MEMORY_SLOTS: u32 = 1 << 20;

impl PoolConfig {
    /// The memory slots the pool has: `memory_slots`, or `instances` when it is 0.
    pub fn memory_slots(&self) -> u32 {
        self.memory_slots.max(self.instances)
    }
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            instances: 256,
            memory_slots: 0,
            max_memory_mib: 256,
            table_elements: 20_000,
            component_core_instances: 16,
            memory_keep_resident_kib: 8192,
            table_keep_resident_kib: 256,
            stack_keep_resident_kib: 16,
            zero_stacks: true,
            decommit_batch_size: 16,
            pagemap_scan: true,
            max_wasm_stack_kib: 512,
            async_stack_kib: 1024,
            queue_timeout_ms: 1000,
            wasi_p3: false,
        }
    }
}

pub use crate::outbound::{BackendConfig, OutboundConfig};

/// `[[tenant]]`: one handler module and the requests routed to it. Its name, module, kind and
/// assets are the file's own (the admin API names the tenant in its path and deploys modules and
/// assets apart); everything else is [`TenantSettings`], the schema the API shares, written at
/// the same level of the table.
#[derive(Debug, Clone)]
pub struct TenantConfig {
    /// Unique name, used in logs and metrics labels.
    pub name: Spanned<String>,
    /// `.wasm` or `.cwasm` path (relative to the config file), or `builtin:NAME` for a demo guest.
    pub module: Spanned<String>,
    /// What kind of guest the module is (`tern`, `wasi-http`, `cgi`); unset: detected from the
    /// module itself (see [`GuestKind`]).
    pub kind: Option<GuestKind>,
    /// A directory (relative to the config file) loaded into memory at start-up and shown to
    /// the tenant's guests, read-only, as the preopened WASI directory `/assets`.
    pub assets: Option<Spanned<String>>,
    /// Routes, environment, limits, outbound policy, error responses.
    pub settings: TenantSettings<Spanned<String>>,
}

/// What a tenant is besides its code, wherever it is declared: in a `[[tenant]]` table of the
/// config file ([`TenantConfig`]) or through the admin API (`PUT /admin/v1/tenants/{name}`, kept
/// in the manifest as [`crate::store::TenantSpec`]). A new tenant setting is a field here, and
/// both accept it. `R` is how a route (a host or a path) is held: with its place in the config
/// file (`Spanned<String>`, so errors name the line) or plain (`String`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantSettings<R> {
    /// Host names routed here: exact (`api.example.com`) or wildcard (`*.example.com`).
    /// Empty means any host.
    #[serde(default = "Vec::new")]
    pub hosts: Vec<R>,
    /// Path prefixes routed here (`/api` matches `/api` and `/api/...`). Empty means `/`.
    #[serde(default = "Vec::new")]
    pub paths: Vec<R>,
    /// Environment variables the tenant's guests see (and no others).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Per-request limits (any field left out keeps its default).
    #[serde(default)]
    pub limits: LimitsConfig,
    /// What its guests may call (outbound requests of every guest kind): nothing unless listed
    /// here.
    #[serde(default)]
    pub outbound: OutboundConfig,
    /// What clients see when one of its requests fails: `detailed` (the reason: trap kind,
    /// limit, ...) or `minimal` (the status and the request id only).
    #[serde(default)]
    pub errors: ErrorDetail,
    /// Custom bodies of error responses by status (`"503" = "<html>...</html>"`): HTML if the
    /// body starts with `<`, else plain text; `{request_id}` in it becomes the request's id.
    #[serde(default)]
    pub error_pages: BTreeMap<String, String>,
    /// Answer its requests on the cleartext listener with `308 Permanent Redirect` to the same
    /// URL over HTTPS (the TLS listener's port, or `server.public_https_port`); HTTPS
    /// requests are served. Needs `server.tls_listen`.
    #[serde(default)]
    pub https_redirect: bool,
    /// The key-value stores its guests may open, by name (`[kv.NAME]`; `default` is always
    /// there). None unless listed.
    #[serde(default = "Vec::new", skip_serializing_if = "Vec::is_empty")]
    pub kv: Vec<String>,
    /// `Strict-Transport-Security` on its HTTPS responses (never on cleartext ones): browsers
    /// then refuse plain HTTP to its hosts for `max_age_seconds`. Unset: none is added.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hsts: Option<HstsConfig>,
}

/// `[tenant.hsts]`: HTTP Strict Transport Security (RFC 6797). Sticky: a browser that saw it
/// keeps refusing plain HTTP to the host until `max_age_seconds` passes, even if it is removed
/// here (a `max_age_seconds = 0` sent over HTTPS clears it); `include_subdomains` covers every
/// name under the host, `preload` asks to be built into browsers (hard to undo).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct HstsConfig {
    /// How long browsers keep it, in seconds (0: forget it; at most two years).
    pub max_age_seconds: u64,
    /// Also for every subdomain of the host.
    #[serde(default)]
    pub include_subdomains: bool,
    /// The `preload` token (hstspreload.org requires `include_subdomains` and a max age of at
    /// least a year).
    #[serde(default)]
    pub preload: bool,
}

/// Ceiling of `hsts.max_age_seconds`: two years, what browsers' preload lists ask for at most.
pub const MAX_HSTS_SECONDS: u64 = 2 * 365 * 24 * 3600;

impl HstsConfig {
    /// The header's value.
    pub fn value(&self) -> String {
        let mut v = format!("max-age={}", self.max_age_seconds);
        if self.include_subdomains {
            v.push_str("; includeSubDomains");
        }
        if self.preload {
            v.push_str("; preload");
        }
        v
    }

    /// Checks it.
    ///
    /// # Errors
    /// A max age over [`MAX_HSTS_SECONDS`], or `preload` without what preloading needs.
    pub fn check(&self) -> Result<(), String> {
        if self.max_age_seconds > MAX_HSTS_SECONDS {
            return Err(format!(
                "hsts.max_age_seconds must be at most {MAX_HSTS_SECONDS} (two years), not {}",
                self.max_age_seconds
            ));
        }
        if self.preload && (!self.include_subdomains || self.max_age_seconds < 31_536_000) {
            return Err(
                "hsts.preload needs include_subdomains = true and max_age_seconds of at least \
                 31536000 (one year), as browsers' preload lists require"
                    .into(),
            );
        }
        Ok(())
    }
}

impl<R> Default for TenantSettings<R> {
    fn default() -> Self {
        Self {
            hosts: Vec::new(),
            paths: Vec::new(),
            env: BTreeMap::new(),
            limits: LimitsConfig::default(),
            outbound: OutboundConfig::default(),
            errors: ErrorDetail::default(),
            error_pages: BTreeMap::new(),
            https_redirect: false,
            kv: Vec::new(),
            hsts: None,
        }
    }
}

impl<R> TenantSettings<R> {
    /// The same settings with each route held as `f` makes it.
    pub fn map_routes<Q>(&self, f: impl Fn(&R) -> Q) -> TenantSettings<Q> {
        let Self {
            hosts,
            paths,
            env,
            limits,
            outbound,
            errors,
            error_pages,
            https_redirect,
            kv,
            hsts,
        } = self;
        TenantSettings {
            hosts: hosts.iter().map(&f).collect(),
            paths: paths.iter().map(&f).collect(),
            env: env.clone(),
            limits: limits.clone(),
            outbound: outbound.clone(),
            errors: *errors,
            error_pages: error_pages.clone(),
            https_redirect: *https_redirect,
            kv: kv.clone(),
            hsts: hsts.clone(),
        }
    }
}

/// The keys of a `[[tenant]]` table that are the file's own, not [`TenantSettings`].
const FILE_ONLY: [&str; 4] = ["name", "module", "kind", "assets"];

/// The keys of [`TenantSettings`], as the file and the admin API write them (a unit test holds
/// this list to the struct).
pub const SETTINGS_KEYS: [&str; 10] = [
    "hosts",
    "paths",
    "env",
    "limits",
    "outbound",
    "errors",
    "error_pages",
    "https_redirect",
    "kv",
    "hsts",
];

/// Every key of a `[[tenant]]` table, for the message about an unknown one: the file's own,
/// then the settings'.
const TENANT_KEYS: [&str; FILE_ONLY.len() + SETTINGS_KEYS.len()] = {
    let mut keys = [""; FILE_ONLY.len() + SETTINGS_KEYS.len()];
    let mut i = 0;
    while i < keys.len() {
        keys[i] = if i < FILE_ONLY.len() {
            FILE_ONLY[i]
        } else {
            SETTINGS_KEYS[i - FILE_ONLY.len()]
        };
        i += 1;
    }
    keys
};

impl<'de> Deserialize<'de> for TenantConfig {
    /// A `[[tenant]]` table: the file's own keys taken here, every other key handed to
    /// [`TenantSettings`]' own deserializer as the table's next key. (`serde(flatten)` would
    /// buffer the table: `deny_unknown_fields` and the spans of `Spanned` values, which name the
    /// line of a bad value, would be lost.)
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(FileTenant)
    }
}

/// Reads a `[[tenant]]` table.
struct FileTenant;

/// The file's own keys of a `[[tenant]]` table, as they are read.
#[derive(Default)]
struct FileOnly {
    name: Option<Spanned<String>>,
    module: Option<Spanned<String>>,
    kind: Option<GuestKind>,
    assets: Option<Spanned<String>>,
}

impl<'de> serde::de::Visitor<'de> for FileTenant {
    type Value = TenantConfig;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a [[tenant]] table")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<TenantConfig, A::Error> {
        use serde::de::Error;
        let mut own = FileOnly::default();
        let settings =
            TenantSettings::deserialize(serde::de::value::MapAccessDeserializer::new(Settings {
                map,
                own: &mut own,
            }))?;
        Ok(TenantConfig {
            name: own.name.ok_or_else(|| A::Error::missing_field("name"))?,
            module: own
                .module
                .ok_or_else(|| A::Error::missing_field("module"))?,
            kind: own.kind,
            assets: own.assets,
            settings,
        })
    }
}

/// A `[[tenant]]` table as [`TenantSettings`] sees it: the file's own keys are taken into `own`
/// on the way.
struct Settings<'a, A> {
    map: A,
    own: &'a mut FileOnly,
}

/// A key of a `[[tenant]]` table: the file's own (with the unused seed `K` handed back), or
/// one for [`TenantSettings`].
enum Key<K, V> {
    Own(&'static str, K),
    Setting(V),
}

/// Reads a key of a `[[tenant]]` table; a settings key goes to `K`, inside the file's own key
/// deserializer (so an unknown key's error names its line).
struct KeySeed<K>(K);

impl<'de, K: serde::de::DeserializeSeed<'de>> serde::de::DeserializeSeed<'de> for KeySeed<K> {
    type Value = Key<K, K::Value>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de, K: serde::de::DeserializeSeed<'de>> serde::de::Visitor<'de> for KeySeed<K> {
    type Value = Key<K, K::Value>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<Self::Value, E> {
        use serde::de::IntoDeserializer;
        match FILE_ONLY.iter().find(|k| **k == key) {
            Some(own) => Ok(Key::Own(own, self.0)),
            None if TENANT_KEYS.contains(&key) => self
                .0
                .deserialize(key.into_deserializer())
                .map(Key::Setting),
            None => Err(E::unknown_field(key, &TENANT_KEYS)),
        }
    }
}

impl<'de, A: serde::de::MapAccess<'de>> serde::de::MapAccess<'de> for Settings<'_, A> {
    type Error = A::Error;

    fn next_key_seed<K: serde::de::DeserializeSeed<'de>>(
        &mut self,
        mut seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        loop {
            let own = match self.map.next_key_seed(KeySeed(seed))? {
                None => return Ok(None),
                Some(Key::Setting(key)) => return Ok(Some(key)),
                Some(Key::Own(own, unused)) => {
                    seed = unused;
                    own
                }
            };
            match own {
                "name" => self.own.name = Some(self.map.next_value()?),
                "module" => self.own.module = Some(self.map.next_value()?),
                "kind" => self.own.kind = Some(self.map.next_value()?),
                _ => self.own.assets = Some(self.map.next_value()?),
            }
        }
    }

    fn next_value_seed<V: serde::de::DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, A::Error> {
        self.map.next_value_seed(seed)
    }
}

/// How a guest takes its request and gives its answer (`kind` of a tenant, `tern deploy
/// --kind`). Detected from the module when not given: a component exporting
/// `wasi:http/incoming-handler` is `wasi-http`; a core module importing from `tern` is `tern`;
/// any other WASI command (`_start`) is `cgi`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum GuestKind {
    /// Tern's own ABI v1 (the guest SDK, `tern.h`): a fresh instance's `_start` per request.
    Tern,
    /// A `wasi:http` proxy component (`wasmtime serve`, Spin, wasmCloud): its
    /// `wasi:http/incoming-handler.handle` per request.
    WasiHttp,
    /// A WASI preview1 program run as CGI (RFC 3875): the request in its environment and on
    /// stdin, the response (a header block, a blank line, the body) on stdout.
    Cgi,
}

impl GuestKind {
    /// Every kind, in the order the docs list them.
    pub const ALL: [GuestKind; 3] = [Self::Tern, Self::WasiHttp, Self::Cgi];

    /// The name used in config files, the admin API and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Self::Tern => "tern",
            Self::WasiHttp => "wasi-http",
            Self::Cgi => "cgi",
        }
    }
}

impl std::str::FromStr for GuestKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| format!("unknown guest kind {s:?} (kinds: tern, wasi-http, cgi)"))
    }
}

/// How much an error response says (`errors` of a tenant).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ErrorDetail {
    /// The reason (trap kind, limit, ...) and the request id.
    #[default]
    Detailed,
    /// The status and the request id; nothing about the guest or its limits.
    Minimal,
    /// As `detailed`, plus what the guest wrote to stderr (a panic's message): for
    /// development (`tern dev`), never for clients you do not trust.
    Dev,
}

/// A value validation refused: what is wrong, and where in the config file (when it came from
/// one) so the message can name the line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    /// Byte range of the offending value in the file, if known.
    pub span: Option<std::ops::Range<usize>>,
    /// What is wrong.
    pub message: String,
}

use crate::ceilings::{
    self, MAX_BODY_BYTES, MAX_ERROR_PAGE_BYTES, MAX_ERROR_PAGES, MAX_LOG_LINES_PER_SEC,
    MAX_RESPONSE_HEADERS, MAX_STDIO_BYTES, MAX_TIMEOUT_MS,
};

/// `[tenant.limits]`: what one request of this tenant may use.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Wall-clock budget of a request's guest (instantiate + run), in ms; past it: `504`.
    pub timeout_ms: u64,
    /// Largest linear memory, in MiB; growth past it fails as the Wasm spec allows.
    /// Unset: `pool.max_memory_mib`.
    pub max_memory_mib: Option<u64>,
    /// Bytes of stdout and of stderr kept per request for the log.
    pub stdio_bytes: usize,
    /// Guest output log lines per second for the whole tenant; the rest are dropped (and
    /// counted in `tern_guest_log_lines_dropped_total`), so a chatty guest cannot flood the log.
    pub log_lines_per_sec: u32,
    /// Largest response body, in bytes.
    pub max_response_bytes: u64,
    /// Most response headers a guest may set.
    pub max_response_headers: usize,
    /// Largest request body, in bytes; larger gets `413` (checked as the body streams in).
    pub max_request_bytes: u64,
    /// Most requests of this tenant running at once; `0` means three quarters of the pool, so
    /// one tenant can never take every slot.
    pub max_concurrency: u32,
    /// Most key-value operations one request's guest may make.
    #[serde(skip_serializing_if = "is_default_kv_ops")]
    pub max_kv_ops: u32,
}

/// Default of `limits.max_kv_ops`.
const DEFAULT_KV_OPS: u32 = 1000;

/// Left out of stored settings when it is the default, so replicas of a fleet that predate it
/// still read them.
fn is_default_kv_ops(n: &u32) -> bool {
    *n == DEFAULT_KV_OPS
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            timeout_ms: 1000,
            max_memory_mib: None,
            stdio_bytes: 64 * 1024,
            log_lines_per_sec: 50,
            max_response_bytes: 64 * 1024 * 1024,
            max_response_headers: 100,
            max_request_bytes: 16 * 1024 * 1024,
            max_concurrency: 0,
            max_kv_ops: DEFAULT_KV_OPS,
        }
    }
}

impl Config {
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
        if self.server.max_connections == 0 || self.server.header_read_timeout_ms == 0 {
            return whole("server.max_connections and server.header_read_timeout_ms must be > 0");
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
        self.validate_tls()?;
        self.validate_registry()?;
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

impl Config {
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
        self.validate_tls()
            .map_err(|e| anyhow::anyhow!("--tls-cert: {}", e.message))
    }

    /// The TLS listener has certificates and they have it; a host is served by one certificate;
    /// at most one default. (The files are read when the listener starts: [`crate::tls`].)
    /// Uses the shared registry at `url` (`tern serve --registry`).
    ///
    /// # Errors
    /// If it is not a registry URL.
    pub fn set_registry(&mut self, url: String) -> anyhow::Result<()> {
        self.registry.url = url;
        self.validate_registry()
            .map_err(|e| anyhow::anyhow!("--registry: {}", e.message))
    }

    fn validate_registry(&self) -> Result<(), Invalid> {
        let r = &self.registry;
        let bad = |message: String| {
            Err(Invalid {
                span: None,
                message,
            })
        };
        if r.poll_interval_ms == 0 {
            return bad("registry.poll_interval_ms must be > 0".into());
        }
        if !(r.advertise.is_empty() || r.advertise.starts_with("http://")) {
            return bad(format!(
                "registry.advertise: {:?} is not an http:// URL of this replica's admin listener",
                r.advertise
            ));
        }
        if !(r.url.is_empty() || r.url.starts_with("s3://")) {
            return bad(format!(
                "registry.url: {:?} is not an s3://bucket/prefix URL (leave it empty for the \
                 data directory alone)",
                r.url
            ));
        }
        Ok(())
    }

    fn validate_tls(&self) -> Result<(), Invalid> {
        let at =
            |span: Option<std::ops::Range<usize>>, message: String| Err(Invalid { span, message });
        let server = &self.server;
        // A TLS listener without [[certificate]]s serves the data directory's (uploaded with
        // `tern cert put`, or obtained by [tls.acme]).
        if server.tls_listen.is_none()
            && let Some(c) = self.certificates.first()
        {
            return at(
                Some(c.cert.span()),
                "[[certificate]] is served by the TLS listener: set server.tls_listen \
                 (e.g. \"0.0.0.0:8443\")"
                    .into(),
            );
        }
        let acme = self.tls.acme.as_ref();
        if server.listen.is_none() && server.tls_listen.is_none() {
            return at(
                None,
                "server.listen is \"off\" and there is no server.tls_listen: nothing would \
                 serve the tenants"
                    .into(),
            );
        }
        if let Some(acme) = acme {
            if server.tls_listen.is_none() {
                return at(
                    Some(acme.directory.span()),
                    "[tls.acme] certificates are served by the TLS listener: set \
                     server.tls_listen (e.g. \"0.0.0.0:443\")"
                        .into(),
                );
            }
            let url = acme.directory.get_ref();
            if !(url.starts_with("https://") || url.starts_with("http://")) {
                return at(
                    Some(acme.directory.span()),
                    format!("tls.acme.directory: {url:?} is not an http(s) URL"),
                );
            }
            if acme.challenge == AcmeChallenge::Http01 && server.listen.is_none() {
                return at(
                    Some(acme.directory.span()),
                    "tls.acme.challenge = \"http-01\" is answered on the cleartext listener, \
                     and server.listen is \"off\": use \"tls-alpn-01\""
                        .into(),
                );
            }
            if acme.check_interval_seconds == 0 || acme.retry_seconds == 0 {
                return at(
                    Some(acme.directory.span()),
                    "tls.acme.check_interval_seconds and tls.acme.retry_seconds must be > 0".into(),
                );
            }
            for h in &acme.hosts {
                if let Err(m) = acme_name(h.get_ref()) {
                    return at(Some(h.span()), format!("tls.acme.hosts: {m}"));
                }
            }
        }
        if server.tls_handshake_timeout_ms == 0 || server.max_tls_handshakes == 0 {
            return at(
                None,
                "server.tls_handshake_timeout_ms and server.max_tls_handshakes must be > 0".into(),
            );
        }
        let mut seen = std::collections::HashSet::new();
        let mut default = None;
        for c in &self.certificates {
            if c.hosts.is_empty()
                && let Some(first) = default.replace(&c.cert)
            {
                return at(
                    Some(c.cert.span()),
                    format!(
                        "a second default certificate (no `hosts`): {:?} is the default \
                             already; give this one `hosts`",
                        first.get_ref()
                    ),
                );
            }
            for h in &c.hosts {
                if h.get_ref() == "*" {
                    return at(
                        Some(h.span()),
                        "certificate hosts: \"*\" is not a name; leave `hosts` out for the \
                         default certificate"
                            .into(),
                    );
                }
                if let Err(m) = crate::router::HostPattern::parse(h.get_ref()) {
                    return at(Some(h.span()), format!("certificate hosts: {m}"));
                }
                if !seen.insert(h.get_ref().to_ascii_lowercase()) {
                    return at(
                        Some(h.span()),
                        format!(
                            "certificate hosts: {:?} is served by two certificates",
                            h.get_ref()
                        ),
                    );
                }
            }
        }
        Ok(())
    }
}

/// Checks one tenant's name, module, routes, limits and env (not clashes with other tenants).
///
/// # Errors
/// The span of the offending value (if known) and a message naming the field.
pub fn validate_tenant(t: &TenantConfig, pool: &PoolConfig) -> Result<(), Invalid> {
    let name = t.name.get_ref();
    let here = |s: &Spanned<String>, m: String| {
        Err(Invalid {
            span: Some(s.span()),
            message: m,
        })
    };
    if name.is_empty()
        || name.len() > 64
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return here(
            &t.name,
            format!("tenant.name {name:?} must be 1-64 letters, digits, '-' or '_'"),
        );
    }
    if name == "other" || name == "none" {
        return here(
            &t.name,
            format!("tenant.name {name:?} is reserved for metrics"),
        );
    }
    if t.module.get_ref().is_empty() {
        return here(
            &t.module,
            format!("tenant {name:?}: module must not be empty"),
        );
    }
    for h in &t.settings.hosts {
        if let Err(m) = crate::router::HostPattern::parse(h.get_ref()) {
            return here(h, format!("tenant {name:?}: hosts: {m}"));
        }
    }
    for p in &t.settings.paths {
        if let Err(m) = crate::router::check_prefix(p.get_ref()) {
            return here(p, format!("tenant {name:?}: paths: {m}"));
        }
    }
    if let Some(Err(m)) = t.settings.hsts.as_ref().map(HstsConfig::check) {
        return here(&t.name, format!("tenant {name:?}: {m}"));
    }
    for (i, p) in t.settings.paths.iter().enumerate() {
        let prefix = crate::router::normalise_prefix(p.get_ref());
        if t.settings.paths[..i]
            .iter()
            .any(|q| crate::router::normalise_prefix(q.get_ref()) == prefix)
        {
            return here(
                p,
                format!("tenant {name:?}: paths: {prefix:?} is listed twice"),
            );
        }
    }
    for (i, h) in t.settings.hosts.iter().enumerate() {
        if t.settings.hosts[..i]
            .iter()
            .any(|g| g.get_ref().eq_ignore_ascii_case(h.get_ref()))
        {
            return here(
                h,
                format!("tenant {name:?}: hosts: {:?} is listed twice", h.get_ref()),
            );
        }
    }
    let l = &t.settings.limits;
    // Every limit has a ceiling: a limit of "practically unbounded" is no limit.
    if let Err(why) = ceilings::check(&[
        ("limits.timeout_ms", l.timeout_ms, 1, MAX_TIMEOUT_MS),
        (
            "limits.stdio_bytes",
            l.stdio_bytes as u64,
            0,
            MAX_STDIO_BYTES,
        ),
        (
            "limits.log_lines_per_sec",
            u64::from(l.log_lines_per_sec),
            0,
            MAX_LOG_LINES_PER_SEC,
        ),
        (
            "limits.max_response_bytes",
            l.max_response_bytes,
            0,
            MAX_BODY_BYTES,
        ),
        (
            "limits.max_response_headers",
            l.max_response_headers as u64,
            0,
            MAX_RESPONSE_HEADERS,
        ),
        (
            "limits.max_request_bytes",
            l.max_request_bytes,
            0,
            MAX_BODY_BYTES,
        ),
        (
            "limits.max_concurrency",
            u64::from(l.max_concurrency),
            0,
            u64::from(pool.instances),
        ),
        (
            "limits.max_kv_ops",
            u64::from(l.max_kv_ops),
            0,
            ceilings::MAX_KV_OPS,
        ),
    ]) {
        return here(&t.name, format!("tenant {name:?}: {why}"));
    }
    if t.settings.error_pages.len() > MAX_ERROR_PAGES {
        return here(
            &t.name,
            format!("tenant {name:?}: at most {MAX_ERROR_PAGES} error_pages"),
        );
    }
    for (status, page) in &t.settings.error_pages {
        if !status
            .parse::<u16>()
            .is_ok_and(|s| (400..=599).contains(&s))
        {
            return here(
                &t.name,
                format!("tenant {name:?}: error_pages key {status:?} is not a status 400-599"),
            );
        }
        if page.len() > MAX_ERROR_PAGE_BYTES {
            return here(
                &t.name,
                format!(
                    "tenant {name:?}: error_pages.{status} is larger than {MAX_ERROR_PAGE_BYTES} bytes"
                ),
            );
        }
    }
    for (i, store) in t.settings.kv.iter().enumerate() {
        if !crate::kv::valid_name(store) {
            return here(
                &t.name,
                format!("tenant {name:?}: kv: {store:?} is not a store name (a-z, 0-9, '-', '_')"),
            );
        }
        if t.settings.kv[..i].contains(store) {
            return here(
                &t.name,
                format!("tenant {name:?}: kv: {store:?} is listed twice"),
            );
        }
    }
    if let Err(m) = crate::outbound::check_config(&t.settings.outbound) {
        return here(&t.name, format!("tenant {name:?}: outbound: {m}"));
    }
    let mem = l.max_memory_mib.unwrap_or(pool.max_memory_mib);
    if mem == 0 || mem > pool.max_memory_mib {
        return here(
            &t.name,
            format!(
                "tenant {name:?}: limits.max_memory_mib must be between 1 and \
         pool.max_memory_mib ({})",
                pool.max_memory_mib
            ),
        );
    }
    for (k, v) in &t.settings.env {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return here(
                &t.name,
                format!("tenant {name:?}: env name {k:?} is invalid"),
            );
        }
        if v.contains('\0') {
            return here(
                &t.name,
                format!("tenant {name:?}: env {k:?}: a value may not contain NUL"),
            );
        }
    }
    Ok(())
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

/// Whether `name` is a host name a CA can issue a certificate for by HTTP-01 or TLS-ALPN-01:
/// a DNS name with a dot, no wildcard, no IP address, no port.
///
/// # Errors
/// Why it is not.
pub fn acme_name(name: &str) -> Result<(), String> {
    if name.contains('*') {
        return Err(format!(
            "{name:?}: a wildcard needs DNS validation, which Tern does not do; give it a \
             [[certificate]]"
        ));
    }
    if name.parse::<std::net::IpAddr>().is_ok() || name.contains(':') {
        return Err(format!("{name:?}: not a DNS name (an address or a port)"));
    }
    let labels_ok = name.split('.').all(|l| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    });
    if !name.contains('.') || !labels_ok || name.len() > 253 {
        return Err(format!(
            "{name:?}: not a public DNS name a CA can issue for (letters, digits, `-`, at least \
             one dot)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hsts_is_checked_and_rendered_as_browsers_read_it() {
        let h = |max_age_seconds, include_subdomains, preload| HstsConfig {
            max_age_seconds,
            include_subdomains,
            preload,
        };
        assert_eq!(h(300, false, false).value(), "max-age=300");
        assert_eq!(
            h(31_536_000, true, true).value(),
            "max-age=31536000; includeSubDomains; preload"
        );
        assert!(h(0, false, false).check().is_ok(), "0 clears it");
        assert!(h(MAX_HSTS_SECONDS, false, false).check().is_ok());
        assert!(h(MAX_HSTS_SECONDS + 1, false, false).check().is_err());
        assert!(h(31_536_000, true, true).check().is_ok());
        assert!(
            h(31_535_999, true, true).check().is_err(),
            "a year at least"
        );
        assert!(
            h(31_536_000, false, true).check().is_err(),
            "subdomains needed"
        );
        let e = err(
            "[[tenant]]\nname = \"t\"\nmodule = \"builtin:hello\"\n[tenant.hsts]\n\
             max_age_seconds = 10\npreload = true\n",
        );
        assert!(e.contains("hsts.preload"), "{e}");
    }

    #[test]
    fn acme_names_are_dns_names_without_wildcards_addresses_or_ports() {
        assert!(acme_name("a.example.com").is_ok());
        assert!(acme_name("xn--bcher-kva.example").is_ok());
        for bad in [
            "*.example.com",
            "127.0.0.1",
            "::1",
            "a.test:443",
            "localhost",
            "-a.test",
            "a..test",
            "a_b.test",
        ] {
            assert!(acme_name(bad).is_err(), "{bad}");
        }
    }

    fn err(text: &str) -> String {
        Config::parse(text, "t.toml", PathBuf::new())
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn memory_slots_are_as_many_as_instances_or_more() {
        let slots = |text: &str| {
            Config::parse(text, "t.toml", PathBuf::new())
                .unwrap()
                .pool
                .memory_slots()
        };
        assert_eq!(slots(""), 256);
        assert_eq!(slots("[pool]\ninstances = 8\n"), 8);
        assert_eq!(slots("[pool]\ninstances = 8\nmemory_slots = 8\n"), 8);
        assert_eq!(slots("[pool]\ninstances = 8\nmemory_slots = 9\n"), 9);
        let max = format!("[pool]\nmemory_slots = {MAX_MEMORY_SLOTS}\n");
        assert_eq!(slots(&max), MAX_MEMORY_SLOTS);
        for bad in [
            "[pool]\ninstances = 8\nmemory_slots = 7\n".to_string(),
            format!("[pool]\nmemory_slots = {}\n", MAX_MEMORY_SLOTS + 1),
        ] {
            assert!(
                err(&bad).contains("pool.memory_slots must be 0 (as many as pool.instances) or"),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_shared_registry_is_an_s3_url_polled_at_a_positive_interval() {
        let ok = Config::parse(
            "[registry]\nurl = \"s3://bucket/prefix\"\npoll_interval_ms = 250\n",
            "t.toml",
            PathBuf::new(),
        )
        .unwrap();
        assert_eq!(ok.registry.shared_url(), Some("s3://bucket/prefix"));
        assert_eq!(ok.registry.poll_interval_ms, 250);
        assert_eq!(Config::demo().registry.shared_url(), None);
        assert!(err("[registry]\nurl = \"ftp://x/y\"\n").contains("not an s3://bucket/prefix URL"));
        assert!(err("[registry]\npoll_interval_ms = 0\n").contains("must be > 0"));
        assert!(err("[registry]\nurls = \"s3://b\"\n").contains("unknown field"));
        assert!(err("[registry]\nadvertise = \"10.0.0.5:9090\"\n").contains("not an http:// URL"));
        let wildcard: std::net::SocketAddr = "0.0.0.0:9090".parse().unwrap();
        let bound: std::net::SocketAddr = "10.0.0.5:9090".parse().unwrap();
        if std::env::var_os("TERN_ADVERTISE_URL").is_none() {
            assert_eq!(ok.registry.advertise_url(wildcard), None);
            assert_eq!(
                ok.registry.advertise_url(bound).as_deref(),
                Some("http://10.0.0.5:9090")
            );
        }
        let mut set = ok.registry.clone();
        set.advertise = "http://tern-0.tern:9090/".into();
        assert_eq!(
            set.advertise_url(wildcard).as_deref(),
            Some("http://tern-0.tern:9090")
        );
        let mut c = Config::demo();
        assert!(
            c.set_registry("http://x".into())
                .unwrap_err()
                .to_string()
                .starts_with("--registry:")
        );
        c.set_registry("s3://b/p".into()).unwrap();
        assert_eq!(c.registry.shared_url(), Some("s3://b/p"));
    }

    /// The `tern.toml` of a Kubernetes manifest's ConfigMap: the block under `tern.toml: |`.
    fn configmap_toml(manifest: &str) -> String {
        let mut lines = manifest
            .lines()
            .skip_while(|l| l.trim() != "tern.toml: |")
            .skip(1);
        let first = lines.next().expect("a tern.toml block");
        let indent = first.len() - first.trim_start().len();
        std::iter::once(first)
            .chain(lines.take_while(|l| l.trim().is_empty() || l.starts_with(&" ".repeat(indent))))
            .map(|l| l.get(indent..).unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn the_kubernetes_manifests_carry_a_valid_config() {
        let single = configmap_toml(include_str!("../../../deploy/kubernetes/tern.yaml"));
        let c = Config::parse(&single, "tern.yaml", PathBuf::new()).unwrap();
        assert_eq!(c.registry.shared_url(), None);
        assert_eq!(c.tenants.len(), 1);
        let fleet = configmap_toml(include_str!(
            "../../../deploy/kubernetes/fleet/tern-fleet.yaml"
        ));
        let c = Config::parse(&fleet, "tern-fleet.yaml", PathBuf::new()).unwrap();
        assert_eq!(
            c.registry.shared_url(),
            Some("s3://tern-registry/production")
        );
        assert!(
            c.tenants.is_empty(),
            "a fleet's tenants live in the registry"
        );
        assert_eq!(c.server.admin_listen, "0.0.0.0:9090".parse().unwrap());
    }

    #[test]
    fn demo_config_is_valid_and_routes_the_demo_tenants() {
        let c = Config::demo();
        let names: Vec<&str> = c
            .tenants
            .iter()
            .map(|t| t.name.get_ref().as_str())
            .collect();
        assert_eq!(
            names,
            [
                "hello",
                "echo",
                "json",
                "component",
                "cgi",
                "visits",
                "counter"
            ]
        );
        assert_eq!(c.server.listen, Some("127.0.0.1:8080".parse().unwrap()));
    }

    #[test]
    fn syntax_errors_name_file_and_line() {
        assert!(
            err("[server]\nlisten = \n").starts_with("t.toml:2:"),
            "{}",
            err("[server]\nlisten = \n")
        );
    }

    #[test]
    fn unknown_fields_are_refused_with_their_line() {
        let e = err("[pool]\ninstances = 4\nbogus = 1\n");
        assert!(e.starts_with("t.toml:3:") && e.contains("bogus"), "{e}");
    }

    #[test]
    fn route_clash_names_both_tenants_and_the_line() {
        let e = err(
            "[[tenant]]\nname = \"a\"\nmodule = \"a.wasm\"\npaths = [\"/x\"]\n\
             [[tenant]]\nname = \"b\"\nmodule = \"b.wasm\"\npaths = [\"/x/\"]\n",
        );
        assert!(
            e.starts_with("t.toml:8:") && e.contains("\"a\"") && e.contains("\"b\""),
            "{e}"
        );
    }

    #[test]
    fn bad_prefix_and_host_are_refused() {
        let e = err("[[tenant]]\nname = \"a\"\nmodule = \"a.wasm\"\npaths = [\"x\"]\n");
        assert!(e.starts_with("t.toml:4:") && e.contains("paths"), "{e}");
        let e = err("[[tenant]]\nname = \"a\"\nmodule = \"a.wasm\"\nhosts = [\"a.*.com\"]\n");
        assert!(e.starts_with("t.toml:4:") && e.contains("hosts"), "{e}");
    }

    #[test]
    fn a_tenant_table_reads_its_own_keys_and_the_shared_settings_with_their_lines() {
        let c = Config::parse(
            "[[tenant]]\nhosts = [\"a.example\"]\nname = \"a\"\nenv = { K = \"v\" }\n\
             module = \"a.wasm\"\nkind = \"cgi\"\nassets = \"www\"\n\
             [tenant.limits]\ntimeout_ms = 7\n",
            "t.toml",
            PathBuf::new(),
        )
        .unwrap();
        let t = &c.tenants[0];
        assert_eq!(
            (t.name.get_ref().as_str(), t.module.get_ref().as_str()),
            ("a", "a.wasm")
        );
        assert_eq!(
            (t.kind, t.assets.as_ref().map(|a| a.get_ref().as_str())),
            (Some(GuestKind::Cgi), Some("www"))
        );
        assert_eq!(t.settings.hosts[0].get_ref(), "a.example");
        assert_eq!(t.settings.env["K"], "v");
        assert_eq!(t.settings.limits.timeout_ms, 7);
        // Spans reach through to the shared settings: a route names its line.
        assert_eq!(
            t.settings.hosts[0].span().start,
            "[[tenant]]\nhosts = [".len()
        );
        let unknown = err("[[tenant]]\nname = \"a\"\nmodule = \"a.wasm\"\nmodul = 1\n");
        assert!(
            unknown.starts_with("t.toml:4:")
                && unknown.contains("`modul`, expected one of `name`, `module`"),
            "{unknown}"
        );
        let bad =
            err("[[tenant]]\nname = \"a\"\nmodule = \"a.wasm\"\nlimits = { timeout_ms = \"x\" }\n");
        assert!(
            bad.starts_with("t.toml:4:") && bad.contains("expected u64"),
            "{bad}"
        );
        let missing = err("[[tenant]]\nmodule = \"a.wasm\"\n");
        assert!(missing.contains("missing field `name`"), "{missing}");
    }

    #[test]
    fn the_tenant_key_list_is_the_file_keys_and_the_settings_keys() {
        // serde names a struct's fields when it refuses an unknown one.
        let e = serde_json::from_str::<TenantSettings<String>>(r#"{"zz": 1}"#)
            .unwrap_err()
            .to_string();
        let listed: Vec<&str> = e.split('`').skip(3).step_by(2).collect();
        assert_eq!(listed, SETTINGS_KEYS, "{e}");
        assert_eq!(TENANT_KEYS[..FILE_ONLY.len()], FILE_ONLY);
        assert_eq!(TENANT_KEYS[FILE_ONLY.len()..], SETTINGS_KEYS);
    }

    #[test]
    fn tenant_memory_limit_must_fit_the_pool() {
        let e = err(
            "[pool]\nmax_memory_mib = 64\n[[tenant]]\nname = \"a\"\nmodule = \"a.wasm\"\n\
             [tenant.limits]\nmax_memory_mib = 128\n",
        );
        assert!(e.contains("max_memory_mib"), "{e}");
    }
}
