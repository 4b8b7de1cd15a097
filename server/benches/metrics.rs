//! What a request's latency histograms cost the worker that records them, alone and with
//! another core recording at the same time: a `hello`'s five phases and its total
//! (`Metrics::observe` + `Metrics::observe_total`), against the same six observations into
//! `prometheus::Histogram`s (what the server used before its histograms were kept per thread:
//! every core then wrote the same cache lines).
//!
//! `request_counters`: the counters a cache hit adds one to (its tenant's responses by status
//! class for `tern_requests_total` and for the admin API, the cache's `hit`, the live log's
//! `kept`), as `tern::metrics::Counter`s (per thread) against `prometheus::IntCounter`s (what
//! the server used before).
//!
//! `cache_get`: a hit's look in the store a tenant's cache keeps its answers in
//! (`moka::sync::Cache`, as `cache::store` builds it: keyed by the key's hash, weighed), of one
//! key by one thread and by two at once: what a hit shares with the other cores beyond the
//! metrics (moka records every read in a channel all threads write).
//!
//! `cache_hit`: a whole hit of a tenant's cache (`Cache::lookup` of a stored answer with a
//! header of the guest's own, the answer built and dropped), by one thread and by two at once
//! on the same key: what the hit writes that the cores share (the store's read, and the
//! counted references of the stored header values and body, unless each thread answers from
//! its own copy).
//!
//! `cache_hit_gzip`: the same hit by clients that take gzip (the stored answer's compressed
//! copy, made by the first of them, sent to the others).
//!
//! Run: `cargo bench -p tern --bench metrics`. `threads/2` is the wall time of two threads
//! each recording one request, per request pair: with no shared line it stays near
//! `threads/1`.

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use tern::metrics::{Metrics, Phase, Timings};
use tern::rollout::Role;

/// A `hello`'s phases, as the server times them under load.
fn timings() -> Timings {
    let mut t = Timings::default();
    for (phase, us) in [
        (Phase::Route, 2),
        (Phase::Queue, 1),
        (Phase::Instantiate, 9),
        (Phase::Run, 9),
        (Phase::Teardown, 12),
    ] {
        t.set(phase, Duration::from_micros(us));
    }
    t
}

/// Runs `record` `iters` times on each of `threads` threads at once; the wall time from the
/// moment all have started.
fn together(threads: usize, iters: u64, record: Arc<dyn Fn() + Send + Sync>) -> Duration {
    let start = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (start, record) = (start.clone(), record.clone());
            std::thread::spawn(move || {
                start.wait();
                for _ in 0..iters {
                    record();
                }
            })
        })
        .collect();
    start.wait();
    let began = Instant::now();
    for h in handles {
        h.join().expect("recording thread");
    }
    began.elapsed()
}

/// Benches `record` in the group `name` on one thread and on two at once (`threads/1`,
/// `threads/2`).
fn one_and_two_threads(c: &mut Criterion, name: &str, record: &Arc<dyn Fn() + Send + Sync>) {
    let mut group = c.benchmark_group(name);
    for threads in [1, 2] {
        let record = record.clone();
        group.bench_function(format!("threads/{threads}"), |b| {
            b.iter_custom(|iters| together(threads, iters, record.clone()));
        });
    }
    group.finish();
}

fn histograms(c: &mut Criterion) {
    let t = timings();
    let total = Duration::from_micros(35);
    let metrics = Metrics::new(10);
    let ours: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
        metrics.observe(black_box(&t), Phase::Teardown, Role::Current);
        metrics.observe_total(black_box(total));
    });
    let vec = prometheus::HistogramVec::new(
        prometheus::HistogramOpts::new("bench_phase_seconds", "h")
            .buckets(prometheus::exponential_buckets(1e-6, 2.0, 25).expect("buckets")),
        &["phase"],
    )
    .expect("valid");
    let shared: Vec<prometheus::Histogram> = ["route", "queue", "instantiate", "run", "teardown"]
        .iter()
        .map(|p| vec.with_label_values(&[p]))
        .collect();
    let whole = prometheus::Histogram::with_opts(
        prometheus::HistogramOpts::new("bench_seconds", "h")
            .buckets(prometheus::exponential_buckets(1e-6, 2.0, 25).expect("buckets")),
    )
    .expect("valid");
    let reference: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
        let t = black_box(&t);
        for (h, d) in shared.iter().zip(&t.0) {
            h.observe(d.as_secs_f64());
        }
        whole.observe(black_box(total).as_secs_f64());
    });
    for (name, record) in [("per_thread", ours), ("prometheus", reference)] {
        one_and_two_threads(c, &format!("request_histograms/{name}"), &record);
    }
}

