//! Prometheus metrics: phase histograms, per-tenant request counters, pool gauges.
//!
//! Every handle a request touches is resolved when the server starts (or a tenant is added),
//! so the hot path only does atomic adds: no label lookups, no locks.

mod openmetrics;
mod per_thread;
mod phases;

use std::time::Duration;

pub use openmetrics::{CONTENT_TYPE as OPENMETRICS_CONTENT_TYPE, Exemplars};
pub use per_thread::{Counter, Counters, Entered, Level, Sizes};
pub use phases::{PHASES, Phase, Timings};

use prometheus::core::Collector;
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};
use wasmtime::Engine;

/// `Content-Type` of the Prometheus text exposition format (Prometheus 3 requires it).
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Buckets from 1 µs to ~16 s, doubling: fits a 2 µs teardown and a 1 s deadline alike.
/// Makes metrics and registers each as it is made.
struct Registrar(Registry);

impl Registrar {
    fn register<C: Collector + Clone + 'static>(&self, metric: C) -> C {
        self.0
            .register(Box::new(metric.clone()))
            .expect("metric registered once");
        metric
    }

    fn counter(&self, name: &str, help: &str) -> IntCounter {
        self.register(IntCounter::new(name, help).expect("valid metric"))
    }

    fn gauge(&self, name: &str, help: &str) -> IntGauge {
        self.register(IntGauge::new(name, help).expect("valid metric"))
    }

    fn gauges(&self, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
        self.register(IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric"))
    }

    fn counters(&self, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        self.register(IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric"))
    }

    fn sizes(&self, name: &str, help: &str) -> Sizes {
        self.register(Sizes::new(name, help))
    }

    fn thread_counters(&self, name: &str, help: &str, labels: &[&str]) -> Counters {
        self.register(Counters::new(name, help, labels))
    }

    fn histogram(&self, name: &str, help: &str, buckets: Vec<f64>) -> Histogram {
        let opts = HistogramOpts::new(name, help).buckets(buckets);
        self.register(Histogram::with_opts(opts).expect("valid metric"))
    }
}

fn buckets() -> Vec<f64> {
    per_thread::bounds()
}

/// The index (0-4) of `status`'s class, 1xx to 5xx (anything else counts as 1xx or 5xx).
pub fn status_class(status: u16) -> usize {
    usize::from(status / 100).clamp(1, 5) - 1
}

/// Counts something in a gauge while it lives: up when made, down when dropped, however its
/// owner ends (answered, timed out, or dropped because the client left).
#[derive(Debug)]
pub struct GaugeGuard<G: std::borrow::Borrow<IntGauge>>(G);

impl<G: std::borrow::Borrow<IntGauge>> GaugeGuard<G> {
    /// Counts one in `gauge` until the guard is dropped.
    pub fn new(gauge: G) -> Self {
        gauge.borrow().inc();
        Self(gauge)
    }
}

impl<G: std::borrow::Borrow<IntGauge>> Drop for GaugeGuard<G> {
    fn drop(&mut self) {
        self.0.borrow().dec();
    }
}

/// The HTTP versions `tern_requests_total` tells apart, as its `version` label.
const VERSIONS: [&str; 4] = ["1.0", "1.1", "2", "3"];

/// The index in [`VERSIONS`] of `version` (HTTP/0.9 counts as 1.0).
fn version_index(version: http::Version) -> usize {
    match version {
        http::Version::HTTP_11 => 1,
        http::Version::HTTP_2 => 2,
        http::Version::HTTP_3 => 3,
        _ => 0,
    }
}

/// One tenant's counters of one trigger: by deployment, HTTP version and status class.
type ByVersionClass = [[[std::sync::OnceLock<Counter>; 5]; 4]; 2];

/// Request counters of one tenant, by trigger (a client's request or a schedule), deployment
/// (its current version or its candidate), HTTP version and status class: each resolved the
/// first time it counts (a tenant that never sees HTTP/1.0 exports no series for it), then one
/// atomic load and an increment.
#[derive(Debug, Clone)]
pub struct TenantMetrics {
    requests: Counters,
    label: std::sync::Arc<str>,
    by_version_class: std::sync::Arc<[ByVersionClass; 2]>,
}

impl TenantMetrics {
    /// Counts one response with `status` to a request of `version`, served by `role`, that
    /// `trigger` made.
    pub fn count(
        &self,
        status: u16,
        version: http::Version,
        role: crate::rollout::Role,
        trigger: crate::trigger::Trigger,
    ) {
        let v = version_index(version);
        let class = status_class(status);
        self.by_version_class[trigger as usize][role as usize][v][class]
            .get_or_init(|| {
                self.requests.with_label_values(&[
                    &*self.label,
                    ["1xx", "2xx", "3xx", "4xx", "5xx"][class],
                    VERSIONS[v],
                    role.name(),
                    trigger.name(),
                ])
            })
            .inc();
    }
}

/// Streamed responses of one tenant that did not reach their end, by reason, resolved once.
///
/// A buffered response leaves in one piece with its head; a streamed one can be cut after its
/// head was sent, and the status counted in `tern_requests_total` then says nothing of it.
#[derive(Debug, Clone)]
pub struct Undelivered {
    /// The guest failed (trap, limit, deadline) after its head was sent: the body was aborted.
    pub guest_failed: IntCounter,
    /// A backend's body that the guest forwarded (`response_forward`) failed, passed the
    /// backend's total timeout or the tenant's response limit.
    pub backend_failed: IntCounter,
    /// The client closed the connection or stream before the body's end.
    pub client_gone: IntCounter,
}

/// Declares the metrics registered by name alone, each once: a field of [`Named`] (its doc
/// is the metric's help), and what [`Registrar`] registers for it (the kind, then the name,
/// help and labels or buckets). A new metric is one entry here.
macro_rules! named_metrics {
    ($($vis:vis $field:ident: $kind:ident($name:literal, $help:literal $(, $more:expr)* $(,)?);)*) => {
        /// The metrics registered by name alone ([`Metrics`] derefs to them).
        #[derive(Debug, Clone)]
        pub struct Named {
            $(
                #[doc = $help]
                $vis $field: named_metrics!(@type $kind),
            )*
        }

        impl Named {
            fn register(r: &Registrar) -> Self {
                Self {
                    $($field: r.$kind($name, $help $(, $more)*),)*
                }
            }
        }
    };
    (@type gauge) => { IntGauge };
    (@type gauges) => { IntGaugeVec };
    (@type counter) => { IntCounter };
    (@type counters) => { IntCounterVec };
    (@type thread_counters) => { Counters };
    (@type sizes) => { Sizes };
    (@type histogram) => { Histogram };
}

named_metrics! {
    requests: thread_counters(
        "tern_requests_total",
        "Responses sent, by tenant, status class, HTTP version (1.0, 1.1, 2, 3), \
         deployment (current: the tenant's version; candidate: its new version in a gradual \
         deployment) and trigger (request: a client's; schedule: a run of the tenant's \
         schedule, [[tenant.schedule]]).",
        &["tenant", "status", "version", "deployment", "trigger"],
    );
    outcomes: thread_counters(
        "tern_guest_outcomes_total",
        "Guest runs by tenant and outcome (ok, trap kinds, timeout, exit, overload, ...).",
        &["tenant", "outcome"],
    );
    sliced: counters(
        "tern_guest_sliced_total",
        "Guest runs that used their first time slice up (2 ms of CPU after the first epoch \
         tick) and ran on in turns, yielding their worker to the other requests between turns, \
         by tenant. Each turn waits behind the worker's other ready requests (the `ready` \
         phase); a tenant whose runs keep doing so gets a short first slice.",
        &["tenant"],
    );
    undelivered: counters(
        "tern_responses_undelivered_total",
        "Streamed responses whose body did not reach its end, by tenant and reason \
         (guest_failed: the guest failed after the head was sent; backend_failed: a \
         backend's body the guest forwarded failed, timed out or passed the limit; \
         client_gone: the client left first).",
        &["tenant", "reason"],
    );
    pool: gauges(
        "tern_pool_slots",
        "Pooling allocator slots by kind (instances, memories, tables, stacks) and \
         state (in_use, warm: unused but still mapped).",
        &["kind", "state"],
    );
    labelled_tenants: gauge(
        "tern_tenant_labels",
        "Tenants with their own metrics label (the rest count as `other`).",
    );
    modules_loaded: gauge(
        "tern_modules_loaded",
        "Compiled modules and components loaded (mapped); tenants and versions of the same \
         bytes share one.",
    );
    resident: gauges(
        "tern_pool_resident_bytes",
        "Bytes kept resident by unused (warm) pool slots, by kind.",
        &["kind"],
    );
    pub queue_depth: gauge(
        "tern_queue_depth",
        "Requests waiting for their turn in their tenant's line on a worker, a free pool slot \
         or a tenant concurrency permit.",
    );
    pub admin_throttled: counter(
        "tern_admin_throttled_total",
        "Admin requests with a wrong, expired or revoked token answered 429: past \
         10 failures per second from one client address.",
    );
    pub audit_dropped: counter(
        "tern_audit_dropped_total",
        "Audit log lines dropped because the writer fell behind (a stuck disk): the admin API \
         never waits for it.",
    );
    pub task_panics: counter(
        "tern_task_panics_total",
        "Request tasks that panicked, caught and counted (the request's stream is reset, the \
         server serves on); a bug to report if it is ever above 0.",
    );
    pub connections_open: gauge(
        "tern_connections_open",
        "Open client connections on the public listener, all workers (at most \
         server.max_connections).",
    );
    pub worker_connections: gauges(
        "tern_worker_connections_open",
        "Open client connections on the public listeners by worker thread (`worker`, from 0) \
         and transport (`tcp`: HTTP/1 and HTTP/2, with or without TLS; `quic`: HTTP/3): how \
         evenly the kernel (TCP) and the connection-ID steering (QUIC) spread them.",
        &["worker", "transport"],
    );
    pub tls_handshakes: counter(
        "tern_tls_handshakes_total",
        "TLS handshakes completed on the TLS listener.",
    );
    pub tls_handshake_failures: counters(
        "tern_tls_handshake_failures_total",
        "TLS handshakes that failed, by reason: timeout (not done within \
         server.tls_handshake_timeout_ms), busy (server.max_tls_handshakes in flight), \
         no_certificate (no certificate for the name asked and no default), protocol (not \
         TLS, or TLS this server does not speak), alert (the client refused, e.g. an \
         untrusted certificate), io (the connection closed or failed).",
        &["reason"],
    );
    pub quic_retries: counter(
        "tern_quic_retries_total",
        "HTTP/3 clients sent a QUIC Retry to prove their address before their handshake \
         (done past half of server.max_tls_handshakes in flight): what a handshake flood cost \
         one packet each.",
    );
    pub tls_handshakes_in_progress: gauge(
        "tern_tls_handshakes_in_progress",
        "TLS handshakes in progress on the TLS listener (at most server.max_tls_handshakes; \
         a connection past it is closed and counted busy).",
    );
    pub tls_certificate_expiry: gauges(
        "tern_tls_certificate_expiry_timestamp_seconds",
        "When each certificate the TLS listener serves expires (Unix seconds), by its first \
         host name (`default` for the default certificate).",
        &["certificate"],
    );
    pub acme_orders: counters(
        "tern_acme_orders_total",
        "Certificate orders placed with the ACME CA ([tls.acme]), by outcome: issued (a \
         certificate obtained and served), failed (the CA refused or could not be reached; \
         retried with backoff, the old certificate keeps serving), busy (another process \
         sharing the data directory holds the name's lease and orders it).",
        &["outcome"],
    );
    pub registry_syncs: counters(
        "tern_registry_syncs_total",
        "Reads of the fleet's shared registry (`[registry] url`), by outcome: unchanged (a \
         conditional read answered not modified), changed (a new revision was read and \
         applied), unreachable (the store could not be reached; what was served keeps \
         serving), failed (a tenant of the new revision could not be loaded, e.g. an object \
         refused by its digest; its running version keeps serving).",
        &["outcome"],
    );
    pub registry_revision: gauge(
        "tern_registry_revision",
        "The revision of the fleet's shared registry this replica last applied (0: none yet).",
    );
    pub registry_artifacts: counters(
        "tern_registry_artifacts_total",
        "Compiled artifacts and the shared registry: downloaded (taken from the registry, \
         verified, not compiled here), published (compiled here and stored for the other \
         replicas), refused (an artifact in the registry failed verification; compiled here \
         instead).",
        &["outcome"],
    );
    pub registry_nudges: counters(
        "tern_registry_nudges_total",
        "Replicas told to read the shared registry at once after a change made here, by \
         outcome: sent (it answered), failed (unreachable or refused within 1 s; it reads \
         the change at its next poll), received (another replica told this one).",
        &["outcome"],
    );
    pub registry_peers: gauge(
        "tern_registry_peers",
        "The other replicas this one tells of a change it makes (those whose reports in the \
         registry are fresh and name an admin URL; `[registry] advertise`).",
    );
    pub memory_peak: sizes(
        "tern_guest_memory_peak_bytes",
        "Largest linear memory each guest reached during its request.",
    );
    pub compile: histogram(
        "tern_module_compile_duration_seconds",
        "Time to compile a module ahead of time (artifact cache misses only).",
        prometheus::exponential_buckets(0.001, 2.0, 17).expect("static buckets"),
    );
    pub log_dropped: counter(
        "tern_guest_log_lines_dropped_total",
        "Guest stdout/stderr log lines dropped because a tenant exceeded its log budget.",
    );
    pub live_log_records: thread_counters(
        "tern_live_log_records_total",
        "Requests as live log records (tern logs): kept in their tenant's ring, or left out by \
         its sampling past server.live_logs.records_per_second.",
        &["kept"],
    );
    pub live_log_tailers: gauge(
        "tern_live_log_tailers",
        "Live log streams open (tern logs -f), every tenant's; a fleet's merged stream counts on \
         each replica it reads.",
    );
    pub schedule_runs: counters(
        "tern_schedule_runs_total",
        "Ticks of tenants' schedules, by tenant and what became of them: ok (the guest \
         answered 1xx-3xx), failed (4xx/5xx or a failure), skipped (the last run still ran, \
         overlap = \"skip\"), missed (this replica could not reach the fleet's registry to \
         take it before the next tick, and no other replica had: counted by each such \
         replica), lost (the replica \
         running a tick let its lease pass without recording the end: counted by the replica \
         that runs it once more); ok, failed and skipped are counted by the replica that took \
         the tick (once for a fleet); runs asked by hand count too.",
        &["tenant", "outcome"],
    );
    pub schedule_lag: histogram(
        "tern_schedule_lag_seconds",
        "From a schedule's tick to its guest's start (taking the tick in the registry \
         included).",
        prometheus::exponential_buckets(0.0005, 2.0, 16).expect("static buckets"),
    );
    pub rollout_steps: counters(
        "tern_rollout_steps_total",
        "Steps gradual deployments took by themselves, by tenant and step (advance: the next \
         stage; promote: after the last timed stage; abort: the abort rule; restart: a stage \
         that ended while the server was down runs again), counted by the replica \
         that made the change (once for a fleet).",
        &["tenant", "step"],
    );
    pub live_log_dropped: counter(
        "tern_live_log_dropped_total",
        "Live log records tailers missed because they read slower than their tenant's requests \
         came (each stream is told how many).",
    );
    pub deploys: counters(
        "tern_deploys_total",
        "Module deploys (loads of a tenant's module) by tenant and outcome.",
        &["tenant", "outcome"],
    );
    pub kv_operations: counters(
        "tern_kv_operations_total",
        "Key-value operations of guests by store and result (ok, limit, invalid, unavailable: nothing written, unknown: a write sent and never answered).",
        &["store", "result"],
    );
    pub outbound_requests: counters(
        "tern_outbound_requests_total",
        "Outbound requests of guests by tenant, backend (`url` for requests by URL) and \
         status (status class, or denied, timeout, error, limit).",
        &["tenant", "backend", "status"],
    );
    pub outbound_connections: counter(
        "tern_outbound_connections_total",
        "Connections opened for outbound requests; the rest of the requests reused \
         a pooled one.",
    );
    pub trace_spans_exported: counter(
        "tern_trace_spans_exported_total",
        "Spans the trace collector accepted ([tracing]).",
    );
    pub trace_spans_dropped: counters(
        "tern_trace_spans_dropped_total",
        "Spans of kept requests that were not exported, by reason: queue_full (more \
         requests waited for export than tracing.max_queue: the collector is slow or \
         down), export_failed (the collector refused the batch or did not answer within \
         tracing.timeout_ms).",
        &["reason"],
    );
    pub cache_requests: thread_counters(
        "tern_cache_requests_total",
        "Requests of tenants with a cache ([tenant.cache]), by result: hit (answered from \
         the cache, no guest ran), collapsed (waited for another request filling the same \
         key, then answered with its stored answer), miss (the guest ran; its answer may \
         have been stored), bypass (a method the cache does not answer).",
        &["tenant", "result"],
    );
    pub outbound_cache_requests: thread_counters(
        "tern_outbound_cache_requests_total",
        "Guests' requests to backends whose answers are cached (outbound.backends.NAME.cache), \
         by tenant, backend and result: hit (answered from the tenant's cache, the backend \
         not asked), collapsed (waited for another request asking the same, then answered \
         with its stored answer), stale, revalidated, miss (the backend was asked), bypass \
         (not a GET or HEAD, or Tern-Cache: pass).",
        &["tenant", "backend", "result"],
    );
    pub guest_cache_requests: thread_counters(
        "tern_guest_cache_requests_total",
        "Guests' lookups of their own entries in their tenant's cache (the cache API), by \
         tenant and result: hit (found fresh), collapsed (waited for another request \
         inserting it, then found it), stale (found within its stale-while-revalidate), \
         miss (not found).",
        &["tenant", "result"],
    );
    pub cache_stored_bytes: gauges(
        "tern_cache_stored_bytes",
        "Bytes held by a tenant's cache (bodies, headers and keys; at most its \
         cache.max_mib).",
        &["tenant"],
    );
    pub cache_evictions: counters(
        "tern_cache_evictions_total",
        "Entries a tenant's cache dropped to stay within its cache.max_mib.",
        &["tenant"],
    );
    pub cache_purges: counters(
        "tern_cache_purges_total",
        "Purges applied to tenants' caches, by where they came from: api (asked of this \
         server), fleet (asked of another replica, read from the shared registry), missed \
         (this replica fell behind the registry's purge log and dropped every stored \
         answer instead), guest (a guest purged a tag of its tenant's cache here).",
        &["from"],
    );
    pub rate_limited: counters(
        "tern_rate_limited_total",
        "Requests over a tenant's rate limit ([[tenant.rate_limit]]), by tenant, limit and \
         mode: enforce (refused with 429, no guest ran), dry_run (counted, served).",
        &["tenant", "limit", "mode"],
    );
    pub rate_limit_delayed: counters(
        "tern_rate_limit_delayed_total",
        "Requests a tenant's rate limit made wait (within its burst, past its delay).",
        &["tenant", "limit"],
    );
    pub rate_limit_unreachable: counters(
        "tern_rate_limit_unreachable_total",
        "Requests a shared rate limit (shared = true) could not count: its Redis store did not \
         answer; let through or refused as its when_unreachable says.",
        &["tenant", "limit"],
    );
    pub rate_limit_keys: gauges(
        "tern_rate_limit_keys",
        "Keys (clients, header values...) a tenant's rate limit tracks, at most its max_keys.",
        &["tenant", "limit"],
    );
    pub rate_counter_entries: gauges(
        "tern_rate_counter_entries",
        "Entries a tenant's rate counter or penalty box keeps for its guests \
         ([[tenant.rate_counter]], [[tenant.penalty_box]]), at most its max_entries.",
        &["tenant", "kind", "name"],
    );
    pub websocket_connections: gauges(
        "tern_websocket_connections",
        "WebSocket connections open, by tenant and mode (handoff: relayed to a backend; \
         events: held by Tern, its events sent to the guest).",
        &["tenant", "mode"]
    );
    pub websocket_messages: counters(
        "tern_websocket_messages_total",
        "WebSocket messages relayed, by tenant and direction (in: from clients, out: to \
         them).",
        &["tenant", "direction"]
    );
    pub websocket_bytes: counters(
        "tern_websocket_bytes_total",
        "WebSocket bytes relayed (frames as sent), by tenant and direction (in, out).",
        &["tenant", "direction"]
    );
    pub websocket_closes: counters(
        "tern_websocket_closes_total",
        "WebSocket connections closed, by tenant and close code: the first close frame either \
         side sent or the relay sent (1001 idle, lifetime or shutdown; 1008 frame rate; 1009 \
         message size; 1002 protocol), 1006 when it ended without one.",
        &["tenant", "code"]
    );
    pub websocket_refused: counters(
        "tern_websocket_refused_total",
        "WebSocket openings refused before any guest ran, by tenant and why (tenant: its \
         websocket.max_connections; server: max_websockets), or after (backend: it could \
         not be reached or refused the upgrade; guest: an events guest did not accept it).",
        &["tenant", "why"]
    );
    pub websocket_published: counters(
        "tern_websocket_published_total",
        "Published WebSocket messages (events mode), by tenant and outcome per connection \
         reached on this server (delivered: queued for it; dropped: its queue was full).",
        &["tenant", "outcome"]
    );
    pub websocket_fleet_publishes: counters(
        "tern_websocket_fleet_publishes_total",
        "Publishes sent on to the other replicas of a fleet, by outcome (sent, failed).",
        &["outcome"]
    );
    pub compressed: thread_counters(
        "tern_compressed_responses_total",
        "Answers sent compressed ([tenant.compression]), by tenant and encoding (zstd, br, \
         gzip).",
        &["tenant", "encoding"],
    );
    pub compression_bytes: thread_counters(
        "tern_compression_bytes_total",
        "Body bytes of the answers sent compressed, by tenant: plain (before compression) \
         and sent (after); their ratio is what compression saves.",
        &["tenant", "body"],
    );
}

/// All of Tern's metrics and the registry that exposes them.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    /// The metrics registered by name alone.
    named: Named,
    /// Requests received and not yet answered (up to their response head).
    pub in_flight: Level,
    /// Time from a request's arrival until its response head is ready.
    total: per_thread::Family,
    /// By deployment ([`crate::rollout::Role`]), then phase: the series in that order.
    phases: per_thread::Family,
    /// Tenant names that have their own label (taken at load time, never per request).
    labelled: std::sync::Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
    max_tenant_labels: usize,
    unrouted: TenantMetrics,
    /// Outbound time to response head, by tenant.
    pub outbound_duration: HistogramVec,
    /// Trace ids of kept requests on the latency histograms' buckets.
    pub exemplars: std::sync::Arc<Exemplars>,
}

