//! Core modules, the `tern` and `cgi` kinds: their store state and their linker, composed
//! here from the parts of this folder.
//!
//! A core module's store holds WASI preview1 ([`wasi`], built on the guest's first WASI
//! call), the read-only `/assets` directory ([`fs`]), the request and response, and the host
//! side of its kind: the `tern` ABI's outbound calls and key-value stores ([`tern`]), CGI's
//! output parser ([`cgi`]). Its linker is WASI preview1 with the `tern` ABI, `/assets` in place
//! of WASI's files, and for CGI stdin and stdout as the request body and response. Host calls
//! reach the guest's memory only through [`memory`]'s bounds checks. Its driver, which
//! instantiates the module and calls `_start` on its own fiber, is [`crate::execute`]'s.

pub mod cgi;
pub mod fs;
pub mod memory;
pub mod tern;
pub mod wasi;

use tern_sdk::abi;
use wasmtime::{Engine, ExternType, InstancePre, Linker, Memory, Module, ModuleExport};
use wasmtime_wasi::p1::WasiP1Ctx;

use cgi::Cgi;
pub use memory::{GuestFault, GuestMemory};
pub use wasi::Wasi;

use super::{GuestLimits, GuestRequest, GuestResponse};

/// Everything one request's store holds. Dropped with the store at teardown.
pub struct GuestState {
    /// WASI preview1: args, this tenant's env, captured stdout/stderr; no files, no sockets.
    pub wasi: Wasi,
    /// The guest's exported memory, set right after instantiation.
    pub memory: Option<Memory>,
    /// The request the guest reads.
    pub request: GuestRequest,
    /// The response the guest writes.
    pub response: GuestResponse,
    /// Memory and table limits, and whether the guest ran into them.
    pub limits: GuestLimits,
    /// The tenant's `/assets` and the files this request opened (tenants with assets only).
    pub files: fs::Files,
    /// The request's host capabilities (outbound, key-value), every kind's.
    pub capabilities: crate::capabilities::Capabilities,
    /// The handles the request holds through the `tern` ABI (outbound requests, open
    /// key-value stores, cache entries).
    pub tables: tern::Tables,
    /// The CGI output parser, for a guest of the `cgi` kind.
    pub cgi: Option<Cgi>,
    /// The request's headers as `tern::request_headers` gives them, made on its first call.
    pub headers_blob: Option<Vec<u8>>,
    /// When the guest yields its worker (kept by the epoch callback, [`crate::execute`]).
    pub slicing: crate::guest::slice::Slicing,
}

impl crate::capabilities::CapabilitiesView for GuestState {
    fn capabilities(&mut self) -> &mut crate::capabilities::Capabilities {
        &mut self.capabilities
    }
}

// The views the host functions have of the state (each interface's, in its own file).

impl GuestMemory for GuestState {
    fn memory(&self) -> Option<Memory> {
        self.memory
    }
}

impl tern::RequestView for GuestState {
    fn request(&mut self) -> &mut GuestRequest {
        &mut self.request
    }

    fn request_headers(&mut self) -> (&GuestRequest, &mut Option<Vec<u8>>) {
        (&self.request, &mut self.headers_blob)
    }

    fn request_info(&self) -> (&GuestRequest, &str) {
        (&self.request, self.wasi.tenant())
    }
}

impl tern::ResponseView for GuestState {
    fn response(&mut self) -> &mut GuestResponse {
        &mut self.response
    }
}

impl tern::OutboundView for GuestState {
    fn outbound(
        &mut self,
    ) -> (
        tern::OutboundCalls<'_>,
        &mut GuestRequest,
        &mut GuestResponse,
    ) {
        let calls = self.tables.outbound.with(&mut self.capabilities.outbound);
        (calls, &mut self.request, &mut self.response)
    }

    fn outbound_handles(&self) -> &tern::Outbound {
        &self.tables.outbound
    }
}

