//! The registry on a real S3 server: the probe, digest-checked objects, one writer of the manifest, and replicas killed mid-deploy.

use super::*;

#[test]
fn the_probe_finds_a_real_s3_server_keeps_conditional_writes_and_names_what_it_cannot_reach() {
    let s3 = S3::start();
    let out = probe(&s3, "s3://fleet/registry", |_| {});
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for check in [
        "create-if-absent",
        "update-if-match",
        "conditional-read",
        "create-race",
        "update-race",
    ] {
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with("ok") && l.contains(check)),
            "{check}: {stdout}"
        );
    }
    assert!(
        stdout.contains("8 writers created one name at once: 1 succeeded"),
        "{stdout}"
    );
    // It leaves no object behind.
    let left = walk(&s3.root.path().join("fleet"));
    assert!(left.is_empty(), "{left:?}");

    // Wrong credentials, a bucket that does not exist: nothing could be checked, said so.
    let out = probe(&s3, "s3://fleet/registry", |c| {
        c.env("AWS_SECRET_ACCESS_KEY", "wrong");
    });
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cannot write to the store"), "{stderr}");
    let out = probe(&s3, "s3://no-such-bucket/registry", |_| {});
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot write to the store"));
    // Not a store URL at all.
    let out = probe(&s3, "ftp://fleet/registry", |_| {});
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not supported"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_objects_on_a_real_s3_server_are_digest_checked_and_the_manifest_swapped_by_one_writer()
 {
    use tern::fleet::objects::{Remote, RemoteError, open_with};
    let s3 = S3::start();
    let options = s3.options();
    let options: Vec<(&str, &str)> = options.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (store, prefix) = open_with("s3://fleet/registry", &options).unwrap();
    let remote = Remote::new(store, prefix);

    // A blob is written once, named by its digest, and read back whole.
    let wasm = bytes::Bytes::from(vec![7u8; 100_000]);
    let hash = remote.put_blob(wasm.clone()).await.unwrap();
    assert_eq!(remote.put_blob(wasm.clone()).await.unwrap(), hash);
    assert_eq!(remote.get_blob(&hash).await.unwrap(), wasm);
    // Changed behind the registry's back (on the S3 server's disk): refused, never used.
    let on_disk = s3.root.path().join("fleet/registry/blobs").join(&hash);
    std::fs::write(&on_disk, b"tampered").unwrap();
    let e = remote.get_blob(&hash).await.unwrap_err();
    assert!(matches!(e, RemoteError::Damaged(_)), "{e}");
    assert!(e.to_string().contains("do not match their digest"), "{e}");

    // Two writers change the manifest from the same version at once (each adding its own
    // tenant): one wins, one is told and nothing of the winner's is lost.
    // Each change records its own id.
    let with_tenant = |name: &str, change: &str| -> tern::datadir::Manifest {
        serde_json::from_value(serde_json::json!({
            "format": tern::datadir::MANIFEST_FORMAT,
            "tenants": { name: { "spec": {}, "current": null, "previous": null, "created_at": 1 } },
            "changes": [change],
        }))
        .unwrap()
    };
    let base = remote
        .put_manifest(&tern::datadir::Manifest::default(), None, "first")
        .await
        .unwrap()
        .version()
        .unwrap();
    let (a, b) = (remote.clone(), remote.clone());
    let (base_a, base_b) = (base.clone(), base.clone());
    let (ma, mb) = (with_tenant("a", "change-a"), with_tenant("b", "change-b"));
    let results = tokio::join!(
        tokio::spawn(async move { a.put_manifest(&ma, Some(&base_a), "change-a").await }),
        tokio::spawn(async move { b.put_manifest(&mb, Some(&base_b), "change-b").await }),
    );
    let results = [results.0.unwrap(), results.1.unwrap()];
    assert_eq!(
        results.iter().filter(|r| r.is_ok()).count(),
        1,
        "{results:?}"
    );
    assert!(
        results
            .iter()
            .any(|r| matches!(r, Err(RemoteError::Conflict(_)))),
        "{results:?}"
    );
    let (stored, now) = remote.manifest().await.unwrap().expect("a manifest");
    let winner = if results[0].is_ok() { "a" } else { "b" };
    assert_eq!(stored.tenants.keys().collect::<Vec<_>>(), [winner]);
    // A watcher holding the new version learns that nothing changed from one small request.
    assert!(
        remote
            .manifest_if_changed(Some(&now))
            .await
            .unwrap()
            .is_none()
    );

    // The store goes away: said so, distinctly from a conflict.
    drop(s3);
    let e = remote.manifest().await.unwrap_err();
    assert!(matches!(e, RemoteError::Unreachable(_)), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_mid_deploy_leaves_the_registry_consistent_and_tampered_artifacts_are_not_run()
 {
    use sha2::Digest as _;
    use tern::fleet::objects::{Remote, open_with};
    let s3 = S3::start();
    let dirs = tempfile::tempdir().unwrap();
    let mut a = replica(&s3, "a", &dirs.path().join("a"));
    create(addr(&a.admin), "site", "/site").await;
    let (status, v) = deploy(addr(&a.admin), "site", &module(0, 1)).await;
    assert_eq!(status, http::StatusCode::OK, "{v}");

    // kill -9 at each moment of a deploy, each seen to have come (never guessed with a
    // sleep): half the upload sent, all of it sent, the module stored in the registry, the
    // manifest naming it. A restart then serves what the registry names.
    let options = s3.options();
    let options: Vec<(&str, &str)> = options.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (store, prefix) = open_with(REGISTRY, &options).unwrap();
    let remote = Remote::new(store, prefix);
    async fn current(remote: &Remote) -> tern::datadir::Version {
        let (manifest, _) = remote.manifest().await.unwrap().expect("a manifest");
        manifest.tenants["site"]
            .current
            .clone()
            .expect("a current version")
    }
    let mut served = 0;
    for (i, moment) in [
        "half the upload sent",
        "the upload sent",
        "the module stored",
        "the manifest names it",
    ]
    .into_iter()
    .enumerate()
    {
        let i = i + 1;
        let wasm = module(i, 40);
        let hash = format!("{:x}", sha2::Sha256::digest(&wasm));
        let mut conn = tokio::net::TcpStream::connect(addr(&a.admin))
            .await
            .unwrap();
        let head = format!(
            "PUT /admin/v1/tenants/site/module HTTP/1.1\r\nhost: x\r\n\
             authorization: Bearer {FLEET_TOKEN}\r\ncontent-length: {}\r\n\r\n",
            wasm.len()
        );
        use tokio::io::AsyncWriteExt;
        conn.write_all(head.as_bytes()).await.unwrap();
        let half = wasm.len() / 2;
        conn.write_all(&wasm[..half]).await.unwrap();
        if i > 1 {
            conn.write_all(&wasm[half..]).await.unwrap();
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let came = match i {
                3 => remote.get_blob(&hash).await.is_ok(),
                4 => current(&remote).await.module == hash,
                _ => true,
            };
            if came {
                break;
            }
            assert!(Instant::now() < deadline, "{moment}: never came");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        crate::support::ran(Command::new("kill").args(["-KILL", &a.child.id().to_string()]));
        let _ = a.child.wait();
        drop(conn);
        a = replica(&s3, "a", &dirs.path().join("a"));
        // The new version is current only once its manifest is written; whichever it is, the
        // restarted replica serves it.
        let now = current(&remote).await;
        match i {
            1 => assert_ne!(now.module, hash, "{moment}: a half upload was deployed"),
            4 => assert_eq!(now.module, hash, "{moment}: the deploy was lost"),
            _ => {}
        }
        if now.module == hash {
            served = i;
        }
        let r = get(&a, "/site").await;
        assert_eq!(r.status, http::StatusCode::OK, "{moment}: {}", r.text());
        assert_eq!(
            r.text(),
            format!("version {served} "),
            "{moment}: not what the registry names"
        );
    }

    // The registry names only objects that are there and whole.
    let (manifest, _) = remote.manifest().await.unwrap().expect("a manifest");
    let site = &manifest.tenants["site"];
    for v in site.current.iter().chain(&site.previous) {
        remote.get_blob(&v.module).await.expect("a whole module");
    }
    // A new replica serves the same version.
    let b = replica(&s3, "b", &dirs.path().join("b"));
    let want = site.current.as_ref().unwrap().id.clone();
    let (_, v) = admin(&b, http::Method::GET, "/admin/v1/tenants/site", "").await;
    assert_eq!(v["current"]["id"], want.as_str(), "{v}");
    assert_eq!(get(&b, "/site").await.status, http::StatusCode::OK);

    // Every compiled artifact in the registry changed on the S3 server's disk (as by someone
    // with write access to the bucket but not the fleet's token): a new replica refuses them,
    // compiles the module itself, and serves it.
    let artifacts = s3.root.path().join("fleet/registry/artifacts");
    let mut changed = 0;
    for e in std::fs::read_dir(&artifacts).unwrap().flatten() {
        let mut bytes = std::fs::read(e.path()).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        std::fs::write(e.path(), bytes).unwrap();
        changed += 1;
    }
    assert!(changed >= 1);
    let c = replica(&s3, "c", &dirs.path().join("c"));
    let reply = get(&c, "/site").await;
    assert_eq!(reply.status, http::StatusCode::OK);
    assert!(reply.text().starts_with("version "), "{}", reply.text());
    let m = metrics(&c).await;
    assert_eq!(
        crate::support::metric_value(&m, "tern_registry_artifacts_total{outcome=\"refused\"}"),
        1.0,
        "{m}"
    );
    assert_eq!(
        crate::support::metric_value(&m, "tern_module_compile_duration_seconds_count"),
        1.0
    );
}
