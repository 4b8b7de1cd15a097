//! Execute: instantiate a fresh guest for one request and run its handler on its own fiber.
//!
//! Each request gets a new `Store`; `instantiate_async` takes a slot from the pool and maps the
//! module's copy-on-write heap image; the handler (`_start`) runs through `call_async` on a
//! pooled fiber stack. Epoch interruption makes the guest yield every tick, so a busy guest
//! never holds a worker thread, and a wall-clock deadline around the whole run cuts it off.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};
use tokio::sync::oneshot;
use wasmtime::{Extern, Store, Trap, UpdateDeadline};
use wasmtime_wasi::I32Exit;

use crate::engine::EPOCH_TICK;
use crate::hostcalls::outbound::Outbound;
use crate::hostcalls::{
    GuestFault, GuestLimits, GuestRequest, GuestResponse, GuestState, Head, Stdio, Wasi,
};
use crate::outcome::{ExecError, Outcome, body_too_large, response_limit};
use crate::teardown;
use crate::tenant::TenantRef;

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
    request_id: HeaderValue,
) -> RunOutput {
    let start = Instant::now();
    let limits = &tenant.limits;
    let state = GuestState {
        wasi: Wasi::new(tenant.wasi.clone()),
        memory: None,
        request,
        response: GuestResponse::new(
            limits.max_response_bytes,
            limits.max_response_headers,
            commit,
        ),
        limits: GuestLimits {
            max_memory: limits.max_memory,
            max_table_elements: limits.max_table_elements,
            memory_limit_hit: false,
            peak_memory: 0,
        },
        files: crate::hostcalls::fs::Files::new(tenant.assets.clone()),
        outbound: Outbound::new(tenant.outbound.clone()),
    };
    let mut store = Store::new(tenant.pre.module().engine(), state);
    store.limiter(|s| &mut s.limits);
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

    let mut instantiated = None;
    let guest = async {
        let instance = tenant
            .pre
            .instantiate_async(&mut store)
            .await
            .map_err(Stage::Instantiate)?;
        let memory = instance
            .get_module_export(&mut store, &tenant.memory)
            .and_then(Extern::into_memory);
        store.data_mut().memory = memory;
        let handler = instance
            .get_module_export(&mut store, &tenant.start)
            .and_then(Extern::into_func)
            .ok_or_else(|| Stage::Instantiate(wasmtime::format_err!("handler export missing")))?;
        let handler = handler
            .typed::<(), ()>(&store)
            .map_err(Stage::Instantiate)?;
        instantiated = Some(Instant::now());
        handler.call_async(&mut store, ()).await.map_err(Stage::Run)
    };
    let result = tokio::time::timeout(limits.timeout, guest).await;
    let ended = Instant::now();
    let ran_from = instantiated.unwrap_or(ended);

    let result = match result {
        // The body limit is the server's to enforce, and a broken body the client's fault,
        // whatever the guest made of the error.
        _ if store.data().request.too_large && !store.data().response.is_streaming() => {
            Err(body_too_large(store.data().request.max_bytes))
        }
        _ if store.data().request.body_error.is_some() && !store.data().response.is_streaming() => {
            Err(ExecError::new(
                Outcome::BadRequest,
                format!(
                    "the request body could not be read: {}",
                    store
                        .data()
                        .request
                        .body_error
                        .as_deref()
                        .unwrap_or_default()
                ),
            ))
        }
        Err(_elapsed) => Err(ExecError::new(
            Outcome::Timeout,
            format!(
                "guest exceeded its time limit ({} ms)",
                limits.timeout.as_millis()
            ),
        )),
        // A body that does not match its declared length fails (a `HEAD` answer has none).
        Ok(Ok(())) => match store.data().response.length_mismatch() {
            Some(why) if store.data().request.method != http::Method::HEAD => {
                Err(ExecError::new(Outcome::ResponseLimit, why))
            }
            _ => Ok(()),
        },
        Ok(Err(stage)) => classify(stage, store.data()),
    };
    let result = match result {
        Ok(()) if store.data().response.is_streaming() => Ok(Reply::Streamed),
        Ok(()) => {
            let resp = &mut store.data_mut().response;
            if let Some(n) = resp.declared {
                resp.headers
                    .insert(http::header::CONTENT_LENGTH, HeaderValue::from(n));
            }
            Ok(Reply::Buffered(Finished {
                status: resp.status,
                headers: std::mem::take(&mut resp.headers),
                body: resp.body.split().freeze(),
            }))
        }
        Err(e) => {
            store.data_mut().response.abort_stream().await;
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
    tenant
        .memory_peak
        .observe(store.data().limits.peak_memory as f64);
    let stdio = store.data_mut().wasi.take_stdio();
    let mut result = result;
    if tenant.errors.dev
        && let (Err(e), Some(stdio)) = (&mut result, &stdio)
    {
        let stderr = stdio.stderr.contents();
        if !stderr.is_empty() {
            e.message.push_str("\n--- the guest's stderr ---\n");
            e.message
                .push_str(String::from_utf8_lossy(&stderr).trim_end());
        }
    }
    let outbound = store.data().outbound.waited;
    let teardown = teardown::teardown(store, tenant.sweep.as_ref());
    if let Some(stdio) = stdio {
        log_stdio(&tenant, request_id.to_str().unwrap_or("-"), &stdio);
    }
    RunOutput {
        result,
        instantiate: ran_from - start,
        run: ended - ran_from,
        teardown,
        outbound,
    }
}

/// Where a guest error came from.
enum Stage {
    Instantiate(wasmtime::Error),
    Run(wasmtime::Error),
}

fn classify(stage: Stage, state: &GuestState) -> Result<(), ExecError> {
    let (err, instantiating) = match stage {
        Stage::Instantiate(e) => (e, true),
        Stage::Run(e) => (e, false),
    };
    if let Some(exit) = err.downcast_ref::<I32Exit>() {
        return match exit.0 {
            0 => Ok(()),
            n if state.response.limit_hit => Err(response_limit(n)),
            n => Err(ExecError::new(
                Outcome::Exit,
                format!("guest exited with status {n}"),
            )),
        };
    }
    if state.limits.memory_limit_hit {
        return Err(ExecError::new(
            Outcome::MemoryLimit,
            format!(
                "guest exceeded its memory limit ({} MiB)",
                state.limits.max_memory / (1024 * 1024)
            ),
        ));
    }
    if state.response.limit_hit {
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
