//! Tenants: a pre-linked module, its limits and environment, and its metric handles.
//!
//! Loading checks everything a request would otherwise trip over: the handler and memory
//! exports and every import. A tenant that loads is ready to instantiate with no linking.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use prometheus::IntCounter;
use wasmtime::Engine;

use crate::artifact::{self, ArtifactError, Compiled};
use crate::assets::{Assets, AssetsError};
use crate::config::{GuestKind, LimitsConfig, PoolConfig, TenantConfig};
use crate::datadir::Version;
use crate::guest::{Guest, Linked, Linkers, WasiSpec, link};
use crate::logwriter::LogBudget;
use crate::metrics::{Metrics, TenantMetrics, Undelivered};
use crate::outcome::Outcome;
use crate::teardown::MemorySweep;

pub mod front;

/// Why a tenant could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TenantError {
    /// The module file could not be compiled or loaded.
    #[error("tenant {tenant:?}: {source}")]
    Artifact {
        /// The tenant.
        tenant: String,
        /// What went wrong.
        source: ArtifactError,
    },
    /// The module does not fit ABI v1 (exports or imports).
    #[error("tenant {tenant:?}: module refused: {reason}")]
    Abi {
        /// The tenant.
        tenant: String,
        /// Which export or import is wrong.
        reason: String,
    },
    /// The module needs more than the pool or the tenant's limits give a guest.
    #[error("tenant {tenant:?}: module does not fit: {reason}")]
    DoesNotFit {
        /// The tenant.
        tenant: String,
        /// Which limit, and what the module asks for.
        reason: String,
    },
    /// The tenant's assets could not be loaded.
    #[error("tenant {tenant:?}: {source}")]
    Assets {
        /// The tenant.
        tenant: String,
        /// What went wrong.
        source: AssetsError,
    },
    /// `builtin:NAME` names no demo guest.
    #[error("tenant {tenant:?}: no built-in module {name:?} (built-ins: {known})")]
    UnknownBuiltin {
        /// The tenant.
        tenant: String,
        /// The name asked for.
        name: String,
        /// The names that exist.
        known: String,
    },
}

/// Per-request limits of a tenant.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Wall-clock budget for instantiate + run.
    pub timeout: Duration,
    /// Largest linear memory, in bytes.
    pub max_memory: usize,
    /// Largest table, in elements.
    pub max_table_elements: usize,
    /// Bytes of stdout and of stderr captured per request.
    pub stdio_bytes: usize,
    /// Largest response body.
    pub max_response_bytes: u64,
    /// Most response headers.
    pub max_response_headers: usize,
    /// Largest request body.
    pub max_request_bytes: u64,
    /// Most concurrent requests.
    pub max_concurrency: usize,
}

impl Limits {
    /// The limits `c` gives, with the pool's defaults filled in.
    pub fn from_config(c: &LimitsConfig, pool: &PoolConfig) -> Self {
        let mib = c.max_memory_mib.unwrap_or(pool.max_memory_mib);
        Self {
            timeout: Duration::from_millis(c.timeout_ms),
            max_memory: usize::try_from(mib * 1024 * 1024).unwrap_or(usize::MAX),
            max_table_elements: pool.table_elements,
            stdio_bytes: c.stdio_bytes,
            max_response_bytes: c.max_response_bytes,
            max_response_headers: c.max_response_headers,
            max_request_bytes: c.max_request_bytes,
            max_concurrency: match c.max_concurrency {
                0 => (pool.instances as usize * 3).div_ceil(4),
                n => n as usize,
            },
        }
    }
}

/// Where a tenant comes from, which decides who may change it.
#[derive(Debug, Clone)]
pub enum Origin {
    /// Declared in the config file (changed by editing it and reloading).
    Config,
    /// Created through the admin API (kept in the data directory's manifest).
    Api {
        /// The version serving.
        version: Version,
    },
}

/// Responses by status class (1xx..5xx), kept across a tenant's versions for the admin API
/// (counted per thread: every request of the tenant counts one).
#[derive(Debug, Default)]
pub struct Served([crate::metrics::Counter; 5]);

