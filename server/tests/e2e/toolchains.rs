//! Guests built by other people's toolchains, as their users build them: Go's standard
//! library CGI (`GOOS=wasip1`), JavaScript through componentize-js, Python through
//! componentize-py, Spin's Rust SDK. Each found a wrong answer our own guests never showed.

use bytes::Bytes;
use http::{Method, StatusCode};

use crate::support::{
    H2Conn, TernDev, TestServer, go_program, js_component, python_component, raw, spin_module,
    spin_p3_component,
};

/// A POST of `n` bytes to `path`, sent chunked (no length declared) or with its length.
async fn post(s: &TestServer, path: &str, n: usize, chunked: bool) -> crate::support::Reply {
    let headers: &[(&str, &str)] = if chunked {
        &[("transfer-encoding", "chunked")]
    } else {
        &[]
    };
    crate::support::post(s, path, headers, vec![b'x'; n]).await
}

/// Checks that no pool slot is in use (every request's instance was torn down).
async fn assert_no_slot_held(s: &TestServer) {
    let m = s.metrics().await;
    crate::support::assert_slots_free(&m);
}

/// Creates tenant `name` at `/name` and deploys `wasm`, which must be refused with `422`; the
/// refusal's message.
async fn refused_deploy(s: &TestServer, name: &str, wasm: Vec<u8>) -> String {
    let spec = serde_json::json!({ "paths": [format!("/{name}")] }).to_string();
    let path = format!("/admin/v1/tenants/{name}");
    let (status, v) = s.admin_call(Method::PUT, &path, spec).await;
    assert!(status.is_success(), "{v}");
    let (status, v) = s
        .admin_call(Method::PUT, &format!("{path}/module"), wasm)
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    v["error"].as_str().unwrap().to_string()
}

/// A server with the Go CGI program at `/go`, its body limit 100,000 bytes.
async fn go_cgi() -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    go_program(dir.path(), "server/guests/go-cgi", "go-cgi");
    let config = "[pool]\ninstances = 4\nmax_memory_mib = 64\n\
         [[tenant]]\nname = \"go\"\nmodule = \"go-cgi.wasm\"\npaths = [\"/go\"]\n\
         [tenant.limits]\ntimeout_ms = 10000\nmax_request_bytes = 100000\n";
    TestServer::try_start_in(dir, config).await.expect("start")
}

