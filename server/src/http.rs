//! The request path's front end: request ids, routing, admission, execution, and the response.
//!
//! [`handle`] never fails: every error becomes a short plain-text response with its own status,
//! an `x-request-id`, and a `Server-Timing` header with the phases the request reached.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use http::header::{CONNECTION, HOST, RETRY_AFTER, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri};
use hyper::body::Incoming;
use tokio::sync::oneshot;

use crate::app::App;
use crate::body::{ResponseBody, declared_length, plain};
use crate::context::{Connection, RequestContext};
use crate::execute::{self, Reply, RunOutput};
use crate::guest::{GuestRequest, Head, RequestBody};
use crate::metrics::{GaugeGuard, Phase, Timings};
use crate::outcome::{self, ExecError, Outcome};
use crate::tenant::TenantRef;

/// `x-request-id`: honoured when the client sends a sane one, generated otherwise.
pub static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
/// Where HTTP-01 challenge answers are asked for (RFC 8555 §8.3).
const ACME_CHALLENGE_PATH: &str = "/.well-known/acme-challenge/";
static SERVER_TIMING: HeaderName = HeaderName::from_static("server-timing");

/// Serves one request that came on `conn`. Infallible: failures become responses.
pub async fn handle(
    app: Arc<App>,
    mut req: Request<Incoming>,
    conn: Connection,
) -> Response<ResponseBody> {
    let arrived = Instant::now();
    // The client: the peer, or whom a trusted proxy in front says it forwards.
    let client = if app.trusted_proxies.is_empty() {
        conn.peer
    } else {
        app.trusted_proxies.client(conn.peer, req.headers())
    };
    let trace = app
        .tracer
        .as_ref()
        .map(|t| Traced::begin(t, &req, &conn, client));
    let request_id = match (client_request_id(req.headers()), &trace) {
        (Some(id), _) => id,
        // A traced request's id is its trace id: logs, error pages and traces join on it.
        (None, Some(t)) => t.active.trace_id_header(),
        (None, None) => new_request_id(),
    };
    // The access line, gathered as the request came (before its path is normalised), when
    // access lines are on.
    let access = crate::logwriter::access_enabled().then(|| crate::logwriter::AccessRecord {
        request_id: request_id.clone(),
        tenant: None,
        method: req.method().clone(),
        target: req.uri().clone(),
        with_query: app.access_log_query,
        version: req.version(),
        host: match req.uri().authority() {
            Some(a) => HeaderValue::from_str(a.as_str()).ok(),
            None => req.headers().get(HOST).cloned(),
        },
        remote: conn.peer,
        client: client.ip().to_canonical(),
        user_agent: req.headers().get(http::header::USER_AGENT).cloned(),
        referer: req.headers().get(http::header::REFERER).cloned(),
        trace_id: trace.as_ref().map(|t| *t.active.trace_id_hex()),
        arrived,
        status: 0,
    });
    let mut ex = Exchange {
        arrived,
        request_id,
        tls: conn.tls.is_some(),
        version: req.version(),
        timings: Timings::default(),
        trace,
        access,
    };
    let _in_flight = GaugeGuard::new(&app.metrics.in_flight);

    // Framing a proxy in front might read differently, a coding Tern cannot undo: refused
    // before anything reads the body, and the connection closed.
    if let Err((status, why)) = framing(&req) {
        ex.timings.set(Phase::Route, ex.arrived.elapsed());
        let mut resp = plain(status, &format!("{why}\n"));
        resp.headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
        return ex.unrouted(&app, resp);
    }
    // `OPTIONS *` asks about the server itself (RFC 9110 §9.3.7), no tenant.
    if req.uri().path() == "*" {
        ex.timings.set(Phase::Route, ex.arrived.elapsed());
        return ex.unrouted(&app, asterisk(req.method()));
    }
    // One meaning of the path for routing, the guest and everything keyed on it later.
    match crate::target::normalize(req.uri().path()) {
        Ok(std::borrow::Cow::Borrowed(_)) => {}
        Ok(std::borrow::Cow::Owned(path)) => match with_path(req.uri(), &path) {
            Some(uri) => *req.uri_mut() = uri,
            None => {
                ex.timings.set(Phase::Route, ex.arrived.elapsed());
                let resp = plain(StatusCode::BAD_REQUEST, "the request target is not a URI\n");
                return ex.unrouted(&app, resp);
            }
        },
        Err(why) => {
            ex.timings.set(Phase::Route, ex.arrived.elapsed());
            let resp = plain(StatusCode::BAD_REQUEST, &format!("{why}\n"));
            return ex.unrouted(&app, resp);
        }
    }
    // h2 carries the host in the URI (`:authority`); HTTP/1.1 in the Host header, or in the URI
    // too for an absolute-form target. Where both are given they must agree.
    let host = match authority(&req) {
        Ok(host) => host,
        Err(why) => {
            ex.timings.set(Phase::Route, ex.arrived.elapsed());
            let mut resp = plain(
                StatusCode::BAD_REQUEST,
                &format!("ambiguous request: {why}\n"),
            );
            resp.headers_mut()
                .insert(CONNECTION, HeaderValue::from_static("close"));
            return ex.unrouted(&app, resp);
        }
    };
    // An ACME HTTP-01 challenge in progress is answered before any tenant sees the path.
    if conn.tls.is_none()
        && let Some(token) = req.uri().path().strip_prefix(ACME_CHALLENGE_PATH)
        && let Some(answer) = app
            .registry
            .certificates()
            .and_then(|c| c.http_challenge(token))
    {
        ex.timings.set(Phase::Route, ex.arrived.elapsed());
        return ex.unrouted(&app, plain(StatusCode::OK, &answer));
    }
    let route = || {
        app.registry
            .live()
            .router
            .find(host, req.uri().path())
            .map(|(t, prefix_len)| (t.clone(), prefix_len))
    };
    let mut routed = route();
    if routed
        .as_ref()
        .is_some_and(|(t, _)| t.awaits_memset_reset())
    {
        // A swap area was just switched on and the tenants are being moved to the swap-safe
        // reset (milliseconds): route on the moved table.
        app.registry
            .memset_reset_ready(app.pool.queue_timeout())
            .await;
        routed = route();
    }
    ex.timings.set(Phase::Route, ex.arrived.elapsed());
    let Some((tenant, prefix_len)) = routed else {
        let resp = plain(
            StatusCode::NOT_FOUND,
            "no tenant is routed for this host and path\n",
        );
        return ex.unrouted(&app, resp);
    };
    if let Some(t) = &mut ex.trace {
        t.tenant = Some((tenant.clone(), prefix_len));
    }

    // (A request without a host name has nowhere to be sent: it is served.)
    if tenant.https_redirect
        && conn.tls.is_none()
        && let Some(&port) = app.https_port.get()
        && let Some(to) = host.and_then(|h| https_location(h, port, req.uri()))
    {
        return ex.unrouted(&app, redirect(&to));
    }

    // A declared body over the limit is refused before any instance is made.
    let declared = declared_length(req.headers());
    if declared.is_some_and(|n| n > tenant.limits.max_request_bytes) {
        let e = outcome::body_too_large(tenant.limits.max_request_bytes);
        return ex.reject(&app, &tenant, &e, Phase::Route);
    }

    let queued = Instant::now();
    if let Some(t) = &mut ex.trace {
        t.queued = Some(queued);
    }
    let admitted = match app
        .pool
        .admit(&tenant.slots, tenant.limits.max_concurrency)
        .await
    {
        Ok(admitted) => admitted,
        Err(overloaded) => {
            ex.timings.set(Phase::Queue, queued.elapsed());
            let e = ExecError::new(Outcome::Overload, overloaded.to_string());
            return ex.reject(&app, &tenant, &e, Phase::Queue);
        }
    };
    ex.timings.set(Phase::Queue, queued.elapsed());

    let (mut parts, body) = req.into_parts();
    // A `HEAD` response's body is never sent, so it is never counted as undelivered.
    let head_only = parts.method == Method::HEAD;
    let trace = ex.trace.as_ref().map(|t| t.active.clone());
    if let Some(t) = &trace
        && tenant.kind() != crate::config::GuestKind::Tern
    {
        // Components and CGI programs see their own span as the request's `traceparent` (its
        // header, `HTTP_TRACEPARENT`), so their logs and calls join the trace there. A `tern`
        // ABI guest asks `request_info` instead: one more header would cost every guest that
        // parses its headers (the SDK's `request()` does), traced or not.
        t.stamp(&mut parts.headers, t.run_span);
    }
    let context = RequestContext {
        conn,
        client,
        request_id: ex.request_id.clone(),
        prefix_len,
        version: parts.version,
        trace,
    };
    let request = GuestRequest::new(
        parts.method,
        parts.uri,
        parts.headers,
        RequestBody::Incoming(body),
        tenant.limits.max_request_bytes,
        context,
    );
    let (commit, mut committed) = oneshot::channel();
    let mut run = Box::pin({
        let tenant = tenant.clone();
        async move {
            let out = execute::run(tenant, request, commit).await;
            drop(admitted); // after teardown: the pool slot is free again
            out
        }
    });

    let out = tokio::select! {
        // A guest that ended wins: if it failed after committing a head that was never sent,
        // the client gets a clean error instead of a cut stream.
        biased;
        out = &mut run => out,
        Ok(head) = &mut committed => {
            // The body outgrew the buffer while the guest runs: send the head now and let the
            // guest run on in its own task, streaming into the body channel.
            let mut after = ex.timings;
            let app2 = app.clone();
            // Its trace ends with the guest: it is taken out of the exchange.
            let trace = ex.trace.take();
            let (status, arrived) = (head.status.as_u16(), ex.arrived);
            let request_id = ex.request_id.clone();
            tokio::spawn(async move {
                let out = run.await;
                record_phases(&mut after, &out);
                app2.metrics.observe(&after, Phase::Teardown);
                if let Some(mut t) = trace {
                    t.ran(&out);
                    t.end(&app2, (arrived, Instant::now()), &after, status, &request_id);
                }
            });
            let resp = streamed(&tenant, head, head_only);
            // Only route and queue are known when the head leaves; the rest reaches /metrics.
            return ex.finish(&app, Some(&tenant), resp, Phase::Queue);
        }
    };

    // The guest has ended. If it streamed, its head is still in `committed`: the guest wrote
    // past the buffer and finished before this task looked (a body just over the threshold,
    // written fast). That head is the response; the whole body waits in its channel.
    record_phases(&mut ex.timings, &out);
    app.metrics.observe(&ex.timings, Phase::Teardown);
    if let Some(t) = &mut ex.trace {
        t.ran(&out);
    }
    let resp = match out.result {
        Ok(Reply::Buffered(mut done)) => {
            if let ResponseBody::Forwarded(f) = &mut done.body {
                f.count_in(tenant.undelivered.clone(), head_only);
            }
            let mut resp = Response::new(done.body);
            *resp.status_mut() = done.status;
            *resp.headers_mut() = done.headers;
            resp
        }
        Ok(Reply::Streamed) => match committed.try_recv() {
            Ok(head) => streamed(&tenant, head, head_only),
            // Unreachable: a streamed run sent its head, and only the branch above takes it.
            Err(_) => {
                tracing::error!(
                    tenant = %tenant.name,
                    request_id = ex.request_id.to_str().unwrap_or("-"),
                    "a streamed response lost its head"
                );
                plain(StatusCode::INTERNAL_SERVER_ERROR, "internal error\n")
            }
        },
        Err(e) => error_response(&e, &tenant, &ex.ids()),
    };
    ex.finish(&app, Some(&tenant), resp, Phase::Teardown)
}