impl Served {
    /// Counts one response.
    pub fn count(&self, status: u16) {
        self.0[crate::metrics::status_class(status)].inc();
    }

    /// The counts, 1xx to 5xx.
    pub fn get(&self) -> [u64; 5] {
        std::array::from_fn(|i| self.0[i].get())
    }
}

/// A loaded tenant, shared by every request routed to it.
pub struct Tenant {
    /// Unique name.
    pub name: String,
    /// Whose it is: its name and id for a tenant of the admin API (another for a tenant
    /// created again under a deleted one's name), its name for one of the config file
    /// ([`TenantConfig::data`]). What it keeps per tenant (its key-value data, connections,
    /// counts, schedules' ledgers) and what replicas ask of each other about it go by this.
    pub data: Arc<str>,
    /// Where it comes from.
    pub origin: Origin,
    /// Host patterns routed to it (empty: any host).
    pub hosts: Vec<String>,
    /// Path prefixes routed to it (empty: `/`).
    pub paths: Vec<String>,
    /// Its read-only `/assets` directory, if it has one.
    pub assets: Option<Arc<Assets>>,
    /// Responses served, across versions.
    pub served: Arc<Served>,
    /// Its label in metrics (`other` past the label cap).
    pub label: String,
    /// Its compiled module or component (kept to re-prepare it with new settings).
    pub compiled: Compiled,
    /// The guest, pre-linked for its kind: instantiation does no import resolution or
    /// type-checking.
    pub guest: Guest,
    /// Its guests' WASI view: args, environment, captured output size.
    pub wasi: Arc<WasiSpec>,
    /// Per-request limits.
    pub limits: Limits,
    /// Request counters by status class.
    pub requests: TenantMetrics,
    /// Outcome counters, indexed by [`Outcome`].
    pub outcomes: Vec<crate::metrics::Counter>,
    /// Streamed responses that did not reach their end.
    pub undelivered: Undelivered,
    /// Permits for this tenant's concurrent requests (`limits.max_concurrency`).
    pub slots: Arc<tokio::sync::Semaphore>,
    /// Where each request's peak guest memory is recorded.
    pub memory_peak: crate::metrics::Sizes,
    /// Budget for guest output log lines.
    pub log_budget: Arc<LogBudget>,
    /// The sweep before teardown, when the dirty-page reset is in use (`crate::teardown`).
    pub sweep: Option<MemorySweep>,
    /// Whether its requests lately used their first time slice up ([`crate::guest::slice::Habit`]).
    pub slice_habit: crate::guest::slice::Habit,
    /// Its runs that used their first time slice up (`tern_guest_sliced_total`).
    pub sliced: IntCounter,
    /// What its guests are granted (outbound calls, key-value stores).
    pub grants: crate::capabilities::Grants,
    /// What the front end does for it around its guests (redirect, HSTS, error pages).
    pub front: crate::tenant::front::Front,
    /// Something about the module its author should know (shown by a deploy, logged at load).
    pub warning: Option<String>,
    /// Its live log: its last requests, and the tailers following them (kept across versions).
    pub logs: Arc<crate::livelog::Tail>,
    /// The version serving, as its live log's records name it.
    pub version_label: Arc<str>,
    /// What keys its answers in its cache apart from another version's (a candidate shares
    /// the current version's cache): from its version id; 0 for a tenant of the config file.
    pub cache_version: u64,
    /// Holds `cache_version` among the versions its cache's front answers for while it lives
    /// (a write through another version sharing the cache invalidates this one's keys too).
    pub cache_serving: Option<crate::cache::Serving>,
    /// Its schedules (`[[tenant.schedule]]`), read when it loaded.
    pub schedules: Arc<[crate::schedule::Schedule]>,
}

impl crate::logwriter::Named for Tenant {
    fn name(&self) -> &str {
        &self.name
    }

    fn version(&self) -> Option<&str> {
        self.short_version()
    }
}

impl crate::trace::SpanTenant for Tenant {
    fn name(&self) -> &str {
        &self.name
    }