impl tern::KvView for GuestState {
    fn kv(&mut self) -> (&mut tern::Kv, &mut crate::kv::Session) {
        (&mut self.tables.kv, &mut self.capabilities.kv)
    }

    fn kv_handles(&self) -> &tern::Kv {
        &self.tables.kv
    }
}

impl tern::CacheView for GuestState {
    fn cache(&mut self) -> (&mut tern::CacheEntries, &mut crate::cache::guest::Session) {
        (&mut self.tables.cache, &mut self.capabilities.cache)
    }

    fn cache_entries(&self) -> &tern::CacheEntries {
        &self.tables.cache
    }
}

impl tern::RateView for GuestState {
    fn rate(&mut self) -> (&mut crate::ratelimit::counters::Session, &mut String) {
        (&mut self.capabilities.counters, &mut self.tables.rate_error)
    }

    fn rate_last_error(&self) -> &str {
        &self.tables.rate_error
    }
}

impl tern::WebsocketView for GuestState {
    fn channels(&mut self) -> (&mut crate::websocket::channels::Session, &mut String) {
        (
            &mut self.capabilities.channels,
            &mut self.tables.websocket_error,
        )
    }

    fn websocket_last_error(&self) -> &str {
        &self.tables.websocket_error
    }
}

impl tern::ConfigView for GuestState {
    fn variables(&self) -> &crate::variables::Grant {
        &self.capabilities.variables
    }
}

impl fs::FilesView for GuestState {
    fn files(&mut self) -> &mut fs::Files {
        &mut self.files
    }
}

impl cgi::CgiView for GuestState {
    fn cgi(&mut self) -> (Option<&mut Cgi>, &mut GuestResponse) {
        (self.cgi.as_mut(), &mut self.response)
    }

    fn stdin(&mut self) -> &mut GuestRequest {
        &mut self.request
    }

    fn stderr(&mut self) -> &wasmtime_wasi::p2::pipe::MemoryOutputPipe {
        self.wasi.stderr()
    }
}

impl GuestState {
    /// The WASI context, built on first use: a CGI program's environment also holds the
    /// request's meta-variables.
    fn wasi_ctx(&mut self) -> &mut WasiP1Ctx {
        let (request, cgi) = (&self.request, self.cgi.is_some());
        let variables = &self.capabilities.variables;
        self.wasi.ctx(variables, |spec| {
            cgi.then(|| {
                // A tenant whose secrets cannot be opened here gives its program none of them.
                let values = variables.values();
                let env = spec.env.with(&values);
                let values = values.all().unwrap_or_default();
                (cgi::args(request), cgi::env(request, &values, &env))
            })
        })
    }
}

/// Whether `module` imports from the `tern` ABI (a module that does not is a CGI program
/// unless its deployer says otherwise).
pub fn imports_tern_abi(module: &Module) -> bool {
    module.imports().any(|i| i.module() == abi::IMPORT_MODULE)
}

/// A warning for a module deployed as kind `tern` that imports nothing from `tern`: a plain
/// WASI program, which can neither read the request nor write a response through the ABI.
pub fn tern_kind_warning(module: &Module) -> Option<String> {
    if imports_tern_abi(module) {
        return None;
    }
    Some(
        "this module imports nothing from `tern` but is deployed as kind `tern`: it cannot \
         read the request, its stdout goes to the server log, and every client gets an empty \
         200. Deploy it as kind `cgi` (the default for such modules) to answer on stdout"
            .into(),
    )
}

/// Builds the linker core modules are pre-linked against: WASI preview1 plus the `tern` ABI's
/// request and response (its capabilities are linked by [`crate::guest::link`]), with `assets` the in-memory `/assets` directory in place of WASI's file functions, and with
/// `cgi` stdin and stdout as a CGI program's request body and response.
///
/// # Errors
/// Only if wasmtime rejects a definition (a bug).
pub fn linker(engine: &Engine, assets: bool, cgi: bool) -> wasmtime::Result<Linker<GuestState>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p1::add_to_linker_async(&mut linker, GuestState::wasi_ctx)?;
    tern::add_to_linker(&mut linker)?;
    if assets {
        fs::add_to_linker(&mut linker)?;
    }
    if cgi {
        cgi::add_to_linker(&mut linker, assets)?;
    }
    Ok(linker)
}