fn record_phases(t: &mut Timings, out: &RunOutput) {
    t.set(Phase::Instantiate, out.instantiate);
    t.set(Phase::Run, out.run);
    t.set(Phase::Teardown, out.teardown);
    t.set(Phase::Outbound, out.outbound);
    t.set(Phase::Kv, out.kv);
}

/// The response of a guest whose body streams: its head, and its body from the channel.
fn streamed(tenant: &TenantRef, head: Head, head_only: bool) -> Response<ResponseBody> {
    let body = ResponseBody::stream(head.body, tenant.undelivered.clone(), head_only);
    let mut resp = Response::new(body);
    *resp.status_mut() = head.status;
    *resp.headers_mut() = head.headers;
    resp
}

/// The response for a failure: its status, the body the tenant's error settings give it (`ids`:
/// the request id, and the trace id when it differs), and the headers its outcome calls for.
fn error_response(e: &ExecError, tenant: &TenantRef, ids: &str) -> Response<ResponseBody> {
    let (body, kind) = tenant.errors.body(e, ids);
    let mut resp = plain(e.outcome.status(), &body);
    if let Some(kind) = kind {
        resp.headers_mut().insert(http::header::CONTENT_TYPE, kind);
    }
    match e.outcome {
        Outcome::Overload => {
            resp.headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from_static("1"));
        }
        // The unread rest of the body would otherwise be drained (or cannot be framed); close.
        Outcome::BodyTooLarge | Outcome::BadRequest => {
            resp.headers_mut()
                .insert(CONNECTION, HeaderValue::from_static("close"));
        }
        _ => {}
    }
    resp
}