impl std::ops::Deref for Metrics {
    type Target = Named;

    fn deref(&self) -> &Named {
        &self.named
    }
}

impl Metrics {
    /// Registers every metric. At most `max_tenant_labels` tenants get their own label.
    ///
    /// # Panics
    /// Never in practice: metric definitions are static and registered once.
    pub fn new(max_tenant_labels: usize) -> Self {
        let r = Registrar(Registry::new());
        let named = Named::register(&r);
        // Every request adds to these: kept per thread (`per_thread`).
        let in_flight = r.register(Level::new(
            "tern_requests_in_flight",
            "Requests received and not yet answered (up to their response head).",
        ));
        let total = r.register(per_thread::Family::new(
            "tern_request_duration_seconds",
            "Time from a request's arrival until its response head is ready.",
            &[],
            &[vec![]],
        ));
        let roles = [
            crate::rollout::Role::Current,
            crate::rollout::Role::Candidate,
        ];
        let phase_labels: Vec<Vec<&str>> = roles
            .iter()
            .flat_map(|role| Phase::EVERY.map(|p| vec![p.name(), role.name()]))
            .collect();
        let phases = r.register(per_thread::Family::new(
            "tern_request_phase_duration_seconds",
            "Time spent in each phase of a request: route, queue, instantiate, run, \
             teardown; outbound (part of run: waiting for outbound requests) for \
             requests that made any; by deployment (current, or a gradual \
             deployment's candidate).",
            &["phase", "deployment"],
            &phase_labels,
        ));
        // Every outcome from the start: a rate over a series that appears only with its first
        // order is no rate at all.
        for outcome in ["issued", "failed", "busy"] {
            named.acme_orders.with_label_values(&[outcome]);
        }
        let outbound_duration = r.register(
            HistogramVec::new(
                HistogramOpts::new(
                    "tern_outbound_duration_seconds",
                    "Time from an outbound request's start to its response head, by tenant.",
                )
                .buckets(buckets()),
                &["tenant"],
            )
            .expect("valid metric"),
        );
        let Registrar(registry) = r;
        #[cfg(target_os = "linux")]
        registry
            .register(Box::new(
                prometheus::process_collector::ProcessCollector::for_self(),
            ))
            .expect("process metrics registered once");
        let unrouted = Self::tenant_counters(&named.requests, "none");
        Self {
            registry,
            named,
            in_flight,
            total,
            phases,
            labelled: Default::default(),
            max_tenant_labels,
            unrouted,
            outbound_duration,
            exemplars: Default::default(),
        }
    }

