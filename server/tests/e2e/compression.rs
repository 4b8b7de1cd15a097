//! Compression at the edge, checked with curl (which decodes zstd, Brotli and gzip itself):
//! every guest kind's text answers arrive compressed in the encoding the client prefers and
//! decode to the plain answer, over HTTP/1.0, 1.1 and 2; a slow 10 MB stream arrives whole;
//! what a guest marks `no-transform` or encodes itself is untouched; the cache keeps the plain
//! answer and serves each client its encoding; a tenant can switch it off.

use std::path::Path;

use bytes::Bytes;
use http::{Method, StatusCode};

use crate::support::{
    TestServer, metric_value, metric_value_or_zero, send, test_component, test_guest,
};

/// Runs curl with `args` against `url`: the response head's lines (the last response's, after
/// any `100 Continue`) and the body as curl wrote it (decoded with `--compressed`).
async fn curl(dir: &Path, args: &[&str], url: String) -> (String, Vec<u8>) {
    let head = dir.join(format!("head-{}", rand_name()));
    let body = dir.join(format!("body-{}", rand_name()));
    let mut all: Vec<String> = vec![
        "-sS".into(),
        "--fail".into(),
        "-D".into(),
        head.display().to_string(),
        "-o".into(),
        body.display().to_string(),
    ];
    all.extend(args.iter().map(|a| (*a).to_string()));
    all.push(url);
    let out =
        tokio::task::spawn_blocking(move || std::process::Command::new("curl").args(all).output())
            .await
            .unwrap()
            .expect("curl (Debian's curl) is installed");
    assert!(
        out.status.success(),
        "curl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let head = std::fs::read_to_string(head).unwrap();
    let last = head
        .rsplit("\r\n\r\n")
        .find(|h| !h.trim().is_empty())
        .unwrap_or("")
        .to_string();
    (last.to_ascii_lowercase(), std::fs::read(body).unwrap())
}

fn rand_name() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// The value of header `name` in curl's head lines (lower-cased), or "".
fn field<'a>(head: &'a str, name: &str) -> &'a str {
    head.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map_or("", str::trim)
}

/// `write_sized`'s body of `n` bytes.
fn sized(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8).collect()
}