/// One request as the front end sees it: when it came, its id, how long each phase took, and
/// its trace when tracing is on.
struct Exchange {
    arrived: Instant,
    request_id: HeaderValue,
    /// Whether it came over TLS (a tenant's `hsts` goes on HTTPS responses only).
    tls: bool,
    /// The HTTP version it came in (a label of `tern_requests_total`).
    version: http::Version,
    timings: Timings,
    trace: Option<Traced>,
    /// Its access line, when access lines are on: written when the response ends.
    access: Option<crate::logwriter::AccessRecord>,
}

impl Exchange {
    /// The request id as error pages give it: with the trace id when the client chose the
    /// request id (otherwise a traced request's id is its trace id).
    fn ids(&self) -> String {
        let id = self.request_id.to_str().unwrap_or("-");
        match &self.trace {
            Some(t) => {
                let trace_id = t.active.trace_id_text();
                if id == trace_id {
                    id.to_string()
                } else {
                    format!("{id}, trace id {trace_id}")
                }
            }
            None => id.to_string(),
        }
    }

    /// Answers a request that reached no tenant with `resp`.
    fn unrouted(self, app: &App, resp: Response<ResponseBody>) -> Response<ResponseBody> {
        app.metrics.observe(&self.timings, Phase::Route);
        self.finish(app, None, resp, Phase::Route)
    }

