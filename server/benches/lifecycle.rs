//! The instance lifecycle, phase by phase, as Fastly measured Lucet's: cold start, instantiate
//! from a warm pool, a trivial call, teardown, and a whole request without HTTP; plus the two
//! curves (instantiation against initial heap size, dense and sparse; teardown against pages
//! touched) and the pool's reset settings.
//!
//! Run: `cargo bench -p tern --bench lifecycle` (add a filter, e.g. `-- heap`, for one group).
//! Phase figures come from the server's own phase timers (`execute::answer`), summed by criterion's
//! `iter_custom`, so each line is the mean time of that phase alone.

use std::time::{Duration, Instant};

mod support;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use support::Harness;
use tern::config::PoolConfig;
use tern::execute::RunOutput;
use tern::tenant::TenantRef;
use wasm_encoder::{
    CodeSection, ConstExpr, DataSection, ExportKind, ExportSection, Function, FunctionSection,
    Instruction, MemArg, MemArgTarget, MemorySection, MemoryType, Module, TypeSection,
};

const PAGE: u64 = 64 * 1024;

/// A module with `pages` of initial memory whose `_start` stores one byte into each of the first
/// `touch` pages; `fill` picks which pages get a non-zero data segment.
fn heap_module(pages: u64, touch: u32, fill: impl Fn(u64) -> bool) -> Vec<u8> {
    let mut m = Module::new();
    let mut types = TypeSection::new();
    types.ty().function([], []);
    m.section(&types);
    let mut funcs = FunctionSection::new();
    funcs.function(0);
    m.section(&funcs);
    let mut mems = MemorySection::new();
    mems.memory(MemoryType {
        minimum: pages,
        maximum: None,
        memory64: false,
        shared: false,
        page_size_log2: None,
    });
    m.section(&mems);
    let mut exports = ExportSection::new();
    exports.export("_start", ExportKind::Func, 0);
    exports.export("memory", ExportKind::Memory, 0);
    m.section(&exports);
    let mut code = CodeSection::new();
    let mut f = Function::new([(1, wasm_encoder::ValType::I32)]);
    // for (i = 0; i < touch; i++) mem[i * PAGE] = 1
    let arg = MemArg {
        offset: 0,
        align: 0,
        target: MemArgTarget::Memory(0),
        ordering: None,
    };
    f.instruction(&Instruction::Block(wasm_encoder::BlockType::Empty));
    f.instruction(&Instruction::Loop(wasm_encoder::BlockType::Empty));
    f.instruction(&Instruction::LocalGet(0));
    f.instruction(&Instruction::I32Const(touch as i32));
    f.instruction(&Instruction::I32GeU);
    f.instruction(&Instruction::BrIf(1));
    f.instruction(&Instruction::LocalGet(0));
    f.instruction(&Instruction::I32Const(PAGE as i32));
    f.instruction(&Instruction::I32Mul);
    f.instruction(&Instruction::I32Const(1));
    f.instruction(&Instruction::I32Store8(arg));
    f.instruction(&Instruction::LocalGet(0));
    f.instruction(&Instruction::I32Const(1));
    f.instruction(&Instruction::I32Add);
    f.instruction(&Instruction::LocalSet(0));
    f.instruction(&Instruction::Br(0));
    f.instruction(&Instruction::End);
    f.instruction(&Instruction::End);
    f.instruction(&Instruction::End);
    code.function(&f);
    m.section(&code);
    let mut data = DataSection::new();
    let page_bytes = vec![0xA5u8; PAGE as usize];
    for p in (0..pages).filter(|p| fill(*p)) {
        data.active(
            0,
            &ConstExpr::i32_const((p * PAGE) as i32),
            page_bytes.iter().copied(),
        );
    }
    m.section(&data);
    m.finish()
}

/// A harness, a runtime to drive it, and a cache directory for its artifacts.
struct Bench {
    rt: tokio::runtime::Runtime,
    h: Harness,
    cache: tempfile::TempDir,
}

impl Bench {
    fn new(pool: PoolConfig) -> Self {
        Self {
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap(),
            h: Harness::new(pool).expect("engine"),
            cache: tempfile::tempdir().unwrap(),
        }
    }

    fn tenant(&self, name: &str, wasm: &[u8]) -> TenantRef {
        self.h.tenant(name, wasm, self.cache.path()).unwrap()
    }

