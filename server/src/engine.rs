//! The one wasmtime `Config` that `tern serve` and `tern compile` share, and the epoch ticker.
//!
//! Artifacts compiled by `tern compile` load in `tern serve` only if both built their engine
//! here: wasmtime refuses artifacts from another version or compiler configuration.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use wasmtime::{Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use crate::config::PoolConfig;

/// How often the epoch advances. Past its first slice (`guest::slice`) a running guest of a
/// CPU-bound tenant yields to the scheduler at each tick, so this is the time slice of a busy
/// guest: a light tenant's request waits at most one slice per busy guest ahead of it on its
/// worker (two for a guest of a tenant whose requests mostly end within their first slice).
/// With 1 ms, `hello`'s p99 next to a CPU-bound tenant was 2.6x its solo value; with 500 µs
/// 1.7x (`loadtest/bench.sh mixed`), while the yield itself (~1 µs) costs about 0.2 % of a
/// busy guest's time.
pub const EPOCH_TICK: Duration = Duration::from_micros(500);

const KIB: usize = 1024;
const MIB: u64 = 1024 * 1024;

/// Builds the engine configuration from the pool settings.
///
/// Only the pooling settings depend on `pool`; nothing that changes compiled code does, so one
/// `.cwasm` serves every pool size.
pub fn engine_config(pool: &PoolConfig) -> Config {
    let mut p = PoolingAllocationConfig::new();
    let n = pool.instances;
    // A slot holds one guest: a core module (one instance, memory and table) or a component
    // (up to `component_core_instances` core instances and tables, still one memory). One
    // admission permit per slot then guarantees that an admitted request finds room.
    let k = pool.component_core_instances;
    p.total_core_instances(n.saturating_mul(k))
        .total_component_instances(n)
        .max_core_instances_per_component(k)
        .max_memories_per_component(1)
        .max_tables_per_component(k)
        // More memories than instances: a freed memory slot keeps its module's image, so
        // slots beyond the running guests keep more tenants' images ready.
        .total_memories(pool.memory_slots())
        .total_tables(n.saturating_mul(k))
        .total_stacks(n)
        // A freed slot keeps its module's heap image mapped, so the module's next request
        // reuses it without an `mmap`. wasmtime keeps at most 100 such slots by default: with
        // 100 tenants spread over the pool, most requests then remapped an image and
        // throughput fell from 70k to 29k requests/s (`loadtest/bench.sh density`).
        .max_unused_warm_slots(pool.memory_slots())
        // One memory and table per module.
        .max_memories_per_module(1)
        .max_tables_per_module(1)
        .max_memory_size(usize::try_from(pool.max_memory_mib * MIB).unwrap_or(usize::MAX))
        .table_elements(pool.table_elements)
        .linear_memory_keep_resident(keep_resident_kib(pool) * KIB)
        .table_keep_resident(pool.table_keep_resident_kib * KIB)
        // Reset only the pages a guest dirtied (Linux >= 6.7; a no-op elsewhere).
        .pagemap_scan(if pool.pagemap_scan {
            Enabled::Auto
        } else {
            Enabled::No
        })
        // Zeroed fiber stacks: nothing a guest left on its stack reaches the next guest.
        // Keeping the top of each stack resident makes the zeroing a memset, not a page fault.
        .async_stack_keep_resident(pool.stack_keep_resident_kib * KIB);
    // Batched `madvise`: a lone one per request forces a TLB shootdown on every other core
    // running a worker (+15 % requests/s in `loadtest/bench.sh throughput`). A queued slot is
    // not reused before its batch is flushed (the pool flushes early when it runs out), so a
    // large batch keeps slots from their modules: with 64, 100 tenants got 44k requests/s,
    // with 16 65k (`loadtest/bench.sh density`).
    p.decommit_batch_size(pool.decommit_batch_size.min(n as usize / 8).max(1));

    let mut c = Config::new();
    c.allocation_strategy(InstanceAllocationStrategy::Pooling(p))
        // Time slicing and deadlines: guests check the epoch at loop headers and calls.
        .epoch_interruption(true)
        .async_stack_zeroing(pool.zero_stacks)
        .max_wasm_stack(pool.max_wasm_stack_kib * KIB)
        .async_stack_size(pool.async_stack_kib * KIB)
        // Copy-on-write heap images: instantiation maps the initial memory rather than copying
        // it, so it costs the same for a 64 KiB and a 64 MiB heap.
        .memory_init_cow(true)
        // Build an image even for sparse data (by default only up to 16 MiB): without one, a
        // 64 MiB heap with one data page in eight was copied on every instantiation (4.3 ms
        // instead of 2 µs, `cargo bench --bench lifecycle -- heap`). The image is a sparse
        // memfd, so holes cost no memory.
        .memory_guaranteed_dense_image_size(pool.max_memory_mib * MIB)
        // WASI 0.3 components need the component-model async ABI and the store's concurrency
        // support; both stay off unless asked for (`pool.wasi_p3`).
        .concurrency_support(pool.wasi_p3)
        .wasm_component_model_async(pool.wasi_p3);
    c
}