    /// Refuses a routed request before its guest runs, recording the phases it reached and
    /// counting the outcome.
    fn reject(
        mut self,
        app: &App,
        tenant: &TenantRef,
        e: &ExecError,
        reached: Phase,
    ) -> Response<ResponseBody> {
        app.metrics.observe(&self.timings, reached);
        tenant.count_outcome(e.outcome);
        if let Some(t) = &mut self.trace {
            t.failure = Some((e.outcome.name(), e.message.clone()));
            t.guest_failed = e.outcome.is_guests();
        }
        let resp = error_response(e, tenant, &self.ids());
        self.finish(app, Some(tenant), resp, reached)
    }

    /// Adds the request id and `Server-Timing`, counts the response, ends the trace, and has
    /// the access line written when the response's body ends.
    fn finish(
        self,
        app: &App,
        tenant: Option<&TenantRef>,
        resp: Response<ResponseBody>,
        reached: Phase,
    ) -> Response<ResponseBody> {
        let ended = Instant::now();
        let total = ended - self.arrived;
        app.metrics.observe_total(total);
        let status = resp.status().as_u16();
        match tenant {
            Some(t) => {
                t.requests.count(status, self.version);
                t.served.count(status);
            }
            None => app.metrics.unrouted().count(status, self.version),
        }
        let mut resp = match self.access {
            Some(mut record) => {
                record.status = status;
                record.tenant = tenant.map(|t| t.clone() as Arc<dyn crate::logwriter::Named>);
                let no_body = record.method == Method::HEAD
                    || matches!(status, 204 | 304)
                    || (100..200).contains(&status);
                resp.map(|body| body.logged(record, no_body))
            }
            None => resp,
        };
        let headers: &mut HeaderMap = resp.headers_mut();
        headers.insert(X_REQUEST_ID.clone(), self.request_id.clone());
        if self.tls
            && let Some(hsts) = tenant.and_then(|t| t.hsts.as_ref())
        {
            headers.insert(http::header::STRICT_TRANSPORT_SECURITY, hsts.clone());
        }
        if let Ok(v) = HeaderValue::from_str(&self.timings.server_timing(total, reached)) {
            headers.insert(SERVER_TIMING.clone(), v);
        }
        if let Some(t) = self.trace {
            t.end(
                app,
                (self.arrived, ended),
                &self.timings,
                status,
                &self.request_id,
            );
        }
        resp
    }
}

