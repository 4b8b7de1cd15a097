//! The log's output: a writer that batches lines to stderr, and a fast format for the
//! per-request access line.
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

use std::fmt::Write as _;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

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

impl Write for LogWriter {
    /// Takes one whole line (`tracing_subscriber` writes each event with one `write_all`).
    fn write(&mut self, line: &[u8]) -> std::io::Result<usize> {
        let mut state = lock(&self.shared);
        if state.waiting.len() + line.len() > MAX_WAITING {
            drop(state);
            self.shared.dropped.fetch_add(1, Ordering::Relaxed);
            return Ok(line.len());
        }
        let was = state.waiting.len();
        state.waiting.extend_from_slice(line);
        let wake = was < WAKE_AT && state.waiting.len() >= WAKE_AT;
        drop(state);
        if wake {
            self.shared.wake.notify_one();
        }
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

/// The target of the per-request access line.
pub const ACCESS_TARGET: &str = "tern::access";

/// Writes the access line of one request (target [`ACCESS_TARGET`], level info): the request
/// id, the tenant (`-` when none was routed), the status, the total time in ms and, when
/// tracing is on, the trace id.
pub fn access(
    request_id: &str,
    tenant: &str,
    status: u16,
    total: Duration,
    trace_id: Option<&str>,
) {
    let total_ms = total.as_micros() as f64 / 1e3;
    match trace_id {
        None => tracing::info!(
            target: "tern::access",
            request_id,
            tenant,
            status,
            total_ms,
            "request"
        ),
        Some(trace_id) => tracing::info!(
            target: "tern::access",
            request_id,
            tenant,
            status,
            total_ms,
            trace_id,
            "request"
        ),
    }
}

/// The process's log subscriber: events passing `filter` (an `EnvFilter` directive string such
/// as `info,tern::access=off`) formatted as text (with colours when `ansi`) or JSON, access
/// lines by [`AccessFormat`], handed to `writer`.
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
        .with_writer(writer);
    let format = tracing_subscriber::fmt::format();
    Ok(if json {
        Box::new(
            logs.json()
                .event_format(AccessFormat::new(format.json(), true))
                .finish(),
        )
    } else {
        Box::new(
            logs.with_ansi(ansi)
                .event_format(AccessFormat::new(format, false))
                .finish(),
        )
    })
}

/// An event format that writes `tern::access` lines itself and hands every other event to
/// `inner` (`tracing_subscriber`'s text or JSON format). The lines read as `inner` writes them
/// (same fields, order and quoting) with less work: the general formatter visits each field
/// through `Debug` and formats the whole timestamp for every line.
pub struct AccessFormat<F> {
    inner: F,
    json: bool,
}

impl<F> AccessFormat<F> {
    /// Access lines as text (`json == false`) or as JSON objects, like `inner`'s.
    pub fn new(inner: F, json: bool) -> Self {
        Self { inner, json }
    }
}

/// Writes the access event's fields as they are visited (in the order `http.rs` gives them,
/// which is also the order `tracing_subscriber` writes them in).
struct Fields<'a, 'w> {
    out: &'a mut Writer<'w>,
    json: bool,
    first: bool,
    result: std::fmt::Result,
}

impl Fields<'_, '_> {
    /// Writes the separator and the name of the next field; the message has no name in text.
    fn key(&mut self, name: &str) -> std::fmt::Result {
        let sep = if std::mem::take(&mut self.first) {
            ""
        } else {
            ","
        };
        match (self.json, name) {
            (true, _) => write!(self.out, "{sep}\"{name}\":"),
            (false, "message") => Ok(()),
            (false, _) => write!(self.out, " {name}="),
        }
    }

    fn field(&mut self, name: &str, value: impl FnOnce(&mut Self) -> std::fmt::Result) {
        if self.result.is_ok() {
            self.result = self.key(name).and_then(|()| value(self));
        }
    }
}

impl Visit for Fields<'_, '_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        let json = self.json;
        self.field(field.name(), |f| {
            if json {
                json_str(f.out, value)
            } else {
                debug_str(f.out, value)
            }
        });
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.field(field.name(), |f| write!(f.out, "{value}"));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.field(field.name(), |f| write!(f.out, "{value}"));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.field(field.name(), |f| write!(f.out, "{value:?}"));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.field(field.name(), |f| write!(f.out, "{value}"));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let json = self.json;
        self.field(field.name(), |f| {
            if json {
                json_str(f.out, format_args!("{value:?}"))
            } else {
                write!(f.out, "{value:?}")
            }
        });
    }
}

/// Writes `value` as `Debug` does (quoted, escaped); text with nothing to escape (ids, names)
/// without `Debug`'s walk through every character.
fn debug_str(out: &mut impl std::fmt::Write, value: &str) -> std::fmt::Result {
    if value
        .bytes()
        .all(|b| (b' '..=b'~').contains(&b) && b != b'"' && b != b'\\')
    {
        out.write_char('"')?;
        out.write_str(value)?;
        out.write_char('"')
    } else {
        write!(out, "{value:?}")
    }
}

