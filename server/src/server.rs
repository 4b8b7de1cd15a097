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
    // A file per loaded module and a socket per connection: take all the process may have.
    if let Some((before, after)) = crate::os::raise_open_files() {
        tracing::info!("limit of open files raised from {before} to {after} (the hard limit)");
    }
    // Decided once, before the engine and every tenant take it from `config.pool`.
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
    let watch_swap = config.pool.pagemap_scan;
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
            let fleet =
                crate::fleet::Fleet::open(url, config.registry.replica_name(), poll, &token.token)
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

    let (slots, connections) = (config.pool.memory_slots(), config.server.max_connections);
    let headroom =
        tokio::task::spawn_blocking(move || crate::os::check_headroom(slots, connections));
    for warning in headroom.await.unwrap_or_default() {
        tracing::warn!("{warning}");
    }
    let pool = Pool::new(
        config.pool.instances,
        Duration::from_millis(config.pool.queue_timeout_ms),
        metrics.queue_depth.clone(),
    );
    let shutdown = Shutdown::new();
    let tracing = config
        .tracing
        .resolve(|k| std::env::var(k).ok(), &config.registry.replica_name())
        .map_err(|e| anyhow::anyhow!("[tracing]: {e}"))?;
    let mut tasks = Vec::new();
    let tracer = tracing.map(|settings| {
        tracing::info!(url = %settings.url, "exporting traces by OTLP/HTTP");
        let (tracer, task) = crate::trace::Tracer::start(
            settings,
            metrics.trace(),
            shutdown.clone(),
            metrics.in_flight.clone(),
            Duration::from_millis(config.server.shutdown_grace_ms),
        );
        tasks.push(task);
        tracer
    });
    let app = Arc::new(App {
        registry,
        certificates: std::sync::OnceLock::new(),
        admin_token: token.token,
        pool,
        metrics,
        https_port: std::sync::OnceLock::new(),
        tracer,
        trusted_proxies: crate::context::TrustedProxies::parse(&config.server.trusted_proxies)
            .map_err(anyhow::Error::msg)?,
        access_log_query: config.server.access_log_query,
    });

    let per_core = config.server.runtime == crate::config::RuntimeMode::PerCore;
    let public = config
        .server
        .listen
        .map(|at| bind(at, per_core).with_context(|| format!("cannot listen on {at}")))
        .transpose()?;
    let admin_l = TcpListener::bind(config.server.admin_listen)
        .await
        .with_context(|| format!("cannot listen on {} (admin)", config.server.admin_listen))?;
    let addr = public.as_ref().map(TcpListener::local_addr).transpose()?;
    let admin_addr = admin_l.local_addr()?;
    if let Some(fleet) = &fleet
        && let Some(url) = config.registry.advertise_url(admin_addr)
    {
        let _ = fleet.advertise.set(url);
    }
    // The TLS listener: its certificates are read and checked before anything serves.
    let mut acme_manager = None;
    let tls = match config.server.tls_listen {
        None => None,
        Some(at) => {
            let table = crate::tls::Table::load(&config.certificates, &config.base_dir)?;
            let mut store = crate::tls::stored::CertStore::open(&data_dir)?;
            if let Some(fleet) = &fleet {
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
            if let Some(acme) = &config.tls.acme {
                let a = app.clone();
                let tenant_hosts: crate::tls::acme::TenantHosts = Box::new(move || {
                    let live = a.registry.live();
                    live.tenants
                        .values()
                        .flat_map(|t| t.hosts.iter().cloned())
                        .collect()
                });
                acme_manager = Some(crate::tls::acme::Manager::new(
                    acme.clone(),
                    &config.base_dir,
                    &data_dir,
                    certificates.clone(),
                    tenant_hosts,
                    &app.metrics,
                ));
            }
            let acceptor = crate::tls::Acceptor::new(
                certificates,
                config.server.max_tls_handshakes,
                Duration::from_millis(config.server.tls_handshake_timeout_ms),
                &app.metrics,
            )?;
            let l = bind(at, per_core).with_context(|| format!("cannot listen on {at} (TLS)"))?;
            Some((l, Arc::new(acceptor)))
        }
    };
    let tls_addr = tls.as_ref().map(|(l, _)| l.local_addr()).transpose()?;
    if let Some(at) = tls_addr {
        let public = config.server.public_https_port;
        let _ = app
            .https_port
            .set(if public == 0 { at.port() } else { public });
    }
    if watch_swap {
        tokio::spawn(use_memset_reset_under_swap(app.clone(), shutdown.clone()));
    }
    // One connection cap for every worker of the public listener; the admin listener has its
    // own, so `/metrics` and the admin API answer while the public one is full.
    let mut opts = listener::ListenOptions::from_config(&config.server);
    opts.open = Some(app.metrics.connections_open.clone());
    opts.panics = Some(app.metrics.task_panics.clone());
    // HTTP/3 on the TLS listener's address over UDP, advertised on its answers.
    let quic = match (&tls, tls_addr) {
        (Some((_, acceptor)), Some(at)) if config.server.http3 => {
            let bound = listener::quic::bind(at, acceptor, &config.server)?;
            let port = app.https_port.get().copied().unwrap_or(at.port());
            let alt_svc = Arc::new(listener::AltSvc::new(
                port,
                config.server.http3_alt_svc_max_age_secs,
            ));
            Some((bound, alt_svc))
        }
        _ => None,
    };
    // The TLS listener shares the public one's connection cap.
    let tls_opts = tls.as_ref().map(|(_, acceptor)| {
        let mut o = opts.clone();
        o.tls = Some(acceptor.clone());
        o.alt_svc = quic.as_ref().map(|(_, alt_svc)| alt_svc.clone());
        o
    });
    // HTTP/3 runs on the first worker's runtime (per-core) or the shared one.
    let mut quic = quic.zip(tls_opts.clone());
    let mut tls_first = tls.map(|(l, _)| l);

    let mut threads = Vec::new();
    if app.registry.shared_url().is_some() {
        let (a, s) = (app.clone(), shutdown.clone());
        tasks.push(tokio::spawn(
            async move { a.registry.watch_shared(s).await },
        ));
    }
    // Certificates another replica (or another process sharing the data directory) stores
    // serve here too, and the answers to ACME challenges another replica ordered: checked at
    // the fleet's poll, else every few seconds (without a fleet the ACME manager's rounds do it).
    let stored_every = match &fleet {
        Some(fleet) => Some(fleet.poll),
        None => acme_manager
            .is_none()
            .then(|| Duration::from_secs(STORED_CERTIFICATES_CHECK_SECONDS)),
    };
    if let Some(manager) = acme_manager {
        tasks.push(manager.spawn(shutdown.clone()));
    }
    if let (Some(certificates), Some(every)) = (app.certificates.get(), stored_every) {
        tasks.push(certificates.clone().watch_stored(every, shutdown.clone()));
    }
    if per_core {
        // Worker 0 takes the listener bound above (which fixed the port); the others bind the
        // same address with SO_REUSEPORT, and the kernel spreads connections across them.
        let mut first = public;
        for i in 0..config.server.workers() {
            let plain_listener = match (first.take(), addr) {
                (Some(l), _) => Some(l.into_std()?),
                (None, Some(at)) => Some(bind(at, true)?.into_std()?),
                (None, None) => None,
            };
            let tls_listener = match (tls_first.take(), tls_addr) {
                (Some(l), _) => Some(l.into_std()?),
                (None, Some(at)) => Some(bind(at, true)?.into_std()?),
                (None, None) => None,
            };
            let tls_opts = tls_opts.clone();
            let quic = quic.take();
            let (app, shutdown, opts) = (app.clone(), shutdown.clone(), opts.clone());
            let thread = std::thread::Builder::new()
                .name(format!("tern-worker-{i}"))
                .spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .expect("worker runtime");
                    rt.block_on(async move {
                        let handler = move |req: http::Request<RequestBody>, conn| {
                            crate::http::handle(app.clone(), req, conn)
                        };
                        let plain = async {
                            if let Some(l) = plain_listener {
                                let l = TcpListener::from_std(l).expect("listener");
                                let (h, s) = (handler.clone(), shutdown.clone());
                                listener::serve(l, h, s, opts).await;
                            }
                        };
                        let tls = async {
                            if let (Some(l), Some(o)) = (tls_listener, tls_opts) {
                                let l = TcpListener::from_std(l).expect("listener");
                                listener::serve(l, handler.clone(), shutdown.clone(), o).await;
                            }
                        };
                        let h3 = async {
                            if let Some(((bound, alt_svc), o)) = quic {
                                let s = shutdown.clone();
                                let h = handler.clone();
                                listener::quic::serve(bound, h, s, o, Some(alt_svc)).await;
                            }
                        };
                        tokio::join!(plain, tls, h3);
                    });
                })?;
            threads.push(thread);
        }
    } else {
        let a = app.clone();
        let handler =
            move |req: http::Request<RequestBody>, conn| crate::http::handle(a.clone(), req, conn);
        if let Some(l) = public {
            tasks.push(tokio::spawn(listener::serve(
                l,
                handler.clone(),
                shutdown.clone(),
                opts.clone(),
            )));
        }
        if let (Some(l), Some(o)) = (tls_first.take(), tls_opts) {
            tasks.push(tokio::spawn(listener::serve(
                l,
                handler.clone(),
                shutdown.clone(),
                o,
            )));
        }
        if let Some(((bound, alt_svc), o)) = quic.take() {
            tasks.push(tokio::spawn(listener::quic::serve(
                bound,
                handler,
                shutdown.clone(),
                o,
                Some(alt_svc),
            )));
        }
    }
    let a = app.clone();
    let admin_task = tokio::spawn(listener::serve(
        admin_l,
        move |req, _client| admin::handle(a.clone(), req),
        shutdown.clone(),
        listener::ListenOptions::from_config(&config.server),
    ));
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
        tasks: {
            tasks.push(admin_task);
            tasks
        },
        threads,
    })
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

/// Binds a listening socket, with `SO_REUSEPORT` when several workers share the address.
fn bind(addr: SocketAddr, reuse_port: bool) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    if reuse_port {
        socket.set_reuseport(true)?;
    }
    socket.bind(addr)?;
    // A deep backlog: past `max_connections`, clients wait here rather than being refused.
    socket.listen(4096)
}
