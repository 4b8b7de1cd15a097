//! Streamed responses at the buffer's edge: a body just past [`abi::STREAM_THRESHOLD`] is
//! answered with the guest's own head and its whole body, whether the guest finished before
//! the server looked at the head (fast) or still runs while the body streams (slow), over
//! HTTP/1.1 and HTTP/2. A body that cannot be delivered is counted.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, StatusCode};
use tern_sdk::abi;

use crate::support::{Conn, H2Conn, Reply, TestServer, metric_value, send, test_guest};

/// The sizes around the threshold and far past it, each with how many times to try it.
const SIZES: [(usize, usize); 7] = [
    (0, 5),
    (abi::STREAM_THRESHOLD - 1, 20),
    (abi::STREAM_THRESHOLD, 20),
    (abi::STREAM_THRESHOLD + 1, 30),
    (100_000, 30),
    (1_000_000, 10),
    (10_000_000, 3),
];

/// A server with the `write_sized` guest at `/sized` and the demo tenants.
async fn server() -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    test_guest(dir.path(), "write_sized");
    let demo = tern::config::DEMO_CONFIG;
    let config = format!(
        "[pool]\ninstances = 16\nmax_memory_mib = 64\nqueue_timeout_ms = 30000\n\
         [[tenant]]\nname = \"sized\"\nmodule = \"write_sized.wasm\"\npaths = [\"/sized\"]\n\
         [tenant.limits]\ntimeout_ms = 20000\n{}",
        &demo[demo.find("[[tenant]]").expect("demo has tenants")..]
    );
    TestServer::try_start_in(dir, &config).await.expect("start")
}

/// The body `write_sized` sends for `n` bytes.
fn expected(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8).collect()
}

fn check(r: &Reply, n: usize, what: &str) {
    assert_eq!(r.status, StatusCode::OK, "{what}: {}", r.text());
    assert_eq!(r.body.len(), n, "{what}: body length");
    assert!(r.body == expected(n), "{what}: body differs");
    assert!(
        !r.header("x-request-id").is_empty(),
        "{what}: no request id"
    );
}

/// The query that makes `write_sized` write `n` bytes, fast (one write) or slow (16 KiB writes,
/// ~2 ms of computing before each; at most 8 of them for large bodies).
fn target(n: usize, slow: bool) -> String {
    if slow {
        let chunk = (n / 8).max(16 * 1024);
        format!("/sized?n={n}&chunk={chunk}&slow=1")
    } else {
        format!("/sized?n={n}")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_at_the_stream_threshold_arrive_whole_over_http1() {
    let s = server().await;
    let mut conn = Conn::open(s.addr()).await;
    for (n, tries) in SIZES {
        for slow in [false, true] {
            for i in 0..tries {
                let r = conn.get(&target(n, slow)).await;
                check(&r, n, &format!("{n} bytes, slow {slow}, try {i}"));
                // Up to the threshold the body is buffered and sent with its length.
                if n <= abi::STREAM_THRESHOLD {
                    assert_eq!(r.header("content-length"), n.to_string());
                }
            }
        }
    }
    let m = s.metrics().await;
    assert_eq!(
        crate::support::metric_value_or_zero(
            &m,
            r#"tern_requests_total{deployment="current",status="5xx",tenant="sized",trigger="request",version="1.1"}"#
        ),
        0.0
    );
    assert_eq!(
        metric_value(
            &m,
            r#"tern_responses_undelivered_total{reason="guest_failed",tenant="sized"}"#
        ),
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_at_the_stream_threshold_arrive_whole_over_http2() {
    let s = server().await;
    let conn = H2Conn::open(s.addr()).await;
    for (n, tries) in SIZES {
        for slow in [false, true] {
            // Several streams of one connection at once: heads and bodies interleave.
            let runs = (0..tries).map(|i| {
                let mut c = conn.clone();
                let path = target(n, slow);
                tokio::spawn(async move { (i, c.get(&path).await) })
            });
            for run in runs.collect::<Vec<_>>() {
                let (i, r) = run.await.expect("request task");
                check(&r, n, &format!("h2 {n} bytes, slow {slow}, try {i}"));
            }
        }
    }
}

/// The README's example: the built-in `/echo` with a 100 KB body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_of_100_kb_answers_200_every_time() {
    let s = server().await;
    let body = Bytes::from(expected(100_000));
    for i in 0..30 {
        let r = send(s.addr(), Method::POST, "/echo", None, &[], body.clone()).await;
        assert_eq!(r.status, StatusCode::OK, "try {i}: {}", r.text());
        assert!(r.body.ends_with(&body), "try {i}: echoed body differs");
    }
}

/// A client that leaves in the middle of a streamed body is counted as `client_gone`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_leaving_mid_stream_is_counted() {
    let s = server().await;
    let series = r#"tern_responses_undelivered_total{reason="client_gone",tenant="sized"}"#;
    assert_eq!(metric_value(&s.metrics().await, series), 0.0);
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut tcp = tokio::net::TcpStream::connect(s.addr()).await.unwrap();
        // 160 writes of 64 KiB, ~2 ms apart: the guest is still writing when the client leaves.
        let req = "GET /sized?n=10000000&chunk=65536&slow=1 HTTP/1.1\r\nhost: x\r\n\r\n";
        tcp.write_all(req.as_bytes()).await.unwrap();
        let mut head = vec![0; 4096];
        let n = tcp.read(&mut head).await.unwrap();
        assert!(head[..n].starts_with(b"HTTP/1.1 200"), "{:?}", &head[..n]);
    } // dropped: the connection closes with most of the body unsent
    let mut counted = 0.0;
    for _ in 0..200 {
        counted = metric_value(&s.metrics().await, series);
        if counted > 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(counted, 1.0, "the cut stream was not counted");
    // A HEAD of the same body is not a body the client asked for.
    let r = send(
        s.addr(),
        Method::HEAD,
        &target(100_000, false),
        None,
        &[],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.body.is_empty());
    // hyper drops a HEAD's body before it writes the head, so a false count would show now.
    assert_eq!(metric_value(&s.metrics().await, series), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_content_length_is_sent_and_held_to() {
    let s = server().await;
    for (n, slow) in [
        (100, false),
        (70_000, false),
        (70_000, true),
        (1_000_000, false),
    ] {
        let path = format!("{}&declare={n}", target(n, slow));
        let r = s.get(&path).await;
        check(&r, n, &path);
        // Streamed or not, the client gets the length the guest declared, never chunked.
        assert_eq!(r.header("content-length"), n.to_string(), "{path}");
        assert!(r.header("transfer-encoding").is_empty(), "{path}");
    }
    // Short of the declared length, or past it: the request fails, never a short body that
    // looks complete.
    for (n, declared) in [(100, 101), (100, 99), (70_000, 70_001), (70_000, 69_999)] {
        let path = format!("/sized?n={n}&declare={declared}");
        let reply = crate::support::raw(
            s.addr(),
            format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"),
        )
        .await;
        let complete = reply.starts_with("HTTP/1.1 200")
            && reply
                .split_once("\r\n\r\n")
                .is_some_and(|(_, body)| body.len() == declared);
        assert!(!complete, "{path}: {}", &reply[..reply.len().min(300)]);
        if n < abi::STREAM_THRESHOLD {
            assert!(reply.starts_with("HTTP/1.1 500"), "{path}: {reply}");
            assert!(reply.contains("declared a body of"), "{path}: {reply}");
        }
    }
    // Not a number: refused (the guest exits 2).
    let r = s.get("/sized?n=10&declare=ten").await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "{}", r.text());
}
