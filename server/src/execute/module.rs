//! The driver of a core module (the `tern` and `cgi` kinds): a fresh instance, then `_start`
//! on its own fiber; a CGI program whose body has no declared length gets it whole first.

use std::time::Instant;

use wasmtime::{Extern, Store};

use super::driver::{BodyEnd, Clock, Driver, GuestStore, Stage, classify, guest_limits};
use crate::capabilities::Capabilities;
use crate::guest::module::cgi::Cgi;
use crate::guest::module::{CoreGuest, GuestState, Wasi, fs};
use crate::guest::slice::Slicing;
use crate::guest::{GuestLimits, GuestRequest, GuestResponse, Stdio};
use crate::outcome::{ExecError, Outcome};
use crate::teardown::{self, MemorySweep};
use crate::tenant::Tenant;

/// A core module's run: `_start` on its own fiber, for the `tern` ABI or, with `cgi`, a CGI
/// program.
pub(super) struct Module<'a> {
    core: &'a CoreGuest,
    cgi: bool,
}

impl<'a> Module<'a> {
    /// The driver and the store's state of one run of `core`, a guest of `tenant`.
    pub(super) fn new(
        tenant: &Tenant,
        core: &'a CoreGuest,
        cgi: bool,
        request: GuestRequest,
        response: GuestResponse,
        capabilities: Capabilities,
    ) -> (Self, GuestState) {
        let state = GuestState {
            wasi: Wasi::new(tenant.wasi.clone()),
            memory: None,
            request,
            response,
            limits: guest_limits(&tenant.limits),
            files: fs::Files::new(tenant.assets.clone()),
            capabilities,
            tables: Default::default(),
            cgi: cgi.then(Cgi::default),
            headers_blob: None,
            slicing: Slicing::new(tenant.slice_habit.long_first_slice()),
        };
        (Self { core, cgi }, state)
    }
}

impl Driver for Module<'_> {
    type State = GuestState;

    fn engine(&self) -> &wasmtime::Engine {
        self.core.pre.module().engine()
    }

    async fn call(
        &mut self,
        store: &mut Store<GuestState>,
        clock: &mut Clock,
    ) -> Result<(), Stage> {
        if self.cgi && store.data().request.length_unknown() {
            // RFC 3875 gives a CGI program its body with a length: one sent without (chunked)
            // is read whole first. Over the limit or broken, the program is not run: the
            // verdict answers 413 or 400.
            let reading = Instant::now();
            let request = &mut store.data_mut().request;
            request.buffer_whole().await;
            clock.body_read = reading.elapsed();
            if request.too_large || request.body_error.is_some() {
                return Ok(());
            }
        }
        let core = self.core;
        let instance = core
            .pre
            .instantiate_async(&mut *store)
            .await
            .map_err(Stage::Instantiate)?;
        let memory = instance
            .get_module_export(&mut *store, &core.memory)
            .and_then(Extern::into_memory);
        store.data_mut().memory = memory;
        let handler = instance
            .get_module_export(&mut *store, &core.start)
            .and_then(Extern::into_func)
            .ok_or_else(|| Stage::Instantiate(wasmtime::format_err!("handler export missing")))?;
        let handler = handler
            .typed::<(), ()>(&*store)
            .map_err(Stage::Instantiate)?;
        clock.called = Some(Instant::now());
        handler.call_async(store, ()).await.map_err(Stage::Run)
    }

    fn settle(
        &mut self,
        state: &mut GuestState,
        ended: Result<(), Stage>,
    ) -> Result<(), ExecError> {
        let cgi_exit = |stage: &Stage| {
            let cgi = state.cgi.as_ref().filter(|_| !state.response.limit_hit)?;
            let status = stage.exit_status().filter(|&n| n != 0)?;
            Some(cgi_exited(status, cgi.in_body))
        };
        ended
            .or_else(|stage| match cgi_exit(&stage) {
                Some(settled) => settled,
                None => classify(stage, &state.limits, &state.response),
            })
            .and_then(|()| {
                let why = state
                    .cgi
                    .as_mut()
                    .and_then(|cgi| cgi.finish(&mut state.response));
                why.map_or(Ok(()), |why| Err(ExecError::new(Outcome::BadOutput, why)))
            })
    }

    fn response<'s>(&'s mut self, state: &'s mut GuestState) -> &'s mut GuestResponse {
        &mut state.response
    }

    fn body_end(&self, state: &GuestState) -> BodyEnd {
        let (too_large, failed) = state.request.body_end();
        BodyEnd {
            too_large: too_large.then_some(state.request.max_bytes),
            failed,
        }
    }

    async fn sweep<'t>(
        &mut self,
        tenant: &'t Tenant,
        store: &mut Store<GuestState>,
    ) -> Option<(&'t MemorySweep, (usize, usize))> {
        let memory = store.data().memory;
        teardown::due(tenant.sweep.as_ref(), memory, store)
    }
}

/// A CGI program that exited with `status` (not 0): its exit status does not change an
/// answer it has given, its header block complete (`in_body`), as with classic CGI servers
/// (the log has it); before that, it gave none.
fn cgi_exited(status: i32, in_body: bool) -> Result<(), ExecError> {
    if in_body {
        tracing::debug!("CGI program exited with status {status} after its headers");
        return Ok(());
    }
    Err(ExecError::new(
        Outcome::BadOutput,
        format!("the CGI program exited with status {status} before its header block ended"),
    ))
}

impl GuestStore for GuestState {
    fn slicing(&mut self) -> &mut Slicing {
        &mut self.slicing
    }

    fn limits(&mut self) -> &mut GuestLimits {
        &mut self.limits
    }

    fn take_stdio(&mut self) -> Option<Stdio> {
        self.wasi.take_stdio()
    }
}
