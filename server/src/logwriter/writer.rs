//! The writer: a worker appends each formatted line to a shared buffer and returns; one thread
//! writes the buffer out every [`FLUSH_EVERY`] (sooner once [`WAKE_AT`] bytes are waiting).

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

/// The longest a line waits before it is written.
pub const FLUSH_EVERY: Duration = Duration::from_millis(20);
/// Bytes waiting that make the writer start at once.
pub const WAKE_AT: usize = 64 * 1024;
/// Most bytes waiting; lines beyond are dropped (and counted) rather than a worker blocked.
pub const MAX_WAITING: usize = 4 * 1024 * 1024;

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    dropped: AtomicU64,
}

#[derive(Default)]
struct State {
    waiting: Vec<u8>,
    closed: bool,
}

/// Hands lines to the writer thread; `tracing_subscriber`'s `with_writer` takes it.
#[derive(Clone)]
pub struct LogWriter {
    shared: Arc<Shared>,
}

/// Writes what is waiting and stops the writer thread when dropped (keep it alive in `main`).
#[must_use = "dropping the guard stops the log writer"]
pub struct FlushGuard {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// Starts the writer thread over `out`.
///
/// # Panics
/// If the thread cannot be started.
pub fn start(out: impl Write + Send + 'static) -> (LogWriter, FlushGuard) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State::default()),
        wake: Condvar::new(),
        dropped: AtomicU64::new(0),
    });
    let thread = std::thread::Builder::new()
        .name("tern-log".into())
        .spawn({
            let shared = shared.clone();
            move || write_loop(&shared, out)
        })
        .expect("start the log writer thread");
    (
        LogWriter {
            shared: shared.clone(),
        },
        FlushGuard {
            shared,
            thread: Some(thread),
        },
    )
}

fn lock(shared: &Shared) -> MutexGuard<'_, State> {
    // A panic while holding the lock leaves only bytes behind; keep logging.
    shared.state.lock().unwrap_or_else(|e| e.into_inner())
}

fn write_loop(shared: &Shared, mut out: impl Write) {
    let mut spare = Vec::new();
    loop {
        let closed = {
            let mut state = lock(shared);
            if !state.closed && state.waiting.len() < WAKE_AT {
                state = shared
                    .wake
                    .wait_timeout(state, FLUSH_EVERY)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            std::mem::swap(&mut state.waiting, &mut spare);
            state.closed
        };
        let dropped = shared.dropped.swap(0, Ordering::Relaxed);
        if dropped > 0 {
            let _ = writeln!(
                spare,
                "tern: {dropped} log lines dropped (more than {MAX_WAITING} bytes were waiting)"
            );
        }
        if !spare.is_empty() {
            // Nowhere to report a failing stderr; the lines are gone either way.
            let _ = out.write_all(&spare).and_then(|()| out.flush());
            spare.clear();
        }
        if closed && lock(shared).waiting.is_empty() {
            return;
        }
    }
}

impl LogWriter {
    /// Hands one whole line to the writer thread (dropped and counted past [`MAX_WAITING`]).
    pub(super) fn append(&self, line: &[u8]) {
        let mut state = lock(&self.shared);
        if state.waiting.len() + line.len() > MAX_WAITING {
            drop(state);
            self.shared.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let was = state.waiting.len();
        state.waiting.extend_from_slice(line);
        let wake = was < WAKE_AT && state.waiting.len() >= WAKE_AT;
        drop(state);
        if wake {
            self.shared.wake.notify_one();
        }
    }
}

impl Write for LogWriter {
    /// Takes one whole line (`tracing_subscriber` writes each event with one `write_all`).
    fn write(&mut self, line: &[u8]) -> std::io::Result<usize> {
        self.append(line);
        Ok(line.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogWriter {
    type Writer = LogWriter;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

impl Drop for FlushGuard {
    fn drop(&mut self) {
        lock(&self.shared).closed = true;
        self.shared.wake.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