/// Most bytes of a freed memory the `memset` reset (no `PAGEMAP_SCAN`, or swap active) copies
/// back: it copies them all on every request, whatever the guest dirtied, so a
/// `memory_keep_resident_kib` sized for the dirty-page reset of heavy guests (8 MiB) would cost
/// every request of those guests an 8 MiB copy there.
pub const MEMSET_KEEP_RESIDENT_KIB: usize = 1024;

/// `[pool] memory_keep_resident_kib`, capped at [`MEMSET_KEEP_RESIDENT_KIB`] for the `memset`
/// reset.
pub fn keep_resident_kib(pool: &PoolConfig) -> usize {
    if pool.pagemap_scan {
        pool.memory_keep_resident_kib
    } else {
        pool.memory_keep_resident_kib.min(MEMSET_KEEP_RESIDENT_KIB)
    }
}

/// Creates the engine for `pool`.
///
/// # Errors
/// If wasmtime rejects the configuration (e.g. the host cannot reserve the pool).
pub fn build(pool: &PoolConfig) -> anyhow::Result<Engine> {
    Engine::new(&engine_config(pool)).map_err(|e| {
        // The pool's reservation is the mapping that fails for want of address space.
        if crate::os::Exhausted::in_chain(e.chain()).is_none() {
            return anyhow::anyhow!("cannot create engine: {e:#}");
        }
        let slots = pool.memory_slots();
        anyhow::anyhow!(
            "cannot create engine: {e:#} (the pool reserves 4 GiB of address space for each of \
             its {slots} memory slots, {} TiB in all; with 4-level page tables a process has \
             128 TiB: lower pool.memory_slots or pool.instances)",
            (u64::from(slots) * 4).div_ceil(1024)
        )
    })
}

/// How long an epoch ticker sleeps when it finds no guest's store in existence: a guest that
/// starts then gets its first tick up to this late, so its first slice may last this long
/// instead of one [`EPOCH_TICK`]. Each wake-up of the ticker costs the core it lands on ~8 µs
/// (a context switch each way): at 15k `hello` requests a second, ticking every 500 µs cost
/// 0.9-2.8 µs per request, though a store existed at only a few of those ticks.
pub const QUIET_TICK: Duration = Duration::from_millis(2);

/// Quiet checks in a row with no store made in between after which an epoch ticker rests until
/// the next store is made: an idle server then has no thread waking at all (ticking every
/// 500 µs cost an idle `tern serve` 3 % of a core).
const IDLE_CHECKS: u32 = 10;

/// Added to [`Activity::stores`] by each store made: its low 32 bits count the stores that
/// exist, its high bits the stores made (wrapping), so a ticker also sees a guest that came and
/// went between two of its ticks.
const MADE_ONE: u64 = (1 << 32) + 1;

/// What the epoch tickers watch: the guests' stores (a guest can run only while its store
/// exists) and whether any ticker rests.
struct Activity {
    stores: AtomicU64,
    resting: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

static ACTIVITY: Activity = Activity {
    stores: AtomicU64::new(0),
    resting: AtomicUsize::new(0),
    lock: Mutex::new(()),
    wake: Condvar::new(),
};

impl Activity {
    /// Wakes every resting ticker.
    fn wake_all(&self) {
        let _held = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        self.wake.notify_all();
    }

