//! The kept requests waiting for export, already encoded: each thread that ends requests
//! writes their spans into its own buffer (the `spans` entries of one OTLP `ScopeSpans`, which
//! concatenate), so a kept request costs its encoding and no allocation, channel or
//! cross-thread free; the exporter takes whole buffers and only writes the few bytes of the
//! envelope in front of each. Buffers go round: one sent is handed to the next thread whose
//! batch is taken (its pages already touched), not freed and made again.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;

use super::otlp::{self, Pb};
use super::record::Record;

/// One thread's encoded requests since the exporter last took them.
#[derive(Debug, Default)]
pub(super) struct Batch {
    /// `reserve` bytes for the envelope, then the spans.
    pub bytes: Vec<u8>,
    /// The requests in it.
    pub requests: usize,
    /// The spans in it.
    pub spans: usize,
}

/// A thread's buffer, shared with the exporter (which locks it only to take the batch).
#[derive(Debug, Default)]
struct Shard {
    batch: Mutex<Batch>,
    /// The length of the last batch taken: the room a new one starts with.
    last_len: AtomicUsize,
}

/// Most sent buffers kept for reuse, and the largest kept.
const SPARES: usize = 8;
const SPARE_MAX_BYTES: usize = 4 << 20;

/// The queue of one tracer: every thread's shard, and how many requests wait in all of them.
#[derive(Debug)]
pub(crate) struct Queue {
    /// Tells this queue's shards from another tracer's in a thread's list (tests run
    /// several servers in one process).
    id: u64,
    shards: Mutex<Vec<Arc<Shard>>>,
    /// Requests encoded and not yet taken by the exporter.
    queued: AtomicUsize,
    /// Most requests waiting; past it a request's spans are dropped.
    max: usize,
    /// A shard with this many requests wakes the exporter.
    max_batch: usize,
    /// Bytes at the front of every batch for the export's envelope.
    reserve: usize,
    /// Sent buffers, emptied, for the next batches.
    spares: Mutex<Vec<Vec<u8>>>,
    /// Wakes the exporter before its next tick.
    pub(super) wake: Notify,
}