    fn version(&self) -> &str {
        match &self.origin {
            Origin::Api { version } => &version.id,
            Origin::Config => "config",
        }
    }

    fn kind(&self) -> &'static str {
        Tenant::kind(self).name()
    }
}

debug_fields!(Tenant: name, limits);

impl Tenant {
    /// How its guests take a request and answer it.
    pub fn kind(&self) -> GuestKind {
        self.guest.kind()
    }

    /// Its version as `tern deploy` shows it (12 digits), `None` for a tenant of the config
    /// file: in `Server-Timing` and the access line.
    pub fn short_version(&self) -> Option<&str> {
        match self.origin {
            Origin::Api { .. } => self.version_label.get(..12).or(Some(&self.version_label)),
            Origin::Config => None,
        }
    }

    /// Counts one guest outcome.
    pub fn count_outcome(&self, o: Outcome) {
        self.outcomes[o as usize].inc();
    }

    /// Whether its guests cannot run now: a component (whose memory cannot be swept) on an
    /// engine with the dirty-page reset while a swap area switched on after start-up is active
    /// and the tenants are not yet moved to the `memset` reset (see [`crate::teardown`]).
    pub fn awaits_memset_reset(&self) -> bool {
        self.sweep.is_some()
            && matches!(self.guest, Guest::WasiHttp(_))
            && crate::teardown::swap_active()
    }
}

/// The server's parts every tenant is prepared with, whoever loads it.
#[derive(Clone, Copy)]
pub struct ServerParts<'a> {
    /// The linkers tenants are pre-linked against.
    pub linkers: &'a Linkers,
    /// The pool, whose settings fill in default limits.
    pub pool: &'a PoolConfig,
    /// Where tenants' metric handles come from.
    pub metrics: &'a Metrics,
    /// What the server holds for every tenant's capabilities (stores, variables).
    pub resources: &'a crate::capabilities::Resources,
}

/// Loads the module a tenant's config names: `builtin:NAME`, a `.wasm` or a `.cwasm` file.
/// Blocking: compiles on a cache miss. Call it off the async reactor.
///
/// # Errors
/// If the module cannot be found, compiled or loaded.
pub fn load_module(
    engine: &Engine,
    config: &TenantConfig,
    base_dir: &Path,
    cache_dir: &Path,
    pool: &PoolConfig,
) -> Result<artifact::Loaded, TenantError> {
    let tenant = config.name.get_ref().clone();
    let spec = config.module.get_ref();
    let wrap = |source| TenantError::Artifact {
        tenant: tenant.clone(),
        source,
    };
    let limits = Limits::from_config(&config.settings.limits, pool);
    let fits = |wasm: &[u8]| {
        check_fits(wasm, &limits).map_err(|reason| TenantError::DoesNotFit {
            tenant: tenant.clone(),
            reason,
        })
    };
    if let Some(name) = spec.strip_prefix("builtin:") {
        let wasm = crate::demo::module(name).ok_or_else(|| TenantError::UnknownBuiltin {
            tenant: tenant.clone(),
            name: name.to_string(),
            known: crate::demo::NAMES.join(", "),
        })?;
        if !artifact::is_component(wasm) {
            fits(wasm)?;
        }
        return artifact::load_wasm(engine, wasm, spec, cache_dir).map_err(wrap);
    }
    let path = base_dir.join(spec);
    // A `.wasm` is checked before it is compiled; a `.cwasm` holds no Wasm to check.
    if let Ok(wasm) = std::fs::read(&path)
        && wasm.starts_with(b"\0asm")
        && !artifact::is_component(&wasm)
    {
        fits(&wasm)?;
    }
    artifact::load_file(engine, &path, cache_dir).map_err(wrap)
}

