//! Counts every core adds to without contending: each thread adds to a shard of its own
//! ([`shard_index`], picked when it first counts), a read sums the shards. The metrics' latency
//! histograms and in-flight level (`metrics::per_thread`) keep a shard per thread on cache
//! lines of their own; a [`Counter`] is a slot in each thread's shard of one arena: 8 bytes a
//! shard, next to the same thread's other counters, where a cache line of its own a shard
//! would take 128 (a counter per tenant, outcome and status class: thousands on a server of
//! many tenants).
//!
//! A leaf module (it uses nothing of the crate): what counts per request anywhere can use it.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Shards of every per-thread count. Threads past this many share shards (still exact: the
/// additions are atomic); the workers of a machine with up to this many cores never do.
pub const SHARDS: usize = 64;

/// The shard the calling thread adds to: the first of those no running thread has, taken
/// when the thread first counts and given back when it ends (so threads that come and go, as
/// a blocking pool's, do not pile onto the workers' shards).
#[inline]
pub fn shard_index() -> usize {
    thread_local! {
        static SHARD: ShardTaken = ShardTaken::take();
    }
    // (While the thread ends, after its shard was given back: the first shard.)
    SHARD.try_with(|s| s.0).unwrap_or(0)
}

/// Shards given back by threads that ended.
static SHARDS_FREE: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// A thread's shard, given back when the thread ends.
struct ShardTaken(usize);

impl ShardTaken {
    fn take() -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let free = SHARDS_FREE.lock().unwrap_or_else(|e| e.into_inner()).pop();
        // Past SHARDS running threads, shards are shared (still exact: additions are atomic).
        Self(free.unwrap_or_else(|| NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS))
    }
}

impl Drop for ShardTaken {
    fn drop(&mut self) {
        SHARDS_FREE
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(self.0);
    }
}

/// Counters in one chunk of the [`Arena`] (32 KB a shard).
const CHUNK: usize = 4096;

/// Chunks the [`Arena`] can hold: 262,144 counters, more than a server keeps (a tenant has
/// ~30, at most ~120; tenants' labels are capped: `server.max_tenant_labels`, 1,000 by
/// default).
const CHUNKS: usize = 64;

/// The last index: shared by the counters made past the others (see [`Arena::take`]).
#[allow(clippy::cast_possible_truncation)]
const OVERFLOW: u32 = (CHUNKS * CHUNK - 1) as u32;

/// Counters' slots kept clear at each end of a chunk, so that no other allocation shares a
/// cache line (or its neighbour the prefetcher pairs it with) with a chunk's counters.
const PAD: usize = 16;

/// Every [`Counter`] of the process, per thread: a counter is an index, the same in every
/// shard; a thread adds to its own shard's slot (a chunk of a shard is made when a thread of
/// that shard first adds to one of its counters), a read sums the shards'. So a counter takes
/// 8 bytes in each shard a thread wrote it from, next to the same thread's other counters,
/// where a cache line of its own a shard would take 128. Chunks are kept; a counter's index is
/// given to a new counter once the last handle to it is dropped (its slots zeroed).
struct Arena {
    shards: Box<[ArenaShard]>,
    /// Indexes never handed out start here.
    next: AtomicUsize,
    /// Indexes of dropped counters.
    free: Mutex<Vec<u32>>,
}

/// One shard of the [`Arena`]: its chunks, each made when first written.
type ArenaShard = Box<[OnceLock<Box<[AtomicU64]>>]>;

static ARENA: std::sync::LazyLock<Arena> = std::sync::LazyLock::new(|| Arena {
    shards: (0..SHARDS)
        .map(|_| (0..CHUNKS).map(|_| OnceLock::new()).collect())
        .collect(),
    next: AtomicUsize::new(0),
    free: Mutex::default(),
});

impl Arena {
    /// Where `index` is: its chunk and its slot in it.
    #[inline]
    fn place(index: u32) -> (usize, usize) {
        let index = index as usize;
        (index / CHUNK, PAD + index % CHUNK)
    }

    /// Adds `n` to counter `index` in the calling thread's shard (its chunk made if it is
    /// the first there); what that shard held before.
    #[inline]
    fn add(index: u32, n: u64) -> u64 {
        thread_local! {
            /// The calling thread's shard, found once.
            static SHARD: &'static ArenaShard = &ARENA.shards[shard_index()];
        }
        let (chunk, slot) = Self::place(index);
        SHARD.with(|shard| {
            shard[chunk].get_or_init(|| (0..CHUNK + 2 * PAD).map(|_| AtomicU64::new(0)).collect())
                [slot]
                .fetch_add(n, Ordering::Relaxed)
        })
    }

