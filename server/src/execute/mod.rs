//! Execute: the drivers of the guest kinds and the lifecycle they share: a fresh guest for one
//! request, its handler on its own fiber, its verdict, its reply, its teardown.
//!
//! Each request gets a new `Store` (`new_store`); the kind's driver instantiates its guest
//! (`instantiate_async` takes a slot from the pool and maps the copy-on-write heap image) and
//! calls its handler on a pooled fiber stack: `_start` for a core module (`module`: the
//! `tern` and `cgi` kinds), `handle` for a `wasi:http` component (`wasi_http`). Epoch
//! interruption makes the guest yield in turns of a tick or two after its first slice, so a
//! busy guest never holds a worker thread, and a wall-clock deadline around the whole run cuts
//! it off.
//! The rest is shared, here: what a failure means for the client (`classify`, `verdict`), the
//! reply, the outcome counts, the captured output and teardown (`Ended`). The kinds' host
//! sides are [`crate::guest`]'s.

mod module;
mod wasi_http;

use std::time::{Duration, Instant};

use http::{HeaderMap, HeaderValue, StatusCode};
use tokio::sync::oneshot;
use wasmtime::{Store, Trap, UpdateDeadline};
use wasmtime_wasi::I32Exit;

use crate::guest::module::GuestFault;
use crate::guest::slice::Slicing;
use crate::guest::{Guest, GuestLimits, GuestRequest, GuestResponse, Head, Stdio};
use crate::outcome::{ExecError, Outcome, body_too_large, response_limit};
use crate::tenant::{Tenant, TenantRef};

/// A guest's response, complete when the guest ended.
#[derive(Debug)]
pub struct Finished {
    /// Status set by the guest.
    pub status: StatusCode,
    /// Headers set by the guest.
    pub headers: HeaderMap,
    /// The whole body, or the backend's body the guest forwarded (which streams from there).
    pub body: crate::body::ResponseBody,
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
    /// When the run began (instantiation, then the handler, then teardown follow).
    pub start: Instant,
    /// `Store::new` + `instantiate_async` (the WASI context is built on first use, in `run`).
    pub instantiate: Duration,
    /// The handler call.
    pub run: Duration,
    /// Dropping the store.
    pub teardown: Duration,
    /// Part of `run`: waiting for outbound requests.
    pub outbound: Duration,
    /// Part of `run`: waiting for key-value stores.
    pub kv: Duration,
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
    let run = Run {
        start: Instant::now(),
        request_id: request.context.request_id.clone(),
        response: GuestResponse::new(
            tenant.limits.max_response_bytes,
            tenant.limits.max_response_headers,
            commit,
        ),
    };
    match &tenant.guest {
        Guest::Tern(core) => module::run(&tenant, core, false, request, run).await,
        Guest::Cgi(core) => module::run(&tenant, core, true, request, run).await,
        Guest::WasiHttp(handler) => wasi_http::run(&tenant, handler, request, run).await,
    }
}

/// What every driver starts from.
struct Run {
    /// When the run began (its phases are timed from here).
    start: Instant,
    /// The request's id, for log lines.
    request_id: HeaderValue,
    /// The empty response the guest writes.
    response: GuestResponse,
}

/// A store's state that keeps its guest's time slicing ([`crate::guest::slice`]).
pub(crate) trait Sliced {
    /// The guest's slicing.
    fn slicing(&mut self) -> &mut Slicing;
}

impl Sliced for crate::guest::module::GuestState {
    fn slicing(&mut self) -> &mut Slicing {
        &mut self.slicing
    }
}

impl Sliced for crate::guest::wasi_http::HttpState {
    fn slicing(&mut self) -> &mut Slicing {
        &mut self.slicing
    }
}

/// A fresh store for one request, time-sliced by the epoch as its state's [`Slicing`] says.
pub(super) fn new_store<T: Sliced + 'static>(engine: &wasmtime::Engine, state: T) -> Store<T> {
    let mut store = Store::new(engine, state);
    // Time slicing, not a limit: the guest yields at the ticks `Slicing` says. A tick that
    // lands in a short guest's first microseconds never sends it to the back of the run queue
    // (with a yield at every tick, 2-3 % of `hello` runs under load took 1-8 ms).
    store.set_epoch_deadline(1);
    // The store owns the callback, so the tickers tick while it exists.
    let live = crate::engine::LiveStore::new();
    store.epoch_deadline_callback(move |mut ctx| {
        let _ticked_while = &live;
        let slicing = ctx.data_mut().slicing();
        Ok(if slicing.tick(crate::guest::slice::thread_clock) {
            UpdateDeadline::YieldCustom(1, slicing.pause())
        } else {
            UpdateDeadline::Continue(1)
        })
    });
    store
}

/// The limits of one guest of a tenant with `limits` (one core instance; a component's state
/// raises it).
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
pub(super) struct BodyEnd {
    /// The body went past the tenant's limit of this many bytes.
    pub too_large: Option<u64>,
    /// The body could not be read.
    pub failed: Option<String>,
}

/// The verdict of a run that ended (`Ok`) or passed its deadline (`Err`), before its answer
/// is sent. The server's own limits come first: a body over the limit is `413` and a broken
/// one `400`, whatever the guest made of the error (unless the answer is already streaming).
pub(super) fn verdict(
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
pub(super) async fn reply(
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
                body: match response.forwarded.take() {
                    Some(forwarded) => crate::body::ResponseBody::Forwarded(Box::new(forwarded)),
                    None => crate::body::ResponseBody::full(response.body.split().freeze()),
                },
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

/// What every run hands to [`Ended::finish`].
pub(super) struct Ended {
    pub peak_memory: usize,
    pub stdio: Option<Stdio>,
    pub outbound: Duration,
    pub kv: Duration,
    /// Start, end of instantiation, end of the run.
    pub times: [Instant; 3],
}

impl Ended {
    /// The end every run shares: the peak memory recorded, the guest's output added (in `tern
    /// dev`) and logged, the store torn down by `teardown`, the phases timed.
    pub(super) fn finish(
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
            start,
            instantiate: ran_from - start,
            run: ran_until - ran_from,
            teardown,
            outbound: self.outbound,
            kv: self.kv,
        }
    }
}

/// Where a guest error came from.
pub(super) enum Stage {
    Instantiate(wasmtime::Error),
    Run(wasmtime::Error),
    /// The guest's answer could not be taken (the kind's driver says why).
    Answer(ExecError),
}

/// What a failed run means for the client, from the error and what the guest ran into:
/// `cgi_headers_done` is, for a CGI program, whether its header block was complete.
pub(super) fn classify(
    stage: Stage,
    limits: &GuestLimits,
    response: &GuestResponse,
    cgi_headers_done: Option<bool>,
) -> Result<(), ExecError> {
    let (err, instantiating) = match stage {
        Stage::Instantiate(e) => (e, true),
        Stage::Run(e) => (e, false),
        Stage::Answer(e) => return Err(e),
    };
    if let Some(exit) = err.downcast_ref::<I32Exit>() {
        return match (exit.0, cgi_headers_done) {
            (0, _) => Ok(()),
            (_, _) if response.limit_hit => Err(response_limit()),
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
        return Err(response_limit());
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
    // Not the guest's doing: the operator needs the cause (the client gets only `what`), and
    // when the host ran out of mappings or files, which limit and how to raise it.
    match crate::host::Exhausted::in_chain(err.chain()) {
        Some(limit) => tracing::warn!("{what}: {err:#}; {}", limit.advice()),
        None => tracing::warn!("{what}: {err:#}"),
    }
    Err(ExecError::new(Outcome::Error, what))
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