/// Checks, before compiling, that `wasm` fits what a guest of a tenant with `limits` gets: one
/// memory (32-bit, not shared) starting within its memory limit and one table starting within
/// the pool's table size. Otherwise the pool refuses the compiled module at load, with a
/// message about incompatible artifacts. Bytes that do not parse are left to the compiler,
/// whose message says why.
///
/// # Errors
/// The limit and what the module asks for.
pub fn check_fits(wasm: &[u8], limits: &Limits) -> Result<(), String> {
    use wasmparser::Payload;
    let (mut memories, mut tables) = (0, 0);
    for payload in wasmparser::Parser::new(0).parse_all(wasm) {
        match payload {
            Ok(Payload::MemorySection(section)) => {
                for memory in section {
                    let Ok(m) = memory else { return Ok(()) };
                    memories += 1;
                    if m.memory64 || m.shared {
                        return Err(format!(
                            "its memory is {}; Tern gives a guest one 32-bit, unshared memory",
                            if m.memory64 { "64-bit" } else { "shared" }
                        ));
                    }
                    let page = 1u64 << m.page_size_log2.unwrap_or(16).min(16);
                    let bytes = m.initial.saturating_mul(page);
                    if bytes > limits.max_memory as u64 {
                        return Err(format!(
                            "its memory starts at {} MiB ({} pages), above this tenant's memory \
                             limit of {} MiB (`limits.max_memory_mib`, at most \
                             `pool.max_memory_mib`)",
                            bytes.div_ceil(1 << 20),
                            m.initial,
                            limits.max_memory >> 20
                        ));
                    }
                }
            }
            Ok(Payload::TableSection(section)) => {
                for table in section {
                    let Ok(t) = table else { return Ok(()) };
                    tables += 1;
                    if t.ty.initial > limits.max_table_elements as u64 {
                        return Err(format!(
                            "its table starts with {} elements, above the limit of {} \
                             (`pool.table_elements`)",
                            t.ty.initial, limits.max_table_elements
                        ));
                    }
                }
            }
            // Memories and tables are declared before the code: nothing more to read.
            Ok(Payload::CodeSectionStart { .. }) | Err(_) => break,
            Ok(_) => {}
        }
    }
    if memories > 1 {
        return Err(format!(
            "it defines {memories} memories; Tern gives a guest one"
        ));
    }
    if tables > 1 {
        return Err(format!(
            "it defines {tables} tables; Tern gives a guest one"
        ));
    }
    Ok(())
}

/// Loads the assets directory a config tenant names (relative to the config file).
///
/// # Errors
/// [`TenantError::Assets`] if it cannot be read or holds something other than files and
/// directories.
pub fn load_assets(
    config: &TenantConfig,
    base_dir: &Path,
    max_bytes: u64,
) -> Result<Option<Arc<Assets>>, TenantError> {
    let Some(dir) = &config.assets else {
        return Ok(None);
    };
    Assets::from_dir(&base_dir.join(dir.get_ref()), max_bytes)
        .map(|a| Some(Arc::new(a)))
        .map_err(|source| TenantError::Assets {
            tenant: config.name.get_ref().clone(),
            source,
        })
}

/// What a tenant keeps from the version it replaces (so a redeploy does not reset them).
#[derive(Clone, Default)]
pub struct Carried {
    /// Whose it is ([`Tenant::data`]): nothing is carried to a tenant of another.
    pub data: Option<Arc<str>>,
    /// Its concurrency permits (kept when the limit is unchanged).
    pub slots: Option<(usize, Arc<tokio::sync::Semaphore>)>,
    /// Its response counts.
    pub served: Option<Arc<Served>>,
    /// Its rate limits' counts (each kept by a limit with the same settings).
    pub rate_limits: Option<crate::ratelimit::RateLimits>,
    /// Its guests' rate counters and penalty boxes (each kept by the same declaration).
    pub counters: Option<Arc<crate::ratelimit::counters::Grant>>,
    /// Its WebSocket channels (their key: the connections open stay its own).
    pub channels: Option<Arc<crate::websocket::channels::Grant>>,
    /// Its live log (the records and the tailers following them).
    pub logs: Option<Arc<crate::livelog::Tail>>,
    /// Its cache: only a candidate shares the current version's (its own answers to clients
    /// keyed apart by version: [`Tenant::cache_version`]); a new current version starts empty.
    pub cache: Option<Arc<crate::cache::Cache>>,
}

