//! The metrics every request writes, counted per thread: the latency histograms
//! (`tern_request_duration_seconds`, `tern_request_phase_duration_seconds`), the requests in
//! flight (`tern_requests_in_flight`), and the counters a request adds one to ([`Counters`]:
//! `tern_requests_total`, `tern_guest_outcomes_total`, `tern_cache_requests_total`,
//! `tern_live_log_records_total`; a tenant's responses by status class for the admin API), and
//! the guests' peak memory ([`Sizes`], `tern_guest_memory_peak_bytes`).
//!
//! A `prometheus::Histogram` keeps one count, one sum and one set of buckets for every thread:
//! each observation is four atomic writes to lines all workers share (one of them a
//! compare-and-swap loop for the sum in `f64`), and an `IntGauge` moved up and down by every
//! request is one line all workers write twice a request; so on a many-core edge every request
//! of every core takes those cache lines from the core that wrote them last. Here each thread
//! adds to a shard of its own, a cache line apart from the others' ([`SHARDS`], a thread's
//! picked when it first writes), with atomic additions no other core contends for; a scrape
//! sums the shards. A histogram's count is its buckets' sum, so it always agrees with them.
//!
//! The buckets are [`bounds`], 1 µs × 2^k for k = 0..24, and a duration's is found by its
//! bits, not by comparing it with each bound.
//!
//! A counter family's series are [`Counter`]s (`crate::counter`): a slot in each thread's
//! shard of one arena.

use std::collections::HashMap;

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus::core::{Collector, Desc};
use prometheus::proto;

pub use crate::counter::Counter;

/// Finite buckets: upper bounds 1 µs × 2^k, k = 0..24 (`prometheus::exponential_buckets(1e-6,
/// 2.0, 25)`); one more counts what lies above them (`+Inf`).
pub const BUCKETS: usize = 25;

/// Shards of each histogram: one per thread up to this many ([`crate::counter::SHARDS`]).
const SHARDS: usize = crate::counter::SHARDS;

/// The buckets' upper bounds in seconds, as the exposition gives them (every latency histogram
/// of the server has these).
pub fn bounds() -> Vec<f64> {
    prometheus::exponential_buckets(1e-6, 2.0, BUCKETS).expect("static bucket spec")
}

/// The least `k` with `value <= unit × 2^k`, or `finite` past the last bound (`k = finite − 1`).
fn power_bucket(value: u64, unit: u64, finite: usize) -> usize {
    let units = value.div_ceil(unit);
    if units <= 1 {
        return 0;
    }
    // The least k with 2^k >= units.
    ((u64::BITS - (units - 1).leading_zeros()) as usize).min(finite)
}

/// One thread's part of a histogram of `N − 1` finite buckets, on cache lines of its own.
#[repr(align(128))]
struct Shard<const N: usize> {
    /// Observations in each bucket (not cumulative), the last above every bound.
    counts: [AtomicU64; N],
    /// Their sum, in the histogram's whole units (nanoseconds, bytes).
    sum: AtomicU64,
}

impl<const N: usize> Default for Shard<N> {
    fn default() -> Self {
        Self {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            sum: AtomicU64::new(0),
        }
    }
}

/// A histogram of whole numbers with bounds `unit` × 2^k (k < `N` − 1), kept per thread
/// ([`Shard`]).
struct Powers<const N: usize> {
    unit: u64,
    shards: Box<[Shard<N>]>,
}

impl<const N: usize> Powers<N> {
    fn new(unit: u64) -> Self {
        Self {
            unit,
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
        }
    }

    #[inline]
    fn observe(&self, value: u64) {
        let shard = &self.shards[crate::counter::shard_index()];
        shard.counts[power_bucket(value, self.unit, N - 1)].fetch_add(1, Ordering::Relaxed);
        shard.sum.fetch_add(value, Ordering::Relaxed);
    }

    /// The shards summed, as the exposition's histogram with `bounds`' buckets and its sum
    /// times `scale`. (Read while others observe, the sum may lack an observation the count
    /// has, or hold one it lacks; the count is always its buckets'.)
    fn proto(&self, bounds: &[f64], scale: f64) -> proto::Histogram {
        let mut counts = [0u64; N];
        let mut sum = 0u128;
        for shard in &self.shards {
            for (total, count) in counts.iter_mut().zip(&shard.counts) {
                *total += count.load(Ordering::Relaxed);
            }
            sum += u128::from(shard.sum.load(Ordering::Relaxed));
        }
        let mut h = proto::Histogram::default();
        let mut cumulative = 0;
        let buckets = bounds
            .iter()
            .zip(counts)
            .map(|(bound, count)| {
                cumulative += count;
                let mut b = proto::Bucket::default();
                b.set_cumulative_count(cumulative);
                b.set_upper_bound(*bound);
                b
            })
            .collect();
        h.set_bucket(buckets);
        h.set_sample_count(counts.iter().sum());
        h.set_sample_sum(sum as f64 * scale);
        h
    }
}