/// The `key=value` lines of the Go program's answer.
fn field<'a>(text: &'a str, key: &str) -> &'a str {
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no {key} in {text:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_net_http_cgi_programs_read_every_request_right() {
    let s = go_cgi().await;
    let r = s.get("/go/hello").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.header("x-toolchain"), "go-net-http-cgi");
    let t = r.text();
    assert_eq!(
        (field(&t, "proto"), field(&t, "method"), field(&t, "path")),
        ("HTTP/1.1", "GET", "/go/hello")
    );
    assert_eq!(field(&t, "host"), "localhost");

    // HTTP/2: SERVER_PROTOCOL must be `HTTP/2.0` (RFC 3875's HTTP/x.y), which net/http/cgi
    // parses; `HTTP/2` made every HTTP/2 request a 502. The host comes from `:authority`.
    let mut h2 = H2Conn::open(s.addr()).await;
    let r = h2.get("/go/two").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let t = r.text();
    assert_eq!(field(&t, "proto"), "HTTP/2.0");
    assert_eq!(field(&t, "host"), s.addr().to_string());

    // HTTP/1.0.
    let reply = raw(s.addr(), "GET /go/old HTTP/1.0\r\nhost: x\r\n\r\n").await;
    assert!(reply.starts_with("HTTP/1.0 200"), "{reply}");
    assert!(reply.contains("proto=HTTP/1.0"), "{reply}");

    // A chunked upload reaches the program whole, with its length (RFC 3875 4.2): before,
    // it read nothing and answered 200, a silently lost upload.
    for n in [0usize, 1, 65_536, 99_999, 100_000] {
        let r = post(&s, "/go/up", n, true).await;
        assert_eq!(r.status, StatusCode::OK, "{n}: {}", r.text());
        let t = r.text();
        assert_eq!(field(&t, "read"), n.to_string(), "{t}");
        if n > 0 {
            assert_eq!(field(&t, "content-length"), n.to_string(), "{t}");
        }
    }
    // Past the limit: 413, and the program is not run.
    let r = post(&s, "/go/up", 100_001, true).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", r.text());
    // So does an HTTP/2 body sent without a content-length.
    let chunks = vec![
        Bytes::from(vec![b'c'; 40_000]),
        Bytes::from(vec![b'd'; 30_000]),
    ];
    let r = H2Conn::post_unsized(s.addr(), "/go/up", chunks).await;
    let t = r.text();
    assert_eq!(
        (field(&t, "read"), field(&t, "content-length")),
        ("70000", "70000"),
        "{t}"
    );
    // A sized body streams to the program as before.
    let r = post(&s, "/go/up", 70_000, false).await;
    let t = r.text();
    assert_eq!(
        (field(&t, "read"), field(&t, "content-length")),
        ("70000", "70000")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn componentize_js_handlers_are_served_and_a_throw_ends_at_once() {
    let dir = tempfile::tempdir().unwrap();
    js_component(dir.path(), "js");
    let config = "[pool]\ninstances = 4\nmax_memory_mib = 64\n\
         [[tenant]]\nname = \"js\"\nmodule = \"js.wasm\"\npaths = [\"/js\"]\n\
         [tenant.limits]\ntimeout_ms = 10000\n\
         [[tenant]]\nname = \"js-dev\"\nmodule = \"js.wasm\"\npaths = [\"/jsdev\"]\n\
         errors = \"dev\"\n[tenant.limits]\ntimeout_ms = 10000\n";
    let s = TestServer::try_start_in(dir, config).await.expect("start");
    let r = s.get("/js/hello").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.header("x-toolchain"), "componentize-js");
    assert_eq!(r.text(), "hello from javascript: GET /js/hello\n");
    for n in [0usize, 65_537, 300_000] {
        let r = post(&s, "/js/echo", n, false).await;
        assert_eq!(r.text(), format!("read {n} bytes\n"));
    }
    // A handler that throws: StarlingMonkey sets a 500 response and returns without finishing
    // its body. The request ends at once (it waited out the 10 s deadline and answered 504).
    for _ in 0..3 {
        let r = s.get("/js/throw").await;
        assert_eq!(r.status, StatusCode::BAD_GATEWAY, "{}", r.text());
        assert!(
            r.text().contains("without finishing its response body"),
            "{}",
            r.text()
        );
    }
    // In dev mode the answer carries the exception, from the guest's stderr.
    let r = s.get("/jsdev/throw").await;
    assert!(r.text().contains("thrown on purpose"), "{}", r.text());
    // The pool carries on; no slot is held.
    assert_eq!(s.get("/js/hello").await.status, StatusCode::OK);
    assert_no_slot_held(&s).await;
}

/// A denied `fetch` is a bare `NetworkError` inside the JavaScript; `tern dev` shows why.
#[test]
fn tern_dev_shows_why_an_outbound_request_was_refused() {
    let dir = tempfile::tempdir().unwrap();
    let js = js_component(dir.path(), "js");
    let dev = TernDev::start(&js, &dir.path().join("cache"));
    let r = dev.get("/fetch?url=http://example.com/x");
    assert!(r.starts_with("HTTP/1.1 502"), "{r}");
    assert!(r.contains("fetch failed"), "{r}");
    let line = dev.wait_for("outbound request refused");
    assert!(
        line.contains("example.com") && line.contains("request_id") && line.contains("tenant"),
        "{line}"
    );
}

/// spin-sdk 3.x and 5.x built for wasm32-wasip1 (as Spin's docs say) are core modules that
/// export the wasi:http handler by the component naming convention: served as components,
/// as Spin serves them. They were refused as "no _start export ... build it as a WASI command".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spin_sdk_wasip1_modules_are_served_as_components() {
    let s = TestServer::start("").await;
    let dir = tempfile::tempdir().unwrap();
    for sdk in [3, 5] {
        let wasm = std::fs::read(spin_module(dir.path(), sdk, "spin")).unwrap();
        let name = format!("spin{sdk}");
        let v = s.deploy(&name, &format!("/{name}"), &wasm).await;
        assert_eq!(v["kind"], "wasi-http", "{v}");
        let r = s.get(&format!("/{name}/x?y=1")).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        assert_eq!(r.header("x-toolchain"), format!("tern-spin-sdk{sdk}"));
        assert_eq!(
            r.text(),
            format!("hello from tern-spin-sdk{sdk}: GET /{name}/x body=0\n")
        );
        let r = post(&s, &format!("/{name}/up"), 70_000, true).await;
        assert!(r.text().ends_with("body=70000\n"), "{}", r.text());
        // The stored module is what was uploaded: a redeploy of the same bytes is the same
        // version.
        let again = s.deploy(&name, &format!("/{name}"), &wasm).await;
        assert_eq!(again["version"], v["version"]);
    }
    // A core module that exports the handler but carries no world to make a component of:
    // 422 saying what to do, and nothing is kept.
    let wat = r#"(module (memory (export "memory") 1)
        (func (export "wasi:http/incoming-handler@0.2.0#handle") (param i32 i32)))"#;
    let e = refused_deploy(&s, "bare", wat::parse_str(wat).unwrap()).await;
    assert!(
        e.contains("could not be made a component") && e.contains("wasm32-wasip2"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn componentize_py_handlers_are_served() {
    let dir = tempfile::tempdir().unwrap();
    python_component(dir.path(), "py");
    let config = "[pool]\ninstances = 4\nmax_memory_mib = 64\n\
         [[tenant]]\nname = \"py\"\nmodule = \"py.wasm\"\npaths = [\"/py\"]\n\
         errors = \"dev\"\n[tenant.limits]\ntimeout_ms = 10000\n";
    let s = TestServer::try_start_in(dir, config).await.expect("start");
    let r = s.get("/py/hello?x=1").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.header("x-toolchain"), "componentize-py");
    assert_eq!(r.text(), "hello from python: GET /py/hello?x=1 read=0\n");
    for (n, chunked) in [(1usize, false), (100_000, true), (100_000, false)] {
        let r = post(&s, "/py/up", n, chunked).await;
        assert_eq!(
            r.text(),
            format!("hello from python: POST /py/up read={n}\n")
        );
    }
    // An exception is a trap: 500, with Python's traceback in dev mode; the pool carries on.
    let r = s.get("/py/raise").await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "{}", r.text());
    assert!(
        r.text().contains("RuntimeError: raised on purpose"),
        "{}",
        r.text()
    );
    assert_eq!(s.get("/py/hello").await.status, StatusCode::OK);
}

