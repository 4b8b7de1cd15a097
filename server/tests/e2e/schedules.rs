//! Scheduled runs on one server (`[[tenant.schedule]]`): the guest is called each tick with
//! the schedule's headers, a client cannot pose as the scheduler, runs by hand, the listing,
//! bad expressions refused at start and by the API, `overlap = "skip"`. (A fleet's: in
//! `fleet::schedules`.)

use std::time::{Duration, Instant};

use http::{Method, StatusCode};

use crate::support::{TestServer, post, test_guest};

/// The value of `series` in `metrics` (0 when absent: a counter family with no series yet is
/// not exposed at all).
pub fn series(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0.0)
}

/// A config with the schedule probe at `/probe` (its `default` store) and `schedules`
/// (`[[tenant.schedule]]` tables), the probe's module written into `dir`.
fn probe_config(dir: &std::path::Path, schedules: &str) -> String {
    test_guest(dir, "schedule_probe");
    format!(
        "[pool]\ninstances = 16\nmax_memory_mib = 64\n\
         [[tenant]]\nname = \"probe\"\nmodule = \"schedule_probe.wasm\"\npaths = [\"/probe\"]\n\
         kv = [\"default\"]\n{schedules}"
    )
}

/// A server with [`probe_config`].
async fn probe_server(schedules: &str) -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    let config = probe_config(dir.path(), schedules);
    TestServer::try_start_in(dir, &config)
        .await
        .unwrap_or_else(|e| panic!("server failed to start: {e:#}"))
}

/// A `tern serve` process of [`probe_config`] in `dir`, writing access lines.
fn probe_process(dir: &std::path::Path, schedules: &str) -> crate::support::TernProcess {
    let config = dir.join("tern.toml");
    std::fs::write(&config, probe_config(dir, schedules)).unwrap();
    crate::support::TernProcess::serve_with(
        &["--config", &config.display().to_string()],
        dir,
        |cmd| {
            cmd.env("TERN_LOG", "info,tern::access=info");
        },
    )
}

/// The runs the probe recorded, one line each.
async fn recorded(s: &TestServer) -> Vec<String> {
    let reply = s.get("/probe").await;
    assert_eq!(reply.status, StatusCode::OK);
    reply.text().lines().map(str::to_string).collect()
}

