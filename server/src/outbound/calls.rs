//! One guest's outbound requests, whatever its kind: the checks before a request is made, what
//! it carries from the incoming request, and the exchange (client, budget, send, timeouts,
//! metrics). Each guest ABI keeps only an adapter that maps [`Refused`] and [`NoHead`] to its
//! own errors (`tern`'s errnos, `wasi:http`'s error codes).

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::header::{HOST, HeaderName};
use http::{HeaderMap, HeaderValue, Request, Response};
use hyper::body::Incoming;
use tokio::sync::OwnedSemaphorePermit;

use super::{CDN_ID, Destination, HeadError, MAX_HOPS, OutBody, client, hops, send};
use crate::body::Fetched;

/// `CDN-Loop` (RFC 8586): where a request has been.
pub static CDN_LOOP: HeaderName = HeaderName::from_static("cdn-loop");
pub use crate::trace::{TRACEPARENT, TRACESTATE};

/// A tenant's outbound policy with its metric handles, shared by its requests.
#[derive(Debug)]
pub struct Grant {
    /// What its guests may call.
    pub policy: super::Policy,
    /// The tenant's metrics label.
    pub label: String,
    /// `tern_outbound_requests_total`.
    pub requests: prometheus::IntCounterVec,
    /// Time to response head, this tenant's child of `tern_outbound_duration_seconds`.
    pub duration: prometheus::Histogram,
    /// `tern_outbound_connections_total`.
    pub opened: prometheus::IntCounter,
    /// The tenant's budget of guest log lines (denials are logged within it).
    pub log_budget: Arc<crate::logwriter::LogBudget>,
    /// The tenant's cache, for its backends with `cache = true`.
    pub readthrough: Option<super::cached::Readthrough>,
}

/// What an incoming request hands on to the requests its guest sends: how often it passed
/// through Tern, the `CDN-Loop` value to send on, and the trace it belongs to (Tern's own when
/// tracing is on: each request is a client span; else the caller's, passed on as it came).
#[derive(Debug, Clone, Default)]
pub struct Passing {
    hops: usize,
    cdn_loop: Option<HeaderValue>,
    trace: Option<(HeaderValue, Option<HeaderValue>)>,
    traced: Option<Arc<crate::trace::Active>>,
}

impl Passing {
    /// What the incoming request with `headers` (and trace `traced`, when tracing is on)
    /// hands on.
    pub fn of(headers: &HeaderMap, traced: Option<&Arc<crate::trace::Active>>) -> Self {
        // Built for every component request: most came through no CDN, so the value is just
        // ours, with nothing to allocate.
        let cdn_loop = if headers.contains_key(&CDN_LOOP) {
            let mut cdn_loop = String::new();
            for v in headers.get_all(&CDN_LOOP) {
                if let Ok(v) = v.to_str() {
                    cdn_loop.push_str(v);
                    cdn_loop.push_str(", ");
                }
            }
            cdn_loop.push_str(CDN_ID);
            HeaderValue::from_str(&cdn_loop).ok()
        } else {
            Some(HeaderValue::from_static(CDN_ID))
        };
        Self {
            hops: hops(headers.get_all(&CDN_LOOP).iter()),
            cdn_loop,
            trace: headers
                .get(&TRACEPARENT)
                .map(|tp| (tp.clone(), headers.get(&TRACESTATE).cloned())),
            traced: traced.cloned(),
        }
    }

    /// Adds `CDN-Loop` (what the request passed through, and us) and, unless the guest set
    /// its own, the trace headers: when tracing is on, a new client span's (its id
    /// returned); else the caller's.
    fn stamp(&self, headers: &mut HeaderMap) -> Option<[u8; 8]> {
        if let Some(v) = &self.cdn_loop {
            headers.insert(CDN_LOOP.clone(), v.clone());
        }
        if headers.contains_key(&TRACEPARENT) {
            return None;
        }
        if let Some(active) = &self.traced {
            let span = crate::trace::span_id();
            active.stamp(headers, span);
            return Some(span);
        }
        if let Some((tp, ts)) = &self.trace {
            headers.insert(TRACEPARENT.clone(), tp.clone());
            if let Some(ts) = ts {
                headers.insert(TRACESTATE.clone(), ts.clone());
            }
        }
        None
    }
}

