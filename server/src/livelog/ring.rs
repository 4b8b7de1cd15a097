//! A tenant's ring of records: kept by count and by output bytes, sampled past a rate,
//! read by tailers at their own pace (each told what it missed).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::record::Record;

/// `[server.live_logs]` as every tenant's ring uses it.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Records kept per tenant (`0`: live logs are off).
    pub history: usize,
    /// Bytes of guest output kept per tenant.
    pub history_bytes: usize,
    /// Tailers a tenant may have at once.
    pub max_tailers: usize,
    /// Records a second before sampling (`0`: never).
    pub per_second: u32,
}

impl Settings {
    /// From the server's config.
    pub fn from_config(c: &crate::config::LiveLogsConfig) -> Self {
        Self {
            history: c.history,
            history_bytes: c.history_kib.saturating_mul(1024),
            max_tailers: c.max_tailers,
            per_second: c.records_per_second,
        }
    }
}

impl Default for Settings {
    fn default() -> Self {
        Self::from_config(&crate::config::LiveLogsConfig::default())
    }
}

/// The metrics every ring counts into.
#[derive(Clone)]
pub struct Counts {
    kept: crate::metrics::Counter,
    sampled_out: crate::metrics::Counter,
    tailers: prometheus::IntGauge,
    dropped: prometheus::IntCounter,
}

impl Counts {
    /// Handles from the server's metrics.
    pub fn new(m: &crate::metrics::Metrics) -> Self {
        Self {
            kept: m.live_log_records.with_label_values(&["yes"]),
            sampled_out: m.live_log_records.with_label_values(&["sampled_out"]),
            tailers: m.live_log_tailers.clone(),
            dropped: m.live_log_dropped.clone(),
        }
    }
}

/// A tenant's live log: its last records, and the tailers following them. Kept across its
/// versions (a redeploy does not empty it).
pub struct Tail {
    settings: Settings,
    ring: Mutex<Ring>,
    /// Tailers attached now.
    tailers: AtomicUsize,
    /// The sampling window's second.
    window: AtomicU64,
    /// Records seen (sampled in or out), counted per thread.
    seen: crate::counter::Counter,
    /// `seen` when the window's second began; held while a window begins, so that the window,
    /// this count and the step change together (one thread begins it, the others go on).
    window_began: Mutex<u64>,
    /// One record kept in this many (from the last window's rate; 1: every one).
    step: AtomicU64,
    counts: Counts,
}

/// The records, oldest first, and the sequence number the next one gets.
#[derive(Default)]
struct Ring {
    records: VecDeque<Arc<Record>>,
    next: u64,
    bytes: usize,
}

impl Tail {
    /// An empty ring with `settings`.
    pub fn new(settings: Settings, counts: Counts) -> Self {
        Self {
            settings,
            ring: Mutex::new(Ring::default()),
            tailers: AtomicUsize::new(0),
            window: AtomicU64::new(0),
            seen: crate::counter::Counter::new(),
            window_began: Mutex::new(0),
            step: AtomicU64::new(1),
            counts,
        }
    }

    /// Whether records are kept at all (`history > 0`).
    pub fn is_on(&self) -> bool {
        self.settings.history > 0
    }

    /// Whether a record of a request that ended in second `second` is kept, and at what rate
    /// (one in the returned number); `failed` ones always are.
    pub(super) fn sample(&self, second: u64, failed: bool) -> Option<u32> {
        let per = u64::from(self.settings.per_second);
        if per == 0 {
            return Some(1);
        }
        // This thread's count of the tenant's records: a thread keeps one in `step` of its
        // own (every request's count on one line all cores wrote, before).
        let counted = self.seen.inc_here();
        let now = self.window.load(Ordering::Relaxed);
        // A later second begins a window; so does one well before it (the clock was set
        // back), not a record that ended a moment before another thread's.
        let begins = |now: u64| second > now || second.saturating_add(2) < now;
        if begins(now)
            && let Ok(mut began) = self.window_began.try_lock()
        {
            // Looked at again under the lock: another thread may have begun it just now.
            let now = self.window.load(Ordering::Relaxed);
            if begins(now) {
                // A new second: the last one's count sets the rate for this one (a quiet
                // second in between resets it). (Counted while other threads count: near
                // enough.)
                let seen = self.seen.get();
                let last = if now.saturating_add(1) == second {
                    seen.saturating_sub(*began)
                } else {
                    0
                };
                *began = seen;
                let step = last.div_ceil(per).max(1);
                if self.step.load(Ordering::Relaxed) != step {
                    self.step.store(step, Ordering::Relaxed);
                }
                self.window.store(second, Ordering::Relaxed);
            }
        }
        let step = self.step.load(Ordering::Relaxed).max(1);
        let rate = u32::try_from(step).unwrap_or(u32::MAX);
        if failed || step == 1 || counted.is_multiple_of(step) {
            self.counts.kept.inc();
            Some(if failed { 1 } else { rate })
        } else {
            self.counts.sampled_out.inc();
            None
        }
    }

