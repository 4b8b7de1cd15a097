//! The `wasi-http` guest kind: `wasi:http/proxy` components, as `wasmtime serve`, Spin and
//! wasmCloud run them, each request in a fresh pooled instance.
//!
//! This room holds what is particular to components: their store state (WASI preview2, a
//! resource table, the `wasi:http` context), their linker, how a request goes in (a
//! `wasi:http` incoming-request whose body streams from the client within the tenant's limit)
//! and how the answer comes out (the response-outparam's head and body, fed into the same
//! [`GuestResponse`] the `tern` ABI writes: buffered up to 64 KiB, streamed beyond). Outgoing
//! requests (`wasi:http/outgoing-handler`) go through Tern's outbound client under the
//! tenant's `[tenant.outbound]` policy: denied unless allowed. Admission, deadlines, memory
//! limits, teardown and metrics are the shared lifecycle's ([`crate::execute`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::HOST;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use tern_sdk::abi::errno;
use wasmtime::Engine;
use wasmtime::component::{Linker, ResourceTable};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};
use wasmtime_wasi_http::p2::bindings::http::types::ErrorCode;
use wasmtime_wasi_http::p2::body::HyperOutgoingBody;
use wasmtime_wasi_http::{
    RequestOptions, WasiBody, WasiHttpCtx, WasiHttpCtxView, WasiHttpHooks, WasiHttpView,
};

use crate::hostcalls::{GuestLimits, GuestRequest, GuestResponse, RequestBody, Stdio, WasiSpec};
use crate::outbound::{self, ComponentCalls, Denied, OutBody};
use crate::outbound::{Calls, Failed, Passing, Refused};

/// The pre-linked form of a `wasi:http/proxy` component (WASI 0.2).
pub type Pre = wasmtime_wasi_http::p2::bindings::ProxyPre<HttpState>;

/// The pre-linked form of a `wasi:http/service` component (WASI 0.3).
pub type PreP3 = wasmtime_wasi_http::p3::bindings::ServicePre<HttpState>;

/// The export a WASI 0.3 component is served by.
pub const HANDLER_EXPORT_P3: &str = "wasi:http/handler@0.3";

/// Which `wasi:http` a component is served through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// WASI 0.2: `wasi:http/incoming-handler`.
    P2,
    /// WASI 0.3: `wasi:http/handler` (component-model async).
    P3,
}

pub use crate::adapter::HANDLER_EXPORT;

/// Core instances (and tables) a component's store may create; the pool's own per-component
/// limit (`pool.component_core_instances`) is the one that binds, checked at deploy.
const STORE_INSTANCES: usize = 10_000;

/// One request's component store state. Dropped with the store at teardown.
pub struct HttpState {
    table: ResourceTable,
    /// WASI preview2, built on the guest's first call that needs it: a handler that only
    /// speaks `wasi:http` (and `wasi:io` streams) never pays for it (~2 µs).
    wasi: Option<WasiCtx>,
    /// Args and env of the context.
    spec: Arc<WasiSpec>,
    /// What the guest wrote to stdout and stderr, once it has a context.
    stdio: Option<Stdio>,
    http: WasiHttpCtx,
    hooks: Hooks,
    /// Memory and table limits, and whether the guest ran into them.
    pub limits: GuestLimits,
}

impl WasiView for HttpState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        let (spec, stdio) = (&self.spec, &mut self.stdio);
        let ctx = self.wasi.get_or_insert_with(|| {
            let stdio = stdio.get_or_insert_with(|| Stdio::new(spec.stdio_bytes));
            WasiCtxBuilder::new()
                .args(&[&spec.name])
                .envs(&spec.env)
                .stdout(stdio.stdout.clone())
                .stderr(stdio.stderr.clone())
                .build()
        });
        WasiCtxView {
            ctx,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for HttpState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.hooks,
        }
    }
}

impl HttpState {
    /// The state of one request of a tenant whose guests see `spec` (args, env; stdout and
    /// stderr captured), limited by `limits`, calling out under `calls`; the client's request
    /// `headers` carry the loop and trace headers passed on; `request_id` names the request in
    /// log lines.
    pub fn new(
        spec: Arc<WasiSpec>,
        mut limits: GuestLimits,
        calls: Arc<Calls>,
        headers: &HeaderMap,
        request_id: &HeaderValue,
    ) -> Self {
        limits.instances = STORE_INSTANCES;
        Self {
            table: ResourceTable::new(),
            wasi: None,
            spec,
            stdio: None,
            http: WasiHttpCtx::new(),
            hooks: Hooks::new(calls, headers, request_id),
            limits,
        }
    }

