//! Prometheus keeps the trace ids of traced requests as exemplars.

use super::*;

/// A GET with `accept`, its status, content type and body (`None` while nothing listens).
async fn fetch(addr: SocketAddr, path: &str, accept: &str) -> Option<(StatusCode, String, String)> {
    let stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .ok()?;
    tokio::spawn(conn);
    let req = http::Request::get(path)
        .header("host", addr.to_string())
        .header("accept", accept)
        .body(http_body_util::Empty::<Bytes>::new())
        .ok()?;
    let resp = sender.send_request(req).await.ok()?;
    let status = resp.status();
    let kind = resp
        .headers()
        .get(http::header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap_or_default().to_string())
        .unwrap_or_default();
    let body = resp.into_body().collect().await.ok()?.to_bytes();
    Some((status, kind, String::from_utf8_lossy(&body).into_owned()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_keeps_the_trace_ids_of_traced_requests_as_exemplars() {
    // No collector needed: exemplars name the kept requests whether or not export succeeds.
    let dir = tempfile::tempdir().unwrap();
    test_guest(dir.path(), "context");
    let config = format!(
        "[pool]\ninstances = 16\nmax_memory_mib = 64\n\
         [tracing]\nendpoint = \"http://127.0.0.1:{}\"\n\
         [[tenant]]\nname = \"ctx\"\nmodule = \"context.wasm\"\npaths = [\"/ctx\"]\n",
        free_port()
    );
    let s = TestServer::try_start_in(dir, &config).await.expect("start");
    let r = get(s.addr(), "/ctx/", &[]).await;
    let first = r.header("x-request-id").to_string();

    // Asked for OpenMetrics: exemplars on the latency buckets; asked for the text format: none.
    let openmetrics = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5";
    let (status, kind, body) = fetch(s.admin(), "/metrics", openmetrics).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert!(
        kind.starts_with("application/openmetrics-text; version=1.0.0"),
        "{kind}"
    );
    assert!(body.ends_with("# EOF\n"));
    assert!(body.contains("# TYPE tern_requests counter\n"), "{body}");
    let with_exemplar = |metric: &str| {
        body.lines()
            .any(|l| l.starts_with(metric) && l.contains(&format!("# {{trace_id=\"{first}\"}}")))
    };
    assert!(
        with_exemplar("tern_request_duration_seconds_bucket{"),
        "{body}"
    );
    assert!(
        with_exemplar(
            "tern_request_phase_duration_seconds_bucket{deployment=\"current\",phase=\"run\""
        ),
        "{body}"
    );
    let (_, kind, text) = fetch(s.admin(), "/metrics", "text/plain").await.unwrap();
    assert!(kind.starts_with("text/plain; version=0.0.4"), "{kind}");
    assert!(!text.contains("trace_id"));

    // A real Prometheus (it asks for OpenMetrics first) scrapes it and keeps the exemplars.
    let pdir = tempfile::tempdir().unwrap();
    let config = format!(
        "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: tern\n    \
         static_configs:\n      - targets: [\"{}\"]\n",
        s.admin()
    );
    std::fs::write(pdir.path().join("prometheus.yml"), config).unwrap();
    let prom =
        crate::support::Prometheus::start(pdir.path(), &["--enable-feature=exemplar-storage"]);
    let prom_addr = prom.addr;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = String::new();
    let mut sent = std::collections::HashSet::from([first.clone()]);
    loop {
        let r = get(s.addr(), "/ctx/", &[]).await;
        sent.insert(r.header("x-request-id").to_string());
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let path = format!(
            "/api/v1/query_exemplars?query=tern_request_phase_duration_seconds_bucket&start={}&end={}",
            now - 120,
            now + 60
        );
        if let Some((_, _, body)) = fetch(prom_addr, &path, "application/json").await {
            let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            let ids: Vec<String> = v["data"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|series| series["exemplars"].as_array().cloned().unwrap_or_default())
                .filter_map(|e| e["labels"]["trace_id"].as_str().map(str::to_string))
                .collect();
            // Trace ids of this server's requests (each request's id is its trace id).
            if ids.iter().any(|t| sent.contains(t)) {
                break;
            }
            last = body.chars().take(2000).collect();
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus kept no exemplar of ours: {last}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // The shipped dashboard shows them on its latency panels, and the shipped datasource makes
    // the label they carry a link to the trace.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("deploy/grafana/dashboards/tern.json")).unwrap(),
    )
    .unwrap();
    let latency: Vec<&serde_json::Value> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| {
            p["targets"].as_array().unwrap().iter().any(|t| {
                let e = t["expr"].as_str().unwrap_or_default();
                e.contains("tern_request_duration_seconds_bucket")
                    || e.contains("tern_request_phase_duration_seconds_bucket")
            })
        })
        .collect();
    assert!(!latency.is_empty());
    for p in latency {
        for t in p["targets"].as_array().unwrap() {
            assert_eq!(t["exemplar"], true, "panel {}: {t}", p["title"]);
        }
    }
    let datasources = std::fs::read_to_string(
        root.join("deploy/grafana/provisioning/datasources/prometheus.yaml"),
    )
    .unwrap();
    assert!(
        datasources.contains(
            "exemplarTraceIdDestinations:\n        - name: trace_id\n          datasourceUid: tempo"
        ),
        "{datasources}"
    );
    assert!(datasources.contains("uid: tempo"), "{datasources}");
}
