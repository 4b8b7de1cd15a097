//! WebSockets handed to a backend: Python's `websockets` library (client and backend, written
//! by others) through a guest that checks a token and hands the connection on. Refused
//! openings never reach the backend; the limits close with their codes; shutdown closes with
//! `1001`.

use std::io::BufRead;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use crate::support::{TestServer, metric_value, test_component, test_guest, tools_dir};

/// The `websockets` echo server (`wsclient.py echo-server`), killed when dropped.
pub(crate) struct EchoServer {
    child: std::process::Child,
    pub(crate) port: u16,
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/wsclient.py")
}

pub(crate) fn echo_server() -> EchoServer {
    let mut child = std::process::Command::new("python3")
        .arg(script())
        .arg("echo-server")
        .env("PYTHONPATH", tools_dir().join("websockets-15.0.1"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{e}: {line:?}"));
    EchoServer { child, port }
}

/// `wsclient.py client URL ARGS...`: its one JSON answer.
async fn client(url: String, args: &[&str]) -> Value {
    let mut command = std::process::Command::new("python3");
    command
        .arg(script())
        .arg("client")
        .arg(&url)
        .args(args)
        .env("PYTHONPATH", tools_dir().join("websockets-15.0.1"));
    json_of(command).await
}

/// Runs `command` (a helper that prints one JSON object) to its end, off the runtime: what it
/// printed.
pub(crate) async fn json_of(mut command: std::process::Command) -> Value {
    let out = tokio::task::spawn_blocking(move || command.output())
        .await
        .unwrap()
        .expect("python3 runs");
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("{e}: {text:?} {}", String::from_utf8_lossy(&out.stderr)))
}

/// A server with the `ws_gate` guest at `/` whose backend `echo` is `echo`, and `extra`
/// settings of the tenant.
pub(crate) async fn gate(echo: &EchoServer, extra: &str) -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    test_guest(dir.path(), "ws_gate");
    let config = format!(
        "[pool]\ninstances = 16\nmax_memory_mib = 64\n\
         [[tenant]]\nname = \"chat\"\nmodule = \"ws_gate.wasm\"\n{extra}\n\
         [tenant.outbound.backends.echo]\nurl = \"http://127.0.0.1:{}/rooms\"\n\
         connect_timeout_ms = 10000\n\
         [tenant.outbound.backends.gone]\nurl = \"http://127.0.0.1:1\"\n",
        echo.port
    );
    TestServer::try_start_in(dir, &config).await.expect("start")
}

