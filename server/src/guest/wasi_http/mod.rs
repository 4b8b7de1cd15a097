//! The `wasi-http` guest kind: `wasi:http` components, as `wasmtime serve`, Spin and wasmCloud
//! run them, each request in a fresh pooled instance.
//!
//! This module holds what is particular to components: their store state (WASI preview2, a
//! resource table, the `wasi:http` context) and their linker (here), how a request goes in and
//! the answer comes out ([`body`]: a `wasi:http` incoming-request whose body streams from the
//! client within the tenant's limit; the response's head and body fed into the same
//! [`GuestResponse`](crate::guest::GuestResponse) every kind writes, buffered up to 64 KiB and
//! streamed beyond), their outgoing requests ([`hooks`]: `wasi:http/outgoing-handler` through
//! Tern's outbound path under the tenant's `[tenant.outbound]` policy, denied unless allowed),
//! their driver is [`crate::execute`]'s (WASI 0.2's `incoming-handler`, WASI 0.3's `handler`). Core modules
//! that export the handler are made components before compiling ([`crate::adapter`]).
//! Admission, deadlines, memory limits, teardown and metrics are the shared lifecycle's
//! ([`crate::execute`]).

pub mod body;
pub mod cache;
pub mod hooks;
pub mod kv;
pub mod rate;
pub mod variables;

use std::sync::Arc;

use wasmtime::Engine;
use wasmtime::StoreContextMut;
use wasmtime::component::{
    Component, ComponentExportIndex, InstancePre, Linker, ResourceTable, WasmList,
};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};
use wasmtime_wasi_http::p2::bindings::ProxyIndices;
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

pub use body::{Unanswered, incoming, pump, pump_parts};

use super::{GuestLimits, Stdio, WasiSpec};
use crate::capabilities::Capabilities;

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

/// Spin's cron export (`fermyon:spin-cron@2.0.0`, `server/wit/spin-cron`): a scheduled run of
/// a component that exports it calls it instead of its `wasi:http` handler.
pub const CRON_EXPORT: &str = "handle-cron-event";

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
    /// The request's host capabilities: outbound requests go through its session ([`hooks`]),
    /// key-value operations through its stores ([`kv`]).
    capabilities: Capabilities,
    /// Memory and table limits, and whether the guest ran into them.
    pub limits: GuestLimits,
    /// The main memory's address and length, as the memory probe last reported them
    /// ([`crate::teardown::probe`]).
    pub memory: Option<(usize, usize)>,
    /// When the guest yields its worker (kept by the epoch callback, [`crate::execute`]).
    pub slicing: crate::guest::slice::Slicing,
}

impl WasiView for HttpState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        let (spec, stdio, variables) = (&self.spec, &mut self.stdio, &self.capabilities.variables);
        let ctx = self.wasi.get_or_insert_with(|| {
            let stdio = stdio.get_or_insert_with(|| Stdio::new(spec.stdio_bytes));
            WasiCtxBuilder::new()
                .args(&[&spec.name])
                .envs(&spec.env.resolve(variables))
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
            hooks: &mut self.capabilities.outbound,
        }
    }
}

/// The views the capabilities' host APIs have of a request's store (linked in
/// [`crate::guest::link`]).
impl HttpState {
    /// Key-value stores ([`kv`]).
    pub fn kv(&mut self) -> kv::KvHost<'_> {
        kv::KvHost {
            session: &mut self.capabilities.kv,
            table: &mut self.table,
            max_memory: self.limits.max_memory,
        }
    }

    /// The guest's own cache entries ([`cache`]).
    pub fn cache(&mut self) -> cache::CacheHost<'_> {
        cache::CacheHost {
            session: &mut self.capabilities.cache,
            table: &mut self.table,
        }
    }

    /// The tenant's rate counters and penalty boxes ([`rate`]).
    pub fn rate(&mut self) -> rate::RateHost<'_> {
        rate::RateHost {
            session: &mut self.capabilities.counters,
        }
    }

    /// The tenant's variables ([`variables`]).
    pub fn variables(&mut self) -> variables::VariablesHost<'_> {
        variables::VariablesHost {
            variables: &self.capabilities.variables,
        }
    }
}

impl crate::capabilities::CapabilitiesView for HttpState {
    fn capabilities(&mut self) -> &mut Capabilities {
        &mut self.capabilities
    }
}