impl Carried {
    /// What `tenant`'s successor keeps.
    pub fn from(tenant: &Tenant) -> Self {
        Self {
            data: Some(tenant.data.clone()),
            slots: Some((tenant.limits.max_concurrency, tenant.slots.clone())),
            served: Some(tenant.served.clone()),
            rate_limits: tenant.front.rate_limits.clone(),
            counters: Some(tenant.grants.counters.clone()),
            channels: Some(tenant.grants.channels.clone()),
            logs: Some(tenant.logs.clone()),
            cache: None,
        }
    }

    /// What a candidate beside `current` shares with it: everything a successor keeps, and
    /// its cache.
    pub fn for_candidate(current: &Tenant) -> Self {
        Self {
            cache: current.front.cache.clone(),
            ..Self::from(current)
        }
    }
}

/// Decides the kind of `compiled` (`asked` if the config or deploy names one, else detected),
/// checks it against what that kind needs, and pre-links it (core modules with the `/assets`
/// functions if the tenant has assets).
///
/// # Errors
/// [`TenantError::Abi`] saying what the module or component lacks or imports wrongly, or why
/// it is not of the kind asked for.
pub fn prepare(
    server: ServerParts<'_>,
    compiled: &Compiled,
    config: &TenantConfig,
    origin: Origin,
    assets: Option<Arc<Assets>>,
    carried: Carried,
) -> Result<Tenant, TenantError> {
    let ServerParts {
        linkers,
        pool,
        metrics,
        resources,
    } = server;
    let name = config.name.get_ref().clone();
    let refuse = |reason: String| TenantError::Abi {
        tenant: name.clone(),
        reason,
    };
    let Linked { guest, warning } =
        link(linkers, compiled, config.kind, assets.is_some()).map_err(refuse)?;
    if let Some(w) = &warning {
        tracing::warn!(tenant = %name, "{w}");
    }
    let label = metrics.tenant_label(&name);
    let outcomes = Outcome::ALL
        .iter()
        .map(|o| metrics.outcome(&label, o.name()))
        .collect();
    let limits = Limits::from_config(&config.settings.limits, pool);
    let log_budget = Arc::new(LogBudget::new(
        config.settings.limits.log_lines_per_sec,
        metrics.log_dropped.clone(),
    ));
    let data = (config.data.clone()).unwrap_or_else(|| name.as_str().into());
    // What another tenant's version kept (one of a deleted tenant's name, say) is not this
    // one's.
    let carried = match &carried.data {
        Some(whose) if *whose != data => Carried::default(),
        _ => carried,
    };
    let preparing = crate::prepare::Preparing {
        tenant: &name,
        data: &data,
        label: &label,
        log_budget: &log_budget,
        metrics,
    };
    // Its cache (`[tenant.cache]`), when it has one: shared by its front and its backends.
    let cache = config.settings.cache.enabled.then(|| {
        carried.cache.clone().unwrap_or_else(|| {
            Arc::new(crate::cache::Cache::new(
                &config.settings.cache,
                metrics,
                &label,
            ))
        })
    });
    let grants = crate::capabilities::Grants::prepare(
        &preparing,
        &config.settings,
        resources,
        cache.as_ref(),
        (carried.counters.as_deref(), carried.channels.as_deref()),
    )
    .map_err(refuse)?;
    let front = crate::tenant::front::Front::prepare(
        &preparing,
        &config.settings,
        cache.as_ref(),
        carried.rate_limits.as_ref(),
        &resources.stores,
    )
    .map_err(refuse)?;
    let slots = match carried.slots {
        Some((n, slots)) if n == limits.max_concurrency => slots,
        _ => Arc::new(tokio::sync::Semaphore::new(limits.max_concurrency)),
    };
    let version_label: Arc<str> = match &origin {
        Origin::Api { version } => version.id.as_str().into(),
        Origin::Config => "config".into(),
    };
    let logs = carried.logs.unwrap_or_else(|| {
        Arc::new(crate::livelog::Tail::new(
            crate::livelog::Settings::from_config(&resources.live_logs),
            crate::livelog::Counts::new(metrics),
        ))
    });
    let cache_version = match &origin {
        Origin::Api { version } => {
            crate::hex::decode::<8>(version.id.as_bytes()).map_or(1, u64::from_be_bytes)
        }
        Origin::Config => 0,
    };
    let cache_serving = (front.cache.as_ref()).map(|cache| cache.serves_version(cache_version));
    let paths: Vec<&str> = config
        .settings
        .paths
        .iter()
        .map(|p| p.get_ref().as_str())
        .collect();
    let schedules = crate::schedule::prepare_all(
        &config.settings.schedule,
        &paths,
        crate::ceilings::MAX_TIMEOUT_MS,
    )
    .map_err(refuse)?;
    Ok(Tenant {
        schedules: schedules.into(),
        logs,
        cache_version,
        cache_serving,
        version_label,
        origin,
        hosts: config
            .settings
            .hosts
            .iter()
            .map(|h| h.get_ref().clone())
            .collect(),
        paths: config
            .settings
            .paths
            .iter()
            .map(|p| p.get_ref().clone())
            .collect(),
        assets,
        served: carried.served.unwrap_or_default(),
        slots,
        memory_peak: metrics.memory_peak.clone(),
        sweep: pool
            .pagemap_scan
            .then(|| MemorySweep::new(pool.memory_keep_resident_kib * 1024))
            .flatten(),
        slice_habit: crate::guest::slice::Habit::default(),
        sliced: metrics.sliced(&label),
        log_budget,
        requests: metrics.tenant(&label),
        undelivered: metrics.undelivered(&label),
        grants,
        front,
        warning,
        outcomes,
        label,
        compiled: compiled.clone(),
        guest,
        wasi: Arc::new(WasiSpec {
            name: name.clone(),
            env: crate::variables::Env::new(&config.settings.env),
            stdio_bytes: limits.stdio_bytes,
        }),
        limits,
        name,
        data,
    })
}

