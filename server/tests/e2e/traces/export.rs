//! The export to a collector: one down, stuck, busy or refusing costs requests nothing and loses what it must; the standard environment names it; a graceful shutdown exports what it answered.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_down_or_stuck_costs_requests_nothing_and_drops_are_counted() {
    // Down: nothing listens.
    let dir = tempfile::tempdir().unwrap();
    test_guest(dir.path(), "context");
    let config = format!(
        "[pool]\ninstances = 16\nmax_memory_mib = 64\n\
         [tracing]\nendpoint = \"http://127.0.0.1:{}\"\nbatch_delay_ms = 50\n\
         [[tenant]]\nname = \"ctx\"\nmodule = \"context.wasm\"\npaths = [\"/ctx\"]\n",
        free_port()
    );
    let s = TestServer::try_start_in(dir, &config).await.expect("start");
    for _ in 0..20 {
        assert_eq!(get(s.addr(), "/ctx/", &[]).await.status, StatusCode::OK);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = s.metrics().await;
        let failed = metric_value(
            &m,
            "tern_trace_spans_dropped_total{reason=\"export_failed\"}",
        );
        if failed >= 100.0 {
            // 20 requests of 5 spans each.
            assert_eq!(failed, 100.0, "{m}");
            assert_eq!(metric_value(&m, "tern_trace_spans_exported_total"), 0.0);
            break;
        }
        assert!(Instant::now() < deadline, "drops not counted: {m}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Stuck: a collector that accepts and never answers. The exporter waits on it (up to its
    // timeout); meanwhile the queue fills and further requests' spans are dropped, counted.
    let stuck = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let stuck_addr = stuck.local_addr().unwrap();
    let held = Arc::new(Mutex::new(Vec::new()));
    let keep = held.clone();
    tokio::spawn(async move {
        while let Ok((conn, _)) = stuck.accept().await {
            keep.lock().unwrap().push(conn);
        }
    });
    let dir = tempfile::tempdir().unwrap();
    test_guest(dir.path(), "context");
    let config = format!(
        "[pool]\ninstances = 16\nmax_memory_mib = 64\n\
         [tracing]\nendpoint = \"http://{stuck_addr}\"\nmax_queue = 4\nbatch_delay_ms = 50\n\
         timeout_ms = 60000\n\
         [[tenant]]\nname = \"ctx\"\nmodule = \"context.wasm\"\npaths = [\"/ctx\"]\n"
    );
    let s = TestServer::try_start_in(dir, &config).await.expect("start");
    // The first request's batch goes out and hangs.
    assert_eq!(get(s.addr(), "/ctx/", &[]).await.status, StatusCode::OK);
    let deadline = Instant::now() + Duration::from_secs(10);
    while held.lock().unwrap().is_empty() {
        assert!(Instant::now() < deadline, "the exporter never connected");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let started = Instant::now();
    for _ in 0..30 {
        let r = get(s.addr(), "/ctx/", &[]).await;
        assert_eq!(r.status, StatusCode::OK);
    }
    let m = s.metrics().await;
    // 4 requests wait in the queue; the other 26 were dropped (5 spans each).
    assert_eq!(
        metric_value(&m, "tern_trace_spans_dropped_total{reason=\"queue_full\"}"),
        130.0,
        "{m}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
}

/// An OTLP endpoint that answers the export requests it gets with `answers` in turn (status,
/// `Retry-After`), then 200; it keeps the bodies.
async fn answering(
    answers: &'static [(u16, Option<&'static str>)],
) -> (SocketAddr, Arc<Mutex<Vec<Bytes>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let got = bodies.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let got = got.clone();
            let service =
                hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let got = got.clone();
                    async move {
                        let body = req
                            .into_body()
                            .collect()
                            .await
                            .map(|b| b.to_bytes())
                            .unwrap_or_default();
                        let n = {
                            let mut got = got.lock().unwrap();
                            got.push(body);
                            got.len() - 1
                        };
                        let (status, after) = answers.get(n).copied().unwrap_or((200, None));
                        let mut resp = Response::new(Full::new(Bytes::from_static(b"")));
                        *resp.status_mut() = StatusCode::from_u16(status).unwrap();
                        if let Some(after) = after {
                            resp.headers_mut()
                                .insert(http::header::RETRY_AFTER, after.parse().unwrap());
                        }
                        Ok::<_, Infallible>(resp)
                    }
                });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service),
            );
        }
    });
    (addr, bodies)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_collector_gets_the_batch_again_and_a_refusing_one_loses_it() {
    for (answers, posts, exported, dropped) in [
        // Busy twice (once saying when to come back): the third time it is taken.
        (&[(503, None), (429, Some("0"))][..], 3, 5.0, 0.0),
        // Busy past the retries: dropped after four tries.
        (
            &[(503, None), (502, None), (504, None), (503, None)][..],
            4,
            0.0,
            5.0,
        ),
        // Refused (a bad request is not sent again).
        (&[(400, None)][..], 1, 0.0, 5.0),
    ] {
        let (addr, bodies) = answering(answers).await;
        let dir = tempfile::tempdir().unwrap();
        test_guest(dir.path(), "context");
        let config = format!(
            "[pool]\ninstances = 16\nmax_memory_mib = 64\n\
             [tracing]\nendpoint = \"http://{addr}\"\nbatch_delay_ms = 50\n\
             [[tenant]]\nname = \"ctx\"\nmodule = \"context.wasm\"\npaths = [\"/ctx\"]\n"
        );
        let s = TestServer::try_start_in(dir, &config).await.expect("start");
        assert_eq!(get(s.addr(), "/ctx/", &[]).await.status, StatusCode::OK);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let m = s.metrics().await;
            let sent = metric_value(&m, "tern_trace_spans_exported_total");
            let failed = metric_value(
                &m,
                "tern_trace_spans_dropped_total{reason=\"export_failed\"}",
            );
            if sent + failed > 0.0 {
                assert_eq!((sent, failed), (exported, dropped), "{answers:?}: {m}");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{answers:?}: nothing counted: {m}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let bodies = bodies.lock().unwrap().clone();
        assert_eq!(bodies.len(), posts, "{answers:?}");
        assert!(!bodies[0].is_empty());
        assert!(
            bodies.iter().all(|b| *b == bodies[0]),
            "the same batch each time"
        );
    }
}

#[test]
fn tern_serve_exports_to_the_collector_named_by_the_standard_environment() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let collector = rt.block_on(Collector::start());
    let cache = tempfile::tempdir().unwrap();
    let endpoint = collector.endpoint.clone();
    let tern = TernProcess::serve_with(&[], cache.path(), |cmd| {
        cmd.env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
            .env("OTEL_SERVICE_NAME", "edge-test")
            .env("OTEL_BSP_SCHEDULE_DELAY", "50")
            .env("TERN_LOG", "info,tern::access=info");
    });
    let addr: SocketAddr = tern.addr.parse().unwrap();
    let r = rt.block_on(get(addr, "/hello", &[]));
    assert_eq!(r.status, StatusCode::OK);
    let trace = r.header("x-request-id").to_string();
    // The access line carries the trace id.
    let access = tern.wait_for("request_id=");
    assert!(
        access.contains(&format!("trace_id=\"{trace}\"")),
        "{access}"
    );
    let spans = rt.block_on(collector.trace(&trace, 5));
    let server = named(&spans, "GET /hello");
    assert_eq!(
        server.resource.get("service.name").map(String::as_str),
        Some("edge-test")
    );
    assert_eq!(server.attr("tern.tenant"), "hello");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_answered_during_a_graceful_shutdown_are_exported() {
    let collector = Collector::start().await;
    let dir = tempfile::tempdir().unwrap();
    test_guest(dir.path(), "cpu_burn");
    // Nothing is exported on the schedule in this test: only the exporter's last rounds.
    let config = format!(
        "[pool]\ninstances = 16\nmax_memory_mib = 64\n\
         [tracing]\nendpoint = \"{}\"\nbatch_delay_ms = 600000\n\
         [[tenant]]\nname = \"slow\"\nmodule = \"cpu_burn.wasm\"\npaths = [\"/burn\"]\n",
        collector.endpoint
    );
    let s = TestServer::try_start_in(dir, &config).await.expect("start");
    let addr = s.addr();
    let slow = tokio::spawn(async move { get(addr, "/burn?ms=700", &[]).await });
    s.wait_metric("tern_requests_in_flight", 1.0).await;
    s.running.shutdown.trigger();
    let r = slow.await.unwrap();
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let spans = collector.trace(r.header("x-request-id"), 5).await;
    assert_eq!(
        named(&spans, "GET /burn").attr("http.response.status_code"),
        "200"
    );
}