fn counters(c: &mut Criterion) {
    let ours: Vec<tern::metrics::Counter> = (0..4).map(|_| tern::metrics::Counter::new()).collect();
    let ours: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
        for counter in black_box(&ours) {
            counter.inc();
        }
    });
    let reference: Vec<prometheus::IntCounter> = (0..4)
        .map(|i| prometheus::IntCounter::new(format!("bench_{i}_total"), "c").expect("valid"))
        .collect();
    let reference: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
        for counter in black_box(&reference) {
            counter.inc();
        }
    });
    for (name, record) in [("per_thread", ours), ("prometheus", reference)] {
        one_and_two_threads(c, &format!("request_counters/{name}"), &record);
    }
}

fn cache_get(c: &mut Criterion) {
    let store: moka::sync::Cache<u64, Arc<Vec<u8>>> = moka::sync::Cache::builder()
        .max_capacity(64 * 1024 * 1024)
        .weigher(|_, v: &Arc<Vec<u8>>| u32::try_from(v.len()).unwrap_or(u32::MAX))
        .build();
    for key in 0..1000u64 {
        store.insert(key, Arc::new(vec![0; 1000]));
    }
    let get: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
        black_box(store.get(black_box(&7)));
    });
    one_and_two_threads(c, "cache_get/moka", &get);
}

fn cache_hit(c: &mut Criterion) {
    use std::future::Future;
    use tern::body::ResponseBody;
    use tern::cache::{Asking, Cache, CacheConfig, Lookup, Space};
    use tern::compress::{Compression, CompressionConfig};

    let metrics = Metrics::new(10);
    let cache = Arc::new(Cache::new(&CacheConfig::default(), &metrics, "t"));
    let gzip = Arc::new(
        Compression::prepare(&CompressionConfig::default(), &metrics, "t").expect("compression"),
    );
    let req = http::Request::get("/a").body(()).expect("request");
    let req_gzip = http::Request::get("/a")
        .header("accept-encoding", "gzip")
        .body(())
        .expect("request");
    // Polled once: a hit never waits.
    let look = move |cache: &Arc<Cache>, req: &http::Request<()>, gzip: Option<&Compression>| {
        let asking = Asking {
            https: false,
            host: "example.com",
            trusted: false,
            space: Space::Front(1),
            compress: gzip.map(|c| (c, c.ask(req))),
            body: false,
            at: Instant::now(),
            present: tern::context::Present::of(req.headers()),
        };
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let looked = std::pin::pin!(cache.lookup(req, asking));
        match looked.poll(&mut cx) {
            std::task::Poll::Ready(looked) => looked,
            std::task::Poll::Pending => panic!("a look waited"),
        }
    };
    let Lookup::Miss(fill) = look(&cache, &req, None) else {
        panic!("the first look is a miss");
    };
    let answer = http::Response::builder()
        .header("cache-control", "max-age=3600")
        .header("content-type", "text/plain")
        .header("etag", "\"v1\"")
        .header("x-tier", "gold")
        .body(ResponseBody::Full(Some(bytes::Bytes::from(vec![
            b'x';
            512
        ]))))
        .expect("answer");
    drop(fill.answered(answer));
    let plain_cache = cache.clone();
    let hit: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
        let Lookup::Hit(resp) = look(&plain_cache, black_box(&req), None) else {
            panic!("not a hit");
        };
        black_box(resp);
    });
    one_and_two_threads(c, "cache_hit", &hit);
    // The same answer to clients that take gzip: its compressed copy made by the first.
    let hit_gzip: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
        let Lookup::Hit(resp) = look(&cache, black_box(&req_gzip), Some(&gzip)) else {
            panic!("not a hit");
        };
        assert!(resp.headers().contains_key("content-encoding"));
        black_box(resp);
    });
    one_and_two_threads(c, "cache_hit_gzip", &hit_gzip);
}

criterion_group!(benches, histograms, counters, cache_get, cache_hit);
criterion_main!(benches);
