//! HTTPS as a tenant sees it: the README's commands, redirects from cleartext, a TLS listener alone, HSTS.

use super::*;

/// The README's HTTPS commands, as written there: `openssl req` for a self-signed `localhost`
/// certificate, `tern serve --tls-listen --tls-cert --tls-key` (here on an ephemeral port), and
/// curl trusting that certificate.
#[test]
fn the_readme_https_commands_serve_the_demo_over_https() {
    let readme = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"),
    )
    .unwrap();
    let line = |start: &str| {
        readme
            .lines()
            .find(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("README has no `{start}` line"))
            .to_string()
    };
    let dir = tempfile::tempdir().unwrap();
    let openssl = line("openssl req ");
    crate::support::ran(
        std::process::Command::new("sh")
            .args(["-c", &openssl])
            .current_dir(dir.path()),
    );
    // `cargo run --release -p tern -- serve ARGS` is the binary with ARGS.
    let serve = line("cargo run --release -p tern -- serve --tls-listen");
    let args: Vec<String> = serve
        .split_whitespace()
        .skip_while(|w| *w != "serve")
        .skip(1)
        .map(|w| match w {
            "127.0.0.1:8443" => "127.0.0.1:0".to_string(),
            "cert.pem" | "key.pem" => dir.path().join(w).display().to_string(),
            w => w.to_string(),
        })
        .collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let p = crate::support::TernProcess::serve(&args, &dir.path().join("cache"));
    let tls = p.tls.clone().expect("the HTTPS address in the log");
    let port = tls.rsplit(':').next().unwrap();
    let curl = line("curl --cacert cert.pem https://");
    assert!(curl.contains("https://localhost:8443/hello"), "{curl}");
    let out = crate::support::ran(
        std::process::Command::new("curl")
            .args(["-sS", "--fail", "--cacert"])
            .arg(dir.path().join("cert.pem"))
            .arg(format!("https://localhost:{port}/hello")),
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("Hello"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_with_https_redirect_sends_cleartext_clients_to_https() {
    use crate::support::send;
    use http::Method;
    let pki = Pki::new();
    let start = async |public_port: u16| {
        let dir = tempfile::tempdir().unwrap();
        pki.issue(dir.path(), "a", &["a.test", "b.test"]);
        crate::support::test_guest(dir.path(), "context");
        let config = format!(
            "[server]\ntls_listen = \"127.0.0.1:0\"\npublic_https_port = {public_port}\n\
             [pool]\ninstances = 8\nmax_memory_mib = 64\n\
             [[tenant]]\nname = \"secure\"\nmodule = \"context.wasm\"\nhosts = [\"a.test\"]\n\
             https_redirect = true\n\
             [[tenant]]\nname = \"plain\"\nmodule = \"context.wasm\"\nhosts = [\"b.test\"]\n\
             [[certificate]]\ncert = \"a.crt\"\nkey = \"a.key\"\n"
        );
        TestServer::try_start_in(dir, &config).await
    };
    let s = start(0).await.expect("start");
    let tls = s.running.tls_addr.unwrap();
    let r = send(
        s.addr(),
        Method::GET,
        "/x/y?z=1",
        Some("a.test:8080"),
        &[],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.status, 308, "{}", r.text());
    assert_eq!(
        r.header("location"),
        format!("https://a.test:{}/x/y?z=1", tls.port())
    );
    // A 308 keeps the method and body: a POST is sent on, not turned into a GET.
    let r = send(
        s.addr(),
        Method::POST,
        "/form",
        Some("a.test"),
        &[],
        Bytes::from("k=v"),
    )
    .await;
    assert_eq!(r.status, 308);
    // Over HTTPS it is served; a tenant without the setting is served in cleartext.
    let conn = connect(tls, "a.test", &[b"http/1.1"], &pki.ca)
        .await
        .unwrap();
    let (status, _, body) = get(conn, "a.test", "/x").await;
    assert_eq!(status, 200);
    assert_eq!(field(&body, "SCHEME"), "=https");
    let r = send(
        s.addr(),
        Method::GET,
        "/",
        Some("b.test"),
        &[],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.status, 200);

    // Behind a load balancer that listens on 443: no port in the URL.
    let s443 = start(443).await.expect("start");
    let r = send(
        s443.addr(),
        Method::GET,
        "/p",
        Some("a.test"),
        &[],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.header("location"), "https://a.test/p");

    // Without a TLS listener the setting is refused, in the file and through the API.
    let e = TestServer::try_start(
        "[[tenant]]\nname = \"t\"\nmodule = \"m.wasm\"\nhttps_redirect = true\n",
    )
    .await
    .err()
    .expect("refused");
    assert!(
        format!("{e:#}").contains("https_redirect needs the TLS listener"),
        "{e:#}"
    );
    let plain = TestServer::start("").await;
    let (status, v) = plain
        .admin_call(
            Method::PUT,
            "/admin/v1/tenants/t",
            r#"{"https_redirect": true}"#,
        )
        .await;
    assert_eq!(status, 400, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("https_redirect needs the TLS listener")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_listen_off_the_tls_listener_serves_alone() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    pki.issue(dir.path(), "a", &["a.test"]);
    let s = tls_server_with(
        dir,
        "listen = \"off\"\n",
        "[[certificate]]\ncert = \"a.crt\"\nkey = \"a.key\"\n",
    )
    .await
    .expect("start");
    assert_eq!(s.running.addr, None, "no cleartext listener");
    let conn = connect(s.running.tls_addr.unwrap(), "a.test", &[b"h2"], &pki.ca)
        .await
        .unwrap();
    let (status, version, _) = get(conn, "a.test", "/").await;
    assert_eq!((status, version), (StatusCode::OK, Version::HTTP_2));

    // Nothing left to serve, or an HTTP-01 challenge with nowhere to answer it: refused.
    for (config, want) in [
        (
            "[server]\nlisten = \"off\"\n",
            "nothing would serve the tenants",
        ),
        (
            "[server]\nlisten = \"off\"\ntls_listen = \"127.0.0.1:0\"\n[tls.acme]\n\
             directory = \"https://ca.test/dir\"\nchallenge = \"http-01\"\n",
            "use \"tls-alpn-01\"",
        ),
        ("[server]\nlisten = \"80\"\n", "\"80\" is not an address"),
    ] {
        let e = TestServer::try_start(config).await.err().expect("refused");
        assert!(format!("{e:#}").contains(want), "want {want:?}: {e:#}");
    }
}

/// A tenant's `hsts` setting is sent on its HTTPS responses, never over cleartext; a preload
/// request without what preloading needs is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hsts_goes_on_https_responses_only() {
    use crate::support::send;
    use http::Method;
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    pki.issue(dir.path(), "a", &["a.test", "b.test"]);
    crate::support::test_guest(dir.path(), "context");
    // The longest max age the server takes (two years, as documented); one second more is
    // refused at start.
    let max = tern::config::MAX_HSTS_SECONDS;
    assert_eq!(
        max,
        2 * 365 * 86_400,
        "docs/configuration.md says two years"
    );
    let config = |max_age: u64| {
        format!(
            "[server]\ntls_listen = \"127.0.0.1:0\"\n\
             [pool]\ninstances = 8\nmax_memory_mib = 64\n\
             [[tenant]]\nname = \"strict\"\nmodule = \"context.wasm\"\nhosts = [\"a.test\"]\n\
             [tenant.hsts]\nmax_age_seconds = {max_age}\ninclude_subdomains = true\npreload = true\n\
             [[tenant]]\nname = \"plain\"\nmodule = \"context.wasm\"\nhosts = [\"b.test\"]\n\
             [[certificate]]\ncert = \"a.crt\"\nkey = \"a.key\"\n"
        )
    };
    let over = tempfile::tempdir().unwrap();
    pki.issue(over.path(), "a", &["a.test", "b.test"]);
    crate::support::test_guest(over.path(), "context");
    let e = TestServer::try_start_in(over, &config(max + 1))
        .await
        .err()
        .expect("a max age over two years is refused");
    assert!(
        format!("{e:#}").contains("hsts.max_age_seconds must be at most"),
        "{e:#}"
    );
    let s = TestServer::try_start_in(dir, &config(max))
        .await
        .expect("start");
    let tls = s.running.tls_addr.unwrap();
    let over_tls = async |host: &str, path: &str| {
        let stream = connect(tls, host, &[b"http/1.1"], &pki.ca).await.unwrap();
        let io = TokioIo::new(stream);
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
        tokio::spawn(conn);
        let r = sender
            .send_request(
                Request::get(path)
                    .header("host", host)
                    .body(Empty::<Bytes>::new())
                    .unwrap(),
            )
            .await
            .unwrap();
        (
            r.status(),
            r.headers()
                .get("strict-transport-security")
                .map(|v| v.to_str().unwrap().to_string()),
        )
    };
    let want = Some(format!("max-age={max}; includeSubDomains; preload"));
    assert_eq!(
        over_tls("a.test", "/").await,
        (StatusCode::OK, want.clone())
    );
    // A request refused before it is routed has no tenant, so no tenant's setting.
    assert_eq!(
        over_tls("a.test", "/a%2Fb").await,
        (StatusCode::BAD_REQUEST, None),
        "refused before any tenant is routed: no tenant's setting applies"
    );
    assert_eq!(over_tls("b.test", "/").await, (StatusCode::OK, None));
    let r = send(
        s.addr(),
        Method::GET,
        "/",
        Some("a.test"),
        &[],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        r.header("strict-transport-security"),
        "",
        "never over cleartext"
    );

    // Through the admin API: a preload without what it needs is 400; a valid one applies.
    let (status, v) = crate::support::admin_request(
        s.admin(),
        crate::support::ADMIN_TOKEN,
        Method::PUT,
        "/admin/v1/tenants/api",
        Bytes::from(r#"{"hosts": ["c.test"], "hsts": {"max_age_seconds": 300, "preload": true}}"#),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert!(v["error"].as_str().unwrap().contains("preload"), "{v}");
}
