//! Guest failures become clear responses with their own status, and never hurt the next
//! request; modules that do not fit the ABI are refused at load, naming the problem.

use http::StatusCode;

use crate::support::{TestServer, guest_wat, metric_is, wat_file};

/// Starts a server with a `bad` tenant at /bad running `body`, and the demo hello at /hello.
async fn with_guest(body: &str, limits: &str) -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    wat_file(dir.path(), "bad.wasm", &guest_wat(body, "ok"));
    let config = format!(
        "[pool]\ninstances = 8\n\
         [[tenant]]\nname = \"bad\"\nmodule = \"bad.wasm\"\npaths = [\"/bad\"]\n{limits}\n\
         [[tenant]]\nname = \"hello\"\nmodule = \"builtin:hello\"\npaths = [\"/hello\"]\n"
    );
    TestServer::try_start_in(dir, &config).await.expect("start")
}

async fn expect(s: &TestServer, status: StatusCode, body_has: &str) {
    for _ in 0..3 {
        let r = s.get("/bad").await;
        assert_eq!(r.status, status, "{}", r.text());
        assert!(
            r.text().contains(body_has),
            "body {:?} lacks {body_has:?}",
            r.text()
        );
        let ok = s.get("/hello").await;
        assert_eq!(ok.status, StatusCode::OK, "the next request must succeed");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_trap_is_500_naming_the_trap() {
    let s = with_guest("(unreachable)", "").await;
    expect(
        &s,
        StatusCode::INTERNAL_SERVER_ERROR,
        "guest trapped: wasm `unreachable` instruction executed\n",
    )
    .await;
    let m = s.metrics().await;
    assert!(
        metric_is(
            &m,
            r#"tern_guest_outcomes_total{outcome="trap_unreachable",tenant="bad"}"#,
            3.0
        ),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn divide_by_zero_is_500() {
    let s = with_guest("(drop (i32.div_s (i32.const 1) (i32.const 0)))", "").await;
    expect(
        &s,
        StatusCode::INTERNAL_SERVER_ERROR,
        "integer divide by zero",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_bounds_pointer_to_a_host_call_traps_the_guest_only() {
    let s = with_guest("(drop (call $write (i32.const 65530) (i32.const 100)))", "").await;
    expect(&s, StatusCode::INTERNAL_SERVER_ERROR, "outside its memory").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endless_loop_is_504_at_the_deadline() {
    let s = with_guest("(loop $l (br $l))", "[tenant.limits]\ntimeout_ms = 200").await;
    expect(&s, StatusCode::GATEWAY_TIMEOUT, "time limit (200 ms)").await;
}

/// A guest that writes `done` and exits with `code`.
fn exit(code: i32) -> String {
    format!(
        r#"(module
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (import "tern" "response_body_write" (func $write (param i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "done")
  (func (export "_start") (drop (call $write (i32.const 0) (i32.const 4))) (call $exit (i32.const {code}))))"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nonzero_exit_is_500_and_zero_exit_is_a_normal_end() {
    let dir = tempfile::tempdir().unwrap();
    wat_file(dir.path(), "zero.wasm", &exit(0));
    wat_file(dir.path(), "three.wasm", &exit(3));
    let config = "[[tenant]]\nname = \"zero\"\nmodule = \"zero.wasm\"\npaths = [\"/zero\"]\n\
                  [[tenant]]\nname = \"three\"\nmodule = \"three.wasm\"\npaths = [\"/three\"]\n";
    let s = TestServer::try_start_in(dir, config).await.expect("start");
    let r = s.get("/zero").await;
    assert_eq!((r.status, r.text().as_str()), (StatusCode::OK, "done"));
    let r = s.get("/three").await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    let id = r.header("x-request-id").to_string();
    assert_eq!(
        r.text(),
        format!(
            "guest exited with status 3\nrequest id: {id} (the guest's output is in the server log)\n"
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_choose_minimal_errors_and_their_own_pages() {
    let dir = tempfile::tempdir().unwrap();
    wat_file(dir.path(), "three.wasm", &exit(3));
    let config = "[[tenant]]\nname = \"minimal\"\nmodule = \"three.wasm\"\npaths = [\"/minimal\"]\n\
                  errors = \"minimal\"\n\
                  [[tenant]]\nname = \"paged\"\nmodule = \"three.wasm\"\npaths = [\"/paged\"]\n\
                  error_pages = { \"500\" = \"<h1>Sorry</h1><p>{request_id}</p>\" }\n";
    let s = TestServer::try_start_in(dir, config).await.expect("start");
    let r = s.get("/minimal").await;
    let id = r.header("x-request-id").to_string();
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        r.text(),
        format!("500 Internal Server Error\nrequest id: {id}\n")
    );
    let r = s.get("/paged").await;
    let id = r.header("x-request-id").to_string();
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(r.header("content-type"), "text/html; charset=utf-8");
    assert_eq!(r.text(), format!("<h1>Sorry</h1><p>{id}</p>"));
    // Only error statuses may have pages.
    let e = TestServer::try_start(
        "[[tenant]]\nname = \"t\"\nmodule = \"builtin:hello\"\nerror_pages = { \"200\" = \"x\" }\n",
    )
    .await
    .err()
    .expect("refused");
    assert!(format!("{e:#}").contains("not a status 400-599"), "{e:#}");
}

async fn load_error(wat: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    wat_file(dir.path(), "m.wasm", wat);
    let config = "[[tenant]]\nname = \"m\"\nmodule = \"m.wasm\"\n";
    match TestServer::try_start_in(dir, config).await {
        Ok(_) => panic!("module should be refused"),
        Err(e) => format!("{e:#}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modules_that_do_not_fit_the_abi_are_refused_at_load() {
    let e = load_error(
        r#"(module (import "env" "socket" (func)) (memory (export "memory") 1) (func (export "_start")))"#,
    )
    .await;
    assert!(
        e.contains("tenant \"m\"") && e.contains("`env::socket`"),
        "{e}"
    );

    let e = load_error(
        r#"(module (import "tern" "launch_missiles" (func)) (memory (export "memory") 1) (func (export "_start")))"#,
    )
    .await;
    assert!(e.contains("`tern::launch_missiles`"), "{e}");

    let e = load_error(
        r#"(module (import "tern" "response_body_write" (func (param i64))) (memory (export "memory") 1) (func (export "_start")))"#,
    )
    .await;
    assert!(
        e.contains("imports `tern::response_body_write` as (i64) -> ()")
            && e.contains("Tern's `response_body_write` is (i32, i32) -> (i32)"),
        "the module's type and Tern's, each named as what it is: {e}"
    );

    let e = load_error(r#"(module (memory (export "memory") 1) (func (export "handle")))"#).await;
    assert!(e.contains("no `_start` export"), "{e}");

    let e = load_error(r#"(module (func (export "_start")))"#).await;
    assert!(e.contains("does not export its memory"), "{e}");

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("m.wasm"), b"not wasm at all").unwrap();
    let e = TestServer::try_start_in(dir, "[[tenant]]\nname = \"m\"\nmodule = \"m.wasm\"\n")
        .await
        .map(|_| ())
        .expect_err("garbage refused");
    assert!(
        format!("{e:#}").contains("not a valid WebAssembly module"),
        "{e:#}"
    );
}