    /// The handles the tracer's exporter counts with.
    pub fn trace(&self) -> crate::trace::TraceMetrics {
        crate::trace::TraceMetrics {
            exported: self.trace_spans_exported.clone(),
            dropped_queue: self.trace_spans_dropped.with_label_values(&["queue_full"]),
            dropped_export: self
                .trace_spans_dropped
                .with_label_values(&["export_failed"]),
        }
    }

    fn tenant_counters(requests: &Counters, label: &str) -> TenantMetrics {
        TenantMetrics {
            requests: requests.clone(),
            label: label.into(),
            by_version_class: std::sync::Arc::default(),
        }
    }

    /// The label a tenant's metrics use: its name, or `other` past the label cap. A tenant
    /// keeps its label across redeploys.
    pub fn tenant_label(&self, name: &str) -> String {
        let mut labelled = self.labelled.lock().unwrap_or_else(|e| e.into_inner());
        if labelled.contains(name) {
            return name.to_string();
        }
        if labelled.len() < self.max_tenant_labels {
            labelled.insert(name.to_string());
            self.labelled_tenants.set(labelled.len() as i64);
            name.to_string()
        } else {
            "other".to_string()
        }
    }

    /// Resolves the request counters of a tenant labelled `label`.
    pub fn tenant(&self, label: &str) -> TenantMetrics {
        Self::tenant_counters(&self.requests, label)
    }

