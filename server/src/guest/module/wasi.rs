//! WASI preview1 for a core module, built on the guest's first WASI call.

use std::sync::Arc;

use wasmtime_wasi::WasiCtxBuilder;
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;

use crate::guest::{Stdio, WasiSpec};
use crate::variables::Grant;

/// A guest's WASI preview1 context, built on its first WASI call.
///
/// Many handlers make no WASI call at all (the SDK's `hello` makes none), and building a
/// context with its two capture pipes costs about as much as instantiating the guest, so a
/// request pays for it only when its guest uses it.
pub struct Wasi {
    /// Boxed: most guests of the `tern` kind make no WASI call, and every request's state is
    /// moved a few times whole before its store holds it (its 384 bytes inline would be moved
    /// with it).
    ctx: Option<Box<WasiP1Ctx>>,
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
    /// name and the environment its configured one (entries from `variables` read now),
    /// unless `program` gives both (a CGI program's); stdout and stderr captured.
    pub fn ctx(
        &mut self,
        variables: &Grant,
        program: impl FnOnce(&WasiSpec) -> Option<(Vec<String>, Vec<(String, String)>)>,
    ) -> &mut WasiP1Ctx {
        self.ctx.get_or_insert_with(|| {
            let t = &self.spec;
            let stdio = self.stdio.get_or_insert_with(|| Stdio::new(t.stdio_bytes));
            let mut b = WasiCtxBuilder::new();
            b.stdout(stdio.stdout.clone()).stderr(stdio.stderr.clone());
            match program(t) {
                Some((args, vars)) => b.args(&args).envs(&vars),
                None => b.args(&[&t.name]).envs(&t.env.resolve(variables)),
            };
            Box::new(b.build_p1())
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
