//! The host side of guest ABI v1: per-request guest state and the `tern` host functions.
//!
//! One file per interface: [`request`] (what the guest reads), [`response`] (what it
//! writes) and [`outbound`] (the requests it sends); [`fs`] is the read-only `/assets`
//! directory and [`cgi`] the stdin/stdout of CGI programs (the `cgi` guest kind, which shares
//! this state and these functions). Every pointer and length from the guest is bounds-checked against its memory; an
//! out-of-range one traps the guest with [`GuestFault::BadPointer`] and never touches the host.

pub mod cgi;
pub mod fs;
pub mod outbound;
pub mod request;
pub mod response;

use std::ops::Range;

use tern_sdk::abi;
use wasmtime::{Caller, Engine, Linker, Memory, ResourceLimiter};
use wasmtime_wasi::WasiCtxBuilder;
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;

use std::sync::Arc;

pub use request::{GuestRequest, RequestBody};
pub use response::{GuestResponse, Head};

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
    pub outbound: outbound::Outbound,
    /// The CGI output parser, for a guest of the `cgi` kind.
    pub cgi: Option<cgi::Cgi>,
}

impl GuestState {
    /// The WASI context, built on first use: a CGI program's environment also holds the
    /// request's meta-variables.
    fn wasi_ctx(&mut self) -> &mut WasiP1Ctx {
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

/// What a tenant's guests see through WASI, owned by the tenant and shared by its requests.
#[derive(Debug)]
pub struct WasiSpec {
    /// The guest's only argument: the tenant's name.
    pub name: String,
    /// Environment variables its guests see.
    pub env: Vec<(String, String)>,
    /// Bytes of stdout and of stderr captured per request.
    pub stdio_bytes: usize,
}

/// What a guest wrote to stdout and stderr, each capped at its tenant's `stdio_bytes`.
pub struct Stdio {
    /// Captured stdout.
    pub stdout: MemoryOutputPipe,
    /// Captured stderr.
    pub stderr: MemoryOutputPipe,
}

impl Stdio {
    /// Two empty pipes of `capacity` bytes each.
    pub fn new(capacity: usize) -> Self {
        Self {
            stdout: MemoryOutputPipe::new(capacity),
            stderr: MemoryOutputPipe::new(capacity),
        }
    }
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

/// Limits memory and table growth per request; remembers the peak and whether a limit was hit.
#[derive(Debug, Clone)]
pub struct GuestLimits {
    /// Largest linear memory, in bytes.
    pub max_memory: usize,
    /// Largest table, in elements.
    pub max_table_elements: usize,
    /// Set when a growth request was refused: a later trap is then reported as the limit.
    pub memory_limit_hit: bool,
    /// Largest memory size the guest reached, in bytes.
    pub peak_memory: usize,
    /// Core instances (and tables) one guest may create: 1 for a module; for a component,
    /// `pool.component_core_instances`.
    pub instances: usize,
}

impl GuestLimits {
    /// Whether growing to `desired` stays within `max`; a refusal is recorded.
    fn allow(&mut self, desired: usize, max: usize) -> bool {
        self.memory_limit_hit |= desired > max;
        desired <= max
    }
}

impl ResourceLimiter for GuestLimits {
    fn memory_growing(
        &mut self,
        _: usize,
        desired: usize,
        _: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let ok = self.allow(desired, self.max_memory);
        if ok {
            self.peak_memory = self.peak_memory.max(desired);
        }
        Ok(ok)
    }

    fn table_growing(
        &mut self,
        _: usize,
        desired: usize,
        _: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(self.allow(desired, self.max_table_elements))
    }

    fn instances(&self) -> usize {
        self.instances
    }
    fn memories(&self) -> usize {
        1
    }
    fn tables(&self) -> usize {
        self.instances
    }
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
    request::add_to_linker(&mut linker)?;
    response::add_to_linker(&mut linker)?;
    outbound::add_to_linker(&mut linker)?;
    if assets {
        fs::add_to_linker(&mut linker)?;
    }
    if cgi {
        cgi::add_to_linker(&mut linker, assets)?;
    }
    Ok(linker)
}

/// The range `ptr..ptr+len` of guest memory, if it lies inside `mem_len` bytes.
///
/// Wasm passes `i32`s; they are reinterpreted as the unsigned 32-bit values the guest meant.
fn guest_range(ptr: i32, len: i32, mem_len: usize) -> Option<Range<usize>> {
    let start = ptr as u32 as usize;
    let end = start.checked_add(len as u32 as usize)?;
    (end <= mem_len).then_some(start..end)
}

fn memory(caller: &Caller<'_, GuestState>) -> wasmtime::Result<Memory> {
    caller
        .data()
        .memory
        .ok_or_else(|| wasmtime::Error::new(GuestFault::NoMemory))
}

/// Headers as the ABI's copy-out functions give them: `name NUL value NUL` pairs, in order.
fn headers_blob(headers: &http::HeaderMap) -> Vec<u8> {
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
fn copy_to_guest(
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