    /// Counters for requests that matched no tenant (`tenant="none"`).
    pub fn unrouted(&self) -> &TenantMetrics {
        &self.unrouted
    }

    /// The outcome counter of a tenant (resolved once per tenant and outcome by the caller).
    pub fn outcome(&self, label: &str, outcome: &str) -> Counter {
        self.outcomes.with_label_values(&[label, outcome])
    }

    /// The counter of a tenant's runs that used their first time slice up.
    pub fn sliced(&self, label: &str) -> IntCounter {
        self.sliced.with_label_values(&[label])
    }

    /// The undelivered-response counters of a tenant labelled `label`.
    pub fn undelivered(&self, label: &str) -> Undelivered {
        let counter = |reason| self.undelivered.with_label_values(&[label, reason]);
        Undelivered {
            guest_failed: counter("guest_failed"),
            backend_failed: counter("backend_failed"),
            client_gone: counter("client_gone"),
        }
    }

    /// Records a request's phase timings up to the last phase it `reached`, as served by
    /// `role`.
    pub fn observe(&self, t: &Timings, reached: Phase, role: crate::rollout::Role) {
        // The role's series, in `Phase::EVERY` order.
        let series = |phase: usize| self.phases.series(role as usize * PHASES + phase);
        for (phase, d) in t.0.iter().enumerate().take(reached as usize + 1) {
            series(phase).observe(*d);
        }
        for phase in Phase::WHEN_USED {
            let d = t.0[phase as usize];
            if !d.is_zero() {
                series(phase as usize).observe(d);
            }
        }
    }

