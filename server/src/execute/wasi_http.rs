//! The driver of a `wasi:http` component: `incoming-handler.handle` (WASI 0.2) or
//! `handler.handle` (WASI 0.3) with the request, its answer moved into the shared response as
//! the guest writes it; for a scheduled run of a component that exports Spin's
//! `handle-cron-event`, that call instead.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use wasmtime_wasi_http::WasiHttpView;
use wasmtime_wasi_http::p2::bindings::http::types::Scheme;

use wasmtime::Store;

use super::driver::{BodyEnd, Clock, Driver, GuestStore, Stage, classify, guest_limits};
use crate::body::BodyFlags;
use crate::capabilities::Capabilities;
use crate::guest::slice::Slicing;
use crate::guest::wasi_http::{Handler, HttpState, Proxy, Unanswered, incoming, pump, pump_parts};
use crate::guest::{GuestLimits, GuestRequest, GuestResponse, Stdio};
use crate::outcome::{ExecError, Outcome, response_limit};
use crate::teardown::MemorySweep;
use crate::tenant::Tenant;

/// A `wasi:http` component's run: `incoming-handler.handle` (WASI 0.2) or `handler.handle`
/// (WASI 0.3, run in the store's concurrent event loop, which keeps running the guest's tasks
/// while its body streams) with the request, its answer moved into a [`GuestResponse`] as the
/// guest writes it.
pub(super) struct Component<'a> {
    handler: &'a Handler,
    /// The request, until the guest is given it.
    request: Option<GuestRequest>,
    /// How its body ended (set as the guest reads it).
    flags: Arc<BodyFlags>,
    max_request: u64,
    scheme: Scheme,
    /// The response the guest writes (outside the store: the answer is pumped into it).
    response: GuestResponse,
    /// The instance (WASI 0.2), for the memory probe.
    instance: Option<wasmtime::component::Instance>,
    /// A scheduled run of a component with Spin's cron export: the tick (Unix seconds) its
    /// `handle-cron-event` is called with.
    cron_tick: Option<u64>,
}

impl<'a> Component<'a> {
    /// The driver and the store's state of one run of `handler`, a guest of `tenant`.
    pub(super) fn new(
        tenant: &Tenant,
        handler: &'a Handler,
        request: GuestRequest,
        response: GuestResponse,
        mut capabilities: Capabilities,
    ) -> (Self, HttpState) {
        // What the request hands on to the guest's requests, worked out now: its headers go
        // to the guest.
        capabilities
            .outbound
            .passing(&request.headers, request.context.trace.as_ref());
        let limits = guest_limits(&tenant.limits);
        let mut state = HttpState::new(tenant.wasi.clone(), limits, capabilities);
        state.slicing = Slicing::new(tenant.slice_habit.long_first_slice());
        let scheme = match request.context.conn.tls {
            Some(_) => Scheme::Https,
            None => Scheme::Http,
        };
        let cron_tick = match handler {
            Handler::P2(Proxy { cron: Some(_), .. })
                if request.context.trigger == crate::trigger::Trigger::Schedule =>
            {
                Some(scheduled_time(&request.headers))
            }
            _ => None,
        };
        let driver = Self {
            handler,
            max_request: request.max_bytes,
            request: Some(request),
            flags: Arc::new(BodyFlags::default()),
            scheme,
            response,
            instance: None,
            cron_tick,
        };
        (driver, state)
    }
}

