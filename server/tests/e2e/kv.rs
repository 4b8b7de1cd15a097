//! Key-value stores: guests keep state across requests in the stores their tenant is granted,
//! each tenant's keys its own; sizes, quotas and operations per request are limited; the data
//! survives a restart; concurrent increments all count. Through the `tern` ABI (the `kv_probe`
//! guest) and through Spin's key-value and `wasi:keyvalue` (a spin-sdk component, unchanged).
//! Real SQLite files in the data directory, real HTTP.

use http::{Method, StatusCode};

use crate::support::{
    TestServer, get_at, metric_value, post, restart_dir, spin_module, test_guest,
};

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
            "tern_request_phase_duration_seconds_count{deployment=\"current\",phase=\"kv\"}"
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

/// A tenant keeps its keys across deploys, candidates, promotions, rollbacks, changes of its
/// spec and restarts; deleted, its keys are removed from the store, and created again under
/// its name (by its team or another) it starts with none of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_created_again_under_a_deleted_ones_name_starts_with_no_data() {
    let s = start(tempfile::tempdir().unwrap()).await;
    let wasm = std::fs::read(s.path("kv_probe.wasm")).unwrap();
    let create = async |s: &TestServer| {
        let spec = serde_json::json!({ "paths": ["/api"], "kv": ["default"] }).to_string();
        let (status, v) = s
            .admin_call(Method::PUT, "/admin/v1/tenants/api", spec)
            .await;
        assert_eq!(status, StatusCode::CREATED, "{v}");
    };
    let deploy = async |s: &TestServer| {
        let path = "/admin/v1/tenants/api/module";
        let (status, v) = s.admin_call(Method::PUT, path, wasm.clone()).await;
        assert_eq!(status, StatusCode::OK, "{v}");
    };
    assert_eq!(probe(&s, "/b?op=set:k:theirs").await, ["ok"]);
    create(&s).await;
    deploy(&s).await;
    assert_eq!(
        probe(&s, "/api?op=set:k:kept&op=get:k").await,
        ["ok", "kept"]
    );
    // Its own: deployed again, as a candidate (serving every client) then promoted, rolled
    // back, its spec changed, the server restarted.
    deploy(&s).await;
    let path = "/admin/v1/tenants/api/module?percent=100";
    let other = crate::rollout::variant(&wasm, "2");
    let (status, v) = s.admin_call(Method::PUT, path, other).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(probe(&s, "/api?op=get:k").await, ["kept"], "the candidate");
    for step in ["promote", "rollback"] {
        let path = format!("/admin/v1/tenants/api/{step}");
        let (status, v) = s.admin_call(Method::POST, &path, "").await;
        assert_eq!(status, StatusCode::OK, "{step}: {v}");
        assert_eq!(probe(&s, "/api?op=get:k").await, ["kept"], "{step}");
    }
    let spec = serde_json::json!({ "limits": { "max_kv_ops": 50 } }).to_string();
    let (status, v) = s
        .admin_call(Method::PATCH, "/admin/v1/tenants/api", spec)
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(probe(&s, "/api?op=get:k").await, ["kept"]);
    let dir = restart_dir(s);
    let s = start(dir).await;
    assert_eq!(probe(&s, "/api?op=get:k").await, ["kept"]);
    // Deleted: its rows leave the store's file before the answer (read after a restart:
    // a running server holds the file's lock), another tenant's stay.
    let (status, v) = s
        .admin_call(Method::DELETE, "/admin/v1/tenants/api", "")
        .await;
    assert!(status.is_success(), "{status} {v}");
    let dir = restart_dir(s);
    let rows = |tenant: &str| {
        let db = rusqlite::Connection::open(dir.path().join("data/kv/default.sqlite")).unwrap();
        let count = "SELECT count(*) FROM entries WHERE tenant LIKE ?1";
        db.query_row(count, [tenant], |r| r.get::<_, i64>(0))
            .unwrap()
    };
    assert_eq!(
        (rows("api/%"), rows("b")),
        (0, 1),
        "the deleted tenant's rows"
    );
    let s = start(dir).await;
    // Created again: nothing of the old tenant's.
    create(&s).await;
    deploy(&s).await;
    assert_eq!(
        probe(&s, "/api?op=get:k&op=list&op=set:k:new").await,
        ["none", "", "ok"],
        "the deleted tenant's keys"
    );
    // A config file's tenant keeps its own under its name, apart from it.
    assert_eq!(probe(&s, "/b?op=get:k").await, ["theirs"]);
}

