//! Changes whose answer was lost between a replica and the registry (through a proxy that drops it): answered as done, or as unknown, and settled by a conditional retry.

use super::*;

/// The five changes the registry's compare-and-swap writes carry, made on `a` (which reaches
/// S3 through `proxy`) with `fault` armed for each change's write: each answer is the
/// change's own, and replica `b` serves every change. `round` keeps the names apart.
async fn every_change_survives(
    a: &crate::support::TernProcess,
    b: &crate::support::TernProcess,
    proxy: &crate::faults::S3Proxy,
    fault: crate::faults::Fault,
    round: usize,
) {
    use http::Method;
    let site = format!("site{round}");
    let path = format!("/admin/v1/tenants/{site}");
    // Set up without faults: two versions, so there is one to roll back to.
    create(addr(&a.admin), &site, &format!("/{site}")).await;
    for module in ["hello", "echo"] {
        let (status, v) = deploy(addr(&a.admin), &site, demo(module)).await;
        assert_eq!(status, 200, "{v}");
    }
    let applied = proxy.applied();

    // A spec change.
    proxy.arm(fault, "registry/index.json");
    let (status, v) = admin_if(a, Method::PATCH, &path, r#"{"env": {"ROUND": "x"}}"#, None).await;
    assert_eq!(status, 200, "{fault:?}: the spec change was applied: {v}");
    assert_eq!(proxy.applied(), applied + 1, "the fault happened");
    assert_eq!(v["env"], serde_json::json!(["ROUND"]), "{v}");

    // A deploy.
    proxy.arm(fault, "registry/index.json");
    let (status, v) = deploy(addr(&a.admin), &site, demo("json")).await;
    assert_eq!(status, 200, "{fault:?}: the deploy was applied: {v}");
    assert_eq!(proxy.applied(), applied + 2);
    let deployed = v["version"].as_str().unwrap().to_string();
    let etag = v["etag"].as_str().unwrap().to_string();
    let started = Instant::now();
    while tenant(b, &site).await["current"]["id"] != deployed.as_str() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "b never saw it"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A rollback, conditional: answered as done, and its retry is refused, not applied again.
    proxy.arm(fault, "registry/index.json");
    let rollback = format!("{path}/rollback");
    let (status, v) = admin_if(a, Method::POST, &rollback, "", Some(&etag)).await;
    assert_eq!(status, 200, "{fault:?}: the rollback was applied: {v}");
    assert_eq!(proxy.applied(), applied + 3);
    assert_eq!(v["previous"], deployed.as_str(), "{v}");
    let rolled_back = v["version"].as_str().unwrap().to_string();
    let (status, v) = admin_if(a, Method::POST, &rollback, "", Some(&etag)).await;
    assert_eq!(status, 412, "a retried rollback is not applied twice: {v}");
    assert_eq!(
        tenant(a, &site).await["current"]["id"],
        rolled_back.as_str()
    );

    // A certificate upload.
    let (cert, key) = self_signed(&format!("r{round}.test"));
    let body = serde_json::json!({"hosts": [format!("r{round}.test")], "cert": cert, "key": key});
    proxy.arm(fault, "certificates/index.json");
    let (status, v) = admin(
        a,
        Method::PUT,
        &format!("/admin/v1/certificates/r{round}"),
        body.to_string(),
    )
    .await;
    assert_eq!(status, 201, "{fault:?}: the upload was applied: {v}");
    assert_eq!(v["created"], true, "{v}");
    assert_eq!(proxy.applied(), applied + 4);

    // A delete.
    proxy.arm(fault, "registry/index.json");
    let (status, v) = admin_if(a, Method::DELETE, &path, "", None).await;
    assert_eq!(status, 200, "{fault:?}: the delete was applied: {v}");
    assert_eq!(proxy.applied(), applied + 5);
    let started = Instant::now();
    while !tenant(b, &site).await.is_null() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "b still has it"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A replica whose registry write S3 applied but whose answer was lost — the connection
/// closed instead of the answer, or the answer late past the client's timeout — answers the
/// change as done (it recognises its change id when it reads the registry back), for every
/// kind of change; a conditional retry of it is refused with 412 rather than applied twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_whose_answer_the_registry_lost_is_answered_as_done_not_as_a_conflict() {
    use crate::faults::Fault;
    let s3 = S3::start();
    let dirs = tempfile::tempdir().unwrap();
    let (a, proxy) = replica_behind_a_proxy(&s3, dirs.path()).await;
    let b = replica_with(&s3, "b", &dirs.path().join("b"), TLS, 100);
    every_change_survives(&a, &b, &proxy, Fault::Drop, 0).await;
    every_change_survives(&a, &b, &proxy, Fault::Delay(Duration::from_secs(3)), 1).await;
    // Every deploy counted as the success it was.
    let m = metrics(&a).await;
    assert_eq!(
        crate::support::metric_value(&m, "tern_deploys_total{outcome=\"ok\",tenant=\"site0\"}"),
        3.0,
        "{m}"
    );
}

/// The registry stops right after it applied a change, before its answer leaves: the replica
/// cannot read it back, so it answers 503 saying the change may or may not have been applied
/// (never "nothing was written"); once the registry is back the change is there, and the same
/// conditional change sent again is refused with 412 instead of being applied twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_the_registry_went_away_after_is_answered_as_unknown_and_a_conditional_retry_settles_it()
 {
    use crate::faults::{Fault, S3Proxy};
    use http::Method;
    let mut s3 = S3::start();
    let dirs = tempfile::tempdir().unwrap();
    let (a, proxy) = replica_behind_a_proxy(&s3, dirs.path()).await;
    create(addr(&a.admin), "site", "/site").await;
    for module in ["hello", "echo"] {
        let (status, v) = deploy(addr(&a.admin), "site", demo(module)).await;
        assert_eq!(status, 200, "{v}");
    }
    let path = "/admin/v1/tenants/site";

    // Each change: armed, sent, S3 stopped while its answer is held, then back.
    async fn unknown(
        a: &crate::support::TernProcess,
        s3: &mut S3,
        proxy: &S3Proxy,
        suffix: &str,
        change: impl std::future::Future<Output = (http::StatusCode, serde_json::Value)>,
    ) {
        proxy.arm(Fault::Hold, suffix);
        let (answer, ()) = tokio::join!(change, async {
            proxy.wait_held(Duration::from_secs(20)).await;
            s3.stop();
            proxy.release();
        });
        let (status, v) = answer;
        let error = v["error"].as_str().unwrap_or_default().to_string();
        assert_eq!(status, 503, "{v}");
        assert!(
            error.contains("may have been applied or not") && !error.contains("nothing was"),
            "{error}"
        );
        s3.restart();
        // The replica reads the registry again by itself.
        let started = Instant::now();
        while get_admin(a, "/readyz").await.status != 200
            || admin(a, http::Method::GET, "/admin/v1/fleet", "").await.0 != 200
        {
            assert!(started.elapsed() < Duration::from_secs(20));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    // A rollback: it was applied; its conditional retry is refused.
    let etag = tenant(&a, "site").await["etag"]
        .as_str()
        .unwrap()
        .to_string();
    let before = tenant(&a, "site").await;
    unknown(&a, &mut s3, &proxy, "registry/index.json", async {
        admin_if(
            &a,
            Method::POST,
            &format!("{path}/rollback"),
            "",
            Some(&etag),
        )
        .await
    })
    .await;
    let after = tenant(&a, "site").await;
    assert_eq!(after["current"], before["previous"], "{after}");
    let (status, v) = admin_if(
        &a,
        Method::POST,
        &format!("{path}/rollback"),
        "",
        Some(&etag),
    )
    .await;
    assert_eq!(status, 412, "{v}");
    assert_eq!(tenant(&a, "site").await["current"], before["previous"]);

    // A spec change and a deploy, the same.
    let etag = after["etag"].as_str().unwrap().to_string();
    unknown(&a, &mut s3, &proxy, "registry/index.json", async {
        admin_if(
            &a,
            Method::PATCH,
            path,
            r#"{"env": {"K": "v"}}"#,
            Some(&etag),
        )
        .await
    })
    .await;
    let after = tenant(&a, "site").await;
    assert_eq!(after["env"], serde_json::json!(["K"]), "{after}");
    let (status, _) = admin_if(
        &a,
        Method::PATCH,
        path,
        r#"{"env": {"K": "v"}}"#,
        Some(&etag),
    )
    .await;
    assert_eq!(status, 412);
    let etag = after["etag"].as_str().unwrap().to_string();
    let reply = async {
        let auth = format!("Bearer {FLEET_TOKEN}");
        let r = crate::support::send(
            addr(&a.admin),
            Method::PUT,
            &format!("{path}/module"),
            None,
            &[("authorization", &auth), ("if-match", &etag)],
            bytes::Bytes::from_static(demo("json")),
        )
        .await;
        (
            r.status,
            serde_json::from_slice(&r.body).unwrap_or_default(),
        )
    };
    unknown(&a, &mut s3, &proxy, "registry/index.json", reply).await;
    let after = tenant(&a, "site").await;
    assert_ne!(after["current"], before["previous"], "deployed: {after}");
    assert_eq!(after["previous"], before["previous"], "{after}");

    // A certificate upload: listed once the registry is back.
    let (cert, key) = self_signed("gone.test");
    let body = serde_json::json!({"hosts": ["gone.test"], "cert": cert, "key": key});
    unknown(&a, &mut s3, &proxy, "certificates/index.json", async {
        admin(
            &a,
            Method::PUT,
            "/admin/v1/certificates/gone",
            body.to_string(),
        )
        .await
    })
    .await;
    let started = Instant::now();
    loop {
        let (_, listed) = admin(&a, Method::GET, "/admin/v1/certificates", "").await;
        if listed.to_string().contains("gone.test") {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{listed}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A delete: gone, and its conditional retry refused rather than answered 404.
    let etag = after["etag"].as_str().unwrap().to_string();
    unknown(&a, &mut s3, &proxy, "registry/index.json", async {
        admin_if(&a, Method::DELETE, path, "", Some(&etag)).await
    })
    .await;
    assert!(tenant(&a, "site").await.is_null());
    let (status, v) = admin_if(&a, Method::DELETE, path, "", Some(&etag)).await;
    assert_eq!(status, 412, "{v}");
    assert_eq!(proxy.applied(), 5);
}
