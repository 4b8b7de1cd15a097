//! The OpenMetrics text format with exemplars: when traces are on, a scraper that asks for
//! OpenMetrics (Prometheus does, first) gets the registry's text in that format, and the
//! buckets of the latency histograms (`tern_request_duration_seconds`,
//! `tern_request_phase_duration_seconds`) carry the trace id of the latest kept request that
//! fell in them, so a dashboard can go from a latency spike to its trace.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{Phase, Timings};

/// `Content-Type` of OpenMetrics text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Bucket bounds of the latency histograms: 1 µs doubling, 25 of them, then `+Inf`.
const BOUNDS: usize = 25;
/// The histograms with exemplars: the phases, then the total.
const SERIES: usize = crate::metrics::PHASES + 1;
const TOTAL: usize = crate::metrics::PHASES;

/// Whether an `Accept` header asks for OpenMetrics.
pub fn wanted(accept: &[u8]) -> bool {
    accept
        .windows(b"application/openmetrics-text".len())
        .any(|w| w == b"application/openmetrics-text")
}

#[derive(Debug, Clone, Copy)]
struct Exemplar {
    trace_id: [u8; 16],
    value: f64,
    /// Unix seconds.
    at: f64,
}

/// A bucket's exemplar is replaced at most this often (in nanoseconds): a scraper sees one per
/// bucket per scrape, and a busy server keeps every request, so the exemplar of a bucket a
/// request often falls in is at most this old; a rare bucket's (a latency spike's) is its
/// latest request's.
const REFRESH_NANOS: u64 = 100_000_000;

/// The latest exemplar per bucket of each latency histogram.
#[derive(Debug)]
pub struct Exemplars {
    slots: Mutex<[[Option<Exemplar>; BOUNDS + 1]; SERIES]>,
    /// When each slot was last written (Unix nanoseconds, at least 1; 0 for never): read
    /// without the lock, so a kept request whose buckets all have a fresh exemplar takes no
    /// lock.
    written: [[AtomicU64; BOUNDS + 1]; SERIES],
}

impl Default for Exemplars {
    fn default() -> Self {
        Self {
            slots: Mutex::new([[None; BOUNDS + 1]; SERIES]),
            written: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
        }
    }
}

/// The bucket a value falls in (the first bound at or above it).
fn bucket(seconds: f64) -> usize {
    (0..BOUNDS)
        .find(|&i| seconds <= 1e-6 * f64::from(1u32 << i))
        .unwrap_or(BOUNDS)
}

/// [`bucket`] of a duration, without floating point: the first `i` with
/// `d <= 1 µs × 2^i`.
fn bucket_of(d: Duration) -> usize {
    let nanos =
        (d.as_secs().saturating_mul(1_000_000_000)).saturating_add(u64::from(d.subsec_nanos()));
    let micros = nanos.div_ceil(1000);
    if micros <= 1 {
        return 0;
    }
    let i = (u64::BITS - (micros - 1).leading_zeros()) as usize;
    i.min(BOUNDS)
}

impl Exemplars {
    /// Records a kept request of trace `trace_id`: its phases (those it spent time in) and its
    /// total, at wall time `at`.
    pub fn record(&self, trace_id: [u8; 16], timings: &Timings, total: Duration, at: SystemTime) {
        let now = at.duration_since(UNIX_EPOCH).unwrap_or_default();
        let nanos = u64::try_from(now.as_nanos()).unwrap_or(u64::MAX);
        let mut due = [None; SERIES];
        for (i, d) in timings.0.iter().chain([&total]).enumerate() {
            if i == TOTAL || !d.is_zero() {
                let b = bucket_of(*d);
                let written = self.written[i][b].load(Ordering::Relaxed);
                if written == 0 || nanos.saturating_sub(written) >= REFRESH_NANOS {
                    due[i] = Some((b, d.as_secs_f64()));
                }
            }
        }
        if due.iter().all(Option::is_none) {
            return;
        }
        let at = now.as_secs_f64();
        let mut slots = self
            .slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (series, due) in due.into_iter().enumerate() {
            if let Some((b, value)) = due {
                slots[series][b] = Some(Exemplar {
                    trace_id,
                    value,
                    at,
                });
                self.written[series][b].store(nanos.max(1), Ordering::Relaxed);
            }
        }
    }

    /// The exemplar of histogram series `series`, bucket `le`.
    fn get(&self, series: usize, le: &str) -> Option<Exemplar> {
        let i = if le == "+Inf" {
            BOUNDS
        } else {
            bucket(le.parse::<f64>().ok()?)
        };
        self.slots.lock().ok()?[series][i]
    }
}

/// The value of label `name` in a sample line's label set.
fn label<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let at = line.find(&format!("{name}=\""))? + name.len() + 2;
    let rest = &line[at..];
    Some(&rest[..rest.find('"')?])
}

/// The histogram series of a bucket line, if it is one of the latency histograms'.
fn series_of(line: &str) -> Option<usize> {
    if line.starts_with("tern_request_duration_seconds_bucket{") {
        return Some(TOTAL);
    }
    if line.starts_with("tern_request_phase_duration_seconds_bucket{") {
        let phase = label(line, "phase")?;
        return Phase::EVERY.iter().position(|p| p.name() == phase);
    }
    None
}

