//! Certificates as files, uploaded through the admin API, rotated by a reload under load, and shared by processes of one data directory.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_certificate_files_are_refused_at_start_with_the_reason() {
    let pki = Pki::new();
    // The certificates of the config, the files written for them, what the error says.
    type Case<'a> = (&'a str, &'a dyn Fn(&Path), &'a str);
    let cases: [Case<'_>; 6] = [
        (
            "[[certificate]]\nhosts = [\"a.test\"]\ncert = \"a.crt\"\nkey = \"b.key\"\n",
            &|d| {
                pki.issue(d, "a", &["a.test"]);
                pki.issue(d, "b", &["a.test"]);
            },
            "does not belong to the certificate",
        ),
        (
            "[[certificate]]\nhosts = [\"b.test\"]\ncert = \"a.crt\"\nkey = \"a.key\"\n",
            &|d| {
                pki.issue(d, "a", &["a.test", "*.w.test"]);
            },
            "does not cover host \"b.test\" (its names: a.test, *.w.test)",
        ),
        (
            "[[certificate]]\ncert = \"missing.crt\"\nkey = \"a.key\"\n",
            &|d| {
                pki.issue(d, "a", &["a.test"]);
            },
            "missing.crt: cannot read",
        ),
        (
            "[[certificate]]\ncert = \"a.key\"\nkey = \"a.key\"\n",
            &|d| {
                pki.issue(d, "a", &["a.test"]);
            },
            "holds no certificate (no `BEGIN CERTIFICATE` block)",
        ),
        (
            "[[certificate]]\ncert = \"a.crt\"\nkey = \"a.key\"\n[[certificate]]\ncert = \"a.crt\"\nkey = \"a.key\"\n",
            &|d| {
                pki.issue(d, "a", &["a.test"]);
            },
            "a second default certificate",
        ),
        (
            "[tls.acme]\ndirectory = \"https://ca.test/dir\"\nhosts = [\"*.w.test\"]\n",
            &|_| {},
            "tls.acme.hosts: \"*.w.test\": a wildcard needs DNS validation",
        ),
    ];
    for (certificates, files, want) in cases {
        let dir = tempfile::tempdir().unwrap();
        files(dir.path());
        let e = tls_server(dir, certificates).await.err().expect("refused");
        assert!(format!("{e:#}").contains(want), "want {want:?}, got: {e:#}");
    }
    // A certificate without a TLS listener is a mistake, said with its line.
    let e = TestServer::try_start("[[certificate]]\ncert = \"a.crt\"\nkey = \"a.key\"\n")
        .await
        .err()
        .expect("refused");
    assert!(format!("{e:#}").contains("set server.tls_listen"), "{e:#}");
    // So is ACME without one.
    let e = TestServer::try_start("[tls.acme]\ndirectory = \"https://ca.test/dir\"\n")
        .await
        .err()
        .expect("refused");
    assert!(format!("{e:#}").contains("set server.tls_listen"), "{e:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_uploaded_through_the_admin_api_serve_from_the_next_handshake_and_persist() {
    use http::Method;
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let files = tempfile::tempdir().unwrap();
    let first = pki.issue(files.path(), "a1", &["a.test"]);
    let second = pki.issue(files.path(), "a2", &["a.test"]);
    pki.issue(files.path(), "b", &["b.test"]);
    let read = |f: &str| std::fs::read_to_string(files.path().join(f)).unwrap();
    let upload = |cert: &str, key: &str, hosts: &[&str]| {
        serde_json::json!({ "hosts": hosts, "cert": read(cert), "key": read(key) }).to_string()
    };
    // A TLS listener with no certificate of its own starts, and refuses every name.
    let s = tls_server(dir, "")
        .await
        .expect("starts without a certificate");
    let tls = s.running.tls_addr.unwrap();
    assert!(connect(tls, "a.test", &[], &pki.ca).await.is_err());

    let (status, v) = s
        .admin_call(
            Method::PUT,
            "/admin/v1/certificates/a",
            upload("a1.crt", "a1.key", &["a.test"]),
        )
        .await;
    assert_eq!(status, 201, "{v}");
    let conn = connect(tls, "a.test", &[b"http/1.1"], &pki.ca)
        .await
        .expect("served");
    assert_eq!(conn.get_ref().1.peer_certificates().unwrap()[0], first);
    let (status, _, body) = get(conn, "a.test", "/").await;
    assert_eq!(status, 200);
    assert_eq!(field(&body, "TLS_SNI"), "=a.test");

    // Refused uploads change nothing: a key of another certificate, a host taken by another
    // upload, a name the certificate does not cover, not JSON.
    let bad = [
        (
            upload("a2.crt", "a1.key", &["a.test"]),
            "a",
            422,
            "does not belong",
        ),
        (
            upload("b.crt", "b.key", &["b.test", "a.test"]),
            "b",
            422,
            "does not cover host \"a.test\"",
        ),
        (
            upload("a2.crt", "a2.key", &["a.test"]),
            "other",
            409,
            "served by the uploaded certificate \"a\"",
        ),
        ("{\"cert\": 1}".to_string(), "a", 400, "is JSON"),
    ];
    for (body, name, want_status, want) in bad {
        let (status, v) = s
            .admin_call(Method::PUT, &format!("/admin/v1/certificates/{name}"), body)
            .await;
        assert_eq!(status, want_status, "{v}");
        assert!(v["error"].as_str().unwrap().contains(want), "{v}");
    }
    let conn = connect(tls, "a.test", &[], &pki.ca).await.unwrap();
    assert_eq!(
        conn.get_ref().1.peer_certificates().unwrap()[0],
        first,
        "unchanged"
    );

    // `tern cert`: replace it (served from the next handshake), list, upload another.
    let cli = |args: &[&str]| {
        crate::support::ran(
            crate::support::tern_bin()
                .arg("cert")
                .args(args)
                .args(["--server", &format!("http://{}", s.admin())])
                .args(["--token", crate::support::ADMIN_TOKEN])
                .current_dir(files.path()),
        )
    };
    let out = cli(&[
        "put", "a", "--cert", "a2.crt", "--key", "a2.key", "--host", "a.test",
    ]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("replaced certificate a for a.test"));
    let conn = connect(tls, "a.test", &[], &pki.ca).await.unwrap();
    assert_eq!(
        conn.get_ref().1.peer_certificates().unwrap()[0],
        second,
        "the new one serves"
    );
    cli(&[
        "put", "b", "--cert", "b.crt", "--key", "b.key", "--host", "b.test",
    ]);
    let listed = String::from_utf8_lossy(&cli(&["list"]).stdout).into_owned();
    assert!(
        listed.contains("a.test") && listed.contains("b.test") && listed.contains("api"),
        "{listed}"
    );
    let m = s.metrics().await;
    assert!(
        metric(
            &m,
            "tern_tls_certificate_expiry_timestamp_seconds{certificate=\"b.test\"}"
        ) > 0.0
    );

    // Delete: the name is refused again; an unknown name is a 404.
    cli(&["delete", "b"]);
    assert!(connect(tls, "b.test", &[], &pki.ca).await.is_err());
    let (status, _) = s
        .admin_call(Method::DELETE, "/admin/v1/certificates/b", "")
        .await;
    assert_eq!(status, 404);

    // A restart serves what was uploaded; a bundle damaged on disk is refused, never served.
    let dir2 = crate::support::restart_dir(s);
    let s2 = tls_server(dir2, "").await.unwrap();
    let tls2 = s2.running.tls_addr.unwrap();
    let conn = connect(tls2, "a.test", &[], &pki.ca)
        .await
        .expect("served after a restart");
    assert_eq!(conn.get_ref().1.peer_certificates().unwrap()[0], second);
    let certs = s2.dir.path().join("data/certificates");
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(certs.join("index.json")).unwrap()).unwrap();
    let bundle = index["certificates"]["a"]["bundle"]
        .as_str()
        .unwrap()
        .to_string();
    let mut pem = std::fs::read(certs.join(format!("{bundle}.pem"))).unwrap();
    pem.extend_from_slice(b"\n# tampered\n");
    std::fs::write(certs.join(format!("{bundle}.pem")), pem).unwrap();
    let dir3 = crate::support::restart_dir(s2);
    let s3 = tls_server(dir3, "").await.unwrap();
    assert!(
        connect(s3.running.tls_addr.unwrap(), "a.test", &[], &pki.ca)
            .await
            .is_err(),
        "a damaged bundle is not served"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_rotates_certificates_under_load_and_a_bad_one_changes_nothing() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let pki = Arc::new(Pki::new());
    let (s, addr, old) = a_test_server(&pki).await;
    let served =
        |tls: &TlsStream<TcpStream>| tls.get_ref().1.peer_certificates().unwrap()[0].clone();

    // An HTTP/2 connection opened before the rotation, used again after it.
    let tls = connect(addr, "a.test", &[b"h2"], &pki.ca).await.unwrap();
    assert_eq!(served(&tls), old);
    let (mut early, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    let request = || {
        Request::get("https://a.test/")
            .body(Empty::<Bytes>::new())
            .unwrap()
    };
    assert_eq!(
        early.send_request(request()).await.unwrap().status(),
        StatusCode::OK
    );

    // Clients making a new handshake and request in a loop, all through the rotation.
    let stop = Arc::new(AtomicBool::new(false));
    let (done, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut load = Vec::new();
    for _ in 0..4 {
        let (stop, done, failed, pki) = (stop.clone(), done.clone(), failed.clone(), pki.clone());
        load.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let ok = match connect(addr, "a.test", &[b"h2", b"http/1.1"], &pki.ca).await {
                    Ok(tls) => get(tls, "a.test", "/").await.0 == StatusCode::OK,
                    Err(_) => false,
                };
                let counter = if ok { &done } else { &failed };
                counter.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;

    // The config's certificate made to name other files, then reloaded: its status and JSON.
    let config_path = s.path("tern.toml");
    let config = std::fs::read_to_string(&config_path).unwrap();
    let reload_with = |cert: &str, key: &str| {
        let text = config
            .replace("\"a.crt", &format!("\"{cert}"))
            .replace("\"a.key", &format!("\"{key}"));
        std::fs::write(&config_path, text).unwrap();
        s.admin_call(http::Method::POST, "/admin/v1/reload", "")
    };
    let new = pki.issue(s.dir.path(), "a2", &["a.test"]);
    let (status, body) = reload_with("a2.crt", "a2.key").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let tls = connect(addr, "a.test", &[], &pki.ca).await.unwrap();
    assert_eq!(
        served(&tls),
        new,
        "the next handshake gets the new certificate"
    );

    // A certificate whose key is another's: refused, the one serving keeps serving.
    pki.issue(s.dir.path(), "b", &["a.test"]);
    let (status, body) = reload_with("a2.crt", "b.key").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(body.to_string().contains("does not belong"), "{body}");
    let tls = connect(addr, "a.test", &[], &pki.ca).await.unwrap();
    assert_eq!(served(&tls), new);

    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    for task in load {
        task.await.unwrap();
    }
    assert_eq!(
        early.send_request(request()).await.unwrap().status(),
        StatusCode::OK
    );
    let (done, failed) = (done.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    assert!(done > 20 && failed == 0, "{done} requests, {failed} failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_uploaded_to_one_process_serves_in_another_sharing_its_data_directory() {
    use http::Method;
    let pki = Pki::new();
    let files = tempfile::tempdir().unwrap();
    let cert = pki.issue(files.path(), "a", &["a.test"]);
    let a = tls_server(tempfile::tempdir().unwrap(), "").await.unwrap();
    let dir_b = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(a.dir.path().join("data"), dir_b.path().join("data")).unwrap();
    let b = tls_server(dir_b, "").await.unwrap();
    let b_tls = b.running.tls_addr.unwrap();
    assert!(connect(b_tls, "a.test", &[], &pki.ca).await.is_err());

    let read = |f: &str| std::fs::read_to_string(files.path().join(f)).unwrap();
    let body =
        serde_json::json!({ "hosts": ["a.test"], "cert": read("a.crt"), "key": read("a.key") });
    let (status, v) = a
        .admin_call(Method::PUT, "/admin/v1/certificates/a", body.to_string())
        .await;
    assert_eq!(status, 201, "{v}");
    // The other process serves it at its next check of the data directory (every 2 s).
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        if let Ok(conn) = connect(b_tls, "a.test", &[], &pki.ca).await {
            assert_eq!(conn.get_ref().1.peer_certificates().unwrap()[0], cert);
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never served by the other process"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (status, _) = a
        .admin_call(Method::DELETE, "/admin/v1/certificates/a", "")
        .await;
    assert_eq!(status, 200);
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while connect(b_tls, "a.test", &[], &pki.ca).await.is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "still served after the delete"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