    /// What the guest wrote to stdout and stderr, if it made a WASI call.
    pub fn take_stdio(&mut self) -> Option<Stdio> {
        self.stdio.take()
    }

    /// Marks the guest's run as failed (a trap, its deadline): outgoing request bodies still
    /// streaming fail toward their backends when the store is dropped, rather than ending as
    /// if complete. Call before dropping the store.
    pub fn guest_failed(&self) {
        if let Some(shared) = &self.hooks.shared {
            shared.failed.store(true, Ordering::Release);
        }
    }

    /// Time spent waiting for outgoing responses' heads.
    pub fn outbound_waited(&self) -> Duration {
        let shared = self.hooks.shared.as_ref();
        Duration::from_nanos(shared.map_or(0, |s| s.waited_ns.load(Ordering::Relaxed)))
    }
}

/// The linker components are pre-linked against: WASI preview2 (no files, sockets or network
/// names: the context grants none) and `wasi:http`; with `wasi_p3` also their WASI 0.3
/// versions.
///
/// # Errors
/// Only if wasmtime rejects a definition (a bug).
pub fn linker(engine: &Engine, wasi_p3: bool) -> wasmtime::Result<Linker<HttpState>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
    wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)?;
    if wasi_p3 {
        wasmtime_wasi::p3::add_to_linker(&mut linker)?;
        wasmtime_wasi_http::p3::add_to_linker(&mut linker)?;
    }
    Ok(linker)
}

/// Why a component's answer could not be sent.
#[derive(Debug)]
pub enum Answer {
    /// The handler returned without setting its response-outparam.
    NoResponse,
    /// The guest set its response-outparam to an error.
    Error(ErrorCode),
    /// A WASI 0.3 guest answered with an error code (its text).
    ErrorP3(String),
    /// The response went past the tenant's body or header limits.
    Limit,
    /// The guest's body failed before its end (it was dropped unfinished, or its declared
    /// length was not met).
    BodyFailed(String),
    /// The client went away.
    ClientGone,
    /// The handler returned without finishing its body (`outgoing-body.finish`) or dropping
    /// it: by wasi:http's rules the body is not complete, and nothing more can come.
    Unfinished,
}

/// `wait` for something the guest produces (its response head, its next body frame). Once
/// the handler has `returned`, a `wasi:http` 0.2 guest can no longer act, so what is not
/// there now never comes: `None` then, at once, instead of a wait until the deadline.
async fn from_guest<F: Future>(wait: F, returned: &AtomicBool) -> Option<F::Output> {
    // Unconstrained: tokio's channels answer `Pending` when the task has used up its
    // cooperative budget, even with a value waiting, which must not pass for "never comes".
    let mut wait = std::pin::pin!(tokio::task::unconstrained(wait));
    std::future::poll_fn(|cx| match wait.as_mut().poll(cx) {
        Poll::Ready(v) => Poll::Ready(Some(v)),
        Poll::Pending if returned.load(Ordering::Acquire) => Poll::Ready(None),
        Poll::Pending => Poll::Pending,
    })
    .await
}

/// Moves a component's answer into `response`: the head from `head` (the response-outparam's
/// channel), then the body chunk by chunk as the guest writes it. Set `returned` when the
/// handler has returned and poll again: what the guest left unsent then ends the answer.
///
/// # Errors
/// [`Answer`], saying why the answer is not complete.
pub async fn pump(
    head: tokio::sync::oneshot::Receiver<Result<Response<HyperOutgoingBody>, ErrorCode>>,
    response: &mut GuestResponse,
    returned: &AtomicBool,
) -> Result<(), Answer> {
    let answer = match from_guest(head, returned).await {
        Some(Ok(Ok(r))) => r,
        Some(Ok(Err(code))) => return Err(Answer::Error(code)),
        // Dropped, or kept by a handler that returned without setting it.
        Some(Err(_)) | None => return Err(Answer::NoResponse),
    };
    let (parts, body) = answer.into_parts();
    pump_parts(parts, body, response, returned).await
}

