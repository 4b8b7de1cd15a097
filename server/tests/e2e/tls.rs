//! The TLS listener, with real clients: certificates made here (rcgen) picked by SNI (exact,
//! wildcard, default), HTTP/2 and HTTP/1.1 chosen by ALPN, what guests see of the session,
//! handshakes that fail or stall closed and counted by reason, and certificate files refused
//! at start with a clear error.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode, Version};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::support::TestServer;

/// A CA made for the test.
pub(crate) struct Pki {
    pub(crate) ca: CertificateDer<'static>,
    pub(crate) ca_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Pki {
    pub(crate) fn new() -> Self {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        // Subject names of their own: OpenSSL takes a certificate whose issuer is its subject
        // for self-signed.
        params
            .distinguished_name
            .push(DnType::CommonName, "Tern test CA");
        let cert = params.self_signed(&key).unwrap();
        Self {
            ca: cert.der().clone(),
            ca_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A certificate for `names`, written to `dir/FILE.crt` and `dir/FILE.key`.
    pub(crate) fn issue(&self, dir: &Path, file: &str, names: &[&str]) -> CertificateDer<'static> {
        let key = KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names.clone()).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, names[0].as_str());
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        std::fs::write(dir.join(format!("{file}.crt")), cert.pem()).unwrap();
        std::fs::write(dir.join(format!("{file}.key")), key.serialize_pem()).unwrap();
        cert.der().clone()
    }
}

/// A TLS connection to `addr` asking for `sni`, offering `alpn`, trusting `ca` only.
async fn connect(
    addr: SocketAddr,
    sni: &str,
    alpn: &[&[u8]],
    ca: &CertificateDer<'static>,
) -> std::io::Result<TlsStream<TcpStream>> {
    connect_with(addr, sni, alpn, ca, rustls::DEFAULT_VERSIONS).await
}

/// [`connect`] offering only the TLS `versions`.
async fn connect_with(
    addr: SocketAddr,
    sni: &str,
    alpn: &[&[u8]],
    ca: &CertificateDer<'static>,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> std::io::Result<TlsStream<TcpStream>> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone()).unwrap();
    let mut config = rustls::ClientConfig::builder_with_protocol_versions(versions)
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from(sni.to_string()).unwrap();
    connector.connect(name, tcp).await
}

/// `GET path` over `tls` with HTTP/2 if ALPN chose it, else HTTP/1.1: status, version, body.
async fn get(tls: TlsStream<TcpStream>, host: &str, path: &str) -> (StatusCode, Version, String) {
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
    let io = TokioIo::new(tls);
    let request = |version| {
        Request::get(format!("https://{host}{path}"))
            .version(version)
            .header("host", host)
            .body(Empty::<Bytes>::new())
            .unwrap()
    };
    let response = if h2 {
        let (mut sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .unwrap();
        tokio::spawn(conn);
        sender.send_request(request(Version::HTTP_2)).await.unwrap()
    } else {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
        tokio::spawn(conn);
        sender
            .send_request(request(Version::HTTP_11))
            .await
            .unwrap()
    };
    let (status, version) = (response.status(), response.version());
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, version, String::from_utf8_lossy(&body).into_owned())
}

/// The value the `context` guest printed for `key` (`=value`, or `!errno`).
fn field<'a>(body: &'a str, key: &str) -> &'a str {
    body.lines()
        .find_map(|l| l.strip_prefix(key).filter(|v| v.starts_with(['=', '!'])))
        .unwrap_or_else(|| panic!("{key} missing from {body}"))
}

/// A server with a TLS listener serving `certificates` (TOML `[[certificate]]` tables) and the
/// `context` guest at `/`; the certificate files are in its directory.
async fn tls_server(dir: tempfile::TempDir, certificates: &str) -> anyhow::Result<TestServer> {
    tls_server_with(dir, "", certificates).await
}

/// [`tls_server`] with more `[server]` settings.
async fn tls_server_with(
    dir: tempfile::TempDir,
    server: &str,
    certificates: &str,
) -> anyhow::Result<TestServer> {
    crate::support::test_guest(dir.path(), "context");
    crate::support::test_guest(dir.path(), "cgi_probe");
    crate::support::test_component(dir.path(), "component");
    let config = format!(
        "[server]\ntls_listen = \"127.0.0.1:0\"\ntls_handshake_timeout_ms = 1000\n{server}\
         [pool]\ninstances = 16\nmax_memory_mib = 64\n\
         [[tenant]]\nname = \"ctx\"\nmodule = \"context.wasm\"\n\
         [[tenant]]\nname = \"cgi\"\nmodule = \"cgi_probe.wasm\"\npaths = [\"/cgi\"]\n\
         [[tenant]]\nname = \"comp\"\nmodule = \"component.wasm\"\npaths = [\"/component\"]\n\
         {certificates}"
    );
    TestServer::try_start_in(dir, &config).await
}

/// A server whose TLS listener serves one certificate, for `a.test` (no default): the server,
/// the listener's address, the certificate.
async fn a_test_server(pki: &Pki) -> (TestServer, SocketAddr, CertificateDer<'static>) {
    let dir = tempfile::tempdir().unwrap();
    let cert = pki.issue(dir.path(), "a", &["a.test"]);
    let s = tls_server(
        dir,
        "[[certificate]]\nhosts = [\"a.test\"]\ncert = \"a.crt\"\nkey = \"a.key\"\n",
    )
    .await
    .expect("start");
    let addr = s.running.tls_addr.expect("a TLS listener");
    (s, addr, cert)
}

/// The value of the series `line_start` names (with its trailing space); the test fails if
/// there is none.
fn metric(text: &str, line_start: &str) -> f64 {
    crate::support::metric_value(text, line_start.trim_end())
}

/// The value of `series`, 0 if it has not counted yet (its metric must exist).
fn metric_or_zero(text: &str, series: &str) -> f64 {
    crate::support::metric_value_or_zero(text, series)
}

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
