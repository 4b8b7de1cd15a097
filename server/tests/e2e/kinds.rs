//! Guest kinds side by side: `tern` modules, `wasi:http` components and CGI programs in one
//! server; each kind's request in, answer out, limits and failures, detection and `kind`.

use bytes::Bytes;
use http::{Method, StatusCode};

use crate::support::{
    TestServer, c_program, metric_value, post, raw, send, test_component, test_guest,
};

/// A config serving all three kinds: `tern` (the SDK's hello), a component, C and Rust CGI.
const THREE_KINDS: &str = r#"
[pool]
instances = 16
max_memory_mib = 64

[[tenant]]
name = "native"
module = "builtin:hello"
paths = ["/native"]

[[tenant]]
name = "component"
module = "component.wasm"
paths = ["/component"]
[tenant.limits]
timeout_ms = 1000
max_memory_mib = 16

[[tenant]]
name = "component-dev"
module = "component.wasm"
paths = ["/dev"]
errors = "dev"

[[tenant]]
name = "c-cgi"
module = "cgi-c.wasm"
paths = ["/c"]

[[tenant]]
name = "rust-cgi"
module = "builtin:cgi"
paths = ["/rust"]
env = { GREETING = "from the tenant's env", REQUEST_METHOD = "not this" }
"#;

