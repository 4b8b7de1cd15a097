//! What tracing costs the worker that answers a request: its ids and head sampling decision
//! (every request, sampled or not), and for a kept request its five spans encoded as OTLP
//! protobuf into the worker's export buffer. The exporter runs on its own runtime thread,
//! posting to a port where nothing listens (its batches fail and are counted), so this is the
//! worker's share alone; `bash loadtest/bench.sh cpu` gives the whole server's.
//!
//! Run: `cargo bench -p tern --bench traces`.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use criterion::{Criterion, criterion_group, criterion_main};
use http::{HeaderMap, HeaderValue};
use tern::trace::{Record, SpanTenant, Tracer, TracingConfig};

#[derive(Debug)]
struct Shop;

impl SpanTenant for Shop {
    fn name(&self) -> &str {
        "shop"
    }
    fn version(&self) -> &str {
        "v-4bf92f3577b3"
    }
    fn kind(&self) -> &'static str {
        "tern"
    }
}

fn tracer(rt: &tokio::runtime::Runtime, sampler: &str) -> Arc<Tracer> {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let config = TracingConfig {
        endpoint: format!("http://{closed}"),
        sampler: sampler.into(),
        batch_delay_ms: Some(20),
        max_queue: Some(1_000_000),
        ..TracingConfig::default()
    };
    let settings = config
        .resolve(|_| None, "bench")
        .expect("valid")
        .expect("on");
    let metrics = tern::metrics::Metrics::new(16).trace();
    let _guard = rt.enter();
    let (tracer, _task) = Tracer::start(
        settings,
        metrics,
        tern::shutdown::Shutdown::new(),
        prometheus::IntGauge::new("in_flight", "in flight").expect("gauge"),
        Duration::from_secs(1),
    );
    tracer
}

fn request(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let mut headers = HeaderMap::new();
    headers.insert(
        http::header::USER_AGENT,
        HeaderValue::from_static("k6/1.8.1"),
    );
    // Shared, as hyper makes a request's target (a clone is a count, not a copy).
    let uri = http::Uri::from_maybe_shared(bytes::Bytes::from_static(b"/shop/cart/items?page=2"))
        .expect("uri");
    let tenant: Arc<dyn SpanTenant> = Arc::new(Shop);
    let client: std::net::SocketAddr = "10.1.2.3:45678".parse().expect("address");
    let mut group = c.benchmark_group("trace");

    // What the front end does for every traced request: ids and the head decision, the trace
    // id as request id, and the request line kept in case the tail rules keep it.
    let unsampled = tracer(&rt, "always_off");
    group.bench_function("unsampled", |b| {
        b.iter(|| {
            let active = unsampled.begin(black_box(&headers));
            black_box(active.trace_id_header());
            black_box((uri.clone(), headers.get(http::header::USER_AGENT).cloned()));
            black_box(active.trace_id_hex());
        });
    });

    let sampled = tracer(&rt, "always_on");
    group.bench_function("kept", |b| {
        b.iter(|| {
            let active = sampled.begin(black_box(&headers));
            let t = Duration::from_micros;
            sampled.submit(&Record {
                active,
                arrived: Instant::now(),
                end: (t(9), SystemTime::now()),
                method: http::Method::GET,
                uri: uri.clone(),
                version: http::Version::HTTP_11,
                scheme: "http",
                client,
                user_agent: headers.get(http::header::USER_AGENT).cloned(),
                status: 200,
                request_id: None,
                tenant: Some((tenant.clone(), 5)),
                phases: [
                    Some((t(1), t(2))),
                    Some((t(2), t(4))),
                    Some((t(4), t(7))),
                    Some((t(7), t(8))),
                ],
                failure: None,
            });
        });
    });
    group.finish();
}

criterion_group!(benches, request);
criterion_main!(benches);