/// Tenants running the Spin component of `server/guests/spin` (its `/kv/` routes): `s3` and
/// `s5` (spin-sdk 3.x and 5.x; stores `default` and `small`), `nokv` (none) and `few`
/// (`default`, 5 operations per request).
async fn start_spin() -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    spin_module(dir.path(), 3, "spin3");
    spin_module(dir.path(), 5, "spin5");
    let config = "[pool]\ninstances = 16\nmax_memory_mib = 64\n\
         [kv.small]\nmax_key_bytes = 8\n\
         [[tenant]]\nname = \"s3\"\nmodule = \"spin3.wasm\"\npaths = [\"/s3\"]\n\
         kv = [\"default\", \"small\"]\n\
         [[tenant]]\nname = \"s5\"\nmodule = \"spin5.wasm\"\npaths = [\"/s5\"]\n\
         kv = [\"default\", \"small\"]\n\
         [[tenant]]\nname = \"nokv\"\nmodule = \"spin5.wasm\"\npaths = [\"/nokv\"]\n\
         [[tenant]]\nname = \"few\"\nmodule = \"spin5.wasm\"\npaths = [\"/few\"]\n\
         kv = [\"default\"]\n[tenant.limits]\nmax_kv_ops = 5\n";
    TestServer::try_start_in(dir, config).await.expect("start")
}

/// The component's answer to `path` (POSTed with `body` if there is one): status and text.
async fn spin_kv(s: &TestServer, path: &str, body: Option<&str>) -> (u16, String) {
    let r = match body {
        Some(b) => post(s, path, &[], b.as_bytes().to_vec()).await,
        None => s.get(path).await,
    };
    (r.status.as_u16(), r.text())
}