/// Moves a response head `parts` and its `body` into `response`, the body chunk by chunk as
/// the guest writes it; `returned` as for [`pump`].
///
/// # Errors
/// [`Answer`], saying why the answer is not complete.
pub async fn pump_parts<B>(
    parts: http::response::Parts,
    mut body: B,
    response: &mut GuestResponse,
    returned: &AtomicBool,
) -> Result<(), Answer>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    response.status = parts.status;
    let mut name = None;
    for (n, value) in parts.headers {
        // `HeaderMap`'s iterator names only the first of a header's values.
        if let Some(n) = n {
            name = Some(n);
        }
        let Some(n) = name.clone() else { continue };
        if response.append_header(n, value) == errno::LIMIT_EXCEEDED {
            return Err(Answer::Limit);
        }
    }
    loop {
        let frame = match from_guest(body.frame(), returned).await {
            Some(Some(frame)) => frame,
            Some(None) => break,
            None => return Err(Answer::Unfinished),
        };
        let frame = frame.map_err(|e| Answer::BodyFailed(e.to_string()))?;
        // Trailers are not sent (HTTP/1.1 clients rarely ask for them).
        let Ok(data) = frame.into_data() else {
            continue;
        };
        match response.write(&data).await {
            n if n >= 0 => {}
            errno::LIMIT_EXCEEDED => return Err(Answer::Limit),
            _ => return Err(Answer::ClientGone),
        }
    }
    Ok(())
}

/// What the client's body did as the guest read it: the shared lifecycle answers `413` or
/// `400` for it, whatever the guest made of the error.
#[derive(Debug, Default)]
pub struct BodyFlags {
    /// The body went past the tenant's limit.
    pub too_large: AtomicBool,
    /// The body could not be read (bad framing, cut off).
    pub failed: std::sync::Mutex<Option<String>>,
}

/// The client's body as a component reads it: counted against the tenant's limit as it
/// streams in.
struct ClientBody {
    body: RequestBody,
    seen: u64,
    max: u64,
    flags: Arc<BodyFlags>,
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = wasmtime_wasi_http::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        let frame = match &mut this.body {
            RequestBody::Empty => return Poll::Ready(None),
            RequestBody::Full(b) if b.is_empty() => return Poll::Ready(None),
            RequestBody::Full(b) => Some(Ok(Frame::data(std::mem::take(b)))),
            RequestBody::Incoming(i) => std::task::ready!(Pin::new(i).poll_frame(cx)),
        };
        Poll::Ready(match frame {
            None => None,
            Some(Err(e)) => {
                *this.flags.failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
                Some(Err(wasmtime_wasi_http::Error::Hyper(e)))
            }
            Some(Ok(frame)) => {
                this.seen += frame.data_ref().map_or(0, |d| d.len() as u64);
                if this.seen > this.max {
                    this.flags.too_large.store(true, Ordering::Relaxed);
                    Some(Err(wasmtime_wasi_http::Error::HttpRequestBodySize(Some(
                        this.seen,
                    ))))
                } else {
                    Some(Ok(frame))
                }
            }
        })
    }

    fn is_end_stream(&self) -> bool {
        match &self.body {
            RequestBody::Empty => true,
            RequestBody::Full(b) => b.is_empty(),
            RequestBody::Incoming(i) => i.is_end_stream(),
        }
    }
}

/// The request as a component receives it: the body limited to `request.max_bytes`, a `Host`
/// header if the client sent no authority (`wasi:http` requires one), and the routing headers
/// Spin gives its components (`spin-path-info`, `spin-full-url`, ...), set by the server only.
pub fn incoming(
    request: GuestRequest,
    flags: Arc<BodyFlags>,
) -> Request<impl Body<Data = Bytes, Error = wasmtime_wasi_http::Error> + Send + 'static> {
    let GuestRequest {
        method,
        uri,
        mut headers,
        body,
        max_bytes,
        context,
        ..
    } = request;
    if uri.authority().is_none() && !headers.contains_key(HOST) {
        headers.insert(HOST, HeaderValue::from_static("localhost"));
    }
    spin_headers(&mut headers, &uri, &context);
    let mut req = Request::new(ClientBody {
        body,
        seen: 0,
        max: max_bytes,
        flags,
    });
    *req.method_mut() = method;
    *req.uri_mut() = uri;
    *req.headers_mut() = headers;
    req
}