impl Driver for Component<'_> {
    type State = HttpState;

    fn engine(&self) -> &wasmtime::Engine {
        self.handler.engine()
    }

    async fn call(&mut self, store: &mut Store<HttpState>, clock: &mut Clock) -> Result<(), Stage> {
        let Some(request) = self.request.take() else {
            return Ok(());
        };
        let incoming = incoming(request, self.flags.clone());
        let (tx, rx) = oneshot::channel();
        let returned = AtomicBool::new(false);
        let pre = match self.handler {
            Handler::P2(proxy) => proxy,
            Handler::P3(pre) => {
                let service = pre
                    .instantiate_async(&mut *store)
                    .await
                    .map_err(Stage::Instantiate)?;
                clock.called = Some(Instant::now());
                let hooks = store.data_mut().http().hooks;
                let (req, _sent) = wasmtime_wasi_http::p3::Request::from_http(hooks, incoming);
                let (response, never) = (&mut self.response, &returned);
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
        if let (Some(tick), Some(index)) = (self.cron_tick, pre.cron) {
            return self.cron(store, clock, pre, index, tick).await;
        }
        let Some(handler) = &pre.handler else {
            return Err(Stage::Answer(ExecError::new(
                Outcome::NotServed,
                "this tenant serves no requests: its component exports only Spin's \
                 handle-cron-event, which runs on the tenant's schedules",
            )));
        };
        let made = pre
            .pre
            .instantiate_async(&mut *store)
            .await
            .map_err(Stage::Instantiate)?;
        self.instance = Some(made);
        let proxy = handler
            .load(&mut *store, &made)
            .map_err(Stage::Instantiate)?;
        clock.called = Some(Instant::now());
        let mut http = store.data_mut().http();
        let req = http
            .new_incoming_request(self.scheme.clone(), incoming)
            .map_err(Stage::Instantiate)?;
        let out = http.new_response_outparam(tx).map_err(Stage::Instantiate)?;
        let mut call = std::pin::pin!(proxy.wasi_http_incoming_handler().call_handle(
            &mut *store,
            req,
            out
        ));
        let mut pump = std::pin::pin!(pump(rx, &mut self.response, &returned));
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
    }

    fn settle(&mut self, state: &mut HttpState, ended: Result<(), Stage>) -> Result<(), ExecError> {
        let settled = ended.or_else(|stage| classify(stage, &state.limits, &self.response));
        if settled.is_err() {
            state.guest_failed();
        }
        settled
    }

    fn response<'s>(&'s mut self, _: &'s mut HttpState) -> &'s mut GuestResponse {
        &mut self.response
    }

    fn body_end(&self, _: &HttpState) -> BodyEnd {
        BodyEnd {
            too_large: self
                .flags
                .too_large
                .load(Ordering::Relaxed)
                .then_some(self.max_request),
            failed: self
                .flags
                .failed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take(),
        }
    }

    /// The memory probe runs only when the tenant's sweep is due: most requests of a compact
    /// guest skip both.
    async fn sweep<'t>(
        &mut self,
        tenant: &'t Tenant,
        store: &mut Store<HttpState>,
    ) -> Option<(&'t MemorySweep, (usize, usize))> {
        match (self.handler, &tenant.sweep, self.instance) {
            (
                Handler::P2(Proxy {
                    probe: Some(probe), ..
                }),
                Some(sweep),
                Some(instance),
            ) if sweep.due() => probe_memory(store, instance, probe)
                .await
                .map(|m| (sweep, m)),
            _ => None,
        }
    }
}

impl Component<'_> {
    /// A scheduled run of a component with Spin's cron export: `handle-cron-event` with the
    /// tick `tick` (Unix seconds). `Ok` is an empty `200`; the guest's `error` fails the run
    /// (`502`, its message kept).
    async fn cron(
        &mut self,
        store: &mut Store<HttpState>,
        clock: &mut Clock,
        proxy: &Proxy,
        index: wasmtime::component::ComponentExportIndex,
        tick: u64,
    ) -> Result<(), Stage> {
        use wasmtime::component::Val;
        let made = proxy
            .pre
            .instantiate_async(&mut *store)
            .await
            .map_err(Stage::Instantiate)?;
        self.instance = Some(made);
        let func = made.get_func(&mut *store, index).ok_or_else(|| {
            Stage::Instantiate(wasmtime::Error::msg(
                "the component's handle-cron-event is not a function",
            ))
        })?;
        clock.called = Some(Instant::now());
        let metadata = Val::Record(vec![("timestamp".to_string(), Val::U64(tick))]);
        let mut results = [Val::Bool(false)];
        func.call_async(&mut *store, &[metadata], &mut results)
            .await
            .map_err(Stage::Run)?;
        match &results[0] {
            Val::Result(Ok(_)) => Ok(()),
            Val::Result(Err(error)) => Err(Stage::Answer(ExecError::new(
                Outcome::BadOutput,
                format!(
                    "handle-cron-event returned an error: {}",
                    cron_error_text(error.as_deref())
                ),
            ))),
            other => Err(Stage::Answer(ExecError::new(
                Outcome::BadOutput,
                format!("handle-cron-event returned {other:?}, not Spin's result<_, error>"),
            ))),
        }
    }
}

/// The tick a scheduled run is for, in Unix seconds: its `Tern-Scheduled-Time` (set by the
/// scheduler; a client's is removed when it is routed), or now.
fn scheduled_time(headers: &http::HeaderMap) -> u64 {
    headers
        .get(&crate::schedule::TERN_SCHEDULED_TIME)
        .and_then(|v| v.to_str().ok())
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .and_then(|t| u64::try_from(t.timestamp()).ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
        })
}

/// The text of Spin's cron `error` (`other(string)`), or the value as it came.
fn cron_error_text(error: Option<&wasmtime::component::Val>) -> String {
    use wasmtime::component::Val;
    match error {
        Some(Val::Variant(_, Some(text))) => match &**text {
            Val::String(s) => s.chars().take(1000).collect(),
            other => format!("{other:?}"),
        },
        other => format!("{other:?}"),
    }
}

impl GuestStore for HttpState {
    fn slicing(&mut self) -> &mut Slicing {
        &mut self.slicing
    }

    fn limits(&mut self) -> &mut GuestLimits {
        &mut self.limits
    }

    fn take_stdio(&mut self) -> Option<Stdio> {
        HttpState::take_stdio(self)
    }
}

/// How long the memory probe may take; it runs one call into a few instructions, so only a
/// component that brought its own export of that name (and spins in it) ever reaches this.
const PROBE_TIME: Duration = Duration::from_millis(5);

/// The address and length of the component's main memory, from its memory probe
/// ([`crate::teardown::probe`]); `None` if the probe cannot run (say, the guest trapped).
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
