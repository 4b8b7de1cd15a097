//! Clients that stop reading their answers, and uploads that race their answers: over
//! HTTP/1.1, HTTP/2 and HTTP/3, a client that takes nothing holds no guest slot past the
//! guest's time limit (the other clients of its tenant are served), and its connection or
//! stream is cut after `server.send_timeout_ms`; an HTTP/3 upload still being sent when its
//! answer is complete panics no task.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};
use http::{Method, Request, StatusCode};
use http_body_util::Full;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::http3::H3Client;
use crate::support::{TestServer, metric_value, send, test_guest};
use crate::tls::Pki;

/// Bytes each stalled client asks for: more than the kernel's send buffer (4 MiB at most
/// here) and the guest's channel can take, so the guest's writes wait for the client.
const BIG: usize = 16_000_000;
/// The guests' time limit, and the send timeout: far apart, so a slot freed only when the
/// client is cut off is told from one freed at the guest's deadline.
const GUEST_MS: u64 = 1000;
const SEND_MS: u64 = 8000;
/// Stalled clients: as many as the tenant's concurrency, so a slot held past the deadline
/// would turn the next client away.
const STALLED: usize = 4;

struct Slow {
    s: TestServer,
    tls: SocketAddr,
    pki: Pki,
    _ca_file: PathBuf,
}

async fn server() -> Slow {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    pki.issue(dir.path(), "a", &["a.test"]);
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &pki.ca_pem).unwrap();
    test_guest(dir.path(), "write_sized");
    crate::support::test_component(dir.path(), "component");
    let config = format!(
        "[server]\ntls_listen = \"127.0.0.1:0\"\nhttp3 = true\nsend_timeout_ms = {SEND_MS}\n\
         [pool]\ninstances = 16\nmax_memory_mib = 64\n\
         [[certificate]]\ncert = \"a.crt\"\nkey = \"a.key\"\n\
         [[tenant]]\nname = \"sized\"\nmodule = \"write_sized.wasm\"\npaths = [\"/sized\"]\n\
         [tenant.limits]\ntimeout_ms = {GUEST_MS}\nmax_concurrency = {STALLED}\n\
         [[tenant]]\nname = \"echo\"\nmodule = \"builtin:echo\"\npaths = [\"/echo\"]\n\
         [tenant.limits]\ntimeout_ms = 500\n\
         [[tenant]]\nname = \"comp\"\nmodule = \"component.wasm\"\npaths = [\"/comp\"]\n\
         [tenant.limits]\ntimeout_ms = 500\n"
    );
    let s = TestServer::try_start_in(dir, &config)
        .await
        .unwrap_or_else(|e| panic!("server failed to start: {e:#}"));
    let tls = s.running.tls_addr.expect("a TLS listener");
    Slow {
        s,
        tls,
        pki,
        _ca_file: ca_file,
    }
}

fn big_path() -> String {
    format!("/sized?n={BIG}&chunk=65536")
}