/// A component built with spin-sdk, using `spin_sdk::key_value::Store` and `wasi:keyvalue` as
/// Spin's docs show, is served unchanged: both APIs reach the tenant's own keys of the stores
/// it is granted, with Spin's errors for a store it is not granted and the store's words for
/// limits. Before, such a component was refused at deploy (an import Tern did not provide).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spin_components_use_key_value_unchanged() {
    let s = start_spin().await;
    for t in ["s3", "s5"] {
        let ok = |text: &str| (200, text.to_string());
        let at = |p: &str| format!("/{t}/kv/{p}");
        // Each step: the path after /{t}/kv/, the body to POST, the answer.
        let steps: &[(&str, Option<&str>, &str)] = &[
            ("spin/default/get/k", None, "none"),
            ("spin/default/set/k", Some("v1"), "ok"),
            ("spin/default/get/k", None, "v1"),
            // The same keys through wasi:keyvalue.
            ("wasi/default/get/k", None, "v1"),
            ("wasi/default/set/k", Some("v2"), "ok"),
            ("spin/default/exists/k", None, "true"),
            ("spin/default/count/visits", None, "1"),
            ("spin/default/count/visits", None, "2"),
            ("spin/default/count/visits", None, "3"),
            ("wasi/default/incr/hits", None, "1"),
            ("wasi/default/incr/hits", None, "2"),
            ("wasi/default/cas/c", None, "1 after 1"),
            ("wasi/default/cas/c", None, "2 after 1"),
            ("spin/default/keys", None, "c,hits,k,visits"),
            ("wasi/default/many/zz", Some("x=1\ny=2"), "x=1,y=2,zz=none"),
            ("wasi/default/delete/k", None, "ok"),
            ("wasi/default/exists/k", None, "false"),
            ("spin/default/get/k", None, "none"),
        ];
        for &(path, body, want) in steps {
            assert_eq!(spin_kv(&s, &at(path), body).await, ok(want), "{t} {path}");
        }

        // Stores the server does not have: Spin's access-denied, as Spin answers a label its
        // manifest does not allow (a store the server has but the tenant is not granted:
        // `nokv` below).
        for store in ["nope", "other"] {
            let (status, text) = spin_kv(&s, &at(&format!("spin/{store}/get/k")), None).await;
            assert_eq!((status, text.as_str()), (500, "Error::AccessDenied"));
            let (status, text) = spin_kv(&s, &at(&format!("wasi/{store}/get/k")), None).await;
            assert_eq!((status, text.as_str()), (500, "Error::AccessDenied"));
        }
        // The store's limits in its own words: keys of 8 bytes pass, 9 do not.
        let r = spin_kv(&s, &at("spin/small/set/12345678"), Some("v")).await;
        assert_eq!(r, ok("ok"));
        let (status, text) = spin_kv(&s, &at("spin/small/set/123456789"), Some("v")).await;
        assert_eq!(status, 500);
        assert!(
            text.contains("Other") && text.contains("max_key_bytes (8)"),
            "{text}"
        );
        assert_eq!(
            spin_kv(&s, &at("spin/default/set/t"), Some("text")).await,
            ok("ok")
        );
        let (status, text) = spin_kv(&s, &at("wasi/default/incr/t"), None).await;
        assert_eq!(status, 500);
        assert!(text.contains("not a decimal 64-bit integer"), "{text}");
    }
    // Each tenant's keys are its own: s3 and s5 share the store `default`, not its keys.
    assert_eq!(
        spin_kv(&s, "/s3/kv/spin/default/get/visits", None).await,
        (200, "3".to_string())
    );
    let (status, text) = spin_kv(&s, "/nokv/kv/spin/default/get/visits", None).await;
    assert_eq!((status, text.as_str()), (500, "Error::AccessDenied"));

    // The wait is the request's kv phase, for components as for the tern ABI.
    let r = s.get("/s5/kv/spin/default/get/visits").await;
    assert!(
        r.header("server-timing").contains(", kv;dur="),
        "{}",
        r.header("server-timing")
    );

    // Listing a page at a time: 300 more keys make 2 pages of wasi:keyvalue's list-keys, and
    // Spin's get-keys has them all.
    let lines: Vec<String> = (0..300).map(|i| format!("k{i:03}=v")).collect();
    let (status, _) = spin_kv(&s, "/s5/kv/wasi/default/many/k000", Some(&lines.join("\n"))).await;
    assert_eq!(status, 200);
    let (status, text) = spin_kv(&s, "/s5/kv/wasi/default/list/", None).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        text,
        "306 keys in 2 pages, first Some(\"c\"), last Some(\"y\")"
    );
    let (status, text) = spin_kv(&s, "/s5/kv/spin/default/keys", None).await;
    assert_eq!((status, text.split(',').count()), (200, 306));

    // Operations per request count for components too (opening a store is one): 5 pass, the
    // 6th is refused with the limit's name.
    let few = |n: usize| {
        (0..n)
            .map(|i| format!("f{i}=1"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let (status, text) = spin_kv(&s, "/few/kv/wasi/default/many/f0", Some(&few(1))).await;
    assert_eq!(
        (status, text.as_str()),
        (200, "f0=1,f0=1"),
        "open, set, get, get"
    );
    let (status, text) = spin_kv(&s, "/few/kv/wasi/default/many/f0", Some(&few(2))).await;
    assert_eq!(
        status, 500,
        "open, 2 sets, then a 4th, 5th and 6th get: {text}"
    );
    assert!(text.contains("limits.max_kv_ops"), "{text}");
}

/// Compare-and-swap from many concurrent requests of a component: every increment counts
/// once, however many retries it took.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_compare_and_swap_from_components_all_count() {
    let s = start_spin().await;
    let addr = s.addr();
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            tokio::spawn(async move {
                let r = get_at(addr, "/s5/kv/wasi/default/cas/n").await;
                assert_eq!(r.status, StatusCode::OK, "{}", r.text());
                let text = r.text();
                let n = text.split(' ').next().unwrap_or_default();
                n.parse::<u64>().expect("a count")
            })
        })
        .collect();
    let mut seen = Vec::new();
    for t in tasks {
        seen.push(t.await.unwrap());
    }
    seen.sort_unstable();
    assert_eq!(seen, (1..=50).collect::<Vec<_>>());
    assert_eq!(
        spin_kv(&s, "/s5/kv/spin/default/get/n", None).await,
        (200, "50".to_string())
    );
}

/// A real `redis-server` on 127.0.0.1 (Debian's; `bash scripts/test` installs it), saving
/// nothing to disk.
pub struct Redis {
    child: std::process::Child,
    pub port: u16,
}

impl Redis {
    pub fn start() -> Self {
        let port = crate::support::free_port();
        Self {
            child: Self::spawn(port),
            port,
        }
    }

