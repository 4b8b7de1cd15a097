//! Handshakes: each host its certificate over HTTP/2 and HTTP/1.1, curl, failed, stalled and capped handshakes, expired and wrong-host certificates, the cipher suite the server picks.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_serves_each_host_its_certificate_over_h2_and_http1_and_guests_see_it() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let exact = pki.issue(dir.path(), "a", &["a.test"]);
    let wild = pki.issue(dir.path(), "w", &["*.w.test"]);
    let default = pki.issue(dir.path(), "d", &["default.test", "other.test"]);
    let s = tls_server(
        dir,
        "[[certificate]]\nhosts = [\"a.test\"]\ncert = \"a.crt\"\nkey = \"a.key\"\n\
         [[certificate]]\nhosts = [\"*.w.test\"]\ncert = \"w.crt\"\nkey = \"w.key\"\n\
         [[certificate]]\ncert = \"d.crt\"\nkey = \"d.key\"\n",
    )
    .await
    .expect("start");
    let addr = s.running.tls_addr.expect("a TLS listener");
    for (sni, want) in [
        ("a.test", &exact),
        ("x.w.test", &wild),
        ("other.test", &default),
    ] {
        for (alpn, version, shown) in [
            (&[&b"h2"[..], b"http/1.1"][..], Version::HTTP_2, "=HTTP/2"),
            (&[&b"http/1.1"[..]][..], Version::HTTP_11, "=HTTP/1.1"),
            (&[][..], Version::HTTP_11, "=HTTP/1.1"),
        ] {
            let tls = connect(addr, sni, alpn, &pki.ca).await.expect("handshake");
            let served = &tls.get_ref().1.peer_certificates().unwrap()[0];
            assert_eq!(served, want, "{sni}: the wrong certificate");
            // The hybrid post-quantum key exchange, which a current client offers first.
            let group = tls
                .get_ref()
                .1
                .negotiated_key_exchange_group()
                .map(|g| g.name());
            assert_eq!(group, Some(rustls::NamedGroup::X25519MLKEM768));
            let host = format!("{sni}:{}", addr.port());
            let (status, v, body) = get(tls, &host, "/x?y=1").await;
            assert_eq!(
                (status, v),
                (StatusCode::OK, version),
                "{sni} {alpn:?}: {body}"
            );
            assert_eq!(field(&body, "SCHEME"), "=https", "{body}");
            assert_eq!(field(&body, "TLS_PROTOCOL"), "=TLSv1.3", "{body}");
            assert_eq!(field(&body, "TLS_SNI"), format!("={sni}"), "{body}");
            assert_eq!(field(&body, "HTTP_VERSION"), shown, "{body}");
            assert_eq!(
                field(&body, "URL"),
                format!("=https://{host}/x?y=1"),
                "{body}"
            );
        }
    }
    // A CGI program learns it too (RFC 3875 and Apache's variables).
    let tls = connect(addr, "a.test", &[b"h2"], &pki.ca).await.unwrap();
    let (_, _, env) = get(tls, &format!("a.test:{}", addr.port()), "/cgi/env").await;
    for want in [
        "HTTPS=on".to_string(),
        "REQUEST_SCHEME=https".into(),
        format!("SERVER_PORT={}", addr.port()),
        "SERVER_NAME=a.test".into(),
    ] {
        assert!(env.lines().any(|l| l == want), "{want} missing from {env}");
    }
    // So does a wasi:http component (the request's scheme).
    let tls = connect(addr, "a.test", &[b"h2"], &pki.ca).await.unwrap();
    let (status, _, info) = get(tls, "a.test", "/component/info").await;
    assert_eq!(status, StatusCode::OK, "{info}");
    assert!(info.ends_with("scheme=https\n"), "{info}");
    // TLS 1.2 clients are served too.
    let tls = connect_with(
        addr,
        "a.test",
        &[b"h2"],
        &pki.ca,
        &[&rustls::version::TLS12],
    )
    .await
    .expect("TLS 1.2 handshake");
    let (status, _, body) = get(tls, "a.test", "/").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(field(&body, "TLS_PROTOCOL"), "=TLSv1.2", "{body}");
    // The cleartext listener still answers, as plain HTTP.
    let r = s.get("/").await;
    assert_eq!(field(&r.text(), "SCHEME"), "=http", "{}", r.text());
    assert_eq!(field(&r.text(), "TLS_SNI").chars().next(), Some('!'));

    let m = s.metrics().await;
    assert!(metric(&m, "tern_tls_handshakes_total ") >= 9.0, "{m}");
    let expiry = metric(
        &m,
        "tern_tls_certificate_expiry_timestamp_seconds{certificate=\"a.test\"} ",
    );
    assert!(expiry > tern::datadir::now() as f64, "{m}");
    assert!(m.contains("tern_tls_certificate_expiry_timestamp_seconds{certificate=\"default\"}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_speaks_https_and_h2_to_the_tls_listener() {
    let pki = Pki::new();
    let (s, addr, _) = a_test_server(&pki).await;
    let ca = s.path("ca.pem");
    std::fs::write(&ca, &pki.ca_pem).unwrap();
    let port = addr.port();
    for (flag, version) in [("--http2", "=HTTP/2"), ("--http1.1", "=HTTP/1.1")] {
        let args = [
            "-sS".to_string(),
            "--fail".into(),
            flag.into(),
            "--cacert".into(),
            ca.display().to_string(),
            "--resolve".into(),
            format!("a.test:{port}:127.0.0.1"),
            format!("https://a.test:{port}/"),
        ];
        let out = tokio::task::spawn_blocking(move || {
            std::process::Command::new("curl").args(args).output()
        })
        .await
        .unwrap()
        .expect("curl (Debian's curl) is installed");
        let body = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(field(&body, "HTTP_VERSION"), version, "{body}");
        assert_eq!(field(&body, "TLS_SNI"), "=a.test", "{body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_and_stalled_handshakes_are_closed_and_counted_by_reason() {
    let pki = Pki::new();
    // No default certificate: a name nobody serves gets no certificate.
    let (s, addr, _) = a_test_server(&pki).await;

    // A client that connects and says nothing is closed at the handshake deadline (1 s here,
    // not the default 10 s): not before it, and well before the default.
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let mut buf = [0u8; 64];
    let started = std::time::Instant::now();
    let closed = tokio::time::timeout(Duration::from_secs(10), silent.read(&mut buf)).await;
    let took = started.elapsed();
    assert!(matches!(closed, Ok(Ok(0)) | Ok(Err(_))), "{closed:?}");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(5),
        "closed after {took:?}, not at the 1 s deadline"
    );

    // Plain HTTP to the TLS port: not TLS.
    let mut plain = TcpStream::connect(addr).await.unwrap();
    plain
        .write_all(b"GET / HTTP/1.1\r\nhost: a.test\r\n\r\n")
        .await
        .unwrap();
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), plain.read_to_end(&mut rest))
        .await
        .expect("plain HTTP to the TLS port is closed, not left waiting");
    assert!(
        !String::from_utf8_lossy(&rest).contains("200"),
        "{read:?}: {rest:?}"
    );

    // A name no certificate serves, and no default.
    let e = connect(addr, "nobody.test", &[], &pki.ca)
        .await
        .expect_err("refused");
    assert!(e.to_string().to_lowercase().contains("alert"), "{e}");

    // A client that does not trust the certificate (it has another CA).
    let other = Pki::new();
    let e = connect(addr, "a.test", &[], &other.ca)
        .await
        .expect_err("refused");
    assert!(e.to_string().contains("certificate"), "{e}");

    // And the listener still serves.
    let tls = connect(addr, "a.test", &[b"h2"], &pki.ca)
        .await
        .expect("handshake");
    assert_eq!(get(tls, "a.test", "/").await.0, StatusCode::OK);

    let mut m = String::new();
    for _ in 0..50 {
        m = s.metrics().await;
        let counted = ["timeout", "protocol", "no_certificate", "alert"]
            .iter()
            .all(|r| {
                metric_or_zero(
                    &m,
                    &format!("tern_tls_handshake_failures_total{{reason=\"{r}\"}}"),
                ) >= 1.0
            });
        if counted {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("every failure counted by its reason: {m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshakes_past_the_cap_are_closed_at_once_and_counted_busy() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    pki.issue(dir.path(), "a", &["a.test"]);
    let s = tls_server_with(
        dir,
        "max_tls_handshakes = 1\nruntime = \"shared\"\n",
        "[[certificate]]\ncert = \"a.crt\"\nkey = \"a.key\"\n",
    )
    .await
    .expect("start");
    let addr = s.running.tls_addr.unwrap();
    // A client that says nothing holds the one handshake slot until the deadline (1 s), once
    // the server has taken its connection (the gauge says so).
    let _silent = TcpStream::connect(addr).await.unwrap();
    let in_progress = |m: &str| metric_or_zero(m, "tern_tls_handshakes_in_progress");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while in_progress(&s.metrics().await) < 1.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the silent client's handshake never counted in progress"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Another client is refused at once, not at the deadline.
    let busy = |m: &str| metric_or_zero(m, "tern_tls_handshake_failures_total{reason=\"busy\"}");
    let tried = std::time::Instant::now();
    assert!(
        connect(addr, "a.test", &[], &pki.ca).await.is_err(),
        "a handshake was taken while the silent client held the only slot"
    );
    assert!(
        tried.elapsed() < Duration::from_millis(500),
        "refused only after {:?}",
        tried.elapsed()
    );
    assert_eq!(busy(&s.metrics().await), 1.0);
    // Once the silent one is timed out, handshakes are taken again.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let m = s.metrics().await;
        let timeouts = metric_or_zero(&m, "tern_tls_handshake_failures_total{reason=\"timeout\"}");
        if timeouts >= 1.0 && in_progress(&m) == 0.0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the silent client was never timed out and its slot given back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let tls = connect(addr, "a.test", &[], &pki.ca)
        .await
        .expect("handshake");
    assert_eq!(get(tls, "a.test", "/").await.0, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_and_wrong_host_certificates_are_refused_by_clients_and_counted() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    // An expired certificate for e.test: loaded with a warning (it is the one there is).
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec!["e.test".to_string()]).unwrap();
    params.not_before = rcgen::date_time_ymd(2020, 1, 1);
    params.not_after = rcgen::date_time_ymd(2021, 1, 1);
    let cert = params.signed_by(&key, &pki.issuer).unwrap();
    std::fs::write(dir.path().join("e.crt"), cert.pem()).unwrap();
    std::fs::write(dir.path().join("e.key"), key.serialize_pem()).unwrap();
    // The default certificate is for d.test only.
    pki.issue(dir.path(), "d", &["d.test"]);
    let s = tls_server(
        dir,
        "[[certificate]]\nhosts = [\"e.test\"]\ncert = \"e.crt\"\nkey = \"e.key\"\n\
         [[certificate]]\ncert = \"d.crt\"\nkey = \"d.key\"\n",
    )
    .await
    .expect("an expired certificate does not stop the start");
    let addr = s.running.tls_addr.unwrap();
    let m = s.metrics().await;
    let expiry = metric(
        &m,
        "tern_tls_certificate_expiry_timestamp_seconds{certificate=\"e.test\"} ",
    );
    assert!(expiry > 0.0 && expiry < tern::datadir::now() as f64, "{m}");

    let e = connect(addr, "e.test", &[], &pki.ca)
        .await
        .expect_err("expired");
    assert!(format!("{e:?}").contains("Expired"), "{e:?}");
    // A name only the default serves gets the default, which is not valid for it.
    let e = connect(addr, "x.test", &[], &pki.ca)
        .await
        .expect_err("wrong host");
    assert!(format!("{e:?}").contains("NotValidForName"), "{e:?}");
    // The server counts the clients' refusals, and serves the names it has.
    let tls = connect(addr, "d.test", &[], &pki.ca).await.expect("d.test");
    assert_eq!(get(tls, "d.test", "/").await.0, StatusCode::OK);
    let mut alerts = 0.0;
    for _ in 0..50 {
        alerts = metric(
            &s.metrics().await,
            "tern_tls_handshake_failures_total{reason=\"alert\"} ",
        );
        if alerts >= 2.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(alerts >= 2.0, "{alerts}");
}

/// The server's order of cipher suites decides, not the client's (what testssl.sh grades as
/// "server cipher order"): OpenSSL's client listing ChaCha20 first gets AES-GCM, over TLS 1.3
/// and TLS 1.2 alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_chooses_the_cipher_suite_from_what_the_client_offers() {
    let pki = Pki::new();
    let (_s, addr, _) = a_test_server(&pki).await;
    for (version, option, offer, want) in [
        (
            "-tls1_3",
            "-ciphersuites",
            "TLS_CHACHA20_POLY1305_SHA256:TLS_AES_128_GCM_SHA256",
            "TLS_AES_128_GCM_SHA256",
        ),
        (
            "-tls1_2",
            "-cipher",
            "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-ECDSA-AES128-GCM-SHA256",
            "ECDHE-ECDSA-AES128-GCM-SHA256",
        ),
    ] {
        let args = [
            "s_client".to_string(),
            "-connect".into(),
            addr.to_string(),
            "-servername".into(),
            "a.test".into(),
            version.into(),
            option.into(),
            offer.into(),
        ];
        let out = tokio::task::spawn_blocking(move || {
            std::process::Command::new("openssl")
                .args(args)
                .stdin(std::process::Stdio::null())
                .output()
        })
        .await
        .unwrap()
        .expect("openssl (Debian's) is installed");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains(&format!("Cipher is {want}"))
                || text.contains(&format!("Cipher    : {want}")),
            "{version} offering {offer}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