/// Why a guest may not make one more outbound request.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    /// Over `outbound.max_requests`.
    #[error("at most {0} outbound requests per request (outbound.max_requests)")]
    TooMany(u32),
    /// The incoming request passed through Tern too often.
    #[error(
        "request loop: this request already passed through Tern {0} times (CDN-Loop); outbound requests are refused"
    )]
    Loop(usize),
}

/// Why an exchange got no response head. Its text is what the guest reads (`tern`'s
/// `outbound_last_error`), so it says which setting bounded it.
#[derive(Debug, thiserror::Error)]
pub enum NoHead {
    /// The client for the target could not be made (its TLS roots).
    #[error("{0}")]
    NoClient(String),
    /// Connecting took longer than the backend's connect timeout.
    #[error("connecting to the backend took longer than {} ms (connect_timeout_ms)", .0.as_millis())]
    ConnectTimeout(Duration),
    /// Connecting failed.
    #[error("connecting to the backend failed: {0}")]
    Connect(String),
    /// Sending or reading the head failed.
    #[error("the request failed: {0}")]
    Request(String),
    /// The request was sent but no head came in time.
    #[error(
        "no response head within {} ms of sending the request (first_byte_timeout_ms)",
        .0.as_millis()
    )]
    FirstByte(Duration),
    /// The whole exchange took longer than the backend's total timeout.
    #[error("no response within {} ms (total_timeout_ms)", .0.as_millis())]
    Total(Duration),
    /// The request's `Tern-Cache` header is not one Tern reads; nothing was sent.
    #[error("Tern-Cache: {0}")]
    BadOverride(String),
}

impl NoHead {
    /// Whether a timeout ended it.
    pub fn is_timeout(&self) -> bool {
        matches!(
            self,
            Self::ConnectTimeout(_) | Self::FirstByte(_) | Self::Total(_)
        )
    }
}

/// The `status` label of an answered outbound request: its class.
fn class(status: u16) -> &'static str {
    match status {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}

impl Grant {
    /// What `p`'s tenant's guests may call (its `[tenant.outbound]`, `config`), with `cache`
    /// (the tenant's, when it has one) in front of its backends with `cache = true`.
    ///
    /// # Errors
    /// A policy that cannot be granted, in words for the operator.
    pub fn prepare(
        p: &crate::prepare::Preparing<'_>,
        config: &super::OutboundConfig,
        cache: Option<&Arc<crate::cache::Cache>>,
    ) -> Result<Self, String> {
        let policy = super::Policy::from_config(config).map_err(|e| format!("outbound: {e}"))?;
        let readthrough = cache.and_then(|cache| {
            super::cached::Readthrough::new(
                cache.clone(),
                policy.cached_backends(),
                p.metrics,
                p.label,
            )
        });
        Ok(Self {
            readthrough,
            policy,
            log_budget: p.log_budget.clone(),
            label: p.label.to_string(),
            requests: p.metrics.outbound_requests.clone(),
            duration: p.metrics.outbound_duration.with_label_values(&[p.label]),
            opened: p.metrics.outbound_connections.clone(),
        })
    }

    /// Logs that the guest's outbound request was refused and why (what
    /// `outbound_last_error` says), within the tenant's log budget: a denial shows only as
    /// an error value inside the guest (JavaScript's `fetch` throws a bare `NetworkError`),
    /// so its developer finds the reason here (and in `tern dev`'s terminal).
    pub fn log_denied(&self, request_id: &HeaderValue, why: &str) {
        if self.log_budget.allow() {
            tracing::warn!(
                target: "tern::guest",
                tenant = self.label.as_str(),
                request_id = request_id.to_str().unwrap_or("-"),
                "outbound request refused: {why}"
            );
        }
    }

    /// Counts one outbound request to `backend` that ended with `status`.
    pub fn count(&self, backend: &str, status: &str) {
        self.requests
            .with_label_values(&[self.label.as_str(), backend, status])
            .inc();
    }

    /// The metrics label of a request to `backend`: its name if the tenant has it (names a
    /// guest makes up must not become labels), `unknown` otherwise, `url` for URL requests
    /// (`backend` empty).
    pub fn label(&self, backend: &str) -> Arc<str> {
        if backend.is_empty() {
            Arc::from(super::URL_LABEL)
        } else {
            self.policy
                .backend_label(backend)
                .unwrap_or_else(|| Arc::from("unknown"))
        }
    }

