//! The log's output: a writer that batches lines to stderr, the process's log subscriber, the
//! per-request access line ([`access`]: what it holds, and a fast format for it) and the
//! guests' log budget.
//!
//! The writer: a worker appends each formatted line to a shared buffer and returns; one
//! thread writes the buffer to stderr every [`FLUSH_EVERY`] (sooner once [`WAKE_AT`] bytes are
//! waiting), so many lines cost one `write` and no worker ever waits on stderr or wakes a thread
//! per line.
//!
//! Why not `tracing_appender::non_blocking`: it sends every line through a channel that wakes
//! its writer thread, which then writes that line on its own: with one worker pinned to a core,
//! a wake-up, a context switch and a `write` per request (context switches per request 0.126
//! before, 0.093 after; see the cost ledger in loadtest/README.md).

use tracing::Subscriber;

pub mod access;
mod writer;

pub use access::{ACCESS_TARGET, AccessRecord, AccessSink, Named, access_enabled, utc_seconds};
pub use writer::{FLUSH_EVERY, FlushGuard, LogWriter, MAX_WAITING, WAKE_AT, start};

/// The process's log subscriber: events passing `filter` (an `EnvFilter` directive string such
/// as `info,tern::access=off`) formatted as text (with colours when `ansi`) or JSON, handed to
/// `writer`. It also makes `writer` the process's [`AccessSink`], in the same format.
///
/// # Errors
/// If `filter` is not a valid directive string.
pub fn subscriber(
    filter: &str,
    json: bool,
    ansi: bool,
    writer: LogWriter,
) -> Result<Box<dyn Subscriber + Send + Sync>, tracing_subscriber::filter::ParseError> {
    let logs = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_new(filter)?)
        .with_writer(writer.clone());
    access::install(writer, json, ansi);
    Ok(if json {
        Box::new(logs.json().finish())
    } else {
        Box::new(logs.with_ansi(ansi).finish())
    })
}

/// A per-second budget of guest log lines, shared by all of a tenant's requests (lock-free; at a
/// second's boundary a few lines more or less may pass, which is fine for a log).
#[derive(Debug)]
pub struct LogBudget {
    per_sec: u32,
    second: std::sync::atomic::AtomicU64,
    used: std::sync::atomic::AtomicU32,
    dropped: prometheus::IntCounter,
}

impl LogBudget {
    /// A budget of `per_sec` lines a second; refused lines are counted in `dropped`.
    pub fn new(per_sec: u32, dropped: prometheus::IntCounter) -> Self {
        Self {
            per_sec,
            second: Default::default(),
            used: Default::default(),
            dropped,
        }
    }

    /// Whether one more line may be logged now.
    pub fn allow(&self) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        let now = EPOCH
            .get_or_init(std::time::Instant::now)
            .elapsed()
            .as_secs();
        if self.second.swap(now, Relaxed) != now {
            self.used.store(0, Relaxed);
        }
        let ok = self.used.fetch_add(1, Relaxed) < self.per_sec;
        if !ok {
            self.dropped.inc();
        }
        ok
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::*;

    /// A `Write` whose bytes the test can read, counting the writes.
    #[derive(Clone, Default)]
    pub(crate) struct Sink(pub(crate) Arc<Mutex<(Vec<u8>, usize)>>);

    impl Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            let mut s = self.0.lock().unwrap();
            s.0.extend_from_slice(b);
            s.1 += 1;
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_arrive_whole_in_order_in_few_writes_and_all_by_the_guard() {
        let sink = Sink::default();
        let (writer, guard) = start(sink.clone());
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let mut w = writer.clone();
                std::thread::spawn(move || {
                    for i in 0..1000 {
                        w.write_all(format!("t{t} line {i}\n").as_bytes()).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        drop(guard);
        let (bytes, writes) = sink.0.lock().unwrap().clone();
        let text = String::from_utf8(bytes).unwrap();
        for t in 0..4 {
            let mine: Vec<&str> = text
                .lines()
                .filter(|l| l.starts_with(&format!("t{t} ")))
                .collect();
            let want: Vec<String> = (0..1000).map(|i| format!("t{t} line {i}")).collect();
            assert_eq!(mine, want);
        }
        assert!(writes < 400, "{writes} writes for 4000 lines");
    }

    #[test]
    fn a_line_waits_at_most_about_one_flush_interval() {
        let sink = Sink::default();
        let (mut writer, _guard) = start(sink.clone());
        writer.write_all(b"soon\n").unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while sink.0.lock().unwrap().0.is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "the line was never written"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(sink.0.lock().unwrap().0, b"soon\n");
    }

    #[test]
    fn lines_over_the_limit_are_dropped_and_counted_not_blocked() {
        /// A stderr that never returns until released: everything else must wait in memory.
        struct Stuck(Arc<Mutex<()>>, Sink);
        impl Write for Stuck {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                let _held = self.0.lock().unwrap();
                self.1.write(b)
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let gate = Arc::new(Mutex::new(()));
        let sink = Sink::default();
        let held = gate.lock().unwrap();
        let (mut writer, guard) = start(Stuck(gate.clone(), sink.clone()));
        let line = vec![b'x'; 1023];
        let mut line = line;
        line.push(b'\n');
        // Enough to be taken once, then more than the limit while the writer is stuck.
        for _ in 0..(3 * MAX_WAITING / line.len()) {
            writer.write_all(&line).unwrap();
        }
        drop(held);
        drop(guard);
        let text = String::from_utf8(sink.0.lock().unwrap().0.clone()).unwrap();
        assert!(text.contains("log lines dropped"), "no drop note");
        assert!(
            text.len() <= 2 * MAX_WAITING + 200,
            "{} bytes kept",
            text.len()
        );
    }
}
