//! What a guest kind's driver gives the shared lifecycle ([`Driver`]), what its store state
//! keeps for it ([`GuestStore`]), and how a run's end reads ([`Stage`], [`classify`]).

use std::time::{Duration, Instant};

use wasmtime::{Store, Trap};
use wasmtime_wasi::I32Exit;

use crate::capabilities::CapabilitiesView;
use crate::guest::module::GuestFault;
use crate::guest::slice::Slicing;
use crate::guest::{GuestLimits, GuestResponse, Stdio};
use crate::outcome::{ExecError, Outcome, response_limit};
use crate::teardown::MemorySweep;
use crate::tenant::Tenant;

/// When a run's handler was called.
#[derive(Default)]
pub(super) struct Clock {
    /// Time spent reading the client's body whole before instantiating (the client's time).
    pub(super) body_read: Duration,
    /// When the handler was called (instantiation done).
    pub(super) called: Option<Instant>,
}

/// What differs between the guest kinds; the rest of a run is [`lifecycle`]'s.
pub(super) trait Driver {
    /// The state of the guest's store.
    type State: GuestStore;
    /// The engine the guest was compiled for.
    fn engine(&self) -> &wasmtime::Engine;
    /// Instantiates the guest in `store` and calls its handler, noting the times in `clock`.
    async fn call(
        &mut self,
        store: &mut Store<Self::State>,
        clock: &mut Clock,
    ) -> Result<(), Stage>;
    /// What a run that ended with `ended` means for the client: [`classify`]'s reading, and
    /// the kind's own.
    fn settle(
        &mut self,
        state: &mut Self::State,
        ended: Result<(), Stage>,
    ) -> Result<(), ExecError>;
    /// The response the guest wrote.
    fn response<'a>(&'a mut self, state: &'a mut Self::State) -> &'a mut GuestResponse;
    /// How the client's request body ended.
    fn body_end(&self, state: &Self::State) -> BodyEnd;
    /// The guest memory to sweep before teardown, when the tenant's sweep is due.
    async fn sweep<'t>(
        &mut self,
        tenant: &'t Tenant,
        store: &mut Store<Self::State>,
    ) -> Option<(&'t MemorySweep, (usize, usize))>;
}

/// What the shared lifecycle reads and keeps in every kind's store state.
pub(crate) trait GuestStore: CapabilitiesView + Send + 'static {
    /// The guest's time slicing ([`crate::guest::slice`]), kept by the epoch callback.
    fn slicing(&mut self) -> &mut Slicing;
    /// Memory and table limits, and whether the guest ran into them.
    fn limits(&mut self) -> &mut GuestLimits;
    /// What the guest wrote to stdout and stderr, if it had a WASI context.
    fn take_stdio(&mut self) -> Option<Stdio>;
}

/// The limits of one guest of a tenant with `limits` (one core instance; a component's state
/// raises it).
pub(super) fn guest_limits(limits: &crate::tenant::Limits) -> GuestLimits {
    GuestLimits {
        max_memory: limits.max_memory,
        max_table_elements: limits.max_table_elements,
        memory_limit_hit: false,
        peak_memory: 0,
        instances: 1,
    }
}

/// How the client's request body ended, as far as the server's own limits go.
pub(super) struct BodyEnd {
    /// The body went past the tenant's limit of this many bytes.
    pub too_large: Option<u64>,
    /// The body could not be read.
    pub failed: Option<String>,
}

/// Where a guest error came from.
pub(super) enum Stage {
    Instantiate(wasmtime::Error),
    Run(wasmtime::Error),
    /// The guest's answer could not be taken (the kind's driver says why).
    Answer(ExecError),
}

impl Stage {
    /// The status the guest exited with (`proc_exit`), if that is how it ended.
    pub(super) fn exit_status(&self) -> Option<i32> {
        match self {
            Self::Instantiate(e) | Self::Run(e) => e.downcast_ref::<I32Exit>().map(|e| e.0),
            Self::Answer(_) => None,
        }
    }
}

/// What a failed run means for the client, from the error and what the guest ran into.
pub(super) fn classify(
    stage: Stage,
    limits: &GuestLimits,
    response: &GuestResponse,
) -> Result<(), ExecError> {
    let (err, instantiating) = match stage {
        Stage::Instantiate(e) => (e, true),
        Stage::Run(e) => (e, false),
        Stage::Answer(e) => return Err(e),
    };
    if let Some(exit) = err.downcast_ref::<I32Exit>() {
        return match exit.0 {
            0 => Ok(()),
            _ if response.limit_hit => Err(response_limit()),
            n => Err(ExecError::new(
                Outcome::Exit,
                format!("guest exited with status {n}"),
            )),
        };
    }
    if limits.memory_limit_hit {
        return Err(ExecError::new(
            Outcome::MemoryLimit,
            format!(
                "guest exceeded its memory limit ({} MiB)",
                limits.max_memory / (1024 * 1024)
            ),
        ));
    }
    if response.limit_hit {
        return Err(response_limit());
    }
    if let Some(fault) = err.downcast_ref::<GuestFault>() {
        return Err(ExecError::new(
            Outcome::BadPointer,
            format!("guest fault: {fault}"),
        ));
    }
    if let Some(trap) = err.downcast_ref::<Trap>() {
        let outcome = match trap {
            Trap::StackOverflow => Outcome::TrapStackOverflow,
            Trap::MemoryOutOfBounds | Trap::HeapMisaligned => Outcome::TrapOutOfBounds,
            Trap::UnreachableCodeReached => Outcome::TrapUnreachable,
            Trap::IntegerDivisionByZero | Trap::IntegerOverflow | Trap::BadConversionToInteger => {
                Outcome::TrapArithmetic
            }
            // A function pointer naming no function: a null entry, one of another signature,
            // or an index past the table (which wasmtime reports as `table.get` past it is
            // reported; in code compiled from C, Rust or Go only function pointers use tables).
            Trap::IndirectCallToNull | Trap::BadSignature | Trap::TableOutOfBounds => {
                Outcome::TrapBadIndirectCall
            }
            _ => Outcome::TrapOther,
        };
        let text = trap.to_string();
        let text = text.strip_prefix("wasm trap: ").unwrap_or(&text);
        let mut e = ExecError::new(outcome, format!("guest trapped: {text}"));
        e.backtrace = err
            .downcast_ref::<wasmtime::WasmBacktrace>()
            .map(backtrace_text);
        return Err(e);
    }
    let what = if instantiating {
        "could not instantiate guest"
    } else {
        "guest failed"
    };
    // Not the guest's doing: the operator needs the cause (the client gets only `what`), and
    // when the host ran out of mappings or files, which limit and how to raise it.
    match crate::os::Exhausted::in_chain(err.chain()) {
        Some(limit) => tracing::warn!("{what}: {err:#}; {}", limit.advice()),
        None => tracing::warn!("{what}: {err:#}"),
    }
    Err(ExecError::new(Outcome::Error, what))
}

/// A Wasm backtrace as wasmtime writes it (names demangled), one frame a line: without its
/// heading and the hint about `WASMTIME_BACKTRACE_DETAILS` that may follow the frames.
fn backtrace_text(trace: &wasmtime::WasmBacktrace) -> Box<str> {
    let text = trace.to_string();
    let frames: Vec<&str> = text
        .lines()
        .skip(1)
        .take_while(|l| !l.trim().is_empty() && !l.starts_with("note:"))
        .map(str::trim)
        .collect();
    frames.join("\n").into_boxed_str()
}
