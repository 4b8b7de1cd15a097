//! Teardown: the guest's store is dropped, which resets its slot and returns it to the pool.
//!
//! The pooling allocator restores the memory to the module's initial image (a `memset` of the
//! dirtied pages up to `linear_memory_keep_resident`, `madvise` beyond), resets the table and
//! zeroes the fiber stack, so the next guest in this slot sees only its own module's initial
//! state.
//!
//! # Zero state and swap
//! wasmtime 48's dirty-page reset (`[pool] pagemap_scan`) misses pages the kernel swapped out
//! while the guest ran, so they would reach the next guest of that slot (see [`crate::teardown::pagemap`]).
//! Tern therefore:
//! - uses that reset only when no swap area is active at start-up, or the process's cgroup
//!   allows it no swap ([`swap_possible`]); otherwise every freed memory is reset with `memset`
//!   up to `memory_keep_resident_kib` and `madvise` beyond, which holds whatever is swapped;
//! - watches for a swap area switched on later ([`watch_swap`], woken by the kernel at every
//!   `swapon`) and then moves every tenant to an engine with the `memset` reset
//!   ([`crate::registry::Registry::use_memset_reset`], as a deploy swaps a tenant). Until the
//!   move is published (milliseconds), each core module's memory is swept before its store is
//!   dropped and every page its guest made private is discarded, so nothing is left for the
//!   kernel to swap out before wasmtime's reset; a component's memory cannot be reached that
//!   way (wasmtime exposes no handle to it), so its requests wait for the move.
//!
//! # Scattered dirty pages
//! The same reset takes at most 32 dirty regions and decommits the rest, so a guest that
//! dirties many scattered pages would fault them in again on every request. A memory larger than
//! 64 pages (smaller ones cannot hold more than 32 regions) is swept before it is dropped and its
//! regions joined ([`crate::teardown::pagemap::Sweep`]). A tenant whose sweeps keep finding few regions is
//! swept only on one request in [`RECHECK_EVERY`] (spread over its slots, see [`rechecked`]),
//! so compact guests pay nothing.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

mod pagemap;
pub mod probe;

use self::pagemap::WASMTIME_REGIONS;
pub use self::pagemap::{Sweep, Swept};
use wasmtime::{Memory, Store};

/// Whether a swap area became active after start-up (kept current by [`watch_swap`]).
static SWAP_ACTIVE: AtomicBool = AtomicBool::new(false);

/// [`SWAP_ACTIVE`] for async waiters ([`swap_changes`]).
fn swap_state() -> &'static tokio::sync::watch::Sender<bool> {
    static STATE: std::sync::OnceLock<tokio::sync::watch::Sender<bool>> =
        std::sync::OnceLock::new();
    STATE.get_or_init(|| tokio::sync::watch::Sender::new(false))
}

/// Whether a swap area became active after start-up, as it changes (see [`watch_swap`]).
pub fn swap_changes() -> tokio::sync::watch::Receiver<bool> {
    swap_state().subscribe()
}

/// How long [`watch_swap`] waits for the kernel's word before it looks again anyway.
const SWAP_RECHECK: Duration = Duration::from_secs(10);

/// Sweeps in a row that found no more regions than wasmtime takes, after which a tenant is
/// swept only now and then.
const QUIET_AFTER: u32 = 16;

/// A quiet tenant is still swept on one request in this many, in case its guests change.
pub const RECHECK_EVERY: u32 = 128;

/// Whether the `n`th request of a quiet tenant is swept: one in [`RECHECK_EVERY`], spread so
/// that no periodic order of slots escapes it. A tenant's requests often take its slots in a
/// fixed rotation (a closed loop of connections on one worker), and every 128th request of
/// a rotation of 8 slots is always the same slot: a slot whose guest had come to dirty more
/// regions was then never swept, and its pages were faulted in again on every request. The
/// `n`th multiple of the golden ratio (in 32-bit fixed point) falls in the first 128th of
/// the circle as often in every residue class of `n` as overall.
fn rechecked(n: u32) -> bool {
    const GOLDEN: u32 = 0x9E37_79B9;
    n.wrapping_mul(GOLDEN) < u32::MAX / RECHECK_EVERY + 1
}

/// The sweep of one tenant's memories before teardown, and how often it is needed.
#[derive(Debug)]
pub struct MemorySweep {
    sweep: Sweep,
    /// Sweeps in a row that found nothing to join (saturating at [`QUIET_AFTER`]).
    quiet: AtomicU32,
    /// Requests since the tenant went quiet, counted per thread (each thread sweeps one of its
    /// own requests in [`RECHECK_EVERY`]: every request wrote one count all cores shared).
    skipped: crate::counter::Counter,
}

impl MemorySweep {
    /// The sweep for memories that keep up to `keep_resident` bytes resident, or `None` where
    /// the kernel has no `PAGEMAP_SCAN` (then neither has wasmtime's reset).
    pub fn new(keep_resident: usize) -> Option<Self> {
        Some(Self {
            sweep: Sweep::new(keep_resident)?,
            quiet: AtomicU32::new(0),
            skipped: crate::counter::Counter::new(),
        })
    }

