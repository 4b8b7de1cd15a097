//! The access line answers an operator's first questions (who asked what, how, how much came
//! back, how long it took), in text and JSON, written when the response ends; the client
//! address comes from `Forwarded` / `X-Forwarded-For` only through a proxy the config trusts,
//! and guests see the same client.

use std::io::{Read, Write};
use std::net::TcpStream;

use crate::support::TernProcess;

/// A `tern serve` of the demo tenants with `[server]` settings `server`, logging as `format`.
fn serve(dir: &std::path::Path, server: &str, format: &str) -> TernProcess {
    let demo = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/tern.toml"),
    )
    .unwrap();
    // The demo config with this test's [server] keys added to its [server] table.
    let text = demo.replacen("[server]\n", &format!("[server]\n{server}\n"), 1);
    assert_ne!(text, demo, "the demo config has a [server] table");
    let config = dir.join("tern.toml");
    std::fs::write(&config, text).unwrap();
    TernProcess::serve(
        &["--config", config.to_str().unwrap(), "--log-format", format],
        dir,
    )
}

/// Sends `request` on a new connection; the whole reply.
fn exchange(addr: &str, request: &str) -> String {
    let mut conn = TcpStream::connect(addr).unwrap();
    conn.write_all(request.as_bytes()).unwrap();
    let mut reply = String::new();
    let _ = conn.read_to_string(&mut reply);
    reply
}

#[test]
fn access_lines_say_who_asked_what_how_and_what_came_back() {
    let dir = tempfile::tempdir().unwrap();
    let tern = serve(dir.path(), "", "text");
    let reply = exchange(
        &tern.addr,
        "GET /h%65llo?token=secret HTTP/1.1\r\nhost: demo.test:8080\r\nuser-agent: probe/1.0\r\n\
         referer: https://ref.test/page\r\nx-request-id: access-1\r\nconnection: close\r\n\r\n",
    );
    assert!(reply.starts_with("HTTP/1.1 200 "), "{reply}");
    let line = tern.wait_for("access-1");
    for field in [
        "tern::access: request request_id=\"access-1\"",
        "tenant=\"hello\"",
        "method=\"GET\"",
        // The path as the client sent it (routed on its normal form); no query by default.
        "path=\"/h%65llo\"",
        "version=\"HTTP/1.1\"",
        "host=\"demo.test:8080\"",
        "client=127.0.0.1",
        "remote=127.0.0.1:",
        "status=200",
        "bytes=17",
        "user_agent=\"probe/1.0\"",
        "referer=\"https://ref.test/page\"",
    ] {
        assert!(line.contains(field), "{field} in {line}");
    }
    assert!(line.contains("total_ms="), "{line}");
    assert!(!line.contains("secret"), "the query stays out: {line}");
    assert!(!line.contains("incomplete"), "{line}");

    // A HEAD: no body bytes, and complete; HTTP/1.0 named as such.
    exchange(
        &tern.addr,
        "HEAD /hello HTTP/1.0\r\nx-request-id: access-2\r\n\r\n",
    );
    let line = tern.wait_for("access-2");
    assert!(
        line.contains("version=\"HTTP/1.0\"")
            && line.contains("bytes=0")
            && line.contains("method=\"HEAD\"")
            && !line.contains("host="),
        "{line}"
    );
    // A request no tenant takes is logged too, with tenant `-`.
    exchange(
        &tern.addr,
        "GET /nowhere HTTP/1.1\r\nhost: x\r\nx-request-id: access-3\r\nconnection: close\r\n\r\n",
    );
    let line = tern.wait_for("access-3");
    assert!(
        line.contains("tenant=\"-\"") && line.contains("status=404"),
        "{line}"
    );
    // A streamed body (over 64 KiB) that the client leaves mid-way: the bytes that left, and
    // `incomplete`. The echo is 12 MiB, more than the kernel holds between the two ends (the
    // server's send buffer, at most `tcp_wmem`'s 4 MiB, and the window of a client that reads
    // 1 KiB): the answer cannot have left whole when the client goes. (4 MiB could, and did.)
    let conn = TcpStream::connect(&tern.addr).unwrap();
    let size = 12 << 20;
    let mut writer = conn.try_clone().unwrap();
    let sending = std::thread::spawn(move || {
        let head = format!(
            "POST /echo HTTP/1.1\r\nhost: x\r\nx-request-id: access-4\r\ncontent-length: {size}\r\n\r\n"
        );
        // Fails once the client below is gone: the point.
        let _ = writer.write_all(head.as_bytes());
        let _ = writer.write_all(&vec![b'x'; size]);
    });
    // The head and the first bytes of the body (a server that never answers fails here).
    conn.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    let mut first = [0u8; 1024];
    (&conn).read_exact(&mut first).unwrap();
    assert!(first.starts_with(b"HTTP/1.1 200"));
    // (The server may have reset the connection already: either way the client is gone.)
    let _ = conn.shutdown(std::net::Shutdown::Both);
    drop(conn);
    sending.join().unwrap();
    // (The echo guest traps when its client is gone mid-answer, a line of its own first.)
    let line = tern.wait_for("tern::access: request request_id=\"access-4\"");
    assert!(
        line.contains("incomplete=true") && line.contains("status=200"),
        "{line}"
    );
    let sent: u64 = line
        .split(" bytes=")
        .nth(1)
        .and_then(|b| b.split(' ').next())
        .and_then(|b| b.parse().ok())
        .expect("bytes=N");
    // Counted when the answer ended, not when its head left: at least what the client read.
    assert!(sent >= first.len() as u64 && sent < size as u64, "{line}");
}