/// What a traced request's spans say, gathered as it goes (nothing is formatted until the
/// tracer keeps it).
struct Traced {
    active: Arc<crate::trace::Active>,
    method: Method,
    uri: Uri,
    version: http::Version,
    scheme: &'static str,
    client: SocketAddr,
    user_agent: Option<HeaderValue>,
    /// The tenant it was routed to, and the length of the prefix it matched.
    tenant: Option<(TenantRef, usize)>,
    /// When it began waiting for a slot.
    queued: Option<Instant>,
    /// When its run began.
    run_start: Option<Instant>,
    /// The outcome's name and message, when the request failed.
    failure: Option<(&'static str, String)>,
    /// The guest failed (a trap, its deadline, a limit): an error kept whatever the sampling
    /// said, like a 5xx. A client's malformed or oversized body (a 4xx) is not.
    guest_failed: bool,
}

impl Traced {
    fn begin(
        tracer: &crate::trace::Tracer,
        req: &Request<Incoming>,
        conn: &Connection,
        client: SocketAddr,
    ) -> Self {
        Self {
            active: tracer.begin(req.headers()),
            method: req.method().clone(),
            uri: req.uri().clone(),
            version: req.version(),
            scheme: conn.scheme(),
            client,
            user_agent: req.headers().get(http::header::USER_AGENT).cloned(),
            tenant: None,
            queued: None,
            run_start: None,
            failure: None,
            guest_failed: false,
        }
    }

    /// The guest's run ended with `out`.
    fn ran(&mut self, out: &RunOutput) {
        self.run_start = Some(out.start);
        if let Err(e) = &out.result {
            self.failure = Some((e.outcome.name(), e.message.clone()));
            self.guest_failed = e.outcome.is_guests();
        }
    }