/// A histogram of durations, kept per thread: bounds [`bounds`], the sum in nanoseconds.
pub struct Durations(Powers<{ BUCKETS + 1 }>);

impl Default for Durations {
    fn default() -> Self {
        Self(Powers::new(1000))
    }
}

impl std::fmt::Debug for Durations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Durations").finish_non_exhaustive()
    }
}

impl Durations {
    /// Counts `d`.
    pub fn observe(&self, d: Duration) {
        self.0
            .observe(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    }

    fn proto(&self, bounds: &[f64]) -> proto::Histogram {
        self.0.proto(bounds, 1e-9)
    }
}

/// The description of `name` with `help` and `labels`.
///
/// # Panics
/// If they are not a valid metric description (a programming error).
fn describe(name: &str, help: &str, labels: &[&str]) -> Desc {
    Desc::new(
        name.into(),
        help.into(),
        labels.iter().map(|l| (*l).to_string()).collect(),
        Default::default(),
    )
    .expect("valid metric")
}

/// `names` paired with `values`, sorted by name as the exposition has them.
fn label_pairs<'a>(
    names: impl IntoIterator<Item = &'a str>,
    values: impl IntoIterator<Item = &'a str>,
) -> Vec<proto::LabelPair> {
    let mut pairs: Vec<proto::LabelPair> = names
        .into_iter()
        .zip(values)
        .map(|(name, value)| {
            let mut pair = proto::LabelPair::default();
            pair.set_name(name.to_string());
            pair.set_value(value.to_string());
            pair
        })
        .collect();
    pairs.sort_by(|a, b| a.name().cmp(b.name()));
    pairs
}

/// The exposition's family of `desc`: of `kind`, with `metrics`.
fn family(
    desc: &Desc,
    kind: proto::MetricType,
    metrics: Vec<proto::Metric>,
) -> Vec<proto::MetricFamily> {
    let mut family = proto::MetricFamily::default();
    family.set_name(desc.fq_name.clone());
    family.set_help(desc.help.clone());
    family.set_field_type(kind);
    family.set_metric(metrics);
    vec![family]
}

/// Finite buckets of [`Sizes`]: upper bounds 64 KiB × 2^k, k = 0..16 (a guest's memory grows
/// by 64 KiB pages).
pub const SIZE_BUCKETS: usize = 17;

/// A histogram of sizes in bytes without labels (`tern_guest_memory_peak_bytes`, one
/// observation a guest run, every tenant's), kept per thread; bounds 64 KiB × 2^k
/// ([`SIZE_BUCKETS`]). A clone is a handle to the same.
#[derive(Clone)]
pub struct Sizes(Arc<SizesInner>);

struct SizesInner {
    desc: Desc,
    bounds: Vec<f64>,
    powers: Powers<{ SIZE_BUCKETS + 1 }>,
}

impl std::fmt::Debug for Sizes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Sizes").field(&self.0.desc.fq_name).finish()
    }
}

impl Sizes {
    /// `name` with `help`.
    ///
    /// # Panics
    /// If `name` or `help` is not a valid metric description (a programming error).
    pub fn new(name: &str, help: &str) -> Self {
        Self(Arc::new(SizesInner {
            desc: describe(name, help, &[]),
            bounds: prometheus::exponential_buckets(65536.0, 2.0, SIZE_BUCKETS)
                .expect("static bucket spec"),
            powers: Powers::new(65536),
        }))
    }

    /// Counts `bytes`.
    pub fn observe(&self, bytes: u64) {
        self.0.powers.observe(bytes);
    }
}

impl Collector for Sizes {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.0.desc]
    }

    fn collect(&self) -> Vec<proto::MetricFamily> {
        let mut m = proto::Metric::default();
        m.set_histogram(self.0.powers.proto(&self.0.bounds, 1.0));
        family(&self.0.desc, proto::MetricType::HISTOGRAM, vec![m])
    }
}

/// A metric family of [`Durations`], one per fixed set of label values, all made at once
/// (a clone is a handle to the same).
#[derive(Debug, Clone)]
pub struct Family(Arc<Series>);