    /// Records a request's total time to response head.
    pub fn observe_total(&self, d: Duration) {
        self.total.series(0).observe(d);
    }

    /// Renders every metric in the Prometheus text format, refreshing the pool gauges first.
    pub fn render(&self, engine: &Engine) -> Vec<u8> {
        self.modules_loaded
            .set(i64::try_from(crate::artifact::loaded_on(engine)).unwrap_or(i64::MAX));
        if let Some(m) = engine.pooling_allocator_metrics() {
            let set = |kind: &str, state: &str, v: u64| {
                self.pool
                    .with_label_values(&[kind, state])
                    .set(i64::try_from(v).unwrap_or(i64::MAX));
            };
            let n = |v: usize| v as u64;
            set("instances", "in_use", m.core_instances());
            set("memories", "in_use", n(m.memories()));
            set("tables", "in_use", n(m.tables()));
            set("stacks", "in_use", n(m.stacks()));
            set("memories", "warm", u64::from(m.unused_warm_memories()));
            set("tables", "warm", u64::from(m.unused_warm_tables()));
            set("stacks", "warm", u64::from(m.unused_warm_stacks()));
            let bytes = |kind: &str, v: usize| {
                self.resident
                    .with_label_values(&[kind])
                    .set(i64::try_from(v).unwrap_or(i64::MAX));
            };
            bytes("memories", m.unused_memory_bytes_resident());
            bytes("tables", m.unused_table_bytes_resident());
            bytes("stacks", m.unused_stack_bytes_resident().unwrap_or(0));
        }
        let mut out = Vec::with_capacity(16 * 1024);
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("encode to a Vec");
        out
    }