    /// Criterion's mean of `phase` over whole requests of `tenant`.
    fn phase(
        &self,
        tenant: &TenantRef,
        phase: fn(&RunOutput, Duration) -> Duration,
    ) -> impl FnMut(u64) -> Duration {
        move |iters| {
            self.rt.block_on(async {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let start = Instant::now();
                    let out = request_ok(tenant).await;
                    total += phase(&out, start.elapsed());
                }
                total
            })
        }
    }
}

async fn request_ok(tenant: &TenantRef) -> RunOutput {
    let out = support::request(tenant).await;
    assert!(
        out.result.is_ok(),
        "bench guest failed: {:?}",
        out.result.err()
    );
    out
}

fn small_pool() -> PoolConfig {
    PoolConfig {
        instances: 4,
        ..PoolConfig::default()
    }
}

/// A Tern ABI guest (it imports from `tern`, so it is not taken for a CGI program) whose
/// handler does nothing: an empty `200`.
const NOP: &str = r#"(module
  (import "tern" "response_set_status" (func (param i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "_start")))"#;

fn lifecycle(c: &mut Criterion) {
    let mut g = c.benchmark_group("lifecycle");
    g.measurement_time(Duration::from_secs(4));
    // Cold: create the engine and its pool region, map the artifact, pre-link, run once.
    let hello = tern::demo::module("hello").unwrap();
    let cache = tempfile::tempdir().unwrap();
    {
        let h = Harness::new(small_pool()).unwrap();
        tern::artifact::load_wasm(&h.engine, hello, "hello", cache.path()).unwrap();
    }
    g.bench_function("cold_start_hello", |bch| {
        bch.iter_custom(|iters| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let start = Instant::now();
                let h = Harness::new(small_pool()).unwrap();
                let t = h.tenant("hello", hello, cache.path()).unwrap();
                rt.block_on(request_ok(&t));
                total += start.elapsed();
            }
            total
        })
    });

    let b = Bench::new(small_pool());
    let hello = b.tenant("hello", hello);
    let nop = b.tenant("nop", &wat::parse_str(NOP).unwrap());
    g.bench_function("instantiate_warm/hello", |x| {
        x.iter_custom(b.phase(&hello, |o, _| o.phases.instantiate))
    });
    g.bench_function("call_trivial/nop", |x| {
        x.iter_custom(b.phase(&nop, |o, _| o.phases.run))
    });
    g.bench_function("run/hello", |x| {
        x.iter_custom(b.phase(&hello, |o, _| o.phases.run))
    });
    g.bench_function("teardown/hello", |x| {
        x.iter_custom(b.phase(&hello, |o, _| o.phases.teardown))
    });
    g.bench_function("total/hello", |x| {
        x.iter_custom(b.phase(&hello, |_, all| all))
    });
    g.bench_function("total/nop", |x| x.iter_custom(b.phase(&nop, |_, all| all)));
    // Two tenants (two modules: `hello` and a copy with another greeting, so another image)
    // taking turns, request by request, on the same pool: what a second module on the slots
    // costs each request (gradual deployments at 50 %, several tenants on one worker).
    let other = b.tenant(
        "hello-2",
        &own_hello(tern::demo::module("hello").unwrap(), 2),
    );
    g.bench_function("total/hello_and_another_in_turns", |x| {
        x.iter_custom(|iters| {
            b.rt.block_on(async {
                let start = Instant::now();
                for i in 0..iters {
                    request_ok(if i % 2 == 0 { &hello } else { &other }).await;
                }
                start.elapsed()
            })
        })
    });
    g.finish();
}

