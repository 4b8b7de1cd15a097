//! Outbound requests: guests call their tenant's backends and allowed hosts, and nothing else;
//! timeouts, limits, loop detection, connection reuse; the proxy and aggregator examples
//! against real backends on 127.0.0.1.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tern_sdk::abi::errno;

use crate::support::{H2Conn, TestServer, metric_value, post, raw, send, test_guest};

/// A backend for the tests: `/hello` answers `hi` and the request's headers, `/slow` answers
/// after 3 s, `/late` after 1 s, `/big?n=N` N bytes, `/echo` the request body, `/users` and `/orders` each wait
/// (up to 5 s) until the other has arrived too, so they succeed only when sent in parallel.
pub(crate) struct Backend {
    pub(crate) addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    /// `/echo` bodies that failed to arrive whole (the client aborted them).
    aborted: Arc<AtomicUsize>,
}

/// A body that sends a few bytes and then never ends.
struct Stall(bool);

impl http_body::Body for Stall {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Infallible>>> {
        if std::mem::replace(&mut self.0, true) {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(Some(Ok(http_body::Frame::data(Bytes::from_static(
                b"partial",
            )))))
        }
    }
}

type AnyBody = http_body_util::combinators::BoxBody<Bytes, Infallible>;

/// The backend's answer; `/stall` sends its head and part of a body that never ends.
async fn handle(
    req: Request<Incoming>,
    both: Arc<tokio::sync::Barrier>,
    aborted: Arc<AtomicUsize>,
) -> Response<AnyBody> {
    if req.uri().path() == "/stall" {
        return Response::new(BodyExt::boxed(Stall(false)));
    }
    handle_whole(req, both, aborted).await.map(BodyExt::boxed)
}

async fn handle_whole(
    req: Request<Incoming>,
    both: Arc<tokio::sync::Barrier>,
    aborted: Arc<AtomicUsize>,
) -> Response<Full<Bytes>> {
    let full = req.uri().path().to_string();
    // The `base` backend's URL has the base path `/v1`.
    let path = full.strip_prefix("/v1").unwrap_or(&full).to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let mut text = String::new();
    match path.as_str() {
        "/hello" => {
            text.push_str("hi\n");
            text.push_str(&format!("path: {full}\n"));
            for (name, value) in req.headers() {
                text.push_str(&format!("{name}: {}\n", value.to_str().unwrap_or("?")));
            }
        }
        "/slow" => {
            tokio::time::sleep(Duration::from_secs(3)).await;
            text.push_str("late\n");
        }
        "/late" => {
            tokio::time::sleep(Duration::from_secs(1)).await;
            text.push_str("late\n");
        }
        "/big" => {
            let n: usize = query
                .strip_prefix("n=")
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            return Response::new(Full::new(Bytes::from(vec![b'x'; n])));
        }
        "/echo" => {
            let Ok(body) = req.into_body().collect().await else {
                aborted.fetch_add(1, Ordering::SeqCst);
                return Response::new(Full::new(Bytes::new()));
            };
            return Response::new(Full::new(body.to_bytes()));
        }
        "/users" | "/orders" => {
            if tokio::time::timeout(Duration::from_secs(5), both.wait())
                .await
                .is_err()
            {
                let mut r = Response::new(Full::new(Bytes::from("not sent in parallel")));
                *r.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                return r;
            }
            text = format!("{{\"from\":\"{}\"}}", &path[1..]);
        }
        _ => {
            let mut r = Response::new(Full::new(Bytes::from("no such path")));
            *r.status_mut() = StatusCode::NOT_FOUND;
            return r;
        }
    }
    Response::new(Full::new(Bytes::from(text)))
}

/// Serves the test backend's paths (see [`handle`]) on one connection.
async fn serve_backend<S>(stream: S, both: Arc<tokio::sync::Barrier>, aborted: Arc<AtomicUsize>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req| {
        let (both, aborted) = (both.clone(), aborted.clone());
        async move { Ok::<_, Infallible>(handle(req, both, aborted).await) }
    });
    // Room for a guest's `MAX_HEADERS` and those Tern adds (hyper's default is 100 in all).
    let _ = hyper::server::conn::http1::Builder::new()
        .max_headers(2 * tern::outbound::MAX_HEADERS)
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