    fn spawn(port: u16) -> std::process::Child {
        let mut child = std::process::Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server (apt-get install redis-server; bash scripts/test does)");
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return child;
            }
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("redis-server did not listen on port {port}");
    }

    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A server's config with the store `shared` on the Redis at 127.0.0.1:`port`, granted to
/// tenant `a` (the `kv_probe` guest, `/a`) and `s5` (a spin-sdk 5 component, `/s5`).
fn redis_config(port: u16) -> String {
    format!(
        "[pool]\ninstances = 8\nmax_memory_mib = 64\n\
         [kv.shared]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:{port}\"\ntimeout_ms = 500\n\
         [[tenant]]\nname = \"a\"\nmodule = \"kv_probe.wasm\"\npaths = [\"/a\"]\n\
         kv = [\"shared\"]\n\
         [[tenant]]\nname = \"s5\"\nmodule = \"spin5.wasm\"\npaths = [\"/s5\"]\n\
         kv = [\"shared\"]\n"
    )
}

/// A tenant of the admin API deleted: its keys leave a Redis store (the three Redis keys
/// that hold them) before the answer, another tenant's stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_tenants_keys_leave_a_redis_store() {
    let redis = Redis::start();
    let dir = tempfile::tempdir().unwrap();
    test_guest(dir.path(), "kv_probe");
    spin_module(dir.path(), 5, "spin5");
    let s = TestServer::try_start_in(dir, &redis_config(redis.port))
        .await
        .expect("start");
    let spec = serde_json::json!({ "paths": ["/api"], "kv": ["shared"] }).to_string();
    let (status, v) = s
        .admin_call(Method::PUT, "/admin/v1/tenants/api", spec)
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    let wasm = std::fs::read(s.path("kv_probe.wasm")).unwrap();
    let (status, v) = s
        .admin_call(Method::PUT, "/admin/v1/tenants/api/module", wasm)
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    for tenant in ["a", "api"] {
        let set = format!("/{tenant}?store=shared&op=set:k:v");
        assert_eq!(probe(&s, &set).await, ["opened", "ok"]);
    }
    let url = format!("redis://127.0.0.1:{}", redis.port);
    let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
    let mut keys = |pattern: &str| -> Vec<String> {
        let mut found: Vec<String> = redis::cmd("KEYS").arg(pattern).query(&mut conn).unwrap();
        found.sort();
        found
    };
    assert_eq!(keys("*{api/*").len(), 3, "{:?}", keys("*"));
    let theirs = keys("*{a}*");
    assert_eq!(theirs.len(), 3, "{:?}", keys("*"));
    let (status, v) = s
        .admin_call(Method::DELETE, "/admin/v1/tenants/api", "")
        .await;
    assert!(status.is_success(), "{status} {v}");
    // Gone before the answer.
    assert_eq!(
        keys("*{api/*"),
        [] as [String; 0],
        "the deleted tenant's keys"
    );
    assert_eq!(keys("*{a}*"), theirs, "another tenant's keys");
    assert_eq!(probe(&s, "/a?store=shared&op=get:k").await, ["opened", "v"]);
}

