//! Execute: one lifecycle for every guest kind: a fresh guest for one request, its handler on
//! its own fiber, its verdict, its reply, its teardown; the front end awaits one [`Answer`].
//!
//! Each request gets a new `Store` (`new_store`); the kind's [`Driver`] instantiates its guest
//! (`instantiate_async` takes a slot from the pool and maps the copy-on-write heap image) and
//! calls its handler on a pooled fiber stack: `_start` for a core module (`module`: the
//! `tern` and `cgi` kinds), `handle` for a `wasi:http` component (`wasi_http`). Epoch
//! interruption makes the guest yield in turns of a tick or two after its first slice, so a
//! busy guest never holds a worker thread, and a deadline in the guest's own time (`deadline`:
//! the time it waited for a busy worker is the server's) cuts it off.
//! The rest is shared, here ([`lifecycle`]): what a failure means for the client (`classify`,
//! `verdict`), the reply, the hand-off of a streamed head ([`answer`]), the outcome counts, the
//! captured output and teardown. The kinds' host sides are [`crate::guest`]'s.

mod deadline;
pub use deadline::WALL_FACTOR;
mod driver;
mod module;
pub mod turn;
mod wasi_http;

use std::time::{Duration, Instant};

use http::{HeaderMap, HeaderValue, StatusCode};
use tokio::sync::oneshot;
use wasmtime::{Store, UpdateDeadline};

use crate::capabilities::{Capabilities, CapabilitiesView};
use crate::guest::{Guest, GuestRequest, GuestResponse, Head, Output, Stdio};
use crate::outcome::{ExecError, Outcome, body_too_large};
use crate::teardown;
use crate::tenant::{Tenant, TenantRef};
use driver::{BodyEnd, Clock, Driver, GuestStore};

/// A guest's response, complete when the guest ended.
#[derive(Debug)]
pub struct Finished {
    /// Status set by the guest.
    pub status: StatusCode,
    /// Headers set by the guest.
    pub headers: HeaderMap,
    /// The whole body, or the backend's body the guest forwarded (which streams from there).
    pub body: crate::body::ResponseBody,
    /// The backend the guest hands the client's WebSocket to, if it does.
    pub handoff: Option<HeaderValue>,
}

/// How long a run's phases took.
#[derive(Debug, Clone, Copy)]
pub struct Phases {
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
    /// Part of `instantiate` + `run`: ready to run, waiting for a worker thread busy with
    /// other requests (not counted against the guest's time limit; see `deadline`).
    pub ready: Duration,
}

impl Phases {
    /// A run refused before it began.
    fn none(start: Instant) -> Self {
        Self {
            start,
            instantiate: Duration::ZERO,
            run: Duration::ZERO,
            teardown: Duration::ZERO,
            outbound: Duration::ZERO,
            kv: Duration::ZERO,
            ready: Duration::ZERO,
        }
    }
}

/// How a run ended, and how long its phases took.
#[derive(Debug)]
pub struct RunOutput {
    /// `Ok`, or why the guest failed.
    pub result: Result<(), ExecError>,
    /// Its phases.
    pub phases: Phases,
    /// What it wrote to stdout and stderr, if it had a WASI context.
    pub output: Option<Output>,
}

/// A guest's answer, as the front end takes it: one response, whole or streaming.
#[allow(clippy::large_enum_variant)] // moved once per request, never kept: a box would cost an allocation each
pub enum Answer {
    /// The guest ended and was torn down: its whole response, or why it failed.
    Ended {
        /// The response (the front end makes the error's).
        response: Result<Finished, ExecError>,
        /// Its phases.
        phases: Phases,
        /// What it wrote to stdout and stderr, if it had a WASI context.
        output: Option<Output>,
    },
    /// The guest's body outgrew the buffer: its head, the body streaming through its channel.
    Streaming {
        /// The head to send now.
        head: Head,
        /// The rest of the run.
        rest: Rest,
    },
}

/// The rest of a run whose answer streams.
pub enum Rest {
    /// The guest runs on, writing its body: the caller drives this to its end (say, in a task
    /// of its own) for the pool slot to be freed.
    Running(std::pin::Pin<Box<dyn Future<Output = RunOutput> + Send>>),
    /// The guest had already ended (it wrote its body fast) and was torn down.
    Ended(Box<RunOutput>),
}

impl Rest {
    /// Drives the run to its end.
    pub async fn finish(self) -> RunOutput {
        match self {
            Self::Running(run) => run.await,
            Self::Ended(out) => *out,
        }
    }
}

impl Answer {
    /// Drives the run to its end, dropping a streaming body: how it ended and its phases.
    pub async fn finish(self) -> RunOutput {
        match self {
            Self::Ended {
                response,
                phases,
                output,
            } => RunOutput {
                result: response.map(drop),
                phases,
                output,
            },
            Self::Streaming { rest, .. } => rest.finish().await,
        }
    }
}

