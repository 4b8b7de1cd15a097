//! HTTP/3 (`server.http3`: QUIC on the TLS listener's port), with clients nobody here wrote:
//! Python's aioquic (PyPI, `h3client.py`) and the `h3` crate's own client over quinn. Every demo
//! tenant and guest kind, bodies both ways from 1 B to 10 MB, many streams on one connection,
//! the advertisement (`Alt-Svc`), hostile clients (garbage datagrams, heads never finished,
//! oversized heads, a handshake flood), a client that changes address, a drain on shutdown,
//! and SIGTERM to `tern serve --http3` under load.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http::{Request, StatusCode};
use rustls::pki_types::CertificateDer;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::support::{TestServer, metric_value_or_zero, test_guest, tools_dir};
use crate::tls::Pki;

/// A server with HTTP/3 on: the demo tenants, the `context` guest at `/ctx`, the CGI probe at
/// `/probe`, `write_sized` at `/sized`, the test component at `/comp`, the echo demo with a 1 KiB
/// body limit at `/small` and with a 60 s time limit at `/big`; one certificate for `a.test`.
struct H3Server {
    s: TestServer,
    /// The TLS listener's address: TCP, and UDP for HTTP/3.
    addr: SocketAddr,
    pki: Pki,
    ca_file: PathBuf,
}

async fn h3_server(server: &str) -> H3Server {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    pki.issue(dir.path(), "a", &["a.test"]);
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &pki.ca_pem).unwrap();
    test_guest(dir.path(), "context");
    test_guest(dir.path(), "cgi_probe");
    test_guest(dir.path(), "write_sized");
    crate::support::test_component(dir.path(), "component");
    let demo = tern::config::DEMO_CONFIG;
    let demo_tenants = &demo[demo.find("[[tenant]]").unwrap()..];
    let config = format!(
        "[server]\ntls_listen = \"127.0.0.1:0\"\nhttp3 = true\n{server}\n\
         [pool]\ninstances = 16\nmax_memory_mib = 64\n\
         [[certificate]]\ncert = \"a.crt\"\nkey = \"a.key\"\n\
         [[tenant]]\nname = \"ctx\"\nmodule = \"context.wasm\"\npaths = [\"/ctx\"]\n\
         [[tenant]]\nname = \"probe\"\nmodule = \"cgi_probe.wasm\"\npaths = [\"/probe\"]\n\
         [[tenant]]\nname = \"sized\"\nmodule = \"write_sized.wasm\"\npaths = [\"/sized\"]\n\
         [[tenant]]\nname = \"comp\"\nmodule = \"component.wasm\"\npaths = [\"/comp\"]\n\
         [[tenant]]\nname = \"small\"\nmodule = \"builtin:echo\"\npaths = [\"/small\"]\n\
         [tenant.limits]\nmax_request_bytes = 1024\n\
         [[tenant]]\nname = \"big\"\nmodule = \"builtin:echo\"\npaths = [\"/big\"]\n\
         [tenant.limits]\ntimeout_ms = 60000\n\
         {demo_tenants}"
    );
    let s = TestServer::try_start_in(dir, &config)
        .await
        .unwrap_or_else(|e| panic!("server failed to start: {e:#}"));
    let addr = s.running.tls_addr.expect("a TLS listener");
    H3Server {
        s,
        addr,
        pki,
        ca_file,
    }
}

impl H3Server {
    /// Runs aioquic's client with `args` (one connection): one JSON answer per request.
    async fn aioquic(&self, args: &[&str]) -> Vec<Value> {
        let (ok, lines) = aioquic_at(self.addr, &self.ca_file, args).await;
        assert!(ok, "aioquic failed: {lines:?}");
        lines
    }

    /// A `POST` of `n` bytes (byte `i` is `i % 251`) with aioquic, and `more` arguments.
    async fn post(&self, path: &str, n: usize, more: &[&str]) -> Value {
        let n = n.to_string();
        let mut args = vec!["--method", "POST", "--path", path, "--body-bytes", &n];
        args.extend_from_slice(more);
        self.aioquic(&args).await.remove(0)
    }

    /// A connection of the `h3` crate's client.
    async fn h3(&self) -> H3Client {
        H3Client::connect(self.addr, &self.pki.ca)
            .await
            .expect("connect")
    }
}

/// aioquic's client against `addr`: whether it connected, and its answers.
pub(crate) async fn aioquic_at(
    addr: SocketAddr,
    ca: &std::path::Path,
    args: &[&str],
) -> (bool, Vec<Value>) {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/h3client.py");
    let mut command = std::process::Command::new("python3");
    command
        .arg(script)
        .env("PYTHONPATH", tools_dir().join("aioquic-1.7.2"))
        .args(["--connect", &addr.to_string(), "--authority", "a.test"])
        .arg("--cafile")
        .arg(ca)
        .args(args);
    let out = tokio::task::spawn_blocking(move || command.output())
        .await
        .unwrap()
        .expect("python3 runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let lines = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    if !out.status.success() {
        eprintln!("aioquic: {}", String::from_utf8_lossy(&out.stderr));
    }
    (out.status.success(), lines)
}

