//! WebSockets in events mode: Tern holds the connection and the `ws_events` guest sees its
//! events as requests (Pushpin's WebSocket-over-HTTP). The client is Python's `websockets`
//! library (written by others); raw frames where it refuses to send bad ones. A chat room:
//! published messages reach every subscriber and no other tenant; a trapping guest closes its
//! own connection only; the limits close with their codes; the guest is told when a client
//! goes.

use std::io::BufRead;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Duration;

use http::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::{TestServer, test_guest, tools_dir};

/// A `wsclient.py talk` client running: its first line (opened or refused) is read by
/// [`talk`], the last by [`Talk::end`].
pub struct Talk {
    child: Child,
    out: Option<std::io::BufReader<ChildStdout>>,
    /// Its first line (`{"opened": true, ...}`, or the refusal).
    pub first: Value,
}

impl Drop for Talk {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Talk {
    /// Its last line (its steps done and the connection closed).
    pub async fn end(mut self) -> Value {
        let mut out = self.out.take().expect("read once");
        let line = tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            out.read_line(&mut line).unwrap();
            line
        })
        .await
        .unwrap();
        serde_json::from_str(line.trim()).unwrap_or_else(|e| panic!("{e}: {line:?}"))
    }
}

/// Starts `wsclient.py talk URL ARGS...` and reads its first line.
pub async fn talk(url: &str, args: &[&str]) -> Talk {
    let mut child = Command::new("python3")
        .arg(std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/wsclient.py"))
        .arg("talk")
        .arg(url)
        .args(args)
        .env("PYTHONPATH", tools_dir().join("websockets-15.0.1"))
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let (out, line) = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        (out, line)
    })
    .await
    .unwrap();
    let first = serde_json::from_str(line.trim()).unwrap_or_else(|e| panic!("{e}: {line:?}"));
    Talk {
        child,
        out: Some(out),
        first,
    }
}

/// A talk to its end.
pub async fn talk_all(url: &str, args: &[&str]) -> Value {
    let t = talk(url, args).await;
    assert_eq!(t.first["opened"], true, "{}", t.first);
    t.end().await
}

/// A server with tenants `chat` (at `/`) and `rival` (at `/rival`), both the `ws_events`
/// guest in events mode, and `extra` settings of `chat`'s `[tenant.websocket]`.
async fn server(extra: &str) -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    test_guest(dir.path(), "ws_events");
    let config = format!(
        "[pool]\ninstances = 16\nmax_memory_mib = 64\n\
         [[tenant]]\nname = \"chat\"\nmodule = \"ws_events.wasm\"\n\
         [tenant.websocket]\nmode = \"events\"\n{extra}\n\
         [[tenant]]\nname = \"rival\"\nmodule = \"ws_events.wasm\"\npaths = [\"/rival\"]\n\
         [tenant.websocket]\nmode = \"events\"\n"
    );
    TestServer::try_start_in(dir, &config).await.expect("start")
}

