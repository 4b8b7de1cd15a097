//! Execute: instantiate a fresh guest for one request and run its handler on its own fiber.
//!
//! Each request gets a new `Store`; `instantiate_async` takes a slot from the pool and maps the
//! module's copy-on-write heap image; the handler runs on a pooled fiber stack: `_start` through
//! `call_async` for a core module (the `tern` ABI or a CGI program), `incoming-handler.handle`
//! for a `wasi:http` component ([`crate::wasi_http`]). Epoch interruption makes the guest yield
//! every tick, so a busy guest never holds a worker thread, and a wall-clock deadline around the
//! whole run cuts it off. Every kind shares this lifecycle: the limits, the verdict, the reply,
//! the outcome counts, the captured output and teardown.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};
use tokio::sync::oneshot;
use wasmtime::{Extern, Store, Trap, UpdateDeadline};
use wasmtime_wasi::I32Exit;
use wasmtime_wasi_http::WasiHttpView;
use wasmtime_wasi_http::p2::bindings::http::types::Scheme;

use crate::config::GuestKind;
use crate::engine::EPOCH_TICK;
use crate::hostcalls::cgi::Cgi;
use crate::hostcalls::outbound::Outbound;
use crate::hostcalls::{
    GuestFault, GuestLimits, GuestRequest, GuestResponse, GuestState, Head, Stdio, Wasi,
};
use crate::outcome::{ExecError, Outcome, body_too_large, response_limit};
use crate::teardown;
use crate::tenant::{CoreGuest, Guest, Tenant, TenantRef};
use crate::wasi_http::{Answer, BodyFlags, HttpState};

/// A guest's complete, buffered response.
#[derive(Debug)]
pub struct Finished {
    /// Status set by the guest.
    pub status: StatusCode,
    /// Headers set by the guest.
    pub headers: HeaderMap,
    /// The whole body.
    pub body: Bytes,
}

/// How a guest that ran to its end answered.
#[derive(Debug)]
pub enum Reply {
    /// The whole response, buffered.
    Buffered(Finished),
    /// The body outgrew the buffer: the head went through `commit` and the body through its
    /// channel. The front end answers with that head, whether or not it saw it before the
    /// guest ended.
    Streamed,
}

/// What a run produced and how long its phases took.
#[derive(Debug)]
pub struct RunOutput {
    /// The reply, or the failure.
    pub result: Result<Reply, ExecError>,
    /// `Store::new` + `instantiate_async` (the WASI context is built on first use, in `run`).
    pub instantiate: Duration,
    /// The handler call.
    pub run: Duration,
    /// Dropping the store.
    pub teardown: Duration,
    /// Part of `run`: waiting for outbound requests.
    pub outbound: Duration,
}

/// Instantiates a fresh guest of `tenant`, runs it on `request`, and tears it down.
///
/// If the guest's body outgrows the buffer, its head is sent through `commit` and the body
/// streams from there while this future keeps running; the caller must then keep polling it
/// (e.g. in a spawned task) until the guest ends.
pub async fn run(
    tenant: TenantRef,
    request: GuestRequest,
    commit: oneshot::Sender<Head>,
) -> RunOutput {
    let request_id = request.context.request_id.clone();
    match &tenant.guest {
        Guest::Core(core) => run_core(&tenant, core, request, commit, &request_id).await,
        Guest::Http(pre) => {
            run_component(&tenant, Component::P2(pre), request, commit, &request_id).await
        }
        Guest::HttpP3(pre) => {
            run_component(&tenant, Component::P3(pre), request, commit, &request_id).await
        }
    }
}