    /// Whether this request's memory is to be swept: always while swap is active, otherwise
    /// unless the tenant is quiet (then one request in [`RECHECK_EVERY`]). Counts the skipped.
    pub fn due(&self) -> bool {
        SWAP_ACTIVE.load(Ordering::Relaxed)
            || self.quiet.load(Ordering::Relaxed) < QUIET_AFTER
            // (Its low 32 bits: the spread holds for any run of them.)
            || rechecked(self.skipped.inc_here() as u32)
    }

    /// Sweeps the `len` bytes of guest memory at `start` (see [`Sweep::run`]), a sweep found
    /// [`due`](Self::due).
    fn sweep_now(&self, start: usize, len: usize) {
        if SWAP_ACTIVE.load(Ordering::Relaxed) {
            self.sweep.run_span(start, len, true);
            return;
        }
        if len <= 2 * WASMTIME_REGIONS * self.sweep.page() {
            return;
        }
        let swept = self.sweep.run_span(start, len, false);
        if swept.regions > WASMTIME_REGIONS {
            self.quiet.store(0, Ordering::Relaxed);
        } else if self.quiet.load(Ordering::Relaxed) < QUIET_AFTER {
            self.quiet.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The guest memory (address, length) of a module's `memory` whose sweep is [due](MemorySweep::due):
/// what [`teardown`] is to sweep.
pub fn due<'a, T>(
    sweep: Option<&'a MemorySweep>,
    memory: Option<Memory>,
    store: &mut Store<T>,
) -> Option<(&'a MemorySweep, (usize, usize))> {
    let memory = memory?.data_mut(store);
    let span = (memory.as_mut_ptr() as usize, memory.len());
    sweep.filter(|s| s.due()).map(|s| (s, span))
}

/// Sweeps the guest's memory (address, length) if given (see the module docs: a module's from
/// [`due`], a component's from its memory probe, [`crate::teardown::probe`]), drops `store` and returns
/// the time since `started`.
pub fn teardown<T>(
    store: Store<T>,
    sweep: Option<(&MemorySweep, (usize, usize))>,
    started: Instant,
) -> Duration {
    if let Some((sweep, (start, len))) = sweep {
        // The store still owns the memory, and no guest runs in it.
        sweep.sweep_now(start, len);
    }
    drop(store);
    started.elapsed()
}

/// Whether a swap area became active after start-up (every memory must then be swept before
/// its teardown).
pub fn swap_active() -> bool {
    SWAP_ACTIVE.load(Ordering::Relaxed)
}

/// Whether the kernel could swap this process's pages out: a swap area is active
/// (`/proc/swaps`; unreadable counts as yes) and the process's cgroup (v2) does not set
/// `memory.swap.max` to 0.
pub fn swap_possible() -> bool {
    let active = std::fs::read_to_string("/proc/swaps").map_or(true, |s| s.lines().count() > 1);
    active && !cgroup_forbids_swap()
}

fn cgroup_forbids_swap() -> bool {
    let Ok(groups) = std::fs::read_to_string("/proc/self/cgroup") else {
        return false;
    };
    groups
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .and_then(|path| {
            std::fs::read_to_string(format!("/sys/fs/cgroup{path}/memory.swap.max")).ok()
        })
        .is_some_and(|max| max.trim() == "0")
}

/// Watches (once per process) for swap areas switched on after start-up, for [`teardown`]'s
/// sweep. Call it when the dirty-page reset is in use, before serving: the first look is made
/// before it returns.
pub fn watch_swap() {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        // Opened before the first look, so a change after that look wakes the watcher.
        let swaps = std::fs::File::open("/proc/swaps").ok();
        let update = || {
            let now = swap_possible();
            if now != SWAP_ACTIVE.swap(now, Ordering::Relaxed) {
                swap_state().send_replace(now);
                if now {
                    tracing::warn!(
                        "a swap area became active after start-up: moving every tenant to the \
                         swap-safe memset reset"
                    );
                }
            }
        };
        update();
        let watcher = std::thread::Builder::new()
            .name("tern-swap-watch".into())
            .spawn(move || {
                loop {
                    match &swaps {
                        Some(f) => pagemap::wait_for_swap_change(f, SWAP_RECHECK),
                        None => std::thread::sleep(Duration::from_secs(1)),
                    }
                    update();
                }
            });
        if let Err(e) = watcher {
            tracing::error!("cannot watch for swap areas: {e}");
        }
    });
}

#[cfg(test)]
mod tests {
    use super::{RECHECK_EVERY, rechecked};

    /// Slots taken in any rotation of up to 64: every slot is rechecked about once in
    /// `RECHECK_EVERY` of its own requests (a rotation of 8 was never rechecked in 7 of its
    /// slots with every 128th request).
    #[test]
    fn quiet_rechecks_reach_every_slot_of_a_rotation() {
        let per_slot = 64 * RECHECK_EVERY;
        for slots in 1..=64u32 {
            for slot in 0..slots {
                let hits = (0..per_slot)
                    .filter(|i| rechecked(slot + i * slots))
                    .count() as u32;
                assert!(
                    (32..=96).contains(&hits),
                    "slot {slot} of {slots}: {hits} rechecks in {per_slot} requests (64 expected)"
                );
            }
        }
        let all = (0..1 << 20).filter(|&n| rechecked(n)).count();
        let expected = (1 << 20) / RECHECK_EVERY as usize;
        assert!(
            all.abs_diff(expected) < expected / 100,
            "{all} rechecks, {expected} expected"
        );
    }
}
