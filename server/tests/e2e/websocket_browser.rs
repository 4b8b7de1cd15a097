//! Chromium (Debian's, headless, driven through its DevTools protocol by `browser.py`) opens
//! WebSockets as a page does, over HTTP/1.1 and over HTTP/2 (RFC 8441, on the connection the
//! page came on), to both modes: an events guest and a guest handing off to Python's
//! `websockets` echo server. Text, UTF-8, binary and a 70,000-byte message come back; the
//! page's close code reaches the other side and comes back.

use std::path::PathBuf;

use serde_json::{Value, json};

use crate::support::{TestServer, test_guest, tools_dir};

/// What the page does: opens `url`, sends four messages after the first it gets, closes with
/// 4000 after their four echoes, and gives what it saw.
fn scenario(url: &str) -> String {
    format!(
        r#"(async () => {{
  const ws = new WebSocket({url:?});
  ws.binaryType = 'arraybuffer';
  const got = [];
  const show = (d) => typeof d === 'string'
    ? (d.length > 64 ? 'text:' + d.length : d)
    : 'bytes:' + new Uint8Array(d).join(',');
  return await new Promise((resolve) => {{
    const timer = setTimeout(() => resolve({{ got, error: 'no close in 20 s' }}), 20000);
    ws.onmessage = (e) => {{
      got.push(show(e.data));
      if (got.length === 1) {{
        ws.send('hello from chromium');
        ws.send('\u03ba\u1f79\u03c3\u03bc\u03b5');
        ws.send(new Uint8Array([0, 1, 255]));
        ws.send('x'.repeat(70000));
      }}
      if (got.length === 5) ws.close(4000, 'done');
    }};
    ws.onerror = () => got.push('error');
    ws.onclose = (e) => {{
      clearTimeout(timer);
      resolve({{ got: got.slice(1), code: e.code, clean: e.wasClean }});
    }};
  }});
}})()"#
    )
}

/// Runs [`scenario`] for `ws` in Chromium on the page `page`: `browser.py`'s answer.
async fn chromium(page: &str, ws: &str) -> Value {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/browser.py");
    let mut command = std::process::Command::new("python3");
    command
        .arg(script)
        .arg(page)
        .arg(scenario(ws))
        .args([
            "--ignore-certificate-errors",
            "--host-resolver-rules=MAP a.test 127.0.0.1",
        ])
        .env("PYTHONPATH", tools_dir().join("websockets-15.0.1"));
    crate::websocket::json_of(command).await
}

/// The value of `series` (0 before it has counted).
fn count(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_talks_to_both_modes_over_http1_and_http2() {
    let echo = crate::websocket::echo_server();
    let dir = tempfile::tempdir().unwrap();
    test_guest(dir.path(), "ws_events");
    test_guest(dir.path(), "ws_gate");
    crate::tls::Pki::new().issue(dir.path(), "a", &["a.test"]);
    let config = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\ntls_listen = \"127.0.0.1:0\"\n\
         [pool]\ninstances = 16\nmax_memory_mib = 64\n\
         [[certificate]]\nhosts = [\"a.test\"]\ncert = \"a.crt\"\nkey = \"a.key\"\n\
         [[tenant]]\nname = \"events\"\nmodule = \"ws_events.wasm\"\npaths = [\"/events\"]\n\
         [tenant.websocket]\nmode = \"events\"\n\
         [[tenant]]\nname = \"gate\"\nmodule = \"ws_gate.wasm\"\npaths = [\"/gate\"]\n\
         [tenant.outbound.backends.echo]\nurl = \"http://127.0.0.1:{}/rooms\"\n",
        echo.port
    );
    let s = TestServer::try_start_in(dir, &config).await.expect("start");
    let (plain, tls) = (
        s.addr().port(),
        s.running.tls_addr.expect("a TLS listener").port(),
    );
    let expected = json!([
        "hello from chromium",
        "\u{3ba}\u{1f79}\u{3c3}\u{3bc}\u{3b5}",
        "bytes:0,1,255",
        "text:70000"
    ]);
    // (The page is no tenant's: a 404, which counts for neither.)
    for (scheme, port, ws, protocol, version) in [
        ("http", plain, "ws", "http/1.1", "1.1"),
        ("https", tls, "wss", "h2", "2"),
    ] {
        let page = format!("{scheme}://a.test:{port}/page");
        let origin = format!("{ws}://a.test:{port}");
        for (tenant, path) in [
            ("events", "/events/room"),
            ("gate", "/gate/room?token=good"),
        ] {
            // (An opening is answered 101 over HTTP/1.1, 200 over HTTP/2.)
            let status = if version == "2" { "2xx" } else { "1xx" };
            let series = format!(
                "tern_requests_total{{deployment=\"current\",status=\"{status}\",tenant=\"{tenant}\",trigger=\"request\",version=\"{version}\"}}"
            );
            let before = count(&s.metrics().await, &series);
            let got = chromium(&page, &format!("{origin}{path}")).await;
            assert_eq!(got["protocol"], protocol, "{page}: {got}");
            let v = &got["value"];
            assert_eq!(v["got"], expected, "{tenant} over {protocol}: {got}");
            assert_eq!(v["code"], 4000, "{tenant} over {protocol}: {got}");
            assert_eq!(v["clean"], true, "{tenant} over {protocol}: {got}");
            // The opening came in the version the page did: over HTTP/2 on the page's own
            // connection (Chromium opens no other for a WebSocket).
            assert_eq!(
                count(&s.metrics().await, &series),
                before + 1.0,
                "{tenant} over {protocol}: the opening was not counted as HTTP/{version}"
            );
        }
    }
}