/// Spin's routing headers, so components written for Spin find what they read there. A
/// client's own `spin-*` headers are dropped: only the server's values are seen.
fn spin_headers(
    headers: &mut HeaderMap,
    uri: &http::Uri,
    context: &crate::context::RequestContext,
) {
    static FULL_URL: HeaderName = HeaderName::from_static("spin-full-url");
    static PATH_INFO: HeaderName = HeaderName::from_static("spin-path-info");
    static MATCHED_ROUTE: HeaderName = HeaderName::from_static("spin-matched-route");
    static RAW_COMPONENT_ROUTE: HeaderName = HeaderName::from_static("spin-raw-component-route");
    static COMPONENT_ROUTE: HeaderName = HeaderName::from_static("spin-component-route");
    static BASE_PATH: HeaderName = HeaderName::from_static("spin-base-path");
    static CLIENT_ADDR: HeaderName = HeaderName::from_static("spin-client-addr");
    if headers.keys().any(|k| k.as_str().starts_with("spin-")) {
        let spoofed: Vec<_> = headers
            .keys()
            .filter(|k| k.as_str().starts_with("spin-"))
            .cloned()
            .collect();
        for k in spoofed {
            headers.remove(&k);
        }
    }
    headers.reserve(7);
    let path = uri.path();
    let (prefix, info) = path.split_at(context.prefix_len.min(path.len()));
    let prefix = prefix.trim_end_matches('/');
    let full = crate::context::url(context, uri, headers);
    let route = HeaderValue::from_maybe_shared(Bytes::from(format!("{prefix}/..."))).ok();
    let values = [
        (
            &FULL_URL,
            HeaderValue::from_maybe_shared(Bytes::from(full)).map_err(drop),
        ),
        (&PATH_INFO, HeaderValue::from_str(info).map_err(drop)),
        (&MATCHED_ROUTE, route.clone().ok_or(())),
        (&RAW_COMPONENT_ROUTE, route.ok_or(())),
        (
            &COMPONENT_ROUTE,
            HeaderValue::from_str(prefix).map_err(drop),
        ),
        (&BASE_PATH, Ok(HeaderValue::from_static("/"))),
        (
            &CLIENT_ADDR,
            HeaderValue::from_str(&context.client().to_string()).map_err(drop),
        ),
    ];
    for (name, value) in values {
        if let Ok(v) = value {
            headers.insert(name.clone(), v);
        }
    }
}

/// How a component's outgoing requests are sent: through Tern's outbound client, under the
/// tenant's policy.
struct Hooks {
    calls: Arc<Calls>,
    /// Requests made so far by this guest.
    sent: usize,
    /// What the client's request hands on to the guest's requests.
    passing: Passing,
    /// Time waited and the run's failure, shared with the requests sent (made by the first).
    shared: Option<Arc<ComponentCalls>>,
    /// The client's request, in log lines.
    request_id: HeaderValue,
}

impl Hooks {
    fn new(calls: Arc<Calls>, incoming: &HeaderMap, request_id: &HeaderValue) -> Self {
        Self {
            request_id: request_id.clone(),
            passing: Passing::of(incoming),
            calls,
            sent: 0,
            shared: None,
        }
    }
}

/// The future `send_request` returns.
type Sent = Box<
    dyn Future<
            Output = wasmtime_wasi_http::Result<(
                Response<WasiBody>,
                Box<dyn Future<Output = wasmtime_wasi_http::Result<()>> + Send>,
            )>,
        > + Send,
>;