impl Backend {
    /// `/echo` bodies that failed to arrive whole so far.
    pub(crate) fn aborted(&self) -> usize {
        self.aborted.load(Ordering::SeqCst)
    }

    /// Waits (up to 5 s) until more than `before` `/echo` bodies have failed to arrive whole.
    pub(crate) async fn await_abort(&self, before: usize) {
        let mut waited = 0;
        while self.aborted() == before {
            assert!(waited < 100, "the backend never saw the body fail");
            tokio::time::sleep(Duration::from_millis(50)).await;
            waited += 1;
        }
    }

    pub(crate) async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let aborted = Arc::new(AtomicUsize::new(0));
        let (count, failed) = (accepted.clone(), aborted.clone());
        let both = Arc::new(tokio::sync::Barrier::new(2));
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(serve_backend(stream, both.clone(), failed.clone()));
            }
        });
        Self {
            addr,
            accepted,
            aborted,
        }
    }
}

/// Asserts the probe's answer is the error `code` (`error=CODE MESSAGE`) whose message says
/// `says`.
#[track_caller]
fn assert_failed(text: &str, code: i32, says: &str) {
    assert!(
        text.starts_with(&format!("error={code} ")) && text.contains(says),
        "expected error {code} saying {says:?}: {text}"
    );
}

