//! The driver of a core module (the `tern` and `cgi` kinds): a fresh instance, then `_start`
//! on its own fiber; a CGI program whose body has no declared length gets it whole first.

use std::time::{Duration, Instant};

use wasmtime::Extern;

use super::{BodyEnd, Ended, Run, RunOutput, Stage, classify, new_store, reply, verdict};
use crate::guest::GuestRequest;
use crate::guest::module::cgi::Cgi;
use crate::guest::module::tern::{Kv, Outbound};
use crate::guest::module::{CoreGuest, GuestState, Wasi, fs};
use crate::guest::slice::Slicing;
use crate::outcome::{ExecError, Outcome};
use crate::teardown;
use crate::tenant::Tenant;

/// The driver of a core module's run: `_start` on its own fiber, for the `tern` ABI or, with
/// `cgi`, a CGI program.
pub(super) async fn run(
    tenant: &Tenant,
    core: &CoreGuest,
    cgi: bool,
    request: GuestRequest,
    Run {
        start,
        request_id,
        response,
    }: Run,
) -> RunOutput {
    let request_id = &request_id;
    let limits = &tenant.limits;
    let trace = request.context.trace.clone();
    let state = GuestState {
        wasi: Wasi::new(tenant.wasi.clone()),
        memory: None,
        request,
        response,
        limits: super::guest_limits(limits),
        files: fs::Files::new(tenant.assets.clone()),
        outbound: Outbound::new(tenant.outbound.clone()),
        kv: Kv::new(tenant.kv.clone(), trace),
        cgi: cgi.then(Cgi::default),
        headers_blob: None,
        slicing: Slicing::new(tenant.slice_habit.long_first_slice()),
    };
    let mut store = new_store(core.pre.module().engine(), state);
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
    let (too_large, failed) = state.request.body_end();
    let body = BodyEnd {
        too_large: too_large.then_some(state.request.max_bytes),
        failed,
    };
    let head_request = state.request.method == http::Method::HEAD;
    let result = verdict(ended, body, &state.response, limits.timeout, head_request);
    let result = reply(result, &mut state.response, tenant, request_id).await;
    let data = store.data_mut();
    let ended = Ended {
        peak_memory: data.limits.peak_memory,
        stdio: data.wasi.take_stdio(),
        outbound: data.outbound.waited,
        kv: data.kv.session.waited,
        // Reading a body whole is the client's time, not instantiation's.
        times: [
            start + body_read,
            ran_from.max(start + body_read),
            ran_until,
        ],
    };
    let memory = data.memory;
    tenant.slice_habit.record(&data.slicing);
    ended.finish(result, tenant, request_id, || {
        let started = Instant::now();
        let sweep = teardown::due(tenant.sweep.as_ref(), memory, &mut store);
        teardown::teardown(store, sweep, started)
    })
}