async fn three_kinds() -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    test_component(dir.path(), "component");
    c_program(dir.path(), "guest-sdk/examples/c/cgi.c", "cgi-c");
    TestServer::try_start_in(dir, THREE_KINDS)
        .await
        .expect("start")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_kinds_serve_side_by_side() {
    let s = three_kinds().await;
    let r = s.get("/native").await;
    assert_eq!(
        (r.status, r.text().as_str()),
        (StatusCode::OK, "Hello from Tern!\n")
    );

    let r = s.get("/component/hello").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.text(), "Hello from a component!\n");
    assert_eq!(r.header("x-kind"), "wasi-http");
    assert_eq!(r.header("content-length"), "24");
    // Every phase of the shared lifecycle is timed for components too.
    for phase in ["queue", "instantiate", "run", "teardown"] {
        assert!(
            r.header("server-timing").contains(phase),
            "{}",
            r.header("server-timing")
        );
    }

    let r = s.get("/c/a/b%20c?x=1").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("x-program"), "cgi.c");
    assert_eq!(
        r.text(),
        "Hello from C over CGI on Tern!\nmethod=GET script=/c path=/a/b c query=x=1\nbody=0 bytes\n"
    );

    let r = s.get("/rust").await;
    assert_eq!(r.text(), "Hello from a CGI program on Tern!\n");
    let r = s.get("/rust/nope").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);

    // Many requests of each kind at once, interleaved: each gets a fresh instance.
    let mut tasks = Vec::new();
    for i in 0..48 {
        let addr = s.addr();
        tasks.push(tokio::spawn(async move {
            let path = ["/native", "/component/hello", "/c/x", "/rust"][i % 4];
            send(addr, Method::GET, path, None, &[], Bytes::new())
                .await
                .status
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), StatusCode::OK);
    }
    let m = s.metrics().await;
    for tenant in ["native", "component", "c-cgi", "rust-cgi"] {
        let ok = metric_value(
            &m,
            &format!(r#"tern_guest_outcomes_total{{outcome="ok",tenant="{tenant}"}}"#),
        );
        assert!(ok >= 12.0, "{tenant}: {ok}");
    }
    crate::support::assert_slots_free(&m);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cgi_programs_get_rfc_3875_variables_and_stream_both_ways() {
    let s = three_kinds().await;
    let r = send(
        s.addr(),
        Method::GET,
        "/rust/env?a=1&b=two",
        Some("example.test:8443"),
        &[
            ("x-test", "yes"),
            ("proxy", "http://evil.test"),
            ("cookie", "a=1"),
        ],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let env = r.text();
    for line in [
        "GATEWAY_INTERFACE=CGI/1.1",
        "REQUEST_METHOD=GET",
        "SCRIPT_NAME=/rust",
        "PATH_INFO=/env",
        "QUERY_STRING=a=1&b=two",
        "REQUEST_URI=/rust/env?a=1&b=two",
        "SERVER_NAME=example.test",
        "SERVER_PORT=8443",
        "SERVER_PROTOCOL=HTTP/1.1",
        "REMOTE_ADDR=127.0.0.1",
        "HTTP_X_TEST=yes",
        "HTTP_COOKIE=a=1",
        "GREETING=from the tenant's env",
        "X_RAW_PATH_INFO=/env",
        "X_MATCHED_ROUTE=/rust/...",
        "X_FULL_URL=http://example.test:8443/rust/env?a=1&b=two",
    ] {
        assert!(env.lines().any(|l| l == line), "no {line:?} in:\n{env}");
    }
    // A client's `Proxy` header never becomes HTTP_PROXY; meta-variables beat the tenant env.
    assert!(!env.contains("HTTP_PROXY"), "{env}");
    assert!(!env.contains("not this"), "{env}");
    assert!(!env.contains("CONTENT_LENGTH"), "{env}");

    let r = post(
        &s,
        "/rust/env",
        &[("content-type", "text/csv")],
        b"a,b".to_vec(),
    )
    .await;
    let env = r.text();
    assert!(env.lines().any(|l| l == "CONTENT_LENGTH=3"), "{env}");
    assert!(env.lines().any(|l| l == "CONTENT_TYPE=text/csv"), "{env}");
    assert!(env.lines().any(|l| l == "REQUEST_METHOD=POST"), "{env}");

    // 3 MB through stdin and stdout: more than the response buffer, streamed both ways.
    let body: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let r = post(&s, "/rust/echo", &[], body.clone()).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("content-type"), "application/octet-stream");
    assert_eq!(r.body.len(), body.len());
    assert!(r.body == body, "the echoed body differs");
    // The C program reads its stdin to the end.
    let r = post(&s, "/c/upload", &[], vec![7u8; 100_000]).await;
    assert!(r.text().ends_with("body=100000 bytes\n"), "{}", r.text());
    // An empty body is an immediate end of stdin.
    let r = post(&s, "/rust/echo", &[], Vec::new()).await;
    assert_eq!((r.status, r.body.len()), (StatusCode::OK, 0));
}

/// GETs `path` over a raw connection and checks that the answer started (`200`) but its
/// chunked body was cut: it never reaches the final empty chunk, so no client takes it for
/// complete.
async fn assert_cut(s: &TestServer, path: &str) {
    assert_cut_with(s, path, "HTTP/1.1 200").await;
}

/// [`assert_cut`] for an answer whose head starts with `status_line`.
async fn assert_cut_with(s: &TestServer, path: &str, status_line: &str) {
    let reply = raw(
        s.addr(),
        format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"),
    )
    .await;
    assert!(
        reply.starts_with(status_line),
        "{path}: {}",
        &reply[..reply.len().min(200)]
    );
    assert!(
        !reply.ends_with("0\r\n\r\n"),
        "{path}: a cut body must not end cleanly"
    );
}

/// A POST of `n` bytes sent chunked (no length declared up front).
async fn post_chunked(s: &TestServer, path: &str, n: usize) -> crate::support::Reply {
    post(s, path, &[("transfer-encoding", "chunked")], vec![0u8; n]).await
}

/// A server with the CGI probe program at `/p`, limits as given.
async fn probe(limits: &str) -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    test_guest(dir.path(), "cgi_probe");
    let config = format!(
        "[pool]\ninstances = 8\nmax_memory_mib = 64\n[[tenant]]\nname = \"probe\"\n\
         module = \"cgi_probe.wasm\"\npaths = [\"/p\"]\n[tenant.limits]\n{limits}\n"
    );
    TestServer::try_start_in(dir, &config).await.expect("start")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_cgi_output_is_502_with_the_reason() {
    let s = probe("").await;
    for (path, reason) in [
        ("/p/raw", "must start with headers"),
        ("/p/nothing", "wrote nothing to stdout"),
        ("/p/bad-status", "not a three-digit status"),
        ("/p/huge-header", "header block passed 65536 bytes"),
        (
            "/p/exit-early",
            "exited with status 3 before its header block ended",
        ),
    ] {
        let r = s.get(path).await;
        assert_eq!(r.status, StatusCode::BAD_GATEWAY, "{path}: {}", r.text());
        assert!(r.text().contains(reason), "{path}: {}", r.text());
    }
    // A complete answer stands whatever the exit status; a header block ended by the end of
    // the output is complete; `Location` alone redirects.
    let r = s.get("/p/exit-after").await;
    assert_eq!(
        (r.status, r.text().as_str()),
        (StatusCode::OK, "complete\n")
    );
    let r = s.get("/p/headers-only").await;
    assert_eq!((r.status, r.body.len()), (StatusCode::NO_CONTENT, 0));
    let r = s.get("/p/location").await;
    assert_eq!(
        (r.status, r.header("location")),
        (StatusCode::FOUND, "/elsewhere")
    );
    let m = s.metrics().await;
    assert_eq!(
        metric_value(
            &m,
            r#"tern_guest_outcomes_total{outcome="bad_output",tenant="probe"}"#
        ),
        5.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cgi_programs_get_wagi_arguments() {
    let s = probe("").await;
    // The path, then the query split at `&`, undecoded (as WAGI gives them).
    let r = s.get("/p/args?name=Ada%20L&x&=").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.text(), "/p/args\nname=Ada%20L\nx\n=\n");
    // No query (or an empty one): the path alone.
    assert_eq!(s.get("/p/args").await.text(), "/p/args\n");
    assert_eq!(s.get("/p/args?").await.text(), "/p/args\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cgi_bodies_at_the_stream_threshold_and_the_limits() {
    let s = probe("max_request_bytes = 10000\nmax_response_bytes = 200000").await;
    // Up to 64 KiB a CGI answer is buffered (Content-Length); one byte more streams.
    for n in [0usize, 65_535, 65_536, 65_537, 199_999] {
        let r = s.get(&format!("/p/big?n={n}")).await;
        assert_eq!((r.status, r.body.len()), (StatusCode::OK, n), "n={n}");
        let length = r.header("content-length");
        if n <= 65_536 {
            assert_eq!(length, n.to_string(), "n={n}");
        } else {
            assert_eq!(length, "", "n={n}");
        }
    }
    // Past the response limit: the program's write fails and the client sees an error (the
    // head is already out, so the body is cut).
    assert_cut(&s, "/p/big?n=200001").await;
    // The request body limit holds for stdin: 413, whatever the program made of the error.
    let r = post(&s, "/p/read", &[], vec![1u8; 9_999]).await;
    assert_eq!(r.text(), "read 9999 bytes\n");
    let r = post_chunked(&s, "/p/read", 20_000).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", r.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn component_bodies_stream_both_ways_at_every_size() {
    let s = three_kinds().await;
    for n in [0usize, 1, 65_535, 65_536, 65_537, 1_000_000] {
        let r = s.get(&format!("/component/big?n={n}")).await;
        assert_eq!((r.status, r.body.len()), (StatusCode::OK, n), "n={n}");
        assert!(r.body.iter().all(|&b| b == b'x'));
        if n <= 65_536 {
            assert_eq!(r.header("content-length"), n.to_string(), "n={n}");
        }
    }
    let body: Vec<u8> = (0..2_000_000u32).map(|i| (i % 253) as u8).collect();
    let r = post(&s, "/component/echo", &[], body.clone()).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(
        r.body == body,
        "echoed {} bytes of {}",
        r.body.len(),
        body.len()
    );
    let r = post(
        &s,
        "/component/info?q=1",
        &[("x-test", "t")],
        vec![0u8; 1234],
    )
    .await;
    assert_eq!(
        r.text(),
        "method=Method::Post path=/component/info?q=1 x-test=t spin-path-info=/info body=1234 scheme=http\n"
    );
    // The status the component sets is the status sent.
    assert_eq!(
        s.get("/component/status?code=418").await.status.as_u16(),
        418
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_components_get_defined_statuses_and_the_pool_survives() {
    let s = three_kinds().await;
    let cases = [
        (
            "/component/panic",
            StatusCode::INTERNAL_SERVER_ERROR,
            "trap_unreachable",
        ),
        ("/component/loop", StatusCode::GATEWAY_TIMEOUT, "timeout"),
        (
            "/component/bomb",
            StatusCode::INTERNAL_SERVER_ERROR,
            "memory_limit",
        ),
        ("/component/none", StatusCode::BAD_GATEWAY, "bad_output"),
        // Returned with the outparam neither set nor dropped: nothing more can come, so the
        // answer is at once, not at the deadline (1 s here) as a 504.
        (
            "/component/forgotten",
            StatusCode::BAD_GATEWAY,
            "bad_output",
        ),
        // Returned without finishing the body (componentize-js when the JavaScript throws):
        // the body is incomplete by wasi:http's rules, and the answer is at once.
        (
            "/component/unfinished?n=100",
            StatusCode::BAD_GATEWAY,
            "bad_output",
        ),
    ];
    for (path, status, _) in cases {
        let r = s.get(path).await;
        assert_eq!(r.status, status, "{path}: {}", r.text());
    }
    let r = s.get("/component/bomb").await;
    assert!(r.text().contains("memory limit (16 MiB)"), "{}", r.text());
    let r = s.get("/component/none").await;
    assert!(
        r.text().contains("without setting a response"),
        "{}",
        r.text()
    );
    let r = s.get("/component/unfinished?n=0").await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY, "{}", r.text());
    assert!(
        r.text().contains("without finishing its response body"),
        "{}",
        r.text()
    );
    // A trap after the head and 100 KiB of body: the client sees a cut body, never a clean end.
    assert_cut(&s, "/component/trap-mid").await;
    // So does a body left unfinished after its head was sent (past 64 KiB it streams).
    assert_cut_with(&s, "/component/unfinished?n=100000", "HTTP/1.1 500").await;
    // The pool and every other tenant carry on.
    for _ in 0..20 {
        assert_eq!(s.get("/component/hello").await.status, StatusCode::OK);
        assert_eq!(s.get("/native").await.status, StatusCode::OK);
    }
    let m = s.metrics().await;
    for (_, _, outcome) in cases {
        let n = metric_value(
            &m,
            &format!(r#"tern_guest_outcomes_total{{outcome="{outcome}",tenant="component"}}"#),
        );
        assert!(n >= 1.0, "{outcome}: {n}");
    }
    crate::support::assert_slots_free(&m);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn component_request_bodies_over_the_limit_are_413() {
    let dir = tempfile::tempdir().unwrap();
    test_component(dir.path(), "component");
    let config = "[pool]\ninstances = 4\nmax_memory_mib = 64\n[[tenant]]\nname = \"c\"\n\
                  module = \"component.wasm\"\n[tenant.limits]\nmax_request_bytes = 1000\n";
    let s = TestServer::try_start_in(dir, config).await.expect("start");
    let r = post(&s, "/info", &[], vec![0u8; 1000]).await;
    assert_eq!(
        r.text(),
        "method=Method::Post path=/info x-test= spin-path-info=/info body=1000 scheme=http\n"
    );
    // Declared too large: refused before any instance; streamed too large: 413 all the same.
    let r = post(&s, "/info", &[], vec![0u8; 1001]).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    let r = post_chunked(&s, "/info", 5000).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", r.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn component_outgoing_requests_follow_the_tenant_policy() {
    let backend = crate::outbound::Backend::start().await;
    let dir = tempfile::tempdir().unwrap();
    test_component(dir.path(), "component");
    let config = format!(
        "[pool]\ninstances = 4\nmax_memory_mib = 64\n\
         [[tenant]]\nname = \"closed\"\nmodule = \"component.wasm\"\npaths = [\"/closed\"]\n\
         [[tenant]]\nname = \"open\"\nmodule = \"component.wasm\"\npaths = [\"/open\"]\n\
         [tenant.outbound]\nmax_requests = 1\n\
         [tenant.outbound.backends.origin]\nurl = \"http://{0}\"\n\
         [tenant.outbound.backends.slow]\nurl = \"http://{0}\"\nfirst_byte_timeout_ms = 200\n",
        backend.addr
    );
    let s = TestServer::try_start_in(dir, &config).await.expect("start");
    // The head wait is first_byte_timeout_ms from the request's sending (not plus the connect
    // timeout): a head 1 s late is a timeout.
    let r = s.get("/open/fetch?url=http://slow/late").await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY, "{}", r.text());
    assert!(r.text().contains("ConnectionReadTimeout"), "{}", r.text());
    // Deny by default: no backends, no allowed hosts.
    let direct = format!("/closed/fetch?url=http://{}/hello", backend.addr);
    let r = s.get(&direct).await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY);
    assert!(r.text().contains("HttpRequestDenied"), "{}", r.text());
    // A private address is not reachable by URL even where backends exist...
    let r = s.get(&direct.replace("/closed/", "/open/")).await;
    assert!(r.text().contains("HttpRequestDenied"), "{}", r.text());
    // ...but the backend is, by its name.
    let r = s.get("/open/fetch?url=http://origin/hello").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert!(r.text().starts_with("backend said 200: hi"), "{}", r.text());
    // The request went through Tern's client: CDN-Loop added, counted in the metrics.
    assert!(
        r.text().to_ascii_lowercase().contains("cdn-loop: tern"),
        "{}",
        r.text()
    );
    let m = s.metrics().await;
    assert_eq!(
        metric_value(
            &m,
            r#"tern_outbound_requests_total{backend="origin",status="2xx",tenant="open"}"#
        ),
        1.0,
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_failing_mid_upload_aborts_the_backends_request() {
    let backend = crate::outbound::Backend::start().await;
    let dir = tempfile::tempdir().unwrap();
    test_component(dir.path(), "component");
    let config = format!(
        "[pool]\ninstances = 4\nmax_memory_mib = 64\n\
         [[tenant]]\nname = \"up\"\nmodule = \"component.wasm\"\n\
         [tenant.outbound]\nmax_request_bytes = 1000000\n\
         [tenant.outbound.backends.origin]\nurl = \"http://{}\"\n",
        backend.addr
    );
    let s = TestServer::try_start_in(dir, &config).await.expect("start");
    // A finished body arrives whole (more than the body channel holds, so it streams).
    let r = s.get("/upload?url=http://origin/echo&n=50000").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.text(), "backend said 200: 50000 bytes");
    assert_eq!(backend.aborted(), 0);
    // A guest that traps before finishing it: the backend sees the request fail, never a
    // complete-looking shorter body.
    let r = s.get("/upload?url=http://origin/echo&n=50000&trap=1").await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "{}", r.text());
    backend.await_abort(0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kinds_are_detected_or_chosen_and_mismatches_refused() {
    let s = TestServer::start("").await;
    let dir = tempfile::tempdir().unwrap();
    let component = std::fs::read(test_component(dir.path(), "c")).unwrap();
    // The test component imports WASI 0.2.12, newer than wasmtime 48's 0.2.6: served all the
    // same (0.2.x imports match by semver).
    assert!(
        component
            .windows(22)
            .any(|w| w == b"wasi:http/types@0.2.12"),
        "the test component should import WASI 0.2.12 (server/guests/component/Cargo.lock)"
    );
    let v = s.deploy("comp", "/comp", &component).await;
    assert_eq!(v["kind"], "wasi-http");
    assert_eq!(
        s.get("/comp/hello").await.text(),
        "Hello from a component!\n"
    );
    let cgi = tern::demo::module("cgi").unwrap();
    assert_eq!(s.deploy("cgi", "/cgi", cgi).await["kind"], "cgi");
    assert_eq!(s.deploy_as("cgi", "/cgi", cgi, "cgi").await["kind"], "cgi");

    let refused = |kind: &'static str, wasm: Vec<u8>| {
        let s = &s;
        async move {
            s.admin_call(
                Method::PUT,
                &format!("/admin/v1/tenants/comp/module?kind={kind}"),
                wasm,
            )
            .await
        }
    };
    let (status, v) = refused("cgi", component.clone()).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("needs a core module"),
        "{v}"
    );
    let (status, v) = refused("wasi-http", cgi.to_vec()).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("needs a component"),
        "{v}"
    );
    let (status, v) = refused("lambda", cgi.to_vec()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("unknown guest kind"),
        "{v}"
    );
    // A component that is not a wasi:http proxy says what it exports and what Tern expects.
    let empty = wat::parse_str("(component)").unwrap();
    let (status, v) = refused("wasi-http", empty).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    let e = v["error"].as_str().unwrap();
    assert!(
        e.contains("does not export `wasi:http/incoming-handler`")
            && e.contains("exports: nothing"),
        "{e}"
    );
    // Another platform's host API is named, with what Tern provides instead.
    let spin = wat::parse_str(
        r#"(component
            (import "fermyon:spin/sqlite@2.0.0" (instance (export "open" (func))))
            (instance $handler)
            (export "wasi:http/incoming-handler@0.2.0" (instance $handler)))"#,
    )
    .unwrap();
    let (status, v) = refused("wasi-http", spin).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    let e = v["error"].as_str().unwrap();
    assert!(
        e.contains("fermyon:spin/sqlite") && e.contains("not other platforms' host APIs"),
        "{e}"
    );
    // Every refusal left the serving version alone.
    assert_eq!(
        s.get("/comp/hello").await.text(),
        "Hello from a component!\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_is_redeployed_under_load_without_a_failed_request() {
    let s = TestServer::start("").await;
    let dir = tempfile::tempdir().unwrap();
    let test = std::fs::read(test_component(dir.path(), "c")).unwrap();
    let example = tern::demo::module("wasi-http").unwrap().to_vec();
    s.deploy("app", "/app", &test).await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut load = Vec::new();
    for _ in 0..4 {
        let (addr, stop) = (s.addr(), stop.clone());
        load.push(tokio::spawn(async move {
            let mut conn = crate::support::Conn::open(addr).await;
            let mut seen = std::collections::BTreeSet::new();
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let r = conn.get("/app/hello").await;
                assert_eq!(r.status, StatusCode::OK, "{}", r.text());
                seen.insert(r.text());
                n += 1;
            }
            (n, seen)
        }));
    }
    for wasm in [&example, &test, &example] {
        tokio::time::sleep(std::time::Duration::from_millis(150)).await;
        s.deploy("app", "/app", wasm).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(150)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut bodies = std::collections::BTreeSet::new();
    for l in load {
        let (n, seen) = l.await.unwrap();
        assert!(n > 0);
        bodies.extend(seen);
    }
    // Both versions answered, and no request failed on the way.
    assert!(bodies.contains("Hello from a component!\n"), "{bodies:?}");
    assert!(
        bodies.contains("Hello from a wasi:http component on Tern!\n"),
        "{bodies:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_is_compiled_ahead_of_time_and_served_from_its_sealed_artifact() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = test_component(dir.path(), "component");
    let cwasm = dir.path().join("component.cwasm");
    let out = crate::support::tern_bin()
        .arg("compile")
        .arg(&wasm)
        .arg("-o")
        .arg(&cwasm)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{said}");
    assert!(said.contains("kind wasi-http"), "{said}");
    // A modified artifact is refused at start-up; the sealed one serves.
    let mut bytes = std::fs::read(&cwasm).unwrap();
    let other = tempfile::tempdir().unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0xff;
    std::fs::write(other.path().join("component.cwasm"), &bytes).unwrap();
    let config = "[pool]\ninstances = 4\nmax_memory_mib = 64\n[[tenant]]\nname = \"c\"\n\
                  module = \"component.cwasm\"\n";
    let e = TestServer::try_start_in(other, config)
        .await
        .err()
        .expect("refused");
    assert!(format!("{e:#}").contains("do not match its seal"), "{e:#}");
    let s = TestServer::try_start_in(dir, config).await.expect("start");
    assert_eq!(s.get("/hello").await.text(), "Hello from a component!\n");
}

/// The lifecycle example (`phases`) runs many requests in one task, which uses up tokio's
/// cooperative budget: a component's answer must still be taken then (a budget-limited channel
/// poll once passed for "the component returned without setting a response").
#[test]
fn the_lifecycle_example_runs_every_kind_many_times_in_one_task() {
    let exe =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release/examples/phases");
    assert!(
        exe.exists(),
        "{} is built by `cargo test --release` (examples are built with the tests)",
        exe.display()
    );
    for guest in ["builtin:hello", "builtin:wasi-http", "builtin:cgi"] {
        let out = std::process::Command::new(&exe)
            .args([guest, "300"])
            .output()
            .expect("run phases");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains(&format!("300 requests of {guest}")),
            "{guest}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
