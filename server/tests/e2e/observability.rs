//! The shipped observability kit is checked by real tools: the Grafana dashboard's structure and
//! every PromQL expression (against live metric names and `promtool check rules`), and a real
//! Prometheus server scraping a running Tern with the shipped scrape config.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use http::StatusCode;

use crate::support::TestServer;

/// `promtool check rules FILE` succeeds (promtool: Debian's `prometheus`, which scripts/test
/// installs).
fn promtool_check_rules(file: &std::path::Path) {
    crate::support::ran(
        std::process::Command::new("promtool")
            .args(["check", "rules"])
            .arg(file),
    );
}

fn repo_file(path: &str) -> String {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Every `(panel id, refId, expr)` of the dashboard, with annotation queries as panel 0.
fn dashboard_queries(d: &serde_json::Value) -> Vec<(u64, String, String)> {
    let mut out = Vec::new();
    for (i, a) in d["annotations"]["list"]
        .as_array()
        .expect("annotations")
        .iter()
        .enumerate()
    {
        if let Some(expr) = a["expr"].as_str() {
            assert_eq!(
                a["datasource"]["uid"], "${datasource}",
                "annotation {}",
                a["name"]
            );
            out.push((0, format!("annotation{i}"), expr.to_string()));
        }
    }
    for p in d["panels"].as_array().expect("panels") {
        let id = p["id"].as_u64().expect("panel id");
        for t in p["targets"].as_array().expect("targets") {
            out.push((
                id,
                t["refId"].as_str().expect("refId").to_string(),
                t["expr"].as_str().expect("expr").to_string(),
            ));
        }
    }
    out
}

/// Metric names in a PromQL expression (ours and the process collector's).
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let rest = &expr[i..];
        let boundary = i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_');
        if boundary && (rest.starts_with("tern_") || rest.starts_with("process_")) {
            let len = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            names.push(rest[..len].to_string());
            i += len;
        } else {
            i += 1;
        }
    }
    names
}