/// A fresh store for one request of `tenant`, time-sliced by the epoch from `start`.
fn new_store<T>(engine: &wasmtime::Engine, state: T, start: Instant) -> Store<T> {
    let mut store = Store::new(engine, state);
    // Time slicing, not a limit: a guest yields at an epoch tick once it has run a full slice.
    // A tick that lands in a short guest's first microseconds must not send it to the back of
    // the run queue: with a yield at every tick, 2-3 % of `hello` runs under load took 1-8 ms
    // (they waited behind every other connection's task). The yield is tokio's `yield_now`,
    // which lets the runtime poll its sockets before the guest resumes. A plain
    // wake-and-return-pending yield requeues the guest at once, and the runtime checks for I/O
    // only every 61 task polls: with two busy guests on a worker, other tenants' requests waited
    // tens of milliseconds (`loadtest/bench.sh mixed`).
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(move |_| {
        Ok(if start.elapsed() < EPOCH_TICK {
            UpdateDeadline::Continue(1)
        } else {
            UpdateDeadline::YieldCustom(1, Box::pin(tokio::task::yield_now()))
        })
    });
    store
}

fn guest_limits(limits: &crate::tenant::Limits) -> GuestLimits {
    GuestLimits {
        max_memory: limits.max_memory,
        max_table_elements: limits.max_table_elements,
        memory_limit_hit: false,
        peak_memory: 0,
        instances: 1,
    }
}

/// How the client's request body ended, as far as the server's own limits go.
struct BodyEnd {
    /// The body went past the tenant's limit of this many bytes.
    too_large: Option<u64>,
    /// The body could not be read.
    failed: Option<String>,
}

/// The verdict of a run that ended (`Ok`) or passed its deadline (`Err`), before its answer
/// is sent. The server's own limits come first: a body over the limit is `413` and a broken
/// one `400`, whatever the guest made of the error (unless the answer is already streaming).
fn verdict(
    ended: Result<Result<(), ExecError>, tokio::time::error::Elapsed>,
    body: BodyEnd,
    response: &GuestResponse,
    timeout: Duration,
    head_request: bool,
) -> Result<(), ExecError> {
    let streaming = response.is_streaming();
    if let Some(max) = body.too_large.filter(|_| !streaming) {
        return Err(body_too_large(max));
    }
    if let Some(why) = body.failed.filter(|_| !streaming) {
        return Err(ExecError::new(
            Outcome::BadRequest,
            format!("the request body could not be read: {why}"),
        ));
    }
    match ended {
        Err(_elapsed) => Err(ExecError::new(
            Outcome::Timeout,
            format!("guest exceeded its time limit ({} ms)", timeout.as_millis()),
        )),
        // A body that does not match its declared length fails (a `HEAD` answer has none).
        Ok(Ok(())) => match response.length_mismatch() {
            Some(why) if !head_request => Err(ExecError::new(Outcome::ResponseLimit, why)),
            _ => Ok(()),
        },
        Ok(Err(e)) => Err(e),
    }
}

/// The reply a run's `result` makes of `response`; a failure ends a streaming body with an
/// error (so the client sees it cut, not complete) and is logged.
async fn reply(
    result: Result<(), ExecError>,
    response: &mut GuestResponse,
    tenant: &Tenant,
    request_id: &HeaderValue,
) -> Result<Reply, ExecError> {
    let result = match result {
        Ok(()) if response.is_streaming() => Ok(Reply::Streamed),
        Ok(()) => {
            if let Some(n) = response.declared {
                response
                    .headers
                    .insert(http::header::CONTENT_LENGTH, HeaderValue::from(n));
            }
            Ok(Reply::Buffered(Finished {
                status: response.status,
                headers: std::mem::take(&mut response.headers),
                body: response.body.split().freeze(),
            }))
        }
        Err(e) => {
            response.abort_stream().await;
            tracing::warn!(
                tenant = %tenant.name,
                request_id = request_id.to_str().unwrap_or("-"),
                outcome = e.outcome.name(),
                "guest failed: {}", e.message
            );
            Err(e)
        }
    };
    tenant.count_outcome(result.as_ref().map_or_else(|e| e.outcome, |_| Outcome::Ok));
    result
}

/// In `tern dev`, a failure's message gets the guest's stderr (a panic's message).
fn add_stderr(tenant: &Tenant, result: &mut Result<Reply, ExecError>, stdio: Option<&Stdio>) {
    if tenant.errors.dev
        && let (Err(e), Some(stdio)) = (result, stdio)
    {
        let stderr = stdio.stderr.contents();
        if !stderr.is_empty() {
            e.message.push_str("\n--- the guest's stderr ---\n");
            e.message
                .push_str(String::from_utf8_lossy(&stderr).trim_end());
        }
    }
}