async fn probe_server(backend: &Backend) -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    test_guest(dir.path(), "outbound_probe");
    let b = backend.addr;
    let config = format!(
        "[pool]\ninstances = 16\nmax_memory_mib = 64\n\
         [[tenant]]\nname = \"probe\"\nmodule = \"outbound_probe.wasm\"\npaths = [\"/probe\"]\n\
         [tenant.limits]\ntimeout_ms = 5000\n\
         [tenant.outbound]\nallowed_hosts = [\"localhost\", \"127.0.0.1\"]\nmax_requests = 3\n\
         max_response_bytes = 100000\nmax_request_bytes = 1000\n\
         [tenant.outbound.backends.origin]\nurl = \"http://{b}\"\n\
         [tenant.outbound.backends.base]\nurl = \"http://{b}/v1/\"\nhost = \"origin.internal\"\n\
         [tenant.outbound.backends.slow]\nurl = \"http://{b}\"\nfirst_byte_timeout_ms = 200\n\
         [tenant.outbound.backends.down]\nurl = \"http://127.0.0.1:{}\"\n\
         [[tenant]]\nname = \"closed\"\nmodule = \"outbound_probe.wasm\"\npaths = [\"/closed\"]\n\
         [[tenant]]\nname = \"deadline\"\nmodule = \"outbound_probe.wasm\"\npaths = [\"/deadline\"]\n\
         [tenant.limits]\ntimeout_ms = 300\n\
         [tenant.outbound.backends.origin]\nurl = \"http://{b}\"\n",
        crate::support::free_port()
    );
    TestServer::try_start_in(dir, &config).await.expect("start")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guests_call_their_backends_and_nothing_else() {
    let backend = Backend::start().await;
    let s = probe_server(&backend).await;
    let b = backend.addr;

    // A named backend, on loopback: the operator named it, so it may be private.
    let traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let r = send(
        s.addr(),
        Method::GET,
        "/probe?backend=origin&path=/hello",
        None,
        &[("traceparent", traceparent)],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let text = r.text();
    assert!(text.starts_with("status=200 "), "{text}");
    assert!(text.contains("body=hi\n"), "{text}");
    assert!(text.contains(&format!("host: {b}\n")), "{text}");
    assert!(text.contains("cdn-loop: tern\n"), "{text}");
    assert!(
        text.contains(&format!("traceparent: {traceparent}\n")),
        "the incoming trace context is passed on: {text}"
    );
    assert!(
        r.header("server-timing").contains("outbound;dur="),
        "{}",
        r.header("server-timing")
    );
    // A base path and a Host override.
    let r = s.get("/probe?backend=base&path=/hello?x=1").await;
    assert!(r.text().starts_with("status=200 "), "{}", r.text());
    assert!(r.text().contains("path: /v1/hello\n"), "{}", r.text());
    assert!(r.text().contains("host: origin.internal\n"), "{}", r.text());
    let r = s.get("/probe?backend=base&path=hello").await;
    assert_failed(&r.text(), errno::INVALID_ARGUMENT, "must start with '/'");

    // Everything else is denied, each with a message that says why.
    let denied = format!("error={} ", errno::DENIED);
    for (path, why) in [
        ("/probe?backend=nope", "no backend named \"nope\""),
        ("/closed?backend=origin", "no backend named \"origin\""),
        (
            "/probe?url=http://evil.example/x",
            "not in this tenant's outbound.allowed_hosts",
        ),
        ("/probe?url=http://localhost:1/x", "not a public address"),
        ("/probe?url=http://127.0.0.1:1/x", "not a public address"),
        (
            "/closed?url=http://127.0.0.1:1/x",
            "not in this tenant's outbound.allowed_hosts",
        ),
    ] {
        let r = s.get(path).await;
        assert_eq!(r.status, StatusCode::OK);
        assert!(r.text().starts_with(&denied), "{path}: {}", r.text());
        assert!(r.text().contains(why), "{path}: {}", r.text());
    }
    let r = s.get("/probe?url=https://localhost/x").await;
    assert!(r.text().starts_with(&denied), "{}", r.text());
    assert!(r.text().contains("not a public address"), "{}", r.text());

    // Limits: requests per request, request and response body sizes.
    let r = s.get("/probe?backend=origin&path=/hello&times=4").await;
    let text = r.text();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("status=") || l.starts_with("error="))
        .collect();
    assert_eq!(lines.len(), 4, "{}", r.text());
    assert!(
        lines[3].starts_with(&format!(
            "error={} at most 3 outbound requests",
            errno::LIMIT_EXCEEDED
        )),
        "{}",
        r.text()
    );
    let r = s.get("/probe?backend=origin&path=/big?n=100001").await;
    assert_failed(&r.text(), errno::LIMIT_EXCEEDED, "max_response_bytes");
    let r = s.get("/probe?backend=origin&path=/big?n=100000").await;
    assert!(
        r.text().starts_with("status=200 bytes=100000 "),
        "limit exactly: {}",
        &r.text()[..40]
    );
    let r = s
        .get("/probe?backend=origin&path=/echo&method=POST&size=1001")
        .await;
    assert_failed(&r.text(), errno::LIMIT_EXCEEDED, "");
    let r = s
        .get("/probe?backend=origin&path=/echo&method=POST&size=1000")
        .await;
    assert!(
        r.text().starts_with("status=200 bytes=1000 "),
        "{}",
        &r.text()[..40]
    );

    // Timeouts and a backend that is down: errors for the guest, not for the client.
    let r = s.get("/probe?backend=slow&path=/slow").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_failed(&r.text(), errno::TIMEOUT, "first_byte_timeout_ms");
    // The head wait is first_byte_timeout_ms (200) from the request's sending, not that plus
    // the connect timeout (2 s): a head 1 s late is too late, on a pooled connection as on a
    // new one.
    for _ in 0..2 {
        let r = s.get("/probe?backend=slow&path=/late").await;
        assert_failed(&r.text(), errno::TIMEOUT, "");
        let r = s.get("/probe?backend=slow&path=/hello").await;
        assert!(r.text().starts_with("status=200 "), "{}", r.text());
    }
    let r = s.get("/probe?backend=down&path=/").await;
    assert!(
        r.text().starts_with(&format!(
            "error={} connecting to the backend failed",
            errno::IO
        )),
        "{}",
        r.text()
    );
    // The guest's own deadline still holds while it waits for a backend.
    let r = s.get("/deadline?backend=origin&path=/slow").await;
    assert_eq!(r.status, StatusCode::GATEWAY_TIMEOUT, "{}", r.text());

    let m = s.metrics().await;
    for (series, at_least) in [
        (
            "tern_outbound_requests_total{backend=\"origin\",status=\"2xx\",tenant=\"probe\"}",
            3.0,
        ),
        (
            "tern_outbound_requests_total{backend=\"unknown\",status=\"denied\",tenant=\"probe\"}",
            1.0,
        ),
        (
            "tern_outbound_requests_total{backend=\"url\",status=\"denied\",tenant=\"probe\"}",
            3.0,
        ),
        (
            "tern_outbound_requests_total{backend=\"slow\",status=\"timeout\",tenant=\"probe\"}",
            3.0,
        ),
        (
            "tern_outbound_requests_total{backend=\"down\",status=\"error\",tenant=\"probe\"}",
            1.0,
        ),
        (
            "tern_outbound_requests_total{backend=\"origin\",status=\"limit\",tenant=\"probe\"}",
            2.0,
        ),
        ("tern_outbound_connections_total", 1.0),
        (
            "tern_request_phase_duration_seconds_count{deployment=\"current\",phase=\"outbound\"}",
            1.0,
        ),
    ] {
        assert!(metric_value(&m, series) >= at_least, "{series} in\n{m}");
    }
}

