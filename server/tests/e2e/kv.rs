//! Key-value stores: guests keep state across requests in the stores their tenant is granted,
//! each tenant's keys its own; sizes, quotas and operations per request are limited; the data
//! survives a restart; concurrent increments all count. Real SQLite files in the data
//! directory, real HTTP.

use http::{Method, StatusCode};

use crate::support::{TestServer, metric_value, restart_dir, test_guest};

/// Tenants `a` (stores `default` and `small`), `b` (`default`), `plain` (no store) and `few`
/// (`default`, 5 operations per request), all running the `kv_probe` guest.
fn config() -> String {
    "[pool]\ninstances = 16\nmax_memory_mib = 64\n\
     [kv.small]\nmax_key_bytes = 8\nmax_value_bytes = 100\nmax_keys_per_tenant = 3\n\
     [[tenant]]\nname = \"a\"\nmodule = \"kv_probe.wasm\"\npaths = [\"/a\"]\n\
     kv = [\"default\", \"small\"]\n\
     [[tenant]]\nname = \"b\"\nmodule = \"kv_probe.wasm\"\npaths = [\"/b\"]\nkv = [\"default\"]\n\
     [[tenant]]\nname = \"plain\"\nmodule = \"kv_probe.wasm\"\npaths = [\"/plain\"]\n\
     [[tenant]]\nname = \"few\"\nmodule = \"kv_probe.wasm\"\npaths = [\"/few\"]\n\
     kv = [\"default\"]\n[tenant.limits]\nmax_kv_ops = 5\n"
        .to_string()
}

async fn start(dir: tempfile::TempDir) -> TestServer {
    test_guest(dir.path(), "kv_probe");
    TestServer::try_start_in(dir, &config())
        .await
        .expect("start")
}

