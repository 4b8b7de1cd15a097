//! The OpenMetrics text format with exemplars: when traces are on, a scraper that asks for
//! OpenMetrics (Prometheus does, first) gets the registry's text in that format, and the
//! buckets of the latency histograms (`tern_request_duration_seconds`,
//! `tern_request_phase_duration_seconds`) carry the trace id of the latest kept request that
//! fell in them, so a dashboard can go from a latency spike to its trace.

use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{Phase, Timings};

/// `Content-Type` of OpenMetrics text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Bucket bounds of the latency histograms: 1 µs doubling, 25 of them, then `+Inf`.
const BOUNDS: usize = 25;
/// The histograms with exemplars: the 7 phases, then the total.
const SERIES: usize = 8;
const TOTAL: usize = 7;

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

/// The latest exemplar per bucket of each latency histogram.
#[derive(Debug)]
pub struct Exemplars(Mutex<[[Option<Exemplar>; BOUNDS + 1]; SERIES]>);

impl Default for Exemplars {
    fn default() -> Self {
        Self(Mutex::new([[None; BOUNDS + 1]; SERIES]))
    }
}

/// The bucket a value falls in (the first bound at or above it).
fn bucket(seconds: f64) -> usize {
    (0..BOUNDS)
        .find(|&i| seconds <= 1e-6 * f64::from(1u32 << i))
        .unwrap_or(BOUNDS)
}

impl Exemplars {
    /// Records a kept request of trace `trace_id`: its phases (those it spent time in) and its
    /// total, at wall time `at`.
    pub fn record(&self, trace_id: [u8; 16], timings: &Timings, total: Duration, at: SystemTime) {
        let at = at
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let mut slots = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut put = |series: usize, d: Duration| {
            let value = d.as_secs_f64();
            slots[series][bucket(value)] = Some(Exemplar {
                trace_id,
                value,
                at,
            });
        };
        for (i, d) in timings.0.iter().enumerate() {
            if !d.is_zero() {
                put(i, *d);
            }
        }
        put(TOTAL, total);
    }

    /// The exemplar of histogram series `series`, bucket `le`.
    fn get(&self, series: usize, le: &str) -> Option<Exemplar> {
        let i = if le == "+Inf" {
            BOUNDS
        } else {
            bucket(le.parse::<f64>().ok()?)
        };
        self.0.lock().ok()?[series][i]
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
                crate::trace::hex(&e.trace_id),
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
}