/// The expression as Prometheus would see it once Grafana substitutes its variables.
fn substituted(expr: &str) -> String {
    expr.replace("$__rate_interval", "1m")
        .replace("$tenant", ".*")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grafana_dashboard_is_well_formed_and_queries_only_real_metrics() {
    let d: serde_json::Value =
        serde_json::from_str(&repo_file("deploy/grafana/dashboards/tern.json"))
            .expect("dashboard is JSON");
    // Unique panel ids, refIds unique within a panel, every query on the templated datasource.
    let mut ids = HashSet::new();
    for p in d["panels"].as_array().unwrap() {
        assert!(
            ids.insert(p["id"].as_u64().unwrap()),
            "duplicate panel id {}",
            p["id"]
        );
        assert_eq!(
            p["datasource"]["uid"], "${datasource}",
            "panel {}",
            p["title"]
        );
        let mut refs = HashSet::new();
        for t in p["targets"].as_array().unwrap() {
            assert!(
                refs.insert(t["refId"].as_str().unwrap()),
                "duplicate refId in {}",
                p["title"]
            );
            assert_eq!(t["datasource"]["uid"], "${datasource}");
        }
        assert!(!refs.is_empty(), "panel {} has no queries", p["title"]);
    }
    let vars = d["templating"]["list"].as_array().unwrap();
    assert!(vars.iter().any(|v| v["name"] == "datasource"
        && v["type"] == "datasource"
        && v["query"] == "prometheus"));

    // Every metric a query names is exported by a live server.
    let live = live_metrics().await;
    let exported = exported_names(&live);
    let queries = dashboard_queries(&d);
    assert!(queries.len() >= 10);
    assert!(
        queries
            .iter()
            .any(|(id, _, e)| *id == 0 && e.contains("tern_deploys_total")),
        "deploys are annotations"
    );
    for (id, refid, expr) in &queries {
        let names = metric_names(expr);
        assert!(
            !names.is_empty(),
            "panel {id}/{refid} names no metric: {expr}"
        );
        for n in names {
            assert!(
                exported.contains(n.as_str()),
                "panel {id}/{refid}: {n} is not exported"
            );
        }
    }

    // Every expression parses: as recording rules, checked by promtool.
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (id, refid, expr) in &queries {
        let expr = substituted(expr).replace('\'', "''");
        rules.push_str(&format!(
            "      - record: dashboard:panel{id}_{refid}\n        expr: '{expr}'\n"
        ));
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rules.yml");
    std::fs::write(&file, rules).unwrap();
    promtool_check_rules(&file);
}

/// The metrics of the demo after a request, and of a server with a TLS listener serving a
/// certificate (its expiry).
async fn live_metrics() -> String {
    let s = TestServer::demo().await;
    assert_eq!(s.get("/hello").await.status, StatusCode::OK);
    let dir = tempfile::tempdir().unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["a.test".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    std::fs::write(dir.path().join("a.crt"), cert.pem()).unwrap();
    std::fs::write(dir.path().join("a.key"), key.serialize_pem()).unwrap();
    let tls = TestServer::try_start_in(
        dir,
        "[server]\ntls_listen = \"127.0.0.1:0\"\n[pool]\ninstances = 4\nmax_memory_mib = 64\n\
         [[certificate]]\ncert = \"a.crt\"\nkey = \"a.key\"\n\
         [[tenant]]\nname = \"cached\"\nmodule = \"builtin:hello\"\npaths = [\"/cached\"]\n\
         [tenant.cache]\nenabled = true\n\
         [[tenant.rate_limit]]\nname = \"rl\"\nrate = \"1000/s\"\n\
         [[tenant]]\nname = \"calls\"\nmodule = \"builtin:proxy\"\npaths = [\"/calls\"]\n\
         [tenant.cache]\nenabled = true\nmax_mib = 1\n\
         [tenant.outbound.backends.origin]\nurl = \"http://127.0.0.1:9\"\ncache = true\n",
    )
    .await
    .unwrap();
    // Outbound metrics appear once a guest called a backend (a cached one: its cache's as it
    // loads); nothing listens on port 9.
    assert_eq!(tls.get("/calls/x").await.status, StatusCode::BAD_GATEWAY);
    // A cached tenant's metrics appear once it served a request and was purged.
    assert_eq!(tls.get("/cached").await.status, StatusCode::OK);
    let (status, v) = tls
        .admin_call(
            http::Method::POST,
            "/admin/v1/tenants/cached/cache/purge",
            r#"{"all": true}"#,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    s.metrics().await + &tls.metrics().await
}

fn exported_names(metrics: &str) -> HashSet<&str> {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_alerts_are_valid_rules_on_real_metrics() {
    let file =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/prometheus/alerts.yml");
    promtool_check_rules(&file);
    let rules = repo_file("deploy/prometheus/alerts.yml");
    let live = live_metrics().await;
    let exported = exported_names(&live);
    let exprs: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("expr: "))
        .collect();
    assert!(exprs.len() >= 3, "{rules}");
    for expr in exprs {
        for n in metric_names(expr) {
            // The ACME order counter appears once a server orders (tested in acme.rs).
            assert!(
                exported.contains(n.as_str()) || n == "tern_acme_orders_total",
                "alert {expr}: {n} is not exported"
            );
        }
    }
    assert!(
        repo_file("deploy/prometheus/prometheus.yml").contains("- alerts.yml"),
        "prometheus.yml loads the alerts"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_scrapes_tern_and_answers_a_per_phase_p99() {
    let s = TestServer::demo().await;
    let dir = tempfile::tempdir().unwrap();
    // The shipped scrape config, pointed at this server and scraping every second.
    let config = repo_file("deploy/prometheus/prometheus.yml")
        .replace("127.0.0.1:9090", &s.admin().to_string())
        .replace("scrape_interval: 15s", "scrape_interval: 1s");
    assert!(
        config.contains(&s.admin().to_string()),
        "scrape target not found in the shipped config"
    );
    std::fs::write(dir.path().join("prometheus.yml"), config).unwrap();
    std::fs::write(
        dir.path().join("alerts.yml"),
        repo_file("deploy/prometheus/alerts.yml"),
    )
    .unwrap();
    let prom = crate::support::Prometheus::start(dir.path(), &[]);

    let query = "histogram_quantile(0.99, sum by (le, phase) (rate(tern_request_phase_duration_seconds_bucket[1m])))";
    let url = format!("/api/v1/query?query={}", urlencode(query));
    let prom_addr = prom.addr;
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut last = String::new();
    loop {
        // Traffic between scrapes, so the rate has something to show.
        for _ in 0..20 {
            assert_eq!(s.get("/hello").await.status, StatusCode::OK);
        }
        if let Ok(Some(body)) =
            tokio::time::timeout(Duration::from_secs(5), try_get(prom_addr, &url)).await
        {
            {
                last = body.clone();
                let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
                let result = v["data"]["result"].as_array().cloned().unwrap_or_default();
                let phases: HashSet<String> = result
                    .iter()
                    .filter(|r| r["value"][1].as_str().is_some_and(|x| x != "NaN"))
                    .filter_map(|r| r["metric"]["phase"].as_str().map(str::to_string))
                    .collect();
                if ["route", "queue", "instantiate", "run", "teardown"]
                    .iter()
                    .all(|p| phases.contains(*p))
                {
                    break;
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus never answered a p99 for every phase: {last}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A GET that tolerates a server that is not up yet.
async fn try_get(addr: std::net::SocketAddr, path: &str) -> Option<String> {
    use http_body_util::BodyExt;
    let stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .ok()?;
    tokio::spawn(conn);
    let req = http::Request::get(path)
        .header("host", addr.to_string())
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .ok()?;
    let resp = sender.send_request(req).await.ok()?;
    let body = resp.into_body().collect().await.ok()?.to_bytes();
    Some(String::from_utf8_lossy(&body).into_owned())
}

/// Percent-encodes a query-string value.
fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The k6 binary: `$TERN_K6`, else `~/.cache/tern-tools/k6-1.8.1/k6` (where scripts/test builds
/// it), else PATH.
fn k6() -> std::path::PathBuf {
    if let Some(p) = std::env::var_os("TERN_K6") {
        return p.into();
    }
    let built = crate::support::tools_dir().join("k6-1.8.1/k6");
    if built.exists() {
        return built;
    }
    "k6".into()
}

#[test]
fn k6_smoke_script_passes_against_a_running_tern() {
    let dir = tempfile::tempdir().unwrap();
    let tern = crate::support::TernProcess::serve(&[], &dir.path().join("cache"));
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../loadtest/k6/smoke.js");
    let out = std::process::Command::new(k6())
        .args(["run", "--quiet", "--no-usage-report"])
        .arg(&script)
        .env("BASE_URL", format!("http://{}", tern.addr))
        .env("OUT_DIR", dir.path())
        .env("K6_NO_USAGE_REPORT", "true")
        .output()
        .expect(
            "k6 is required: scripts/test builds it into ~/.cache/tern-tools (go install go.k6.io/k6)",
        );
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "k6 smoke failed:\n{text}");
    // Our own summary writer produced both files, with the server-side phases parsed.
    let summary: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("smoke-summary.json")).unwrap(),
    )
    .unwrap();
    for phase in ["route", "queue", "instantiate", "run", "teardown", "total"] {
        let m = &summary["metrics"][format!("tern_server_{phase}_ms")]["values"];
        assert!(
            m["max"].as_f64().is_some(),
            "no {phase} timings in the k6 summary"
        );
    }
    assert_eq!(summary["metrics"]["checks"]["values"]["fails"], 0, "{text}");
    let txt = std::fs::read_to_string(dir.path().join("smoke-summary.txt")).unwrap();
    assert!(
        txt.contains("PASS threshold") && !txt.contains("FAIL threshold"),
        "{txt}"
    );
}
