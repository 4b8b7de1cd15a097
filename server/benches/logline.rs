//! What the access line costs a worker: one `tern::access` event through the server's own log
//! subscriber (`logwriter::subscriber`) into the batching writer, as text, as JSON, and
//! filtered out (`TERN_LOG=info,tern::access=off`). The writer thread writes to a sink, so this
//! is the worker's share; the write to stderr is one call per 20 ms or 64 KiB of lines.
//!
//! `server_timing`: the other text every response carries, its `Server-Timing` value (the
//! phases of a request that ran its guest).
//!
//! Run: `cargo bench -p tern --bench logline`. Compare with the CPU per request of
//! `bash loadtest/bench.sh cpu` to get the access line's share of a request.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use tern::logwriter;

/// The tenant of the benchmark's requests.
struct Hello;

impl logwriter::Named for Hello {
    fn name(&self) -> &str {
        "hello"
    }
}

/// A `GET /hello` as curl sends it, answered `200` with 17 bytes.
fn record(trace_id: Option<[u8; 32]>) -> logwriter::AccessRecord {
    logwriter::AccessRecord {
        request_id: http::HeaderValue::from_static("0193a1b2c3d4e5f6a7b8c9d0e1f2a3b4"),
        tenant: Some(std::sync::Arc::new(Hello)),
        method: http::Method::GET,
        target: http::Uri::from_static("/hello?name=x"),
        with_query: false,
        version: http::Version::HTTP_11,
        host: Some(http::HeaderValue::from_static("localhost:8080")),
        remote: "127.0.0.1:51234".parse().unwrap(),
        client: "127.0.0.1".parse().unwrap(),
        user_agent: Some(http::HeaderValue::from_static("curl/8.5.0")),
        referer: None,
        trace_id,
        arrived: std::time::Instant::now(),
        status: 200,
        trigger: tern::trigger::Trigger::Request,
    }
}

fn access_line(c: &mut Criterion) {
    let mut group = c.benchmark_group("access_line");
    let traced = *b"4bf92f3577b34da6a3ce929d0e0e4736";
    let tenant: std::sync::Arc<dyn logwriter::Named> = std::sync::Arc::new(Hello);
    let proto = record(None);
    for (name, filter, json, trace_id) in [
        ("text", "info", false, None),
        ("text_traced", "info", false, Some(traced)),
        ("json", "info", true, None),
        ("off", "info,tern::access=off", false, None),
    ] {
        let (writer, _flush) = logwriter::start(std::io::sink());
        let subscriber = logwriter::subscriber(filter, json, false, writer).expect("filter");
        tracing::subscriber::with_default(subscriber, || {
            group.bench_function(name, |b| {
                b.iter(|| {
                    // What a request pays: the check; when lines are on, the record gathered
                    // from the request (clones of its parts), the body wrapped, sent and
                    // dropped, which writes the line.
                    if logwriter::access_enabled() {
                        let p = black_box(&proto);
                        let r = logwriter::AccessRecord {
                            request_id: p.request_id.clone(),
                            tenant: Some(tenant.clone()),
                            method: p.method.clone(),
                            target: p.target.clone(),
                            with_query: p.with_query,
                            version: p.version,
                            host: p.host.clone(),
                            remote: p.remote,
                            client: p.client,
                            user_agent: p.user_agent.clone(),
                            referer: p.referer.clone(),
                            trace_id,
                            arrived: p.arrived,
                            status: p.status,
                            trigger: p.trigger,
                        };
                        let mut body = tern::body::ResponseBody::full(&b"Hello from Tern!\n"[..])
                            .logged(r, false);
                        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
                        let frame =
                            http_body::Body::poll_frame(std::pin::Pin::new(&mut body), &mut cx);
                        let _ = black_box(frame);
                        drop(body);
                    }
                });
            });
        });
    }
    group.finish();
}

fn server_timing(c: &mut Criterion) {
    use tern::metrics::{Phase, Timings};
    let mut t = Timings::default();
    for (phase, us) in [
        (Phase::Route, 1),
        (Phase::Queue, 0),
        (Phase::Instantiate, 4),
        (Phase::Run, 2),
        (Phase::Teardown, 1),
    ] {
        t.set(phase, Duration::from_nanos(us * 1_000 + 317));
    }
    c.bench_function("server_timing", |b| {
        b.iter(|| {
            black_box(&t).server_timing(black_box(Duration::from_micros(9)), Phase::Teardown, None)
        });
    });
}

criterion_group!(benches, access_line, server_timing);
criterion_main!(benches);