/// A core module's run: the `tern` ABI, or a CGI program.
async fn run_core(
    tenant: &Tenant,
    core: &CoreGuest,
    request: GuestRequest,
    commit: oneshot::Sender<Head>,
    request_id: &HeaderValue,
) -> RunOutput {
    let start = Instant::now();
    let limits = &tenant.limits;
    let cgi = tenant.kind == GuestKind::Cgi;
    let state = GuestState {
        wasi: Wasi::new(tenant.wasi.clone()),
        memory: None,
        request,
        response: GuestResponse::new(
            limits.max_response_bytes,
            limits.max_response_headers,
            commit,
        ),
        limits: guest_limits(limits),
        files: crate::hostcalls::fs::Files::new(tenant.assets.clone()),
        outbound: Outbound::new(tenant.outbound.clone()),
        cgi: cgi.then(Cgi::default),
    };
    let mut store = new_store(core.pre.module().engine(), state, start);
    store.limiter(|s| &mut s.limits);

    let mut instantiated = None;
    let mut body_read = Duration::ZERO;
    let guest = async {
        if cgi && store.data().request.length_unknown() {
            // RFC 3875 gives a CGI program its body with a length: one sent without (chunked)
            // is read whole first. Over the limit or broken, the program is not run: the
            // verdict answers 413 or 400.
            let reading = Instant::now();
            let request = &mut store.data_mut().request;
            request.buffer_whole().await;
            body_read = reading.elapsed();
            if request.too_large || request.body_error.is_some() {
                return Ok(());
            }
        }
        let instance = core
            .pre
            .instantiate_async(&mut store)
            .await
            .map_err(Stage::Instantiate)?;
        let memory = instance
            .get_module_export(&mut store, &core.memory)
            .and_then(Extern::into_memory);
        store.data_mut().memory = memory;
        let handler = instance
            .get_module_export(&mut store, &core.start)
            .and_then(Extern::into_func)
            .ok_or_else(|| Stage::Instantiate(wasmtime::format_err!("handler export missing")))?;
        let handler = handler
            .typed::<(), ()>(&store)
            .map_err(Stage::Instantiate)?;
        instantiated = Some(Instant::now());
        handler.call_async(&mut store, ()).await.map_err(Stage::Run)
    };
    let ended = tokio::time::timeout(limits.timeout, guest).await;
    let ran_until = Instant::now();
    let ran_from = instantiated.unwrap_or(ran_until);

    let state = store.data_mut();
    let ended = ended.map(|r| {
        r.or_else(|stage| {
            classify(
                stage,
                &state.limits,
                &state.response,
                state.cgi.as_ref().map(|c| c.in_body),
            )
        })
        .and_then(|()| {
            let why = state
                .cgi
                .as_mut()
                .and_then(|cgi| cgi.finish(&mut state.response));
            why.map_or(Ok(()), |why| Err(ExecError::new(Outcome::BadOutput, why)))
        })
    });
    let body = BodyEnd {
        too_large: state.request.too_large.then_some(state.request.max_bytes),
        failed: state.request.body_error.clone(),
    };
    let head_request = state.request.method == http::Method::HEAD;
    let result = verdict(ended, body, &state.response, limits.timeout, head_request);
    let result = reply(result, &mut state.response, tenant, request_id).await;
    let data = store.data_mut();
    let ended = Ended {
        peak_memory: data.limits.peak_memory,
        stdio: data.wasi.take_stdio(),
        outbound: data.outbound.waited,
        // Reading a body whole is the client's time, not instantiation's.
        times: [
            start + body_read,
            ran_from.max(start + body_read),
            ran_until,
        ],
    };
    let memory = data.memory;
    ended.finish(result, tenant, request_id, || {
        teardown::teardown(store, tenant.sweep.as_ref().zip(memory))
    })
}

/// What every run hands to [`Ended::finish`].
struct Ended {
    peak_memory: usize,
    stdio: Option<Stdio>,
    outbound: Duration,
    /// Start, end of instantiation, end of the run.
    times: [Instant; 3],
}

