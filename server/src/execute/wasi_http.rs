//! The driver of a `wasi:http` component: `incoming-handler.handle` (WASI 0.2) or
//! `handler.handle` (WASI 0.3) with the request, its answer moved into the shared response as
//! the guest writes it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use wasmtime_wasi_http::WasiHttpView;
use wasmtime_wasi_http::p2::bindings::http::types::Scheme;

use super::{BodyEnd, Ended, Run, RunOutput, Stage, classify, new_store, reply, verdict};
use crate::body::BodyFlags;
use crate::guest::GuestRequest;
use crate::guest::slice::Slicing;
use crate::guest::wasi_http::{Handler, HttpState, Proxy, Unanswered, incoming, pump, pump_parts};
use crate::outcome::{ExecError, Outcome, response_limit};
use crate::teardown;
use crate::tenant::Tenant;

/// A `wasi:http` component's run: `incoming-handler.handle` (WASI 0.2) or `handler.handle`
/// (WASI 0.3, run in the store's concurrent event loop, which keeps running the guest's tasks
/// while its body streams) with the request, its answer moved into a [`GuestResponse`] as the
/// guest writes it.
pub(super) async fn run(
    tenant: &Tenant,
    handler: &Handler,
    request: GuestRequest,
    Run {
        start,
        request_id,
        mut response,
    }: Run,
) -> RunOutput {
    let request_id = &request_id;
    let limits = &tenant.limits;
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
            start,
            instantiate: Duration::ZERO,
            run: Duration::ZERO,
            teardown: Duration::ZERO,
            outbound: Duration::ZERO,
            kv: Duration::ZERO,
        };
    }
    let flags = Arc::new(BodyFlags::default());
    let head_request = request.method == http::Method::HEAD;
    let max_request = request.max_bytes;
    let mut state = HttpState::new(
        tenant.wasi.clone(),
        super::guest_limits(limits),
        tenant.outbound.clone(),
        tenant.kv.clone(),
        &request.headers,
        request.context.trace.as_ref(),
        request_id,
    );
    state.slicing = Slicing::new(tenant.slice_habit.long_first_slice());
    let scheme = match request.context.conn.tls {
        Some(_) => Scheme::Https,
        None => Scheme::Http,
    };
    let incoming = incoming(request, flags.clone());
    let mut store = new_store(handler.engine(), state);
    store.limiter(|s| &mut s.limits);

    let mut instantiated = None;
    let mut instance = None;
    let (tx, rx) = oneshot::channel();
    let returned = AtomicBool::new(false);
    let guest = async {
        let pre = match handler {
            Handler::P2(proxy) => proxy,
            Handler::P3(pre) => {
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
                            .map_err(|code| {
                                Stage::Answer(answer_error(Unanswered::ErrorP3(format!(
                                    "{code:?}"
                                ))))
                            })?;
                        let answer = acc
                            .with(|s| answer.into_http(s, async { Ok(()) }))
                            .map_err(Stage::Run)?;
                        let (parts, body) = answer.into_parts();
                        pump_parts(parts, body, response, never)
                            .await
                            .map_err(|a| Stage::Answer(answer_error(a)))
                    })
                    .await
                    .map_err(Stage::Run)?;
            }
        };
        let made = pre
            .pre
            .instantiate_async(&mut store)
            .await
            .map_err(Stage::Instantiate)?;
        instance = Some(made);
        let proxy = pre
            .handler
            .load(&mut store, &made)
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
        let mut pump = std::pin::pin!(pump(rx, &mut response, &returned));
        // The answer is taken as the guest writes it. A guest that fails ends the run at once
        // (its body may never end otherwise). Once it returns it can write nothing more: what
        // it wrote is sent, and a body it did not finish ends the answer as failed (rather
        // than waiting for the deadline with the slot held).
        tokio::select! {
            biased;
            called = &mut call => {
                called.map_err(Stage::Run)?;
                returned.store(true, Ordering::Release);
                pump.await.map_err(|a| Stage::Answer(answer_error(a)))
            }
            pumped = &mut pump => {
                pumped.map_err(|a| Stage::Answer(answer_error(a)))?;
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
            .load(Ordering::Relaxed)
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
    tenant.slice_habit.record(&data.slicing);
    let ended = Ended {
        peak_memory: data.limits.peak_memory,
        stdio: data.take_stdio(),
        outbound: data.outbound_waited(),
        kv: data.kv_waited(),
        times: [start, ran_from, ran_until],
    };
    // The memory probe runs only when the tenant's sweep is due: most requests of a compact
    // guest skip both.
    let started = Instant::now();
    let sweep = match (handler, &tenant.sweep, instance) {
        (
            Handler::P2(Proxy {
                probe: Some(probe), ..
            }),
            Some(sweep),
            Some(instance),
        ) if sweep.due() => probe_memory(&mut store, instance, probe)
            .await
            .map(|m| (sweep, m)),
        _ => None,
    };
    ended.finish(result, tenant, request_id, || {
        teardown::teardown(store, sweep, started)
    })
}

/// How long the memory probe may take; it runs one call into a few instructions, so only a
/// component that brought its own export of that name (and spins in it) ever reaches this.
const PROBE_TIME: Duration = Duration::from_millis(5);

/// The address and length of the component's main memory, from its memory probe
/// ([`crate::probe`]); `None` if the probe cannot run (say, the guest trapped).
async fn probe_memory(
    store: &mut wasmtime::Store<HttpState>,
    instance: wasmtime::component::Instance,
    probe: &wasmtime::component::ComponentExportIndex,
) -> Option<(usize, usize)> {
    // Only this call's report counts (a guest may call the import itself while it runs).
    store.data_mut().memory = None;
    let run = instance.get_typed_func::<(), ()>(&mut *store, probe).ok()?;
    tokio::time::timeout(PROBE_TIME, run.call_async(&mut *store, ()))
        .await
        .ok()?
        .ok()?;
    store.data_mut().memory.take()
}

/// The failure for a component answer that could not be taken.
fn answer_error(a: Unanswered) -> ExecError {
    match a {
        Unanswered::NoResponse => ExecError::new(
            Outcome::BadOutput,
            "the component returned without setting a response (ResponseOutparam::set)",
        ),
        Unanswered::Error(code) => ExecError::new(
            Outcome::BadOutput,
            format!("the component answered with an error: {code:?}"),
        ),
        Unanswered::ErrorP3(code) => ExecError::new(
            Outcome::BadOutput,
            format!("the component answered with an error: {code}"),
        ),
        Unanswered::Limit => response_limit(),
        Unanswered::BodyFailed(why) => ExecError::new(
            Outcome::BadOutput,
            format!("the component's response body failed before its end: {why}"),
        ),
        Unanswered::ClientGone => ExecError::new(Outcome::Error, "the client went away"),
        Unanswered::Unfinished => ExecError::new(
            Outcome::BadOutput,
            "the component returned from its handler without finishing its response body \
             (outgoing-body.finish), so the body is incomplete (componentize-js does this when \
             the JavaScript throws: see the guest's stderr)",
        ),
    }
}
