//! The demo tenants answer as documented, over HTTP/1.1 and HTTP/2; `tern dev` and `tern new`.

use bytes::Bytes;
use http::{Method, StatusCode};

use crate::support::{Conn, TestServer, send, send_h2};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_answers_with_headers_timing_and_request_id() {
    let s = TestServer::demo().await;
    let r = s.get("/hello").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.text(), "Hello from Tern!\n");
    assert_eq!(r.header("content-type"), "text/plain");
    assert_eq!(r.header("content-length"), "17");
    let timing = r.header("server-timing");
    for phase in [
        "route;dur=",
        "queue;dur=",
        "instantiate;dur=",
        "run;dur=",
        "teardown;dur=",
        "total;dur=",
    ] {
        assert!(
            timing.contains(phase),
            "Server-Timing {timing:?} lacks {phase}"
        );
    }
    // The phases follow one another within the whole (each begins at the clock reading that
    // ended the one before): in whole microseconds, their sum is at most the total.
    let us = |name: &str| -> u64 {
        let ms = timing
            .split(", ")
            .find_map(|p| p.strip_prefix(&format!("{name};dur=")))
            .unwrap_or_else(|| panic!("no {name} in {timing:?}"));
        let (whole, frac) = ms.split_once('.').expect("three decimals");
        whole.parse::<u64>().unwrap() * 1000 + frac.parse::<u64>().unwrap()
    };
    let phases: u64 = ["route", "queue", "instantiate", "run", "teardown"]
        .into_iter()
        .map(us)
        .sum();
    assert!(phases <= us("total"), "{timing}");
    assert!(!r.header("x-request-id").is_empty());

    let r = send(
        s.addr(),
        Method::GET,
        "/hello",
        None,
        &[("x-request-id", "trace-42")],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.header("x-request-id"), "trace-42");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_returns_method_path_headers_and_body() {
    let s = TestServer::demo().await;
    let r = send(
        s.addr(),
        Method::PUT,
        "/echo/some/path?q=1",
        None,
        &[("x-custom", "value 1")],
        Bytes::from_static(b"the body"),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("x-echo-method"), "PUT");
    let text = r.text();
    assert!(text.starts_with("PUT /echo/some/path?q=1\n"), "{text}");
    assert!(text.contains("x-custom: value 1\n"), "{text}");
    assert!(text.ends_with("\n\nthe body"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_streams_a_body_larger_than_the_buffer() {
    let s = TestServer::demo().await;
    let body: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
    let r = send(
        s.addr(),
        Method::POST,
        "/echo",
        None,
        &[],
        Bytes::from(body.clone()),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    // Streamed: no Content-Length, head timing covers route and queue only.
    assert_eq!(r.header("content-length"), "");
    assert!(r.header("server-timing").starts_with("route;dur="));
    assert!(r.body.ends_with(&body), "streamed body differs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_transforms_the_body_and_rejects_bad_json() {
    let s = TestServer::demo().await;
    let r = send(
        s.addr(),
        Method::POST,
        "/json",
        None,
        &[],
        Bytes::from_static(br#"{"a":1,"b":[true]}"#),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("content-type"), "application/json");
    let v: serde_json::Value = serde_json::from_slice(&r.body).expect("JSON reply");
    assert_eq!(v["kind"], "object");
    assert_eq!(v["keys"], serde_json::json!(["a", "b"]));
    assert_eq!(v["echo"]["b"][0], true);
    assert_eq!(v["bytes"], 18);

    let r = send(
        s.addr(),
        Method::POST,
        "/json",
        None,
        &[],
        Bytes::from_static(b"{nope"),
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.text().contains("error"), "{}", r.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_prior_knowledge_is_served() {
    let s = TestServer::demo().await;
    let r = send_h2(s.addr(), "/hello").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.text(), "Hello from Tern!\n");
    assert!(r.header("server-timing").contains("instantiate;dur="));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counter_is_one_on_every_sequential_request() {
    let s = TestServer::demo().await;
    let mut conn = Conn::open(s.addr()).await;
    for i in 0..1000 {
        let r = conn.get("/counter").await;
        assert_eq!(
            (r.status, r.text().as_str()),
            (StatusCode::OK, "1\n"),
            "request {i}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counter_is_one_on_every_concurrent_request() {
    let s = TestServer::demo().await;
    let addr = s.addr();
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            tokio::spawn(async move {
                let mut conn = Conn::open(addr).await;
                let mut bodies = Vec::new();
                for _ in 0..20 {
                    let r = conn.get("/counter").await;
                    bodies.push((r.status, r.text()));
                }
                bodies
            })
        })
        .collect();
    let mut n = 0;
    for t in tasks {
        for (status, body) in t.await.expect("client task") {
            assert_eq!((status, body.as_str()), (StatusCode::OK, "1\n"));
            n += 1;
        }
    }
    assert_eq!(n, 1000);
}

/// `/visits` counts in the `default` key-value store, beside `/counter` which never does:
/// state lives in the store, not in the guest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn visits_count_up_in_the_default_store() {
    let s = TestServer::demo().await;
    for i in 1..=3 {
        let r = s.get("/visits").await;
        assert_eq!(
            (r.status, r.text()),
            (StatusCode::OK, format!("visit {i}\n"))
        );
        assert!(r.header("server-timing").contains("kv;dur="));
        assert_eq!(s.get("/counter").await.text(), "1\n");
    }
    assert!(s.path("data/kv/default.sqlite").exists());
}

/// `tern dev FILE`: serves the file at `/`, shows a panic's message in the response, and
/// picks up a new build of the file (keeping the old one when the new one is broken).
#[test]
fn tern_dev_serves_a_file_shows_panics_and_reloads_it() {
    let dir = tempfile::tempdir().unwrap();
    let app = dir.path().join("app.wasm");
    std::fs::copy(crate::support::test_guest(dir.path(), "panic"), &app).unwrap();
    let dev = crate::support::TernDev::start(&app, &dir.path().join("cache"));
    let r = dev.get("/");
    assert!(r.starts_with("HTTP/1.1 500"), "{r}");
    assert!(
        r.contains("panicked at") && r.contains("index out of bounds"),
        "{r}"
    );
    // A new build of the file is served without a restart.
    std::fs::write(&app, tern::demo::module("hello").unwrap()).unwrap();
    dev.wait_for("tern dev: reloaded");
    assert!(dev.get("/").contains("Hello from Tern!"));
    // A broken one is refused and the last good one keeps serving.
    std::fs::write(&app, b"not wasm").unwrap();
    let line = dev.wait_for("was not loaded");
    assert!(line.contains("previous version keeps serving"), "{line}");
    assert!(dev.get("/").contains("Hello from Tern!"));
}

/// `tern new` writes projects that build outside this repository with their one command and
/// serve on Tern: for the ABI Rust (with its copy of the SDK), C (with tern.h) and Zig (the ABI
/// alone; `bash scripts/test` puts a `zig` in ~/.cache/tern-tools/bin); a wasi:http component in Rust;
/// CGI programs in Rust and C.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tern_new_projects_build_outside_the_repository_and_serve() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = String::from("[pool]\ninstances = 8\nmax_memory_mib = 64\n");
    let tools = crate::support::tools_dir().join("bin");
    let path = format!(
        "{}:{}",
        tools.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let zig = std::process::Command::new("zig")
        .arg("version")
        .env("PATH", &path)
        .output()
        .is_ok_and(|o| o.status.success());
    // Required, as every toolchain of the suite: a project left out would pass unbuilt.
    assert!(
        zig,
        "no zig on PATH or in {}: bash scripts/test installs one there",
        tools.display()
    );
    let cargo = vec!["cargo", "build", "--release", "--quiet"];
    let sh = vec!["sh", "build.sh"];
    let projects = vec![
        (
            "hello-rs",
            "tern",
            "rust",
            cargo.clone(),
            "target/wasm32-wasip1/release/hello-rs.wasm",
        ),
        ("hello-c", "tern", "c", sh.clone(), "hello-c.wasm"),
        (
            "comp-rs",
            "wasi-http",
            "rust",
            cargo.clone(),
            "target/wasm32-wasip2/release/comp_rs.wasm",
        ),
        (
            "cgi-rs",
            "cgi",
            "rust",
            cargo.clone(),
            "target/wasm32-wasip1/release/cgi-rs.wasm",
        ),
        ("cgi-c", "cgi", "c", sh.clone(), "cgi-c.wasm"),
        ("hello-zig", "tern", "zig", sh, "hello-zig.wasm"),
    ];
    for (name, kind, lang, build, wasm) in projects {
        let out = crate::support::tern_bin()
            .args(["new", name, "--kind", kind, "--lang", lang])
            .current_dir(dir.path())
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{said}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            said.contains(&build.join(" ").replace(" --quiet", "")),
            "{said}"
        );
        let project = dir.path().join(name);
        let mut cmd = std::process::Command::new(build[0]);
        cmd.args(&build[1..])
            .current_dir(&project)
            .env("PATH", &path);
        // Nothing of this repository's build may leak into the project's.
        for var in [
            "RUSTFLAGS",
            "CARGO_TARGET_DIR",
            "CARGO_BUILD_TARGET",
            "CARGO_ENCODED_RUSTFLAGS",
            // `bash scripts/test` lints its own crates with clippy as they build.
            "RUSTC_WORKSPACE_WRAPPER",
            "CLIPPY_ARGS",
        ] {
            cmd.env_remove(var);
        }
        let built = cmd.output().unwrap();
        assert!(
            built.status.success(),
            "{name}: {}{}",
            String::from_utf8_lossy(&built.stdout),
            String::from_utf8_lossy(&built.stderr)
        );
        let module = project.join(wasm);
        assert!(module.exists(), "{name}: no {wasm}");
        config.push_str(&format!(
            "[[tenant]]\nname = \"{name}\"\nmodule = \"{}\"\npaths = [\"/{name}\"]\n",
            module.display()
        ));
    }
    let s = TestServer::try_start_in(dir, &config).await.expect("start");
    let r = s.get("/hello-rs/x").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert!(
        r.text()
            .starts_with("Hello, 127.0.0.1! You asked for GET /hello-rs/x"),
        "{}",
        r.text()
    );
    let r = s.get("/hello-c/y").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.text(), "Hello from hello-c! You asked for /hello-c/y\n");
    // The other kinds, detected from what was built.
    let r = s.get("/comp-rs").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.text(), "Hello from a wasi:http component on Tern!\n");
    let r = s.get("/cgi-rs/env").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert!(
        r.text().lines().any(|l| l == "SCRIPT_NAME=/cgi-rs"),
        "{}",
        r.text()
    );
    let r = s.get("/cgi-c/z?q=1").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert!(
        r.text().contains("script=/cgi-c path=/z query=q=1"),
        "{}",
        r.text()
    );
    let r = s.get("/hello-zig/z").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(
        r.text(),
        "Hello from hello-zig! You asked for /hello-zig/z\n"
    );
}

/// The README's demo commands for the other two guest kinds: the `wasi:http` component at
/// `/component` (and its streaming `/component/echo`) and the CGI program at `/cgi`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_serves_a_component_and_a_cgi_program() {
    let s = TestServer::demo().await;
    let r = s.get("/component").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.text(), "Hello from a wasi:http component on Tern!\n");
    let body: Vec<u8> = (0..300_000u32).map(|i| (i % 249) as u8).collect();
    let r = send(
        s.addr(),
        Method::POST,
        "/component/echo",
        None,
        &[],
        Bytes::from(body.clone()),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(
        r.body == body,
        "echoed {} of {} bytes",
        r.body.len(),
        body.len()
    );
    let r = s.get("/cgi").await;
    assert_eq!(r.text(), "Hello from a CGI program on Tern!\n");
    let r = s.get("/cgi/env").await;
    assert!(
        r.text().lines().any(|l| l == "SCRIPT_NAME=/cgi"),
        "{}",
        r.text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_chat_room_carries_messages_between_websockets() {
    use crate::websocket_events::{talk, talk_all};
    let s = TestServer::demo().await;
    let base = format!("ws://{}/chat", s.addr());
    // ann listens: her welcome, her own join, bob's join, his message, his new name, his exit.
    let ann = talk(&format!("{base}?nick=ann"), &["--recv", "6"]).await;
    let bob = talk_all(
        &format!("{base}?nick=bob"),
        &[
            "--recv",
            "2",
            "--send",
            "hi ann",
            "--recv",
            "1",
            "--send",
            "/nick robert",
            "--recv",
            "1",
        ],
    )
    .await;
    assert_eq!(
        bob["received"],
        serde_json::json!([
            "welcome to lobby, bob (/nick NAME to change your name)",
            "bob joined",
            "bob: hi ann",
            "bob is now robert"
        ]),
        "{bob}"
    );
    let ann = ann.end().await;
    assert_eq!(
        ann["received"],
        serde_json::json!([
            "welcome to lobby, ann (/nick NAME to change your name)",
            "ann joined",
            "bob joined",
            "bob: hi ann",
            "bob is now robert",
            // The name kept as the connection's metadata, for its last batch.
            "robert left"
        ]),
        "{ann}"
    );
    // A plain GET is not a WebSocket: the guest says so.
    let r = s.get("/chat").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text());
}
