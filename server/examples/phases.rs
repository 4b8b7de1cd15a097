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

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{HeaderMap, HeaderValue, Method, Uri};
use tern::config::Config;
use tern::execute::{self, RunOutput};
use tern::hostcalls::{self, GuestRequest, RequestBody};
use tern::metrics::Metrics;
use tern::tenant::{self, TenantRef};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let Some(module) = args.next() else {
        anyhow::bail!("usage: phases GUEST.wasm|builtin:NAME [REQUESTS] [POOL_KEY=VALUE ...]");
    };
    let mut requests = 100_000usize;
    let mut pool_toml = String::from("[pool]\ninstances = 4\n");
    for a in args {
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
    let toml = format!("{pool_toml}[[tenant]]\nname = \"probe\"\nmodule = \"x.wasm\"\n");
    let config = Config::parse(&toml, "phases.toml", Path::new(".").to_path_buf())?;
    let engine = tern::engine::build(&config.pool)?;
    let _ticker = tern::engine::EpochTicker::start(&engine);
    let linkers = hostcalls::Linkers::new(&engine)?;
    let metrics = Metrics::new(1000);
    let cache = std::env::temp_dir().join(format!("tern-phases-{}", std::process::id()));
    std::fs::create_dir_all(&cache)?;
    let loaded = tern::artifact::load_wasm(&engine, &wasm, "probe", &cache);
    let _ = std::fs::remove_dir_all(&cache);
    let tenant: TenantRef = Arc::new(tenant::prepare(
        &linkers,
        &loaded?.module,
        &config.tenants[0],
        tenant::Origin::Config,
        None,
        Default::default(),
        &config.pool,
        &metrics,
    )?);

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut samples: [Vec<Duration>; 4] = Default::default();
    rt.block_on(async {
        for i in 0..requests + requests / 10 {
            let start = Instant::now();
            let out = request(&tenant).await;
            let total = start.elapsed();
            if let Err(e) = &out.result {
                anyhow::bail!("guest failed: {e}");
            }
            if i >= requests / 10 {
                // The first tenth warms the pool and caches.
                for (s, d) in
                    samples
                        .iter_mut()
                        .zip([out.instantiate, out.run, out.teardown, total])
                {
                    s.push(d);
                }
            }
        }
        Ok(())
    })?;
    println!("{requests} requests of {module} ({} bytes)", wasm.len());
    println!("{:<12} {:>9} {:>9} {:>9}", "phase", "p50", "p90", "p99");
    for (name, s) in ["instantiate", "run", "teardown", "total"]
        .iter()
        .zip(samples.iter_mut())
    {
        s.sort_unstable();
        let q = |p: f64| s[((s.len() as f64 * p) as usize).min(s.len() - 1)].as_secs_f64() * 1e6;
        println!(
            "{name:<12} {:>7.2}µs {:>7.2}µs {:>7.2}µs",
            q(0.5),
            q(0.9),
            q(0.99)
        );
    }
    Ok(())
}

async fn request(tenant: &TenantRef) -> RunOutput {
    let req = GuestRequest::new(
        Method::GET,
        Uri::from_static("/"),
        HeaderMap::new(),
        RequestBody::Empty,
        u64::MAX,
    );
    let (commit, _head) = tokio::sync::oneshot::channel();
    execute::run(
        tenant.clone(),
        req,
        commit,
        HeaderValue::from_static("probe"),
    )
    .await
}