/// spin-sdk 7 builds WASI 0.3 (component-model async) components. By default they are refused
/// with 422 saying what they are and what to do (it was a 400 "not a valid WebAssembly
/// module"); with `[pool] wasi_p3 = true` they are served, a fresh instance per request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wasi_0_3_components_are_served_where_enabled_and_refused_elsewhere() {
    let s = TestServer::start("").await;
    let dir = tempfile::tempdir().unwrap();
    let wasm = std::fs::read(spin_p3_component(dir.path(), "p3")).unwrap();
    let e = refused_deploy(&s, "p3", wasm).await;
    assert!(
        e.contains("WASI 0.3 component") && e.contains("spin-sdk 5.x") && e.contains("wasi_p3"),
        "{e}"
    );
    assert_eq!(s.get("/p3").await.status, StatusCode::NOT_FOUND);

    // Served where the server is asked to, beside a WASI 0.2 component, with the same
    // lifecycle, limits and outbound policy.
    let backend = crate::outbound::Backend::start().await;
    let dir = tempfile::tempdir().unwrap();
    let p3 = spin_p3_component(dir.path(), "p3");
    crate::support::test_component(dir.path(), "p2");
    // `tern compile --wasi-p3` makes an artifact such a server loads.
    let out = crate::support::tern_bin()
        .args(["compile", "--wasi-p3"])
        .arg(&p3)
        .arg("-o")
        .arg(dir.path().join("p3.cwasm"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let config = format!(
        "[pool]\ninstances = 4\nmax_memory_mib = 64\nwasi_p3 = true\n\
         [[tenant]]\nname = \"p3\"\nmodule = \"p3.wasm\"\npaths = [\"/p3\"]\n\
         [tenant.limits]\ntimeout_ms = 1000\n\
         [tenant.outbound.backends.origin]\nurl = \"http://{}\"\n\
         [[tenant]]\nname = \"p2\"\nmodule = \"p2.wasm\"\npaths = [\"/p2\"]\n\
         [[tenant]]\nname = \"p3-aot\"\nmodule = \"p3.cwasm\"\npaths = [\"/aot\"]\n",
        backend.addr
    );
    let s = TestServer::try_start_in(dir, &config).await.expect("start");
    for _ in 0..3 {
        let r = s.get("/p3/x").await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        assert_eq!(r.text(), "hello from tern-spin-sdk7: /p3/x\n");
        let r = s.get("/p2/hello").await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        let r = s.get("/aot/y").await;
        assert_eq!(r.text(), "hello from tern-spin-sdk7: /aot/y\n");
    }
    for (n, chunked) in [(0usize, false), (65_537, true), (300_000, false)] {
        let r = post(&s, "/p3/echo", n, chunked).await;
        assert_eq!(r.text(), format!("read {n} bytes\n"));
    }
    for n in [0usize, 65_535, 65_537, 1_000_000] {
        let r = s.get(&format!("/p3/big?n={n}")).await;
        assert_eq!((r.status, r.body.len()), (StatusCode::OK, n));
    }
    let r = s.get("/p3/panic").await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "{}", r.text());
    let r = s.get("/p3/loop").await;
    assert_eq!(r.status, StatusCode::GATEWAY_TIMEOUT, "{}", r.text());
    // Outgoing requests go through the tenant's policy: its backend by name, nothing else.
    let r = s.get("/p3/fetch?url=http://origin/hello").await;
    assert!(r.text().starts_with("backend said 200: hi"), "{}", r.text());
    let r = s
        .get(&format!("/p3/fetch?url=http://{}/hello", backend.addr))
        .await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY, "{}", r.text());
    assert!(r.text().contains("fetch failed"), "{}", r.text());
    assert_eq!(s.get("/p3/x").await.status, StatusCode::OK);
    assert_no_slot_held(&s).await;
}