    /// The request (arrived, ended) ended with `status`: queued for export if the tracer keeps
    /// it.
    fn end(
        self,
        app: &App,
        (arrived, end): (Instant, Instant),
        timings: &Timings,
        status: u16,
        request_id: &HeaderValue,
    ) {
        let Some(tracer) = &app.tracer else { return };
        if !tracer.keeps(&self.active, status, self.guest_failed, end - arrived) {
            return;
        }
        let took = |p: Phase| timings.0[p as usize];
        let since = |i: Instant| i.saturating_duration_since(arrived);
        let queue = self
            .queued
            .map(|q| (since(q), since(q) + took(Phase::Queue)));
        let phases = match self.run_start {
            Some(s) => {
                let s = since(s);
                let ran_from = s + took(Phase::Instantiate);
                let ran_until = ran_from + took(Phase::Run);
                [
                    queue,
                    Some((s, ran_from)),
                    Some((ran_from, ran_until)),
                    Some((ran_until, ran_until + took(Phase::Teardown))),
                ]
            }
            None => [queue, None, None, None],
        };
        let wall = std::time::SystemTime::now();
        app.metrics
            .exemplars
            .record(self.active.trace_id, timings, end - arrived, wall);
        let tenant = self
            .tenant
            .map(|(t, prefix_len)| (t as Arc<dyn crate::trace::SpanTenant>, prefix_len));
        // A request id other than the trace id (a client's own) goes with the spans.
        let own_id =
            (request_id.as_bytes() != self.active.trace_id_hex()).then(|| request_id.clone());
        tracer.submit(&crate::trace::Record {
            active: self.active,
            arrived,
            end: (end - arrived, wall),
            method: self.method,
            uri: self.uri,
            version: self.version,
            scheme: self.scheme,
            client: self.client,
            user_agent: self.user_agent,
            status,
            request_id: own_id,
            tenant,
            phases,
            failure: self.failure,
        });
    }
}

/// Refuses a request whose body's framing Tern does not read the way every proxy would
/// (RFC 9112 §6.1): `chunked` more than once (`400`), or a transfer coding other than
/// `chunked` (`501`: Tern would hand the guest a body still in that coding). hyper itself
/// drops a `Content-Length` sent with `Transfer-Encoding` and refuses `chunked` that is not
/// the last coding.
fn framing(req: &Request<Incoming>) -> Result<(), (StatusCode, &'static str)> {
    let mut chunked = 0;
    for coding in req
        .headers()
        .get_all(TRANSFER_ENCODING)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|c| !c.is_empty())
    {
        if coding.eq_ignore_ascii_case(b"chunked") {
            chunked += 1;
        } else {
            return Err((
                StatusCode::NOT_IMPLEMENTED,
                "a transfer coding other than chunked: Tern reads only chunked request bodies \
                 (send Content-Encoding for a compressed body)",
            ));
        }
    }
    if chunked > 1 {
        return Err((
            StatusCode::BAD_REQUEST,
            "ambiguous request: the chunked transfer coding applied more than once",
        ));
    }
    Ok(())
}

/// The answer to a request for the asterisk target `*`: `OPTIONS *` is the server's own
/// options (each tenant's guest decides which methods its paths take); any other method with
/// it is malformed.
fn asterisk(method: &Method) -> Response<ResponseBody> {
    if method == Method::OPTIONS {
        let mut resp = plain(StatusCode::OK, "");
        resp.headers_mut().insert(
            http::header::ALLOW,
            HeaderValue::from_static("GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"),
        );
        resp
    } else {
        plain(
            StatusCode::BAD_REQUEST,
            &format!("the target `*` is only for OPTIONS, not {method}\n"),
        )
    }
}

/// `uri` with its path replaced by `path` (its query kept).
fn with_path(uri: &Uri, path: &str) -> Option<Uri> {
    let mut parts = uri.clone().into_parts();
    let pq = match uri.query() {
        Some(q) => format!("{path}?{q}"),
        None => path.to_string(),
    };
    parts.path_and_query = Some(pq.parse().ok()?);
    Uri::from_parts(parts).ok()
}