impl WasiHttpHooks for Hooks {
    fn send_request(
        &mut self,
        request: Request<WasiBody>,
        options: Option<RequestOptions>,
        _fut: Box<dyn Future<Output = wasmtime_wasi_http::Result<()>> + Send>,
    ) -> Sent {
        self.sent += 1;
        let calls = self.calls.clone();
        // `http://NAME/path` calls the tenant's backend NAME; any other URL must be an
        // allowed public host.
        let uri = request.uri().clone();
        let host = uri.host().unwrap_or_default();
        let backend = match calls.policy.backend_label(host) {
            Some(_) if uri.port().is_none() => host.to_string(),
            _ => String::new(),
        };
        let admitted = calls.admit(
            self.sent,
            &self.passing,
            &calls.label(&backend),
            &self.request_id,
        );
        let passing = self.passing.clone();
        let shared = self.shared.get_or_insert_with(Arc::default).clone();
        let request_id = self.request_id.clone();
        Box::new(async move {
            use wasmtime_wasi_http::Error;
            match admitted {
                Ok(()) => {}
                Err(Refused::TooMany(_)) => return Err(Error::HttpRequestDenied),
                Err(Refused::Loop(_)) => return Err(Error::LoopDetected),
            }
            let pq = uri.path_and_query().map_or("/", |p| p.as_str());
            let target = if backend.is_empty() {
                calls.policy.target("", &uri.to_string()).await
            } else {
                calls.policy.target(&backend, pq).await
            };
            let target = match target {
                Ok(t) => t,
                Err(Denied::Unresolved { host, .. }) => {
                    calls.log_denied(&request_id, &format!("cannot resolve {host}"));
                    calls.count(outbound::URL_LABEL, "error");
                    return Err(Error::DnsError {
                        rcode: Some(format!("cannot resolve {host}")),
                        info_code: None,
                    });
                }
                Err(d) => {
                    calls.log_denied(&request_id, &d.to_string());
                    calls.count(outbound::URL_LABEL, "denied");
                    return Err(Error::HttpRequestDenied);
                }
            };
            let (parts, body) = request.into_parts();
            let body = http_body_util::Limited::new(body, calls.policy.max_request_bytes as usize)
                .map_err(|_| outbound::BodyAborted)
                .boxed_unsync();
            let req = Request::from_parts(parts, OutBody::component(body, shared.clone()));
            let started = Instant::now();
            // The guest's request options may shorten the wait for the head, never lengthen
            // it. (The connect timeout is the worker's connector's: the tenant's.)
            let first_byte = options
                .and_then(|o| o.first_byte_timeout)
                .map_or(target.timeouts.first_byte, |t| {
                    t.min(target.timeouts.first_byte)
                });
            let sent = calls.exchange(&target, req, first_byte, &passing).await;
            shared
                .waited_ns
                .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
            let (resp, permit) = sent.map_err(|f| match f {
                Failed::ConnectTimeout(_) => Error::ConnectionTimeout,
                Failed::Connect(_) => Error::ConnectionRefused,
                Failed::FirstByte(_) | Failed::Total(_) => Error::ConnectionReadTimeout,
                Failed::NoClient(e) => Error::InternalError(Some(e)),
                Failed::Request(_) => Error::HttpProtocolError,
            })?;
            let max = calls.policy.max_response_bytes;
            let resp = resp.map(move |b| {
                http_body_util::Limited::new(b, max as usize)
                    .map_err(move |e| match e.downcast::<hyper::Error>() {
                        Ok(e) => Error::Hyper(*e),
                        Err(_) => Error::HttpResponseBodySize(None),
                    })
                    // The backend's in-flight slot is held until the body is dropped.
                    .map_frame(move |f| {
                        let _ = &permit;
                        f
                    })
                    .boxed_unsync()
            });
            let done: Box<dyn Future<Output = wasmtime_wasi_http::Result<()>> + Send> =
                Box::new(async { Ok(()) });
            Ok((resp, done))
        })
    }
}

/// Which `wasi:http` a component is served through, or why it is not a `wasi-http` guest: it
/// must export `wasi:http/incoming-handler@0.2.x` (or, WASI 0.3, `wasi:http/handler@0.3.x`).
pub fn check_exports(
    component: &wasmtime::component::Component,
    engine: &Engine,
) -> Result<Version, String> {
    let ty = component.component_type();
    let exports: Vec<String> = ty
        .exports(engine)
        .map(|(name, _)| name.to_string())
        .collect();
    if exports.iter().any(|e| e.starts_with(HANDLER_EXPORT)) {
        return Ok(Version::P2);
    }
    if exports.iter().any(|e| e.starts_with(HANDLER_EXPORT_P3)) {
        return Ok(Version::P3);
    }
    let hint = if exports.iter().any(|e| e.starts_with("wasi:cli/run@")) {
        "; it is a command component (a program with `main`, built for wasm32-wasip2): build it \
         for wasm32-wasip1 to serve it as a CGI program, or make it a wasi:http proxy component"
    } else {
        ""
    };
    Err(format!(
        "this component does not export `wasi:http/incoming-handler` (it exports: {}); Tern \
         serves wasi:http proxy components (`wasmtime serve`, Spin){hint}",
        if exports.is_empty() {
            "nothing".to_string()
        } else {
            exports.join(", ")
        }
    ))
}