/// A guest's outbound request carries the headers it set up to the limit (`MAX_HEADERS`):
/// one under and at the limit every one reaches the backend; one more is refused with
/// `LIMIT_EXCEEDED` and nothing is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbound_request_carries_headers_up_to_the_limit() {
    let backend = Backend::start().await;
    let s = probe_server(&backend).await;
    let max = tern::outbound::MAX_HEADERS;
    let received = |text: &str| {
        text.lines()
            .filter(|l| {
                l.strip_prefix('h')
                    .and_then(|l| l.strip_suffix(": v"))
                    .is_some_and(|n| n.parse::<usize>().is_ok())
            })
            .count()
    };
    for n in [max - 1, max] {
        let r = s
            .get(&format!("/probe?backend=origin&path=/hello&headers={n}"))
            .await;
        let text = r.text();
        assert!(text.starts_with("status=200 "), "{n} headers: {text}");
        assert_eq!(received(&text), n, "{n} headers reach the backend: {text}");
    }
    let r = s
        .get(&format!(
            "/probe?backend=origin&path=/hello&headers={}",
            max + 1
        ))
        .await;
    assert_failed(&r.text(), errno::LIMIT_EXCEEDED, "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_in_parallel_and_connections_reused() {
    let backend = Backend::start().await;
    let s = probe_server(&backend).await;
    // Two at once: each backend request waits for the other, so only parallel ones succeed.
    let r = s.get("/probe?backend=origin&path=/users&parallel=2").await;
    assert_eq!(r.text().matches("status=200").count(), 2, "{}", r.text());
    assert!(r.text().contains("{\"from\":\"users\"}"), "{}", r.text());
    // Sequential requests reuse the worker's pooled connection.
    let before = backend.accepted.load(Ordering::SeqCst);
    for _ in 0..10 {
        let r = s.get("/probe?backend=origin&path=/hello&times=3").await;
        assert_eq!(r.text().matches("status=200").count(), 3, "{}", r.text());
    }
    let opened = backend.accepted.load(Ordering::SeqCst) - before;
    // One pool per worker thread (2 here), and the one connection the parallel pair left.
    assert!(opened <= 3, "30 requests opened {opened} connections");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_example_streams_10_mb_both_ways() {
    let backend = Backend::start().await;
    let b = backend.addr;
    let mb10 = 10_000_000;
    // 4 MiB of guest memory: a proxy that held a 10 MB body whole would run out.
    let config = format!(
        "[[tenant]]\nname = \"shop\"\nmodule = \"builtin:proxy\"\npaths = [\"/shop\"]\n\
         [tenant.limits]\nmax_memory_mib = 4\nmax_request_bytes = 20000000\n\
         max_response_bytes = 20000000\ntimeout_ms = 20000\n\
         [tenant.outbound]\nmax_request_bytes = 20000000\nmax_response_bytes = 20000000\n\
         [tenant.outbound.backends.origin]\nurl = \"http://{b}\"\n\
         [[tenant]]\nname = \"gone\"\nmodule = \"builtin:proxy\"\npaths = [\"/gone\"]\n\
         [tenant.outbound.backends.origin]\nurl = \"http://127.0.0.1:{}\"\n",
        crate::support::free_port()
    );
    let s = TestServer::start(&config).await;

    let r = s.get("/shop/hello?x=1").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let text = r.text();
    for line in [
        "path: /hello\n",
        "x-forwarded-for: 127.0.0.1\n",
        "x-forwarded-host: localhost\n",
        "x-forwarded-proto: http\n",
        "cdn-loop: tern\n",
    ] {
        assert!(text.contains(line), "{line:?} in {text}");
    }
    assert_eq!(r.header("cache-control"), "public, max-age=60");

    let body: Vec<u8> = (0..mb10).map(|i| (i % 251) as u8).collect();
    let r = send(
        s.addr(),
        Method::POST,
        "/shop/echo",
        None,
        &[],
        Bytes::from(body.clone()),
    )
    .await;
    assert_eq!(
        r.status,
        StatusCode::OK,
        "{}",
        &r.text()[..r.text().len().min(300)]
    );
    assert_eq!(r.body.len(), mb10);
    assert!(r.body == body, "the body came back changed");

    let r = s.get(&format!("/shop/big?n={mb10}")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body.len(), mb10);

    // The backend's status passes through; a backend that is down is a 502.
    assert_eq!(s.get("/shop/nothing").await.status, StatusCode::NOT_FOUND);
    let r = s.get("/gone/x").await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY, "{}", r.text());
    assert!(
        r.text().contains("connecting to the backend failed"),
        "{}",
        r.text()
    );
}