#[test]
fn json_access_lines_hold_the_same_fields_and_the_query_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let tern = serve(dir.path(), "access_log_query = true", "json");
    exchange(
        &tern.addr,
        "POST /echo?a=1 HTTP/1.1\r\nhost: x\r\nx-request-id: access-json\r\n\
         content-length: 5\r\nconnection: close\r\n\r\nhello",
    );
    let line = tern.wait_for("access-json");
    let v: serde_json::Value = serde_json::from_str(&line).expect("one JSON object");
    let f = &v["fields"];
    assert_eq!(v["target"], "tern::access");
    assert_eq!(f["message"], "request");
    assert_eq!(f["tenant"], "echo");
    assert_eq!(f["method"], "POST");
    assert_eq!(f["path"], "/echo?a=1");
    assert_eq!(f["version"], "HTTP/1.1");
    assert_eq!(f["client"], "127.0.0.1");
    assert_eq!(f["status"], 200);
    assert!(f["bytes"].as_u64().unwrap() > 0, "{line}");
    assert!(f["total_ms"].as_f64().is_some(), "{line}");
}

/// Behind a proxy the config trusts, the client is whom the proxy names (`Forwarded`, else
/// `X-Forwarded-For`), for the access line and for guests alike; from anyone else the headers
/// are only headers.
#[test]
fn a_forwarded_client_is_believed_only_from_a_trusted_proxy() {
    let forwarded = |tern: &TernProcess, id: &str, header: &str| {
        let reply = exchange(
            &tern.addr,
            &format!(
                "GET /cgi/env HTTP/1.1\r\nhost: x\r\nx-request-id: {id}\r\n{header}\r\n\
                 connection: close\r\n\r\n"
            ),
        );
        let line = tern.wait_for(id);
        (reply, line)
    };
    // Trusted: the connection comes from 127.0.0.1.
    let dir = tempfile::tempdir().unwrap();
    let tern = serve(dir.path(), "trusted_proxies = [\"127.0.0.0/8\"]", "text");
    let (reply, line) = forwarded(
        &tern,
        "fwd-1",
        "x-forwarded-for: 6.6.6.6, 198.51.100.7, 127.0.0.9",
    );
    assert!(reply.contains("REMOTE_ADDR=198.51.100.7\n"), "{reply}");
    assert!(
        !reply.contains("REMOTE_PORT="),
        "no port was forwarded: {reply}"
    );
    assert!(
        line.contains("client=198.51.100.7") && line.contains("remote=127.0.0.1:"),
        "{line}"
    );
    let (reply, line) = forwarded(
        &tern,
        "fwd-2",
        "forwarded: for=\"[2001:db8::5]:4711\";proto=https\r\nx-forwarded-for: 6.6.6.6",
    );
    assert!(
        reply.contains("REMOTE_ADDR=2001:db8::5\n") && reply.contains("REMOTE_PORT=4711\n"),
        "{reply}"
    );
    assert!(line.contains("client=2001:db8::5"), "{line}");
    drop(tern);

    // Not trusted (the default): the peer, whatever the headers claim.
    let dir = tempfile::tempdir().unwrap();
    let tern = serve(dir.path(), "", "text");
    let (reply, line) = forwarded(&tern, "fwd-3", "x-forwarded-for: 198.51.100.7");
    assert!(reply.contains("REMOTE_ADDR=127.0.0.1\n"), "{reply}");
    assert!(line.contains("client=127.0.0.1 "), "{line}");

    // A bad entry in the config is refused at start-up, naming it.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.toml");
    std::fs::write(&config, "[server]\ntrusted_proxies = [\"10.0.0.0/33\"]\n").unwrap();
    let out = crate::support::tern_bin()
        .args(["serve", "--config", config.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains("server.trusted_proxies")
            && err.contains("10.0.0.0/33"),
        "{err}"
    );
}