impl Ended {
    /// The end every run shares: the peak memory recorded, the guest's output added (in `tern
    /// dev`) and logged, the store torn down by `teardown`, the phases timed.
    fn finish(
        self,
        mut result: Result<Reply, ExecError>,
        tenant: &Tenant,
        request_id: &HeaderValue,
        teardown: impl FnOnce() -> Duration,
    ) -> RunOutput {
        tenant.memory_peak.observe(self.peak_memory as f64);
        add_stderr(tenant, &mut result, self.stdio.as_ref());
        let teardown = teardown();
        if let Some(stdio) = &self.stdio {
            log_stdio(tenant, request_id.to_str().unwrap_or("-"), stdio);
        }
        let [start, ran_from, ran_until] = self.times;
        RunOutput {
            result,
            instantiate: ran_from - start,
            run: ran_until - ran_from,
            teardown,
            outbound: self.outbound,
        }
    }
}

/// A pre-linked component, by the `wasi:http` it is served through.
enum Component<'a> {
    P2(&'a crate::wasi_http::Pre),
    P3(&'a crate::wasi_http::PreP3),
}

/// A `wasi:http` component's run: `incoming-handler.handle` (WASI 0.2) or `handler.handle`
/// (WASI 0.3, run in the store's concurrent event loop, which keeps running the guest's tasks
/// while its body streams) with the request, its answer moved into a [`GuestResponse`] as the
/// guest writes it.
async fn run_component(
    tenant: &Tenant,
    pre: Component<'_>,
    request: GuestRequest,
    commit: oneshot::Sender<Head>,
    request_id: &HeaderValue,
) -> RunOutput {
    let start = Instant::now();
    let limits = &tenant.limits;
    let mut response = GuestResponse::new(
        limits.max_response_bytes,
        limits.max_response_headers,
        commit,
    );
    if tenant.awaits_memset_reset() {
        // Its memory cannot be swept before teardown (see `teardown`): refuse rather than risk
        // another guest reading this one's swapped pages. Requests wait for the move to the
        // `memset` reset before they get here; this one waited in vain.
        let e = ExecError::new(
            Outcome::Overload,
            "a swap area was switched on and the server has not yet moved this tenant to the \
             swap-safe memory reset; retry shortly",
        );
        let result = reply(Err(e), &mut response, tenant, request_id).await;
        return RunOutput {
            result,
            instantiate: Duration::ZERO,
            run: Duration::ZERO,
            teardown: Duration::ZERO,
            outbound: Duration::ZERO,
        };
    }
    let flags = Arc::new(BodyFlags::default());
    let head_request = request.method == http::Method::HEAD;
    let max_request = request.max_bytes;
    let state = HttpState::new(
        tenant.wasi.clone(),
        guest_limits(limits),
        tenant.outbound.clone(),
        &request.headers,
        request_id,
    );
    let scheme = match request.context.conn.tls {
        Some(_) => Scheme::Https,
        None => Scheme::Http,
    };
    let incoming = crate::wasi_http::incoming(request, flags.clone());
    let engine = match pre {
        Component::P2(p) => p.instance_pre().component().engine().clone(),
        Component::P3(p) => p.instance_pre().component().engine().clone(),
    };
    let mut store = new_store(&engine, state, start);
    store.limiter(|s| &mut s.limits);

    let mut instantiated = None;
    let (tx, rx) = oneshot::channel();
    let returned = std::sync::atomic::AtomicBool::new(false);
    let guest = async {
        let pre = match pre {
            Component::P2(pre) => pre,
            Component::P3(pre) => {
                let service = pre
                    .instantiate_async(&mut store)
                    .await
                    .map_err(Stage::Instantiate)?;
                instantiated = Some(Instant::now());
                let hooks = store.data_mut().http().hooks;
                let (req, _sent) = wasmtime_wasi_http::p3::Request::from_http(hooks, incoming);
                let (response, never) = (&mut response, &returned);
                // A WASI 0.3 guest may go on writing its body after `handle` returns: the answer
                // is pumped inside the event loop that runs its tasks.
                return store
                    .run_concurrent(async |acc| {
                        let answer = service
                            .handle(acc, req)
                            .await
                            .map_err(Stage::Run)?
                            .map_err(|code| Stage::Answer(Answer::ErrorP3(format!("{code:?}"))))?;
                        let answer = acc
                            .with(|s| answer.into_http(s, async { Ok(()) }))
                            .map_err(Stage::Run)?;
                        let (parts, body) = answer.into_parts();
                        crate::wasi_http::pump_parts(parts, body, response, never)
                            .await
                            .map_err(Stage::Answer)
                    })
                    .await
                    .map_err(Stage::Run)?;
            }
        };
        let proxy = pre
            .instantiate_async(&mut store)
            .await
            .map_err(Stage::Instantiate)?;
        instantiated = Some(Instant::now());
        let mut http = store.data_mut().http();
        let req = http
            .new_incoming_request(scheme, incoming)
            .map_err(Stage::Instantiate)?;
        let out = http.new_response_outparam(tx).map_err(Stage::Instantiate)?;
        let mut call = std::pin::pin!(
            proxy
                .wasi_http_incoming_handler()
                .call_handle(&mut store, req, out)
        );
        let mut pump = std::pin::pin!(crate::wasi_http::pump(rx, &mut response, &returned));
        // The answer is taken as the guest writes it. A guest that fails ends the run at once
        // (its body may never end otherwise). Once it returns it can write nothing more: what
        // it wrote is sent, and a body it did not finish ends the answer as failed (rather
        // than waiting for the deadline with the slot held).
        tokio::select! {
            biased;
            called = &mut call => {
                called.map_err(Stage::Run)?;
                returned.store(true, std::sync::atomic::Ordering::Release);
                pump.await.map_err(Stage::Answer)
            }
            pumped = &mut pump => {
                pumped.map_err(Stage::Answer)?;
                call.await.map_err(Stage::Run)
            }
        }
    };
    let ended = tokio::time::timeout(limits.timeout, guest).await;
    let ran_until = Instant::now();
    let ran_from = instantiated.unwrap_or(ran_until);

    let ended =
        ended.map(|r| r.or_else(|stage| classify(stage, &store.data().limits, &response, None)));
    if !matches!(ended, Ok(Ok(()))) {
        store.data().guest_failed();
    }
    let body = BodyEnd {
        too_large: flags
            .too_large
            .load(std::sync::atomic::Ordering::Relaxed)
            .then_some(max_request),
        failed: flags
            .failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take(),
    };
    let result = verdict(ended, body, &response, limits.timeout, head_request);
    let result = reply(result, &mut response, tenant, request_id).await;
    let data = store.data_mut();
    let ended = Ended {
        peak_memory: data.limits.peak_memory,
        stdio: data.take_stdio(),
        outbound: data.outbound_waited(),
        times: [start, ran_from, ran_until],
    };
    ended.finish(result, tenant, request_id, || {
        teardown::teardown(store, None)
    })
}

/// Where a guest error came from.
enum Stage {
    Instantiate(wasmtime::Error),
    Run(wasmtime::Error),
    /// A component's answer could not be taken.
    Answer(Answer),
}

/// What a failed run means for the client, from the error and what the guest ran into:
/// `cgi_headers_done` is, for a CGI program, whether its header block was complete.
fn classify(
    stage: Stage,
    limits: &GuestLimits,
    response: &GuestResponse,
    cgi_headers_done: Option<bool>,
) -> Result<(), ExecError> {
    let (err, instantiating) = match stage {
        Stage::Instantiate(e) => (e, true),
        Stage::Run(e) => (e, false),
        Stage::Answer(a) => return Err(answer_error(a, response)),
    };
    if let Some(exit) = err.downcast_ref::<I32Exit>() {
        return match (exit.0, cgi_headers_done) {
            (0, _) => Ok(()),
            (_, _) if response.limit_hit => Err(response_limit(exit.0)),
            // A CGI program's exit status does not change an answer it has given (as with
            // classic CGI servers); the log has it.
            (n, Some(true)) => {
                tracing::debug!("CGI program exited with status {n} after its headers");
                Ok(())
            }
            (n, Some(false)) => Err(ExecError::new(
                Outcome::BadOutput,
                format!("the CGI program exited with status {n} before its header block ended"),
            )),
            (n, None) => Err(ExecError::new(
                Outcome::Exit,
                format!("guest exited with status {n}"),
            )),
        };
    }
    if limits.memory_limit_hit {
        return Err(ExecError::new(
            Outcome::MemoryLimit,
            format!(
                "guest exceeded its memory limit ({} MiB)",
                limits.max_memory / (1024 * 1024)
            ),
        ));
    }
    if response.limit_hit {
        return Err(response_limit(1));
    }
    if let Some(fault) = err.downcast_ref::<GuestFault>() {
        return Err(ExecError::new(
            Outcome::BadPointer,
            format!("guest fault: {fault}"),
        ));
    }
    if let Some(trap) = err.downcast_ref::<Trap>() {
        let outcome = match trap {
            Trap::StackOverflow => Outcome::TrapStackOverflow,
            Trap::MemoryOutOfBounds | Trap::TableOutOfBounds | Trap::HeapMisaligned => {
                Outcome::TrapOutOfBounds
            }
            Trap::UnreachableCodeReached => Outcome::TrapUnreachable,
            Trap::IntegerDivisionByZero | Trap::IntegerOverflow | Trap::BadConversionToInteger => {
                Outcome::TrapArithmetic
            }
            Trap::IndirectCallToNull | Trap::BadSignature => Outcome::TrapBadIndirectCall,
            _ => Outcome::TrapOther,
        };
        let text = trap.to_string();
        let text = text.strip_prefix("wasm trap: ").unwrap_or(&text);
        return Err(ExecError::new(outcome, format!("guest trapped: {text}")));
    }
    let what = if instantiating {
        "could not instantiate guest"
    } else {
        "guest failed"
    };
    // Not the guest's doing: the operator needs the cause (the client gets only `what`).
    tracing::warn!("{what}: {err:#}");
    Err(ExecError::new(Outcome::Error, what))
}

/// The failure for a component answer that could not be taken.
fn answer_error(a: Answer, response: &GuestResponse) -> ExecError {
    match a {
        Answer::NoResponse => ExecError::new(
            Outcome::BadOutput,
            "the component returned without setting a response (ResponseOutparam::set)",
        ),
        Answer::Error(code) => ExecError::new(
            Outcome::BadOutput,
            format!("the component answered with an error: {code:?}"),
        ),
        Answer::ErrorP3(code) => ExecError::new(
            Outcome::BadOutput,
            format!("the component answered with an error: {code}"),
        ),
        Answer::Limit => response_limit(if response.limit_hit { 1 } else { 0 }),
        Answer::BodyFailed(why) => ExecError::new(
            Outcome::BadOutput,
            format!("the component's response body failed before its end: {why}"),
        ),
        Answer::ClientGone => ExecError::new(Outcome::Error, "the client went away"),
        Answer::Unfinished => ExecError::new(
            Outcome::BadOutput,
            "the component returned from its handler without finishing its response body \
             (outgoing-body.finish), so the body is incomplete (componentize-js does this when \
             the JavaScript throws: see the guest's stderr)",
        ),
    }
}

/// Logs what a guest wrote to stdout and stderr (each capped at the tenant's `stdio_bytes`):
/// one line per stream with the output escaped (a newline stays `\n`), so a guest cannot forge
/// log lines.
fn log_stdio(tenant: &crate::tenant::Tenant, request_id: &str, stdio: &Stdio) {
    let (limit, name) = (tenant.limits.stdio_bytes, tenant.name.as_str());
    for (stream, pipe) in [("stdout", &stdio.stdout), ("stderr", &stdio.stderr)] {
        let bytes = pipe.contents();
        if !bytes.is_empty() && tenant.log_budget.allow() {
            let output = String::from_utf8_lossy(&bytes);
            let truncated = bytes.len() >= limit;
            // A Rust guest's panic message, tagged so it can be found (and alerted on).
            let panic = stream == "stderr" && output.contains("panicked at");
            tracing::info!(
                target: "tern::guest",
                tenant = name,
                request_id,
                stream,
                truncated,
                panic,
                output = ?output,
                "guest output"
            );
        }
    }
}
