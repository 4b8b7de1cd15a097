//! `/metrics` speaks the Prometheus text format and shows every phase of the tenant just called.

use bytes::Bytes;
use http::{Method, StatusCode};

use crate::support::{TestServer, metric_is, send};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_show_every_phase_and_the_tenant() {
    let s = TestServer::demo().await;
    for _ in 0..5 {
        assert_eq!(s.get("/hello").await.status, StatusCode::OK);
    }
    let r = send(s.admin(), Method::GET, "/metrics", None, &[], Bytes::new()).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        r.header("content-type"),
        "text/plain; version=0.0.4; charset=utf-8"
    );
    let m = r.text();
    for phase in ["route", "queue", "instantiate", "run", "teardown"] {
        let line = format!(
            "tern_request_phase_duration_seconds_count{{deployment=\"current\",phase=\"{phase}\"}} 5"
        );
        assert!(m.contains(&line), "missing {line}");
    }
    // Buckets start in the microseconds.
    assert!(
        m.contains(r#"tern_request_phase_duration_seconds_bucket{deployment="current",phase="teardown",le="0.000001"}"#)
    );
    assert!(
        metric_is(&m, "tern_request_duration_seconds_count", 5.0),
        "{m}"
    );
    assert!(metric_is(
        &m,
        r#"tern_requests_total{deployment="current",status="2xx",tenant="hello",trigger="request",version="1.1"}"#,
        5.0
    ));
    assert!(metric_is(
        &m,
        r#"tern_guest_outcomes_total{outcome="ok",tenant="hello"}"#,
        5.0
    ));
    crate::support::assert_slots_free(&m);
    assert!(m.contains("process_resident_memory_bytes"));
    // In-flight and queue gauges return to zero; every guest's peak memory is recorded; the
    // eight demo modules were compiled into a fresh cache; warm slots report resident bytes.
    assert!(metric_is(&m, "tern_requests_in_flight", 0.0), "{m}");
    assert!(metric_is(&m, "tern_queue_depth", 0.0), "{m}");
    assert!(
        metric_is(&m, "tern_guest_memory_peak_bytes_count", 5.0),
        "{m}"
    );
    assert!(
        metric_is(&m, "tern_module_compile_duration_seconds_count", 8.0),
        "{m}"
    );
    assert!(
        m.contains(r#"tern_pool_resident_bytes{kind="memories"}"#),
        "{m}"
    );
    assert!(
        metric_is(
            &m,
            r#"tern_deploys_total{outcome="ok",tenant="hello"}"#,
            1.0
        ),
        "{m}"
    );
    // Requests are counted by HTTP version too; a version never seen has no series.
    assert!(!m.contains(r#"version="2""#), "{m}");
    let r = crate::support::send_h2(s.addr(), "/hello").await;
    assert_eq!(r.status, StatusCode::OK);
    let m = s.metrics().await;
    for (version, n) in [("2", 1.0), ("1.1", 5.0)] {
        let series = format!(
            r#"tern_requests_total{{deployment="current",status="2xx",tenant="hello",trigger="request",version="{version}"}}"#
        );
        assert_eq!(crate::support::metric_value(&m, &series), n, "{m}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_routes_are_only_on_the_admin_listener() {
    let s = TestServer::demo().await;
    let r = send(s.admin(), Method::GET, "/healthz", None, &[], Bytes::new()).await;
    assert_eq!((r.status, r.text().as_str()), (StatusCode::OK, "ok\n"));
    let r = send(s.admin(), Method::GET, "/readyz", None, &[], Bytes::new()).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(s.get("/metrics").await.status, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_past_the_label_cap_count_as_other() {
    let dir = tempfile::tempdir().unwrap();
    let config = "[server]\nmax_tenant_labels = 1\n\
                  [[tenant]]\nname = \"first\"\nmodule = \"builtin:hello\"\npaths = [\"/a\"]\n\
                  [[tenant]]\nname = \"second\"\nmodule = \"builtin:hello\"\npaths = [\"/b\"]\n";
    let s = TestServer::try_start_in(dir, config).await.expect("start");
    assert_eq!(s.get("/a").await.status, StatusCode::OK);
    assert_eq!(s.get("/b").await.status, StatusCode::OK);
    let m = s.metrics().await;
    assert!(
        metric_is(
            &m,
            r#"tern_requests_total{deployment="current",status="2xx",tenant="first",trigger="request",version="1.1"}"#,
            1.0
        ),
        "{m}"
    );
    assert!(
        metric_is(
            &m,
            r#"tern_requests_total{deployment="current",status="2xx",tenant="other",trigger="request",version="1.1"}"#,
            1.0
        ),
        "{m}"
    );
    assert!(!m.contains("tenant=\"second\""), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promtool_finds_nothing_wrong_with_live_metrics() {
    use std::io::Write;
    let s = TestServer::demo().await;
    assert_eq!(s.get("/hello").await.status, StatusCode::OK);
    assert_eq!(s.get("/nowhere").await.status, StatusCode::NOT_FOUND);
    let text = s.metrics().await;
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool is required (Debian package `prometheus`; scripts/test installs it)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && report.trim().is_empty(),
        "promtool: {report}"
    );
}
