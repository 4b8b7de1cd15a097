//! Traces against a real OpenTelemetry Collector (built by `bash scripts/test` from
//! scripts/otelcol-builder.yaml): Tern exports OTLP/HTTP protobuf to the collector's OTLP
//! receiver, and the collector's `otlphttp` exporter hands the spans on, as OTLP JSON, to a
//! small receiver inside the test, which reads them back.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;

use crate::outbound::Backend;
use crate::support::{
    TernProcess, TestServer, free_port, metric_value, send, test_component, test_guest, tools_dir,
};

mod exemplars;
mod export;

/// The collector the suite builds (the builder's version and the components' in the manifest).
const OTELCOL: &str = "otelcol-0.165.0/otelcol-tern";

/// A tenant's secret, which no span may hold.
const SECRET: &str = "sk-live-TRACESECRET-99";

/// One span as the collector exported it.
#[derive(Debug, Clone)]
struct Span {
    trace: String,
    id: String,
    parent: String,
    trace_state: String,
    name: String,
    kind: u64,
    start: u64,
    end: u64,
    attrs: HashMap<String, String>,
    status: u64,
    status_message: String,
    events: Vec<(String, HashMap<String, String>)>,
    resource: HashMap<String, String>,
}

impl Span {
    fn attr(&self, key: &str) -> &str {
        self.attrs.get(key).map_or("", String::as_str)
    }
}

fn attributes(list: &serde_json::Value) -> HashMap<String, String> {
    list.as_array()
        .into_iter()
        .flatten()
        .map(|kv| {
            let v = &kv["value"];
            let text = v["stringValue"]
                .as_str()
                .map(str::to_string)
                .or_else(|| v["intValue"].as_str().map(str::to_string))
                .or_else(|| v["intValue"].as_i64().map(|n| n.to_string()))
                .or_else(|| v["boolValue"].as_bool().map(|b| b.to_string()))
                .unwrap_or_default();
            (kv["key"].as_str().unwrap_or_default().to_string(), text)
        })
        .collect()
}

fn number(v: &serde_json::Value) -> u64 {
    v.as_str()
        .and_then(|s| s.parse().ok())
        .or_else(|| v.as_u64())
        .unwrap_or(0)
}