    /// A counter's slots in every shard that has them.
    fn slots(&self, index: u32) -> impl Iterator<Item = &AtomicU64> {
        let (chunk, slot) = Self::place(index);
        self.shards
            .iter()
            .filter_map(move |shard| Some(&shard[chunk].get()?[slot]))
    }

    /// An index no live counter has; past [`CHUNKS`] × [`CHUNK`] − 1 live counters (more than
    /// a server keeps), [`OVERFLOW`], which every such counter shares (said once, in the log).
    fn take(&self) -> u32 {
        if let Some(index) = self.free.lock().unwrap_or_else(|e| e.into_inner()).pop() {
            return index;
        }
        let index = self.next.fetch_add(1, Ordering::Relaxed);
        match u32::try_from(index) {
            Ok(index) if index < OVERFLOW => index,
            _ => {
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| {
                    tracing::error!(
                        "more than {OVERFLOW} counters at once: the ones made past that share \
                         one count (their metrics are wrong)"
                    );
                });
                OVERFLOW
            }
        }
    }

    /// `index` back, its slots zeroed (no handle to it is left to add to them); never
    /// [`OVERFLOW`], which others may still share.
    fn give_back(&self, index: u32) {
        if index == OVERFLOW {
            return;
        }
        for slot in self.slots(index) {
            slot.store(0, Ordering::Relaxed);
        }
        self.free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(index);
    }
}

/// A counter every thread adds to without contending with the others (see [`Arena`]). A
/// clone is a handle to the same count.
#[derive(Clone)]
pub struct Counter(Arc<Index>);

/// A counter's index in the [`Arena`], given back when dropped.
struct Index(u32);

impl Drop for Index {
    fn drop(&mut self) {
        ARENA.give_back(self.0);
    }
}

impl std::fmt::Debug for Counter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Counter").field(&self.get()).finish()
    }
}

impl Default for Counter {
    fn default() -> Self {
        Self::new()
    }
}

impl Counter {
    /// A new counter at 0.
    pub fn new() -> Self {
        Self(Arc::new(Index(ARENA.take())))
    }

    /// One more.
    #[inline]
    pub fn inc(&self) {
        self.inc_by(1);
    }

    /// `n` more.
    #[inline]
    pub fn inc_by(&self, n: u64) {
        Arena::add(self.0.0, n);
    }

    /// One more, and how many the calling thread's shard had counted before (the count of
    /// this thread's own, where no other thread shares its shard): for what is done once in
    /// so many times without every core writing one count.
    #[inline]
    pub fn inc_here(&self) -> u64 {
        Arena::add(self.0.0, 1)
    }

    /// The count: every thread's summed.
    pub fn get(&self) -> u64 {
        ARENA
            .slots(self.0.0)
            .map(|slot| slot.load(Ordering::Relaxed))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_counters_place_is_given_to_a_new_one_at_zero() {
        // Counted from this thread and two others, then dropped (the family's handles too).
        let old: Vec<Counter> = (0..100).map(|_| Counter::new()).collect();
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| old.iter().for_each(|c| c.inc_by(3)));
            }
        });
        old.iter().for_each(Counter::inc);
        assert!(old.iter().all(|c| c.get() == 7));
        let clone = old[0].clone();
        let indexes: Vec<u32> = old.iter().map(|c| c.0.0).collect();
        drop(old);
        assert_eq!(clone.get(), 7, "a clone keeps its counter");
        drop(clone);
        // New counters until one has a place given back (tests running alongside may give
        // back places of their own, taken first).
        let mut new: Vec<Counter> = Vec::new();
        while new.len() < 100_000 && !new.last().is_some_and(|c| indexes.contains(&c.0.0)) {
            new.push(Counter::new());
        }
        assert!(
            new.last().is_some_and(|c| indexes.contains(&c.0.0)),
            "the places given back are taken again"
        );
        assert!(
            new.iter().all(|c| c.get() == 0),
            "a new counter starts at 0"
        );
        new.iter().for_each(Counter::inc);
        assert!(new.iter().all(|c| c.get() == 1));
    }
}
