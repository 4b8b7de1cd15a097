//! Per-phase latency of one guest, without HTTP: instantiate, run and tear down a module N times
//! on one thread and print p50/p90/p99 of each phase.
//!
//! ```sh
//! cargo run --release -p tern --example phases -- GUEST.wasm|GUEST.wat [REQUESTS] [KEY=VALUE ...]
//! cargo run --release -p tern --example phases -- builtin:hello 200000 memory_keep_resident_kib=128
//! ```
//!
//! `KEY=VALUE` sets a `[pool]` setting (docs/configuration.md), so reset settings can be compared
//! for a given guest. Useful to see what a guest costs per request before deploying it.
//!
//! `--evict=KIB` writes a buffer of that many KiB between requests, as a server's own work
//! (the kernel's TCP, hyper, the records) does between two guests: the lifecycle then runs with
//! its data evicted from the caches, as it does in a server under load
//! (`loadtest/results/pgo.md`, "Why").

use std::path::Path;
use std::time::{Duration, Instant};

use tern::config::Config;

#[path = "../benches/support/mod.rs"]
mod support;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let Some(module) = args.next() else {
        anyhow::bail!(
            "usage: phases GUEST.wasm|GUEST.wat|builtin:NAME [REQUESTS] [POOL_KEY=VALUE ...] [--evict=KIB]"
        );
    };
    let mut requests = 100_000usize;
    // The server's `[pool]` defaults, so the reset (decommit batches, keep-resident sizes) is the
    // one a request gets in `tern serve`.
    let mut pool_toml = String::from("[pool]\n");
    let mut evict = Vec::new();
    for a in args {
        if let Some(kib) = a.strip_prefix("--evict=") {
            evict = vec![0u8; kib.parse::<usize>()? * 1024];
            continue;
        }
        match a.split_once('=') {
            Some((k, v)) => pool_toml.push_str(&format!("{k} = {v}\n")),
            None => requests = a.parse()?,
        }
    }
    let wasm = match module.strip_prefix("builtin:") {
        Some(name) => tern::demo::module(name)
            .ok_or_else(|| anyhow::anyhow!("no builtin {name}"))?
            .to_vec(),
        None if module.ends_with(".wat") => wat::parse_file(&module)?,
        None => std::fs::read(&module)?,
    };
    let pool = Config::parse(&pool_toml, "phases.toml", Path::new(".").to_path_buf())?.pool;
    let harness = support::Harness::new(pool)?;
    let cache = tempfile::tempdir()?;
    let tenant = harness.tenant("probe", &wasm, cache.path())?;

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut samples: [Vec<Duration>; 4] = Default::default();
    rt.block_on(async {
        for i in 0..requests + requests / 10 {
            // One write per cache line: the lines are dirty, so evicting them costs as a
            // server's own dirty data does.
            for line in evict.chunks_mut(64) {
                line[0] = line[0].wrapping_add(1);
            }
            std::hint::black_box(&mut evict);
            let start = Instant::now();
            let out = support::request(&tenant).await;
            let total = start.elapsed();
            if let Err(e) = &out.result {
                anyhow::bail!("guest failed: {e}");
            }
            if i >= requests / 10 {
                // The first tenth warms the pool and caches.
                for (s, d) in samples.iter_mut().zip([
                    out.phases.instantiate,
                    out.phases.run,
                    out.phases.teardown,
                    total,
                ]) {
                    s.push(d);
                }
            }
        }
        Ok(())
    })?;
    println!(
        "{requests} requests of {module} ({} bytes){}",
        wasm.len(),
        if evict.is_empty() {
            String::new()
        } else {
            format!(", {} KiB written between requests", evict.len() / 1024)
        }
    );
    // The mean next to the quantiles: a reset batched over many requests (one `madvise` call for
    // 16 freed slots) shows in the p90 and the mean, not in the p50.
    println!(
        "{:<12} {:>9} {:>9} {:>9} {:>9}",
        "phase", "p50", "p90", "p99", "mean"
    );
    for (name, s) in ["instantiate", "run", "teardown", "total"]
        .iter()
        .zip(samples.iter_mut())
    {
        s.sort_unstable();
        let q = |p: f64| s[((s.len() as f64 * p) as usize).min(s.len() - 1)].as_secs_f64() * 1e6;
        let mean = s.iter().sum::<Duration>().as_secs_f64() * 1e6 / s.len() as f64;
        println!(
            "{name:<12} {:>7.2}µs {:>7.2}µs {:>7.2}µs {:>7.2}µs",
            q(0.5),
            q(0.9),
            q(0.99),
            mean
        );
    }
    Ok(())
}
