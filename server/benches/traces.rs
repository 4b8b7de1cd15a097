//! What tracing costs the worker that answers a request: its ids and head sampling decision
//! (every request, sampled or not), and for a kept request its five spans encoded as OTLP
//! protobuf into the worker's export buffer. The exporter runs on its own runtime thread and
//! posts every batch to an OTLP endpoint in this process that reads it whole and answers `200`,
//! so buffers come back for reuse as they do against a collector; only the worker's side is
//! timed (kept requests in batches of `max_batch`, each exported before the next is timed: the
//! steady state of a server, not a queue filling up). `bash loadtest/bench.sh cpu` gives the
//! whole server's.
//!
//! Run: `cargo bench -p tern --bench traces`.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use http::{HeaderMap, HeaderValue};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use tern::trace::{Record, SpanTenant, TraceMetrics, Tracer, TracingConfig};

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

/// Requests per export batch (`tracing.max_batch`): a full batch wakes the exporter at once.
const BATCH: u64 = 512;

/// An OTLP/HTTP endpoint on `rt` that reads every export request whole and answers `200`.
fn sink(rt: &tokio::runtime::Runtime) -> std::net::SocketAddr {
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("a port");
    let at = listener.local_addr().expect("address");
    rt.spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|req: http::Request<Incoming>| async {
                    let _ = req.into_body().collect().await;
                    Ok::<_, std::convert::Infallible>(http::Response::new(Empty::<Bytes>::new()))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    at
}

fn tracer(rt: &tokio::runtime::Runtime, sampler: &str) -> (Arc<Tracer>, TraceMetrics) {
    let config = TracingConfig {
        endpoint: format!("http://{}", sink(rt)),
        sampler: sampler.into(),
        max_batch: Some(BATCH as usize),
        // A batch that is not full (criterion's first, small rounds) goes soon too.
        batch_delay_ms: Some(5),
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
        metrics.clone(),
        tern::shutdown::Shutdown::new(),
        || 0,
        Duration::from_secs(1),
    );
    (tracer, metrics)
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
    let (unsampled, _) = tracer(&rt, "parentbased_always_off");
    // A request that starts its trace, and one that continues its caller's unsampled trace.
    let mut child = headers.clone();
    child.insert(
        tern::trace::TRACEPARENT.clone(),
        HeaderValue::from_static("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"),
    );
    for (name, headers) in [("unsampled", &headers), ("unsampled_child", &child)] {
        group.bench_function(name, |b| {
            b.iter(|| {
                let active = unsampled.begin(black_box(headers));
                black_box(active.trace_id_header());
                black_box((uri.clone(), headers.get(http::header::USER_AGENT).cloned()));
                black_box(active.trace_id_text());
            });
        });
    }

    let (sampled, exported) = tracer(&rt, "always_on");
    let kept = || {
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
            cache_status: None,
            websocket: None,
            trigger: tern::trigger::Trigger::Request,
        });
    };
    group.bench_function("kept", |b| {
        b.iter_custom(|iters| {
            let mut took = Duration::ZERO;
            let mut done = 0;
            while done < iters {
                let n = BATCH.min(iters - done);
                let before = exported.exported.get();
                let start = Instant::now();
                for _ in 0..n {
                    kept();
                }
                took += start.elapsed();
                done += n;
                // Untimed: the exporter takes the batch (at once when full, else at its next
                // tick) and the endpoint answers, so the next one starts from an empty shard.
                while exported.exported.get() < before + 5 * n {
                    std::thread::sleep(Duration::from_micros(100));
                }
            }
            took
        });
    });
    group.finish();
}

criterion_group!(benches, request);
criterion_main!(benches);
