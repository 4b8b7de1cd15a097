//! Start-up: build the engine, load and pre-link every tenant, bind the listeners, serve.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::{TcpListener, TcpSocket};
use tokio::task::JoinHandle;

use crate::app::App;
use crate::body::RequestBody;
use crate::config::Config;
use crate::datadir::{self, DataDir};
use crate::engine;
use crate::metrics::Metrics;
use crate::pool::Pool;
use crate::registry::Registry;
use crate::shutdown::Shutdown;
use crate::{admin, listener};

/// How often a TLS listener without `[tls.acme]` looks for certificates other processes
/// sharing its data directory stored.
const STORED_CERTIFICATES_CHECK_SECONDS: u64 = 2;

/// A running server.
#[derive(Debug)]
pub struct Running {
    /// Where the public cleartext listener is bound (useful with port 0); `None` with
    /// `listen = "off"`.
    pub addr: Option<SocketAddr>,
    /// Where the admin listener is bound.
    pub admin_addr: SocketAddr,
    /// Where the TLS listener is bound, if there is one.
    pub tls_addr: Option<SocketAddr>,
    /// Fires shutdown.
    pub shutdown: Shutdown,
    /// Shared request-path state.
    pub app: Arc<App>,
    tasks: Vec<JoinHandle<()>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Running {
    /// Reloads the config file on every `SIGHUP`; a bad config is refused and logged, and the
    /// tenants running keep serving.
    ///
    /// # Errors
    /// If the signal handler cannot be installed.
    pub fn reload_on_sighup(&self) -> std::io::Result<()> {
        use tokio::signal::unix::{SignalKind, signal};
        let mut hup = signal(SignalKind::hangup())?;
        let app = self.app.clone();
        tokio::spawn(async move {
            while hup.recv().await.is_some() {
                match app.reload().await {
                    Ok(n) => tracing::info!(tenants = n, "SIGHUP: config reloaded"),
                    Err(e) => tracing::error!(
                        "SIGHUP: config reload refused, the running tenants keep serving: {e}"
                    ),
                }
            }
        });
        Ok(())
    }

    /// Waits until both listeners have stopped and drained.
    pub async fn wait(mut self) {
        for t in std::mem::take(&mut self.tasks) {
            let _ = t.await;
        }
        for t in std::mem::take(&mut self.threads) {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
    }
}

/// Dropping a running server shuts it down (its worker threads would otherwise outlive it).
impl Drop for Running {
    fn drop(&mut self) {
        self.shutdown.trigger();
    }
}

/// Where and how the server keeps its state, beside the config.
#[derive(Debug, Clone, Default)]
pub struct StartOptions {
    /// The config file, for reloads (`None`: the config cannot be reloaded).
    pub config_path: Option<PathBuf>,
    /// The data directory; `None`: `server.data_dir`, else [`crate::config::default_data_dir`].
    pub data_dir: Option<PathBuf>,
}

/// Loads every tenant (config and data directory) and starts serving.
///
/// # Errors
/// If the engine cannot be built, the data directory cannot be opened, a tenant cannot be
/// loaded (every failing tenant is named), or a listener cannot be bound.
pub async fn start(config: Config) -> anyhow::Result<Running> {
    start_with(config, StartOptions::default()).await
}

/// [`start`] with a config file to reload from and a data directory.
///
/// # Errors
/// See [`start`].
pub async fn start_with(mut config: Config, opts: StartOptions) -> anyhow::Result<Running> {
    let watch_swap = process_limits(&mut config);
    let Opened {
        data_dir,
        token,
        fleet,
        registry,
        metrics,
    } = Opened::open(&config, &opts).await?;
    warn_headroom(&config).await;
    let shutdown = Shutdown::new();
    let mut tasks = Vec::new();
    let app = new_app(
        &config,
        (registry, metrics, token),
        &data_dir,
        &shutdown,
        &mut tasks,
    )?;
    let public = Public::bind(&config, &app, &data_dir, fleet.as_ref()).await?;
    let admin = TcpListener::bind(config.server.admin_listen)
        .await
        .with_context(|| format!("cannot listen on {} (admin)", config.server.admin_listen))?;
    let admin_addr = admin.local_addr()?;
    if let Some(fleet) = &fleet
        && let Some(url) = config.registry.advertise_url(admin_addr)
    {
        let _ = fleet.advertise.set(url);
    }
    let (addr, tls_addr) = (public.addr, public.tls_addr);
    background(
        &app,
        fleet.as_ref(),
        public.acme,
        watch_swap,
        &shutdown,
        &mut tasks,
    );
    let threads = public.workers.serve(&config, &app, &shutdown, &mut tasks)?;
    let a = app.clone();
    tasks.push(tokio::spawn(listener::serve(
        admin,
        move |req, conn: crate::context::Connection| {
            admin::handle(a.clone(), req, crate::context::canonical(conn.peer))
        },
        shutdown.clone(),
        listener::ListenOptions::from_config(&config.server),
    )));
    let serving: Vec<String> = [
        addr.map(|a| format!("http://{a}")),
        tls_addr.map(|a| format!("https://{a}")),
        tls_addr
            .filter(|_| config.server.http3)
            .map(|a| format!("HTTP/3 on udp {a}")),
    ]
    .into_iter()
    .flatten()
    .collect();
    tracing::info!(
        "serving tenants on {}, metrics on http://{admin_addr}/metrics",
        serving.join(", ")
    );
    Ok(Running {
        addr,
        admin_addr,
        tls_addr,
        shutdown,
        app,
        tasks,
        threads,
    })
}

/// The process's limits: open files raised to the hard limit (a file per loaded module, a
/// socket per connection), and how freed guest memory is reset, decided once before the
/// engine and every tenant take it from `config.pool`. Whether to watch for a swap area.
fn process_limits(config: &mut Config) -> bool {
    if let Some((before, after)) = crate::os::raise_open_files() {
        tracing::info!("limit of open files raised from {before} to {after} (the hard limit)");
    }
    if config.pool.pagemap_scan {
        if crate::teardown::swap_possible() {
            tracing::warn!(
                "a swap area is active: freed guest memory is reset with memset instead of the \
                 dirty-page scan, which misses swapped pages (docs/limits.md, \"Zero state\"); \
                 give Tern no swap (cgroup memory.swap.max = 0) for the faster reset"
            );
            config.pool.pagemap_scan = false;
        } else {
            crate::teardown::watch_swap();
        }
    }
    config.pool.pagemap_scan
}

/// The server's state, opened before anything serves.
struct Opened {
    data_dir: PathBuf,
    /// The admin API's token.
    token: String,
    /// The fleet's shared registry, when `[registry] url` is set.
    fleet: Option<Arc<crate::fleet::Fleet>>,
    /// The tenants, every one loaded (the engine built).
    registry: Registry,
    metrics: Metrics,
}

impl Opened {
    /// Opens the data directory, reads (or makes) the admin token, joins the fleet, builds the
    /// engine and loads every tenant.
    async fn open(config: &Config, opts: &StartOptions) -> anyhow::Result<Self> {
        let engine = engine::build(&config.pool)?;
        let metrics = Metrics::new(config.server.max_tenant_labels);
        let data_dir = opts
            .data_dir
            .clone()
            .or_else(|| {
                (!config.server.data_dir.is_empty())
                    .then(|| config.base_dir.join(&config.server.data_dir))
            })
            .unwrap_or_else(crate::config::default_data_dir);
        let store = DataDir::open(&data_dir)
            .with_context(|| format!("cannot open the data directory {}", data_dir.display()))?;
        let token = datadir::admin_token(&config.server.admin_token, &data_dir)?;
        if let Some(file) = &token.file {
            tracing::info!(file = %file.display(), "admin API token generated (read it from this file)");
        }
        let fleet = match config.registry.shared_url() {
            None => None,
            Some(url) => {
                if token.file.is_some() {
                    anyhow::bail!(
                        "[registry] url is set: the replicas of a fleet share one admin token (it \
                     also signs the compiled artifacts they share); set TERN_ADMIN_TOKEN or \
                     server.admin_token"
                    );
                }
                let poll = Duration::from_millis(config.registry.poll_interval_ms);
                let fleet = crate::fleet::Fleet::open(
                    url,
                    config.registry.replica_name(),
                    poll,
                    &token.token,
                )
                .map_err(|e| anyhow::anyhow!("[registry] url: {e}"))?;
                tracing::info!(registry = url, replica = %fleet.replica, "serving from a shared registry");
                Some(Arc::new(fleet))
            }
        };
        let registry = Registry::start(
            config.clone(),
            opts.config_path.clone(),
            store,
            engine,
            metrics.clone(),
            fleet.clone(),
        )
        .await?;
        Ok(Self {
            data_dir,
            token: token.token,
            fleet,
            registry,
            metrics,
        })
    }
}

/// Warns when the process's limits leave too little room for the pool's memory slots and
/// `max_connections` (read off the reactor: it reads `/proc`).
async fn warn_headroom(config: &Config) {
    let (slots, connections) = (config.pool.memory_slots(), config.server.max_connections);
    let headroom =
        tokio::task::spawn_blocking(move || crate::os::check_headroom(slots, connections));
    for warning in headroom.await.unwrap_or_default() {
        tracing::warn!("{warning}");
    }
}

/// The request path's shared state: the instance pool, the trace exporter (its task in
/// `tasks`), the trusted proxies, the audit log (in `data_dir`).
fn new_app(
    config: &Config,
    (registry, metrics, admin_token): (Registry, Metrics, String),
    data_dir: &std::path::Path,
    shutdown: &Shutdown,
    tasks: &mut Vec<JoinHandle<()>>,
) -> anyhow::Result<Arc<App>> {
    let pool = Pool::new(
        config.pool.instances,
        Duration::from_millis(config.pool.queue_timeout_ms),
        metrics.queue_depth.clone(),
    );
    let tracing = config
        .tracing
        .resolve(|k| std::env::var(k).ok(), &config.registry.replica_name())
        .map_err(|e| anyhow::anyhow!("[tracing]: {e}"))?;
    let tracer = tracing.map(|settings| {
        tracing::info!(url = %settings.url, "exporting traces by OTLP/HTTP");
        let (tracer, task) = crate::trace::Tracer::start(
            settings,
            metrics.trace(),
            shutdown.clone(),
            {
                let in_flight = metrics.in_flight.clone();
                move || in_flight.get()
            },
            Duration::from_millis(config.server.shutdown_grace_ms),
        );
        tasks.push(task);
        tracer
    });
    let replica = registry
        .shared_url()
        .is_some()
        .then(|| config.registry.replica_name());
    let audit = crate::audit::AuditLog::open(data_dir, metrics.audit_dropped.clone(), replica)
        .with_context(|| format!("cannot open {}", data_dir.join("audit.log").display()))?;
    let rate_limits = crate::ratelimit::RateLimits::prepare(
        &config.server.rate_limit,
        None,
        &metrics,
        (
            crate::ratelimit::SERVER_LABEL,
            crate::ratelimit::SERVER_LABEL,
        ),
        registry.stores(),
    )
    .map_err(|e| anyhow::anyhow!("server.{e}"))?;
    let clock = crate::schedule::Clock::from_env().map_err(anyhow::Error::msg)?;
    let schedule_store = match config.server.schedule_store.as_str() {
        "" => None,
        name => Some(registry.stores().get(name).cloned().ok_or_else(|| {
            anyhow::anyhow!(
                "server.schedule_store = {name:?}: there is no [kv.{name}] (a Redis store, \
                 backend = \"redis\")"
            )
        })?),
    };
    let ledgers =
        crate::scheduler::Store::open(schedule_store, registry.fleet().cloned(), data_dir)
            .map_err(|e| {
                anyhow::anyhow!(
                    "server.schedule_store = {:?}: {e}",
                    config.server.schedule_store
                )
            })?;
    let scheduler = crate::scheduler::Scheduler::new(
        ledgers,
        clock,
        config.registry.replica_name(),
        Duration::from_millis(config.server.shutdown_grace_ms),
    );
    Ok(Arc::new(App {
        registry,
        certificates: std::sync::OnceLock::new(),
        admin_token,
        audit,
        failures: crate::access::Failures::default(),
        pool,
        metrics: metrics.clone(),
        https_port: std::sync::OnceLock::new(),
        tracer,
        trusted_proxies: crate::context::TrustedProxies::parse(&config.server.trusted_proxies)
            .map_err(anyhow::Error::msg)?,
        access_log_query: config.server.access_log_query,
        rate_limits,
        sockets: crate::websocket::Sockets::new(
            config.server.max_websockets,
            shutdown.clone(),
            metrics.clone(),
        ),
        live_logs: crate::livelog::Readers {
            replica: config.registry.replica_name().into(),
            shutdown: shutdown.clone(),
        },
        scheduler,
    }))
}

/// The public listeners, bound before anything serves (a bad address or certificate is an
/// error at start), and the workers that serve them.
struct Public {
    /// The cleartext listener's address; `None` with `listen = "off"`.
    addr: Option<SocketAddr>,
    /// The TLS listener's address, if there is one.
    tls_addr: Option<SocketAddr>,
    /// The ACME manager, with `[tls.acme]`.
    acme: Option<crate::tls::acme::Manager>,
    workers: Workers,
}

impl Public {
    async fn bind(
        config: &Config,
        app: &Arc<App>,
        data_dir: &std::path::Path,
        fleet: Option<&Arc<crate::fleet::Fleet>>,
    ) -> anyhow::Result<Self> {
        let per_core = config.server.runtime == crate::config::RuntimeMode::PerCore;
        let plain = config
            .server
            .listen
            .map(|at| bind_first(at, per_core).with_context(|| format!("cannot listen on {at}")))
            .transpose()?;
        let addr = plain.as_ref().map(TcpListener::local_addr).transpose()?;
        let (tls, acme) = match config.server.tls_listen {
            None => (None, None),
            Some(at) => {
                let (l, acceptor, acme) =
                    tls_listener(config, app, data_dir, fleet, at, per_core).await?;
                (Some((l, acceptor)), acme)
            }
        };
        let tls_addr = tls.as_ref().map(|(l, _)| l.local_addr()).transpose()?;
        if let Some(at) = tls_addr {
            let public = config.server.public_https_port;
            let _ = app
                .https_port
                .set(if public == 0 { at.port() } else { public });
        }
        // One connection cap for every worker of the public listeners (TLS and HTTP/3
        // included); the admin listener has its own, so `/metrics` and the admin API answer
        // while the public one is full.
        let mut opts = listener::ListenOptions::from_config(&config.server);
        opts.open = Some(app.metrics.connections_open.clone());
        opts.panics = Some(app.metrics.task_panics.clone());
        // HTTP/3 on the TLS listener's address over UDP, advertised on its answers.
        // Per-core: a UDP socket for each worker, bound here, now (see `listener::quic`).
        let mut quic_rest = Vec::new();
        let quic = match (&tls, tls_addr) {
            (Some((_, acceptor)), Some(at)) if config.server.http3 => {
                let sockets = if per_core { config.server.workers() } else { 1 };
                let mut bound = listener::quic::bind(at, acceptor, &config.server, sockets)?;
                quic_rest = bound.split_off(1);
                let port = app.https_port.get().copied().unwrap_or(at.port());
                let alt_svc = Arc::new(listener::AltSvc::new(
                    port,
                    config.server.http3_alt_svc_max_age_secs,
                ));
                Some((bound.remove(0), alt_svc))
            }
            _ => None,
        };
        // The TLS listener's options (TLS termination, HTTP/3 advertised) serve HTTP/3 too.
        let tls = tls.map(|(l, acceptor)| {
            let mut o = opts.clone();
            o.tls = Some(acceptor);
            o.alt_svc = quic.as_ref().map(|(_, alt_svc)| alt_svc.clone());
            (l, o)
        });
        let quic = quic.zip(tls.as_ref().map(|(_, o)| o.clone()));
        let workers = Workers {
            per_core,
            first: Worker {
                plain: plain.map(TcpListener::into_std).transpose()?,
                tls: match tls {
                    Some((l, o)) => Some((l.into_std()?, o)),
                    None => None,
                },
                quic,
                opts,
            },
            addr,
            tls_addr,
            quic_rest,
        };
        Ok(Self {
            addr,
            tls_addr,
            acme,
            workers,
        })
    }
}

/// The TLS listener bound on `at`: its certificates (configured, uploaded, the fleet's) read and
/// checked before anything serves, its handshake acceptor, and the ACME manager with
/// `[tls.acme]`.
async fn tls_listener(
    config: &Config,
    app: &Arc<App>,
    data_dir: &std::path::Path,
    fleet: Option<&Arc<crate::fleet::Fleet>>,
    at: SocketAddr,
    per_core: bool,
) -> anyhow::Result<(
    TcpListener,
    Arc<crate::tls::Acceptor>,
    Option<crate::tls::acme::Manager>,
)> {
    let table = crate::tls::Table::load(&config.certificates, &config.base_dir)?;
    let mut store = crate::tls::stored::CertStore::open(data_dir)?;
    if let Some(fleet) = fleet {
        // The fleet's certificates (uploaded or obtained by ACME on any replica).
        store = store.with_registry(fleet.clone());
    }
    let reading = store.clone();
    let stored = tokio::task::spawn_blocking(move || {
        let index = reading.read()?;
        Ok::<_, crate::datadir::StoreError>(reading.table(&index))
    })
    .await??;
    let nothing = table.is_empty() && stored.is_empty() && config.tls.acme.is_none();
    let certificates = crate::tls::Certificates::new(table, store, &app.metrics);
    certificates.replace_stored(stored);
    if nothing {
        tracing::warn!(
            "the TLS listener has no certificate yet: handshakes fail until one is \
             uploaded (tern cert put) or configured ([[certificate]], [tls.acme])"
        );
    }
    let _ = app.certificates.set(certificates.clone());
    let acme = config.tls.acme.as_ref().map(|acme| {
        let a = app.clone();
        let tenant_hosts: crate::tls::acme::TenantHosts = Box::new(move || {
            let live = a.registry.live();
            live.tenants
                .values()
                .flat_map(|t| t.hosts.iter().cloned())
                .collect()
        });
        crate::tls::acme::Manager::new(
            acme.clone(),
            &config.base_dir,
            data_dir,
            certificates.clone(),
            tenant_hosts,
            &app.metrics,
        )
    });
    let acceptor = crate::tls::Acceptor::new(
        certificates,
        config.server.max_tls_handshakes,
        Duration::from_millis(config.server.tls_handshake_timeout_ms),
        &app.metrics,
    )?;
    let l = bind_first(at, per_core).with_context(|| format!("cannot listen on {at} (TLS)"))?;
    Ok((l, Arc::new(acceptor), acme))
}

/// The scheduled runs' runner runs in the server: its tenants, and the front end its runs go
/// through.
impl crate::scheduler::Host for App {
    fn scheduler(&self) -> &crate::scheduler::Scheduler {
        &self.scheduler
    }

    fn live(&self) -> Arc<crate::registry::Live> {
        self.registry.live().clone()
    }

    fn metrics(&self) -> &crate::metrics::Metrics {
        &self.metrics
    }

    fn queue_timeout(&self) -> Duration {
        self.pool.queue_timeout()
    }

    fn fire(
        this: &Arc<Self>,
        tenant: crate::tenant::TenantRef,
        req: http::Request<crate::body::RequestBody>,
        timeout: Option<Duration>,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = http::Response<crate::body::ResponseBody>> + Send>,
    > {
        let app = this.clone();
        Box::pin(async move { crate::http::scheduled(&app, tenant, req, timeout).await })
    }
}

/// How often candidates' rollouts are looked at (abort rule, stages): the time an abort
/// takes at most after its rule is met, besides the change itself.
const ROLLOUTS_TENDED_EVERY: Duration = Duration::from_secs(1);

/// How often when each scoped token was last used is saved in the data directory.
const TOKEN_USE_SAVED_EVERY: Duration = Duration::from_secs(10);

/// The tasks beside the listeners: the fleet's registry watched, ACME's rounds, certificates
/// other replicas or processes store, candidates' rollouts tended, the swap watch.
fn background(
    app: &Arc<App>,
    fleet: Option<&Arc<crate::fleet::Fleet>>,
    acme: Option<crate::tls::acme::Manager>,
    watch_swap: bool,
    shutdown: &Shutdown,
    tasks: &mut Vec<JoinHandle<()>>,
) {
    if let Some(fleet) = fleet {
        let (a, s) = (app.clone(), shutdown.clone());
        tasks.push(tokio::spawn(
            async move { a.registry.watch_shared(s).await },
        ));
        let (a, f, s) = (app.clone(), fleet.clone(), shutdown.clone());
        tasks.push(tokio::spawn(async move {
            a.audit.ship_until(&f.remote, &s).await;
        }));
    }
    // Certificates another replica (or another process sharing the data directory) stores
    // serve here too, and the answers to ACME challenges another replica ordered: checked at
    // the fleet's poll, else every few seconds (without a fleet the ACME manager's rounds do it).
    let stored_every = match fleet {
        Some(fleet) => Some(fleet.poll),
        None => acme
            .is_none()
            .then(|| Duration::from_secs(STORED_CERTIFICATES_CHECK_SECONDS)),
    };
    if let Some(manager) = acme {
        tasks.push(manager.spawn(shutdown.clone()));
    }
    if let (Some(certificates), Some(every)) = (app.certificates.get(), stored_every) {
        tasks.push(certificates.clone().watch_stored(every, shutdown.clone()));
    }
    // Gradual deployments: each candidate's abort rule and stages, every second.
    let (a, s) = (app.clone(), shutdown.clone());
    let watched_since_ms = crate::rollout::now_ms();
    tasks.push(tokio::spawn(async move {
        while s.sleep(ROLLOUTS_TENDED_EVERY).await {
            a.registry
                .tend_rollouts(watched_since_ms, |taken| {
                    let time_ms = crate::audit::now_ms();
                    let path = format!("/admin/v1/tenants/{}", taken.tenant);
                    a.audit.record(crate::audit::Record {
                        time: time_ms / 1000,
                        time_ms,
                        replica: None,
                        request_id: "-",
                        who: "rollout",
                        token: None,
                        token_name: None,
                        client: std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
                        method: "-",
                        path: &path,
                        tenant: Some(&taken.tenant),
                        status: 200,
                        outcome: "done",
                        version: Some(&taken.version),
                        token_made: None,
                        fields: &[],
                        step: Some(taken.step),
                    });
                })
                .await;
        }
    }));
    // Tenants' schedules.
    tasks.push(tokio::spawn(crate::scheduler::Scheduler::run_until(
        app.clone(),
        shutdown.clone(),
    )));
    // When each scoped token was last used, saved now and then (and once more at the end).
    let (a, s) = (app.clone(), shutdown.clone());
    tasks.push(tokio::spawn(async move {
        while s.sleep(TOKEN_USE_SAVED_EVERY).await {
            a.registry.save_token_use().await;
        }
        a.registry.save_token_use().await;
    }));
    if watch_swap {
        tasks.push(tokio::spawn(use_memset_reset_under_swap(
            app.clone(),
            shutdown.clone(),
        )));
    }
}

/// Who serves the public listeners: per-core, one thread with its own runtime per worker (the
/// first takes the sockets bound at start, which fixed the ports; the others bind the same
/// addresses with `SO_REUSEPORT`, and the kernel spreads connections across them; HTTP/3's
/// sockets are all bound at start, one per worker); else one task on the shared runtime.
struct Workers {
    per_core: bool,
    first: Worker,
    addr: Option<SocketAddr>,
    tls_addr: Option<SocketAddr>,
    /// The other workers' HTTP/3 sockets, in the workers' order.
    quic_rest: Vec<listener::quic::Bound>,
}

impl Workers {
    /// Starts the workers: their threads (per-core), else a task in `tasks`.
    fn serve(
        self,
        config: &Config,
        app: &Arc<App>,
        shutdown: &Shutdown,
        tasks: &mut Vec<JoinHandle<()>>,
    ) -> anyhow::Result<Vec<std::thread::JoinHandle<()>>> {
        if !self.per_core {
            tasks.push(tokio::spawn(self.first.serve(
                app.clone(),
                shutdown.clone(),
                0,
            )));
            return Ok(Vec::new());
        }
        let mut workers = Vec::with_capacity(config.server.workers());
        let mut quic_rest = self.quic_rest.into_iter();
        for _ in 1..config.server.workers() {
            let quic = quic_rest.next();
            workers.push(self.first.again(self.addr, self.tls_addr, quic)?);
        }
        workers.insert(0, self.first);
        let mut threads = Vec::new();
        for (i, worker) in workers.into_iter().enumerate() {
            let (app, shutdown) = (app.clone(), shutdown.clone());
            let thread = std::thread::Builder::new()
                .name(format!("tern-worker-{i}"))
                .spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .expect("worker runtime");
                    // A guest never leaves this thread: a cut one holds its tenant's line.
                    crate::execute::turn::per_worker();
                    rt.block_on(worker.serve(app, shutdown, i));
                })?;
            threads.push(thread);
        }
        Ok(threads)
    }
}
/// What one worker serves: each public listener it has a socket for, with the options shared
/// by every worker (one connection cap). A new kind of listener is a field here and a line in
/// [`Worker::serve`].
struct Worker {
    plain: Option<std::net::TcpListener>,
    tls: Option<(std::net::TcpListener, listener::ListenOptions)>,
    /// HTTP/3: this worker's own socket and endpoint (quinn drives an endpoint on the
    /// runtime it is made in).
    quic: Option<(
        (listener::quic::Bound, Arc<listener::AltSvc>),
        listener::ListenOptions,
    )>,
    opts: listener::ListenOptions,
}

impl Worker {
    /// Another worker beside this one: its own sockets on the same addresses
    /// (`SO_REUSEPORT`; HTTP/3's, `quic`, bound at start), the same options.
    fn again(
        &self,
        addr: Option<SocketAddr>,
        tls_addr: Option<SocketAddr>,
        quic: Option<listener::quic::Bound>,
    ) -> std::io::Result<Self> {
        let plain = match addr {
            Some(at) => Some(bind(at, true)?.into_std()?),
            None => None,
        };
        let tls = match (&self.tls, tls_addr) {
            (Some((_, o)), Some(at)) => Some((bind(at, true)?.into_std()?, o.clone())),
            _ => None,
        };
        let quic = match (&self.quic, quic) {
            (Some(((_, alt_svc), o)), Some(bound)) => Some(((bound, alt_svc.clone()), o.clone())),
            _ => None,
        };
        Ok(Self {
            plain,
            tls,
            quic,
            opts: self.opts.clone(),
        })
    }