/// Waits (up to 20 s) until `tenant` has `n` events connections open.
async fn open_connections(s: &TestServer, tenant: &str, n: u32) {
    let series = format!("tern_websocket_connections{{mode=\"events\",tenant=\"{tenant}\"}} {n}\n");
    for _ in 0..200 {
        let m = s.metrics().await;
        if m.contains(&series) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{tenant} never had {n} events connections open");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_events_guest_accepts_echoes_keeps_metadata_and_closes() {
    let s = server("").await;
    let base = format!("ws://{}", s.addr());
    // The guest's refusal reaches the client as it answered.
    let refused = talk(&format!("{base}/?token=bad"), &[]).await;
    assert_eq!(refused.first["status"], 401, "{}", refused.first);
    assert_eq!(refused.first["body"], "bad token\n", "{}", refused.first);

    let got = talk_all(
        &format!("{base}/?user=alice"),
        &[
            "--recv",
            "1", // welcome
            "--send",
            "hello",
            "--recv",
            "1",
            "--send",
            "é",
            "--recv",
            "1",
            "--send-bytes",
            "70000",
            "--recv",
            "1",
            "--send",
            "whoami",
            "--recv",
            "1",
            "--send",
            "id",
            "--recv",
            "1",
            "--send",
            "close",
            "--recv",
            "2",
        ],
    )
    .await;
    let r = got["received"].as_array().unwrap();
    assert_eq!(r[0], "welcome", "{got}");
    assert_eq!(r[1], "hello");
    assert_eq!(r[2], "é");
    assert_eq!(r[3], json!({"bytes": 70000}));
    // Set at the opening with `Set-Meta-User`, sent back with every batch.
    assert_eq!(r[4], "alice");
    // A connection id: 32 hex digits.
    let id = r[5].as_str().unwrap();
    assert!(
        id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()),
        "{id}"
    );
    // The guest's last message comes before its CLOSE, with its code and reason (the last
    // recv gets the close).
    assert_eq!(r[6], "bye", "{got}");
    assert_eq!(r.len(), 7, "{got}");
    assert_eq!(got["close_code"], 4000, "{got}");
    assert_eq!(got["close_reason"], "done", "{got}");

    // The client closes: the guest answers the code it was sent.
    let got = talk_all(&format!("{base}/"), &["--recv", "1"]).await;
    assert_eq!(got["close_code"], 1000, "{got}");

    // Without GRIP, messages pass unprefixed.
    let got = talk_all(
        &format!("{base}/?grip=no"),
        &["--recv", "1", "--send", "x", "--recv", "1"],
    )
    .await;
    assert_eq!(got["received"], json!(["welcome", "x"]), "{got}");

    let m = s.metrics().await;
    assert!(
        m.contains("tern_websocket_closes_total{code=\"other\",tenant=\"chat\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("tern_websocket_refused_total{tenant=\"chat\",why=\"guest\"} 1"),
        "{m}"
    );
    assert!(
        crate::support::metric_value(
            &m,
            "tern_websocket_messages_total{direction=\"in\",tenant=\"chat\"}"
        ) >= 7.0,
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_published_message_reaches_every_subscriber_of_the_tenant_and_no_one_else() {
    let s = server("").await;
    let base = format!("ws://{}", s.addr());
    // bob and carol listen in the lobby; dave in another room; eve is another tenant's.
    let bob = talk(&format!("{base}/?user=bob"), &["--recv", "4"]).await;
    let carol = talk(&format!("{base}/?user=carol"), &["--recv", "4"]).await;
    let dave = talk(&format!("{base}/?user=dave&room=cellar"), &["--recv", "2"]).await;
    let eve = talk(&format!("{base}/rival?user=eve"), &["--recv", "2"]).await;
    open_connections(&s, "chat", 3).await;
    open_connections(&s, "rival", 1).await;
    // alice speaks in the lobby: every subscriber hears it, herself too.
    let alice = talk_all(
        &format!("{base}/?user=alice"),
        &["--recv", "1", "--send", "say hi", "--recv", "1"],
    )
    .await;
    assert_eq!(
        alice["received"],
        json!(["welcome", "alice: hi"]),
        "{alice}"
    );
    // The operator publishes to the lobby (Pushpin's publish format), to dave by his
    // connection id... which he does not know: to his room, then.
    let publish = |body: Value| {
        let s = &s;
        async move {
            s.admin_call(
                Method::POST,
                "/admin/v1/tenants/chat/publish",
                body.to_string(),
            )
            .await
        }
    };
    let (status, v) = publish(json!({"items": [
        {"channel": "lobby", "formats": {"ws-message": {"content": "from the operator"}}},
        {"channel": "lobby", "formats": {"ws-message": {"content-bin": "AAEC"}}},
        {"channel": "cellar", "formats": {"ws-message": {"content": "down here"}}},
    ]}))
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["delivered"], 5, "{v}");
    let bob = bob.end().await;
    assert_eq!(
        bob["received"],
        json!(["welcome", "alice: hi", "from the operator", {"bytes": 3}]),
        "{bob}"
    );
    assert_eq!(carol.end().await["received"], bob["received"]);
    let dave = dave.end().await;
    assert_eq!(dave["received"], json!(["welcome", "down here"]), "{dave}");
    // The other tenant's lobby heard nothing: its second recv times out.
    let eve = eve.end().await;
    assert_eq!(eve["received"], json!(["welcome", "timeout"]), "{eve}");

    // Mistakes are named; an unknown tenant is 404; the `publish` scope is needed.
    let (status, v) = publish(json!({"items": [{"channel": "lobby", "formats": {}}]})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert!(v.to_string().contains("ws-message"), "{v}");
    let (status, _) = s
        .admin_call(
            Method::POST,
            "/admin/v1/tenants/nobody/publish",
            json!({"items": [{"channel": "c", "formats": {"ws-message": {"content": "x"}}}]})
                .to_string(),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // A team's token publishes with the `publish` scope only.
    let one = json!({"items": [{"channel": "lobby", "formats": {"ws-message": {"content": "x"}}}]});
    for (scope, expected) in [("read", StatusCode::FORBIDDEN), ("publish", StatusCode::OK)] {
        let ask = json!({"name": format!("team-{scope}"), "tenants": ["chat"], "scopes": [scope]});
        let (status, made) = s
            .admin_call(Method::POST, "/admin/v1/tokens", ask.to_string())
            .await;
        assert_eq!(status, StatusCode::CREATED, "{made}");
        let (status, v) = crate::support::admin_request(
            s.admin(),
            made["token"].as_str().unwrap(),
            Method::POST,
            "/admin/v1/tenants/chat/publish",
            one.to_string().into(),
        )
        .await;
        assert_eq!(status, expected, "scope {scope}: {v}");
    }
    let m = s.metrics().await;
    assert!(
        crate::support::metric_value(
            &m,
            "tern_websocket_published_total{outcome=\"delivered\",tenant=\"chat\"}"
        ) >= 6.0,
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trapping_guest_closes_its_connection_only_and_a_client_gone_is_told() {
    let s = server("").await;
    let base = format!("ws://{}", s.addr());
    // A watcher in the room `gone` hears of each connection that went.
    let watcher = talk(&format!("{base}/?user=w&room=gone"), &["--recv", "4"]).await;
    let steady = talk(
        &format!("{base}/?user=steady"),
        &[
            "--recv", "1", "--send", "before", "--recv", "1",
            // (Held open until the test publishes "go" to the lobby, after the trap.)
            "--recv", "1", "--send", "after", "--recv", "1",
        ],
    )
    .await;
    open_connections(&s, "chat", 2).await;
    let trapped = talk_all(
        &format!("{base}/?user=t"),
        &["--recv", "1", "--send", "trap", "--recv", "1"],
    )
    .await;
    assert_eq!(trapped["close_code"], 1011, "{trapped}");
    assert_eq!(trapped["received"], json!(["welcome"]), "{trapped}");
    // Gone without a close: the guest gets DISCONNECT (and tells the room).
    let aborted = talk(&format!("{base}/?user=ab"), &["--recv", "1", "--abort"]).await;
    assert_eq!(aborted.end().await["aborted"], true);
    // Closed cleanly: the guest gets CLOSE.
    talk_all(&format!("{base}/?user=cl"), &["--recv", "1"]).await;
    let go = json!({"items": [{"channel": "lobby", "formats": {"ws-message": {"content": "go"}}}]});
    let (status, v) = s
        .admin_call(
            Method::POST,
            "/admin/v1/tenants/chat/publish",
            go.to_string(),
        )
        .await;
    assert_eq!(
        (status, &v["delivered"]),
        (StatusCode::OK, &json!(1)),
        "{v}"
    );
    let steady = steady.end().await;
    assert_eq!(
        steady["received"],
        json!(["welcome", "before", "go", "after"]),
        "{steady}"
    );
    let watcher = watcher.end().await;
    let heard = watcher["received"].as_array().unwrap();
    assert_eq!(heard[0], "welcome", "{watcher}");
    let mut gone: Vec<&str> = heard[1..].iter().map(|v| v.as_str().unwrap()).collect();
    gone.sort_unstable();
    // (The trapped connection's guest is not told: it is the one failing.)
    assert_eq!(gone, ["gone ab", "gone cl", "gone steady"], "{watcher}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_limits_close_with_their_codes() {
    // (30 frames against 10 a second: however they fall across two seconds, one has > 10.)
    let s = server("max_message_bytes = 1000\nmax_frames_per_second = 10\n").await;
    let base = format!("ws://{}", s.addr());
    // limit: passes; limit + 1: 1009.
    let got = talk_all(
        &format!("{base}/"),
        &[
            "--recv",
            "1",
            "--send-bytes",
            "1000",
            "--recv",
            "1",
            "--send-bytes",
            "1001",
            "--recv",
            "1",
        ],
    )
    .await;
    assert_eq!(
        got["received"],
        json!(["welcome", {"bytes": 1000}]),
        "{got}"
    );
    assert_eq!(got["close_code"], 1009, "{got}");
    // Frames past 10 a second: 1008.
    let mut args = vec!["--recv", "1"];
    for _ in 0..30 {
        args.extend(["--send", "x"]);
    }
    args.extend(["--recv", "30"]);
    let got = talk_all(&format!("{base}/"), &args).await;
    assert_eq!(got["close_code"], 1008, "{got}");
    // Text that is not UTF-8 (a raw masked frame: the library will not send it): 1007.
    let got = talk_all(
        &format!("{base}/"),
        &["--recv", "1", "--send-raw", "818100000000ff", "--recv", "1"],
    )
    .await;
    assert_eq!(got["close_code"], 1007, "{got}");
    // A reserved opcode: 1002.
    let got = talk_all(
        &format!("{base}/"),
        &["--recv", "1", "--send-raw", "838100000000ff", "--recv", "1"],
    )
    .await;
    assert_eq!(got["close_code"], 1002, "{got}");
    // A ping is answered by Tern, the guest never sees it; the echo after it still comes.
    let got = talk_all(
        &format!("{base}/"),
        &[
            "--recv",
            "1",
            "--send-raw",
            "8982000000006869",
            "--send",
            "y",
            "--recv",
            "1",
        ],
    )
    .await;
    assert_eq!(got["received"], json!(["welcome", "y"]), "{got}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_client_talks_to_an_events_guest_over_extended_connect() {
    use crate::websocket::{masked_text, read_text};
    use hyper_util::rt::TokioIo;
    use tokio::io::AsyncWriteExt;
    let s = server("").await;
    let mut sender = crate::websocket::h2_connection(s.addr()).await;
    let open = |path: &str| crate::websocket::h2_opening(s.addr(), path);
    let refused = sender.send_request(open("/?token=bad")).await.unwrap();
    assert_eq!(refused.status(), 401);
    // Two streams on one connection, each its own WebSocket.
    let mut one = sender.send_request(open("/?user=one")).await.unwrap();
    let mut two = sender.send_request(open("/?user=two")).await.unwrap();
    assert_eq!(
        (one.status(), two.status()),
        (StatusCode::OK, StatusCode::OK)
    );
    let mut one = TokioIo::new(hyper::upgrade::on(&mut one).await.unwrap());
    let mut two = TokioIo::new(hyper::upgrade::on(&mut two).await.unwrap());
    assert_eq!(read_text(&mut one).await, "welcome");
    assert_eq!(read_text(&mut two).await, "welcome");
    one.write_all(&masked_text("whoami")).await.unwrap();
    assert_eq!(read_text(&mut one).await, "one");
    two.write_all(&masked_text("say over h2")).await.unwrap();
    // Both in the lobby: two's message reaches both streams.
    assert_eq!(read_text(&mut two).await, "two: over h2");
    assert_eq!(read_text(&mut one).await, "two: over h2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_only_listens_is_not_idle_and_a_silent_one_is_closed_1001() {
    let s = server("idle_timeout_ms = 2000\n").await;
    let base = format!("ws://{}", s.addr());
    // The listener hears a publish every 300 ms for 3.6 s, past its idle time (2 s).
    let listener = talk(&format!("{base}/?room=news"), &["--recv", "13"]).await;
    let silent = talk(&format!("{base}/?room=quiet"), &["--recv", "2"]).await;
    let news =
        json!({"items": [{"channel": "news", "formats": {"ws-message": {"content": "tick"}}}]});
    for _ in 0..12 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (status, v) = s
            .admin_call(
                Method::POST,
                "/admin/v1/tenants/chat/publish",
                news.to_string(),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{v}");
    }
    let listener = listener.end().await;
    assert_eq!(
        listener["received"].as_array().unwrap().len(),
        13,
        "{listener}"
    );
    assert_eq!(listener["received"][12], "tick", "{listener}");
    let silent = silent.end().await;
    assert_eq!(silent["received"], json!(["welcome"]), "{silent}");
    assert_eq!(silent["close_code"], 1001, "{silent}");
}

/// The next message from the server on a raw connection (text, or binary as `bytes:N,N,...`),
/// or its close as `close CODE`.
async fn next_message(io: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) -> String {
    let (_, opcode, payload) = crate::websocket_autobahn::read_frame(io, buf)
        .await
        .unwrap()
        .expect("a frame");
    match opcode {
        1 => String::from_utf8(payload).unwrap(),
        2 => format!(
            "bytes:{}",
            payload
                .iter()
                .map(u8::to_string)
                .collect::<Vec<_>>()
                .join(",")
        ),
        8 => format!("close {}", u16::from_be_bytes([payload[0], payload[1]])),
        other => panic!("an unexpected frame {other:#x}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_publishes_from_an_ordinary_request_with_the_host_call() {
    use crate::support::post;
    use crate::websocket::masked_text;
    use crate::websocket_autobahn::open;
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().unwrap();
    test_guest(dir.path(), "ws_events");
    let config = "[pool]\ninstances = 16\nmax_memory_mib = 64\n\
         [[tenant]]\nname = \"chat\"\nmodule = \"ws_events.wasm\"\n\
         [tenant.websocket]\nmode = \"events\"\n\
         [[tenant]]\nname = \"rival\"\nmodule = \"ws_events.wasm\"\npaths = [\"/rival\"]\n\
         [tenant.websocket]\nmode = \"events\"\n\
         [[tenant]]\nname = \"plain\"\nmodule = \"ws_events.wasm\"\npaths = [\"/plain\"]\n";
    let s = TestServer::try_start_in(dir, config).await.expect("start");
    // Two connections in chat's lobby, one in rival's (each read its welcome).
    let (mut a, mut abuf) = open(s.addr(), "/?user=a").await.unwrap();
    let (mut b, mut bbuf) = open(s.addr(), "/?user=b").await.unwrap();
    let (mut r, mut rbuf) = open(s.addr(), "/rival?user=r").await.unwrap();
    a.write_all(&masked_text("id")).await.unwrap();
    let id = next_message(&mut a, &mut abuf).await;
    let notify = |path: &str, body: &[u8]| {
        let (path, body, s) = (path.to_string(), body.to_vec(), &s);
        async move { post(s, &path, &[], body).await }
    };
    // Text to a channel: its subscribers of this tenant only.
    let got = notify("/notify?room=lobby", b"hello all").await;
    assert_eq!(
        (got.status, got.text()),
        (StatusCode::OK, "delivered 2\n".into())
    );
    assert_eq!(next_message(&mut a, &mut abuf).await, "hello all");
    assert_eq!(next_message(&mut b, &mut bbuf).await, "hello all");
    let got = notify("/rival/notify?room=lobby", b"rival news").await;
    assert_eq!(got.text(), "delivered 1\n");
    assert_eq!(next_message(&mut r, &mut rbuf).await, "rival news");
    // Binary, and one connection by its id.
    let got = notify("/notify?room=lobby&binary=1", &[0, 1, 255]).await;
    assert_eq!(got.text(), "delivered 2\n");
    let got = notify(&format!("/notify?to={id}"), b"just you").await;
    assert_eq!(got.text(), "delivered 1\n");
    assert_eq!(next_message(&mut a, &mut abuf).await, "bytes:0,1,255");
    assert_eq!(next_message(&mut a, &mut abuf).await, "just you");
    assert_eq!(next_message(&mut b, &mut bbuf).await, "bytes:0,1,255");
    // Pushpin's JSON as it is: two items at once.
    let json = r#"{"items": [
        {"channel": "lobby", "formats": {"ws-message": {"content": "one"}}},
        {"channel": "lobby", "formats": {"ws-message": {"content": "two"}}}]}"#;
    let got = notify("/notify?json=1", json.as_bytes()).await;
    assert_eq!(got.text(), "delivered 4\n");
    for (io, buf) in [(&mut a, &mut abuf), (&mut b, &mut bbuf)] {
        assert_eq!(next_message(io, buf).await, "one");
        assert_eq!(next_message(io, buf).await, "two");
    }
    // Bad publishes: each a clear error, nothing sent.
    let got = notify("/notify?room=", b"x").await;
    assert_eq!(got.status, StatusCode::BAD_REQUEST);
    assert!(
        got.text()
            .starts_with("INVALID_ARGUMENT items[0]: a channel's name is 1 to 256 bytes"),
        "{}",
        got.text()
    );
    let got = notify("/notify?json=1", b"{\"items\": [").await;
    assert!(
        got.text()
            .starts_with("INVALID_ARGUMENT the publish is not valid"),
        "{}",
        got.text()
    );
    let got = notify("/notify?room=lobby&close=1005", b"").await;
    assert!(
        got.text().contains("close code 1005 may not be sent"),
        "{}",
        got.text()
    );
    // 100 publishes in a request: the limit; 101: refused past it.
    let got = notify("/notify?room=nobody&times=100", b"x").await;
    assert_eq!(got.text(), "delivered 0\n");
    let got = notify("/notify?room=nobody&times=101", b"x").await;
    assert_eq!(
        got.text(),
        "LIMIT_EXCEEDED a request may publish 100 times\n"
    );
    // A tenant whose WebSockets are handed off has no channels.
    let got = notify("/plain/notify?room=lobby", b"x").await;
    assert!(
        got.text()
            .starts_with("UNAVAILABLE the tenant's WebSockets are not in events mode"),
        "{}",
        got.text()
    );
    let (status, v) = s
        .admin_call(
            Method::POST,
            "/admin/v1/tenants/plain/publish",
            json!({"items": [{"channel": "c", "formats": {"ws-message": {"content": "x"}}}]})
                .to_string(),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    assert!(v.to_string().contains("not in events mode"), "{v}");
    // A close for one connection: it closes with that code, the other stays.
    let got = notify(&format!("/notify?to={id}&close=4001"), b"bye").await;
    assert_eq!(got.text(), "delivered 1\n");
    assert_eq!(next_message(&mut a, &mut abuf).await, "close 4001");
    a.write_all(&crate::websocket_autobahn::frame(
        0x88,
        &4001u16.to_be_bytes(),
    ))
    .await
    .unwrap();
    open_connections(&s, "chat", 1).await;
    let got = notify("/notify?room=lobby", b"last").await;
    assert_eq!(got.text(), "delivered 1\n");
    assert_eq!(next_message(&mut b, &mut bbuf).await, "last");
    // Counted: 2 + 2 + 1 + 4 + 1 + 1 delivered to chat's connections.
    let m = s.metrics().await;
    assert_eq!(
        crate::support::metric_value(
            &m,
            "tern_websocket_published_total{outcome=\"delivered\",tenant=\"chat\"}"
        ),
        11.0,
        "{m}"
    );
}

/// Sends `whoami` on a raw connection: the guest's answer (the `user` its opening named).
async fn whoami(io: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) -> String {
    use tokio::io::AsyncWriteExt;
    io.write_all(&crate::websocket::masked_text("whoami"))
        .await
        .unwrap();
    next_message(io, buf).await
}

/// Each batch of a connection's events goes to the version the tenant's split gives its
/// client at that moment, as a request of the client's would: opened on a candidate at 100 %,
/// its next message goes to the current version once the candidate's share is 0 (what an
/// abort does), and back when it has a share again; a connection whose opening asked for the
/// candidate (`Tern-Version`) stays on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connections_events_go_to_the_version_the_split_gives_its_client_now() {
    use crate::websocket_autobahn::{open, open_with};
    let dir = tempfile::tempdir().unwrap();
    let wasm = std::fs::read(test_guest(dir.path(), "ws_events")).unwrap();
    let s = TestServer::start("").await;
    let spec = json!({"paths": ["/"], "websocket": {"mode": "events"}});
    s.create_and_deploy("chat", spec, &wasm).await;
    let at = "/admin/v1/tenants/chat/module";
    let candidate = crate::rollout::variant(&wasm, "2");
    let (status, v) = s
        .admin_call(Method::PUT, &format!("{at}?percent=100"), candidate)
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let share = async |percent: u32| {
        let body = json!({ "percent": percent }).to_string();
        let (status, v) = s
            .admin_call(Method::POST, "/admin/v1/tenants/chat/rollout", body)
            .await;
        assert_eq!(status, StatusCode::OK, "{v}");
    };
    // The answers each version has sent the tenant's clients (openings and batches).
    let served = async || {
        let m = s.metrics().await;
        let count = |deployment: &str| -> f64 {
            let label = format!("deployment=\"{deployment}\"");
            m.lines()
                .filter(|l| l.starts_with("tern_requests_total{") && l.contains(&label))
                .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
                .sum()
        };
        (count("current"), count("candidate"))
    };
    // Waits until the counts are `want` (an answer is counted as it ends), then checks they
    // stay so a moment.
    let until = async |want: (f64, f64), what: &str| {
        let started = std::time::Instant::now();
        while served().await != want {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{what}: (current, candidate) answers {:?}, not {want:?}",
                served().await
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(served().await, want, "{what}");
    };

    // Both open on the candidate: one by the split (100 %), one asking for it.
    let (mut split, mut split_buf) = open(s.addr(), "/?user=split").await.unwrap();
    let asked = format!(
        "tern-version: candidate\r\ntern-version-token: {}\r\n",
        crate::support::ADMIN_TOKEN
    );
    let (mut chose, mut chose_buf) = open_with(s.addr(), "/?user=chose", &asked).await.unwrap();
    until((0.0, 2.0), "two openings on the candidate").await;
    assert_eq!(whoami(&mut split, &mut split_buf).await, "split");
    until((0.0, 3.0), "a message at 100 %").await;

    // At 0 %: the split's connection goes to the current version, the other stays.
    share(0).await;
    assert_eq!(whoami(&mut split, &mut split_buf).await, "split");
    until((1.0, 3.0), "a message at 0 %").await;
    assert_eq!(whoami(&mut chose, &mut chose_buf).await, "chose");
    until((1.0, 4.0), "a message that asked for the candidate, at 0 %").await;

    // A share again: the client's connection is the candidate's again.
    share(100).await;
    assert_eq!(whoami(&mut split, &mut split_buf).await, "split");
    until((1.0, 5.0), "a message at 100 % again").await;

    // A new candidate split at 50 % by a header: each connection's messages go where its
    // opening went (its header decides, not the address all of them share), and the
    // candidate's are judged (the judge counts what its split gives it, not what is asked for).
    let candidate = crate::rollout::variant(&wasm, "3");
    let query = "percent=50&key=header%3Ax-user";
    let (status, v) = s
        .admin_call(Method::PUT, &format!("{at}?{query}"), candidate)
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let judged = async || {
        let (_, t) = s
            .admin_call(Method::GET, "/admin/v1/tenants/chat", "")
            .await;
        t["candidate"]["answered_here"]["candidate"]["requests"]
            .as_u64()
            .unwrap_or_else(|| panic!("no judge counts: {t}"))
    };
    let before = served().await;
    let mut conns = Vec::new();
    for i in 0..20 {
        let user = format!("x-user: u{i}\r\n");
        conns.push(
            open_with(s.addr(), &format!("/?user=u{i}"), &user)
                .await
                .unwrap(),
        );
    }
    let started = std::time::Instant::now();
    let opened = loop {
        let now = served().await;
        if now.0 + now.1 == before.0 + before.1 + 20.0 {
            break (now.0 - before.0, now.1 - before.1);
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{now:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        opened.0 > 0.0 && opened.1 > 0.0,
        "20 users split both ways: {opened:?}"
    );
    let judged_before = judged().await;
    for (i, (io, buf)) in conns.iter_mut().enumerate() {
        assert_eq!(whoami(io, buf).await, format!("u{i}"));
    }
    let after = (before.0 + 2.0 * opened.0, before.1 + 2.0 * opened.1);
    until(after, "each connection's message where its opening went").await;
    assert_eq!(
        judged().await,
        judged_before + opened.1 as u64,
        "the candidate's messages are judged"
    );
}

/// A tenant's connection limit counts its own connections: one created again under a deleted
/// one's name opens up to its own limit while the old one's connection is still open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_made_again_counts_its_own_connections() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = std::fs::read(test_guest(dir.path(), "ws_events")).unwrap();
    let s = TestServer::start("").await;
    let spec = json!({"paths": ["/"], "websocket": {"mode": "events", "max_connections": 1}});
    s.create_and_deploy("chat", spec.clone(), &wasm).await;
    let url = |user: &str| format!("ws://{}/?user={user}", s.addr());
    // The limit, then the limit + 1.
    let bob = talk(&url("bob"), &["--recv", "2"]).await;
    assert_eq!(bob.first["opened"], true, "{}", bob.first);
    open_connections(&s, "chat", 1).await;
    let full = talk(&url("eve"), &[]).await;
    assert_eq!(full.first["status"], 503, "{}", full.first);
    // Deleted (bob's connection stays until its next batch) and created again.
    let (status, v) = s
        .admin_call(Method::DELETE, "/admin/v1/tenants/chat", "")
        .await;
    assert!(status.is_success(), "{status} {v}");
    s.create_and_deploy("chat", spec, &wasm).await;
    let carol = talk(&url("carol"), &["--recv", "2"]).await;
    assert_eq!(
        carol.first["opened"], true,
        "the old tenant's count: {}",
        carol.first
    );
    open_connections(&s, "chat", 2).await;
    let full = talk(&url("eve"), &[]).await;
    assert_eq!(full.first["status"], 503, "its own limit: {}", full.first);
    drop((bob, carol));
}