/// The spans of an OTLP JSON `ExportTraceServiceRequest`.
fn spans_of(body: &serde_json::Value) -> Vec<Span> {
    let mut out = Vec::new();
    for rs in body["resourceSpans"].as_array().into_iter().flatten() {
        let resource = attributes(&rs["resource"]["attributes"]);
        for ss in rs["scopeSpans"].as_array().into_iter().flatten() {
            for s in ss["spans"].as_array().into_iter().flatten() {
                out.push(Span {
                    trace: s["traceId"].as_str().unwrap_or_default().to_string(),
                    id: s["spanId"].as_str().unwrap_or_default().to_string(),
                    parent: s["parentSpanId"].as_str().unwrap_or_default().to_string(),
                    trace_state: s["traceState"].as_str().unwrap_or_default().to_string(),
                    name: s["name"].as_str().unwrap_or_default().to_string(),
                    kind: s["kind"].as_u64().unwrap_or(0),
                    start: number(&s["startTimeUnixNano"]),
                    end: number(&s["endTimeUnixNano"]),
                    attrs: attributes(&s["attributes"]),
                    status: s["status"]["code"].as_u64().unwrap_or(0),
                    status_message: s["status"]["message"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    events: s["events"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|e| {
                            (
                                e["name"].as_str().unwrap_or_default().to_string(),
                                attributes(&e["attributes"]),
                            )
                        })
                        .collect(),
                    resource: resource.clone(),
                });
            }
        }
    }
    out
}

/// A running collector and the spans it has exported so far.
struct Collector {
    child: std::process::Child,
    /// Its OTLP/HTTP receiver (what `[tracing] endpoint` names).
    endpoint: String,
    spans: Arc<Mutex<Vec<Span>>>,
    _dir: tempfile::TempDir,
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Collector {
    async fn start() -> Self {
        let bin = tools_dir().join(OTELCOL);
        assert!(
            bin.exists(),
            "the OpenTelemetry Collector is not built at {} (bash scripts/test builds it)",
            bin.display()
        );
        // The test's receiver of what the collector exports.
        let spans = Arc::new(Mutex::new(Vec::new()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let sink = listener.local_addr().unwrap();
        let got = spans.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let got = got.clone();
                let service =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let got = got.clone();
                        async move {
                            let body = req.into_body().collect().await.map(|b| b.to_bytes());
                            if let Ok(body) = body
                                && let Ok(json) = serde_json::from_slice::<serde_json::Value>(&body)
                            {
                                got.lock().unwrap().extend(spans_of(&json));
                            }
                            let mut resp = Response::new(Full::new(Bytes::from_static(b"{}")));
                            resp.headers_mut().insert(
                                http::header::CONTENT_TYPE,
                                http::HeaderValue::from_static("application/json"),
                            );
                            Ok::<_, Infallible>(resp)
                        }
                    });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service),
                );
            }
        });
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let config = format!(
            "receivers:\n  otlp:\n    protocols:\n      http:\n        endpoint: 127.0.0.1:{port}\n\
             processors:\n  batch:\n    timeout: 50ms\n\
             exporters:\n  debug:\n    verbosity: basic\n  otlphttp:\n    \
             traces_endpoint: http://{sink}/v1/traces\n    encoding: json\n    compression: none\n\
             service:\n  telemetry:\n    metrics:\n      level: none\n    logs:\n      level: warn\n\
             \x20 pipelines:\n    traces:\n      receivers: [otlp]\n      processors: [batch]\n      \
             exporters: [otlphttp, debug]\n"
        );
        let path = dir.path().join("otelcol.yaml");
        std::fs::write(&path, config).unwrap();
        let child = std::process::Command::new(&bin)
            .arg("--config")
            .arg(&path)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start the collector");
        let c = Self {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
            spans,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            assert!(Instant::now() < deadline, "the collector never listened");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        c
    }

    fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }

    /// The spans of trace `trace` once there are at least `n` of them (within 20 s).
    async fn trace(&self, trace: &str, n: usize) -> Vec<Span> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let spans: Vec<Span> = self
                .spans()
                .into_iter()
                .filter(|s| s.trace == trace)
                .collect();
            if spans.len() >= n {
                return spans;
            }
            assert!(
                Instant::now() < deadline,
                "trace {trace}: {} spans arrived, {n} expected: {spans:#?}",
                spans.len()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The one span named `name`.
fn named<'a>(spans: &'a [Span], name: &str) -> &'a Span {
    let found: Vec<&Span> = spans.iter().filter(|s| s.name == name).collect();
    assert_eq!(found.len(), 1, "one span {name:?} in {spans:#?}");
    found[0]
}

/// The span id a `traceparent` names, after checking it belongs to `trace`.
fn parent_in(traceparent: &str, trace: &str) -> String {
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{traceparent}");
    assert_eq!(parts[1], trace, "{traceparent}");
    parts[2].to_string()
}

/// The value of line `KEY=value` of the `context` guest's answer.
fn line<'a>(text: &'a str, key: &str) -> &'a str {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in {text}"))
}

async fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> crate::support::Reply {
    send(addr, Method::GET, path, None, headers, Bytes::new()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_is_a_server_span_with_its_phases_joined_to_the_callers_trace() {
    let collector = Collector::start().await;
    let dir = tempfile::tempdir().unwrap();
    test_guest(dir.path(), "context");
    test_guest(dir.path(), "cgi_probe");
    test_component(dir.path(), "component");
    let config = format!(
        "[pool]\ninstances = 16\nmax_memory_mib = 64\n\
         [tracing]\nendpoint = \"{}\"\nbatch_delay_ms = 50\n\
         [[tenant]]\nname = \"ctx\"\nmodule = \"context.wasm\"\npaths = [\"/ctx\"]\n\
         [[tenant]]\nname = \"cgi\"\nmodule = \"cgi_probe.wasm\"\npaths = [\"/cgi\"]\n\
         [tenant.variables]\napi_key = {{ secret_file = \"api-key\" }}\n\
         [[tenant]]\nname = \"comp\"\nmodule = \"component.wasm\"\npaths = [\"/component\"]\n\
         [[tenant]]\nname = \"cached\"\nmodule = \"context.wasm\"\npaths = [\"/cached\"]\n\
         [tenant.cache]\nenabled = true\n",
        collector.endpoint
    );
    std::fs::write(dir.path().join("api-key"), SECRET).unwrap();
    let s = TestServer::try_start_in(dir, &config).await.expect("start");

    // A request without trace context starts a trace; its id is the request id.
    let r = get(s.addr(), "/ctx/x?y=1", &[("user-agent", "trace-test")]).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let trace = r.header("x-request-id").to_string();
    assert_eq!(trace.len(), 32, "{trace}");
    let text = r.text();
    let seen_parent = parent_in(line(&text, "TRACEPARENT"), &trace);
    assert!(line(&text, "TRACEPARENT").ends_with("-01"), "{text}");
    let spans = collector.trace(&trace, 5).await;
    let server = named(&spans, "GET /ctx");
    assert_eq!(server.kind, 2, "server kind");
    assert_eq!(server.parent, "", "a new trace's root");
    for (k, v) in [
        ("http.request.method", "GET"),
        ("http.route", "/ctx"),
        ("http.response.status_code", "200"),
        ("url.path", "/ctx/x"),
        ("url.scheme", "http"),
        ("network.protocol.version", "1.1"),
        ("client.address", "127.0.0.1"),
        ("user_agent.original", "trace-test"),
        ("tern.tenant", "ctx"),
        ("tern.tenant.version", "config"),
        ("tern.guest.kind", "tern"),
        ("tern.request_id", trace.as_str()),
    ] {
        assert_eq!(server.attr(k), v, "{k} of {server:#?}");
    }
    assert_eq!(
        server.attr("tern.cache_status"),
        "",
        "no cache, no attribute"
    );
    // A cached tenant's span says what its cache did.
    let r = get(s.addr(), "/cached/x", &[]).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let cached = collector.trace(r.header("x-request-id"), 5).await;
    assert_eq!(
        named(&cached, "GET /cached").attr("tern.cache_status"),
        "tern; fwd=uri-miss"
    );
    assert_eq!(
        server.resource.get("service.name").map(String::as_str),
        Some("tern")
    );
    assert_eq!(server.status, 0, "an answered request is no error");
    let phases: Vec<&Span> = ["queue", "instantiate", "run", "teardown"]
        .iter()
        .map(|p| named(&spans, p))
        .collect();
    for p in &phases {
        assert_eq!(p.parent, server.id, "{} is the server span's child", p.name);
        assert!(
            server.start <= p.start && p.end <= server.end + 1_000_000,
            "{} lies within the request: {server:#?} {p:#?}",
            p.name
        );
    }
    // In order: instantiate, then run, then teardown.
    assert!(phases[1].end <= phases[2].start && phases[2].end <= phases[3].start);
    // The guest saw its run span as its parent.
    assert_eq!(named(&spans, "run").id, seen_parent);

    // A caller's trace context is continued: same trace, the caller's span the parent, and
    // the component sees the trace in its `traceparent` header.
    let caller_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller_span = "00f067aa0ba902b7";
    let tp = format!("00-{caller_trace}-{caller_span}-01");
    let r = get(
        s.addr(),
        "/component/info",
        &[("traceparent", &tp), ("tracestate", "vendor=opaque")],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.header("x-request-id"), caller_trace);
    let info = r.text();
    let guest_tp = info
        .split(" traceparent=")
        .nth(1)
        .unwrap_or_else(|| panic!("the component saw no traceparent: {info}"))
        .trim();
    let guest_parent = parent_in(guest_tp, caller_trace);
    let spans = collector.trace(caller_trace, 5).await;
    let server = named(&spans, "GET /component");
    assert_eq!(server.parent, caller_span);
    assert_eq!(server.trace_state, "vendor=opaque");
    assert_eq!(server.attr("tern.guest.kind"), "wasi-http");
    assert_eq!(named(&spans, "run").id, guest_parent);

    // A CGI program has it as HTTP_TRACEPARENT.
    let r = get(s.addr(), "/cgi/env", &[]).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let trace = r.header("x-request-id").to_string();
    let cgi_parent = parent_in(line(&r.text(), "HTTP_TRACEPARENT"), &trace);
    let spans = collector.trace(&trace, 5).await;
    assert_eq!(named(&spans, "run").id, cgi_parent);
    assert_eq!(named(&spans, "GET /cgi").attr("tern.guest.kind"), "cgi");
    // Its secret is in its environment, and in no span.
    assert!(
        r.text().contains(&format!("API_KEY={SECRET}\n")),
        "{}",
        r.text()
    );
    let exported = format!("{spans:?}");
    assert!(!exported.contains(SECRET), "{exported}");

    // A client's own request id stays the request id; the trace is new and the log and spans
    // carry both.
    let r = get(s.addr(), "/ctx/", &[("x-request-id", "client-chosen-1")]).await;
    assert_eq!(r.header("x-request-id"), "client-chosen-1");
    let trace = parent_trace(line(&r.text(), "TRACEPARENT"));
    let spans = collector.trace(&trace, 5).await;
    assert_eq!(
        named(&spans, "GET /ctx").attr("tern.request_id"),
        "client-chosen-1"
    );

    // Unrouted: a server span alone, no tenant.
    let r = get(s.addr(), "/nowhere", &[]).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let spans = collector.trace(r.header("x-request-id"), 1).await;
    let server = named(&spans, "GET");
    assert_eq!(server.attr("http.response.status_code"), "404");
    assert_eq!(server.attr("tern.tenant"), "");

    let m = s.metrics().await;
    assert!(
        metric_value(&m, "tern_trace_spans_exported_total") >= 21.0,
        "{m}"
    );
    assert_eq!(
        metric_value(&m, "tern_trace_spans_dropped_total{reason=\"queue_full\"}"),
        0.0
    );
}

/// The trace id of a `traceparent`.
fn parent_trace(traceparent: &str) -> String {
    traceparent
        .split('-')
        .nth(1)
        .expect("a trace id")
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_see_the_client_span_and_key_value_calls_are_spans() {
    let collector = Collector::start().await;
    let backend = Backend::start().await;
    let dir = tempfile::tempdir().unwrap();
    test_guest(dir.path(), "outbound_probe");
    test_guest(dir.path(), "kv_probe");
    let config = format!(
        "[pool]\ninstances = 16\nmax_memory_mib = 64\n\
         [tracing]\nendpoint = \"{}\"\nbatch_delay_ms = 50\n\
         [[tenant]]\nname = \"probe\"\nmodule = \"outbound_probe.wasm\"\npaths = [\"/probe\"]\n\
         [tenant.outbound.backends.origin]\nurl = \"http://{}\"\n\
         [tenant.outbound.backends.down]\nurl = \"http://127.0.0.1:{}\"\n\
         [[tenant]]\nname = \"kv\"\nmodule = \"kv_probe.wasm\"\npaths = [\"/kv\"]\nkv = [\"default\"]\n",
        collector.endpoint,
        backend.addr,
        free_port()
    );
    let s = TestServer::try_start_in(dir, &config).await.expect("start");

    let r = get(s.addr(), "/probe?backend=origin&path=/hello&times=2", &[]).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let trace = r.header("x-request-id").to_string();
    let text = r.text();
    // What the backend saw, for each of the two requests.
    let sent: Vec<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("traceparent: "))
        .map(|tp| parent_in(tp, &trace))
        .collect();
    assert_eq!(sent.len(), 2, "{text}");
    assert_ne!(sent[0], sent[1], "each request is its own span");
    let spans = collector.trace(&trace, 7).await;
    let run = named(&spans, "run");
    let clients: Vec<&Span> = spans.iter().filter(|s| s.kind == 3).collect();
    assert_eq!(clients.len(), 2, "{spans:#?}");
    for (c, seen) in clients.iter().zip(&sent) {
        assert_eq!(&c.id, seen, "the backend's parent is the client span");
        assert_eq!(c.parent, run.id, "calls are the run span's children");
        assert_eq!(c.name, "GET");
        assert_eq!(c.attr("tern.backend"), "origin");
        assert_eq!(c.attr("http.response.status_code"), "200");
        assert_eq!(c.attr("server.address"), "127.0.0.1");
        assert!(c.attr("url.full").ends_with("/hello"), "{c:#?}");
        assert!(run.start <= c.start && c.end <= run.end, "{run:#?} {c:#?}");
    }

    // A backend that cannot be reached: an error client span saying why.
    let r = get(s.addr(), "/probe?backend=down&path=/", &[]).await;
    assert!(r.text().starts_with("error="), "{}", r.text());
    let spans = collector.trace(r.header("x-request-id"), 6).await;
    let client = spans.iter().find(|s| s.kind == 3).expect("a client span");
    assert_eq!(client.status, 2, "{client:#?}");
    assert!(
        client
            .status_message
            .contains("connecting to the backend failed"),
        "{client:#?}"
    );

    // Key-value operations.
    let r = get(s.addr(), "/kv?op=set:k:v&op=get:k&op=get:k", &[]).await;
    assert_eq!(r.text(), "ok\nv\nv\n");
    let spans = collector.trace(r.header("x-request-id"), 8).await;
    let run = named(&spans, "run");
    let set = named(&spans, "set default");
    assert_eq!(set.parent, run.id);
    assert_eq!(set.kind, 3);
    assert_eq!(set.attr("db.system.name"), "sqlite");
    assert_eq!(set.attr("db.namespace"), "default");
    assert_eq!(set.attr("db.operation.name"), "set");
    assert_eq!(spans.iter().filter(|s| s.name == "get default").count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_and_slow_requests_are_kept_when_sampling_drops_the_rest() {
    let collector = Collector::start().await;
    let dir = tempfile::tempdir().unwrap();
    test_guest(dir.path(), "context");
    test_guest(dir.path(), "panic");
    test_guest(dir.path(), "loop_forever");
    test_guest(dir.path(), "cpu_burn");
    let config = format!(
        "[pool]\ninstances = 16\nmax_memory_mib = 64\n\
         [tracing]\nendpoint = \"{}\"\nbatch_delay_ms = 50\n\
         sampler = \"parentbased_traceidratio\"\nsampler_arg = 0.0\nkeep_slower_than_ms = 400\n\
         [[tenant]]\nname = \"ctx\"\nmodule = \"context.wasm\"\npaths = [\"/ctx\"]\n\
         [tenant.limits]\nmax_request_bytes = 10\n\
         [[tenant]]\nname = \"trap\"\nmodule = \"panic.wasm\"\npaths = [\"/trap\"]\n\
         [[tenant]]\nname = \"deadline\"\nmodule = \"loop_forever.wasm\"\npaths = [\"/loop\"]\n\
         [tenant.limits]\ntimeout_ms = 200\n\
         [[tenant]]\nname = \"slow\"\nmodule = \"cpu_burn.wasm\"\npaths = [\"/burn\"]\n",
        collector.endpoint
    );
    let s = TestServer::try_start_in(dir, &config).await.expect("start");

    // Not sampled: no trace, but the guest still gets the context (flag 00).
    let r = get(s.addr(), "/ctx/", &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    let dropped_trace = r.header("x-request-id").to_string();
    assert!(
        line(&r.text(), "TRACEPARENT").ends_with("-00"),
        "{}",
        r.text()
    );
    // A caller that sampled its trace decides (parent-based); one that did not, too.
    let kept = "0af7651916cd43dd8448eb211c80319c";
    let tp = format!("00-{kept}-b7ad6b7169203331-01");
    let r = get(s.addr(), "/ctx/", &[("traceparent", &tp)]).await;
    assert!(
        line(&r.text(), "TRACEPARENT").ends_with("-01"),
        "{}",
        r.text()
    );
    let not_kept = "1af7651916cd43dd8448eb211c80319c";
    let tp = format!("00-{not_kept}-b7ad6b7169203331-00");
    get(s.addr(), "/ctx/", &[("traceparent", &tp)]).await;

    // A client's oversized body is its own error, not the server's: not kept.
    let r = send(
        s.addr(),
        Method::POST,
        "/ctx/",
        None,
        &[],
        Bytes::from(vec![b'x'; 100]),
    )
    .await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    let client_error = r.header("x-request-id").to_string();

    // A trap: kept, an error, the outcome an event; the error page names the trace.
    let r = get(s.addr(), "/trap", &[]).await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    let trap_trace = r.header("x-request-id").to_string();
    assert!(
        r.text().contains(&format!("request id: {trap_trace}")),
        "{}",
        r.text()
    );
    let spans = collector.trace(&trap_trace, 5).await;
    let server = named(&spans, "GET /trap");
    assert_eq!(server.status, 2, "{server:#?}");
    assert_eq!(server.attr("tern.outcome"), "trap_unreachable");
    assert!(
        server.status_message.contains("guest trapped"),
        "{server:#?}"
    );
    let (event, attrs) = &server.events[0];
    assert_eq!(event, "trap_unreachable");
    assert!(attrs["message"].contains("unreachable"), "{attrs:?}");
    assert_eq!(named(&spans, "run").status, 2);

    // The deadline: kept, 504, outcome timeout.
    let r = get(s.addr(), "/loop", &[("x-request-id", "deadline-1")]).await;
    assert_eq!(r.status, StatusCode::GATEWAY_TIMEOUT);
    // The client chose the request id: the error page gives the trace id beside it.
    let deadline_trace = r
        .text()
        .split("trace id ")
        .nth(1)
        .map(|t| t[..32].to_string())
        .unwrap_or_else(|| panic!("no trace id in {}", r.text()));
    let spans = collector.trace(&deadline_trace, 5).await;
    let server = named(&spans, "GET /loop");
    assert_eq!(server.attr("tern.outcome"), "timeout");
    assert_eq!(server.attr("http.response.status_code"), "504");
    assert_eq!(server.attr("tern.request_id"), "deadline-1");

    // Slow but fine: kept.
    let r = get(s.addr(), "/burn?ms=500", &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    let spans = collector.trace(r.header("x-request-id"), 5).await;
    let server = named(&spans, "GET /burn");
    assert_eq!(server.status, 0);
    assert!(server.end - server.start >= 400_000_000, "{server:#?}");

    collector.trace(kept, 5).await;
    // Everything above has arrived (in order): the unsampled requests never will.
    let traces: Vec<String> = collector.spans().into_iter().map(|s| s.trace).collect();
    assert!(
        !traces.contains(&dropped_trace),
        "an unsampled request was exported"
    );
    assert!(
        !traces.iter().any(|t| t == not_kept),
        "the caller's 00 was ignored"
    );
    assert!(
        !traces.contains(&client_error),
        "a client's 413 was kept as an error"
    );
}

/// A WebSocket's opening is a server span that lasts until the connection closed, with its
/// close code and the bytes sent to the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websockets_span_lasts_until_it_closes() {
    use crate::websocket_autobahn::{frame, open_with, read_frame};
    use tokio::io::AsyncWriteExt;
    let collector = Collector::start().await;
    let dir = tempfile::tempdir().unwrap();
    test_guest(dir.path(), "ws_events");
    let config = format!(
        "[pool]\ninstances = 16\nmax_memory_mib = 64\n\
         [tracing]\nendpoint = \"{}\"\nbatch_delay_ms = 50\n\
         [[tenant]]\nname = \"chat\"\nmodule = \"ws_events.wasm\"\npaths = [\"/chat\"]\n\
         [tenant.websocket]\nmode = \"events\"\n",
        collector.endpoint
    );
    let s = TestServer::try_start_in(dir, &config).await.expect("start");
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let (mut ws, mut buf) = open_with(
        s.addr(),
        "/chat?grip=no",
        &format!("traceparent: 00-{trace}-00f067aa0ba902b7-01\r\n"),
    )
    .await
    .unwrap();
    ws.write_all(&frame(0x81, b"hi")).await.unwrap();
    let (_, _, echo) = read_frame(&mut ws, &mut buf).await.unwrap().unwrap();
    assert_eq!(echo, b"hi");
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The batch's span is exported once it ran; the connection's not while it is open.
    let batch = collector.trace(trace, 1).await;
    assert!(
        batch
            .iter()
            .filter(|s| s.kind == 2)
            .all(|s| s.name == "POST /chat"),
        "{batch:#?}"
    );
    ws.write_all(&frame(0x88, &4000u16.to_be_bytes()))
        .await
        .unwrap();
    let (_, opcode, _) = read_frame(&mut ws, &mut buf).await.unwrap().unwrap();
    assert_eq!(opcode, 8);
    let deadline = Instant::now() + Duration::from_secs(20);
    let spans = loop {
        let spans = collector.trace(trace, 1).await;
        if spans.iter().any(|s| s.name == "GET /chat") {
            break spans;
        }
        assert!(
            Instant::now() < deadline,
            "no span of the opening: {spans:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let server = named(&spans, "GET /chat");
    assert_eq!(server.parent, "00f067aa0ba902b7", "{server:#?}");
    assert_eq!(
        server.attr("http.response.status_code"),
        "101",
        "{server:#?}"
    );
    assert_eq!(server.attr("tern.tenant"), "chat", "{server:#?}");
    assert_eq!(
        server.attr("tern.websocket.close_code"),
        "4000",
        "{server:#?}"
    );
    // welcome (2 + 7) + hi (2 + 2) + the close (2 + 2), as sent.
    assert_eq!(
        server.attr("tern.websocket.bytes_sent"),
        "17",
        "{server:#?}"
    );
    assert!(
        server.end - server.start >= 500_000_000,
        "the span lasts the connection's time: {server:#?}"
    );
    // Each batch (the message, the close) is a span of the connection's.
    let batches: Vec<&Span> = spans.iter().filter(|s| s.name == "POST /chat").collect();
    assert!(batches.len() >= 2, "{spans:#?}");
    assert!(
        batches.iter().all(|b| b.parent == server.id && b.kind == 2),
        "{spans:#?}"
    );
}

/// A scheduled run is traced like a request, its server span saying `tern.trigger =
/// "schedule"` (a client's request's says nothing of it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_runs_span_says_it_was_scheduled() {
    let collector = Collector::start().await;
    let dir = tempfile::tempdir().unwrap();
    test_guest(dir.path(), "context");
    let config = format!(
        "[pool]\ninstances = 16\nmax_memory_mib = 64\n\
         [tracing]\nendpoint = \"{}\"\nbatch_delay_ms = 50\n\
         [[tenant]]\nname = \"ctx\"\nmodule = \"context.wasm\"\npaths = [\"/ctx\"]\n\
         [[tenant.schedule]]\nname = \"yearly\"\ncron = \"0 0 1 1 *\"\npath = \"/ctx/tick\"\n",
        collector.endpoint
    );
    let s = TestServer::try_start_in(dir, &config).await.expect("start");
    let r = get(s.addr(), "/ctx/client", &[]).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let client_trace = r.header("x-request-id").to_string();
    let (status, v) = s
        .admin_call(
            Method::POST,
            "/admin/v1/tenants/ctx/schedules/run",
            r#"{"schedule": "yearly"}"#,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let deadline = Instant::now() + Duration::from_secs(20);
    let scheduled = loop {
        if let Some(span) = collector
            .spans()
            .into_iter()
            .find(|s| s.name == "POST /ctx" && s.kind == 2)
        {
            break span;
        }
        assert!(Instant::now() < deadline, "{:#?}", collector.spans());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(scheduled.attr("tern.trigger"), "schedule", "{scheduled:#?}");
    assert_eq!(scheduled.attr("url.path"), "/ctx/tick", "{scheduled:#?}");
    let spans = collector.trace(&client_trace, 1).await;
    let client = named(&spans, "GET /ctx");
    assert!(!client.attrs.contains_key("tern.trigger"), "{client:#?}");
}
