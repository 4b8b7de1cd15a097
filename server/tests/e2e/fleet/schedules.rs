//! Scheduled runs in a fleet, on a simulated clock every replica reads
//! (`TERN_SCHEDULE_CLOCK=file:...`): each tick runs once across three replicas; a holder
//! killed mid-run loses its tick, which runs once more elsewhere after the lease (never
//! within it), and the next tick runs once.

use std::path::Path;
use std::time::{Duration, Instant};

use http::Method;

use super::{FLEET_TOKEN, REGISTRY, S3, admin, metrics};
use crate::support::{TernProcess, test_guest};

/// 2025-12-01T00:00:00Z in Unix milliseconds.
const MIDNIGHT: i64 = 1_764_547_200_000;

/// Sets the simulated clock in `file` to `ms`.
fn set_clock(file: &Path, ms: i64) {
    let tmp = file.with_extension("tmp");
    std::fs::write(&tmp, ms.to_string()).unwrap();
    std::fs::rename(&tmp, file).unwrap();
}

/// A replica named `name` of the fleet on `s3` (data in `dir`), on the simulated clock `clock`.
fn clocked(s3: &S3, name: &str, dir: &Path, clock: &Path) -> TernProcess {
    clocked_via(s3, None, name, dir, clock)
}

/// [`clocked`], reaching S3 at `endpoint` (a proxy in front of it) when given.
fn clocked_via(
    s3: &S3,
    endpoint: Option<&str>,
    name: &str,
    dir: &Path,
    clock: &Path,
) -> TernProcess {
    std::fs::create_dir_all(dir).unwrap();
    let config = dir.join("tern.toml");
    std::fs::write(
        &config,
        "[pool]\ninstances = 16\nmax_memory_mib = 64\n[registry]\npoll_interval_ms = 100\n",
    )
    .unwrap();
    let config = config.display().to_string();
    let clock = format!("file:{}", clock.display());
    TernProcess::serve_with(&["--config", &config, "--registry", REGISTRY], dir, |cmd| {
        s3.env(cmd);
        cmd.env("TERN_ADMIN_TOKEN", FLEET_TOKEN)
            .env("TERN_REPLICA", name)
            .env("TERN_SCHEDULE_CLOCK", &clock);
        if let Some(endpoint) = endpoint {
            cmd.env("AWS_ENDPOINT_URL", endpoint);
        }
    })
}