/// A server with a Tern ABI guest (`/w`), a component (`/c`), the demo CGI program (`/cgi`)
/// and the cache test guest (`/h`), compression at its defaults.
async fn kinds() -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    test_guest(dir.path(), "write_sized");
    test_guest(dir.path(), "cache_headers");
    test_component(dir.path(), "component");
    let config = "[pool]\ninstances = 16\nmax_memory_mib = 64\n\
        [[tenant]]\nname = \"abi\"\nmodule = \"write_sized.wasm\"\npaths = [\"/w\"]\n\
        [[tenant]]\nname = \"comp\"\nmodule = \"component.wasm\"\npaths = [\"/c\"]\n\
        [[tenant]]\nname = \"cgi\"\nmodule = \"builtin:cgi\"\npaths = [\"/cgi\"]\n\
        [[tenant]]\nname = \"h\"\nmodule = \"cache_headers.wasm\"\npaths = [\"/h\"]\n";
    TestServer::try_start_in(dir, config).await.expect("start")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_guest_kind_is_compressed_in_the_encoding_curl_asks_for() {
    let s = kinds().await;
    let base = format!("http://127.0.0.1:{}", s.addr().port());
    let cases: [(&str, Option<Vec<u8>>); 3] = [
        ("/w?n=100000&type=text/plain", Some(sized(100_000))),
        (
            "/c/big?n=50000&type=application/json",
            Some(vec![b'x'; 50_000]),
        ),
        // The CGI program's answer names the request: checked by what it holds.
        ("/cgi/env", None),
    ];
    for (path, plain) in &cases {
        for (encoding, version) in [
            ("zstd", "--http1.1"),
            ("br", "--http1.1"),
            ("gzip", "--http1.1"),
            ("zstd", "--http2-prior-knowledge"),
            ("gzip", "--http1.0"),
        ] {
            let accept = format!("accept-encoding: {encoding}");
            let (head, body) = curl(
                s.dir.path(),
                &["--compressed", version, "-H", &accept],
                format!("{base}{path}"),
            )
            .await;
            let what = format!("{path} {encoding} {version}");
            assert_eq!(field(&head, "content-encoding"), encoding, "{what}: {head}");
            assert_eq!(field(&head, "vary"), "accept-encoding", "{what}: {head}");
            match plain {
                Some(plain) => assert!(body == *plain, "{what}: {} bytes decoded", body.len()),
                None => {
                    let text = String::from_utf8_lossy(&body);
                    assert!(text.contains("REQUEST_METHOD=GET"), "{what}: {text}");
                }
            }
        }
        // curl's own list (deflate, gzip, br, zstd): the tenant's first choice, zstd.
        let (head, _) = curl(s.dir.path(), &["--compressed"], format!("{base}{path}")).await;
        assert_eq!(field(&head, "content-encoding"), "zstd", "{path}: {head}");
        // A client that asks for nothing gets the plain answer, still with `Vary`.
        let r = s.get(path).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.header("content-encoding"), "", "{path}");
        if let Some(plain) = plain {
            assert_eq!(r.header("vary"), "accept-encoding", "{path}");
            assert!(r.body == *plain, "{path}");
        }
    }
    // A small answer known whole is compressed at once and sent with its length; a large or
    // streamed one without.
    let (head, body) = curl(
        s.dir.path(),
        &["-H", "accept-encoding: gzip"],
        format!("{base}/w?n=20000&type=text/plain"),
    )
    .await;
    assert_eq!(
        field(&head, "content-length"),
        body.len().to_string(),
        "{head}"
    );
    assert!(body.len() < 2000, "{} bytes for 20,000", body.len());
    // Counted per tenant and encoding, with the bytes before and after.
    let m = s.metrics().await;
    for (tenant, encoding, n) in [
        ("abi", "zstd", 3.0),
        ("abi", "br", 1.0),
        ("abi", "gzip", 3.0),
        ("comp", "gzip", 2.0),
    ] {
        let series = format!(
            r#"tern_compressed_responses_total{{encoding="{encoding}",tenant="{tenant}"}}"#
        );
        assert_eq!(metric_value(&m, &series), n, "{series}");
    }
    let plain = metric_value(
        &m,
        r#"tern_compression_bytes_total{body="plain",tenant="abi"}"#,
    );
    let sent = metric_value(
        &m,
        r#"tern_compression_bytes_total{body="sent",tenant="abi"}"#,
    );
    assert_eq!(
        plain, 620_000.0,
        "six answers of 100,000 bytes and one of 20,000"
    );
    assert!(sent > 0.0 && sent < plain / 2.0, "{sent} of {plain}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_ten_megabyte_stream_arrives_compressed_and_whole() {
    let s = kinds().await;
    let base = format!("http://127.0.0.1:{}", s.addr().port());
    let n = 10_000_000;
    // 153 writes of 64 KiB, each after ~2 ms of computing: the head leaves before the guest
    // ends, and the body is compressed as it comes.
    let path = format!("/w?n={n}&chunk=65536&slow=1&type=text/plain");
    for encoding in ["gzip", "zstd"] {
        let accept = format!("accept-encoding: {encoding}");
        let (head, body) = curl(
            s.dir.path(),
            &["--compressed", "-H", &accept],
            format!("{base}{path}"),
        )
        .await;
        assert_eq!(field(&head, "content-encoding"), encoding, "{head}");
        assert_eq!(field(&head, "transfer-encoding"), "chunked", "{head}");
        assert_eq!(body.len(), n, "{encoding}");
        assert!(body == sized(n), "{encoding}: the decoded body differs");
    }
    // The bytes on the wire: far fewer than the plain ones.
    let r = send(
        s.addr(),
        Method::GET,
        &path,
        None,
        &[("accept-encoding", "gzip")],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.header("content-encoding"), "gzip");
    assert!(r.body.len() < n / 10, "{} bytes on the wire", r.body.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_guest_marks_or_encodes_itself_and_small_answers_are_untouched() {
    let s = kinds().await;
    let get = |path: String, accept: &'static str| {
        let addr = s.addr();
        async move {
            send(
                addr,
                Method::GET,
                &path,
                None,
                &[("accept-encoding", accept)],
                Bytes::new(),
            )
            .await
        }
    };
    let r = get("/h?n=4000".into(), "gzip, br;q=0.9").await;
    assert_eq!(r.header("content-encoding"), "gzip");
    let r = get("/h?n=4000".into(), "br;q=0.5, gzip;q=0.9, zstd;q=0.1").await;
    assert_eq!(r.header("content-encoding"), "gzip");
    let r = get("/h?n=4000".into(), "gzip;q=0, identity").await;
    assert_eq!(r.header("content-encoding"), "");
    assert_eq!(r.body.len(), 4000);
    for (query, kept, why) in [
        ("n=4000&h=cache-control:no-transform", "", "no-transform"),
        (
            "n=4000&h=content-encoding:x-custom",
            "x-custom",
            "already encoded",
        ),
        ("n=100", "", "under min_bytes"),
        ("/c/big?n=4000&type=image/png", "", "not a text type"),
    ] {
        let path = if query.starts_with('/') {
            query.to_string()
        } else {
            format!("/h?{query}")
        };
        let r = get(path, "gzip, br, zstd").await;
        assert_eq!(r.status, StatusCode::OK, "{why}");
        assert_eq!(r.header("content-encoding"), kept, "{why}");
        assert!(r.body.len() >= 100, "{why}");
        assert!(!r.header("vary").contains("accept-encoding"), "{why}");
    }
    // A strong ETag becomes weak when the bytes are compressed.
    let r = get("/h?n=4000&h=etag:%22v1%22".into(), "br").await;
    assert_eq!(r.header("content-encoding"), "br");
    assert_eq!(r.header("etag"), "W/\"v1\"");
    // A HEAD gets a GET's headers.
    let head = send(
        s.addr(),
        Method::HEAD,
        "/c/big?n=50000&type=text/plain",
        None,
        &[("accept-encoding", "br")],
        Bytes::new(),
    )
    .await;
    let get = get("/c/big?n=50000&type=text/plain".into(), "br").await;
    assert_eq!(head.header("content-encoding"), "br");
    assert_eq!(head.header("content-length"), get.header("content-length"));
    assert!(head.body.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_keeps_one_compressed_copy_per_encoding_counted_and_purged_with_the_answer() {
    let dir = tempfile::tempdir().unwrap();
    test_guest(dir.path(), "cache_headers");
    let config = "[pool]\ninstances = 8\nmax_memory_mib = 64\n\
        [[tenant]]\nname = \"h\"\nmodule = \"cache_headers.wasm\"\npaths = [\"/h\"]\n\
        [tenant.cache]\nenabled = true\n";
    let s = TestServer::try_start_in(dir, config).await.expect("start");
    let path = "/h?n=8000&h=cache-control:max-age%3D60";
    let addr = s.addr();
    let get = |accept: &'static str| async move {
        send(
            addr,
            Method::GET,
            path,
            None,
            &[("accept-encoding", accept)],
            Bytes::new(),
        )
        .await
    };
    let stored = || async {
        let m = s.metrics().await;
        metric_value(&m, r#"tern_cache_stored_bytes{tenant="h"}"#)
    };
    // The guest's answer: stored plain, sent compressed.
    let first = get("gzip").await;
    assert_eq!(first.header("content-encoding"), "gzip");
    let plain_stored = stored().await;
    assert!(plain_stored > 8000.0, "{plain_stored}");
    let plain = get("identity").await;
    assert!(
        plain.header("cache-status").contains("hit"),
        "{:?}",
        plain.headers
    );
    assert_eq!(plain.header("content-encoding"), "");
    assert_eq!(plain.body.len(), 8000);
    assert_eq!(stored().await, plain_stored, "a plain hit stores nothing");
    // The first Brotli hit makes the copy, which the cache's bytes now count; the next one is
    // served from it (the same bytes, their length declared).
    let br = get("br").await;
    assert!(
        br.header("cache-status").contains("hit"),
        "{:?}",
        br.headers
    );
    assert_eq!(br.header("content-encoding"), "br");
    assert_eq!(br.header("vary"), "accept-encoding");
    assert!(br.body.len() < 8000);
    let with_copy = stored().await;
    assert_eq!(with_copy, plain_stored + br.body.len() as f64);
    let again = get("br").await;
    assert_eq!(again.body, br.body);
    assert_eq!(again.header("content-length"), br.body.len().to_string());
    assert_eq!(stored().await, with_copy, "the copy is made once");
    let zstd = get("zstd").await;
    assert_eq!(zstd.header("content-encoding"), "zstd");
    assert_eq!(stored().await, with_copy + zstd.body.len() as f64);
    // A purge drops the answer with its copies.
    let (status, v) = s
        .admin_call(
            Method::POST,
            "/admin/v1/tenants/h/cache/purge",
            r#"{"all": true}"#,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(stored().await, 0.0);
    let after = get("br").await;
    assert!(
        !after.header("cache-status").contains("hit"),
        "{:?}",
        after.headers
    );
    assert_eq!(after.header("content-encoding"), "br");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_can_switch_compression_off_and_bad_settings_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    test_guest(dir.path(), "cache_headers");
    let config = "[pool]\ninstances = 8\nmax_memory_mib = 64\n\
        [[tenant]]\nname = \"h\"\nmodule = \"cache_headers.wasm\"\npaths = [\"/h\"]\n\
        [tenant.compression]\nenabled = false\n";
    let s = TestServer::try_start_in(dir, config).await.expect("start");
    let r = send(
        s.addr(),
        Method::GET,
        "/h?n=8000",
        None,
        &[("accept-encoding", "gzip, br, zstd")],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.header("content-encoding"), "");
    assert_eq!(r.header("vary"), "");
    assert_eq!(r.body.len(), 8000);

    for (setting, names) in [
        ("gzip_level = 12", "compression.gzip_level"),
        ("encodings = [\"deflate\"]", "deflate"),
        ("types = [\"html\"]", "compression.types"),
        ("levels = 3", "levels"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        test_guest(dir.path(), "cache_headers");
        let config = format!(
            "[[tenant]]\nname = \"h\"\nmodule = \"cache_headers.wasm\"\npaths = [\"/h\"]\n\
             [tenant.compression]\n{setting}\n"
        );
        let e = TestServer::try_start_in(dir, &config)
            .await
            .err()
            .expect(setting);
        assert!(format!("{e:#}").contains(names), "{setting}: {e:#}");
    }
}

/// Chromium (headless), which sends `Accept-Encoding: gzip, deflate, br, zstd`, decodes what
/// the edge sends it in each encoding: the CGI program's page lists the request's headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_reads_each_encoding() {
    let dir = tempfile::tempdir().unwrap();
    let config = "[pool]\ninstances = 8\nmax_memory_mib = 64\n\
        [[tenant]]\nname = \"z\"\nmodule = \"builtin:cgi\"\npaths = [\"/z\"]\n\
        [[tenant]]\nname = \"b\"\nmodule = \"builtin:cgi\"\npaths = [\"/b\"]\n\
        [tenant.compression]\nencodings = [\"br\"]\n\
        [[tenant]]\nname = \"g\"\nmodule = \"builtin:cgi\"\npaths = [\"/g\"]\n\
        [tenant.compression]\nencodings = [\"gzip\"]\n";
    let s = TestServer::try_start_in(dir, config).await.expect("start");
    let base = format!("http://127.0.0.1:{}", s.addr().port());
    for (path, encoding) in [("/z/env", "zstd"), ("/b/env", "br"), ("/g/env", "gzip")] {
        let tenant = &path[1..2];
        let sent = format!(
            "tern_compressed_responses_total{{encoding=\"{encoding}\",tenant=\"{tenant}\"}}"
        );
        let before = metric_value_or_zero(&s.metrics().await, &sent);
        let url = format!("{base}{path}");
        let profile = s.path(&format!("chromium-{encoding}"));
        let out = tokio::task::spawn_blocking(move || {
            std::process::Command::new("chromium")
                .args([
                    "--headless",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--no-first-run",
                ])
                .arg(format!("--user-data-dir={}", profile.display()))
                .args(["--dump-dom", &url])
                .output()
        })
        .await
        .unwrap()
        .expect("chromium (Debian's chromium) is installed: scripts/test installs it");
        let dom = String::from_utf8_lossy(&out.stdout);
        assert!(
            dom.contains("HTTP_ACCEPT_ENCODING=gzip, deflate, br, zstd")
                && dom.contains("REQUEST_METHOD=GET"),
            "{path}: {dom}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // What Chromium read had come in that encoding (it asks for the page, then maybe
        // `/favicon.ico`: a 404 too short to compress).
        assert_eq!(
            metric_value_or_zero(&s.metrics().await, &sent),
            before + 1.0,
            "{path}: Chromium's page was not sent in {encoding}"
        );
        // The same request as Chromium sent it is answered in that encoding.
        let r = send(
            s.addr(),
            Method::GET,
            path,
            None,
            &[
                ("accept-encoding", "gzip, deflate, br, zstd"),
                (
                    "user-agent",
                    "Mozilla/5.0 (X11; Linux x86_64) HeadlessChrome/156.0.0.0",
                ),
                (
                    "accept",
                    "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
                ),
            ],
            Bytes::new(),
        )
        .await;
        assert_eq!(r.header("content-encoding"), encoding, "{path}");
    }
}
