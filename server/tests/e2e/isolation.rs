//! Zero state: memory, globals and grown memory never carry over from one request to the next.

use http::StatusCode;

use crate::support::{Conn, TestServer, wat_file};

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
