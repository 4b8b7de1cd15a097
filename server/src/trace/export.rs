//! The exporter task: takes the batches of encoded spans off the queue every `batch_delay` (or
//! when a thread's batch has `max_batch` requests or the queue is half full), puts the OTLP
//! envelope in front of each and posts it to the collector. A batch the collector cannot take
//! for now (no connection, or OTLP/HTTP's retryable answers 429, 502, 503, 504) is sent again
//! after a pause, up to [`RETRIES`] times; one that cannot be delivered (still failing, no
//! answer within `timeout`, any other error status) is dropped and its spans counted. The
//! request path never waits for any of it: while the exporter waits, requests fill the queue
//! up to its bound, and past it their spans are dropped and counted.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::config::Settings;
use super::otlp::Envelope;
use super::queue::{Batch, Queue, Sending};
use crate::shutdown::Shutdown;
use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Request};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// The metric handles of tracing.
#[derive(Debug, Clone)]
pub struct TraceMetrics {
    /// Spans the collector accepted.
    pub exported: prometheus::IntCounter,
    /// Spans dropped because the queue was full.
    pub dropped_queue: prometheus::IntCounter,
    /// Spans dropped because their batch could not be exported.
    pub dropped_export: prometheus::IntCounter,
}

type Https = hyper_rustls::HttpsConnector<HttpConnector>;

/// How often a failing collector is logged (each failed batch is counted).
const LOG_EVERY: Duration = Duration::from_secs(60);

/// How many times a batch is sent again after a retryable failure, the first pause (doubling,
/// with up to a quarter more at random) and the longest a collector's `Retry-After` is obeyed.
const RETRIES: u32 = 3;
const FIRST_PAUSE: Duration = Duration::from_millis(200);
const MAX_PAUSE: Duration = Duration::from_secs(5);

/// Why a batch was not delivered.
enum Undelivered {
    /// For now: send it again (after the collector's `Retry-After`, when it gave one).
    Retry(String, Option<Duration>),
    /// For good.
    Drop(String),
}

/// How a stopping server's exporter knows its last requests are done: `in_flight` (requests
/// not yet answered) falls to zero, or `grace` passes.
pub(super) struct Draining {
    pub in_flight: Box<dyn Fn() -> i64 + Send + Sync>,
    pub grace: Duration,
}

pub(super) async fn run(
    settings: Settings,
    envelope: Envelope,
    queue: Arc<Queue>,
    metrics: TraceMetrics,
    stop: Shutdown,
    draining: Draining,
) {
    let client = match client(&settings) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("traces cannot be exported (every span is dropped): {e}");
            return;
        }
    };
    let mut exporter = Exporter {
        client,
        settings,
        envelope,
        metrics,
        logged: None,
        taken: Vec::new(),
        stopping: false,
    };
    loop {
        let stopping = tokio::select! {
            () = tokio::time::sleep(exporter.settings.batch_delay) => false,
            () = queue.wake.notified() => false,
            () = stop.wait() => true,
        };
        exporter.stopping = stopping;
        exporter.drain(&queue).await;
        if stopping {
            break;
        }
    }
    // Stopping: the requests still being answered are exported too, until they are done or
    // the shutdown grace has passed.
    let until = Instant::now() + draining.grace;
    while (draining.in_flight)() > 0 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(50)).await;
        exporter.drain(&queue).await;
    }
    exporter.drain(&queue).await;
}

fn client(settings: &Settings) -> Result<Client<Https, Full<Bytes>>, String> {
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?;
    let tls = if settings.url.scheme_str() == Some("https") {
        use hyper_rustls::ConfigBuilderExt;
        tls.with_native_roots()
            .map_err(|e| format!("the platform's CA certificates could not be loaded: {e}"))?
            .with_no_client_auth()
    } else {
        tls.with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth()
    };
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .build();
    Ok(Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build(connector))
}