/// Instantiates a fresh guest of `tenant`, runs it on `request`, tears it down, and answers
/// with its response: when the guest ends, or as soon as its head is ready if its body
/// outgrows the buffer (the guest then runs on in [`Rest::Running`]). `hold` (say, a pool
/// permit) is dropped after teardown. `start` is when the run begins, its phases timed from
/// there: the caller's last reading of the clock (the end of the request's queue), or now.
pub async fn answer(
    tenant: TenantRef,
    request: GuestRequest,
    hold: impl Send + 'static,
    start: Instant,
) -> Answer {
    let (commit, mut committed) = oneshot::channel();
    // (A core module's lifecycle sizes it; a component's is boxed apart in `run`.)
    let mut run = crate::budget::boxed::<4096, _>(async move {
        let ran = run(tenant, request, commit, start).await;
        drop(hold);
        ran
    });
    tokio::select! {
        // A guest that ended wins: if it failed after committing a head that was never sent,
        // the client gets a clean error instead of a cut stream.
        biased;
        (result, phases, output) = &mut run => match result {
            Ok(Some(finished)) => Answer::Ended { response: Ok(finished), phases, output },
            Err(e) => Answer::Ended { response: Err(e), phases, output },
            // It streamed and ended before its head was taken (a body just over the buffer,
            // written fast): the head waits in the channel, the whole body behind it.
            Ok(None) => match committed.try_recv() {
                Ok(head) => Answer::Streaming {
                    head,
                    rest: Rest::Ended(Box::new(RunOutput { result: Ok(()), phases, output })),
                },
                Err(_) => Answer::Ended {
                    response: Err(ExecError::new(
                        Outcome::Error,
                        "a streamed response lost its head",
                    )),
                    phases,
                    output,
                },
            },
        },
        Ok(head) = &mut committed => Answer::Streaming {
            head,
            rest: Rest::Running(Box::pin(async move {
                let (result, phases, output) = run.await;
                RunOutput { result: result.map(drop), phases, output }
            })),
        },
    }
}

/// A run's response (`None`: it streamed, its head went through the hand-off), phases and
/// output.
type Ran = (Result<Option<Finished>, ExecError>, Phases, Option<Output>);

/// Runs a fresh guest of `tenant` on `request` through its kind's [`Driver`], its phases
/// timed from `start`; a streamed head goes through `commit`.
async fn run(
    tenant: TenantRef,
    request: GuestRequest,
    commit: oneshot::Sender<Head>,
    start: Instant,
) -> Ran {
    let request_id = request.context.request_id.clone();
    let mut response = GuestResponse::new(
        tenant.limits.max_response_bytes,
        tenant.limits.max_response_headers,
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
        let result = reply(Err(e), &mut response, &tenant, &request_id);
        return (result, Phases::none(start), None);
    }
    let head_request = request.method == http::Method::HEAD;
    // Every kind's host capabilities, prepared once.
    let capabilities = Capabilities::new(&tenant.grants, &request.context);
    let run = Run {
        start,
        request_id,
        head_request,
        timeout: request.context.timeout.unwrap_or(tenant.limits.timeout),
    };
    match &tenant.guest {
        Guest::Tern(core) => {
            let (driver, state) =
                module::Module::new(&tenant, core, false, request, response, capabilities);
            lifecycle(&tenant, driver, state, run).await
        }
        Guest::Cgi(core) => {
            let (driver, state) =
                module::Module::new(&tenant, core, true, request, response, capabilities);
            lifecycle(&tenant, driver, state, run).await
        }
        Guest::WasiHttp(handler) => {
            let (driver, state) =
                wasi_http::Component::new(&tenant, handler, request, response, capabilities);
            // Boxed: a component's call future (kilobytes of wasmtime's) would otherwise
            // size every kind's run future, which `answer` copies whole into its box.
            Box::pin(lifecycle(&tenant, driver, state, run)).await
        }
    }
}

/// What every run starts from.
struct Run {
    /// When the run began (its phases are timed from here).
    start: Instant,
    /// The request's id, for log lines.
    request_id: HeaderValue,
    /// A `HEAD` request (its answer has no body, whatever length it declares).
    head_request: bool,
    /// The guest's time limit (the tenant's, or a scheduled run's).
    timeout: Duration,
}

/// The shared life of one guest: a fresh store, its handler on its own fiber within the
/// tenant's deadline, the verdict and the reply, the peak memory and the guest's output
/// recorded, then teardown, each phase timed.
///
/// (The state goes into its store before the run's future is made: an argument of an async
/// function stays in its future to the end, and [`answer`] boxes that future, copying it
/// whole, for every request.)
fn lifecycle<'a, D: Driver + 'a>(
    tenant: &'a Tenant,
    driver: D,
    state: D::State,
    run: Run,
) -> impl Future<Output = Ran> + 'a {
    let mut store = new_store(driver.engine(), state);
    store.limiter(|s| s.limits());
    lifecycle_in(tenant, driver, store, run)
}