impl Slow {
    /// Waits until `n` runs of `sized` have timed out, then checks that its slots are free
    /// (the instances in use are back to none and a client of the tenant is served whole)
    /// before the send timeout since `since` (when the clients stalled) could have freed them.
    async fn slots_freed_after_the_deadline(&self, n: usize, over: &str, since: Instant) {
        let timeouts = r#"tern_guest_outcomes_total{outcome="timeout",tenant="sized"}"#;
        self.s.wait_metric(timeouts, n as f64).await;
        let in_use = crate::support::SLOTS_IN_USE;
        let mut left = f64::NAN;
        for _ in 0..100 {
            left = metric_value(&self.s.metrics().await, in_use);
            if left == 0.0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(
            left, 0.0,
            "{over}: slots still held by clients that stopped reading"
        );
        assert!(
            since.elapsed() < Duration::from_millis(SEND_MS),
            "{over}: the slots were freed only when the clients were cut off ({:?})",
            since.elapsed()
        );
        let r = send(
            self.s.addr(),
            Method::GET,
            "/sized?n=1000",
            None,
            &[],
            Bytes::new(),
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{over}: {}", r.text());
        assert_eq!(r.body.len(), 1000);
    }
}

/// HTTP/1.1: clients with a tiny receive buffer that never read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_clients_that_stop_reading_hold_no_slot_and_are_cut_off() {
    let slow = server().await;
    let since = Instant::now();
    let mut stalled = Vec::new();
    for _ in 0..STALLED {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let mut conn = socket.connect(slow.s.addr()).await.unwrap();
        let head = format!("GET {} HTTP/1.1\r\nhost: localhost\r\n\r\n", big_path());
        conn.write_all(head.as_bytes()).await.unwrap();
        stalled.push(conn);
    }
    slow.slots_freed_after_the_deadline(STALLED, "HTTP/1.1", since)
        .await;
    // After the send timeout the server closes each: reading, the client finds the end
    // before the body's (what the kernels held, then EOF or a reset).
    tokio::time::sleep(Duration::from_millis(SEND_MS + 500)).await;
    for mut conn in stalled {
        let mut got = 0usize;
        let mut buf = vec![0u8; 1 << 16];
        let read_all = async {
            loop {
                match conn.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got += n,
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(20), read_all)
            .await
            .expect("the server never closed a connection whose client stopped reading");
        assert!(
            got < BIG,
            "the whole answer came ({got} bytes): nothing was cut"
        );
    }
}

/// HTTP/2: streams whose flow-control window the client never opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_streams_the_client_grants_no_window_hold_no_slot() {
    let slow = server().await;
    let stream = tokio::net::TcpStream::connect(slow.s.addr()).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(65_535)
        .initial_connection_window_size(65_535 * 8)
        .adaptive_window(false)
        .handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let since = Instant::now();
    let mut held = Vec::new();
    for _ in 0..STALLED {
        let req = Request::builder()
            .uri(format!("http://localhost{}", big_path()))
            .body(Full::new(Bytes::new()))
            .unwrap();
        sender.ready().await.unwrap();
        // The head comes; the body is never read.
        let resp = sender.send_request(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        held.push(resp);
    }
    slow.slots_freed_after_the_deadline(STALLED, "HTTP/2", since)
        .await;
    drop(held);
}

/// HTTP/3: streams whose flow-control window the client never opens are reset after the
/// send timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http3_streams_the_client_grants_no_credit_hold_no_slot_and_are_reset() {
    let slow = server().await;
    let mut client = H3Client::connect_with(slow.tls, &slow.pki.ca, Some(64 * 1024))
        .await
        .expect("connect");
    let since = Instant::now();
    let mut streams = Vec::new();
    for _ in 0..STALLED {
        let req = Request::builder()
            .uri(format!("https://a.test{}", big_path()))
            .body(())
            .unwrap();
        let mut stream = client.send.send_request(req).await.unwrap();
        // The server may answer and stop the request's stream before its end is sent.
        let _ = stream.finish().await;
        let head = stream.recv_response().await.unwrap();
        assert_eq!(head.status(), StatusCode::OK);
        streams.push(stream);
    }
    slow.slots_freed_after_the_deadline(STALLED, "HTTP/3", since)
        .await;
    tokio::time::sleep(Duration::from_millis(SEND_MS + 500)).await;
    for mut stream in streams {
        let mut got = 0usize;
        let ended = tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                match stream.recv_data().await {
                    Ok(Some(mut chunk)) => got += chunk.copy_to_bytes(chunk.remaining()).len(),
                    Ok(None) => return Ok(()),
                    Err(e) => return Err(e),
                }
            }
        })
        .await
        .expect("a stream whose client gave no credit was never reset");
        assert!(
            ended.is_err(),
            "the stream ended cleanly after {got} bytes: a cut answer taken for whole"
        );
        assert!(got < BIG);
    }
}

/// An HTTP/3 upload still being sent when its answer is complete (the guest's time ran out
/// while it waited for the body): the answer comes, and no task panics, for a guest that
/// reads the body itself and for a component whose body the host reads ahead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http3_upload_racing_its_answer_panics_no_task() {
    let slow = server().await;
    for path in ["/echo", "/comp/keep"] {
        let mut client = H3Client::connect_with(slow.tls, &slow.pki.ca, None)
            .await
            .expect("connect");
        for _ in 0..3 {
            let req = Request::builder()
                .method(Method::POST)
                .uri(format!("https://a.test{path}"))
                .header("content-length", "100000")
                .body(())
                .unwrap();
            let mut stream = client.send.send_request(req).await.unwrap();
            stream
                .send_data(Bytes::from(vec![b'x'; 1000]))
                .await
                .unwrap();
            // The rest never comes: the guest's read waits until its time is up.
            let head = tokio::time::timeout(Duration::from_secs(20), stream.recv_response())
                .await
                .expect("an answer")
                .unwrap();
            assert_eq!(head.status(), StatusCode::GATEWAY_TIMEOUT, "{path}");
            while let Ok(Some(_)) = stream.recv_data().await {}
            // Then the client sends on, after its answer.
            let _ = stream.send_data(Bytes::from(vec![b'y'; 1000])).await;
        }
        // The server still serves.
        let mut fresh = H3Client::connect_with(slow.tls, &slow.pki.ca, None)
            .await
            .expect("connect");
        let req = Request::builder()
            .uri("https://a.test/sized?n=10")
            .body(())
            .unwrap();
        let mut stream = fresh.send.send_request(req).await.unwrap();
        let _ = stream.finish().await;
        assert_eq!(
            stream.recv_response().await.unwrap().status(),
            StatusCode::OK
        );
    }
    let panics = metric_value(&slow.s.metrics().await, "tern_task_panics_total");
    assert_eq!(panics, 0.0, "a request's task panicked");
}
