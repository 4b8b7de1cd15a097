//! `[[tenant]]`: a tenant's module, kind, routes, limits and the settings the admin API shares; its validation.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use toml::Spanned;

use super::invalid::Invalid;
use super::pool::PoolConfig;
use crate::outbound::OutboundConfig;

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
    /// `[tenant.variables]`: what its guests read as variables (Spin's, `wasi:config`, a CGI
    /// program's environment), plain or secrets from the server's environment or files.
    pub variables: std::collections::BTreeMap<String, crate::variables::Declared>,
    /// Whose key-value data its guests reach: a tenant of the admin API's, its name and id
    /// ([`crate::datadir::StoredTenant::data_key`]); `None`, a config file's tenant: its name.
    pub data: Option<std::sync::Arc<str>>,
    /// Routes, environment, limits, outbound policy, error responses.
    pub settings: TenantSettings<Spanned<String>>,
}

/// What a tenant is besides its code, wherever it is declared: in a `[[tenant]]` table of the
/// config file ([`TenantConfig`]) or through the admin API (`PUT /admin/v1/tenants/{name}`, kept
/// in the manifest as [`crate::datadir::TenantSpec`]). A new tenant setting is a field here, and
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
    /// Environment variables the tenant's guests see (and no others): plain text, or `{
    /// variable = "name" }` for the value of one of its variables (a secret stays out of the
    /// spec).
    #[serde(default)]
    pub env: BTreeMap<String, crate::variables::EnvValue>,
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
    /// `[tenant.cache]`: its answers cached in front of its guests by their HTTP caching
    /// headers (off unless `enabled`).
    #[serde(default, skip_serializing_if = "crate::cache::CacheConfig::is_default")]
    pub cache: crate::cache::CacheConfig,
    /// `[tenant.compression]`: its answers compressed for clients that accept it (on by
    /// default for text types).
    #[serde(
        default,
        skip_serializing_if = "crate::compress::CompressionConfig::is_default"
    )]
    pub compression: crate::compress::CompressionConfig,
    /// `[[tenant.rate_limit]]`: requests counted per client (or header, query parameter,
    /// tenant) and refused past a rate, before the cache and any guest.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rate_limit: Vec<crate::ratelimit::LimitConfig>,
    /// `[[tenant.rate_counter]]`: counters its guests count clients with (`check_rate`,
    /// `lookup_rate`, `lookup_count`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rate_counter: Vec<crate::ratelimit::counters::TableConfig>,
    /// `[[tenant.penalty_box]]`: where its guests keep clients out for a while.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub penalty_box: Vec<crate::ratelimit::counters::TableConfig>,
    /// `[tenant.websocket]`: its WebSocket connections: handed to a backend by its guests, or
    /// held by Tern with their events sent to its guests (`mode`), and their limits.
    #[serde(
        default,
        skip_serializing_if = "crate::websocket::WebsocketConfig::is_default"
    )]
    pub websocket: crate::websocket::WebsocketConfig,
    /// `[[tenant.schedule]]`: its guest called on cron schedules, once per tick across a
    /// fleet ([`crate::schedule`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub schedule: Vec<crate::schedule::ScheduleConfig>,
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
            cache: crate::cache::CacheConfig::default(),
            compression: crate::compress::CompressionConfig::default(),
            rate_limit: Vec::new(),
            rate_counter: Vec::new(),
            penalty_box: Vec::new(),
            websocket: crate::websocket::WebsocketConfig::default(),
            schedule: Vec::new(),
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
            cache,
            compression,
            rate_limit,
            rate_counter,
            penalty_box,
            websocket,
            schedule,
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
            cache: cache.clone(),
            compression: compression.clone(),
            rate_limit: rate_limit.clone(),
            rate_counter: rate_counter.clone(),
            penalty_box: penalty_box.clone(),
            websocket: websocket.clone(),
            schedule: schedule.clone(),
        }
    }
}

/// How a guest takes its request and gives its answer (`kind` of a tenant, `tern deploy
/// --kind`). Detected from the module when not given: a component exporting
/// `wasi:http/incoming-handler` is `wasi-http`; a core module importing from `tern` is `tern`;
/// any other WASI command (`_start`) is `cgi`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize, clap::ValueEnum)]
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
    if let Err(m) = crate::variables::check_declared(&t.variables) {
        return here(&t.name, format!("tenant {name:?}: [tenant.variables]: {m}"));
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
    if let Err(m) = t.settings.cache.check() {
        return here(&t.name, format!("tenant {name:?}: {m}"));
    }
    if !t.settings.cache.enabled
        && let Some(backend) = t.settings.outbound.backends.iter().find(|(_, b)| b.cache)
    {
        return here(
            &t.name,
            format!(
                "tenant {name:?}: outbound.backends.{}.cache = true needs the tenant's cache \
                 ([tenant.cache] enabled = true): the backend's answers are kept there, within \
                 its max_mib",
                backend.0
            ),
        );
    }
    if let Err(m) = t.settings.compression.check() {
        return here(&t.name, format!("tenant {name:?}: {m}"));
    }
    if let Err(m) = crate::ratelimit::config::check_all(&t.settings.rate_limit) {
        return here(&t.name, format!("tenant {name:?}: {m}"));
    }
    if let Err(m) = t.settings.websocket.check() {
        return here(&t.name, format!("tenant {name:?}: {m}"));
    }
    let paths: Vec<&str> = t
        .settings
        .paths
        .iter()
        .map(|p| p.get_ref().as_str())
        .collect();
    if let Err(m) = crate::schedule::prepare_all(&t.settings.schedule, &paths, MAX_TIMEOUT_MS) {
        return here(&t.name, format!("tenant {name:?}: {m}"));
    }
    for (what, tables) in [
        ("rate_counter", &t.settings.rate_counter),
        ("penalty_box", &t.settings.penalty_box),
    ] {
        if let Err(m) = crate::ratelimit::counters::check_all(what, tables) {
            return here(&t.name, format!("tenant {name:?}: {m}"));
        }
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
    if let Err(e) = crate::variables::env::check_env(&t.settings.env) {
        return here(&t.name, format!("tenant {name:?}: {e}"));
    }
    Ok(())
}