/// A pre-linked core module and the exports every request needs.
pub struct CoreGuest {
    /// The module, pre-linked.
    pub pre: InstancePre<GuestState>,
    /// The handler export (`_start`), resolved once.
    pub start: ModuleExport,
    /// The memory export, resolved once.
    pub memory: ModuleExport,
}

/// Checks `module` against what every core module needs ([`check_abi`]) and pre-links it.
///
/// # Errors
/// What the module lacks or imports wrongly, in words for its author.
pub fn link(linker: &Linker<GuestState>, module: &Module) -> Result<CoreGuest, String> {
    check_abi(module)?;
    let pre = linker
        .instantiate_pre(module)
        .map_err(|e| format!("{e:#}"))?;
    Ok(CoreGuest {
        pre,
        start: module
            .get_export_index(abi::HANDLER_EXPORT)
            .expect("checked by check_abi"),
        memory: module
            .get_export_index(abi::MEMORY_EXPORT)
            .expect("checked by check_abi"),
    })
}

/// ABI v1: a `_start: [] -> []` export, a memory export, and imports only from `tern` (ABI
/// functions, with their ABI signatures) and `wasi_snapshot_preview1`.
///
/// # Errors
/// What the module lacks or imports wrongly, in words for the module's author.
pub fn check_abi(module: &Module) -> Result<(), String> {
    match module.get_export(abi::HANDLER_EXPORT) {
        Some(ExternType::Func(f)) if f.params().len() == 0 && f.results().len() == 0 => {}
        Some(_) => {
            return Err(format!(
                "export `{}` must be a function () -> ()",
                abi::HANDLER_EXPORT
            ));
        }
        None => {
            return Err(format!(
                "module has no `{}` export (the handler); build it as a WASI command \
                 (a program with `main`)",
                abi::HANDLER_EXPORT
            ));
        }
    }
    if !matches!(
        module.get_export(abi::MEMORY_EXPORT),
        Some(ExternType::Memory(_))
    ) {
        return Err(format!(
            "module does not export its memory as `{}`",
            abi::MEMORY_EXPORT
        ));
    }
    for import in module.imports() {
        let (m, n) = (import.module(), import.name());
        let known = match m {
            abi::IMPORT_MODULE => abi::func::ALL.contains(&n),
            "wasi_snapshot_preview1" => true, // checked against the linker by instantiate_pre
            _ => false,
        };
        if !known {
            return Err(format!(
                "module imports `{m}::{n}`, which Tern does not provide (it provides the `tern` \
                 ABI v1 functions and `wasi_snapshot_preview1`)"
            ));
        }
        if m == abi::IMPORT_MODULE
            && let Some(&(_, params)) = abi::func::SIGNATURES.iter().find(|(f, _)| *f == n)
            && let ExternType::Func(f) = import.ty()
        {
            let i32s = |n: usize| vec!["i32"; n].join(", ");
            let yours = |types: &mut dyn Iterator<Item = wasmtime::ValType>| {
                types.map(|t| t.to_string()).collect::<Vec<_>>().join(", ")
            };
            let matches = f.params().len() == params
                && f.params().all(|t| t.is_i32())
                && f.results().len() == 1
                && f.results().all(|t| t.is_i32());
            if !matches {
                return Err(format!(
                    "module imports `{m}::{n}` as ({}) -> ({}), but Tern's `{n}` is ({}) -> (i32) \
                     (guest-sdk/ABI.md)",
                    yours(&mut f.params()),
                    yours(&mut f.results()),
                    i32s(params),
                ));
            }
        }
    }
    Ok(())
}
