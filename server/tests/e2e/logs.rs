//! Live logs (`tern logs`, `GET /admin/v1/tenants/{name}/logs`): a tailer sees each request
//! once, in order, as it ends, with the ids of its answer and access line, its outcome and
//! what its guest wrote; filters select exactly what they name; a reader that stops is told
//! exactly how many records it missed; a tenant takes at most its tailers; what a guest
//! writes never breaks the stream's framing; every guest kind and HTTP version is recorded.
//! (The fleet's merged stream is in `fleet::shared`.)

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;

use crate::support::*;

/// The probe tenant at `/p`: a short time limit (its `spin` runs into it) and a cache.
const PROBE: &str = "[[tenant]]\nname = \"probe\"\nmodule = \"log_probe.wasm\"\npaths = [\"/p\"]\n\
    [tenant.limits]\ntimeout_ms = 100\n[tenant.cache]\nenabled = true\n";

/// What a request of the mixed hundred is, and what its record must say.
struct Sent {
    id: String,
    method: Method,
    path: String,
    status: u16,
    outcome: &'static str,
    answered: Instant,
}

/// Request `i` of the mixed hundred: a guest's 200 with output, its 404 (to a POST), a trap,
/// a deadline, a cache hit (the first of those a miss).
fn mixed(i: usize) -> (Method, String, u16, &'static str) {
    match i % 5 {
        0 => (Method::GET, format!("/p/say/{i}?say=hello{i}"), 200, "ok"),
        1 => (
            Method::POST,
            format!("/p/missing/{i}?status=404"),
            404,
            "ok",
        ),
        2 => (
            Method::GET,
            format!("/p/trap/{i}?trap=1"),
            500,
            "trap_unreachable",
        ),
        3 => (Method::GET, format!("/p/spin/{i}?spin=1"), 504, "timeout"),
        _ if i == 4 => (Method::GET, "/p/cached?cache=1".into(), 200, "ok"),
        _ => (Method::GET, "/p/cached?cache=1".into(), 200, "cache_hit"),
    }
}

/// Lines a child process writes to its stdout, each with the instant it was read.
fn lines_of(stdout: std::process::ChildStdout) -> std::sync::mpsc::Receiver<(Instant, String)> {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send((Instant::now(), line)).is_err() {
                break;
            }
        }
    });
    rx
}

/// `tern logs TENANT ARGS` against `tern`'s admin listener (its token from its data
/// directory): the finished command.
fn tern_logs(tern: &TernProcess, data: &std::path::Path, args: &[&str]) -> std::process::Output {
    ran(tern_bin()
        .arg("logs")
        .args(args)
        .args(["--server", &format!("http://{}", tern.admin)])
        .arg("--data-dir")
        .arg(data))
}

/// The records of `tern logs --json` output (other lines left out).
fn records_of(out: &std::process::Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("every line is JSON"))
        .filter(|v| v.get("request_id").is_some())
        .collect()
}