#[derive(Debug)]
struct Series {
    desc: Desc,
    bounds: Vec<f64>,
    series: Vec<(Vec<proto::LabelPair>, Durations)>,
}

impl Family {
    /// `name` with `help`, a series for each of `values` (the values of `labels`, in order).
    ///
    /// # Panics
    /// If `name`, `help` or `labels` is not a valid metric description (a programming error).
    pub fn new(name: &str, help: &str, labels: &[&str], values: &[Vec<&str>]) -> Self {
        let desc = describe(name, help, labels);
        let series = values
            .iter()
            .map(|values| {
                let pairs = label_pairs(labels.iter().copied(), values.iter().copied());
                (pairs, Durations::default())
            })
            .collect();
        Self(Arc::new(Series {
            desc,
            bounds: bounds(),
            series,
        }))
    }

    /// The series made for the `i`th of the values given to [`Family::new`].
    pub fn series(&self, i: usize) -> &Durations {
        &self.0.series[i].1
    }
}

impl Collector for Family {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.0.desc]
    }

    fn collect(&self) -> Vec<proto::MetricFamily> {
        let this = &self.0;
        let metrics = (this.series.iter())
            .map(|(labels, durations)| {
                let mut m = proto::Metric::from_label(labels.clone());
                m.set_histogram(durations.proto(&this.bounds));
                m
            })
            .collect();
        family(&this.desc, proto::MetricType::HISTOGRAM, metrics)
    }
}

/// A gauge every request moves, up when it arrives and down when it is answered, counted per
/// thread: each shard holds the moves made on its thread (a request may end on another than
/// it began on), and the level is their sum. A clone is a handle to the same.
#[derive(Clone)]
pub struct Level(Arc<LevelShards>);

struct LevelShards {
    desc: Desc,
    shards: Box<[Moves]>,
}

/// One thread's moves of a [`Level`], on a cache line of its own.
#[repr(align(128))]
#[derive(Default)]
struct Moves(AtomicI64);

impl std::fmt::Debug for Level {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Level").field(&self.get()).finish()
    }
}

impl Level {
    /// The gauge `name` with `help`.
    ///
    /// # Panics
    /// If `name` or `help` is not a valid metric description (a programming error).
    pub fn new(name: &str, help: &str) -> Self {
        Self(Arc::new(LevelShards {
            desc: describe(name, help, &[]),
            shards: (0..SHARDS).map(|_| Moves::default()).collect(),
        }))
    }

    /// One more, until the guard is dropped.
    pub fn enter(&self) -> Entered<'_> {
        self.add(1);
        Entered(self)
    }

    fn add(&self, n: i64) {
        self.0.shards[crate::counter::shard_index()]
            .0
            .fetch_add(n, Ordering::Relaxed);
    }

    /// The level now: the shards summed. A request that enters on a shard already read and
    /// leaves on one not yet read would make one sum low by one (and a server draining on
    /// "nothing in flight" stop early), so the shards are summed twice and the larger sum
    /// taken: a request moving during both passes is all it can miss, and it can count one
    /// that has just left.
    pub fn get(&self) -> i64 {
        let sum = || -> i64 {
            self.0
                .shards
                .iter()
                .map(|m| m.0.load(Ordering::Relaxed))
                .sum()
        };
        sum().max(sum())
    }
}

/// One in a [`Level`] while it lives.
#[derive(Debug)]
pub struct Entered<'a>(&'a Level);

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        self.0.add(-1);
    }
}

impl Collector for Level {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.0.desc]
    }

    fn collect(&self) -> Vec<proto::MetricFamily> {
        let mut gauge = proto::Gauge::default();
        gauge.set_value(self.get().max(0) as f64);
        let mut m = proto::Metric::default();
        m.set_gauge(gauge);
        family(&self.0.desc, proto::MetricType::GAUGE, vec![m])
    }
}

/// A labelled family of [`Counter`]s (as `prometheus::IntCounterVec`, counted per thread); a
/// series is made when its label values are first asked for. A clone is a handle to the
/// same.
#[derive(Clone)]
pub struct Counters(Arc<CountersInner>);

struct CountersInner {
    desc: Desc,
    series: Mutex<HashMap<Box<[Box<str>]>, Counter>>,
}

impl std::fmt::Debug for Counters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Counters")
            .field(&self.0.desc.fq_name)
            .finish()
    }
}

