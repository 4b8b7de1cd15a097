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

fn access_line(c: &mut Criterion) {
    let mut group = c.benchmark_group("access_line");
    for (name, filter, json, trace_id) in [
        ("text", "info", false, None),
        (
            "text_traced",
            "info",
            false,
            Some("4bf92f3577b34da6a3ce929d0e0e4736"),
        ),
        ("json", "info", true, None),
        ("off", "info,tern::access=off", false, None),
    ] {
        let (writer, _flush) = logwriter::start(std::io::sink());
        let subscriber = logwriter::subscriber(filter, json, false, writer).expect("filter");
        tracing::subscriber::with_default(subscriber, || {
            group.bench_function(name, |b| {
                b.iter(|| {
                    logwriter::access(
                        black_box("0193a1b2c3d4e5f6a7b8c9d0e1f2a3b4"),
                        black_box("hello"),
                        black_box(200),
                        black_box(Duration::from_micros(1_234)),
                        black_box(trace_id),
                    );
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
            black_box(&t).server_timing(black_box(Duration::from_micros(9)), Phase::Teardown)
        });
    });
}

criterion_group!(benches, access_line, server_timing);
criterion_main!(benches);