thread_local! {
    /// This thread's shard of each queue it has written to.
    static MINE: RefCell<Vec<(u64, Arc<Shard>)>> = const { RefCell::new(Vec::new()) };
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Queue {
    pub(super) fn new(max: usize, max_batch: usize, reserve: usize) -> Self {
        static IDS: AtomicU64 = AtomicU64::new(0);
        Self {
            id: IDS.fetch_add(1, Ordering::Relaxed),
            shards: Mutex::new(Vec::new()),
            queued: AtomicUsize::new(0),
            max,
            max_batch,
            reserve,
            spares: Mutex::new(Vec::new()),
            wake: Notify::new(),
        }
    }

    /// Encodes `r` into this thread's shard; when `max` requests already wait, drops it and
    /// answers how many spans it had.
    pub(super) fn push(&self, r: &Record) -> Result<(), usize> {
        let waiting = self.queued.fetch_add(1, Ordering::Relaxed);
        if waiting >= self.max {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            return Err(r.span_count());
        }
        let written = self.with_shard(|shard| {
            let mut b = lock(&shard.batch);
            if b.bytes.is_empty() {
                let room = shard.last_len.load(Ordering::Relaxed).max(4096);
                b.bytes.reserve(room);
                b.bytes.resize(self.reserve, 0);
            }
            let mut pb = Pb(std::mem::take(&mut b.bytes));
            b.spans += otlp::request_spans(&mut pb, r);
            b.bytes = pb.0;
            b.requests += 1;
            b.requests == self.max_batch
        });
        let Some(batch_full) = written else {
            // A thread being torn down has no shard any more.
            self.queued.fetch_sub(1, Ordering::Relaxed);
            return Err(r.span_count());
        };
        if batch_full || waiting + 1 == self.max.div_ceil(2) {
            self.wake.notify_one();
        }
        Ok(())
    }

    /// Runs `f` on this thread's shard, made and registered on first use; `None` on a thread
    /// whose thread-locals are being destroyed.
    fn with_shard<T>(&self, f: impl FnOnce(&Shard) -> T) -> Option<T> {
        MINE.try_with(|mine| {
            let mut mine = mine.borrow_mut();
            if let Some((_, shard)) = mine.iter().find(|(id, _)| *id == self.id) {
                return f(shard);
            }
            // Shards of queues that are gone (only their thread holds them) are let go.
            mine.retain(|(_, s)| Arc::strong_count(s) > 1);
            let shard = Arc::new(Shard::default());
            lock(&self.shards).push(shard.clone());
            mine.push((self.id, shard));
            f(&mine.last().expect("just pushed").1)
        })
        .ok()
    }

    /// Moves every non-empty shard's batch into `out`, leaving a spare buffer in its place.
    pub(super) fn take(&self, out: &mut Vec<Batch>) {
        let mut spares = lock(&self.spares);
        let mut shards = lock(&self.shards);
        // A thread that ended leaves its shard to the queue alone: once empty, let it go.
        shards.retain(|s| Arc::strong_count(s) > 1 || lock(&s.batch).requests > 0);
        for shard in shards.iter() {
            let mut b = lock(&shard.batch);
            if b.requests == 0 {
                continue;
            }
            let spare = Batch {
                bytes: spares.pop().unwrap_or_default(),
                ..Batch::default()
            };
            let batch = std::mem::replace(&mut *b, spare);
            drop(b);
            shard.last_len.store(batch.bytes.len(), Ordering::Relaxed);
            self.queued.fetch_sub(batch.requests, Ordering::Relaxed);
            out.push(batch);
        }
    }

    /// Takes back a sent batch's buffer for a later batch.
    pub(super) fn give_back(&self, mut bytes: Vec<u8>) {
        let mut spares = lock(&self.spares);
        if spares.len() < SPARES && bytes.capacity() <= SPARE_MAX_BYTES {
            bytes.clear();
            spares.push(bytes);
        }
    }
}

/// A batch's buffer while it is being sent, from where its export request begins: given back
/// to the queue when the HTTP client lets go of it.
pub(super) struct Sending {
    pub bytes: Vec<u8>,
    pub at: usize,
    pub queue: Arc<Queue>,
}

impl AsRef<[u8]> for Sending {
    fn as_ref(&self) -> &[u8] {
        &self.bytes[self.at..]
    }
}

impl Drop for Sending {
    fn drop(&mut self) {
        self.queue.give_back(std::mem::take(&mut self.bytes));
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant, SystemTime};

    use super::super::tests::{active, kv_get};
    use super::*;

    const ZERO: Duration = Duration::ZERO;

    fn record(calls: usize) -> Record {
        let active = Arc::new(active());
        for _ in 0..calls {
            active.record(kv_get());
        }
        let now = Instant::now();
        Record {
            active,
            arrived: now,
            end: (Duration::from_micros(9), SystemTime::now()),
            method: http::Method::GET,
            uri: "/shop/cart?x=1".parse().unwrap(),
            version: http::Version::HTTP_11,
            scheme: "http",
            client: "[::ffff:10.1.2.3]:4567".parse().unwrap(),
            user_agent: None,
            status: 200,
            request_id: None,
            tenant: None,
            phases: [Some((ZERO, ZERO)), Some((ZERO, ZERO)), None, None],
            failure: None,
            cache_status: None,
            websocket: None,
            trigger: crate::trigger::Trigger::Schedule,
        }
    }

    /// Reads one protobuf key and length-delimited field at `at`: (field, body range).
    fn field(b: &[u8], at: &mut usize) -> (u64, std::ops::Range<usize>) {
        let mut varint = || {
            let (mut v, mut shift) = (0u64, 0);
            loop {
                let byte = b[*at];
                *at += 1;
                v |= u64::from(byte & 0x7f) << shift;
                shift += 7;
                if byte < 0x80 {
                    return v;
                }
            }
        };
        let key = varint();
        assert_eq!(key & 7, 2, "a length-delimited field");
        let len = varint() as usize;
        let body = *at..*at + len;
        *at += len;
        (key >> 3, body)
    }

    /// The spans in one wrapped export request, checking every length on the way.
    fn spans_in(body: &[u8]) -> usize {
        let mut at = 0;
        let (f, rs) = field(body, &mut at);
        assert_eq!(
            (f, rs.end),
            (1, body.len()),
            "one ResourceSpans, to the end"
        );
        let mut at = rs.start;
        let (f, _) = field(body, &mut at);
        assert_eq!(f, 1, "its resource");
        let (f, ss) = field(body, &mut at);
        assert_eq!((f, ss.end), (2, body.len()), "one ScopeSpans, to the end");
        let mut at = ss.start;
        let (f, _) = field(body, &mut at);
        assert_eq!(f, 1, "its scope");
        let mut spans = 0;
        while at < body.len() {
            assert_eq!(field(body, &mut at).0, 2, "a span");
            spans += 1;
        }
        assert_eq!(at, body.len());
        spans
    }

    #[test]
    fn each_thread_batches_its_requests_and_a_full_queue_drops() {
        let envelope = otlp::Envelope::new(&[("service.name".into(), "tern-test".into())]);
        let queue = Arc::new(Queue::new(5, 512, envelope.reserve()));
        // Three spans a request (server, two phases) and its calls.
        assert_eq!(queue.push(&record(0)), Ok(()));
        assert_eq!(queue.push(&record(200)), Ok(()));
        let other = queue.clone();
        std::thread::spawn(move || {
            assert_eq!(other.push(&record(1)), Ok(()));
            assert_eq!(other.push(&record(0)), Ok(()));
        })
        .join()
        .unwrap();
        assert_eq!(queue.push(&record(0)), Ok(()));
        // Five wait: the sixth is dropped with its spans counted.
        assert_eq!(queue.push(&record(2)), Err(5));

        let mut taken = Vec::new();
        queue.take(&mut taken);
        let mut found: Vec<(usize, usize)> = taken
            .iter_mut()
            .map(|b| {
                let at = envelope.wrap(&mut b.bytes);
                assert_eq!(spans_in(&b.bytes[at..]), b.spans);
                (b.requests, b.spans)
            })
            .collect();
        found.sort_unstable();
        // This thread's three (3 + 3 + 3, and 128 of the 200 calls) and the other's two.
        assert_eq!(found, [(2, 7), (3, 137)]);
        // Taken: room again, and the ended thread's empty shard let go.
        assert_eq!(queue.push(&record(0)), Ok(()));
        taken.clear();
        queue.take(&mut taken);
        assert_eq!(taken.len(), 1);
        assert_eq!(lock(&queue.shards).len(), 1);
    }
}
