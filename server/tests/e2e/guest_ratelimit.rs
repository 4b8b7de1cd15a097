//! The guest rate counter API (`[[tenant.rate_counter]]`, `[[tenant.penalty_box]]`): a guest
//! counts its clients and keeps them out (Rust SDK, C and a component), by the rate over a
//! window, limit − 1, limit, limit + 1; a tenant's counters are its own and survive a
//! redeploy that leaves them as they were; bad calls and bad declarations are explained.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, StatusCode};

use crate::support::{TestServer, c_program, metric_value, send, test_component, test_guest};

const DECLARED: &str = "[[tenant.rate_counter]]\nname = \"rc\"\n\
                        [[tenant.penalty_box]]\nname = \"pb\"\nmax_entries = 100\n";

/// `GET path`: its status and body.
async fn ask(s: &TestServer, path: &str) -> (StatusCode, String) {
    let r = send(s.addr(), Method::GET, path, None, &[], Bytes::new()).await;
    (r.status, r.text())
}

async fn ok(s: &TestServer, path: &str) -> String {
    let (status, text) = ask(s, path).await;
    assert_eq!(status, StatusCode::OK, "{path}: {text}");
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_guests_count_block_and_box_their_tenants_entries() {
    let dir = tempfile::tempdir().unwrap();
    test_guest(dir.path(), "rate_probe");
    let config = format!(
        "[[tenant]]\nname = \"app\"\nmodule = \"rate_probe.wasm\"\n{DECLARED}\
         [[tenant]]\nname = \"neighbour\"\nmodule = \"rate_probe.wasm\"\npaths = [\"/neighbour\"]\n{DECLARED}"
    );
    let s = TestServer::try_start_in(dir, &config).await.expect("start");
    // 1 a second over 10 s: ten fit (limit - 1 and the limit), the eleventh is over.
    for i in 1..=10 {
        assert_eq!(ok(&s, "/?entry=a").await, "blocked=0", "request {i}");
    }
    assert_eq!(ok(&s, "/?entry=a").await, "blocked=1", "limit + 1");
    assert_eq!(ok(&s, "/?op=has&entry=a").await, "has=1");
    // Boxed: blocked and not counted.
    assert_eq!(ok(&s, "/?entry=a").await, "blocked=1");
    assert_eq!(ok(&s, "/?op=count&entry=a").await, "count=11");
    assert_eq!(ok(&s, "/?entry=b").await, "blocked=0", "another entry");
    // Another tenant's same names and entry are its own.
    assert_eq!(ok(&s, "/neighbour?op=count&entry=a").await, "count=0");
    assert_eq!(ok(&s, "/neighbour?op=has&entry=a").await, "has=0");
    assert_eq!(ok(&s, "/neighbour?entry=a").await, "blocked=0");

    // Rates and counts over a window.
    assert_eq!(ok(&s, "/?op=increment&entry=r&delta=50").await, "ok");
    assert_eq!(ok(&s, "/?op=rate&entry=r&window=10").await, "rate=5");
    assert_eq!(ok(&s, "/?op=count&entry=r&window=60").await, "count=50");

    // A stay in the box ends.
    assert_eq!(ok(&s, "/?op=add&entry=x&ttl=1").await, "ok");
    assert_eq!(ok(&s, "/?op=has&entry=x").await, "has=1");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(ok(&s, "/?op=has&entry=x").await, "has=0");

    // Bad calls: a 500 from the guest with the host's reason; the edges of each range.
    assert_eq!(ok(&s, "/?op=rate&window=60").await, "rate=0");
    assert_eq!(ok(&s, "/?op=rate&window=1").await, "rate=0");
    assert_eq!(ok(&s, "/?op=has&size=256").await, "has=0");
    assert_eq!(ok(&s, "/?op=has&times=1000").await, "has=0");
    for (path, says) in [
        ("/?op=rate&window=0", "1 to 60 seconds, not 0"),
        ("/?op=rate&window=61", "1 to 60 seconds, not 61"),
        ("/?op=add&ttl=0", "1 to 86400 seconds"),
        (
            "/?op=check&counter=nope",
            "declares no rate counter \"nope\"",
        ),
        ("/?op=has&box=nope", "declares no penalty box \"nope\""),
        ("/?op=has&size=257", "1 to 256 bytes, not 257"),
        ("/?op=has&times=1001", "at most 1000"),
        // Past i32::MAX the SDK passes -1: the host's check of a negative number.
        ("/?op=increment&delta=3000000000", "delta -1 is negative"),
        ("/?op=check&limit=3000000000", "limit -1 is negative"),
        ("/?op=add&ttl=3000000000", "-1 is negative"),
    ] {
        let (status, text) = ask(&s, path).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{path}: {text}");
        assert!(text.contains(says), "{path}: {text}");
    }
    let m = s.metrics().await;
    let series = "tern_rate_counter_entries{kind=\"rate_counter\",name=\"rc\",tenant=\"app\"}";
    assert!(metric_value(&m, series) >= 3.0, "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_survive_a_redeploy_that_keeps_them_and_bad_declarations_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = std::fs::read(test_guest(dir.path(), "rate_probe")).unwrap();
    let s = TestServer::start("").await;
    let spec = |counter: serde_json::Value| {
        serde_json::json!({"paths": ["/p"], "rate_counter": [counter], "penalty_box": [{"name": "pb"}]})
            .to_string()
    };
    for (counter, says) in [
        (
            serde_json::json!({"name": "rc", "max_entries": 0}),
            "max_entries is 1 to 1000000",
        ),
        (serde_json::json!({"name": "r c"}), "1-64 of A-Z"),
        (
            serde_json::json!({"name": "rc", "window": 10}),
            "unknown field",
        ),
    ] {
        let (code, v) = s
            .admin_call(Method::PUT, "/admin/v1/tenants/p", spec(counter))
            .await;
        assert_eq!(code, StatusCode::BAD_REQUEST, "{v}");
        assert!(v.to_string().contains(says), "{says}: {v}");
    }
    let (code, v) = s
        .admin_call(
            Method::PUT,
            "/admin/v1/tenants/p",
            spec(serde_json::json!({"name": "rc"})),
        )
        .await;
    assert!(code.is_success(), "{v}");
    for _ in 0..2 {
        let (code, v) = s
            .admin_call(Method::PUT, "/admin/v1/tenants/p/module", wasm.clone())
            .await;
        assert_eq!(code, StatusCode::OK, "{v}");
        assert_eq!(ok(&s, "/p?op=increment&entry=k&delta=7").await, "ok");
    }
    // Both counted: the second version kept the first one's counter.
    assert_eq!(ok(&s, "/p?op=count&entry=k").await, "count=14");
    // A changed declaration starts afresh.
    let (code, v) = s
        .admin_call(
            Method::PUT,
            "/admin/v1/tenants/p",
            spec(serde_json::json!({"name": "rc", "max_entries": 50})),
        )
        .await;
    assert!(code.is_success(), "{v}");
    assert_eq!(ok(&s, "/p?op=count&entry=k").await, "count=0");

    // At start: too many, and named in the error.
    let many: String = (0..17)
        .map(|i| format!("[[tenant.rate_counter]]\nname = \"c{i}\"\n"))
        .collect();
    let config = format!("[[tenant]]\nname = \"t\"\nmodule = \"builtin:hello\"\n{many}");
    let e = TestServer::try_start(&config).await.err().expect("refused");
    let text = format!("{e:#}");
    assert!(
        text.contains("at most 16 of rate_counter, not 17"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_c_example_keeps_a_flooding_client_out() {
    let dir = tempfile::tempdir().unwrap();
    c_program(
        dir.path(),
        "guest-sdk/examples/c/ratelimit.c",
        "ratelimit-c",
    );
    let config = "[[tenant]]\nname = \"c\"\nmodule = \"ratelimit-c.wasm\"\n\
                  [[tenant.rate_counter]]\nname = \"clients\"\n\
                  [[tenant.penalty_box]]\nname = \"slow-down\"\n";
    let s = TestServer::try_start_in(dir, config).await.expect("start");
    // 2 a second over 10 s: twenty fit.
    for i in 1..=20 {
        assert_eq!(
            ok(&s, "/").await,
            format!("{i} requests from 127.0.0.1 in the last 10 s\n")
        );
    }
    for _ in 0..3 {
        let r = send(s.addr(), Method::GET, "/", None, &[], Bytes::new()).await;
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.text());
        assert_eq!(r.header("retry-after"), "60");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn components_count_through_tern_rate_limit() {
    let dir = tempfile::tempdir().unwrap();
    test_component(dir.path(), "component");
    let config = format!("[[tenant]]\nname = \"c\"\nmodule = \"component.wasm\"\n{DECLARED}");
    let s = TestServer::try_start_in(dir, &config).await.expect("start");
    for i in 1..=10 {
        assert_eq!(
            ok(&s, "/rate?entry=a").await,
            format!("blocked=0 count={i}")
        );
    }
    assert_eq!(ok(&s, "/rate?entry=a").await, "blocked=1 count=11");
    assert_eq!(ok(&s, "/rate?entry=a").await, "blocked=1 count=11", "boxed");
    assert_eq!(ok(&s, "/rate?entry=b").await, "blocked=0 count=1");
    let text = ok(&s, "/rate?entry=a&window=0").await;
    assert!(
        text.contains("InvalidArgument(") && text.contains("not 0"),
        "{text}"
    );
    let text = ok(&s, "/rate?entry=a&counter=other").await;
    assert!(text.contains("declares no rate counter"), "{text}");
}
