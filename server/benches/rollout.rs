//! What a gradual deployment adds to a request of its tenant: the split (the key read from the
//! request, hashed into its bucket) and the judge's count of the answer. The rest of its cost
//! is a branch and the candidate's reference taken with the tenant's (measured under load by
//! `bash loadtest/bench.sh rollout`, next to the same tenant with one version).
//!
//! Run: `cargo bench -p tern --bench rollout`.

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};

use criterion::{Criterion, criterion_group, criterion_main};
use http::{HeaderMap, HeaderValue};
use tern::rollout::{Judge, Key, Plan, Role, Split};

/// A request's headers as a browser sends them, with a user header and a session cookie.
fn headers() -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in [
        ("host", "shop.example.com"),
        (
            "user-agent",
            "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0",
        ),
        (
            "accept",
            "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
        ),
        ("accept-language", "en-GB,en;q=0.5"),
        ("accept-encoding", "gzip, deflate, br, zstd"),
        ("x-user", "3f2a9c1be07d4411"),
        (
            "cookie",
            "theme=dark; session=8d6f0c2a91e34b7f9a0c1d2e3f4a5b6c; consent=1",
        ),
    ] {
        h.insert(k, HeaderValue::from_static(v));
    }
    h
}

fn split(key: &str) -> Split {
    let mut plan = Plan::new(Some(5000), Vec::new(), 0).expect("a plan");
    plan.key = Key::parse(key).expect("a key");
    Split::new(
        "shop",
        "2a67179b0dce0d100568a24b0862b401f47429bac0fb0ac590ab5eceeed51297",
        &plan,
    )
    .expect("a split")
}

fn rollout(c: &mut Criterion) {
    let h = headers();
    let client = IpAddr::V4(Ipv4Addr::new(203, 0, 113, 7));
    for key in ["client", "header:x-user", "cookie:session"] {
        let s = split(key);
        c.bench_function(&format!("split/{key}"), |b| {
            b.iter(|| black_box(&s).role(black_box(&h), black_box(client)))
        });
    }
    let judge = Judge::default();
    c.bench_function("judge/count", |b| {
        b.iter(|| judge.count(black_box(Role::Candidate), black_box(200)))
    });
}

criterion_group!(benches, rollout);
criterion_main!(benches);
