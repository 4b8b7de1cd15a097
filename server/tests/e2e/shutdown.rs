//! The `tern serve` binary: with no config it serves the built-in demo tenants; SIGTERM stops
//! accepting, lets the in-flight request finish, and exits 0.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::support::TernProcess;

#[test]
fn demo_server_drains_in_flight_requests_on_sigterm() {
    let cache = tempfile::tempdir().unwrap();
    let mut tern = TernProcess::serve(&[], cache.path());

    // A request whose body is only half sent when the signal arrives.
    let mut conn = TcpStream::connect(&tern.addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    conn.write_all(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\nhello")
        .unwrap();
    // In flight: the server has it (waited for, not slept on).
    tern.wait_metric("tern_requests_in_flight", 1.0);
    let status = std::process::Command::new("kill")
        .args(["-TERM", &tern.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    tern.wait_for("shutting down");
    // New connections are refused once the server stops accepting.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(&tern.addr).is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "listener still accepting 10 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    conn.write_all(b"world").unwrap();
    let mut reply = String::new();
    let _ = conn.read_to_string(&mut reply);
    assert!(reply.starts_with("HTTP/1.1 200 OK"), "{reply}");
    assert!(reply.ends_with("helloworld"), "{reply}");

    let exit = tern.child.wait().unwrap();
    assert!(exit.success(), "tern exited with {exit}");
}

/// Writes "to stdout" and "to stderr" through WASI `fd_write`, then 200 KiB more to stdout.
const PRINTER: &str = r#"(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 5)
  (data (i32.const 100) "to stdout\n")
  (data (i32.const 200) "to stderr\n")
  (func $print (param $fd i32) (param $ptr i32) (param $len i32)
    (i32.store (i32.const 0) (local.get $ptr))
    (i32.store (i32.const 4) (local.get $len))
    (drop (call $fd_write (local.get $fd) (i32.const 0) (i32.const 1) (i32.const 8))))
  (func (export "_start")
    (call $print (i32.const 1) (i32.const 100) (i32.const 10))
    (call $print (i32.const 2) (i32.const 200) (i32.const 10))
    (memory.fill (i32.const 1024) (i32.const 120) (i32.const 204800))
    (call $print (i32.const 1) (i32.const 1024) (i32.const 204800))))"#;

#[test]
fn guest_stdout_and_stderr_are_logged_with_tenant_and_request_id_and_capped() {
    let dir = tempfile::tempdir().unwrap();
    crate::support::wat_file(dir.path(), "printer.wasm", PRINTER);
    let config = dir.path().join("tern.toml");
    std::fs::write(
        &config,
        "[[tenant]]\nname = \"printer\"\nmodule = \"printer.wasm\"\nkind = \"tern\"\n[tenant.limits]\nstdio_bytes = 1024\n",
    )
    .unwrap();
    let tern = TernProcess::serve(
        &["--config", config.to_str().unwrap()],
        &dir.path().join("cache"),
    );
    let mut conn = TcpStream::connect(&tern.addr).unwrap();
    conn.write_all(
        b"GET / HTTP/1.1\r\nhost: x\r\nx-request-id: stdio-check-1\r\nconnection: close\r\n\r\n",
    )
    .unwrap();
    let mut reply = String::new();
    conn.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 200 OK"), "{reply}");

    let out = tern.wait_for("stream=\"stdout\"");
    assert!(
        out.contains("printer") && out.contains("stdio-check-1") && out.contains("to stdout\\n"),
        "{out}"
    );
    assert!(out.contains("truncated=true"), "{out}");
    // Capped at stdio_bytes: the 200 KiB write does not reach the log whole.
    assert!(
        out.len() < 4096,
        "stdout was not capped: {} bytes",
        out.len()
    );
    let err = tern.wait_for("stream=\"stderr\"");
    assert!(
        err.contains("stdio-check-1") && err.contains("to stderr\\n"),
        "{err}"
    );
    assert!(err.contains("truncated=false"), "{err}");
    let access = tern.wait_for("tern::access");
    assert!(
        access.contains("stdio-check-1")
            && access.contains("tenant=\"printer\"")
            && access.contains("status=200"),
        "{access}"
    );
}

/// Shutdown under load: requests in flight when the signal comes all finish with `200`, and
/// every response a client received is a success; the server then stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_under_load_drops_no_accepted_request() {
    use crate::support::{TestServer, test_guest};
    let dir = tempfile::tempdir().unwrap();
    test_guest(dir.path(), "cpu_burn");
    let config = "[[tenant]]\nname = \"burn\"\nmodule = \"cpu_burn.wasm\"\npaths = [\"/burn\"]\n\
                  [tenant.limits]\ntimeout_ms = 10000\n\
                  [[tenant]]\nname = \"hello\"\nmodule = \"builtin:hello\"\npaths = [\"/hello\"]\n";
    let s = TestServer::try_start_in(dir, config).await.expect("start");
    let addr = s.addr();
    // Long requests that will be in flight when shutdown starts.
    let long: Vec<_> = (0..4)
        .map(|_| {
            tokio::spawn(async move {
                crate::support::send(
                    addr,
                    http::Method::GET,
                    "/burn?ms=800",
                    None,
                    &[],
                    bytes::Bytes::new(),
                )
                .await
            })
        })
        .collect();
    // Keep-alive clients hammering a light tenant until the server closes their connection.
    let light: Vec<_> = (0..4)
        .map(|_| {
            tokio::spawn(async move {
                let mut conn = crate::support::Conn::open(addr).await;
                let mut ok = 0;
                while let Some(r) = conn.try_get("/hello").await {
                    assert_eq!(
                        r.status,
                        http::StatusCode::OK,
                        "a response during shutdown failed"
                    );
                    ok += 1;
                }
                ok
            })
        })
        .collect();
    // All four in flight before the signal.
    s.wait_metric("tern_requests_in_flight", 4.0).await;
    s.running.shutdown.trigger();
    for t in long {
        let r = t.await.unwrap();
        assert_eq!(
            r.status,
            http::StatusCode::OK,
            "in-flight request dropped: {}",
            r.text()
        );
    }
    for t in light {
        assert!(t.await.unwrap() > 0);
    }
    tokio::time::timeout(Duration::from_secs(10), s.running.wait())
        .await
        .expect("server stopped");
}

#[test]
fn json_logs_are_one_object_per_line_with_an_access_line_per_request() {
    let cache = tempfile::tempdir().unwrap();
    let tern = TernProcess::serve(&["--log-format", "json"], cache.path());
    let mut conn = TcpStream::connect(&tern.addr).unwrap();
    conn.write_all(
        b"GET /hello HTTP/1.1\r\nhost: x\r\nx-request-id: json-log-1\r\nconnection: close\r\n\r\n",
    )
    .unwrap();
    let mut reply = String::new();
    conn.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 200 OK"), "{reply}");
    let line = tern.wait_for("json-log-1");
    let v: serde_json::Value = serde_json::from_str(&line).expect("a JSON log line");
    assert_eq!(v["target"], "tern::access");
    assert_eq!(v["fields"]["tenant"], "hello");
    assert_eq!(v["fields"]["status"], 200);
    assert!(v["fields"]["total_ms"].as_f64().is_some(), "{line}");
}

/// Reads one HTTP/1.1 response with a `Content-Length`; returns its head, or `None` if the
/// connection ended (EOF or reset) before a whole response came.
fn read_response(conn: &mut TcpStream) -> Result<Option<String>, std::io::Error> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                return Ok(Some(head));
            }
        }
        let n = conn.read(&mut byte)?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&byte[..n]);
    }
}