    /// Whether the guest may make its `n`th outbound request (counting from 1) to `label`;
    /// a refusal is counted (`limit`, `denied`) and logged.
    ///
    /// # Errors
    /// [`Refused`].
    pub fn admit(
        &self,
        n: usize,
        passing: &Passing,
        label: &str,
        request_id: &HeaderValue,
    ) -> Result<(), Refused> {
        let max = self.policy.max_requests;
        let refused = if n > max as usize {
            self.count(label, "limit");
            Refused::TooMany(max)
        } else if passing.hops >= MAX_HOPS {
            self.count(label, "denied");
            Refused::Loop(passing.hops)
        } else {
            return Ok(());
        };
        self.log_denied(request_id, &refused.to_string());
        Err(refused)
    }

    /// Sends `req` to `target` and waits for the response head: `Host`, `CDN-Loop` and the
    /// trace are set, a slot of the target's budget is taken (held by the response body until
    /// it is dropped), the head must come within `first_byte` of the request being sent and
    /// within the target's total timeout. Counted and timed in the tenant's outbound metrics
    /// either way. (Readthrough, [`Grant::exchange`], comes before it.)
    ///
    /// # Errors
    /// [`NoHead`].
    pub(super) async fn fetch(
        &self,
        target: &Destination,
        req: Request<OutBody>,
        first_byte: Duration,
        passing: &Passing,
    ) -> Result<Response<Fetched>, NoHead> {
        let result = self.exchange_inner(target, req, first_byte, passing).await;
        match &result {
            Ok((resp, _)) => self.count(&target.label, class(resp.status().as_u16())),
            Err(f) => self.count(
                &target.label,
                if f.is_timeout() { "timeout" } else { "error" },
            ),
        }
        let (resp, permit) = result?;
        Ok(resp.map(|body| Fetched::live(body, permit)))
    }

    async fn exchange_inner(
        &self,
        target: &Destination,
        mut req: Request<OutBody>,
        first_byte: Duration,
        passing: &Passing,
    ) -> Result<(Response<Incoming>, OwnedSemaphorePermit), NoHead> {
        let client = client(target, &self.opened).map_err(NoHead::NoClient)?;
        let headers = req.headers_mut();
        headers.insert(HOST, target.host.clone());
        let span = passing.stamp(headers);
        *req.uri_mut() = target.uri.clone();
        let method = span.map(|_| req.method().clone());
        let started = Instant::now();
        let total = target.timeouts.total;
        let exchange = async {
            let permit = target
                .budget
                .clone()
                .acquire_owned()
                .await
                .map_err(|_| NoHead::Request("the backend's budget is closed".into()))?;
            match send(&client, req, first_byte).await {
                Ok(resp) => Ok((resp, permit)),
                Err(HeadError::Failed(e)) if e.is_connect() && timed_out(&e) => {
                    Err(NoHead::ConnectTimeout(target.timeouts.connect))
                }
                Err(HeadError::Failed(e)) if e.is_connect() => {
                    Err(NoHead::Connect(crate::error_chain(&e)))
                }
                Err(HeadError::Failed(e)) => Err(NoHead::Request(crate::error_chain(&e))),
                Err(HeadError::FirstByte) => Err(NoHead::FirstByte(first_byte)),
            }
        };
        let result = tokio::time::timeout(total, exchange)
            .await
            .unwrap_or(Err(NoHead::Total(total)));
        if result.is_ok() {
            self.duration.observe(started.elapsed().as_secs_f64());
        }
        if let (Some(span_id), Some(method), Some(active)) = (span, method, &passing.traced) {
            active.record(crate::trace::Call {
                span_id,
                start: started,
                end: Instant::now(),
                what: crate::trace::CallKind::Outbound {
                    method,
                    url: target.uri.clone(),
                    backend: target.label.clone(),
                    result: match &result {
                        Ok((resp, _)) => Ok(resp.status().as_u16()),
                        Err(f) => Err(f.to_string()),
                    },
                },
            });
        }
        result
    }
}

/// Whether an I/O timeout is among `e`'s causes.
fn timed_out(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(cause) = next {
        if cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
        {
            return true;
        }
        next = cause.source();
    }
    false
}