/// The Prometheus text `text` (as the `prometheus` crate writes it) in OpenMetrics, with the
/// exemplars of `exemplars` on the latency histograms' buckets.
///
/// The differences: a counter's family is named without its `_total` (its samples keep it; a
/// counter whose name lacks it is declared `unknown`), `untyped` is `unknown`, `"` in help text
/// is escaped, and the text ends with `# EOF`.
pub fn convert(text: &str, exemplars: &Exemplars) -> Vec<u8> {
    use std::fmt::Write;
    let mut out = String::with_capacity(text.len() + text.len() / 8);
    let mut help: Option<(&str, &str)> = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            help = rest.split_once(' ').or(Some((rest, "")));
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "unknown"));
            let (family, kind) = match kind {
                "counter" => match name.strip_suffix("_total") {
                    Some(f) => (f, "counter"),
                    None => (name, "unknown"),
                },
                "untyped" => (name, "unknown"),
                k => (name, k),
            };
            if let Some((h_name, h)) = help.take()
                && h_name == name
            {
                let _ = writeln!(out, "# HELP {family} {}", h.replace('"', "\\\""));
            }
            let _ = writeln!(out, "# TYPE {family} {kind}");
            continue;
        }
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        out.push_str(line);
        if let Some(series) = series_of(line)
            && let Some(le) = label(line, "le")
            && let Some(e) = exemplars.get(series, le)
        {
            let _ = write!(
                out,
                " # {{trace_id=\"{}\"}} {} {:.3}",
                crate::hex::encode(&e.trace_id),
                e.value,
                e.at
            );
        }
        out.push('\n');
    }
    out.push_str("# EOF\n");
    out.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_text_becomes_openmetrics_with_exemplars() {
        let text = "# HELP tern_requests_total Responses sent, \"by\" tenant.\n\
                    # TYPE tern_requests_total counter\n\
                    tern_requests_total{tenant=\"a\",status=\"2xx\"} 3\n\
                    # HELP odd A counter without the suffix.\n\
                    # TYPE odd counter\n\
                    odd 1\n\
                    # HELP tern_request_duration_seconds Time.\n\
                    # TYPE tern_request_duration_seconds histogram\n\
                    tern_request_duration_seconds_bucket{le=\"0.000001\"} 0\n\
                    tern_request_duration_seconds_bucket{le=\"0.000256\"} 1\n\
                    tern_request_duration_seconds_bucket{le=\"+Inf\"} 1\n\
                    tern_request_duration_seconds_sum 0.0002\n\
                    tern_request_duration_seconds_count 1\n";
        let exemplars = Exemplars::default();
        let mut t = Timings::default();
        t.set(Phase::Run, Duration::from_micros(100));
        exemplars.record([0xab; 16], &t, Duration::from_micros(200), UNIX_EPOCH);
        let out = String::from_utf8(convert(text, &exemplars)).unwrap();
        assert!(
            out.contains("# HELP tern_requests Responses sent, \\\"by\\\" tenant.\n"),
            "{out}"
        );
        assert!(
            out.contains("# TYPE tern_requests counter\ntern_requests_total{"),
            "{out}"
        );
        assert!(out.contains("# TYPE odd unknown\n"), "{out}");
        assert!(
            out.contains(&format!(
                "tern_request_duration_seconds_bucket{{le=\"0.000256\"}} 1 # {{trace_id=\"{}\"}} 0.0002 0.000\n",
                "ab".repeat(16)
            )),
            "{out}"
        );
        assert!(out.contains("seconds_bucket{le=\"0.000001\"} 0\n"), "{out}");
        assert!(out.ends_with("# EOF\n"));
        assert_eq!(bucket(1e-6), 0);
        assert_eq!(bucket(1.5e-6), 1);
        assert_eq!(bucket(100.0), BOUNDS);
    }

    #[test]
    fn durations_fall_in_the_buckets_their_seconds_do() {
        let mut nanos = vec![0, 1, 999, 1000, 1001, 100_000_000_000];
        for i in 0..=BOUNDS as u32 + 1 {
            let bound = 1000u64 << i;
            nanos.extend([bound - 1, bound, bound + 1]);
        }
        for n in nanos {
            let d = Duration::from_nanos(n);
            assert_eq!(bucket_of(d), bucket(d.as_secs_f64()), "{n} ns");
        }
    }

    #[test]
    fn a_bucket_exemplar_is_replaced_at_most_every_refresh() {
        let exemplars = Exemplars::default();
        let t = Timings::default();
        let at = |ms| UNIX_EPOCH + Duration::from_millis(1_700_000_000_000 + ms);
        let us = Duration::from_micros;
        let total = |e: &Exemplars, d: Duration| e.slots.lock().unwrap()[TOTAL][bucket_of(d)];
        exemplars.record([1; 16], &t, us(100), at(0));
        // The same bucket soon after: kept as it was; another bucket: written.
        exemplars.record([2; 16], &t, us(101), at(REFRESH_NANOS / 2_000_000));
        exemplars.record([3; 16], &t, us(900), at(REFRESH_NANOS / 2_000_000));
        assert_eq!(total(&exemplars, us(100)).unwrap().trace_id, [1; 16]);
        assert_eq!(total(&exemplars, us(900)).unwrap().trace_id, [3; 16]);
        // A refresh later: replaced.
        exemplars.record([4; 16], &t, us(101), at(REFRESH_NANOS / 1_000_000));
        let e = total(&exemplars, us(100)).unwrap();
        assert_eq!((e.trace_id, e.value), ([4; 16], 101e-6));
        // Phases that took no time have none.
        assert!(
            exemplars.slots.lock().unwrap()[..TOTAL]
                .iter()
                .flatten()
                .all(Option::is_none)
        );
    }
}