    /// Serves every listener of this worker (number `index`) with the front end until
    /// shutdown (and the drain after it).
    async fn serve(self, app: Arc<App>, shutdown: Shutdown, index: usize) {
        let Self {
            plain,
            tls,
            quic,
            mut opts,
        } = self;
        let worker = index.to_string();
        let counted = |o: &mut listener::ListenOptions, transport: &str| {
            let gauge = app
                .metrics
                .worker_connections
                .with_label_values(&[&worker, transport]);
            o.worker_open = Some(gauge);
        };
        counted(&mut opts, "tcp");
        let tls = tls.map(|(l, mut o)| {
            counted(&mut o, "tcp");
            (l, o)
        });
        let quic = quic.map(|(bound, mut o)| {
            counted(&mut o, "quic");
            (bound, o)
        });
        let sockets = app.sockets.clone();
        let handler = move |req: http::Request<RequestBody>, conn| {
            // (Hyper moves it in for every request, a cache hit's too.)
            crate::budget::sized::<3072, _>(crate::http::handle(app.clone(), req, conn))
        };
        let tokio_listener = |l| TcpListener::from_std(l).expect("a listener bound at start");
        let plain = async {
            if let Some(l) = plain {
                let o = opts.clone();
                listener::serve(tokio_listener(l), handler.clone(), shutdown.clone(), o).await;
            }
        };
        let tls = async {
            if let Some((l, o)) = tls {
                listener::serve(tokio_listener(l), handler.clone(), shutdown.clone(), o).await;
            }
        };
        let h3 = async {
            if let Some(((bound, alt_svc), o)) = quic {
                let (h, s) = (handler.clone(), shutdown.clone());
                listener::quic::serve(bound, h, s, o, Some(alt_svc)).await;
            }
        };
        // The WebSocket relays of this worker run on its runtime: each is sent a `1001` close
        // when shutdown begins, and they end within the grace, counted from then.
        let grace = opts.grace;
        let relays = async {
            shutdown.wait().await;
            let _ = tokio::time::timeout(grace, sockets.closed()).await;
        };
        tokio::join!(plain, tls, h3, relays);
    }
}

/// Once a swap area is switched on (see [`crate::teardown`]), moves every tenant to an engine
/// with the swap-safe `memset` reset; tries again every 10 s while it cannot.
async fn use_memset_reset_under_swap(app: Arc<App>, shutdown: Shutdown) {
    let mut swap = crate::teardown::swap_changes();
    loop {
        tokio::select! {
            on = swap.wait_for(|&on| on) => if on.is_err() { return },
            () = shutdown.wait() => return,
        }
        if shutdown.is_triggered() {
            return;
        }
        match app.registry.use_memset_reset().await {
            Ok(_) => return,
            Err(e) => {
                tracing::error!(
                    "cannot move the tenants to the swap-safe memset reset (trying again in \
                     10 s; wasi-http guests are refused meanwhile): {e:#}"
                );
                if !shutdown.sleep(Duration::from_secs(10)).await {
                    return;
                }
            }
        }
    }
}

/// Binds the first listening socket on `addr`. With `SO_REUSEPORT` (per-core workers), the port
/// is first bound without it, which fails while another process listens there: a second server
/// on the same port stops with an error instead of silently taking a share of the first one's
/// connections.
fn bind_first(addr: SocketAddr, reuse_port: bool) -> std::io::Result<TcpListener> {
    if reuse_port && addr.port() != 0 {
        let probe = if addr.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        probe.set_reuseaddr(true)?;
        probe.bind(addr).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("{e} (is another server already listening there?)"),
            )
        })?;
    }
    bind(addr, reuse_port)
}

/// Binds a listening socket, with `SO_REUSEPORT` when several workers share the address.
fn bind(addr: SocketAddr, reuse_port: bool) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        let socket = TcpSocket::new_v6()?;
        // `[::]` takes IPv4 clients too, whatever the host's `net.ipv6.bindv6only` says
        // (their addresses are made canonical in `http::handle`).
        if addr.ip().is_unspecified() {
            socket2::SockRef::from(&socket).set_only_v6(false)?;
        }
        socket
    };
    socket.set_reuseaddr(true)?;
    if reuse_port {
        socket.set_reuseport(true)?;
    }
    socket.bind(addr)?;
    // A deep backlog: past `max_connections`, clients wait here rather than being refused.
    socket.listen(4096)
}