struct Exporter {
    client: Client<Https, Full<Bytes>>,
    settings: Settings,
    envelope: Envelope,
    metrics: TraceMetrics,
    /// When a failure was last logged.
    logged: Option<Instant>,
    /// What the last drain took from the queue (kept for its room).
    taken: Vec<Batch>,
    /// The server is stopping: no batch is sent again (the shutdown grace bounds the rest).
    stopping: bool,
}

impl Exporter {
    /// Exports everything queued now, each thread's batch as one request.
    async fn drain(&mut self, queue: &Arc<Queue>) {
        let mut taken = std::mem::take(&mut self.taken);
        queue.take(&mut taken);
        for batch in taken.drain(..) {
            self.export(batch, queue).await;
        }
        self.taken = taken;
    }

    async fn export(&mut self, batch: Batch, queue: &Arc<Queue>) {
        let Batch {
            mut bytes, spans, ..
        } = batch;
        let at = self.envelope.wrap(&mut bytes);
        let body = Bytes::from_owner(Sending {
            bytes,
            at,
            queue: queue.clone(),
        });
        let mut pause = FIRST_PAUSE;
        let mut retries = 0;
        let result = loop {
            match self.send(body.clone()).await {
                Ok(()) => break Ok(()),
                Err(Undelivered::Retry(why, after)) if retries < RETRIES && !self.stopping => {
                    tracing::debug!(url = %self.settings.url, "traces: a batch is sent again: {why}");
                    let wait = after.unwrap_or_else(|| {
                        let quarter = pause.as_millis() as u64 / 4;
                        pause + Duration::from_millis(crate::random_below(quarter + 1))
                    });
                    tokio::time::sleep(wait.min(MAX_PAUSE)).await;
                    pause *= 2;
                    retries += 1;
                }
                Err(Undelivered::Retry(why, _) | Undelivered::Drop(why)) => break Err(why),
            }
        };
        match result {
            Ok(()) => self.metrics.exported.inc_by(spans as u64),
            Err(why) => {
                let why = if retries > 0 {
                    format!("{why} (sent {} times)", retries + 1)
                } else {
                    why
                };
                self.metrics.dropped_export.inc_by(spans as u64);
                if self.logged.is_none_or(|at| at.elapsed() >= LOG_EVERY) {
                    self.logged = Some(Instant::now());
                    tracing::warn!(
                        url = %self.settings.url,
                        "traces: a batch of {spans} spans was dropped (counted in \
                         tern_trace_spans_dropped_total; logged at most once a minute): {why}"
                    );
                }
            }
        }
    }

    /// Posts one export request of `body`.
    async fn send(&self, body: Bytes) -> Result<(), Undelivered> {
        let mut req = Request::post(self.settings.url.clone())
            .header(
                CONTENT_TYPE,
                HeaderValue::from_static("application/x-protobuf"),
            )
            .body(Full::new(body))
            .expect("a valid request");
        for (name, value) in &self.settings.headers {
            req.headers_mut().insert(name.clone(), value.clone());
        }
        let sent = async {
            // No connection, or one closed before an answer: the collector may be restarting.
            let resp = self
                .client
                .request(req)
                .await
                .map_err(|e| Undelivered::Retry(crate::error_chain(&e), None))?;
            let status = resp.status();
            if status.is_success() {
                return Ok(());
            }
            let retry_after = resp
                .headers()
                .get(RETRY_AFTER)
                .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok())
                .map(Duration::from_secs);
            let body = Limited::new(resp.into_body(), 4096)
                .collect()
                .await
                .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
                .unwrap_or_default();
            let why = format!("the collector answered {status}: {}", body.trim());
            Err(match status.as_u16() {
                429 | 502 | 503 | 504 => Undelivered::Retry(why, retry_after),
                _ => Undelivered::Drop(why),
            })
        };
        match tokio::time::timeout(self.settings.timeout, sent).await {
            Ok(r) => r,
            // A collector that takes this long is not asked again: the queue behind it fills.
            Err(_) => Err(Undelivered::Drop(format!(
                "no answer within {} ms",
                self.settings.timeout.as_millis()
            ))),
        }
    }
}
