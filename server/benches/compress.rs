//! What compression costs per response and what it saves, by encoding and level: the bodies of
//! `bash loadtest/bench.sh compression` (a ~20 KB JSON list of records and a ~200 KB HTML page,
//! text drawn from a small vocabulary with a fixed seed), compressed whole as the edge does
//! (`compress::body::whole`). The ratio (plain / compressed bytes) is printed once per case;
//! criterion times each. Used to choose the default levels (`[tenant.compression]`).
//!
//! Run: `cargo bench -p tern --bench compress`.

use std::fmt::Write as _;
use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use tern::compress::Encoding;
use tern::compress::body::{Levels, whole};

const WORDS: [&str; 40] = [
    "edge", "server", "request", "tenant", "guest", "module", "cache", "header", "body", "stream",
    "compress", "answer", "client", "latency", "region", "instance", "memory", "table", "function",
    "handler", "route", "version", "deploy", "replica", "registry", "secret", "variable", "config",
    "metric", "trace", "the", "a", "of", "to", "and", "in", "is", "it", "for", "with",
];

/// A small seeded generator (the same bytes every run).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 33) as usize) % n
    }

    fn sentence(&mut self, words: usize) -> String {
        (0..words)
            .map(|_| WORDS[self.below(WORDS.len())])
            .collect::<Vec<_>>()
            .join(" ")
            + "."
    }
}

fn json(rng: &mut Rng) -> Vec<u8> {
    let mut out = String::from("[");
    let mut id = 100_000;
    while out.len() < 20_000 {
        let regions = ["eu-west", "us-east", "ap-south", "sa-east"];
        let words = 4 + rng.below(8);
        let _ = write!(
            out,
            "{{\"id\":{id},\"name\":\"user-{}\",\"email\":\"u{}@example.com\",\"active\":{},\
             \"score\":{}.{},\"region\":\"{}\",\"bio\":\"{}\"}},",
            rng.below(1_000_000),
            rng.below(1_000_000),
            rng.below(10) < 7,
            rng.below(1000),
            rng.below(1000),
            regions[rng.below(4)],
            rng.sentence(words),
        );
        id += 1;
    }
    out.pop();
    out.push(']');
    out.into_bytes()
}

fn html(rng: &mut Rng) -> Vec<u8> {
    let mut out = String::from("<!doctype html><html><head><title>News</title></head><body><main>");
    let mut n = 0;
    while out.len() < 200_000 {
        n += 1;
        let _ = write!(
            out,
            "<article id=\"a{n}\" class=\"story\"><h2><a href=\"/story/{n}\">{}</a></h2>",
            rng.sentence(6)
        );
        for _ in 0..2 + rng.below(3) {
            out.push_str("<p>");
            for _ in 0..2 + rng.below(4) {
                let words = 6 + rng.below(12);
                out.push_str(&rng.sentence(words));
                out.push(' ');
            }
            out.push_str("</p>");
        }
        out.push_str("</article>\n");
    }
    out.push_str("</main></body></html>\n");
    out.into_bytes()
}

fn bench(c: &mut Criterion) {
    let mut rng = Rng(2026);
    let bodies = [("json20k", json(&mut rng)), ("html200k", html(&mut rng))];
    let cases: [(Encoding, &[u32]); 3] = [
        (Encoding::Gzip, &[1, 2, 3, 4, 5, 6]),
        (Encoding::Br, &[1, 2, 3, 4, 5]),
        (Encoding::Zstd, &[1, 3, 6]),
    ];
    let mut group = c.benchmark_group("compress");
    group.measurement_time(Duration::from_secs(2));
    group.warm_up_time(Duration::from_millis(500));
    for (name, body) in &bodies {
        for (encoding, levels) in cases {
            for &level in levels {
                let l = Levels {
                    gzip: level,
                    brotli: level,
                    zstd: level,
                };
                let out = whole(body, encoding, l).expect("compresses");
                let id = format!("{name}/{}-{level}", encoding.token());
                eprintln!(
                    "{id}: {} -> {} bytes, ratio {:.2}",
                    body.len(),
                    out.len(),
                    body.len() as f64 / out.len() as f64
                );
                group.bench_function(&id, |b| b.iter(|| whole(black_box(body), encoding, l)));
            }
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