/// The probe's answer lines for `query`.
async fn probe(s: &TestServer, query: &str) -> Vec<String> {
    let r = s.get(query).await;
    assert_eq!(r.status, StatusCode::OK, "{query}: {}", r.text());
    r.text().lines().map(str::to_string).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guests_keep_state_in_their_own_keys_of_granted_stores() {
    let s = start(tempfile::tempdir().unwrap()).await;

    let got = probe(
        &s,
        "/a?op=get:k&op=set:k:hello&op=get:k&op=exists:k&op=exists:other&op=incr:n:5\
         &op=incr:n:-2&op=get:n&op=incr:k:1&op=cas:k:nope:x&op=cas:k:hello:bye&op=get:k\
         &op=cas:fresh:-:1&op=cas:fresh:-:2&op=list&op=delete:k&op=delete:k&op=get:k",
    )
    .await;
    assert_eq!(
        got[..9],
        [
            "none",
            "ok",
            "hello",
            "true",
            "false",
            "5",
            "3",
            "3",
            // An increment of a value that is not an integer.
            "error=INVALID_ARGUMENT increment: the key's value is not a decimal 64-bit integer",
        ]
    );
    assert_eq!(
        got[9..],
        [
            "false",
            "true",
            "bye",
            "true",
            "false",
            "fresh,k,n",
            "ok",
            "ok",
            "none"
        ]
    );

    // The same store, another tenant: none of a's keys.
    assert_eq!(
        probe(&s, "/b?op=get:n&op=list&op=set:n:mine").await,
        ["none", "", "ok"]
    );
    assert_eq!(probe(&s, "/a?op=get:n").await, ["3"]);
    assert_eq!(probe(&s, "/b?op=get:n").await, ["mine"]);

    // Stores not granted.
    let denied = probe(&s, "/b?store=small").await;
    assert!(denied[0].starts_with("error=DENIED "), "{denied:?}");
    assert!(
        denied[0].contains("\"small\"") && denied[0].contains("granted: default"),
        "{denied:?}"
    );
    let denied = probe(&s, "/plain?op=get:n").await;
    assert_eq!(denied, ["no store"], "the probe could not open `default`");
    let denied = probe(&s, "/plain?store=default").await;
    assert!(denied[0].contains("granted: none"), "{denied:?}");

    // The phase is timed and exported.
    let r = s.get("/a?op=get:n").await;
    assert!(
        r.header("server-timing").contains(", kv;dur="),
        "{}",
        r.header("server-timing")
    );
    let plain = s.get("/plain").await;
    assert!(!plain.header("server-timing").contains("kv;"));
    let m = s.metrics().await;
    assert!(
        metric_value(
            &m,
            "tern_request_phase_duration_seconds_count{phase=\"kv\"}"
        ) >= 5.0,
        "{m}"
    );
    // 25 operations so far (a listing asks once more past its last key), one refused (the
    // increment of a text value).
    let kv_ops = |result: &str| {
        metric_value(
            &m,
            &format!("tern_kv_operations_total{{result=\"{result}\",store=\"default\"}}"),
        )
    };
    assert_eq!(
        (kv_ops("ok"), kv_ops("invalid"), kv_ops("limit")),
        (24.0, 1.0, 0.0)
    );

    // The data is on disk: a restart over the same data directory still has it.
    let dir = restart_dir(s);
    let s = start(dir).await;
    assert_eq!(probe(&s, "/a?op=get:n&op=get:fresh").await, ["3", "1"]);
    assert_eq!(probe(&s, "/b?op=get:n").await, ["mine"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sizes_quotas_and_operations_per_request_are_limited() {
    let s = start(tempfile::tempdir().unwrap()).await;
    let limit = |line: &str, what: &str| {
        assert!(
            line.starts_with("error=LIMIT_EXCEEDED ") && line.contains(what),
            "{line}"
        );
    };
    // Keys of 8 bytes (limit), 9 (over); values of 100 bytes, 101.
    let got = probe(
        &s,
        "/a?store=small&op=setn:12345678:100&op=setn:123456789:1&op=setn:v:101&op=get:v&op=set::x",
    )
    .await;
    assert_eq!(got[..2], ["opened", "ok"]);
    limit(&got[2], "max_key_bytes (8)");
    limit(&got[3], "max_value_bytes (100)");
    assert_eq!(got[4], "none", "nothing written by a refused set");
    assert_eq!(got[5], "error=INVALID_ARGUMENT a key must not be empty");

    // Three keys per tenant: the third fits, a fourth does not until one is deleted; replacing
    // a key's value is no new key.
    let got = probe(
        &s,
        "/a?store=small&op=set:x:1&op=set:y:1&op=set:y:2&op=set:z:1&op=delete:x&op=set:z:1&op=list",
    )
    .await;
    assert_eq!(got[1..4], ["ok", "ok", "ok"]);
    limit(&got[4], "max_keys_per_tenant");
    assert_eq!(got[5..], ["ok", "ok", "12345678,y,z"]);
    let m = s.metrics().await;
    assert_eq!(
        metric_value(
            &m,
            "tern_kv_operations_total{result=\"limit\",store=\"small\"}"
        ),
        3.0,
        "key size, value size, keys per tenant"
    );
    // Another tenant's quota is its own (b is not granted `small`; a's keys count only for a).

    // Operations per request: 4 and 5 (the limit) pass, the 6th is refused.
    assert_eq!(probe(&s, "/few?op=many:4").await, ["4 ok"]);
    assert_eq!(probe(&s, "/few?op=many:5").await, ["5 ok"]);
    let got = probe(&s, "/few?op=many:6").await;
    assert!(
        got[0].starts_with("5 ok, then error=LIMIT_EXCEEDED ")
            && got[0].contains("limits.max_kv_ops"),
        "{got:?}"
    );
    // Per request: the next one starts from zero.
    assert_eq!(probe(&s, "/few?op=many:5").await, ["5 ok"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_increments_from_many_requests_all_count() {
    let s = start(tempfile::tempdir().unwrap()).await;
    let addr = s.addr();
    let tasks: Vec<_> = (0..200)
        .map(|_| {
            tokio::spawn(async move {
                let r = crate::support::get_at(addr, "/a?op=incr:hits:1").await;
                assert_eq!(r.status, StatusCode::OK, "{}", r.text());
                r.text().trim().parse::<i64>().expect("a count")
            })
        })
        .collect();
    let mut seen = Vec::new();
    for t in tasks {
        seen.push(t.await.unwrap());
    }
    seen.sort_unstable();
    assert_eq!(
        seen,
        (1..=200).collect::<Vec<_>>(),
        "each saw its own value"
    );
    assert_eq!(probe(&s, "/a?op=get:hits").await, ["200"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_are_granted_through_the_admin_api_and_checked_in_config() {
    let s = start(tempfile::tempdir().unwrap()).await;
    let wasm = std::fs::read(s.path("kv_probe.wasm")).unwrap();
    let spec = serde_json::json!({ "paths": ["/api"], "kv": ["small"] }).to_string();
    let (status, v) = s
        .admin_call(Method::PUT, "/admin/v1/tenants/api", spec)
        .await;
    assert!(status.is_success(), "{status} {v}");
    let (status, v) = s
        .admin_call(Method::PUT, "/admin/v1/tenants/api/module", wasm)
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(
        probe(&s, "/api?store=small&op=set:k:1&op=get:k").await,
        ["opened", "ok", "1"]
    );
    // A's keys in `small` are not the API tenant's.
    assert_eq!(probe(&s, "/api?store=small&op=list").await, ["opened", "k"]);

    // A store this server does not have: refused, the tenant unchanged.
    let spec = serde_json::json!({ "paths": ["/api"], "kv": ["nope"] }).to_string();
    let (status, v) = s
        .admin_call(Method::PUT, "/admin/v1/tenants/api", spec)
        .await;
    assert!(status.is_client_error(), "{status} {v}");
    assert!(v.to_string().contains("no store named \\\"nope\\\""), "{v}");
    assert_eq!(
        probe(&s, "/api?store=small&op=get:k").await,
        ["opened", "1"]
    );

    // In a config file: an unknown store and a bad name stop the start with the reason.
    for (kv, why) in [
        ("[\"nope\"]", "no store named \"nope\""),
        ("[\"Bad Name\"]", "is not a store name"),
        ("[\"default\", \"default\"]", "listed twice"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        test_guest(dir.path(), "kv_probe");
        let config = format!("[[tenant]]\nname = \"t\"\nmodule = \"kv_probe.wasm\"\nkv = {kv}\n");
        let e = TestServer::try_start_in(dir, &config)
            .await
            .err()
            .expect("refused");
        assert!(format!("{e:#}").contains(why), "{kv}: {e:#}");
    }
}