/// The `proxy` example in front of the test backend at `/shop` (the tenant takes 100 kB in and
/// out; the backend's bodies end within 1.5 s), with `extra` TOML after `[pool]`.
async fn forwarding_proxy(backend: &Backend, extra: &str) -> TestServer {
    let config = format!(
        "[pool]\ninstances = 16\nmax_memory_mib = 64\n{extra}\n\
         [[tenant]]\nname = \"shop\"\nmodule = \"builtin:proxy\"\npaths = [\"/shop\"]\n\
         [tenant.limits]\nmax_request_bytes = 100000\nmax_response_bytes = 100000\nmax_concurrency = 1\n\
         [tenant.outbound]\nmax_request_bytes = 1000000\nmax_response_bytes = 1000000\n\
         [tenant.outbound.backends.origin]\nurl = \"http://{}\"\ntotal_timeout_ms = 1500\n",
        backend.addr
    );
    let dir = tempfile::tempdir().unwrap();
    TestServer::try_start_in(dir, &config).await.expect("start")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarding_passes_headers_and_bodies_of_every_framing() {
    let backend = Backend::start().await;
    let s = forwarding_proxy(&backend, "").await;

    // The client's headers go on, but for the hop-by-hop ones and its host.
    let hop = [
        ("x-custom", "1"),
        ("te", "trailers"),
        ("keep-alive", "5"),
        ("proxy-connection", "keep-alive"),
    ];
    let r = send(
        s.addr(),
        Method::GET,
        "/shop/hello",
        Some("shop.example"),
        &hop,
        Bytes::new(),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let text = r.text();
    assert!(text.contains("x-custom: 1\n"), "{text}");
    assert!(text.contains("x-forwarded-host: shop.example\n"), "{text}");
    for gone in [
        "\nte:",
        "\nkeep-alive:",
        "\nproxy-connection:",
        "\nhost: shop.example",
    ] {
        assert!(!text.contains(gone), "{gone} forwarded: {text}");
    }
    assert_eq!(r.header("cache-control"), "public, max-age=60");

    // HTTP/1.1 chunked, HTTP/2 without a length, a sized empty body, HTTP/1.0.
    let chunked = raw(
        s.addr(),
        "POST /shop/echo HTTP/1.1\r\nhost: localhost\r\ntransfer-encoding: chunked\r\n\
         connection: close\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
    )
    .await;
    assert!(chunked.starts_with("HTTP/1.1 200"), "{chunked}");
    assert!(chunked.ends_with("\r\n\r\nhello world"), "{chunked}");
    let chunks: Vec<Bytes> = (0..20).map(|i| Bytes::from(vec![b'a' + i; 1000])).collect();
    let whole: Vec<u8> = chunks.iter().flat_map(|c| c.to_vec()).collect();
    let r = H2Conn::post_unsized(s.addr(), "/shop/echo", chunks).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert!(r.body == whole, "the body came back changed");
    let r = post(&s, "/shop/echo", &[], Vec::new()).await;
    assert_eq!((r.status, r.body.len()), (StatusCode::OK, 0));
    let old = raw(
        s.addr(),
        "GET /shop/hello HTTP/1.0\r\nhost: localhost\r\n\r\n",
    )
    .await;
    assert!(
        old.starts_with("HTTP/1.0 200") && old.contains("\r\n\r\nhi\n"),
        "{old}"
    );

    // HEAD: the backend's length, no body.
    let r = send(
        s.addr(),
        Method::HEAD,
        "/shop/big?n=100",
        None,
        &[],
        Bytes::new(),
    )
    .await;
    assert_eq!(
        (r.status, r.header("content-length"), r.body.len()),
        (StatusCode::OK, "100", 0)
    );

    // Limits: a client body past the tenant's 100 kB is 413 and the backend sees it aborted;
    // a backend body declared past it is refused before anything is sent.
    let before = backend.aborted();
    let big = raw(
        s.addr(),
        format!(
            "POST /shop/echo HTTP/1.1\r\nhost: localhost\r\ntransfer-encoding: chunked\r\n\
             connection: close\r\n\r\nea60\r\n{0}\r\nea60\r\n{0}\r\n0\r\n\r\n",
            "b".repeat(60_000)
        ),
    )
    .await;
    assert!(
        big.starts_with("HTTP/1.1 413"),
        "{}",
        &big[..big.len().min(300)]
    );
    backend.await_abort(before).await;
    let r = s.get("/shop/big?n=100001").await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY, "{}", r.text());
    assert!(
        r.text().contains("past the tenant's limits"),
        "{}",
        r.text()
    );
    let r = s.get("/shop/big?n=100000").await;
    assert_eq!((r.status, r.body.len()), (StatusCode::OK, 100_000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_answer_streams_after_its_guest_is_gone() {
    let backend = Backend::start().await;
    // One request at a time for the tenant, and no waiting for a slot: a second request can
    // only be served while the first one's body still flows if the first instance is gone.
    let s = forwarding_proxy(&backend, "queue_timeout_ms = 100").await;
    let stream = tokio::net::TcpStream::connect(s.addr()).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::get("/shop/stall")
        .header("host", "localhost")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(&first[..], b"partial");

    // The stalled body is still open; the tenant's only slot is free again.
    let r = s.get("/shop/hello").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());

    // The backend's total timeout cuts the stalled body: the client sees it incomplete.
    let rest = tokio::time::timeout(Duration::from_secs(10), body.collect())
        .await
        .expect("the body ends by the backend's timeout");
    assert!(rest.is_err(), "a cut body must not look complete");
    let m = s.metrics().await;
    let series = "tern_responses_undelivered_total{reason=\"backend_failed\",tenant=\"shop\"}";
    assert_eq!(metric_value(&m, series), 1.0, "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarding_refuses_what_would_lose_or_mix_bytes() {
    let backend = Backend::start().await;
    let s = probe_server(&backend).await;
    // A body the guest has started reading cannot be forwarded (its start would be lost).
    let r = post(
        &s,
        "/probe?backend=origin&path=/echo&method=POST&forward=1&read=1",
        &[],
        b"abc".to_vec(),
    )
    .await;
    assert!(
        r.text().starts_with(&format!(
            "error={} outbound_forward_request: the guest has read from the request body",
            errno::INVALID_ARGUMENT
        )),
        "{}",
        r.text()
    );
    // Forwarded without reading: the backend gets it whole.
    let r = post(
        &s,
        "/probe?backend=origin&path=/echo&method=POST&forward=1",
        &[],
        b"abc".to_vec(),
    )
    .await;
    assert_eq!((r.status, r.text().as_str()), (StatusCode::OK, "abc"));
    // A forwarded answer's body is the backend's: the guest cannot add to it.
    let r = s
        .get("/probe?backend=origin&path=/hello&forward=1&bad_write=1")
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert!(r.text().starts_with("hi\n"), "{}", r.text());
    assert_eq!(
        r.header("x-write-after-forward"),
        errno::INVALID_ARGUMENT.to_string()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_aggregate_example_asks_two_backends_at_once() {
    let backend = Backend::start().await;
    let b = backend.addr;
    let config = format!(
        "[[tenant]]\nname = \"dash\"\nmodule = \"builtin:aggregate\"\n\
         [tenant.limits]\ntimeout_ms = 8000\n\
         [tenant.outbound.backends.users]\nurl = \"http://{b}\"\n\
         [tenant.outbound.backends.orders]\nurl = \"http://{b}\"\n"
    );
    let s = TestServer::start(&config).await;
    let r = s.get("/").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(
        v,
        serde_json::json!({ "users": { "from": "users" }, "orders": { "from": "orders" } })
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_that_calls_itself_is_stopped_by_the_loop_header() {
    let s = TestServer::start("").await;
    // A proxy whose origin is this very tenant: each request would call it again, forever.
    let spec = serde_json::json!({
        "paths": ["/loop"],
        "outbound": { "backends": { "origin": { "url": format!("http://{}/loop", s.addr()) } } },
        "limits": { "timeout_ms": 10000 }
    });
    let (status, v) = s
        .admin_call(Method::PUT, "/admin/v1/tenants/loop", spec.to_string())
        .await;
    assert!(status.is_success(), "{status} {v}");
    let (status, v) = s
        .admin_call(
            Method::PUT,
            "/admin/v1/tenants/loop/module",
            tern::demo::module("proxy").unwrap().to_vec(),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let r = s.get("/loop/x").await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY, "{}", r.text());
    assert!(r.text().contains("request loop"), "{}", r.text());
    let m = s.metrics().await;
    let series =
        "tern_outbound_requests_total{backend=\"origin\",status=\"denied\",tenant=\"loop\"}";
    assert_eq!(metric_value(&m, series), 1.0, "{m}");
    assert_eq!(
        metric_value(
            &m,
            "tern_outbound_requests_total{backend=\"origin\",status=\"5xx\",tenant=\"loop\"}"
        ),
        tern::outbound::MAX_HOPS as f64,
        "every hop but the last sent a request and got the 502 back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_request_body_arrives_whole_or_visibly_aborted() {
    let backend = Backend::start().await;
    let s = probe_server(&backend).await;
    // Within the tenant's 1000-byte outbound body limit, streamed after the head.
    let r = s
        .get("/probe?backend=origin&path=/echo&method=POST&stream=1000")
        .await;
    assert!(
        r.text().starts_with("status=200 bytes=1000 "),
        "{}",
        r.text()
    );
    let r = s
        .get("/probe?backend=origin&path=/echo&method=POST&stream=2000")
        .await;
    assert_failed(&r.text(), errno::LIMIT_EXCEEDED, "");
    assert_eq!(backend.aborted(), 0);
    // A guest that traps mid-body: the backend sees the request fail, not a short body. (It
    // writes more than the body channel holds, so the request is surely on its way.)
    let dir = tempfile::tempdir().unwrap();
    test_guest(dir.path(), "outbound_probe");
    let config = format!(
        "[[tenant]]\nname = \"stream\"\nmodule = \"outbound_probe.wasm\"\n\
         [tenant.outbound]\nmax_request_bytes = 100000\n\
         [tenant.outbound.backends.origin]\nurl = \"http://{}\"\n",
        backend.addr
    );
    let s = TestServer::try_start_in(dir, &config).await.expect("start");
    let r = s
        .get("/?backend=origin&path=/echo&method=POST&stream=50000")
        .await;
    assert!(
        r.text().starts_with("status=200 bytes=50000 "),
        "{}",
        r.text()
    );
    let before = backend.aborted();
    let r = s
        .get("/?backend=origin&path=/echo&method=POST&stream=50000&trap=1")
        .await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "{}", r.text());
    backend.await_abort(before).await;
}

/// A CA made for the test, and a TLS backend for `localhost` whose certificate it signed.
struct TlsBackend {
    addr: SocketAddr,
    ca_pem: String,
}

impl TlsBackend {
    async fn start() -> Self {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec!["localhost".to_string()])
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        let server = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
            )
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let both = Arc::new(tokio::sync::Barrier::new(2));
            let aborted = Arc::new(AtomicUsize::new(0));
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let (acceptor, both, aborted) = (acceptor.clone(), both.clone(), aborted.clone());
                tokio::spawn(async move {
                    // A client that did not trust us gets no service.
                    if let Ok(tls) = acceptor.accept(stream).await {
                        serve_backend(tls, both, aborted).await;
                    }
                });
            }
        });
        Self {
            addr,
            ca_pem: ca_cert.pem(),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_backends_are_verified_against_their_ca() {
    let backend = TlsBackend::start().await;
    let other = TlsBackend::start().await;
    let dir = tempfile::tempdir().unwrap();
    test_guest(dir.path(), "outbound_probe");
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, &backend.ca_pem).unwrap();
    let wrong_ca = dir.path().join("other-ca.pem");
    std::fs::write(&wrong_ca, &other.ca_pem).unwrap();
    let port = backend.addr.port();
    let config = format!(
        "[[tenant]]\nname = \"tls\"\nmodule = \"outbound_probe.wasm\"\n\
         [tenant.outbound.backends.secure]\nurl = \"https://localhost:{port}\"\nca_file = \"{}\"\n\
         [tenant.outbound.backends.wrongca]\nurl = \"https://localhost:{port}\"\nca_file = \"{}\"\n\
         [tenant.outbound.backends.platform]\nurl = \"https://localhost:{port}\"\n",
        ca.display(),
        wrong_ca.display()
    );
    let s = TestServer::try_start_in(dir, &config).await.expect("start");
    let r = s.get("/?backend=secure&path=/hello").await;
    assert!(r.text().starts_with("status=200 "), "{}", r.text());
    assert!(
        r.text().contains(&format!("host: localhost:{port}\n")),
        "{}",
        r.text()
    );
    // Signed by another CA, or checked against the platform's roots: refused.
    for backend in ["wrongca", "platform"] {
        let r = s.get(&format!("/?backend={backend}&path=/hello")).await;
        assert_failed(&r.text(), errno::IO, "certificate");
    }
    // A CA file that is missing or holds no certificate is a configuration error.
    let bad = "[[tenant]]\nname = \"t\"\nmodule = \"builtin:hello\"\n\
               [tenant.outbound.backends.b]\nurl = \"https://localhost\"\nca_file = \"/nonexistent/ca.pem\"\n";
    let err = TestServer::try_start(bad).await.err().expect("refused");
    assert!(format!("{err:#}").contains("ca_file"), "{err:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_and_total_timeouts_and_many_guests_at_once() {
    let backend = Backend::start().await;
    // A listener that never accepts, its queue full: further connects hang.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let hole = socket.listen(1).unwrap();
    let hole_addr = hole.local_addr().unwrap();
    let mut held = Vec::new();
    loop {
        match tokio::time::timeout(
            Duration::from_millis(300),
            tokio::net::TcpStream::connect(hole_addr),
        )
        .await
        {
            Ok(Ok(stream)) => held.push(stream),
            _ => break,
        }
        assert!(held.len() < 64, "the accept queue never filled");
    }
    let dir = tempfile::tempdir().unwrap();
    test_guest(dir.path(), "outbound_probe");
    let config = format!(
        "[pool]\ninstances = 16\nmax_memory_mib = 64\n\
         [[tenant]]\nname = \"t\"\nmodule = \"outbound_probe.wasm\"\n\
         [tenant.limits]\ntimeout_ms = 5000\nmax_concurrency = 8\n\
         [tenant.outbound.backends.hole]\nurl = \"http://{hole_addr}\"\nconnect_timeout_ms = 300\n\
         [tenant.outbound.backends.stall]\nurl = \"http://{}\"\ntotal_timeout_ms = 500\n\
         [tenant.outbound.backends.origin]\nurl = \"http://{}\"\n",
        backend.addr, backend.addr
    );
    let s = TestServer::try_start_in(dir, &config).await.expect("start");

    let r = s.get("/?backend=hole&path=/").await;
    assert_failed(&r.text(), errno::TIMEOUT, "connect_timeout_ms");

    let r = s.get("/?backend=stall&path=/stall").await;
    assert_failed(&r.text(), errno::TIMEOUT, "total_timeout_ms");

    // Many guests calling out at once, each answered.
    let addr = s.addr();
    let calls: Vec<_> = (0..32)
        .map(|_| {
            tokio::spawn(async move {
                send(
                    addr,
                    Method::GET,
                    "/?backend=origin&path=/hello&times=2",
                    None,
                    &[],
                    Bytes::new(),
                )
                .await
            })
        })
        .collect();
    for call in calls {
        let r = call.await.unwrap();
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        assert_eq!(r.text().matches("status=200 ").count(), 2, "{}", r.text());
    }
    drop(held);
}