/// The host a request is for, or why it is ambiguous (RFC 9112 3.2; RFC 9113 8.3.1): one
/// `Host` header at most, the same authority in the target and in `Host` when both are given.
fn authority(req: &Request<Incoming>) -> Result<Option<&str>, &'static str> {
    let headers = req.headers();
    let mut hosts = headers.get_all(HOST).iter();
    let host = hosts.next();
    if hosts.next().is_some() {
        return Err("more than one Host header");
    }
    let host = match host {
        Some(h) => Some(h.to_str().map_err(|_| "a Host header that is not text")?),
        None => None,
    };
    match (req.uri().authority(), host) {
        (Some(target), Some(host)) => {
            let host: http::uri::Authority = host
                .parse()
                .map_err(|_| "a Host header that is not a host")?;
            let same_port = match (target.port_u16(), host.port_u16()) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            };
            if !same_port || !target.host().eq_ignore_ascii_case(host.host()) {
                return Err("the request target's authority and the Host header differ");
            }
            Ok(Some(target.host()))
        }
        (Some(target), None) => Ok(Some(target.host())),
        (None, host) => Ok(host),
    }
}

/// The client's `x-request-id` if it is 1-128 characters of `[A-Za-z0-9._:-]`.
fn client_request_id(headers: &HeaderMap) -> Option<HeaderValue> {
    let v = headers.get(&X_REQUEST_ID)?;
    let b = v.as_bytes();
    (!b.is_empty()
        && b.len() <= 128
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || b"._:-".contains(c)))
    .then(|| v.clone())
}

/// A new request id: this process's prefix and a counter.
fn new_request_id() -> HeaderValue {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static PREFIX: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    let prefix = *PREFIX.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos() ^ (d.as_secs() as u32));
        nanos.rotate_left(13) ^ std::process::id()
    });
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    // `{prefix:08x}-{n:012x}` (the low 48 bits of the counter), written digit by digit:
    // `format!` cost three allocations and the formatting machinery on every request (perf:
    // 0.73 % -> 0.15 % of a `hello` worker).
    let mut id = [b'-'; 21];
    crate::hex::encode_into(&prefix.to_be_bytes(), &mut id[..8]);
    crate::hex::encode_into(&n.to_be_bytes()[2..], &mut id[9..]);
    HeaderValue::from_bytes(&id).expect("hex is a valid header value")
}

/// The same URL as `uri` asked of `host`, over HTTPS on `port`.
fn https_location(host: &str, port: u16, uri: &http::Uri) -> Option<HeaderValue> {
    let authority: http::uri::Authority = host.parse().ok()?;
    let name = authority.host();
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let location = if port == 443 {
        format!("https://{name}{path}")
    } else {
        format!("https://{name}:{port}{path}")
    };
    HeaderValue::from_str(&location).ok()
}

/// `308 Permanent Redirect` to `location` (a 308 keeps the method and body, unlike a 301).
fn redirect(location: &HeaderValue) -> Response<ResponseBody> {
    let text = format!(
        "this site is served over HTTPS: {}\n",
        location.to_str().unwrap_or_default()
    );
    let mut resp = plain(StatusCode::PERMANENT_REDIRECT, &text);
    resp.headers_mut()
        .insert(http::header::LOCATION, location.clone());
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_honoured_only_when_sane() {
        let mut h = HeaderMap::new();
        h.insert(&X_REQUEST_ID, HeaderValue::from_static("abc-123.x:y_z"));
        assert_eq!(client_request_id(&h).unwrap(), "abc-123.x:y_z");
        h.insert(&X_REQUEST_ID, HeaderValue::from_static("has space"));
        assert_eq!(client_request_id(&h), None);
        assert_eq!(client_request_id(&HeaderMap::new()), None);
        let a = new_request_id();
        let b = new_request_id();
        assert_ne!(a, b);
        assert_eq!(a.len(), 21);
        // The prefix, a dash, and the counter in 12 lower-case hex digits.
        let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
        assert_eq!(a.as_bytes()[8], b'-');
        assert_eq!(a[..8], b[..8]);
        let n = |id: &str| u64::from_str_radix(&id[9..], 16).unwrap();
        assert!(n(b) > n(a));
        assert!(
            a.bytes()
                .all(|c| c == b'-' || (c.is_ascii_hexdigit() && !c.is_ascii_uppercase()))
        );
    }
}