/// SIGTERM under load: every request sent on a keep-alive connection is answered (the last one
/// with `Connection: close`), and a new connection is either answered or refused, never reset
/// mid-request. One reset is allowed for a connection the kernel completes in the microseconds
/// between the last accept from the backlog and the listener's close.
#[test]
fn sigterm_under_keep_alive_load_answers_every_request() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let cache = tempfile::tempdir().unwrap();
    let mut tern = TernProcess::serve(&[], cache.path());
    let addr = tern.addr.clone();
    let answered = Arc::new(AtomicUsize::new(0));
    let mut keep_alive = Vec::new();
    for _ in 0..8 {
        let (addr, answered) = (addr.clone(), answered.clone());
        keep_alive.push(std::thread::spawn(move || -> Result<(), String> {
            let mut conn = TcpStream::connect(&addr).map_err(|e| e.to_string())?;
            conn.set_read_timeout(Some(Duration::from_secs(20)))
                .unwrap();
            for i in 0.. {
                conn.write_all(b"GET /hello HTTP/1.1\r\nhost: x\r\n\r\n")
                    .map_err(|e| format!("request {i}: write: {e}"))?;
                match read_response(&mut conn) {
                    Ok(Some(head)) if head.starts_with("http/1.1 200") => {
                        answered.fetch_add(1, Ordering::Relaxed);
                        if head.contains("connection: close") {
                            return Ok(());
                        }
                    }
                    Ok(Some(head)) => return Err(format!("request {i}: {head}")),
                    Ok(None) => return Err(format!("request {i}: closed unanswered")),
                    Err(e) => return Err(format!("request {i}: {e}")),
                }
            }
            Ok(())
        }));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let fresh = {
        let (addr, stop) = (addr.clone(), stop.clone());
        std::thread::spawn(move || {
            let (mut served, mut resets) = (0, 0);
            while !stop.load(Ordering::Relaxed) {
                let Ok(mut conn) = TcpStream::connect(&addr) else {
                    break; // refused: the listener is closed
                };
                conn.set_read_timeout(Some(Duration::from_secs(20)))
                    .unwrap();
                let sent =
                    conn.write_all(b"GET /hello HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
                match (sent, read_response(&mut conn)) {
                    (Ok(()), Ok(Some(head))) if head.starts_with("http/1.1 200") => served += 1,
                    _ => resets += 1,
                }
            }
            (served, resets)
        })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while answered.load(Ordering::Relaxed) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no request answered before the signal"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let status = std::process::Command::new("kill")
        .args(["-TERM", &tern.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    for (i, t) in keep_alive.into_iter().enumerate() {
        let result = t.join().unwrap();
        assert!(result.is_ok(), "keep-alive client {i}: {result:?}");
    }
    stop.store(true, Ordering::Relaxed);
    let (served, resets) = fresh.join().unwrap();
    assert!(served > 0, "no new connection was served");
    assert!(resets <= 1, "{resets} new connections were reset");
    let exit = tern.child.wait().unwrap();
    assert!(exit.success(), "tern exited with {exit}");
}
