//! Core modules, the `tern` and `cgi` kinds: their store state and their linker.
//!
//! A core module's store holds WASI preview1 (built on the guest's first WASI call), the
//! read-only `/assets` directory ([`fs`]), the request and response, and the host side of its
//! kind: the `tern` ABI's outbound calls, CGI's output parser. Its linker is WASI preview1 with
//! the `tern` ABI ([`super::tern`]), `/assets` in place of WASI's files, and for CGI stdin and
//! stdout as the request body and response ([`super::cgi`]). Its driver, which instantiates
//! the module and calls `_start` on its own fiber, is [`crate::execute`]'s. Every pointer and length from the guest is
//! bounds-checked against its memory; an out-of-range one traps the guest with
//! [`GuestFault::BadPointer`] and never touches the host.

pub mod fs;

use std::ops::Range;
use std::sync::Arc;

use tern_sdk::abi;
use wasmtime::{Caller, Engine, ExternType, InstancePre, Linker, Memory, Module, ModuleExport};
use wasmtime_wasi::WasiCtxBuilder;
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;

use super::cgi::{self, Cgi};
use super::tern::kv::Kv;
use super::tern::outbound::Outbound;
use super::{GuestLimits, GuestRequest, GuestResponse, Stdio, WasiSpec};

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
    /// The guest's outbound requests.
    pub outbound: Outbound,
    /// The guest's key-value stores.
    pub kv: Kv,
    /// The CGI output parser, for a guest of the `cgi` kind.
    pub cgi: Option<Cgi>,
    /// The request's headers as `tern::request_headers` gives them, made on its first call.
    pub headers_blob: Option<Vec<u8>>,
    /// When the guest yields its worker (kept by the epoch callback, [`crate::execute`]).
    pub slicing: crate::guest::slice::Slicing,
}

impl GuestState {
    /// The WASI context, built on first use: a CGI program's environment also holds the
    /// request's meta-variables.
    pub(in crate::guest) fn wasi_ctx(&mut self) -> &mut WasiP1Ctx {
        let (request, cgi) = (&self.request, self.cgi.is_some());
        self.wasi
            .ctx(|spec| cgi.then(|| (cgi::args(request), cgi::env(request, spec))))
    }
}

/// A guest's WASI preview1 context, built on its first WASI call.
///
/// Many handlers make no WASI call at all (the SDK's `hello` makes none), and building a
/// context with its two capture pipes costs about as much as instantiating the guest, so a
/// request pays for it only when its guest uses it.
pub struct Wasi {
    ctx: Option<WasiP1Ctx>,
    spec: Arc<WasiSpec>,
    stdio: Option<Stdio>,
}

impl Wasi {
    /// A context for a guest of a tenant with `spec`, not built yet.
    pub fn new(spec: Arc<WasiSpec>) -> Self {
        Self {
            ctx: None,
            spec,
            stdio: None,
        }
    }

    /// The context, built now if this is the guest's first WASI call: args are the tenant
    /// name and the environment its configured variables, unless `program` gives both (a CGI
    /// program's); stdout and stderr captured.
    pub fn ctx(
        &mut self,
        program: impl FnOnce(&WasiSpec) -> Option<(Vec<String>, Vec<(String, String)>)>,
    ) -> &mut WasiP1Ctx {
        self.ctx.get_or_insert_with(|| {
            let t = &self.spec;
            let stdio = self.stdio.get_or_insert_with(|| Stdio::new(t.stdio_bytes));
            let mut b = WasiCtxBuilder::new();
            b.stdout(stdio.stdout.clone()).stderr(stdio.stderr.clone());
            match program(t) {
                Some((args, vars)) => b.args(&args).envs(&vars),
                None => b.args(&[&t.name]).envs(&t.env),
            };
            b.build_p1()
        })
    }

    /// The captured stderr (made now if the guest has made no WASI call yet).
    pub fn stderr(&mut self) -> &MemoryOutputPipe {
        let n = self.spec.stdio_bytes;
        &self.stdio.get_or_insert_with(|| Stdio::new(n)).stderr
    }

    /// The tenant's name.
    pub fn tenant(&self) -> &str {
        &self.spec.name
    }