fn status(answer: &Value) -> u64 {
    answer["status"]
        .as_u64()
        .unwrap_or_else(|| panic!("no status: {answer}"))
}

fn text(answer: &Value) -> &str {
    answer["body"].as_str().unwrap_or_default()
}

/// The value the `context` guest printed for `key`.
fn field<'a>(body: &'a str, key: &str) -> &'a str {
    body.lines()
        .find_map(|l| l.strip_prefix(key).filter(|v| v.starts_with(['=', '!'])))
        .unwrap_or_else(|| panic!("{key} missing from {body}"))
}

/// The SHA-256 of `n` bytes `i % 251`, in hex (`write_sized`'s body, `h3client.py`'s upload).
fn pattern_sha(n: usize) -> String {
    let body: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
    Sha256::digest(&body)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A QUIC connection to `addr` for HTTP/3 (ALPN `h3`, trusting `ca`), with no HTTP/3 on it
/// yet; `window`: at most that many bytes per stream until read (and 16 times that on the
/// connection, so one stalled stream does not hold back the heads of the others).
async fn quic_connect(
    addr: SocketAddr,
    ca: &CertificateDer<'static>,
    window: Option<u32>,
) -> anyhow::Result<(quinn::Endpoint, quinn::Connection)> {
    let endpoint = quinn::Endpoint::client("127.0.0.1:0".parse()?)?;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone())?;
    let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])?
    .with_root_certificates(roots)
    .with_no_client_auth();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    let mut config = quinn::ClientConfig::new(Arc::new(
        quinn::crypto::rustls::QuicClientConfig::try_from(tls)?,
    ));
    if let Some(window) = window {
        let mut transport = quinn::TransportConfig::default();
        transport
            .stream_receive_window(window.into())
            .receive_window((16 * window).into());
        config.transport_config(Arc::new(transport));
    }
    let quic = endpoint.connect_with(config, addr, "a.test")?.await?;
    Ok((endpoint, quic))
}

/// A client connection of the `h3` crate over quinn, trusting the test CA.
pub(crate) struct H3Client {
    endpoint: quinn::Endpoint,
    quic: quinn::Connection,
    pub(crate) send: h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>,
}

/// An answer: status and body.
struct Answer {
    status: StatusCode,
    body: Bytes,
}

impl H3Client {
    async fn connect(addr: SocketAddr, ca: &CertificateDer<'static>) -> anyhow::Result<Self> {
        Self::connect_with(addr, ca, None).await
    }

    /// A connection that grants the server at most `window` bytes per stream until the client
    /// reads: `Some(small)` is a client slow to read.
    pub(crate) async fn connect_with(
        addr: SocketAddr,
        ca: &CertificateDer<'static>,
        window: Option<u32>,
    ) -> anyhow::Result<Self> {
        let (endpoint, quic) = quic_connect(addr, ca, window).await?;
        let (mut driver, send) = h3::client::new(h3_quinn::Connection::new(quic.clone())).await?;
        tokio::spawn(async move { std::future::poll_fn(|cx| driver.poll_close(cx)).await });
        Ok(Self {
            endpoint,
            quic,
            send,
        })
    }
    /// Sends `method path` with `body` and reads the whole answer.
    async fn request(&mut self, method: &str, path: &str, body: &[u8]) -> anyhow::Result<Answer> {
        let req = Request::builder()
            .method(method)
            .uri(format!("https://a.test{path}"))
            .body(())?;
        let mut stream = self.send.send_request(req).await?;
        if !body.is_empty() {
            stream.send_data(Bytes::copy_from_slice(body)).await?;
        }
        // The server may have answered and asked the client to stop sending (H3_NO_ERROR)
        // before the request's end is sent: the answer stands (RFC 9114 §4.1.2).
        let _ = stream.finish().await;
        let head = stream.recv_response().await?;
        let mut got = Vec::new();
        while let Some(mut chunk) = stream.recv_data().await? {
            got.extend_from_slice(&chunk.copy_to_bytes(chunk.remaining()));
        }
        Ok(Answer {
            status: head.status(),
            body: got.into(),
        })
    }