/// Waits until the probe recorded `n` runs (panics after 20 s).
async fn wait_runs(s: &TestServer, n: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let lines = recorded(s).await;
        if lines.len() >= n {
            return lines;
        }
        assert!(Instant::now() < deadline, "{n} runs never came: {lines:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_tick_calls_the_guest_once_with_the_schedules_headers() {
    let s = probe_server(
        "[[tenant.schedule]]\nname = \"every-second\"\ncron = \"* * * * * *\"\n\
         path = \"/probe/tick\"\nbody = \"payload\"\n",
    )
    .await;
    let lines = wait_runs(&s, 4).await;
    let mut ticks = Vec::new();
    for line in &lines {
        let f: Vec<&str> = line.split('|').collect();
        assert_eq!(
            (f[0], f[1], f[2], f[4]),
            ("/probe/tick", "* * * * * *", "every-second", "payload"),
            "{line}"
        );
        let t =
            chrono::DateTime::parse_from_rfc3339(f[3]).unwrap_or_else(|e| panic!("{line}: {e}"));
        ticks.push(t.timestamp());
    }
    // One run per tick: whole seconds, in order, none twice (a tick may be skipped while a
    // slow run still runs, so not necessarily one apart).
    for w in ticks.windows(2) {
        assert!(w[1] > w[0], "{lines:?}");
    }
    // Each is counted (once its end is recorded), with its lag from the tick.
    let ok = "tern_schedule_runs_total{outcome=\"ok\",tenant=\"probe\"}";
    let deadline = Instant::now() + Duration::from_secs(20);
    while series(&s.metrics().await, ok) < 4.0 {
        assert!(Instant::now() < deadline, "4 runs never counted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(series(&s.metrics().await, "tern_schedule_lag_seconds_count") >= 4.0);
    // The listing: the next five times, the last runs, newest first.
    let (status, v) = s
        .admin_call(Method::GET, "/admin/v1/tenants/probe/schedules", "")
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let sched = &v["schedules"][0];
    assert_eq!(sched["name"], "every-second");
    assert_eq!(sched["next"].as_array().unwrap().len(), 5);
    let runs = sched["runs"].as_array().unwrap();
    assert!(runs.len() >= 4, "{v}");
    assert_eq!(runs[1]["state"], "ok", "{v}");
    assert_eq!(runs[1]["status"], 200, "{v}");
    assert!(runs[0]["tick"].as_str() > runs[1]["tick"].as_str(), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cannot_pose_as_the_scheduler_and_a_run_by_hand_is_recorded() {
    let s = probe_server(
        "[[tenant.schedule]]\nname = \"yearly\"\ncron = \"0 0 1 1 *\"\npath = \"/probe/yearly\"\n",
    )
    .await;
    let headers = [
        ("tern-schedule", "forged"),
        ("tern-schedule-name", "forged"),
        ("tern-scheduled-time", "forged"),
    ];
    let r = post(&s, "/probe/client", &headers, b"x".to_vec()).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(recorded(&s).await, ["/probe/client|-|-|-|x"]);
    // By hand: run now, answered when it ends.
    let (status, v) = s
        .admin_call(
            Method::POST,
            "/admin/v1/tenants/probe/schedules/run",
            r#"{"schedule": "yearly"}"#,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["run"]["state"], "ok", "{v}");
    assert_eq!(v["run"]["status"], 200, "{v}");
    let lines = recorded(&s).await;
    assert!(
        lines[1].starts_with("/probe/yearly|0 0 1 1 *|yearly|"),
        "{lines:?}"
    );
    let (_, v) = s
        .admin_call(Method::GET, "/admin/v1/tenants/probe/schedules", "")
        .await;
    assert_eq!(v["schedules"][0]["runs"][0]["manual"], true, "{v}");
    let new_year = format!(
        "{}-01-01T00:00:00Z",
        chrono::Datelike::year(&chrono::Utc::now()) + 1
    );
    assert_eq!(v["schedules"][0]["next"][0], new_year.as_str(), "{v}");
    // Unknown schedule, tenant, body.
    for (path, body, want) in [
        (
            "/admin/v1/tenants/probe/schedules/run",
            r#"{"schedule": "nope"}"#,
            StatusCode::NOT_FOUND,
        ),
        (
            "/admin/v1/tenants/nope/schedules/run",
            r#"{"schedule": "yearly"}"#,
            StatusCode::NOT_FOUND,
        ),
        (
            "/admin/v1/tenants/probe/schedules/run",
            "{}",
            StatusCode::BAD_REQUEST,
        ),
    ] {
        let (status, v) = s.admin_call(Method::POST, path, body).await;
        assert_eq!(status, want, "{path} {body}: {v}");
    }
}

/// A scheduled run is counted, logged and kept in the live log as one: `trigger="schedule"` in
/// `tern_requests_total`, `trigger="schedule"` on its access line, `"trigger": "schedule"` in
/// its live log record (and `tern logs --trigger` selects by it); a client's request says
/// `request` or nothing.
#[test]
fn a_scheduled_run_is_counted_and_logged_as_one() {
    use crate::support::{ran, tern_bin};
    let dir = tempfile::tempdir().unwrap();
    let tern = probe_process(
        dir.path(),
        "[[tenant.schedule]]\nname = \"yearly\"\ncron = \"0 0 1 1 *\"\npath = \"/probe/yearly\"\n",
    );
    let tern_cli = |args: &[&str]| {
        let mut cmd = tern_bin();
        cmd.args(args)
            .args(["--server", &format!("http://{}", tern.admin)])
            .arg("--data-dir")
            .arg(dir.path().join("data"));
        String::from_utf8(ran(&mut cmd).stdout).unwrap()
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let addr: std::net::SocketAddr = tern.addr.parse().unwrap();
    let client = rt.block_on(crate::support::send(
        addr,
        Method::POST,
        "/probe/client",
        None,
        &[],
        bytes::Bytes::from_static(b"x"),
    ));
    assert_eq!(client.status, StatusCode::OK);
    let said = tern_cli(&["schedule", "run", "probe", "yearly"]);
    assert!(said.contains("ok"), "{said}");
    // Every tenant's schedules (only `probe` has some), its run by hand among them.
    let listed = tern_cli(&["schedule", "list"]);
    assert!(listed.starts_with("probe:\n"), "{listed}");
    assert!(
        listed.contains("yearly") && listed.contains("(by hand)"),
        "{listed}"
    );

    let series = |trigger: &str| {
        format!(
            "tern_requests_total{{deployment=\"current\",status=\"2xx\",tenant=\"probe\",\
             trigger=\"{trigger}\",version=\"1.1\"}}"
        )
    };
    tern.wait_metric(&series("schedule"), 1.0);
    let m = tern.metrics();
    assert_eq!(self::series(&m, &series("schedule")), 1.0, "{m}");
    assert_eq!(self::series(&m, &series("request")), 1.0, "{m}");

    let line = tern.wait_for("path=\"/probe/yearly\"");
    assert!(line.contains("trigger=\"schedule\""), "{line}");
    let line = tern
        .logged("path=\"/probe/client\"")
        .expect("the client's access line came first");
    assert!(!line.contains("trigger"), "{line}");

    let records = |trigger: &str| -> Vec<serde_json::Value> {
        tern_cli(&["logs", "probe", "--json", "--trigger", trigger])
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let scheduled = records("schedule");
    assert_eq!(scheduled.len(), 1, "{scheduled:?}");
    assert_eq!(scheduled[0]["path"], "/probe/yearly");
    assert_eq!(scheduled[0]["trigger"], "schedule");
    let requests = records("request");
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert_eq!(requests[0]["path"], "/probe/client");
    assert!(requests[0].get("trigger").is_none(), "{requests:?}");
}

/// SIGTERM while a scheduled run runs: the run ends and its end is recorded before the
/// process exits (the ledger in the data directory says `ok`, not `running`), and no tick is
/// taken after the signal.
#[test]
fn a_run_under_way_at_shutdown_ends_and_is_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let mut tern = probe_process(
        dir.path(),
        "[[tenant.schedule]]\ncron = \"* * * * * *\"\npath = \"/probe/slow?sleep_ms=2000\"\n\
         timeout_ms = 10000\n",
    );
    let ledger = dir.path().join("data/schedules.json");
    let runs = || -> Vec<serde_json::Value> {
        let Ok(bytes) = std::fs::read(&ledger) else {
            return Vec::new();
        };
        let all: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        let (_, one) = all.as_object().unwrap().iter().next().unwrap();
        one["runs"].as_array().unwrap().clone()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let tick = loop {
        if let Some(r) = runs().iter().find(|r| r["state"] == "running") {
            break r["tick_ms"].clone();
        }
        assert!(Instant::now() < deadline, "no run started: {:?}", runs());
        std::thread::sleep(Duration::from_millis(20));
    };
    let status = std::process::Command::new("kill")
        .args(["-TERM", &tern.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    // (Within the 10 s grace and a margin; a drain that never ends fails here.)
    let deadline = Instant::now() + Duration::from_secs(30);
    let exited = loop {
        if let Some(exited) = tern.child.try_wait().unwrap() {
            break exited;
        }
        assert!(
            Instant::now() < deadline,
            "still running 30 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(exited.success(), "{exited:?}");
    // The run seen running ended `ok` (ticks after it, if any, were skipped: it overlapped).
    let after = runs();
    let run = after
        .iter()
        .find(|r| r["tick_ms"] == tick)
        .unwrap_or_else(|| panic!("{after:#?}"));
    assert_eq!(run["state"], "ok", "{after:#?}");
    assert_eq!(run["status"], 200, "{after:#?}");
    assert!(!after.iter().any(|r| r["state"] == "running"), "{after:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_schedules_are_refused_at_start_and_by_the_api() {
    for (schedule, says) in [
        ("cron = \"61 * * * *\"\npath = \"/probe/x\"", "61"),
        ("cron = \"* * *\"\npath = \"/probe/x\"", "3 fields"),
        (
            "cron = \"* * * * *\"\npath = \"/elsewhere\"",
            "not under the tenant's paths",
        ),
        (
            "cron = \"* * * * *\"\npath = \"/probe\"\ntimezone = \"Nowhere/City\"",
            "Nowhere/City",
        ),
        (
            "cron = \"* * * * *\"\npath = \"/probe\"\noverlap = \"sometimes\"",
            "sometimes",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        test_guest(dir.path(), "schedule_probe");
        let config = format!(
            "[pool]\ninstances = 16\nmax_memory_mib = 64\n\
             [[tenant]]\nname = \"probe\"\nmodule = \"schedule_probe.wasm\"\n\
             paths = [\"/probe\"]\n[[tenant.schedule]]\n{schedule}\n"
        );
        let e = match TestServer::try_start_in(dir, &config).await {
            Ok(_) => panic!("started with {schedule}"),
            Err(e) => format!("{e:#}"),
        };
        assert!(e.contains(says), "{schedule}: {e}");
    }
    // Through the API: 400, and the tenant keeps its schedules.
    let s = probe_server("").await;
    let spec = serde_json::json!({
        "paths": ["/api"],
        "schedule": [{ "cron": "0 9 * * MON-FRI", "path": "/api/digest" }],
    });
    let (status, v) = s
        .admin_call(Method::PUT, "/admin/v1/tenants/api", spec.to_string())
        .await;
    assert!(status.is_success(), "{status} {v}");
    for bad in ["61 * * * *", "* * *"] {
        let patch = serde_json::json!({ "schedule": [{ "cron": bad, "path": "/api/x" }] });
        let (status, v) = s
            .admin_call(Method::PATCH, "/admin/v1/tenants/api", patch.to_string())
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {v}");
        assert!(v["error"].as_str().unwrap().contains(bad), "{v}");
    }
    let (_, v) = s.admin_call(Method::GET, "/admin/v1/tenants/api", "").await;
    assert_eq!(v["spec"]["schedule"][0]["cron"], "0 9 * * MON-FRI", "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlap_skip_never_runs_two_at_once_and_allow_does() {
    // Each run sleeps 2.5 s; the schedule ticks every second.
    let slow = |overlap: &str| {
        format!(
            "[[tenant.schedule]]\ncron = \"* * * * * *\"\npath = \"/probe/slow?sleep_ms=2500\"\n\
             timeout_ms = 10000\noverlap = \"{overlap}\"\n"
        )
    };
    let s = probe_server(&slow("skip")).await;
    let ok = "tern_schedule_runs_total{outcome=\"ok\",tenant=\"probe\"}";
    let deadline = Instant::now() + Duration::from_secs(20);
    while series(&s.metrics().await, ok) < 2.0 {
        assert!(Instant::now() < deadline, "two runs never ended");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let lines = recorded(&s).await;
    assert!(!lines.iter().any(|l| l == "OVERLAP"), "{lines:?}");
    let m = s.metrics().await;
    let skipped = series(
        &m,
        "tern_schedule_runs_total{outcome=\"skipped\",tenant=\"probe\"}",
    );
    assert!(skipped >= 2.0, "ticks within a run are skipped: {m}");
    // A run by hand while one runs is refused too (`409`). (Asked while the listing says a run
    // is running; a run may end between the two, so a few tries.)
    let mut refused = None;
    for _ in 0..20 {
        let (_, v) = s
            .admin_call(Method::GET, "/admin/v1/tenants/probe/schedules", "")
            .await;
        if v["schedules"][0]["runs"][0]["state"] != "running" {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        let name = v["schedules"][0]["name"].as_str().unwrap().to_string();
        let body = serde_json::json!({ "schedule": name }).to_string();
        let (status, v) = s
            .admin_call(Method::POST, "/admin/v1/tenants/probe/schedules/run", body)
            .await;
        if status == StatusCode::CONFLICT {
            refused = Some(v);
            break;
        }
        assert_eq!(status, StatusCode::OK, "{v}");
    }
    let refused = refused.expect("a run by hand while a run ran was never refused");
    assert!(
        refused["error"].as_str().unwrap().contains("overlap"),
        "{refused}"
    );
    assert!(!recorded(&s).await.iter().any(|l| l == "OVERLAP"));
    // The same guest with `allow`: runs overlap (so the check above can fail).
    let s = probe_server(&slow("allow")).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let lines = recorded(&s).await;
        if lines.iter().any(|l| l == "OVERLAP") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no overlap with allow: {lines:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A component that exports only Spin's `handle-cron-event` (`Ok`): runs on its schedules,
/// serves no request.
const CRON_ONLY: &str = r#"(component
    (core module $m
        (memory (export "memory") 1)
        (func (export "cron") (param i64) (result i32) (i32.const 0)))
    (core instance $i (instantiate $m))
    (type $metadata' (record (field "timestamp" u64)))
    (export $metadata "metadata" (type $metadata'))
    (type $error' (variant (case "other" string)))
    (export $error "error" (type $error'))
    (func $cron (param "metadata" $metadata) (result (result (error $error)))
        (canon lift (core func $i "cron") (memory (core memory $i "memory"))))
    (export "handle-cron-event" (func $cron)))"#;

/// Spin's cron export: a scheduled run of a component that exports `handle-cron-event` calls
/// it with the tick (Unix seconds) — the suite's component prints it — instead of its HTTP
/// handler, which still serves clients; the guest's `error` fails the run with its message; a
/// component with only the cron export runs on its schedule and answers clients `404`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_components_cron_export_is_called_on_its_schedule() {
    let dir = tempfile::tempdir().unwrap();
    crate::support::test_component(dir.path(), "component");
    std::fs::write(
        dir.path().join("cron_only.wasm"),
        wat::parse_str(CRON_ONLY).unwrap(),
    )
    .unwrap();
    let yearly = |path: &str| {
        format!("[[tenant.schedule]]\nname = \"yearly\"\ncron = \"0 0 1 1 *\"\npath = \"{path}\"\n")
    };
    let config = format!(
        "[pool]\ninstances = 16\nmax_memory_mib = 64\n\
         [[tenant]]\nname = \"comp\"\nmodule = \"component.wasm\"\npaths = [\"/comp\"]\n{}\
         [[tenant]]\nname = \"failing\"\nmodule = \"component.wasm\"\npaths = [\"/failing\"]\n\
         env = {{ CRON_FAIL = \"1\" }}\n{}\
         [[tenant]]\nname = \"cron\"\nmodule = \"cron_only.wasm\"\npaths = [\"/cron\"]\n{}",
        yearly("/comp/tick"),
        yearly("/failing/tick"),
        yearly("/cron/tick"),
    );
    let s = TestServer::try_start_in(dir, &config)
        .await
        .unwrap_or_else(|e| panic!("server failed to start: {e:#}"));
    let run = |tenant: &'static str| {
        let s = &s;
        async move {
            let (status, v) = s
                .admin_call(
                    Method::POST,
                    &format!("/admin/v1/tenants/{tenant}/schedules/run"),
                    r#"{"schedule": "yearly"}"#,
                )
                .await;
            assert_eq!(status, StatusCode::OK, "{tenant}: {v}");
            v["run"].clone()
        }
    };
    let record = |tenant: &'static str| {
        let s = &s;
        async move {
            let (status, v) = s
                .admin_call(
                    Method::GET,
                    &format!("/admin/v1/tenants/{tenant}/logs?trigger=schedule"),
                    "",
                )
                .await;
            assert_eq!(status, StatusCode::OK, "{tenant}: {v}");
            v
        }
    };
    let now = chrono::Utc::now().timestamp();

    // Both exports: the schedule calls the cron export with the tick, clients get HTTP.
    let ran = run("comp").await;
    assert_eq!(
        (ran["state"].as_str(), ran["status"].as_u64()),
        (Some("ok"), Some(200)),
        "{ran}"
    );
    let r = record("comp").await;
    let out = r["stdout"][0].as_str().unwrap_or_else(|| panic!("{r}"));
    let tick: i64 = out
        .strip_prefix("cron-event ")
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("{r}"));
    assert!((tick - now).abs() <= 5, "tick {tick}, now {now}: {r}");
    let hello = s.get("/comp/hello").await;
    assert_eq!(hello.status, StatusCode::OK);
    assert_eq!(hello.text(), "Hello from a component!\n");

    // The guest's error fails the run, its message in the live log.
    let ran = run("failing").await;
    assert_eq!(
        (ran["state"].as_str(), ran["status"].as_u64()),
        (Some("failed"), Some(502)),
        "{ran}"
    );
    let r = record("failing").await;
    assert!(
        r["error"]
            .as_str()
            .unwrap_or_default()
            .contains("CRON_FAIL is set"),
        "{r}"
    );

    // Only the cron export: it runs; a client is told it serves no requests.
    let ran = run("cron").await;
    assert_eq!(
        (ran["state"].as_str(), ran["status"].as_u64()),
        (Some("ok"), Some(200)),
        "{ran}"
    );
    let client = s.get("/cron/anything").await;
    assert_eq!(client.status, StatusCode::NOT_FOUND);
    assert!(
        client.text().contains("serves no requests"),
        "{}",
        client.text()
    );
    let m = s.metrics().await;
    assert_eq!(
        series(
            &m,
            "tern_guest_outcomes_total{outcome=\"not_served\",tenant=\"cron\"}"
        ),
        1.0,
        "{m}"
    );
}

/// A deleted tenant's schedule ledgers go with it: a new tenant of its name and schedule
/// starts with no runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_tenants_ledgers_go_with_it() {
    let s = probe_server("").await;
    let dir = tempfile::tempdir().unwrap();
    let wasm = std::fs::read(test_guest(dir.path(), "schedule_probe")).unwrap();
    let spec = serde_json::json!({
        "paths": ["/job"],
        "kv": ["default"],
        "schedule": [{ "name": "yearly", "cron": "0 0 1 1 *", "path": "/job/y" }],
    });
    let runs = async || {
        let (status, v) = s
            .admin_call(Method::GET, "/admin/v1/tenants/job/schedules", "")
            .await;
        assert_eq!(status, StatusCode::OK, "{v}");
        v["schedules"][0]["runs"].as_array().unwrap().len()
    };
    for round in 0..2 {
        let (status, v) = s
            .admin_call(Method::PUT, "/admin/v1/tenants/job", spec.to_string())
            .await;
        assert!(status.is_success(), "{status} {v}");
        let (status, v) = s
            .admin_call(Method::PUT, "/admin/v1/tenants/job/module", wasm.clone())
            .await;
        assert!(status.is_success(), "{status} {v}");
        assert_eq!(
            runs().await,
            0,
            "round {round}: a new tenant starts with no runs"
        );
        let (status, v) = s
            .admin_call(
                Method::POST,
                "/admin/v1/tenants/job/schedules/run",
                r#"{"schedule": "yearly"}"#,
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{v}");
        assert_eq!(runs().await, 1);
        let (status, v) = s
            .admin_call(Method::DELETE, "/admin/v1/tenants/job", "")
            .await;
        assert_eq!(status, StatusCode::OK, "{v}");
    }
}
