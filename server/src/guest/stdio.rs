//! What every guest kind's WASI sees of its tenant (args, env) and what it writes (stdout and
//! stderr, captured up to the tenant's cap).

use wasmtime_wasi::p2::pipe::MemoryOutputPipe;

/// What a tenant's guests see through WASI, owned by the tenant and shared by its requests.
#[derive(Debug)]
pub struct WasiSpec {
    /// The guest's only argument: the tenant's name.
    pub name: String,
    /// Environment variables its guests see (some read from its variables at each start).
    pub env: crate::variables::Env,
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