impl HttpState {
    /// The state of one request of a tenant whose guests see `spec` (args, env; stdout and
    /// stderr captured), limited by `limits`, with the request's `capabilities`.
    pub fn new(spec: Arc<WasiSpec>, mut limits: GuestLimits, capabilities: Capabilities) -> Self {
        limits.instances = STORE_INSTANCES;
        Self {
            table: ResourceTable::new(),
            wasi: None,
            spec,
            stdio: None,
            http: WasiHttpCtx::new(),
            capabilities,
            limits,
            memory: None,
            slicing: crate::guest::slice::Slicing::default(),
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
        self.capabilities.outbound.run_failed();
    }
}

/// The linker components are pre-linked against: WASI preview2 (no files, sockets or network
/// names: the context grants none) and `wasi:http`; with `wasi_p3` also WASI 0.3 and its
/// `wasi:http`. The key-value interfaces ([`kv`]) are linked by [`crate::guest::link`], with
/// the other capabilities.
///
/// # Errors
/// Only if wasmtime rejects a definition (a bug).
pub fn linker(engine: &Engine, wasi_p3: bool) -> wasmtime::Result<Linker<HttpState>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
    wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)?;
    // The memory probe's import: the list is the whole main memory, lifted in place.
    linker.root().func_wrap(
        crate::teardown::probe::IMPORT,
        |mut store: StoreContextMut<'_, HttpState>, (memory,): (WasmList<u8>,)| {
            let bytes = memory.as_le_slice(&store);
            let span = (bytes.as_ptr() as usize, bytes.len());
            store.data_mut().memory = Some(span);
            Ok(())
        },
    )?;
    if wasi_p3 {
        wasmtime_wasi::p3::add_to_linker(&mut linker)?;
        wasmtime_wasi_http::p3::add_to_linker(&mut linker)?;
    }
    Ok(linker)
}

/// A `wasi:http/proxy` component (WASI 0.2), pre-linked.
pub struct Proxy {
    /// The component, its imports resolved.
    pub pre: InstancePre<HttpState>,
    /// Where its `incoming-handler` is; `None` for a component that exports only Spin's
    /// `handle-cron-event` (it runs on its schedules and serves no request).
    pub handler: Option<ProxyIndices>,
    /// Where its `handle-cron-event` is, if it exports it ([`CRON_EXPORT`]).
    pub cron: Option<ComponentExportIndex>,
    /// Its memory probe, if it has one ([`crate::teardown::probe`]).
    pub probe: Option<ComponentExportIndex>,
}

/// A component pre-linked for the `wasi:http` it is served through.
pub enum Handler {
    /// A `wasi:http/proxy` component (WASI 0.2).
    P2(Proxy),
    /// A `wasi:http/service` component (WASI 0.3, component-model async).
    P3(PreP3),
}

impl Handler {
    /// Checks that `component` exports a `wasi:http` handler and pre-links it with `linker`.
    ///
    /// # Errors
    /// What it lacks or imports that Tern does not provide, in words for its author.
    pub fn link(linker: &Linker<HttpState>, component: &Component) -> Result<Self, String> {
        let version = check_exports(component, component.engine())?;
        let pre = linker
            .instantiate_pre(component)
            .map_err(|e| link_message(&e))?;
        match version {
            Version::P2 => {
                let cron = (spin_cron(component, component.engine()) == Some(true))
                    .then(|| component.get_export_index(None, CRON_EXPORT))
                    .flatten();
                let handler = match ProxyIndices::new(&pre) {
                    Ok(handler) => Some(handler),
                    // (`check_exports` let it through for its cron export.)
                    Err(_) if cron.is_some() => None,
                    Err(e) => return Err(link_message(&e)),
                };
                Ok(Self::P2(Proxy {
                    probe: component.get_export_index(None, crate::teardown::probe::EXPORT),
                    pre,
                    handler,
                    cron,
                }))
            }
            Version::P3 => PreP3::new(pre).map(Self::P3).map_err(|e| link_message(&e)),
        }
    }

    /// The engine it is compiled for.
    pub fn engine(&self) -> &Engine {
        match self {
            Self::P2(p) => p.pre.component().engine(),
            Self::P3(p) => p.instance_pre().component().engine(),
        }
    }
}

/// Whether `component` exports Spin's cron function (`None`: it exports no
/// `handle-cron-event`) of Spin's shape: `func(metadata: record { timestamp: u64 }) ->
/// result<...>`.
fn spin_cron(component: &Component, engine: &Engine) -> Option<bool> {
    use wasmtime::component::types::{ComponentItem, Type};
    let ty = component.component_type();
    let (_, item) = ty.exports(engine).find(|(name, _)| *name == CRON_EXPORT)?;
    let ComponentItem::ComponentFunc(f) = &item.ty else {
        return Some(false);
    };
    let mut params = f.params();
    let metadata = match (params.next(), params.next()) {
        (Some((_, Type::Record(r))), None) => {
            let mut fields = r.fields();
            matches!(
                (fields.next(), fields.next()),
                (Some(field), None) if field.name == "timestamp" && matches!(field.ty, Type::U64)
            )
        }
        _ => false,
    };
    let mut results = f.results();
    let result = matches!(
        (results.next(), results.next()),
        (Some(Type::Result(_)), None)
    );
    Some(metadata && result)
}

