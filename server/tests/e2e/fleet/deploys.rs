//! Deploys reaching every replica: served by all, nudged, with the registry down, and config reloads that would shadow a registry tenant.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deploy_on_any_replica_is_served_by_all_and_a_later_replica_joins_without_compiling() {
    let s3 = S3::start();
    let dirs = tempfile::tempdir().unwrap();
    // Created and deployed on a: served by b.
    let (a, b, v1) = site_on_two_replicas(&s3, dirs.path()).await;

    // Deployed on b: served by a; rolled back on a: served by b again.
    let (status, v) = deploy(addr(&b.admin), "site", demo("echo")).await;
    assert_eq!(status, http::StatusCode::OK, "{v}");
    assert_eq!(v["previous"], v1.as_str(), "{v}");
    serves(&a, "/site", "GET /site").await;
    let (status, v) = admin(
        &a,
        http::Method::POST,
        "/admin/v1/tenants/site/rollback",
        "",
    )
    .await;
    assert_eq!(status, http::StatusCode::OK, "{v}");
    assert_eq!(v["version"], v1.as_str());
    serves(&b, "/site", "Hello").await;

    // Changes to different tenants on both replicas at once: none is lost (a change that
    // lost the race to the registry is made again on top of the winner's).
    let mut jobs = tokio::task::JoinSet::new();
    for (r, side) in [(&a, "a"), (&b, "b")] {
        let at = addr(&r.admin);
        for i in 0..4 {
            let name = format!("t-{side}-{i}");
            jobs.spawn(async move {
                create(at, &name, &format!("/{name}")).await;
                deploy(at, &name, demo("hello")).await
            });
        }
    }
    for (status, v) in jobs.join_all().await {
        assert_eq!(status, http::StatusCode::OK, "{v}");
    }
    for side in ["a", "b"] {
        for i in 0..4 {
            serves(&a, &format!("/t-{side}-{i}"), "Hello").await;
            serves(&b, &format!("/t-{side}-{i}"), "Hello").await;
        }
    }

    // The same tenant deployed on both at once: each deploy succeeds in turn or is told it
    // lost (409); nothing else, and both replicas end up serving the same version.
    let (ra, rb) = tokio::join!(
        deploy(addr(&a.admin), "site", demo("json")),
        deploy(addr(&b.admin), "site", demo("counter"))
    );
    for (status, v) in [&ra, &rb] {
        assert!(
            *status == http::StatusCode::OK || *status == http::StatusCode::CONFLICT,
            "{status} {v}"
        );
    }
    assert!(ra.0 == http::StatusCode::OK || rb.0 == http::StatusCode::OK);
    for (status, v) in [&ra, &rb] {
        if *status == http::StatusCode::CONFLICT {
            let e = v["error"].as_str().unwrap();
            assert!(
                e.contains("another replica at the same time; nothing was written")
                    || e.contains("kept changing during this change; nothing was written"),
                "{v}"
            );
        }
    }

    // The fleet view: both replicas report, every tenant converged.
    let started = Instant::now();
    let view = loop {
        let (status, view) = admin(&b, http::Method::GET, "/admin/v1/fleet", "").await;
        assert_eq!(status, http::StatusCode::OK, "{view}");
        let tenants = view["tenants"].as_object().unwrap();
        if view["replicas"].as_array().unwrap().len() == 2
            && tenants.len() == 9
            && tenants.values().all(|t| t["converged"] == true)
        {
            break view;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{view}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(view["registry"], REGISTRY);
    assert_eq!(view["tenants"]["site"]["serving"], 2, "{view}");
    let site = view["tenants"]["site"]["version"]
        .as_str()
        .unwrap()
        .to_string();
    // `tern tenants` shows it too.
    let out = crate::support::ran(
        crate::support::tern_bin()
            .args(["tenants", "--server", &format!("http://{}", b.admin)])
            .env("TERN_ADMIN_TOKEN", FLEET_TOKEN),
    );
    let table = String::from_utf8_lossy(&out.stdout);
    let row = table.lines().find(|l| l.starts_with("site ")).unwrap();
    assert!(
        row.contains(&site[..8]) && row.contains("(2/2 replicas)"),
        "{table}"
    );

    // A replica started later serves everything at once, from artifacts the others compiled.
    let c = replica(&s3, "c", &dirs.path().join("c"));
    let reply = get(&c, "/t-b-3").await;
    assert_eq!(reply.status, http::StatusCode::OK);
    let m = metrics(&c).await;
    assert_eq!(
        crate::support::metric_value(&m, "tern_module_compile_duration_seconds_count"),
        0.0,
        "the later replica compiled"
    );
    assert!(
        crate::support::metric_value(&m, "tern_registry_artifacts_total{outcome=\"downloaded\"}")
            >= 2.0,
        "{m}"
    );
    let (_, v) = admin(&c, http::Method::GET, "/admin/v1/tenants/site", "").await;
    assert_eq!(v["current"]["id"], site.as_str(), "{v}");
    let (_, view) = admin(&a, http::Method::GET, "/admin/v1/fleet", "").await;
    assert_eq!(view["replicas"].as_array().unwrap().len(), 3, "{view}");

    // A replica that stops (SIGTERM) leaves the fleet view.
    let mut c = c;
    crate::support::ran(Command::new("kill").args(["-TERM", &c.child.id().to_string()]));
    assert!(c.child.wait().unwrap().success());
    let (_, view) = admin(&a, http::Method::GET, "/admin/v1/fleet", "").await;
    let names: Vec<&str> = view["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["replica"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a", "b"], "{view}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_registry_down_replicas_keep_serving_deploys_are_503_and_a_restart_serves_the_snapshot()
 {
    let mut s3 = S3::start();
    let dirs = tempfile::tempdir().unwrap();
    let (a, b, _) = site_on_two_replicas(&s3, dirs.path()).await;

    s3.stop();
    // Both keep serving; a deploy or a new tenant is refused with 503 and says why.
    serves(&a, "/site", "Hello").await;
    serves(&b, "/site", "Hello").await;
    let (status, v) = deploy(addr(&b.admin), "site", demo("echo")).await;
    assert_eq!(status, http::StatusCode::SERVICE_UNAVAILABLE, "{v}");
    let error = v["error"].as_str().unwrap();
    assert!(
        error.contains("cannot be reached") && error.contains(REGISTRY),
        "{error}"
    );
    let spec = serde_json::json!({ "paths": ["/other"] }).to_string();
    let (status, _) = admin(&a, http::Method::PUT, "/admin/v1/tenants/other", spec).await;
    assert_eq!(status, http::StatusCode::SERVICE_UNAVAILABLE);
    serves(&b, "/site", "Hello").await;
    let ready = get_admin(&b, "/readyz").await;
    assert_eq!(ready.status, http::StatusCode::OK, "{}", ready.text());
    // b's watch meets the registry down (waited for, not slept on).
    let deadline = Instant::now() + Duration::from_secs(10);
    while crate::support::metric_value_or_zero(
        &metrics(&b).await,
        "tern_registry_syncs_total{outcome=\"unreachable\"}",
    ) < 1.0
    {
        assert!(Instant::now() < deadline, "b never met the registry down");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // b restarted while the registry is down serves its snapshot of it.
    drop(b);
    let b = replica(&s3, "b", &dirs.path().join("b"));
    serves(&b, "/site", "Hello").await;
    assert_eq!(get_admin(&b, "/readyz").await.status, http::StatusCode::OK);
    // A replica with nothing to serve is not ready until it has read the registry.
    let d = replica(&s3, "d", &dirs.path().join("d"));
    let not_ready = get_admin(&d, "/readyz").await;
    assert_eq!(not_ready.status, http::StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        not_ready.text().contains("registry"),
        "{}",
        not_ready.text()
    );

    // The registry back: d reads it and serves, a deploy on b reaches a.
    s3.restart();
    serves(&d, "/site", "Hello").await;
    assert_eq!(get_admin(&d, "/readyz").await.status, http::StatusCode::OK);
    let (status, v) = deploy(addr(&b.admin), "site", demo("echo")).await;
    assert_eq!(status, http::StatusCode::OK, "{v}");
    serves(&a, "/site", "GET /site").await;
    serves(&d, "/site", "GET /site").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_nudges_the_other_replicas_so_they_need_not_wait_for_their_poll() {
    let s3 = S3::start();
    let root = tempfile::tempdir().unwrap();
    // A minute between polls: b can serve a's deploy within the test's 20 s only if a tells it.
    let a = replica_with(&s3, "a", &root.path().join("a"), "", 60_000);
    let b = replica_with(&s3, "b", &root.path().join("b"), "", 60_000);
    // b's first report nudged a, which then read who to nudge.
    let deadline = Instant::now() + Duration::from_secs(20);
    while crate::support::metric_value(&metrics(&a).await, "tern_registry_peers") < 1.0 {
        assert!(Instant::now() < deadline, "a never learnt of b");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        crate::support::metric_value(
            &metrics(&a).await,
            "tern_registry_nudges_total{outcome=\"received\"}"
        ) >= 1.0
    );
    create(addr(&a.admin), "nudged", "/nudged").await;
    let (status, v) = deploy(addr(&a.admin), "nudged", demo("hello")).await;
    assert_eq!(status, http::StatusCode::OK, "{v}");
    serves(&b, "/nudged", "Hello").await;
    let sent = metrics(&a).await;
    assert!(
        crate::support::metric_value(&sent, "tern_registry_nudges_total{outcome=\"sent\"}") >= 2.0,
        "{sent}"
    );
    assert!(
        crate::support::metric_value(
            &metrics(&b).await,
            "tern_registry_nudges_total{outcome=\"received\"}"
        ) >= 2.0
    );
    // A nudge needs the fleet's token, and a server outside a fleet has nothing to sync.
    let (status, _) = crate::support::admin_request(
        addr(&b.admin),
        "wrong-token",
        http::Method::POST,
        "/admin/v1/fleet/sync",
        bytes::Bytes::new(),
    )
    .await;
    assert_eq!(status, http::StatusCode::UNAUTHORIZED);
    let (status, reply) = admin(&b, http::Method::GET, "/admin/v1/fleet/sync", "").await;
    assert_eq!(status, http::StatusCode::METHOD_NOT_ALLOWED, "{reply}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_reload_that_would_shadow_a_registry_tenant_is_refused_naming_the_registry() {
    let s3 = S3::start();
    let root = tempfile::tempdir().unwrap();
    let (_a, b, _) = site_on_two_replicas(&s3, root.path()).await;
    // b's file now declares a tenant of the same name: two owners; the reload changes nothing.
    let config = root.path().join("b/tern.toml");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str("[[tenant]]\nname = \"site\"\nmodule = \"builtin:echo\"\npaths = [\"/site\"]\n");
    std::fs::write(&config, text).unwrap();
    let (status, reply) = admin(&b, http::Method::POST, "/admin/v1/reload", "").await;
    assert_eq!(status, http::StatusCode::CONFLICT, "{reply}");
    let e = reply["error"].as_str().unwrap();
    assert!(
        e.contains("\"site\" is declared in the config file")
            && e.contains(&format!("the fleet's registry {REGISTRY}")),
        "{e}"
    );
    serves(&b, "/site", "Hello").await;
}
