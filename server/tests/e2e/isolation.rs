//! Zero state: memory, globals and grown memory never carry over from one request to the next.

use http::StatusCode;

use crate::support::{Conn, TestServer, metric_value, wat_file};

/// Traps (500) if it sees anything but the module's initial state, then leaves canaries in
/// static memory (a data segment's byte and a zero page), a global, and a page it grows, all
/// still set when it ends; answers "clean" (200) otherwise.
const CANARY: &str = r#"(module
  (import "tern" "response_body_write" (func $write (param i32 i32) (result i32)))
  (memory (export "memory") 1)
  (global $g (mut i32) (i32.const 0))
  (data (i32.const 16) "clean")
  (func (export "_start")
    (if (i32.ne (memory.size) (i32.const 1)) (then unreachable))
    (if (i32.ne (i32.load (i32.const 1024)) (i32.const 0)) (then unreachable))
    (if (i32.ne (global.get $g) (i32.const 0)) (then unreachable))
    (if (i32.ne (i32.load8_u (i32.const 16)) (i32.const 99)) (then unreachable))
    (i32.store (i32.const 1024) (i32.const 0xdeadbeef))
    (global.set $g (i32.const 1))
    (drop (memory.grow (i32.const 1)))
    (i32.store (i32.const 65600) (i32.const 0xdeadbeef))
    (drop (call $write (i32.const 16) (i32.const 5)))
    ;; The answer is copied out: the data segment's first byte is left changed too.
    (i32.store8 (i32.const 16) (i32.const 0))))"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_state_survives_into_the_next_request() {
    let dir = tempfile::tempdir().unwrap();
    wat_file(dir.path(), "canary.wasm", CANARY);
    // Two tenants on a two-slot pool: each slot is reused by both modules.
    let config = "[pool]\ninstances = 2\n\
                  [[tenant]]\nname = \"a\"\nmodule = \"canary.wasm\"\npaths = [\"/a\"]\n\
                  [[tenant]]\nname = \"b\"\nmodule = \"builtin:counter\"\npaths = [\"/b\"]\n";
    let s = TestServer::try_start_in(dir, config).await.expect("start");
    let mut conn = Conn::open(s.addr()).await;
    for i in 0..2000 {
        let r = conn.get("/a").await;
        assert_eq!(
            (r.status, r.text().as_str()),
            (StatusCode::OK, "clean"),
            "request {i}"
        );
        if i % 10 == 0 {
            assert_eq!(conn.get("/b").await.text(), "1\n");
        }
    }
}

/// Tenants that deploy the same bytes share one loaded module (one mapping, one image, the
/// slots warm for it), and each of their requests still starts from the module's initial state,
/// whichever tenant the slot served last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_of_the_same_bytes_share_one_module_and_no_state() {
    let dir = tempfile::tempdir().unwrap();
    wat_file(dir.path(), "canary.wasm", CANARY);
    // The same code with one more data segment: another heap image, so a module of its own.
    let other = CANARY.replace(
        r#"(data (i32.const 16) "clean")"#,
        r#"(data (i32.const 16) "clean") (data (i32.const 256) "other")"#,
    );
    assert_ne!(other, CANARY);
    wat_file(dir.path(), "other.wasm", &other);
    let config = "[pool]\ninstances = 2\n\
                  [[tenant]]\nname = \"a1\"\nmodule = \"canary.wasm\"\npaths = [\"/a1\"]\n\
                  [[tenant]]\nname = \"a2\"\nmodule = \"canary.wasm\"\npaths = [\"/a2\"]\n\
                  [[tenant]]\nname = \"b\"\nmodule = \"other.wasm\"\npaths = [\"/b\"]\n";
    let s = TestServer::try_start_in(dir, config).await.expect("start");
    assert_eq!(metric_value(&s.metrics().await, "tern_modules_loaded"), 2.0);
    let mut conn = Conn::open(s.addr()).await;
    for i in 0..600 {
        let path = ["/a1", "/a2", "/b"][i % 3];
        let r = conn.get(path).await;
        assert_eq!(
            (r.status, r.text().as_str()),
            (StatusCode::OK, "clean"),
            "request {i} ({path})"
        );
    }
    // Each tenant was served by its own name.
    let m = s.metrics().await;
    for t in ["a1", "a2", "b"] {
        let served = format!(
            r#"tern_requests_total{{deployment="current",status="2xx",tenant="{t}",trigger="request",version="1.1"}}"#
        );
        assert_eq!(metric_value(&m, &served), 200.0, "{t}");
    }
}