    /// [`Self::render`] in the OpenMetrics format, with the latency histograms' exemplars.
    pub fn render_openmetrics(&self, engine: &Engine) -> Vec<u8> {
        let text = self.render(engine);
        openmetrics::convert(&String::from_utf8_lossy(&text), &self.exemplars)
    }

    /// Whether a scraper's `Accept` asks for OpenMetrics.
    pub fn openmetrics_wanted(accept: &[u8]) -> bool {
        openmetrics::wanted(accept)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_timing_lists_the_phases_reached_in_milliseconds() {
        let mut t = Timings::default();
        t.set(Phase::Route, Duration::from_nanos(1_500));
        t.set(Phase::Queue, Duration::from_micros(12_345));
        t.set(Phase::Instantiate, Duration::from_micros(7));
        assert_eq!(
            t.server_timing(Duration::from_micros(2_000_001), Phase::Queue, None),
            "route;dur=0.001, queue;dur=12.345, total;dur=2000.001"
        );
        assert_eq!(
            t.server_timing(Duration::ZERO, Phase::Instantiate, Some("0123456789ab")),
            "route;dur=0.001, queue;dur=12.345, instantiate;dur=0.007, total;dur=0.000, \
             version;desc=0123456789ab"
        );
        // The header value is the same text, made on the stack, or on the heap when a long
        // version outgrows the stack's room (every phase at its longest).
        let mut longest = Timings::default();
        for p in Phase::ALL.iter().chain(&Phase::WHEN_USED) {
            longest.set(*p, Duration::MAX);
        }
        let long_version = "v".repeat(500);
        for (timings, version) in [
            (t, None),
            (t, Some("0123456789ab")),
            (longest, Some("0123456789ab")),
            (longest, Some(long_version.as_str())),
            (t, Some(long_version.as_str())),
        ] {
            for reached in [Phase::Route, Phase::Queue, Phase::Teardown] {
                let text = timings.server_timing(Duration::MAX, reached, version);
                let value = timings
                    .server_timing_value(Duration::MAX, reached, version)
                    .expect("a header value");
                assert_eq!(value.to_str().expect("text"), text);
            }
        }
        // Around the stack's room: a version that makes the value 447, 448 and 449 bytes.
        let bare = longest
            .server_timing(Duration::MAX, Phase::Teardown, Some(""))
            .len();
        for len in [
            phases::STACK_LINE - 1,
            phases::STACK_LINE,
            phases::STACK_LINE + 1,
        ] {
            let version = "v".repeat(len - bare);
            let value = longest
                .server_timing_value(Duration::MAX, Phase::Teardown, Some(&version))
                .expect("a header value");
            assert_eq!(value.len(), len);
            assert!(value.to_str().expect("text").ends_with(&version));
        }
        assert!(
            longest
                .server_timing(Duration::MAX, Phase::Teardown, Some("0123456789ab"))
                .len()
                < phases::STACK_LINE,
            "the longest value with a version fits on the stack"
        );
        // Past u64 microseconds (584,000 years) the figure saturates rather than wraps.
        t.set(Phase::Route, Duration::MAX);
        assert!(
            t.server_timing(Duration::from_micros(1_010), Phase::Route, None)
                .starts_with(&format!(
                    "route;dur={}.{}, ",
                    u64::MAX / 1000,
                    u64::MAX % 1000
                ))
        );
    }
}