/// Which `wasi:http` a component is served through, or why it is not a `wasi-http` guest: it
/// must export `wasi:http/incoming-handler@0.2.x` (or, WASI 0.3, `wasi:http/handler@0.3.x`),
/// or Spin's `handle-cron-event` of Spin's shape (then it runs on its schedules only, through
/// WASI 0.2). (A component with a `wasi:http` handler and a `handle-cron-event` of another
/// shape is served by its handler only. A WASI 0.3 component's cron export is not called.)
pub fn check_exports(component: &Component, engine: &Engine) -> Result<Version, String> {
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
    match spin_cron(component, engine) {
        Some(true) => return Ok(Version::P2),
        Some(false) => {
            return Err(format!(
                "this component exports `{CRON_EXPORT}`, but not as Spin's cron trigger \
                 defines it (`func(metadata: metadata) -> result<_, error>`, metadata a record \
                 of `timestamp: u64`, fermyon:spin-cron@2.0.0), and no wasi:http handler"
            ));
        }
        None => {}
    }
    let hint = if exports.iter().any(|e| e.starts_with("wasi:cli/run@")) {
        "; it is a command component (a program with `main`, built for wasm32-wasip2): build it \
         for wasm32-wasip1 to serve it as a CGI program, or make it a wasi:http proxy component"
    } else {
        ""
    };
    Err(format!(
        "this component does not export `wasi:http/incoming-handler` (it exports: {}); Tern \
         serves wasi:http proxy components (`wasmtime serve`, Spin), and Spin cron components \
         (`{CRON_EXPORT}`) on their schedules{hint}",
        if exports.is_empty() {
            "nothing".to_string()
        } else {
            exports.join(", ")
        }
    ))
}

/// A component's link error in words: an import Tern does not provide is either a WASI
/// version newer than this server's or another platform's host API.
fn link_message(e: &wasmtime::Error) -> String {
    let text = format!("{e:#}");
    if !text.contains("matching implementation was not found in the linker") {
        return text;
    }
    if text.contains("`wasi:") {
        format!(
            "{text}; Tern provides WASI 0.2 as wasmtime 48 does (0.2.6; imports of other 0.2.x \
             versions match when what they call exists in 0.2.6): build the component against \
             WASI 0.2 without newer functions (for Rust, the `wasip2` crate's bindings), or \
             against 0.2.6 or older"
        )
    } else {
        format!(
            "{text}; Tern provides WASI 0.2, wasi:http, Spin's key-value and variables, \
             wasi:keyvalue and wasi:config, not other platforms' host APIs (e.g. Spin's SQLite \
             or Redis)"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A component that exports only Spin's `handle-cron-event` (its core function returns a
    /// pointer to zeroes: `Ok`), as `shape` gives its function type.
    fn cron_only(shape: &str) -> Vec<u8> {
        wat::parse_str(format!(
            r#"(component
                (core module $m
                    (memory (export "memory") 1)
                    (func (export "cron") (param i64) (result i32) (i32.const 0)))
                (core instance $i (instantiate $m))
                (type $metadata' (record (field "timestamp" u64)))
                (export $metadata "metadata" (type $metadata'))
                (type $error' (variant (case "other" string)))
                (export $error "error" (type $error'))
                (func $cron {shape}
                    (canon lift (core func $i "cron") (memory (core memory $i "memory"))))
                (export "handle-cron-event" (func $cron)))"#
        ))
        .unwrap()
    }

    #[test]
    fn a_spin_cron_component_is_served_through_wasi_0_2_and_a_wrong_export_is_named() {
        let engine = Engine::default();
        let good = cron_only(r#"(param "metadata" $metadata) (result (result (error $error)))"#);
        let component = Component::new(&engine, good).unwrap();
        assert_eq!(check_exports(&component, &engine), Ok(Version::P2));
        let bad = wat::parse_str(
            r#"(component
                (core module $m (func (export "f")))
                (core instance $i (instantiate $m))
                (func $f (canon lift (core func $i "f")))
                (export "handle-cron-event" (func $f)))"#,
        )
        .unwrap();
        let component = Component::new(&engine, bad).unwrap();
        let e = check_exports(&component, &engine).unwrap_err();
        assert!(e.contains("not as Spin's cron trigger defines it"), "{e}");
        // One parameter and one result, of other types: refused too.
        let bad = cron_only(r#"(param "metadata" u64) (result (result (error $error)))"#);
        let component = Component::new(&engine, bad).unwrap();
        let e = check_exports(&component, &engine).unwrap_err();
        assert!(e.contains("not as Spin's cron trigger defines it"), "{e}");
    }
}