    /// The captured output, if the guest made any WASI call.
    pub fn take_stdio(&mut self) -> Option<Stdio> {
        self.stdio.take()
    }
}

/// A guest fault caused by a host call, which traps the guest.
#[derive(Debug, thiserror::Error)]
pub enum GuestFault {
    /// A pointer/length pair outside the guest's memory.
    #[error("guest passed a pointer/length outside its memory to `{0}`")]
    BadPointer(&'static str),
    /// The module has no memory export (refused at load, so only a broken module gets here).
    #[error("guest has no exported memory")]
    NoMemory,
}

/// Builds the linker core modules are pre-linked against: WASI preview1 plus the `tern` ABI,
/// with `assets` the in-memory `/assets` directory in place of WASI's file functions, and with
/// `cgi` stdin and stdout as a CGI program's request body and response.
///
/// # Errors
/// Only if wasmtime rejects a definition (a bug).
pub fn linker(engine: &Engine, assets: bool, cgi: bool) -> wasmtime::Result<Linker<GuestState>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p1::add_to_linker_async(&mut linker, GuestState::wasi_ctx)?;
    super::tern::add_to_linker(&mut linker)?;
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

/// The range `ptr..ptr+len` of guest memory, if it lies inside `mem_len` bytes.
///
/// Wasm passes `i32`s; they are reinterpreted as the unsigned 32-bit values the guest meant.
pub(in crate::guest) fn guest_range(ptr: i32, len: i32, mem_len: usize) -> Option<Range<usize>> {
    let start = ptr as u32 as usize;
    let end = start.checked_add(len as u32 as usize)?;
    (end <= mem_len).then_some(start..end)
}

pub(in crate::guest) fn memory(caller: &Caller<'_, GuestState>) -> wasmtime::Result<Memory> {
    caller
        .data()
        .memory
        .ok_or_else(|| wasmtime::Error::new(GuestFault::NoMemory))
}

/// Copies the guest's bytes at `ptr..ptr+len`, or traps naming `func`.
pub(in crate::guest) fn read_guest(
    caller: &Caller<'_, GuestState>,
    ptr: i32,
    len: i32,
    func: &'static str,
) -> wasmtime::Result<Vec<u8>> {
    let data = memory(caller)?.data(caller);
    let range = guest_range(ptr, len, data.len()).ok_or(GuestFault::BadPointer(func))?;
    Ok(data[range].to_vec())
}

/// Headers as the ABI's copy-out functions give them: `name NUL value NUL` pairs, in order.
pub(in crate::guest) fn headers_blob(headers: &http::HeaderMap) -> Vec<u8> {
    let mut blob = Vec::with_capacity(headers.len() * 32);
    for (name, value) in headers {
        blob.extend_from_slice(name.as_str().as_bytes());
        blob.push(0);
        blob.extend_from_slice(value.as_bytes());
        blob.push(0);
    }
    blob
}

/// Copies as much of `src` as fits into the guest buffer `ptr..ptr+len` and returns the full
/// length of `src`, so the guest can retry with a larger buffer.
pub(in crate::guest) fn copy_to_guest(
    data: &mut [u8],
    ptr: i32,
    len: i32,
    src: &[u8],
    func: &'static str,
) -> wasmtime::Result<i32> {
    let range = guest_range(ptr, len, data.len())
        .ok_or_else(|| wasmtime::Error::new(GuestFault::BadPointer(func)))?;
    let n = range.len().min(src.len());
    data[range.start..range.start + n].copy_from_slice(&src[..n]);
    Ok(i32::try_from(src.len()).unwrap_or(abi::errno::LIMIT_EXCEEDED))
}

#[cfg(test)]
mod tests {
    use super::guest_range;

    #[test]
    fn guest_ranges_are_bounds_checked() {
        assert_eq!(guest_range(0, 4, 4), Some(0..4));
        assert_eq!(guest_range(4, 0, 4), Some(4..4));
        assert_eq!(guest_range(1, 4, 4), None);
        assert_eq!(guest_range(-1, 1, 1 << 16), None);
        assert_eq!(guest_range(1, -1, 1 << 16), None);
        assert_eq!(
            guest_range(i32::MAX, i32::MAX, usize::MAX),
            Some(0x7fff_ffff..0xffff_fffe)
        );
    }
}