fn heap_curves(c: &mut Criterion) {
    let b = Bench::new(small_pool());
    let mut g = c.benchmark_group("instantiate_vs_heap");
    g.measurement_time(Duration::from_secs(3));
    for kib in [64u64, 1024, 4096, 16384, 65536] {
        let pages = kib * 1024 / PAGE;
        let dense = b.tenant(&format!("dense{kib}"), &heap_module(pages, 0, |_| true));
        let sparse = b.tenant(
            &format!("sparse{kib}"),
            &heap_module(pages, 0, |p| p % 8 == 0),
        );
        g.bench_with_input(
            BenchmarkId::new("dense", format!("{kib}KiB")),
            &dense,
            |x, t| x.iter_custom(b.phase(t, |o, _| o.phases.instantiate)),
        );
        g.bench_with_input(
            BenchmarkId::new("sparse", format!("{kib}KiB")),
            &sparse,
            |x, t| x.iter_custom(b.phase(t, |o, _| o.phases.instantiate)),
        );
    }
    g.finish();

    let mut g = c.benchmark_group("teardown_vs_touched");
    g.measurement_time(Duration::from_secs(3));
    for touched in [1u32, 16, 64, 256, 1024] {
        let t = b.tenant(
            &format!("touch{touched}"),
            &heap_module(1024, touched, |_| false),
        );
        g.bench_with_input(
            BenchmarkId::from_parameter(format!("{}KiB", u64::from(touched) * 64)),
            &t,
            |x, t| x.iter_custom(b.phase(t, |o, _| o.phases.teardown)),
        );
    }
    g.finish();
}

fn reset_settings(c: &mut Criterion) {
    let mut g = c.benchmark_group("reset_settings_total_hello");
    g.measurement_time(Duration::from_secs(3));
    for (keep_kib, scan, stack_kib) in [
        (0, false, 16),
        (64, false, 16),
        (1024, false, 16),
        (1024, true, 16),
        (1024, true, 64),
        (4096, true, 16),
    ] {
        let pool = PoolConfig {
            memory_keep_resident_kib: keep_kib,
            pagemap_scan: scan,
            stack_keep_resident_kib: stack_kib,
            ..small_pool()
        };
        let b = Bench::new(pool);
        let hello = b.tenant("hello", tern::demo::module("hello").unwrap());
        let id = format!(
            "keep{keep_kib}KiB_scan{}_stack{stack_kib}KiB",
            if scan { "on" } else { "off" }
        );
        g.bench_function(id, |x| x.iter_custom(b.phase(&hello, |_, all| all)));
    }
    g.finish();
}

/// Tenants taking turns, request by request, on a pool sized as a server's (64 instances, as
/// many memory slots): a whole request of `hello` when 1, 3 or 10 tenants share the slots,
/// each with a module of its own (`total_hello`) or all with the same bytes, so one module
/// (`total_hello_same_bytes`). A server with several tenants should pay no more per request
/// than one with a tenant alone.
/// `hello` with the digit `n` for the `n` of its greeting: the same code, another heap image,
/// so a module of its own (tenants of the same bytes share one).
fn own_hello(hello: &[u8], n: u8) -> Vec<u8> {
    let greeting = b"Hello from Tern!\n";
    let at = hello
        .windows(greeting.len())
        .position(|w| w == greeting)
        .expect("hello's greeting in its data");
    let mut wasm = hello.to_vec();
    wasm[at + 12] = b'0' + n;
    wasm
}

fn tenants_in_turns(c: &mut Criterion) {
    let mut g = c.benchmark_group("tenants_in_turns");
    g.measurement_time(Duration::from_secs(4));
    let b = Bench::new(PoolConfig {
        instances: 64,
        ..PoolConfig::default()
    });
    let hello = tern::demo::module("hello").unwrap();
    // Tenants of their own modules: `hello` with a digit for the `n` of its greeting (the same
    // code, another heap image), so a module each. Tenants of the same bytes share one
    // (`artifact::Compiled`).
    let own: Vec<TenantRef> = (0..10)
        .map(|n| b.tenant(&format!("own-{n}"), &own_hello(hello, n)))
        .collect();
    let same: Vec<TenantRef> = (0..10)
        .map(|n| b.tenant(&format!("same-{n}"), hello))
        .collect();
    assert_eq!(tern::artifact::loaded_on(&b.h.engine), 10 + 1);
    for (name, tenants) in [("total_hello", &own), ("total_hello_same_bytes", &same)] {
        for k in [1usize, 3, 10] {
            let turns = &tenants[..k];
            g.bench_with_input(BenchmarkId::new(name, k), &k, |x, _| {
                x.iter_custom(|iters| {
                    b.rt.block_on(async {
                        let start = Instant::now();
                        for i in 0..iters {
                            request_ok(&turns[i as usize % turns.len()]).await;
                        }
                        start.elapsed()
                    })
                })
            });
        }
    }
    g.finish();
}

criterion_group!(
    benches,
    lifecycle,
    heap_curves,
    reset_settings,
    tenants_in_turns
);
criterion_main!(benches);