/// Two servers (replicas of a fleet) with one Redis store: guests of both kinds on either see
/// the same keys, and their increments all count. Redis going away fails the guests' calls
/// with the reason (the servers serve on); once it is back they work again by themselves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_store_is_shared_by_replicas_and_outlives_redis_going_away() {
    let mut redis = Redis::start();
    let config = redis_config(redis.port);
    let mut replicas = Vec::new();
    for _ in 0..2 {
        let dir = tempfile::tempdir().unwrap();
        test_guest(dir.path(), "kv_probe");
        spin_module(dir.path(), 5, "spin5");
        replicas.push(TestServer::try_start_in(dir, &config).await.expect("start"));
    }
    let (one, two) = (&replicas[0], &replicas[1]);
    assert_eq!(
        probe(one, "/a?store=shared&op=set:k:hello&op=incr:n:1").await,
        ["opened", "ok", "1"]
    );
    assert_eq!(
        probe(two, "/a?store=shared&op=get:k&op=incr:n:1&op=list").await,
        ["opened", "hello", "2", "k,n"]
    );
    for (s, n) in [(one, "1"), (two, "2"), (one, "3")] {
        assert_eq!(
            spin_kv(s, "/s5/kv/wasi/shared/incr/hits", None).await,
            (200, n.to_string())
        );
    }
    // Concurrent increments through both replicas: every one counts.
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            let addr = replicas[i % 2].addr();
            tokio::spawn(async move { get_at(addr, "/a?store=shared&op=incr:c:1").await })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap().status, StatusCode::OK);
    }
    assert_eq!(
        probe(one, "/a?store=shared&op=get:c").await,
        ["opened", "40"]
    );

    // Redis stops: the guests' calls fail with the reason, the servers answer.
    redis.stop();
    let got = probe(one, "/a?store=shared&op=get:k").await;
    assert!(
        got[1].starts_with("error=IO ") && got[1].contains("store \"shared\" (Redis)"),
        "{got:?}"
    );
    let (status, text) = spin_kv(two, "/s5/kv/spin/shared/get/k", None).await;
    assert!(status == 500 && text.contains("(Redis)"), "{status} {text}");
    assert_eq!(one.get("/a").await.status, StatusCode::OK);
    let m = one.metrics().await;
    assert!(
        metric_value(
            &m,
            "tern_kv_operations_total{result=\"unavailable\",store=\"shared\"}"
        ) >= 1.0,
        "{m}"
    );

    // Back (empty: it saved nothing): the first calls on each replica reconnect and succeed
    // (they failed with the refusal of the last reconnection while Redis was down).
    redis.child = Redis::spawn(redis.port);
    assert_eq!(
        probe(two, "/a?store=shared&op=set:k:again&op=get:k").await,
        ["opened", "ok", "again"]
    );
    assert_eq!(
        probe(one, "/a?store=shared&op=get:k").await,
        ["opened", "again"]
    );
    assert_eq!(
        spin_kv(one, "/s5/kv/wasi/shared/incr/hits", None).await,
        (200, "1".to_string())
    );
}

/// A write Redis applied whose reply was lost (the connection cut after the write was sent):
/// the guest is told the outcome is unknown (`UNKNOWN_OUTCOME`, a component's `other` text
/// saying so), not `IO`, and the write was indeed applied, once. A store that refuses the
/// connection is `IO`: nothing was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_reply_redis_lost_is_told_apart_from_one_never_sent() {
    let mut redis = Redis::start();
    let proxy = crate::faults::RedisProxy::start(redis.port).await;
    let config = redis_config(proxy.port);
    let dir = tempfile::tempdir().unwrap();
    test_guest(dir.path(), "kv_probe");
    spin_module(dir.path(), 5, "spin5");
    let s = TestServer::try_start_in(dir, &config).await.expect("start");
    // A first write loads the write script into Redis.
    assert_eq!(
        probe(&s, "/a?store=shared&op=incr:n:1").await,
        ["opened", "1"]
    );

    // The reply to the next increment is lost: applied, and the guest knows it may have been.
    proxy.arm();
    let got = probe(&s, "/a?store=shared&op=incr:n:1").await;
    assert_eq!(proxy.applied(), 1, "the reply was lost");
    assert!(
        got[1].starts_with("error=UNKNOWN_OUTCOME ")
            && got[1].contains("may have been applied")
            && got[1].contains("store \"shared\" (Redis)"),
        "{got:?}"
    );
    assert_eq!(
        probe(&s, "/a?store=shared&op=get:n").await,
        ["opened", "2"],
        "applied once"
    );
    // The same for a component's wasi:keyvalue increment.
    proxy.arm();
    let (status, text) = spin_kv(&s, "/s5/kv/wasi/shared/incr/hits", None).await;
    assert_eq!(proxy.applied(), 2);
    assert!(
        status == 500 && text.contains("outcome unknown") && text.contains("may have been applied"),
        "{status} {text}"
    );
    assert_eq!(
        spin_kv(&s, "/s5/kv/wasi/shared/incr/hits", None).await,
        (200, "2".to_string()),
        "the lost one counted"
    );
    let m = s.metrics().await;
    assert_eq!(
        metric_value(
            &m,
            "tern_kv_operations_total{result=\"unknown\",store=\"shared\"}"
        ),
        2.0,
        "{m}"
    );

    // Redis (and the proxy) gone: once the connection is refused, a write is IO (nothing
    // was sent).
    drop(proxy);
    redis.stop();
    let mut last = Vec::new();
    for _ in 0..3 {
        last = probe(&s, "/a?store=shared&op=incr:n:1").await;
    }
    assert!(last[1].starts_with("error=IO "), "{last:?}");
}