    /// Keeps `record` (unless sampled out), dropping the oldest past the ring's bounds. (No
    /// tailer is woken: each reads the ring every [`super::stream::FOLLOW_EVERY`], so a record
    /// costs a request no wake-up, and a tailer one write per interval, not one per record.)
    #[cfg(test)]
    pub fn push(&self, mut record: Record) {
        let always = record.outcome.always_kept(record.status);
        let Some(rate) = self.sample(record.ended_ms / 1000, always) else {
            return;
        };
        record.sample = rate;
        self.keep(record);
    }

    /// Keeps `record` (sampled in already), dropping the oldest past the ring's bounds.
    pub(super) fn keep(&self, record: Record) {
        let weight = record.weight();
        let record = Arc::new(record);
        let evicted = {
            let mut ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
            let mut record = record;
            Arc::get_mut(&mut record).expect("not shared yet").seq = ring.next;
            ring.next += 1;
            ring.bytes += weight;
            ring.records.push_back(record);
            // A full ring drops one record per record kept: held on its own, so that case
            // allocates no list (a `Vec` only for the rest, when outputs outweigh the bytes).
            let (mut first, mut rest) = (None, Vec::new());
            while ring.records.len() > self.settings.history
                || (ring.bytes > self.settings.history_bytes && ring.records.len() > 1)
            {
                let Some(old) = ring.records.pop_front() else {
                    break;
                };
                ring.bytes -= old.weight();
                if first.is_none() {
                    first = Some(old);
                } else {
                    rest.push(old);
                }
            }
            (first, rest)
        };
        // (Freed outside the lock.)
        drop(evicted);
    }

    /// A place for one more tailer, unless it has as many as it may.
    pub fn attach(self: &Arc<Self>) -> Option<Attached> {
        let max = self.settings.max_tailers;
        self.tailers
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()?;
        self.counts.tailers.inc();
        Some(Attached(self.clone()))
    }

    /// The sequence number the next record gets.
    pub fn next_seq(&self) -> u64 {
        self.ring.lock().unwrap_or_else(|e| e.into_inner()).next
    }

    /// The sequence number of the oldest record kept that ended at or after `ms` (Unix
    /// milliseconds), or the next one's if none did.
    pub fn seq_since(&self, ms: u64) -> u64 {
        let ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        ring.records
            .iter()
            .find(|r| r.ended_ms >= ms)
            .map_or(ring.next, |r| r.seq)
    }

    /// Up to `max` records from `*cursor` on (moving it past them), and how many records
    /// from `*cursor` on are no longer kept (the reader missed them).
    pub fn read(&self, cursor: &mut u64, max: usize, into: &mut Vec<Arc<Record>>) -> u64 {
        let ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        let first = ring.records.front().map_or(ring.next, |r| r.seq);
        let missed = first.saturating_sub(*cursor);
        *cursor = (*cursor).max(first);
        let skip = usize::try_from(*cursor - first).unwrap_or(usize::MAX);
        into.extend(ring.records.iter().skip(skip).take(max).cloned());
        *cursor += into.len() as u64;
        drop(ring);
        if missed > 0 {
            self.counts.dropped.inc_by(missed);
        }
        missed
    }
}

/// A tailer's place (given back when dropped).
pub struct Attached(Arc<Tail>);

impl Attached {
    /// The ring it follows.
    pub fn tail(&self) -> &Arc<Tail> {
        &self.0
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        self.0.tailers.fetch_sub(1, Ordering::AcqRel);
        self.0.counts.tailers.dec();
    }
}