/// Waits (up to 20 s) until the tenant `chat` has `n` WebSocket connections open.
async fn open_connections(s: &TestServer, n: u32) {
    let series = format!("tern_websocket_connections{{mode=\"handoff\",tenant=\"chat\"}} {n}\n");
    for _ in 0..200 {
        let m = s.metrics().await;
        if m.contains(&series) || (n == 0 && !m.contains("tern_websocket_connections{")) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the tenant never had {n} WebSocket connections open");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_hands_the_websocket_to_its_backend_and_frames_flow_both_ways() {
    let echo = echo_server();
    let s = gate(&echo, "").await;
    let base = format!("ws://{}", s.addr());
    // No token: the guest's 401, and the backend never opened (see `before` below). The guest
    // saw the opening as it is.
    let refused = client(format!("{base}/lobby"), &[]).await;
    assert_eq!(refused["status"], 401, "{refused}");
    assert_eq!(refused["headers"]["x-saw"], "GET websocket 13", "{refused}");
    assert!(refused["headers"].get("tern-handoff").is_none());

    let big = "70000";
    let ok = client(
        format!("{base}/lobby?token=good"),
        &[
            "--send",
            "hello",
            "--send-bytes",
            big,
            "--send",
            "é",
            // A client cannot pass itself off: the guest's and the server's headers win.
            "--header",
            "x-user:mallory",
            "--header",
            "x-forwarded-for:203.0.113.9",
        ],
    )
    .await;
    let hello = &ok["hello"];
    assert_eq!(
        hello["before"], 0,
        "the refused opening reached no backend: {ok}"
    );
    assert_eq!(hello["path"], "/rooms/lobby?token=good", "{ok}");
    assert_eq!(
        hello["headers"]["x-user"], "alice",
        "the guest's header: {ok}"
    );
    assert_eq!(hello["headers"]["x-forwarded-for"], "127.0.0.1", "{ok}");
    assert_eq!(hello["headers"]["x-forwarded-proto"], "http", "{ok}");
    assert_eq!(
        ok["echoes"],
        serde_json::json!(["hello", 70000, "é"]),
        "{ok}"
    );
    assert_eq!(ok["close_code"], 1000, "{ok}");
    // The two ends agreed on compression through the relay.
    assert!(
        ok["extensions"]
            .as_str()
            .is_some_and(|e| e.contains("permessage-deflate")),
        "{ok}"
    );

    // Counted once the relay has ended (the access line too).
    let mut m = String::new();
    for _ in 0..50 {
        m = s.metrics().await;
        if m.contains("tern_websocket_closes_total{code=\"1000\"") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        metric_value(
            &m,
            "tern_websocket_closes_total{code=\"1000\",tenant=\"chat\"}"
        ),
        1.0,
        "{m}"
    );
    let series = |s: &str| metric_value(&m, &format!("tern_websocket_{s},tenant=\"chat\"}}"));
    assert_eq!(series("messages_total{direction=\"in\""), 3.0);
    assert_eq!(
        series("messages_total{direction=\"out\""),
        4.0,
        "the hello, three echoes"
    );
    // (Bytes as sent: the 70,000 compressed.)
    let out = series("bytes_total{direction=\"out\"");
    assert!(out > 100.0 && out < 70_000.0, "{out}");
    assert_eq!(
        metric_value(
            &m,
            "tern_websocket_connections{mode=\"handoff\",tenant=\"chat\"}"
        ),
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cgi_program_and_a_component_hand_off_with_their_header() {
    let echo = echo_server();
    let dir = tempfile::tempdir().unwrap();
    test_guest(dir.path(), "cgi_probe");
    test_component(dir.path(), "component");
    let backend = format!(
        "[tenant.outbound.backends.echo]\nurl = \"http://127.0.0.1:{}\"\n",
        echo.port
    );
    let config = format!(
        "[pool]\ninstances = 16\nmax_memory_mib = 64\n\
         [[tenant]]\nname = \"cgi\"\nmodule = \"cgi_probe.wasm\"\npaths = [\"/cgi\"]\n{backend}\
         [[tenant]]\nname = \"comp\"\nmodule = \"component.wasm\"\npaths = [\"/comp\"]\n{backend}"
    );
    let s = TestServer::try_start_in(dir, &config).await.expect("start");
    let ok = client(
        format!("ws://{}/comp/handoff", s.addr()),
        &["--send", "wasi"],
    )
    .await;
    assert_eq!(ok["hello"]["headers"]["x-user"], "component", "{ok}");
    assert_eq!(ok["echoes"], serde_json::json!(["wasi"]), "{ok}");
    let ok = client(format!("ws://{}/cgi/handoff", s.addr()), &["--send", "cgi"]).await;
    assert_eq!(ok["hello"]["headers"]["x-user"], "cgi", "{ok}");
    assert_eq!(ok["hello"]["path"], "/cgi/handoff", "{ok}");
    assert_eq!(ok["echoes"], serde_json::json!(["cgi"]), "{ok}");
    // The same answer to a request that opens nothing: served, the header never sent.
    let r = crate::support::send(
        s.addr(),
        http::Method::GET,
        "/cgi/handoff",
        None,
        &[],
        bytes::Bytes::new(),
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(r.headers.get("tern-handoff").is_none(), "{:?}", r.headers);
    assert_eq!(r.headers["x-user"], "cgi");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_abi_call_hands_off_and_says_what_is_wrong() {
    let echo = echo_server();
    let s = gate(&echo, "").await;
    let base = format!("ws://{}", s.addr());
    let ok = client(format!("{base}/abi?token=good&via=abi"), &["--send", "x"]).await;
    assert_eq!(ok["hello"]["headers"]["x-user"], "alice", "{ok}");
    assert_eq!(ok["echoes"], serde_json::json!(["x"]), "{ok}");
    // A backend the tenant does not have: DENIED, with the reason.
    let unknown = client(format!("{base}/abi?token=good&via=abi&to=nope"), &[]).await;
    assert_eq!(unknown["status"], 500, "{unknown}");
    let body = unknown["body"].as_str().unwrap();
    assert!(
        body.starts_with("-6 ") && body.contains("no backend named \"nope\""),
        "{body}"
    );
    // A request that opens no WebSocket: UNAVAILABLE.
    let r = crate::support::send(
        s.addr(),
        http::Method::GET,
        "/abi?token=good&via=abi",
        None,
        &[],
        bytes::Bytes::new(),
    )
    .await;
    assert_eq!(r.status, 500);
    assert!(r.text().starts_with("-5 "), "{}", r.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_not_the_tenants_or_not_there_is_refused_and_the_client_told() {
    let echo = echo_server();
    let s = gate(&echo, "").await;
    let base = format!("ws://{}", s.addr());
    let unknown = client(format!("{base}/x?token=good&to=nope"), &[]).await;
    assert_eq!(unknown["status"], 500, "{unknown}");
    let down = client(format!("{base}/x?token=good&to=gone"), &[]).await;
    assert_eq!(down["status"], 502, "{down}");
    let m = s.metrics().await;
    assert_eq!(
        metric_value(
            &m,
            "tern_websocket_refused_total{tenant=\"chat\",why=\"backend\"}"
        ),
        2.0
    );
    // A request that is no opening, and an opening of another version.
    let r = crate::support::send(
        s.addr(),
        http::Method::GET,
        "/x",
        None,
        &[
            ("upgrade", "websocket"),
            ("connection", "upgrade"),
            ("sec-websocket-version", "8"),
            ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ],
        bytes::Bytes::new(),
    )
    .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.headers["sec-websocket-version"], "13");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tenants_limits_close_with_their_codes() {
    let echo = echo_server();
    let s = gate(
        &echo,
        "[tenant.websocket]\nmax_message_bytes = 1000\nmax_connections = 1\nidle_timeout_ms = 1000\n",
    )
    .await;
    let base = format!("ws://{}", s.addr());
    // limit - 1 and the limit pass; limit + 1 closes with 1009, unforwarded. (Sizes as sent:
    // uncompressed here.)
    let at = client(
        format!("{base}/a?token=good"),
        &[
            "--no-compression",
            "--send-bytes",
            "999",
            "--send-bytes",
            "1000",
            "--send-bytes",
            "1001",
        ],
    )
    .await;
    assert_eq!(at["echoes"], serde_json::json!([999, 1000]), "{at}");
    assert_eq!(at["close_code"], 1009, "{at}");
    // Idle for a second: 1001. Meanwhile a second opening finds no place: 503.
    open_connections(&s, 0).await;
    let held = tokio::spawn(client(format!("{base}/b?token=good"), &["--wait-close"]));
    open_connections(&s, 1).await;
    let full = client(format!("{base}/c?token=good"), &[]).await;
    assert_eq!(full["status"], 503, "{full}");
    let m = s.metrics().await;
    assert_eq!(
        metric_value(
            &m,
            "tern_websocket_refused_total{tenant=\"chat\",why=\"tenant\"}"
        ),
        1.0
    );
    let idle = held.await.unwrap();
    assert_eq!(idle["close_code"], 1001, "{idle}");
    assert_eq!(idle["close_reason"], "idle", "{idle}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_open_websockets_with_1001() {
    let echo = echo_server();
    let s = gate(&echo, "").await;
    let base = format!("ws://{}", s.addr());
    let held = tokio::spawn(client(format!("{base}/b?token=good"), &["--wait-close"]));
    open_connections(&s, 1).await;
    s.running.shutdown.trigger();
    let closed = held.await.unwrap();
    assert_eq!(closed["close_code"], 1001, "{closed}");
    assert_eq!(closed["close_reason"], "server shutting down", "{closed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_sends_a_thousand_open_websockets_1001_within_the_grace() {
    let echo = echo_server();
    let s = gate(&echo, "").await;
    let mut holder = std::process::Command::new("python3")
        .arg(script())
        .args([
            "hold",
            &format!("ws://{}/many?token=good", s.addr()),
            "1000",
        ])
        .env("PYTHONPATH", tools_dir().join("websockets-15.0.1"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let mut out = std::io::BufReader::new(holder.stdout.take().unwrap());
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        (line, out)
    });
    let (opened, mut out) = line.await.unwrap();
    let opened: Value = serde_json::from_str(opened.trim()).unwrap();
    assert_eq!(
        opened["opened"], 1000,
        "the tenant's default cap is 1000: {opened}"
    );
    let m = s.metrics().await;
    assert_eq!(
        metric_value(
            &m,
            "tern_websocket_connections{mode=\"handoff\",tenant=\"chat\"}"
        ),
        1000.0
    );
    let started = std::time::Instant::now();
    s.running.shutdown.trigger();
    tokio::time::timeout(Duration::from_secs(10), s.running.wait())
        .await
        .expect("the server stops within the grace (2 s) and the relays' closing");
    let waited = started.elapsed();
    let codes = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        line
    })
    .await
    .unwrap();
    let _ = holder.wait();
    assert_eq!(
        codes.trim(),
        r#"{"codes": {"1001": 1000}}"#,
        "after {waited:?}"
    );
    // The grace is 2 s (the test servers'): the relays end within it.
    assert!(waited < Duration::from_secs(3), "{waited:?}");
}

/// A WebSocket frame from a client: masked text.
pub fn masked_text(text: &str) -> Vec<u8> {
    let mask = [0x37, 0xfa, 0x21, 0x3d];
    let mut f = vec![0x81, 0x80 | u8::try_from(text.len()).unwrap()];
    f.extend_from_slice(&mask);
    f.extend(text.bytes().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    f
}

/// Reads one unmasked text frame (shorter than 126 bytes) from a server.
pub async fn read_text(io: &mut (impl tokio::io::AsyncRead + Unpin)) -> String {
    use tokio::io::AsyncReadExt;
    let mut head = [0u8; 2];
    io.read_exact(&mut head).await.unwrap();
    assert_eq!(head[0], 0x81, "a whole text frame");
    let mut len = usize::from(head[1] & 0x7F);
    if len == 126 {
        let mut l = [0u8; 2];
        io.read_exact(&mut l).await.unwrap();
        len = usize::from(u16::from_be_bytes(l));
    }
    let mut payload = vec![0u8; len];
    io.read_exact(&mut payload).await.unwrap();
    String::from_utf8(payload).unwrap()
}

/// An HTTP/2 connection to `addr` (prior knowledge).
pub async fn h2_connection(
    addr: std::net::SocketAddr,
) -> hyper::client::conn::http2::SendRequest<http_body_util::Empty<bytes::Bytes>> {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    sender
}

/// An extended CONNECT opening a WebSocket at `path` of `addr` (RFC 8441).
pub fn h2_opening(
    addr: std::net::SocketAddr,
    path: &str,
) -> http::Request<http_body_util::Empty<bytes::Bytes>> {
    let mut req = http::Request::builder()
        .method(http::Method::CONNECT)
        .uri(format!("http://{addr}{path}"))
        .header("sec-websocket-version", "13")
        .body(http_body_util::Empty::new())
        .unwrap();
    req.extensions_mut()
        .insert(hyper::ext::Protocol::from_static("websocket"));
    req
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_client_opens_with_extended_connect_and_the_guest_sees_the_same_opening() {
    use hyper_util::rt::TokioIo;
    use tokio::io::AsyncWriteExt;
    let echo = echo_server();
    let s = gate(&echo, "").await;
    let mut sender = h2_connection(s.addr()).await;
    let open = |path: &str| h2_opening(s.addr(), path);
    // Refused by the guest: its 401, as over HTTP/1.1 (it saw a GET with Upgrade).
    let refused = sender.send_request(open("/h2")).await.unwrap();
    assert_eq!(refused.status(), 401);
    assert_eq!(refused.headers()["x-saw"], "GET websocket 13");
    // Handed off: 200, then frames on the stream.
    let mut resp = sender.send_request(open("/h2?token=good")).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers().get("sec-websocket-accept").is_none());
    let mut ws = TokioIo::new(hyper::upgrade::on(&mut resp).await.unwrap());
    let hello: Value = serde_json::from_str(&read_text(&mut ws).await).unwrap();
    assert_eq!(hello["headers"]["x-user"], "alice", "{hello}");
    assert_eq!(hello["path"], "/rooms/h2?token=good", "{hello}");
    ws.write_all(&masked_text("over h2")).await.unwrap();
    assert_eq!(read_text(&mut ws).await, "over h2");
}