/// [`lifecycle`] from its store on.
async fn lifecycle_in<D: Driver>(
    tenant: &Tenant,
    mut driver: D,
    mut store: Store<D::State>,
    run: Run,
) -> Ran {
    let Run {
        start,
        request_id,
        head_request,
        timeout,
    } = run;
    let mut clock = Clock::default();
    let timed = {
        let call = std::pin::pin!(driver.call(&mut store, &mut clock));
        deadline::within(start, timeout, call, turn::Hold::new(turn::key(tenant))).await
    };
    let ended = timed.ended.map(|r| driver.settle(store.data_mut(), r));
    let body = driver.body_end(store.data());
    let mut result = {
        let response = driver.response(store.data_mut());
        let result = verdict(ended, body, response, timeout, head_request);
        reply(result, response, tenant, &request_id)
    };
    let data = store.data_mut();
    let slicing = data.slicing();
    tenant.slice_habit.record(slicing);
    if slicing.cut() {
        tenant.sliced.inc();
    }
    tenant
        .memory_peak
        .observe(u64::try_from(data.limits().peak_memory).unwrap_or(u64::MAX));
    let (outbound, kv) = data.capabilities().waited();
    let stdio = data.take_stdio();
    add_stderr(tenant, &mut result, stdio.as_ref());
    // One reading ends the run (the guest's, then its answer taken out of its store) and
    // begins teardown.
    let ran_until = Instant::now();
    let sweep = driver.sweep(tenant, &mut store).await;
    let teardown = teardown::teardown(store, sweep, ran_until);
    let output = stdio.map(|stdio| stdio.output(tenant.limits.stdio_bytes));
    if let Some(output) = &output {
        log_stdio(tenant, request_id.to_str().unwrap_or("-"), output);
    }
    // Reading a body whole is the client's time, not instantiation's.
    let start = start + clock.body_read;
    let ran_from = clock.called.unwrap_or(ran_until).max(start);
    let phases = Phases {
        start,
        instantiate: ran_from - start,
        run: ran_until - ran_from,
        teardown,
        outbound,
        kv,
        ready: timed.ready,
    };
    (result, phases, output)
}

/// A fresh store for one request, time-sliced by the epoch as its state's [`Slicing`] says.
fn new_store<T: GuestStore>(engine: &wasmtime::Engine, state: T) -> Store<T> {
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

/// The verdict of a run that ended (`Ok`) or was cut off (`Err`), before its answer is sent. The server's own limits come first: a body over the limit is `413` and a broken
/// one `400`, whatever the guest made of the error (unless the answer is already streaming).
fn verdict(
    ended: Result<Result<(), ExecError>, deadline::Expired>,
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
        Err(deadline::Expired::Guest) => Err(ExecError::new(
            Outcome::Timeout,
            format!("guest exceeded its time limit ({} ms)", timeout.as_millis()),
        )),
        Err(deadline::Expired::Server) => Err(ExecError::new(
            Outcome::Overload,
            format!(
                "the server was too busy to finish this request within {} ms (the guest was \
                 within its own time limit of {} ms); try again shortly",
                (timeout * deadline::WALL_FACTOR).as_millis(),
                timeout.as_millis()
            ),
        )),
        // A body that does not match its declared length fails (a `HEAD` answer has none).
        Ok(Ok(())) => match response.length_mismatch() {
            Some(why) if !head_request => Err(ExecError::new(Outcome::ResponseLimit, why)),
            _ => Ok(()),
        },
        Ok(Err(e)) => Err(e),
    }
}

/// The reply a run's `result` makes of `response` (`None`: it streams, its head went through
/// the hand-off); a failure ends a streaming body with an error (so the client sees it cut,
/// not complete) and is logged.
fn reply(
    result: Result<(), ExecError>,
    response: &mut GuestResponse,
    tenant: &Tenant,
    request_id: &HeaderValue,
) -> Result<Option<Finished>, ExecError> {
    let result = match result {
        Ok(()) if response.is_streaming() => Ok(None),
        Ok(()) => {
            if let Some(n) = response.declared {
                response.headers.insert(
                    http::header::CONTENT_LENGTH,
                    crate::decimal::header_value(n),
                );
            }
            Ok(Some(Finished {
                status: response.status,
                headers: std::mem::take(&mut response.headers),
                body: match response.forwarded.take() {
                    Some(forwarded) => crate::body::ResponseBody::Forwarded(Box::new(forwarded)),
                    None => crate::body::ResponseBody::full(response.body.split().freeze()),
                },
                handoff: response.handoff.take(),
            }))
        }
        Err(e) => {
            response.abort_stream();
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
fn add_stderr<T>(tenant: &Tenant, result: &mut Result<T, ExecError>, stdio: Option<&Stdio>) {
    if tenant.front.errors.dev
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

/// Logs what a guest wrote to stdout and stderr (each capped at the tenant's `stdio_bytes`):
/// one line per stream with the output escaped (a newline stays `\n`), so a guest cannot forge
/// log lines.
fn log_stdio(tenant: &crate::tenant::Tenant, request_id: &str, written: &Output) {
    let name = tenant.name.as_str();
    for (stream, bytes, truncated) in [
        ("stdout", &written.stdout, written.stdout_truncated),
        ("stderr", &written.stderr, written.stderr_truncated),
    ] {
        if !bytes.is_empty() && tenant.log_budget.allow() {
            let output = String::from_utf8_lossy(bytes);
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