impl Counters {
    /// `name` with `help` and `labels`.
    ///
    /// # Panics
    /// If `name`, `help` or `labels` is not a valid metric description (a programming error).
    pub fn new(name: &str, help: &str, labels: &[&str]) -> Self {
        Self(Arc::new(CountersInner {
            desc: describe(name, help, labels),
            series: Mutex::default(),
        }))
    }

    /// The counter of `values` (one for each label, in order), made if it is new. Resolved
    /// once by its user, not per request (it takes a lock).
    ///
    /// # Panics
    /// If `values` has not one value per label (a programming error).
    pub fn with_label_values(&self, values: &[&str]) -> Counter {
        assert_eq!(
            values.len(),
            self.0.desc.variable_labels.len(),
            "{}: one value per label",
            self.0.desc.fq_name
        );
        let key: Box<[Box<str>]> = values.iter().map(|v| (*v).into()).collect();
        let mut series = self.0.series.lock().unwrap_or_else(|e| e.into_inner());
        series.entry(key).or_default().clone()
    }
}

impl Collector for Counters {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.0.desc]
    }

    fn collect(&self) -> Vec<proto::MetricFamily> {
        let this = &self.0;
        let series = this.series.lock().unwrap_or_else(|e| e.into_inner());
        let metrics = series
            .iter()
            .map(|(values, counter)| {
                let pairs = label_pairs(
                    this.desc.variable_labels.iter().map(String::as_str),
                    values.iter().map(|v| &**v),
                );
                let mut c = proto::Counter::default();
                c.set_value(counter.get() as f64);
                let mut m = proto::Metric::from_label(pairs);
                m.set_counter(c);
                m
            })
            .collect();
        drop(series);
        family(&this.desc, proto::MetricType::COUNTER, metrics)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exposition text of `c` alone.
    fn text(c: Box<dyn Collector>) -> String {
        let r = prometheus::Registry::new();
        r.register(c).unwrap();
        let mut out = Vec::new();
        prometheus::Encoder::encode(&prometheus::TextEncoder::new(), &r.gather(), &mut out)
            .unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn a_duration_falls_in_the_bucket_of_the_least_bound_it_does_not_exceed() {
        let bounds = bounds();
        assert_eq!(bounds.len(), BUCKETS);
        for ns in [
            0,
            1,
            999,
            1000,
            1001,
            1999,
            2000,
            2001,
            3000,
            4000,
            4001,
            123_456,
            1_000_000,
            999_999_999,
            16_777_216_000,
            16_777_216_001,
            60_000_000_000,
            u64::MAX,
        ]
        .into_iter()
        // Every bound, and a nanosecond either side of it.
        .chain((0..BUCKETS).flat_map(|k| {
            let bound = 1000u64 << k;
            [bound - 1, bound, bound + 1]
        })) {
            let seconds = ns as f64 / 1e9;
            let expected = bounds.iter().position(|b| seconds <= *b).unwrap_or(BUCKETS);
            assert_eq!(power_bucket(ns, 1000, BUCKETS), expected, "{ns} ns");
        }
    }

    #[test]
    fn shards_from_many_threads_sum_to_what_prometheus_would_expose() {
        // The same durations into a sharded family and into prometheus's own histogram, from
        // eight threads: the same exposition, up to the sum's last digits.
        let ours = Family::new(
            "t_seconds",
            "h",
            &["phase", "deployment"],
            &[vec!["run", "current"], vec!["route", "current"]],
        );
        let reference = prometheus::HistogramVec::new(
            prometheus::HistogramOpts::new("t_seconds", "h").buckets(bounds()),
            &["phase", "deployment"],
        )
        .unwrap();
        let threads: Vec<_> = (0..8u64)
            .map(|t| {
                let (ours, reference) = (ours.clone(), reference.clone());
                std::thread::spawn(move || {
                    for i in 0..500u64 {
                        let d = Duration::from_nanos((t * 7919 + i * 104_729) % 40_000_000);
                        let series = usize::from(i % 3 == 0);
                        ours.series(series).observe(d);
                        let phase = ["run", "route"][series];
                        reference
                            .with_label_values(&[phase, "current"])
                            .observe(d.as_secs_f64());
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let (ours, reference) = (text(Box::new(ours)), text(Box::new(reference)));
        let without_sums = |t: &str| {
            t.lines()
                .filter(|l| !l.starts_with("t_seconds_sum"))
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        assert_eq!(without_sums(&ours), without_sums(&reference), "{ours}");
        assert!(ours.contains("t_seconds_count{deployment=\"current\",phase=\"route\"} 1336"));
        let sums = |t: &str| -> Vec<f64> {
            t.lines()
                .filter(|l| l.starts_with("t_seconds_sum"))
                .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
                .collect()
        };
        for (a, b) in sums(&ours).into_iter().zip(sums(&reference)) {
            assert!((a - b).abs() < 1e-9 * b.max(1.0), "{a} against {b}");
        }
    }

    #[test]
    fn sizes_expose_what_prometheus_would_at_every_bound() {
        // Every bound, a byte either side, 0 and past the last, into both.
        let ours = Sizes::new("m_bytes", "m");
        let reference = prometheus::Histogram::with_opts(
            prometheus::HistogramOpts::new("m_bytes", "m")
                .buckets(prometheus::exponential_buckets(65536.0, 2.0, SIZE_BUCKETS).unwrap()),
        )
        .unwrap();
        let mut values = vec![0u64, 1, u64::from(u32::MAX) * 4];
        for k in 0..SIZE_BUCKETS as u32 {
            let bound = 65536u64 << k;
            values.extend([bound - 1, bound, bound + 1]);
        }
        std::thread::scope(|s| {
            for half in values.chunks(values.len() / 2 + 1) {
                let (ours, reference) = (&ours, &reference);
                s.spawn(move || {
                    for v in half {
                        ours.observe(*v);
                        reference.observe(*v as f64);
                    }
                });
            }
        });
        let (ours, reference) = (text(Box::new(ours)), text(Box::new(reference)));
        assert_eq!(ours, reference);
        assert!(ours.contains("m_bytes_bucket{le=\"65536\"} 4\n"), "{ours}");
    }

    #[test]
    fn counters_from_many_threads_sum_to_what_prometheus_would_expose() {
        // The same counts into a family of per-thread counters and into prometheus's own, from
        // eight threads (each series asked for by every thread: one counter a series).
        let ours = Counters::new("t_total", "c", &["tenant", "status"]);
        let reference = prometheus::IntCounterVec::new(
            prometheus::Opts::new("t_total", "c"),
            &["tenant", "status"],
        )
        .unwrap();
        let threads: Vec<_> = (0..8u64)
            .map(|t| {
                let (ours, reference) = (ours.clone(), reference.clone());
                std::thread::spawn(move || {
                    for i in 0..1000u64 {
                        let tenant = ["a", "b", "c"][((t + i) % 3) as usize];
                        let status = ["2xx", "5xx"][usize::from(i % 7 == 0)];
                        ours.with_label_values(&[tenant, status]).inc_by(i % 4);
                        reference.with_label_values(&[tenant, status]).inc_by(i % 4);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(
            ours.with_label_values(&["a", "2xx"]).get(),
            reference.with_label_values(&["a", "2xx"]).get()
        );
        let (ours, reference) = (text(Box::new(ours)), text(Box::new(reference)));
        assert_eq!(ours, reference);
        assert!(
            ours.contains("t_total{status=\"5xx\",tenant=\"b\"} "),
            "{ours}"
        );
        // A family nobody counted in yet is left out, as prometheus's own is.
        let empty = Counters::new("u_total", "c", &["tenant"]);
        assert_eq!(text(Box::new(empty)), "");
    }

    #[test]
    fn a_level_is_the_sum_of_every_threads_moves_whichever_thread_ends_one() {
        let level = Level::new("t_in_flight", "h");
        let outer = level.enter();
        // Eight threads each enter 100 times and leave as many.
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    let entered: Vec<_> = (0..100).map(|_| level.enter()).collect();
                    assert!(level.get() >= 101);
                    drop(entered);
                });
            }
        });
        assert_eq!(level.get(), 1);
        // Entered here, ended on four other threads.
        let entered: Vec<_> = (0..320).map(|_| level.enter()).collect();
        assert_eq!(level.get(), 321);
        std::thread::scope(|s| {
            let mut entered = entered.into_iter();
            for _ in 0..4 {
                let part: Vec<_> = entered.by_ref().take(80).collect();
                s.spawn(move || drop(part));
            }
        });
        assert_eq!(level.get(), 1);
        drop(outer);
        assert_eq!(level.get(), 0);
        let r = prometheus::Registry::new();
        r.register(Box::new(level.clone())).unwrap();
        let _one = level.enter();
        let mut out = Vec::new();
        prometheus::Encoder::encode(&prometheus::TextEncoder::new(), &r.gather(), &mut out)
            .unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "# HELP t_in_flight h\n# TYPE t_in_flight gauge\nt_in_flight 1\n"
        );
    }
}