/// Waits until `r`'s runner has seen `job`'s schedule (before the clock moves on).
async fn watching(r: &TernProcess) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, v) = admin(r, Method::GET, "/admin/v1/tenants/job/schedules", "").await;
        if v["schedules"][0]["watched_here"] == true {
            break;
        }
        assert!(Instant::now() < deadline, "{v}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Tenant `job` (the schedule probe at `/job`, its module written into `root`) with
/// `schedule`, deployed through `r`.
async fn deploy_job(r: &TernProcess, root: &Path, schedule: serde_json::Value) {
    let spec = serde_json::json!({ "paths": ["/job"], "kv": ["default"], "schedule": [schedule] });
    let (status, v) = admin(r, Method::PUT, "/admin/v1/tenants/job", spec.to_string()).await;
    assert!(status.is_success(), "{status} {v}");
    let wasm = std::fs::read(test_guest(root, "schedule_probe")).unwrap();
    let (status, v) = admin(r, Method::PUT, "/admin/v1/tenants/job/module", wasm).await;
    assert!(status.is_success(), "{status} {v}");
}

/// Three replicas on a simulated clock at `start`, with tenant `job` (the schedule probe at
/// `/job`) and its `schedule` deployed through the first and served by all.
async fn fleet_with(
    s3: &S3,
    root: &Path,
    start: i64,
    schedule: serde_json::Value,
) -> (Vec<TernProcess>, std::path::PathBuf) {
    let clock = root.join("clock");
    set_clock(&clock, start);
    let replicas: Vec<TernProcess> = ["a", "b", "c"]
        .iter()
        .map(|n| clocked(s3, n, &root.join(n), &clock))
        .collect();
    deploy_job(&replicas[0], root, schedule).await;
    for r in &replicas {
        super::serves(r, "/job", "").await;
        watching(r).await;
    }
    (replicas, clock)
}

/// The runs of tenant `job` each replica counts with `outcome`, summed.
async fn counted(replicas: &[&TernProcess], outcome: &str) -> f64 {
    let series = format!("tern_schedule_runs_total{{outcome=\"{outcome}\",tenant=\"job\"}}");
    let mut sum = 0.0;
    for r in replicas {
        sum += crate::schedules::series(&metrics(r).await, &series);
    }
    sum
}

/// The ledger's runs of `job`'s one schedule, newest first, as `r` lists them.
async fn runs(r: &TernProcess) -> Vec<serde_json::Value> {
    let (status, v) = admin(r, Method::GET, "/admin/v1/tenants/job/schedules", "").await;
    assert!(status.is_success(), "{status} {v}");
    assert!(v["schedules"][0]["runs_error"].is_null(), "{v}");
    v["schedules"][0]["runs"].as_array().unwrap().clone()
}

/// Waits until `done` holds of `r`'s listing of the runs (panics after 20 s, saying `what`).
async fn wait_runs(
    r: &TernProcess,
    what: &str,
    done: impl Fn(&[serde_json::Value]) -> bool,
) -> Vec<serde_json::Value> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let runs = runs(r).await;
        if done(&runs) {
            return runs;
        }
        assert!(Instant::now() < deadline, "{what}: {runs:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Moves the simulated clock `clock` to half past minutes 1 to `minutes` in turn, waiting each
/// time until `all` have counted one `ok` run per minute so far between them (never more).
async fn each_minute_runs_once(clock: &Path, all: &[&TernProcess], minutes: i64) {
    for minute in 1..=minutes {
        set_clock(clock, MIDNIGHT + minute * 60_000 + 30_000);
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let ran = counted(all, "ok").await;
            assert!(ran <= minute as f64, "minute {minute}: {ran} runs");
            if ran == minute as f64 {
                break;
            }
            assert!(Instant::now() < deadline, "minute {minute}: {ran} runs");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Tick `minute` (minutes after midnight) as the ledger writes it.
fn tick(minute: i64) -> String {
    let t = chrono::DateTime::from_timestamp_millis(MIDNIGHT + minute * 60_000).unwrap();
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_tick_runs_once_across_three_replicas_over_sixty_simulated_minutes() {
    let s3 = S3::start();
    let root = tempfile::tempdir().unwrap();
    let schedule = serde_json::json!({ "cron": "* * * * *", "path": "/job/tick" });
    let (replicas, clock) = fleet_with(&s3, root.path(), MIDNIGHT + 30_000, schedule).await;
    let all: Vec<&TernProcess> = replicas.iter().collect();
    each_minute_runs_once(&clock, &all, 60).await;
    // Nothing more comes late, and no tick was skipped or missed.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(counted(&all, "ok").await, 60.0);
    for outcome in ["failed", "skipped", "missed", "lost"] {
        assert_eq!(counted(&all, outcome).await, 0.0, "{outcome}");
    }
    // The ledger (its last 20 runs) on any replica: one run per minute, each the first
    // attempt, all ended.
    for r in &replicas {
        let runs = runs(r).await;
        let ticks: Vec<&str> = runs.iter().map(|r| r["tick"].as_str().unwrap()).collect();
        let want: Vec<String> = (41..=60).rev().map(tick).collect();
        assert_eq!(ticks, want, "{runs:#?}");
        for run in &runs {
            assert_eq!(
                (run["state"].as_str(), run["attempt"].as_u64()),
                (Some("ok"), Some(1))
            );
        }
    }
    // Deleted, the tenant's runs leave its ledger (the object stays, empty: removing it
    // would not be conditional): made again with the same schedule, it starts with no runs.
    let (status, v) = admin(&replicas[0], Method::DELETE, "/admin/v1/tenants/job", "").await;
    assert!(status.is_success(), "{status} {v}");
    let ledgers = super::walk(&s3.root.path().join("fleet/registry/schedules/job"));
    assert_eq!(ledgers.len(), 1, "{ledgers:?}");
    let ledger: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&ledgers[0]).unwrap()).unwrap();
    assert!(
        ledger["runs"] == serde_json::json!([]) && ledger.get("others").is_none(),
        "{ledger}"
    );
    let schedule = serde_json::json!({ "cron": "* * * * *", "path": "/job/tick" });
    deploy_job(&replicas[0], root.path(), schedule).await;
    let runs = runs(&replicas[0]).await;
    assert!(runs.is_empty(), "{runs:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_killed_mid_run_loses_its_tick_which_runs_once_more_after_its_lease() {
    let s3 = S3::start();
    let root = tempfile::tempdir().unwrap();
    // Each run sleeps 3 s (real time); its lease: 4 × 5 s (time limit) + 1 s (the wait for a
    // slot) + 5 s = 26 s of the simulated clock.
    let schedule = serde_json::json!({
        "cron": "* * * * *",
        "path": "/job/slow?sleep_ms=3000",
        "timeout_ms": 5000,
    });
    let (mut replicas, clock) = fleet_with(&s3, root.path(), MIDNIGHT + 1000, schedule).await;
    set_clock(&clock, MIDNIGHT + 61_000);
    let first = wait_runs(&replicas[0], "tick 1 running", |r| {
        r.first().is_some_and(|r| r["state"] == "running")
    })
    .await;
    assert_eq!(first[0]["tick"], tick(1));
    let holder = first[0]["replica"].as_str().unwrap().to_string();
    let i = ["a", "b", "c"].iter().position(|n| *n == holder).unwrap();
    let mut dead = replicas.remove(i);
    dead.child.kill().unwrap();
    dead.child.wait().unwrap();
    let alive: Vec<&TernProcess> = replicas.iter().collect();
    // Within the lease nobody takes the tick again.
    set_clock(&clock, MIDNIGHT + 80_000);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let within = runs(alive[0]).await;
    assert_eq!(within.len(), 1, "{within:#?}");
    assert_eq!(within[0]["state"], "running");
    // After it (61 s + 26 s, and the 1 s margin), once more, elsewhere.
    set_clock(&clock, MIDNIGHT + 90_000);
    let after = wait_runs(alive[0], "tick 1 run again", |r| {
        r.first()
            .is_some_and(|r| r["attempt"] == 2 && r["state"] == "ok")
    })
    .await;
    assert_eq!(after.len(), 2, "{after:#?}");
    assert_eq!(after[0]["tick"], tick(1));
    assert_eq!(
        (after[1]["state"].as_str(), after[1]["attempt"].as_u64()),
        (Some("lost"), Some(1))
    );
    // The next tick runs once.
    set_clock(&clock, MIDNIGHT + 121_000);
    let next = wait_runs(alive[0], "tick 2", |r| {
        r.first()
            .is_some_and(|r| r["tick"] == tick(2) && r["state"] == "ok")
    })
    .await;
    assert_eq!(next.len(), 3, "{next:#?}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(runs(alive[1]).await.len(), 3);
    assert_eq!(counted(&alive, "ok").await, 2.0);
    // The lost run is counted once, by the replica that ran its tick again.
    assert_eq!(counted(&alive, "lost").await, 1.0);
}

/// A replica that has not seen tenant `job` deleted and made again under its name (b, its
/// reads of the registry's index failing) goes on running the old one's schedule, beside two
/// replicas (a and c) running the new one's: each tenant runs tick 2 once (the new one on a
/// or c, the old one on b), and each lists only its own runs. Once b catches up, tick 3 runs
/// once across the three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_made_again_runs_its_ticks_beside_a_replica_behind_on_the_old_one() {
    let s3 = S3::start();
    let root = tempfile::tempdir().unwrap();
    let proxy = crate::faults::S3Proxy::start(&s3.endpoint).await;
    let clock = root.path().join("clock");
    set_clock(&clock, MIDNIGHT + 30_000);
    let a = clocked(&s3, "a", &root.path().join("a"), &clock);
    let c = clocked(&s3, "c", &root.path().join("c"), &clock);
    let b = clocked_via(
        &s3,
        Some(&proxy.endpoint),
        "b",
        &root.path().join("b"),
        &clock,
    );
    let all = [&a, &b, &c];
    let schedule = serde_json::json!({ "cron": "* * * * *", "path": "/job/tick" });
    deploy_job(&a, root.path(), schedule.clone()).await;
    for r in all {
        super::serves(r, "/job", "").await;
        watching(r).await;
    }
    each_minute_runs_once(&clock, &all, 1).await;

    // b misses the delete and the tenant made again on a.
    proxy.fail_reads(&["/index.json"]);
    let (status, v) = admin(&a, Method::DELETE, "/admin/v1/tenants/job", "").await;
    assert!(status.is_success(), "{status} {v}");
    deploy_job(&a, root.path(), schedule).await;
    let changed = async |r: &TernProcess| {
        let series = r#"tern_registry_syncs_total{outcome="changed"}"#;
        crate::support::metric_value(&metrics(r).await, series)
    };
    // c applies it (the delete and the create: its runner watches the new job's schedule).
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, v) = admin(&c, Method::GET, "/admin/v1/tenants/job/schedules", "").await;
        if status.is_success() && v["schedules"][0]["runs"] == serde_json::json!([]) {
            break;
        }
        assert!(Instant::now() < deadline, "c never served the new job: {v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    watching(&a).await;
    watching(&c).await;
    // (b reads the index after the change: its next poll.)
    let failed = proxy.failed_reads();
    let deadline = Instant::now() + Duration::from_secs(20);
    while proxy.failed_reads() <= failed {
        assert!(Instant::now() < deadline, "b never read the index again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let count = async || (counted(&[&a, &c], "ok").await, counted(&[&b], "ok").await);
    let before = count().await;
    set_clock(&clock, MIDNIGHT + 2 * 60_000 + 30_000);
    let want = (before.0 + 1.0, before.1 + 1.0);
    let deadline = Instant::now() + Duration::from_secs(20);
    while count().await != want {
        let now = count().await;
        assert!(
            Instant::now() < deadline && now.0 <= want.0 && now.1 <= want.1,
            "tick 2 runs once on a or c (the new job) and once on b (the old one): \
             {before:?} -> {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(count().await, want, "once each");
    let new = runs(&a).await;
    assert_eq!(new.len(), 1, "the new job's runs: {new:#?}");
    assert!(
        new[0]["tick"] == tick(2) && new[0]["state"] == "ok" && new[0]["replica"] != "b",
        "{new:#?}"
    );
    let old = runs(&b).await;
    assert!(
        old[0]["tick"] == tick(2) && old[0]["replica"] == "b",
        "the old job's runs, as b lists them: {old:#?}"
    );

    // b catches up: tick 3 runs once across the three, and the new job lists it.
    let read = changed(&b).await;
    proxy.heal();
    let deadline = Instant::now() + Duration::from_secs(20);
    while changed(&b).await <= read {
        assert!(Instant::now() < deadline, "b never caught up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    watching(&b).await;
    let before = counted(&all, "ok").await;
    set_clock(&clock, MIDNIGHT + 3 * 60_000 + 30_000);
    let listed = wait_runs(&a, "tick 3", |r| {
        r.first()
            .is_some_and(|r| r["tick"] == tick(3) && r["state"] == "ok")
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(counted(&all, "ok").await, before + 1.0);
    let ticks: Vec<&str> = listed.iter().map(|r| r["tick"].as_str().unwrap()).collect();
    assert_eq!(ticks, [tick(3), tick(2)], "{listed:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_out_for_two_minutes_misses_its_ticks_and_no_burst_follows() {
    let mut s3 = S3::start();
    let root = tempfile::tempdir().unwrap();
    let schedule = serde_json::json!({ "cron": "* * * * *", "path": "/job/tick" });
    let (replicas, clock) = fleet_with(&s3, root.path(), MIDNIGHT + 1000, schedule).await;
    let all: Vec<&TernProcess> = replicas.iter().collect();
    // The registry goes away for ticks 1 and 2: every replica tries each until the next.
    s3.stop();
    set_clock(&clock, MIDNIGHT + 61_000);
    tokio::time::sleep(Duration::from_secs(3)).await;
    set_clock(&clock, MIDNIGHT + 121_000);
    // Tick 1's time is over: missed, by every replica (none could take it).
    let deadline = Instant::now() + Duration::from_secs(20);
    while counted(&all, "missed").await < 3.0 {
        assert!(
            Instant::now() < deadline,
            "tick 1 never counted missed on all three"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Back before tick 2's time is over: tick 2 runs once, late; tick 1 never.
    s3.restart();
    let runs2 = wait_runs(all[0], "tick 2 run late", |r| {
        r.iter().any(|r| r["tick"] == tick(2) && r["state"] == "ok")
    })
    .await;
    set_clock(&clock, MIDNIGHT + 181_000);
    let after = wait_runs(all[0], "tick 3", |r| {
        r.first()
            .is_some_and(|r| r["tick"] == tick(3) && r["state"] == "ok")
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let ticks: Vec<&str> = after.iter().map(|r| r["tick"].as_str().unwrap()).collect();
    assert_eq!(ticks, [tick(3), tick(2)], "{runs2:#?} {after:#?}");
    assert_eq!(counted(&all, "ok").await, 2.0);
    assert_eq!(counted(&all, "missed").await, 3.0);
}

/// Servers that share no registry but a Redis store for their schedules' ledgers
/// (`server.schedule_store`), each with the same config file: each tick of `* * * * *` over 20
/// simulated minutes runs once across the three (each alone would run every tick), and each
/// lists the same ledger, read from Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_sharing_a_redis_store_run_each_tick_once() {
    let redis = crate::kv::Redis::start();
    let root = tempfile::tempdir().unwrap();
    let clock = root.path().join("clock");
    set_clock(&clock, MIDNIGHT + 30_000);
    let replicas: Vec<TernProcess> = ["a", "b", "c"]
        .iter()
        .map(|name| {
            let dir = root.path().join(name);
            std::fs::create_dir_all(&dir).unwrap();
            test_guest(&dir, "schedule_probe");
            let config = dir.join("tern.toml");
            std::fs::write(
                &config,
                format!(
                    "[server]\nschedule_store = \"fleet\"\n\
                     [pool]\ninstances = 16\nmax_memory_mib = 64\n\
                     [kv.fleet]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:{}\"\n\
                     [[tenant]]\nname = \"job\"\nmodule = \"schedule_probe.wasm\"\n\
                     paths = [\"/job\"]\nkv = [\"default\"]\n\
                     [[tenant.schedule]]\ncron = \"* * * * *\"\npath = \"/job/tick\"\n",
                    redis.port
                ),
            )
            .unwrap();
            let clock = format!("file:{}", clock.display());
            let config = config.display().to_string();
            TernProcess::serve_with(&["--config", &config], &dir, |cmd| {
                cmd.env("TERN_ADMIN_TOKEN", FLEET_TOKEN)
                    .env("TERN_REPLICA", name)
                    .env("TERN_SCHEDULE_CLOCK", &clock);
            })
        })
        .collect();
    let all: Vec<&TernProcess> = replicas.iter().collect();
    for r in &all {
        watching(r).await;
    }
    each_minute_runs_once(&clock, &all, 20).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(counted(&all, "ok").await, 20.0);
    for outcome in ["failed", "skipped", "missed", "lost"] {
        assert_eq!(counted(&all, outcome).await, 0.0, "{outcome}");
    }
    let want: Vec<String> = (1..=20).rev().map(tick).collect();
    for r in &all {
        let runs = runs(r).await;
        let ticks: Vec<&str> = runs.iter().map(|r| r["tick"].as_str().unwrap()).collect();
        assert_eq!(ticks, want, "{runs:#?}");
        assert!(
            runs.iter().all(|r| r["state"] == "ok" && r["attempt"] == 1),
            "{runs:#?}"
        );
    }
}