/// What [`compile_file`] made.
#[derive(Debug)]
pub struct CompiledFile {
    /// The kind it serves as (detected).
    pub kind: GuestKind,
    /// Size of the input.
    pub wasm_bytes: usize,
    /// Size of the sealed artifact.
    pub artifact_bytes: usize,
    /// How long compiling and checking took.
    pub took: std::time::Duration,
}

/// `tern compile`: compiles the module or component at `input` into a sealed artifact at
/// `output` for a server whose engine has (`wasi_p3`) or has not WASI 0.3, and checks that it
/// would load and link there; what `tern serve` would refuse is refused here, and no artifact
/// is left.
///
/// # Errors
/// If the input cannot be read or is not Wasm, does not compile, or would not load as a tenant.
pub fn compile_file(input: &Path, output: &Path, wasi_p3: bool) -> anyhow::Result<CompiledFile> {
    let engine = crate::engine::build(&PoolConfig {
        wasi_p3,
        ..PoolConfig::default()
    })?;
    let wasm = std::fs::read(input).map_err(|e| anyhow::anyhow!("{}: {e}", input.display()))?;
    if let Some((problem, _)) = artifact::wasm_header_problem(&wasm, "the file is empty") {
        anyhow::bail!("{}: {problem}", input.display());
    }
    let started = std::time::Instant::now();
    let artifact = artifact::compile(&engine, &wasm, &input.display().to_string())?;
    artifact::write_atomic(output, &artifact)?;
    let checked = artifact::load_cwasm(&engine, output)
        .map_err(|e| e.to_string())
        .and_then(|compiled| {
            let linkers = Linkers::new(&engine, wasi_p3).map_err(|e| e.to_string())?;
            link(&linkers, &compiled, None, false)
        });
    match checked {
        Ok(linked) => Ok(CompiledFile {
            kind: linked.guest.kind(),
            wasm_bytes: wasm.len(),
            artifact_bytes: artifact.len(),
            took: started.elapsed(),
        }),
        Err(problem) => {
            let _ = std::fs::remove_file(output);
            anyhow::bail!("{}: {problem}", input.display());
        }
    }
}

/// Shared handle to a tenant.
pub type TenantRef = Arc<Tenant>;
