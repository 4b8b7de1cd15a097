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

/// What a guest wrote, taken from its pipes once its store is gone: each stream's bytes and
/// whether it reached the cap (the guest wrote more than was kept, or exactly the cap).
#[derive(Debug, Clone, Default)]
pub struct Output {
    /// Its stdout.
    pub stdout: bytes::Bytes,
    /// Its stderr.
    pub stderr: bytes::Bytes,
    /// stdout reached `stdio_bytes`.
    pub stdout_truncated: bool,
    /// stderr reached `stdio_bytes`.
    pub stderr_truncated: bool,
}

impl Stdio {
    /// The bytes written, capped at `limit` each.
    pub fn output(&self, limit: usize) -> Output {
        let (stdout, stderr) = (self.stdout.contents(), self.stderr.contents());
        Output {
            stdout_truncated: stdout.len() >= limit && limit > 0,
            stderr_truncated: stderr.len() >= limit && limit > 0,
            stdout,
            stderr,
        }
    }
}