/// Writes what is written to it as the inside of a JSON string (quotes, backslashes and control
/// characters escaped), so any `Display` or `Debug` value can be written into a JSON string
/// without a copy.
struct JsonEscaped<'a, 'w>(&'a mut Writer<'w>);

impl std::fmt::Write for JsonEscaped<'_, '_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let mut rest = s;
        while let Some(i) = rest.find(|c: char| c == '"' || c == '\\' || c < ' ') {
            self.0.write_str(&rest[..i])?;
            let c = rest[i..].chars().next().expect("found above");
            match c {
                '"' => self.0.write_str("\\\"")?,
                '\\' => self.0.write_str("\\\\")?,
                '\n' => self.0.write_str("\\n")?,
                c => write!(self.0, "\\u{:04x}", c as u32)?,
            }
            rest = &rest[i + c.len_utf8()..];
        }
        self.0.write_str(rest)
    }
}

/// `value` as a JSON string.
fn json_str(out: &mut Writer<'_>, value: impl std::fmt::Display) -> std::fmt::Result {
    out.write_char('"')?;
    write!(JsonEscaped(out), "{value}")?;
    out.write_char('"')
}

/// The time now as RFC 3339 UTC with microseconds (`2026-11-23T03:36:42.942409Z`), the date
/// and time of day computed once per second per thread.
fn timestamp(out: &mut Writer<'_>) -> std::fmt::Result {
    thread_local! {
        static SECOND: std::cell::RefCell<(u64, String)> = const {
            std::cell::RefCell::new((u64::MAX, String::new()))
        };
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let secs = now.as_secs();
    SECOND.with_borrow_mut(|(cached, text)| {
        if *cached != secs {
            *cached = secs;
            text.clear();
            let (y, m, d) = civil_date(secs / 86_400);
            let t = secs % 86_400;
            let _ = write!(
                text,
                "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}",
                t / 3600,
                t / 60 % 60,
                t % 60
            );
        }
        write!(out, "{text}.{:06}Z", now.subsec_micros())
    })
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil_date(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + u64::from(m <= 2), m, d)
}

impl<S, N, F> FormatEvent<S, N> for AccessFormat<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut out: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let meta = event.metadata();
        if meta.target() != ACCESS_TARGET {
            return self.inner.format_event(ctx, out, event);
        }
        let ansi = out.has_ansi_escapes();
        if self.json {
            out.write_str("{\"timestamp\":\"")?;
            timestamp(&mut out)?;
            write!(out, "\",\"level\":\"{}\",\"fields\":{{", meta.level())?;
        } else if ansi {
            out.write_str("\x1b[2m")?;
            timestamp(&mut out)?;
            write!(
                out,
                "\x1b[0m \x1b[32m{:>5}\x1b[0m \x1b[2m{ACCESS_TARGET}\x1b[0m\x1b[2m:\x1b[0m ",
                meta.level()
            )?;
        } else {
            timestamp(&mut out)?;
            write!(out, " {:>5} {ACCESS_TARGET}: ", meta.level())?;
        }
        let mut fields = Fields {
            out: &mut out,
            json: self.json,
            first: true,
            result: Ok(()),
        };
        event.record(&mut fields);
        fields.result?;
        if self.json {
            write!(out, "}},\"target\":\"{ACCESS_TARGET}\"}}")?;
        }
        writeln!(out)
    }
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
mod tests {
    use super::*;

    /// A `Write` whose bytes the test can read, counting the writes.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<(Vec<u8>, usize)>>);

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
    fn dates_are_the_calendar_dates_of_their_day_counts() {
        assert_eq!(civil_date(0), (1970, 1, 1));
        assert_eq!(civil_date(59), (1970, 3, 1));
        assert_eq!(civil_date(11_016), (2000, 2, 29));
        assert_eq!(civil_date(20_780), (2026, 11, 23));
        assert_eq!(civil_date(2_932_896), (9999, 12, 31));
    }

    #[test]
    fn text_values_are_written_as_debug_writes_them() {
        for v in [
            "",
            "4bf92f3577b34da6a3ce929d0e0e4736",
            "shop-1",
            "a b~c",
            "say \"hi\"",
            "back\\slash",
            "tab\there",
            "é",
            "\u{7f}",
            "line\n",
        ] {
            let mut out = String::new();
            debug_str(&mut out, v).unwrap();
            assert_eq!(out, format!("{v:?}"));
        }
    }

    #[test]
    fn json_strings_escape_quotes_backslashes_and_controls() {
        let mut s = String::new();
        json_str(&mut Writer::new(&mut s), "a\"b\\c\nd\u{1}é").unwrap();
        assert_eq!(s, r#""a\"b\\c\nd\u0001é""#);
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