#[test]
fn a_tailer_sees_each_request_as_it_ends_and_filters_select_exactly_what_they_name() {
    let dir = tempfile::tempdir().unwrap();
    test_guest(dir.path(), "log_probe");
    let config = dir.path().join("tern.toml");
    std::fs::write(
        &config,
        format!("[pool]\ninstances = 16\nmax_memory_mib = 64\n{PROBE}"),
    )
    .unwrap();
    let data = dir.path().join("data");
    let tern = TernProcess::serve_with(
        &["--config", &config.display().to_string()],
        dir.path(),
        |cmd| {
            cmd.env("TERN_LOG", "info,tern::access=info");
        },
    );
    let addr: std::net::SocketAddr = tern.addr.parse().unwrap();
    let mut tailer = tern_bin()
        .args(["logs", "probe", "-f", "--json"])
        .args(["--server", &format!("http://{}", tern.admin)])
        .arg("--data-dir")
        .arg(&data)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run tern logs");
    let lines = lines_of(tailer.stdout.take().unwrap());
    tern.wait_metric("tern_live_log_tailers", 1.0);

    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut sent = Vec::new();
    for i in 0..100 {
        let (method, path, status, outcome) = mixed(i);
        let r = rt.block_on(send(addr, method.clone(), &path, None, &[], Bytes::new()));
        assert_eq!(r.status.as_u16(), status, "{path}: {}", r.text());
        sent.push(Sent {
            id: r.header("x-request-id").to_string(),
            method,
            path,
            status,
            outcome,
            answered: Instant::now(),
        });
    }
    // One record per request, in the order they were answered, each within a second of its
    // answer.
    let mut records = Vec::new();
    for s in &sent {
        let (at, line) = lines
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("no record for {} {} ({})", s.method, s.path, s.id));
        let v: Value = serde_json::from_str(&line).expect("a JSON line");
        assert_eq!(v["request_id"], s.id.as_str(), "{line}");
        assert!(
            at.saturating_duration_since(s.answered) < Duration::from_secs(1),
            "{} came {:?} after its answer",
            s.path,
            at - s.answered
        );
        let path = s.path.split('?').next().unwrap();
        assert_eq!(v["path"], path, "{line}");
        assert_eq!(v["method"], s.method.as_str(), "{line}");
        assert_eq!(v["status"], s.status, "{line}");
        assert_eq!(v["outcome"], s.outcome, "{line}");
        assert_eq!(v["tenant"], "probe", "{line}");
        assert_eq!(v["version"], "config", "{line}");
        assert_eq!(v["client"], "127.0.0.1", "{line}");
        assert!(v["ms"]["total"].as_f64().unwrap() > 0.0, "{line}");
        match s.outcome {
            "ok" if path.starts_with("/p/say/") => {
                let word = path.rsplit('/').next().unwrap();
                assert_eq!(v["stdout"], serde_json::json!([format!("hello{word}")]));
                assert_eq!(v["stderr"], serde_json::json!([format!("err hello{word}")]));
                assert!(v["ms"]["instantiate"].as_f64().is_some(), "{line}");
            }
            "trap_unreachable" => {
                let stderr = v["stderr"].to_string();
                assert!(
                    stderr.contains("about to trap") && stderr.contains("panicked"),
                    "{line}"
                );
                assert!(
                    v["error"].as_str().unwrap().contains("unreachable"),
                    "{line}"
                );
                // The Wasm frames, innermost first (named when the module keeps its names).
                let trace = v["backtrace"].as_array().expect("a backtrace");
                assert!(trace.len() > 3, "{line}");
                assert!(
                    trace.iter().all(|f| f.as_str().unwrap().contains(" 0x")),
                    "{line}"
                );
            }
            "timeout" => assert!(
                v["error"].as_str().unwrap().contains("time limit"),
                "{line}"
            ),
            "cache_hit" => {
                assert!(v["cache"].as_str().unwrap().contains("hit"), "{line}");
                assert!(v["ms"].get("run").is_none(), "no guest ran: {line}");
            }
            _ => {}
        }
        records.push(v);
    }
    assert!(
        lines.recv_timeout(Duration::from_millis(300)).is_err(),
        "one record per request"
    );
    // The access lines carry the same ids.
    for s in &sent {
        let needle = format!("request_id=\"{}\"", s.id);
        loop {
            let line = tern.wait_for(&needle);
            if line.contains("tern::access") {
                assert!(line.contains(&format!("status={}", s.status)), "{line}");
                break;
            }
        }
    }
    let _ = tailer.kill();
    let _ = tailer.wait();

    // Each filter, on the records kept, selects exactly the requests it names.
    let ids = |pick: &dyn Fn(&Sent) -> bool| -> Vec<String> {
        sent.iter()
            .filter(|s| pick(s))
            .map(|s| s.id.clone())
            .collect()
    };
    let shown = |args: &[&str]| -> Vec<String> {
        let mut all = vec!["probe", "--json"];
        all.extend_from_slice(args);
        records_of(&tern_logs(&tern, &data, &all))
            .iter()
            .map(|v| v["request_id"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(shown(&[]), ids(&|_| true));
    assert_eq!(shown(&["--status", "5xx"]), ids(&|s| s.status >= 500));
    assert_eq!(
        shown(&["--status", "404,504"]),
        ids(&|s| matches!(s.status, 404 | 504))
    );
    assert_eq!(
        shown(&["--outcome", "trap"]),
        ids(&|s| s.outcome.starts_with("trap"))
    );
    assert_eq!(
        shown(&["--outcome", "timeout"]),
        ids(&|s| s.outcome == "timeout")
    );
    assert_eq!(
        shown(&["--outcome", "cached"]),
        ids(&|s| s.outcome == "cache_hit")
    );
    assert_eq!(
        shown(&["--method", "post"]),
        ids(&|s| s.method == Method::POST)
    );
    assert_eq!(
        shown(&["--path", "/p/spin/"]),
        ids(&|s| s.path.starts_with("/p/spin/"))
    );
    assert_eq!(
        shown(&["--search", "HELLO15"]),
        ids(&|s| s.path.contains("hello15"))
    );
    assert_eq!(
        shown(&["--version", "config", "--status", "404"]),
        ids(&|s| s.status == 404)
    );
    assert!(shown(&["--version", "v-none"]).is_empty());
    assert_eq!(shown(&["--since", "1h"]), ids(&|_| true));
    let half = shown(&["--sample", "0.5"]);
    assert!((20..=80).contains(&half.len()), "{}", half.len());
    assert_eq!(
        half,
        shown(&["--sample", "0.5"]),
        "the same sample each time"
    );
    // Readable lines, by default.
    let out = tern_logs(&tern, &data, &["probe", "--status", "500"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        text.lines()
            .filter(|l| l.contains(" 500 trap_unreachable "))
            .count(),
        20,
        "{text}"
    );
    assert!(text.contains("  stderr| about to trap"), "{text}");
    // A bad filter is the server's clear refusal.
    let bad = tern_bin()
        .args([
            "logs",
            "probe",
            "--status",
            "7xx",
            "--server",
            &format!("http://{}", tern.admin),
        ])
        .arg("--data-dir")
        .arg(&data)
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("400 Bad Request: status \"7xx\""));
}

/// A follow stream opened on `s`'s admin listener for `tenant` with `query`, through a socket
/// whose receive buffer is `rcvbuf` bytes: its head, its body unread.
async fn open_stream(
    s: &TestServer,
    tenant: &str,
    query: &str,
    token: &str,
) -> http::Response<hyper::body::Incoming> {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let stream = socket.connect(s.admin()).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = http::Request::get(format!("/admin/v1/tenants/{tenant}/logs?{query}"))
        .header("host", "admin")
        .header("authorization", format!("Bearer {token}"))
        .body(http_body_util::Empty::<Bytes>::new())
        .unwrap();
    sender.send_request(req).await.unwrap()
}

/// The JSON objects of an NDJSON body read until `done` says enough (or 20 s pass).
async fn read_until(
    body: &mut hyper::body::Incoming,
    done: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let mut buf = Vec::new();
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !done(&seen) {
        let frame = tokio::time::timeout_at(deadline, body.frame())
            .await
            .expect("the stream went quiet")
            .expect("the stream ended")
            .expect("the stream broke");
        buf.extend_from_slice(&frame.into_data().unwrap_or_default());
        while let Some(at) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=at).collect();
            seen.push(serde_json::from_slice(&line).expect("a JSON line"));
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_stops_reading_loses_records_never_requests_and_is_told_how_many() {
    let s = TestServer::start(
        "[server.live_logs]\nhistory = 50\nrecords_per_second = 0\n\
         [[tenant]]\nname = \"h\"\nmodule = \"builtin:hello\"\npaths = [\"/h\"]\n",
    )
    .await;
    let resp = open_stream(&s, "h", "follow=1", ADMIN_TOKEN).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["content-type"], "application/x-ndjson");
    let mut body = resp.into_body();
    // It reads nothing while 20,000 requests are answered: far more than the ring of 50
    // holds, and than the sockets buffer (7.6 MB of records; a loopback connection's send
    // buffer starts at about 1.3 MB).
    let mut conn = Conn::open(s.addr()).await;
    let mut ids = Vec::new();
    for i in 0..20_000 {
        let r = conn.get(&format!("/h/{i}")).await;
        assert_eq!(r.status, StatusCode::OK);
        ids.push(r.header("x-request-id").to_string());
    }
    let n = ids.len() as u64;
    let accounted = |seen: &[Value]| {
        let records = seen
            .iter()
            .filter(|v| v.get("request_id").is_some())
            .count() as u64;
        let dropped: u64 = seen.iter().filter_map(|v| v["dropped"].as_u64()).sum();
        records + dropped >= n
    };
    let seen = read_until(&mut body, accounted).await;
    let got: Vec<&str> = seen
        .iter()
        .filter_map(|v| v["request_id"].as_str())
        .collect();
    let dropped: u64 = seen.iter().filter_map(|v| v["dropped"].as_u64()).sum();
    assert_eq!(
        got.len() as u64 + dropped,
        n,
        "each request a record or a dropped one"
    );
    assert!(dropped > 0, "the reader fell behind");
    // What it got is in order, ends with the last requests (the ring kept them for it), and
    // the missed ones are exactly those it did not get.
    let mut at = ids.iter();
    for id in &got {
        assert!(at.any(|x| x == id), "{id} out of order");
    }
    assert_eq!(got.last().copied(), ids.last().map(String::as_str));
    assert!(got.len() >= 50, "{}", got.len());
    let metrics = s.metrics().await;
    assert_eq!(
        metric_value(&metrics, "tern_live_log_dropped_total"),
        dropped as f64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_takes_at_most_its_tailers_and_only_tokens_with_its_logs_scope() {
    let s = TestServer::start(
        "[[tenant]]\nname = \"h\"\nmodule = \"builtin:hello\"\npaths = [\"/h\"]\n\
         [[tenant]]\nname = \"o\"\nmodule = \"builtin:hello\"\npaths = [\"/o\"]\n",
    )
    .await;
    let mut open = Vec::new();
    for _ in 0..10 {
        let resp = open_stream(&s, "h", "follow=1", ADMIN_TOKEN).await;
        assert_eq!(resp.status(), StatusCode::OK);
        open.push(resp);
    }
    let refused = open_stream(&s, "h", "follow=1", ADMIN_TOKEN).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(refused.headers().contains_key("retry-after"));
    let text = refused.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&text).contains("max_tailers"));
    // Another tenant has its own.
    assert_eq!(
        open_stream(&s, "o", "follow=1", ADMIN_TOKEN).await.status(),
        StatusCode::OK
    );
    // A reader that leaves gives its place back.
    drop(open.pop());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let resp = open_stream(&s, "h", "follow=1", ADMIN_TOKEN).await;
        if resp.status() == StatusCode::OK {
            break;
        }
        assert!(Instant::now() < deadline, "the place was never given back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Scoped tokens: `logs` on `h` reads h's live log and nothing else's.
    let mut tokens = Vec::new();
    for scope in ["logs", "read"] {
        let body = serde_json::json!({"name": scope, "tenants": ["h"], "scopes": [scope]});
        let (status, v) = s
            .admin_call(Method::POST, "/admin/v1/tokens", body.to_string())
            .await;
        assert!(status.is_success(), "{v}");
        tokens.push(v["token"].as_str().unwrap().to_string());
    }
    let (logs, read) = (tokens[0].clone(), tokens[1].clone());
    for (tenant, token, status) in [
        ("h", logs.as_str(), StatusCode::OK),
        ("o", &logs, StatusCode::NOT_FOUND),
        ("h", &read, StatusCode::FORBIDDEN),
        ("h", "wrong", StatusCode::UNAUTHORIZED),
    ] {
        assert_eq!(
            log_as(&s, token, tenant, "").await.status,
            status,
            "{tenant}"
        );
    }
}

/// Reads `tenant`'s live log on `s` (not following): its NDJSON body.
pub(crate) async fn log_of(s: &TestServer, tenant: &str, query: &str) -> Reply {
    log_as(s, ADMIN_TOKEN, tenant, query).await
}

/// [`log_of`] with the bearer `token`.
async fn log_as(s: &TestServer, token: &str, tenant: &str, query: &str) -> Reply {
    let auth = format!("Bearer {token}");
    let path = format!("/admin/v1/tenants/{tenant}/logs?{query}");
    send(
        s.admin(),
        Method::GET,
        &path,
        None,
        &[("authorization", &auth)],
        Bytes::new(),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_utf8_escapes_and_a_flood_of_stderr_never_break_the_framing() {
    let dir = tempfile::tempdir().unwrap();
    test_guest(dir.path(), "log_probe");
    let config = format!(
        "[pool]\ninstances = 16\nmax_memory_mib = 64\n{}",
        PROBE.replace("[tenant.cache]\nenabled = true\n", "")
    );
    let s = TestServer::try_start_in(dir, &config).await.unwrap();
    let r = s.get("/p/odd?odd=1&flood=1000000").await;
    assert_eq!(r.status, StatusCode::OK);
    let r = s.get("/p/after?say=next").await;
    assert_eq!(r.status, StatusCode::OK);
    let log = log_of(&s, "probe", "").await;
    assert_eq!(log.status, StatusCode::OK);
    assert!(!log.body.contains(&0x1b) && !log.body.contains(&b'\r'));
    let lines: Vec<&[u8]> = log
        .body
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(lines.len(), 2, "two records, one a line");
    let odd: Value = serde_json::from_slice(lines[0]).unwrap();
    assert_eq!(
        odd["stdout"],
        serde_json::json!([
            "bad \u{fffd}\u{fffd} utf8",
            "\u{1b}[31mred\u{1b}[0m\r",
            "no newline at the end"
        ])
    );
    let stderr = odd["stderr"].as_array().unwrap();
    assert_eq!(stderr.len(), 1);
    assert_eq!(
        stderr[0].as_str().unwrap().len(),
        64 * 1024,
        "cut at stdio_bytes"
    );
    assert_eq!(
        odd["truncated"],
        serde_json::json!({"stdout": false, "stderr": true})
    );
    let next: Value = serde_json::from_slice(lines[1]).unwrap();
    assert_eq!(next["stdout"], serde_json::json!(["next"]));
    // As server-sent events: one event a record.
    let sse = log_of(&s, "probe", "format=sse").await;
    assert_eq!(sse.header("content-type"), "text/event-stream");
    let text = sse.text();
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(events.len(), 2, "{text:.200}");
    assert!(
        events
            .iter()
            .all(|e| e.starts_with("data: {") && !e.contains('\n'))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_guest_kind_and_http_version_and_deployed_version_is_recorded() {
    let s = TestServer::start(
        "[[tenant]]\nname = \"c\"\nmodule = \"builtin:wasi-http\"\npaths = [\"/c\"]\n\
         [[tenant]]\nname = \"g\"\nmodule = \"builtin:cgi\"\npaths = [\"/g\"]\n",
    )
    .await;
    let v = s.deploy("t", "/t", demo("hello")).await;
    let version = v["version"].as_str().unwrap().to_string();
    let mut h2 = H2Conn::open(s.addr()).await;
    for (path, tenant) in [("/c", "c"), ("/g", "g"), ("/t", "t")] {
        let one = s.get(path).await;
        let two = h2.get(path).await;
        assert_eq!(
            (one.status, two.status),
            (StatusCode::OK, StatusCode::OK),
            "{path}"
        );
        let log = log_of(&s, tenant, "").await;
        let records: Vec<Value> = log
            .text()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let seen: BTreeSet<(String, String)> = records
            .iter()
            .map(|r| {
                (
                    r["request_id"].as_str().unwrap().into(),
                    r["http"].as_str().unwrap().into(),
                )
            })
            .collect();
        let want: BTreeSet<(String, String)> = [
            (one.header("x-request-id").to_string(), "1.1".to_string()),
            (two.header("x-request-id").to_string(), "2".to_string()),
        ]
        .into();
        assert_eq!(seen, want, "{tenant}");
        assert!(
            records
                .iter()
                .all(|r| r["outcome"] == "ok" && r["status"] == 200)
        );
        let expected = if tenant == "t" {
            version.as_str()
        } else {
            "config"
        };
        assert!(
            records.iter().all(|r| r["version"] == expected),
            "{records:?}"
        );
    }
    let only = log_of(&s, "t", &format!("version={version}")).await;
    assert_eq!(only.text().lines().count(), 2);
    // A redeploy keeps the tenant's records; the next one names the new version.
    let v2 = s.deploy("t", "/t", demo("counter")).await;
    let v2 = v2["version"].as_str().unwrap();
    assert_eq!(s.get("/t").await.status, StatusCode::OK);
    let log = log_of(&s, "t", "").await;
    let versions: Vec<String> = log
        .text()
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["version"]
                .as_str()
                .unwrap()
                .into()
        })
        .collect();
    assert_eq!(versions, [version.as_str(), version.as_str(), v2]);
    // Unknown tenant, bad query: clear refusals.
    let none = log_of(&s, "nobody", "").await;
    assert_eq!(none.status, StatusCode::NOT_FOUND);
    let bad = log_of(&s, "t", "since=yesterday").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert!(bad.text().contains("since"), "{}", bad.text());
}