    async fn get(&mut self, path: &str) -> anyhow::Result<Answer> {
        self.request("GET", path, b"").await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aioquic_is_served_every_demo_tenant_and_guest_kind_over_http3() {
    let h = h3_server("").await;
    // Each demo tenant answers over HTTP/3 as it does over HTTP/1.1.
    for (method, path) in [
        ("GET", "/hello"),
        ("POST", "/echo/x?y=1"),
        ("GET", "/json"),
        ("GET", "/component"),
        ("GET", "/cgi"),
        ("GET", "/counter"),
        ("GET", "/visits"),
    ] {
        let answer = &h.aioquic(&["--method", method, "--path", path]).await[0];
        let plain = crate::support::send(
            h.s.addr(),
            method.parse().unwrap(),
            path,
            None,
            &[],
            Bytes::new(),
        )
        .await;
        assert_eq!(
            status(answer),
            u64::from(plain.status.as_u16()),
            "{path}: {answer}"
        );
        assert_eq!(
            answer["headers"]["content-type"].as_str(),
            Some(plain.header("content-type")),
            "{path}"
        );
        // The same body as over HTTP/1.1: the echo's request lines aside, and the visits
        // counter, which the HTTP/1.1 request (the later one) found one further.
        match path {
            "/visits" => {
                let visit = |t: &str| -> u64 {
                    t.trim()
                        .strip_prefix("visit ")
                        .and_then(|n| n.parse().ok())
                        .unwrap_or_else(|| panic!("not a visit: {t:?}"))
                };
                assert_eq!(visit(text(answer)) + 1, visit(&plain.text()), "{path}");
            }
            p if p.starts_with("/echo") => {}
            _ => assert_eq!(text(answer), plain.text(), "{path}"),
        }
        if path == "/hello" {
            assert_eq!(text(answer), "Hello from Tern!\n");
            assert_eq!(answer["headers"]["content-length"], "17");
            assert!(answer["headers"]["server-timing"].is_string(), "{answer}");
            assert!(answer["headers"]["date"].is_string(), "{answer}");
        }
        if path.starts_with("/echo") {
            assert!(text(answer).starts_with("POST /echo/x?y=1\n"), "{answer}");
        }
    }
    // What a guest learns of the request: HTTP/3, over TLS 1.3, the name the client asked for.
    let answer = &h.aioquic(&["--path", "/ctx/a?b=c"]).await[0];
    let body = text(answer);
    assert_eq!(field(body, "HTTP_VERSION"), "=HTTP/3", "{body}");
    assert_eq!(field(body, "SCHEME"), "=https", "{body}");
    assert_eq!(field(body, "TLS_PROTOCOL"), "=TLSv1.3", "{body}");
    assert_eq!(field(body, "TLS_SNI"), "=a.test", "{body}");
    assert_eq!(field(body, "URL"), "=https://a.test/ctx/a?b=c", "{body}");
    // A CGI program: `HTTP/3.0`, as RFC 3875's `HTTP/major.minor` (HTTP/2 is `HTTP/2.0`).
    let answer = &h.aioquic(&["--path", "/probe/env"]).await[0];
    let env = text(answer);
    for want in [
        "SERVER_PROTOCOL=HTTP/3.0",
        "HTTPS=on",
        "REQUEST_SCHEME=https",
    ] {
        assert!(env.lines().any(|l| l == want), "{want} missing from {env}");
    }
    // A wasi:http component sees https.
    let answer = &h.aioquic(&["--path", "/comp/info"]).await[0];
    assert!(text(answer).ends_with("scheme=https\n"), "{answer}");
    // Counted and logged as HTTP/3.
    let m = h.s.metrics().await;
    assert!(
        metric_value_or_zero(
            &m,
            r#"tern_requests_total{deployment="current",status="2xx",tenant="hello",trigger="request",version="3"}"#
        ) >= 1.0,
        "{m}"
    );
}

/// A request over HTTP/3 is in its tenant's live log as one (`tern logs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http3_requests_are_in_the_live_log_as_http3() {
    let h = h3_server("").await;
    let mut client = h.h3().await;
    let answer = client.get("/hello").await.expect("an answer");
    assert_eq!(answer.status, StatusCode::OK);
    let log = crate::logs::log_of(&h.s, "hello", "").await;
    let records: Vec<Value> = log
        .text()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), 1, "{}", log.text());
    assert_eq!(records[0]["http"], "3");
    assert_eq!(records[0]["status"], 200);
    assert_eq!(records[0]["path"], "/hello");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http3_is_advertised_on_the_tls_listener_only() {
    let h = h3_server("").await;
    let port = h.addr.port();
    // HTTP/2 and HTTP/1.1 over TLS carry the advertisement (curl, a client of its own).
    for version in ["--http2", "--http1.1"] {
        let out = std::process::Command::new("curl")
            .args(["-sS", "-o", "/dev/null", "-D", "-", version, "--cacert"])
            .arg(&h.ca_file)
            .args([
                "--resolve",
                &format!("a.test:{port}:127.0.0.1"),
                &format!("https://a.test:{port}/hello"),
            ])
            .output()
            .unwrap();
        let head = String::from_utf8_lossy(&out.stdout).to_lowercase();
        assert!(
            head.contains(&format!("alt-svc: h3=\":{port}\"; ma=86400")),
            "{version}: {head}"
        );
    }
    // Not the cleartext listener: HTTP/3 is for https origins.
    let r = h.s.get("/hello").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("alt-svc"), "");

    // Withdrawn: `clear`, for clients that remember the old one.
    let h = h3_server("http3_alt_svc_max_age_secs = 0\n").await;
    let tls = h.addr;
    let out = std::process::Command::new("curl")
        .args(["-sS", "-o", "/dev/null", "-D", "-", "--cacert"])
        .arg(&h.ca_file)
        .args([
            "--resolve",
            &format!("a.test:{}:127.0.0.1", tls.port()),
            &format!("https://a.test:{}/hello", tls.port()),
        ])
        .output()
        .unwrap();
    let head = String::from_utf8_lossy(&out.stdout).to_lowercase();
    assert!(head.contains("alt-svc: clear"), "{head}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_stream_both_ways_over_http3_from_1_byte_to_10_mb() {
    let h = h3_server("").await;
    for n in [1usize, 65_536, 10_000_000] {
        // Up: the echo demo streams the body back after its own lines. (At `/big`: a guest's
        // time limit counts its wait for the client's body, and the Python client takes
        // 3-4 s to send 10 MB when the suite loads both cores; the demo's 1 s cut it off.)
        let answer = &h.post("/big", n, &[]).await;
        assert_eq!(status(answer), 200, "{n}: {answer}");
        assert_eq!(answer["tail_sha256"], answer["sent_sha256"], "{n} up");
        // Down: `write_sized` in 64 KiB writes.
        let path = format!("/sized?n={n}&chunk=65536");
        let answer = &h.aioquic(&["--path", &path]).await[0];
        assert_eq!(status(answer), 200, "{n}: {answer}");
        assert_eq!(answer["body_bytes"].as_u64(), Some(n as u64), "{n} down");
        assert_eq!(answer["body_sha256"].as_str().unwrap(), pattern_sha(n));
    }
    // A component streams the body back too.
    let answer = &h.post("/component/echo", 1_000_000, &[]).await;
    assert_eq!(status(answer), 200, "{answer}");
    assert_eq!(answer["body_sha256"], answer["sent_sha256"]);
    // The tenant's body limit, at it and one past it.
    assert_eq!(status(&h.post("/small", 1024, &[]).await), 200);
    assert_eq!(status(&h.post("/small", 1025, &[]).await), 413);
    // A body that does not match its Content-Length is refused, not taken as whole.
    let answer = &h
        .post("/echo", 10, &["--header", "content-length:20"])
        .await;
    assert_eq!(status(answer), 400, "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_streams_share_one_http3_connection_within_its_stream_cap() {
    let h = h3_server("http3_max_streams = 8\n").await;
    let answers = h.aioquic(&["--path", "/hello", "--count", "200"]).await;
    assert_eq!(answers.len(), 200);
    for answer in &answers {
        assert_eq!(status(answer), 200, "{answer}");
        assert_eq!(text(answer), "Hello from Tern!\n");
    }
    // The h3 crate's client on one connection, one request after another.
    let mut c = h.h3().await;
    for _ in 0..20 {
        let a = c.get("/hello").await.unwrap();
        assert_eq!(a.status, StatusCode::OK);
        assert_eq!(&a.body[..], b"Hello from Tern!\n");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_http3_clients_do_not_disturb_the_others() {
    let h = h3_server("header_read_timeout_ms = 1000\nmax_header_bytes = 8192\n").await;
    // Garbage datagrams of every size.
    let junk = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    for i in 0..2000usize {
        let len = 1 + (i * 37) % 1400;
        let bytes: Vec<u8> = (0..len).map(|j| ((i * 31 + j * 17) % 256) as u8).collect();
        let _ = junk.send_to(&bytes, h.addr);
    }
    // Request streams whose head never ends: each is dropped after the header timeout.
    let mut c = h.h3().await;
    // (Their sending sides stay open: a stream that ends inside a frame is a connection
    // error, RFC 9114 §7.1, and the server closes the connection for it.)
    let (mut stalled, mut open) = (Vec::new(), Vec::new());
    for _ in 0..20 {
        let (mut send, mut recv) = c.quic.open_bi().await.unwrap();
        // A HEADERS frame's type and a length longer than what follows.
        send.write_all(&[0x01, 0x40, 0x80, 0x00]).await.unwrap();
        open.push(send);
        stalled.push(tokio::spawn(async move {
            let mut buf = [0u8; 64];
            recv.read(&mut buf).await
        }));
    }
    // Meanwhile the same connection serves others.
    let a = c.get("/hello").await.unwrap();
    assert_eq!(a.status, StatusCode::OK);
    for s in stalled {
        let read = tokio::time::timeout(Duration::from_secs(10), s)
            .await
            .expect("a stalled stream is ended by the server")
            .unwrap();
        assert!(
            !matches!(read, Ok(Some(n)) if n > 0),
            "a stalled head got an answer: {read:?}"
        );
    }
    drop(open);
    // A head over max_header_bytes is refused; the next client is served.
    let big = format!("x-big:{}", "a".repeat(9000));
    let (_, answers) =
        aioquic_at(h.addr, &h.ca_file, &["--path", "/hello", "--header", &big]).await;
    assert_eq!(
        answers.len(),
        1,
        "no outcome for the oversized head: {answers:?}"
    );
    assert!(
        answers[0]["error"].is_string() || answers[0]["status"].as_u64() == Some(431),
        "an oversized head was not refused: {answers:?}"
    );
    let answer = &h.aioquic(&["--path", "/hello"]).await[0];
    assert_eq!(status(answer), 200);
    // (`c` has idled past the 1 s limit meanwhile, and is closed: a new connection.)
    let a = h.h3().await.get("/hello").await.unwrap();
    assert_eq!(a.status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_changes_address_keeps_its_http3_connection() {
    let h = h3_server("").await;
    let mut c = h.h3().await;
    let before = c.get("/ctx").await.unwrap();
    let port_before = field(std::str::from_utf8(&before.body).unwrap(), "CLIENT_PORT").to_string();
    assert_eq!(
        port_before,
        format!("={}", c.endpoint.local_addr().unwrap().port())
    );
    // The client's socket changes (a phone moving between networks): same connection.
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let new_port = socket.local_addr().unwrap().port();
    c.endpoint.rebind(socket).unwrap();
    let after = c.get("/ctx").await.unwrap();
    assert_eq!(after.status, StatusCode::OK);
    let body = std::str::from_utf8(&after.body).unwrap();
    // The guest sees where the client is now.
    assert_eq!(field(body, "CLIENT_PORT"), format!("={new_port}"), "{body}");
    assert!(c.quic.close_reason().is_none(), "the connection ended");
}

/// With two per-core workers, each drives QUIC connections of its own, and a client that
/// changes address again and again stays with its worker: its packets are steered by the
/// connection ID the worker gave it, not by addresses (after which half the moves would land on
/// the other worker, which knows nothing of the connection and resets it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http3_connections_spread_over_the_workers_and_keep_theirs_when_they_move() {
    let h = h3_server("runtime = \"per-core\"\nworker_threads = 2").await;
    let mut clients = Vec::new();
    for _ in 0..16 {
        let mut c = h.h3().await;
        assert_eq!(c.get("/ctx").await.unwrap().status, StatusCode::OK);
        clients.push(c);
    }
    // The connections' first packets carry IDs the clients chose at random: both workers got
    // some (all 16 on one: a chance of 2 in 65,536).
    let metrics = h.s.metrics().await;
    let on = |worker: &str| {
        metric_value_or_zero(
            &metrics,
            &format!("tern_worker_connections_open{{transport=\"quic\",worker=\"{worker}\"}}"),
        )
    };
    assert_eq!(on("0") + on("1"), 16.0, "{metrics}");
    assert!(on("0") >= 1.0 && on("1") >= 1.0, "{metrics}");
    // Each client moves 8 times, a request after each move: 128 moves, none lost.
    for c in &mut clients {
        for _ in 0..8 {
            let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            let port = socket.local_addr().unwrap().port();
            c.endpoint.rebind(socket).unwrap();
            let a = c.get("/ctx").await.expect("served after the move");
            assert_eq!(a.status, StatusCode::OK);
            let body = std::str::from_utf8(&a.body).unwrap();
            assert_eq!(field(body, "CLIENT_PORT"), format!("={port}"), "{body}");
        }
        assert!(c.quic.close_reason().is_none(), "the connection ended");
    }
    let metrics = h.s.metrics().await;
    let reset = metric_value_or_zero(
        &metrics,
        "tern_worker_connections_open{transport=\"quic\",worker=\"0\"}",
    ) + metric_value_or_zero(
        &metrics,
        "tern_worker_connections_open{transport=\"quic\",worker=\"1\"}",
    );
    assert_eq!(reset, 16.0, "connections lost: {metrics}");
}

/// `tern serve` with `args` that is expected to stop at start: whether it failed, and its log.
fn serve_expecting_failure(args: &[&str], cache: &std::path::Path) -> (bool, String) {
    let mut child = crate::support::tern_bin()
        .arg("serve")
        .args(args)
        .env("TERN_CACHE_DIR", cache)
        .env("TERN_DATA_DIR", cache.join("data"))
        .env_remove("TERN_ADMIN_TOKEN")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start tern");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut log = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut log).unwrap();
    (status.is_some_and(|s| !s.success()), log)
}

/// A second server started on a port the first one serves (TCP, or HTTP/3's UDP) stops at
/// start, naming the address, instead of joining the first one's `SO_REUSEPORT` sockets and
/// taking a share of its connections and packets; the first serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_server_on_the_same_ports_stops_instead_of_sharing_them() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    pki.issue(dir.path(), "a", &["a.test"]);
    let config = dir.path().join("tern.toml");
    std::fs::write(
        &config,
        "[server]\nworker_threads = 2\nruntime = \"per-core\"\n\
         [[tenant]]\nname = \"hello\"\nmodule = \"builtin:hello\"\npaths = [\"/hello\"]\n",
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let (cert, key) = (dir.path().join("a.crt"), dir.path().join("a.key"));
    let (cert, key) = (cert.to_str().unwrap(), key.to_str().unwrap());
    let first = crate::support::TernProcess::serve(
        &[
            "--config",
            config,
            "--tls-listen",
            "127.0.0.1:0",
            "--tls-cert",
            cert,
            "--tls-key",
            key,
            "--http3",
        ],
        &dir.path().join("cache"),
    );
    let tls = first.tls.clone().expect("an HTTPS address");
    let second = |listen: &str, tls_listen: &str| {
        let args = [
            "--config",
            config,
            "--listen",
            listen,
            "--admin-listen",
            "127.0.0.1:0",
            "--tls-listen",
            tls_listen,
            "--tls-cert",
            cert,
            "--tls-key",
            key,
            "--http3",
        ];
        serve_expecting_failure(&args, &dir.path().join("second"))
    };
    // The cleartext port.
    let (failed, log) = second(&first.addr, "127.0.0.1:0");
    assert!(failed, "a second server served beside the first: {log}");
    assert!(
        log.contains(&format!("cannot listen on {}", first.addr)) && log.contains("another server"),
        "{log}"
    );
    // The TLS port (TCP, then UDP for HTTP/3).
    let (failed, log) = second("127.0.0.1:0", &tls);
    assert!(failed, "a second server served beside the first: {log}");
    assert!(
        log.contains(&format!("cannot listen on {tls}")) && log.contains("another server"),
        "{log}"
    );
    // Only the UDP port taken, by sockets sharing it (as another server's workers would).
    // (A UDP port whose TCP twin is free, so that the second server gets as far as UDP.)
    let (_holder, udp) = loop {
        let holder = socket2::Socket::new(
            socket2::Domain::IPV4,
            socket2::Type::DGRAM,
            Some(socket2::Protocol::UDP),
        )
        .unwrap();
        holder.set_reuse_port(true).unwrap();
        holder
            .bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
            .unwrap();
        let udp = holder.local_addr().unwrap().as_socket().unwrap();
        if std::net::TcpListener::bind(udp).is_ok() {
            break (holder, udp);
        }
    };
    let (failed, log) = second("127.0.0.1:0", &udp.to_string());
    assert!(failed, "a second server shared a UDP port: {log}");
    assert!(
        log.contains(&format!("cannot listen on {udp} (UDP, HTTP/3)"))
            && log.contains("another server"),
        "{log}"
    );
    // The first serves on, over HTTP/3 and HTTP/1.1.
    let mut c = H3Client::connect(tls.parse().unwrap(), &pki.ca)
        .await
        .unwrap();
    let a = c.get("/hello").await.unwrap();
    assert_eq!(a.status, StatusCode::OK);
    let r = crate::support::get_at(first.addr.parse().unwrap(), "/hello").await;
    assert_eq!(r.status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_flood_is_capped_and_the_listener_keeps_serving() {
    let h = h3_server("max_tls_handshakes = 4\n").await;
    // The in-progress gauge, sampled all through the flood: never past the cap.
    // (The flood starts once the sampler has its first sample: a first scrape slower than the
    // whole flood left it unsampled.)
    let sampling = Arc::new(AtomicBool::new(true));
    let (first_tx, first_rx) = tokio::sync::oneshot::channel();
    let sampler = {
        let (addr, sampling) = (h.s.admin(), sampling.clone());
        tokio::spawn(async move {
            let (mut most, mut samples) = (0.0f64, 0u32);
            let mut first = Some(first_tx);
            while sampling.load(Ordering::Relaxed) {
                let m = crate::support::get_at(addr, "/metrics").await.text();
                most = most.max(metric_value_or_zero(&m, "tern_tls_handshakes_in_progress"));
                samples += 1;
                if let Some(tx) = first.take() {
                    let _ = tx.send(());
                }
            }
            (most, samples)
        })
    };
    first_rx.await.expect("the sampler's first sample");
    let mut flood = Vec::new();
    for _ in 0..60 {
        let (addr, ca) = (h.addr, h.pki.ca.clone());
        flood.push(tokio::spawn(async move {
            tokio::time::timeout(Duration::from_secs(15), H3Client::connect(addr, &ca)).await
        }));
    }
    let mut connected = 0;
    for f in flood {
        match f.await.unwrap() {
            Ok(Ok(_client)) => connected += 1,
            Ok(Err(_refused)) => {}
            Err(_) => panic!("a handshake hung past 15 s"),
        }
    }
    sampling.store(false, Ordering::Relaxed);
    let (most, samples) = sampler.await.unwrap();
    assert!(samples > 1, "the gauge was never sampled during the flood");
    assert!(most <= 4.0, "{most} handshakes at once, over the cap of 4");
    // The cap acted: clients were asked to prove their address first, or refused busy.
    let m = h.s.metrics().await;
    let (retried, busy) = (
        metric_value_or_zero(&m, "tern_quic_retries_total"),
        metric_value_or_zero(&m, r#"tern_tls_handshake_failures_total{reason="busy"}"#),
    );
    assert!(
        retried + busy > 0.0,
        "60 handshakes at once met no cap: {m}"
    );
    assert!(connected > 0, "no handshake of the flood completed");
    // A client counts its handshake done when the server's last flight arrives, a moment
    // before the server's task for it ends: the gauge is read until it is back to 0 (a
    // handshake never let go would keep it up past the bound).
    let mut m = String::new();
    for _ in 0..50 {
        m = h.s.metrics().await;
        if metric_value_or_zero(&m, "tern_tls_handshakes_in_progress") == 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        metric_value_or_zero(&m, "tern_tls_handshakes_in_progress"),
        0.0,
        "{m}"
    );
    // Served afterwards.
    let mut c = h.h3().await;
    assert_eq!(c.get("/hello").await.unwrap().status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_http3_requests_in_flight() {
    let h = h3_server("").await;
    let mut c = h.h3().await;
    assert_eq!(c.get("/hello").await.unwrap().status, StatusCode::OK);
    // A request whose guest writes in 50 pieces, computing before each: its head has come
    // (so the server has it) when shutdown begins.
    let mut slow = h.h3().await;
    let req = Request::get("https://a.test/sized?n=200000&chunk=4000&slow=1")
        .body(())
        .unwrap();
    let mut stream = slow.send.send_request(req).await.unwrap();
    let _ = stream.finish().await;
    let head = stream.recv_response().await.unwrap();
    assert_eq!(head.status(), StatusCode::OK);
    h.s.running.shutdown.trigger();
    let mut len = 0;
    while let Some(chunk) = stream.recv_data().await.expect("answered in full") {
        len += chunk.remaining();
    }
    assert_eq!(len, 200_000);
    // The idle connection was told to go away: a new request on it is refused at once, not
    // left unanswered.
    let after = tokio::time::timeout(Duration::from_secs(5), c.get("/hello"))
        .await
        .expect("a request after GOAWAY is refused, not left waiting");
    assert!(
        after.is_err(),
        "served after shutdown: {:?}",
        after.map(|a| a.status)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_http3_load_answers_every_request_it_took_in_full() {
    let (tern, addr, pki, _dir) = tern_serve_http3();
    let answered = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut clients = Vec::new();
    for _ in 0..4 {
        let mut c = H3Client::connect(addr, &pki.ca).await.expect("connect");
        let answered = answered.clone();
        clients.push(tokio::spawn(async move {
            // Requests until the server refuses one (GOAWAY, then the close): an answer
            // whose head came is read to its end, whole.
            let mut whole = 0;
            loop {
                let req = Request::post("https://a.test/echo/x").body(()).unwrap();
                let Ok(mut stream) = c.send.send_request(req).await else {
                    return whole;
                };
                // 256 KiB echoed back: an answer of many packets, which a close too early
                // would cut.
                if stream
                    .send_data(Bytes::from(vec![b'x'; 256 * 1024]))
                    .await
                    .is_err()
                {
                    return whole;
                }
                let _ = stream.finish().await;
                // Refused (GOAWAY, the close) or answered: never left without an answer.
                let Ok(head) =
                    tokio::time::timeout(Duration::from_secs(10), stream.recv_response())
                        .await
                        .expect("a request whose head never came in 10 s")
                else {
                    return whole;
                };
                assert_eq!(head.status(), StatusCode::OK);
                let mut body = Vec::new();
                while let Some(mut chunk) = stream.recv_data().await.expect("an answer cut") {
                    body.extend_from_slice(&chunk.copy_to_bytes(chunk.remaining()));
                }
                assert!(body.starts_with(b"POST /echo/x\n"), "{:?}", &body[..40]);
                assert!(body.ends_with(&[b'x'; 256 * 1024]), "{} bytes", body.len());
                whole += 1;
                answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }));
    }
    // Under load, then SIGTERM.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while answered.load(std::sync::atomic::Ordering::Relaxed) < 40 {
        assert!(
            std::time::Instant::now() < deadline,
            "40 answers did not come in 60 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let status = std::process::Command::new("kill")
        .args(["-TERM", &tern.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let mut total = 0;
    for c in clients {
        total += c.await.expect("every answer whole");
    }
    assert!(total >= 40, "{total}");
    let mut tern = tern;
    let exit = tokio::task::spawn_blocking(move || tern.child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(exit.success(), "tern exited with {exit}");
}

/// `tern serve --tls-listen ... --http3` with the demo tenants (a certificate for `a.test`),
/// as a process of its own; its HTTPS (and HTTP/3) address, the PKI, and its directory.
fn tern_serve_http3() -> (
    crate::support::TernProcess,
    SocketAddr,
    Pki,
    tempfile::TempDir,
) {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    pki.issue(dir.path(), "a", &["a.test"]);
    let (cert, key) = (dir.path().join("a.crt"), dir.path().join("a.key"));
    let tern = crate::support::TernProcess::serve(
        &[
            "--tls-listen",
            "127.0.0.1:0",
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
            "--http3",
        ],
        &dir.path().join("cache"),
    );
    let addr = tern
        .tls
        .as_deref()
        .expect("an HTTPS address")
        .parse()
        .unwrap();
    (tern, addr, pki, dir)
}

/// Resident memory of process `pid`, in bytes.
fn resident(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kib * 1024
}

/// A QUIC variable-length integer of 8 bytes (RFC 9000 §16).
fn varint8(n: u64) -> [u8; 8] {
    (n | (0b11 << 62)).to_be_bytes()
}

/// Sends `total` zero bytes on `stream` in 1 MiB writes; the error that stopped it, if any.
async fn stream_zeros(stream: &mut quinn::SendStream, total: usize) -> Option<quinn::WriteError> {
    let chunk = Bytes::from(vec![0u8; 1 << 20]);
    for _ in 0..total >> 20 {
        if let Err(e) = stream.write_all(&chunk).await {
            return Some(e);
        }
    }
    None
}

/// Frames `h3` would buffer whole, in a `tern serve --http3` process: a reserved frame type
/// on the control stream declaring 1 GiB with 256 MiB of it sent is skipped as it comes, and
/// a HEADERS frame declaring 1 GiB is refused at its header (`H3_EXCESSIVE_LOAD`): resident
/// memory stays within 64 MiB of where it was, and the server serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_declaring_a_gibibyte_are_skipped_or_refused_as_they_come() {
    let (tern, addr, pki, _dir) = tern_serve_http3();
    let pid = tern.child.id();
    let mut client = H3Client::connect(addr, &pki.ca).await.expect("connect");
    assert_eq!(client.get("/hello").await.unwrap().status, StatusCode::OK);
    let before = resident(pid);
    const GIB: u64 = 1 << 30;

    // The control stream: its type, an empty SETTINGS, then a reserved frame (0x21).
    let (_endpoint, quic) = quic_connect(addr, &pki.ca, None).await.expect("connect");
    let mut control = quic.open_uni().await.unwrap();
    control.write_all(&[0x00, 0x04, 0x00, 0x21]).await.unwrap();
    control.write_all(&varint8(GIB)).await.unwrap();
    let stopped = tokio::time::timeout(
        Duration::from_secs(120),
        stream_zeros(&mut control, 256 << 20),
    )
    .await
    .expect("the server stopped reading an unknown frame");
    assert!(
        stopped.is_none(),
        "the control stream was refused: {stopped:?}"
    );
    let after_unknown = resident(pid);
    assert!(
        after_unknown < before + (64 << 20),
        "an unknown frame of 256 MiB grew the server from {before} to {after_unknown} bytes"
    );

    // A request stream whose HEADERS frame declares 1 GiB.
    let (mut send, _recv) = quic.open_bi().await.unwrap();
    send.write_all(&[0x01]).await.unwrap();
    send.write_all(&varint8(GIB)).await.unwrap();
    let stopped = tokio::time::timeout(Duration::from_secs(60), stream_zeros(&mut send, 64 << 20))
        .await
        .expect("the server neither read nor refused the head");
    assert!(
        matches!(stopped, Some(quinn::WriteError::Stopped(code)) if code.into_inner() == 0x107),
        "a HEADERS frame of 1 GiB was taken: {stopped:?}"
    );
    let after_head = resident(pid);
    assert!(
        after_head < before + (64 << 20),
        "the server grew from {before} to {after_head} bytes"
    );
    // The server serves on, the connection that had been served before and a new one.
    assert_eq!(client.get("/hello").await.unwrap().status, StatusCode::OK);
    let mut fresh = H3Client::connect(addr, &pki.ca).await.expect("connect");
    assert_eq!(fresh.get("/hello").await.unwrap().status, StatusCode::OK);
    drop(control);
}