    /// Waits until a store exists or `stop` is set.
    fn rest(&self, stop: &AtomicBool) {
        let mut held = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        // Announced before the check, and a new store is counted before its maker looks at
        // `resting` (both sequentially consistent): either this ticker sees the store or the
        // maker sees the ticker resting and wakes it (under the lock, so not before the wait).
        self.resting.fetch_add(1, Ordering::SeqCst);
        while self.stores.load(Ordering::SeqCst) as u32 == 0 && !stop.load(Ordering::SeqCst) {
            held = self.wake.wait(held).unwrap_or_else(PoisonError::into_inner);
        }
        self.resting.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Held by a guest's store for as long as it exists (see `execute::new_store`): while any
/// does, the epoch tickers tick.
#[derive(Debug)]
pub struct LiveStore(());

impl LiveStore {
    /// Counts a new store, waking the tickers if they rest.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        ACTIVITY.stores.fetch_add(MADE_ONE, Ordering::SeqCst);
        if ACTIVITY.resting.load(Ordering::SeqCst) != 0 {
            ACTIVITY.wake_all();
        }
        Self(())
    }
}

impl Drop for LiveStore {
    fn drop(&mut self) {
        ACTIVITY.stores.fetch_sub(1, Ordering::Release);
    }
}

/// A thread that advances an engine's epoch every [`EPOCH_TICK`] while any guest's store
/// exists and every [`QUIET_TICK`] while none does, until it is dropped or the engine is gone.
/// After [`IDLE_CHECKS`] quiet checks with no store made in between it rests until the next
/// store is made, whose guest then gets its first tick one [`EPOCH_TICK`] after it began.
///
/// It holds the engine weakly: an engine replaced at run time (see
/// [`crate::registry::Registry::use_memset_reset`]) is still ticked, so the deadlines of the
/// guests finishing on it hold, and the thread ends by itself once the last of them is gone.
#[derive(Debug)]
pub struct EpochTicker {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl EpochTicker {
    /// Starts ticking `engine`.
    ///
    /// # Panics
    /// If the OS cannot start a thread.
    pub fn start(engine: &Engine) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (engine, flag) = (engine.weak(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("tern-epoch".into())
            .spawn(move || {
                let mut seen = ACTIVITY.stores.load(Ordering::Relaxed);
                let (mut idle, mut next) = (0, EPOCH_TICK);
                while !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(next);
                    match engine.upgrade() {
                        Some(engine) => engine.increment_epoch(),
                        None => break,
                    }
                    let now = ACTIVITY.stores.load(Ordering::Relaxed);
                    // A store that exists now is ticked every slice while it lasts.
                    let live = now as u32 != 0;
                    next = if live { EPOCH_TICK } else { QUIET_TICK };
                    if live || now != seen {
                        (seen, idle) = (now, 0);
                        continue;
                    }
                    idle += 1;
                    if idle >= IDLE_CHECKS {
                        ACTIVITY.rest(&flag);
                        (seen, idle, next) =
                            (ACTIVITY.stores.load(Ordering::Relaxed), 0, EPOCH_TICK);
                    }
                }
            })
            .expect("start epoch thread");
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        ACTIVITY.wake_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;
    use wasmtime::{Instance, Module, Store, Trap};

    /// `(module (func (export "spin") (loop (br 0))))`.
    const SPIN: &[u8] = &[
        0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, // magic, version
        0x01, 0x04, 0x01, 0x60, 0x00, 0x00, // type: () -> ()
        0x03, 0x02, 0x01, 0x00, // function 0 of type 0
        0x07, 0x08, 0x01, 0x04, b's', b'p', b'i', b'n', 0x00, 0x00, // export "spin"
        0x0a, 0x09, 0x01, 0x07, 0x00, 0x03, 0x40, 0x0c, 0x00, 0x0b, 0x0b, // loop { br 0 }
    ];

    #[test]
    fn the_memset_reset_keeps_at_most_one_mib_resident() {
        let with = |kib, pagemap_scan| {
            keep_resident_kib(&PoolConfig {
                memory_keep_resident_kib: kib,
                pagemap_scan,
                ..PoolConfig::default()
            })
        };
        let cap = MEMSET_KEEP_RESIDENT_KIB;
        assert_eq!(with(cap - 4, false), cap - 4);
        assert_eq!(with(cap, false), cap);
        assert_eq!(with(cap + 4, false), cap);
        assert_eq!(
            with(8192, true),
            8192,
            "the dirty-page reset takes what is configured"
        );
    }

    #[test]
    fn an_idle_ticker_rests_and_a_new_store_wakes_it_in_time_to_interrupt_its_guest() {
        let engine = Engine::new(Config::new().epoch_interruption(true)).unwrap();
        let module = Module::new(&engine, SPIN).unwrap();
        let ticker = EpochTicker::start(&engine);
        // With no store in existence it rests after IDLE_CHECKS quiet checks.
        let waited = Instant::now();
        while ACTIVITY.resting.load(Ordering::SeqCst) == 0 {
            assert!(
                waited.elapsed() < Duration::from_secs(10),
                "the ticker never rested"
            );
            std::thread::sleep(EPOCH_TICK);
        }
        // A guest that never ends is interrupted at its deadline: the ticker woke for its store.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let live = LiveStore::new();
            let mut store = Store::new(&engine, ());
            store.set_epoch_deadline(3);
            let spin = Instance::new(&mut store, &module, &[])
                .and_then(|i| i.get_typed_func::<(), ()>(&mut store, "spin"))
                .unwrap();
            let trap = spin
                .call(&mut store, ())
                .unwrap_err()
                .downcast::<Trap>()
                .ok();
            drop(live);
            let _ = tx.send(trap);
        });
        let trap = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the spinning guest was never interrupted");
        assert_eq!(trap, Some(Trap::Interrupt));
        // Dropping the ticker ends its thread, resting or not.
        drop(ticker);
    }
}
