//! Tenants at runtime: the admin API (deploy, rollback, delete, create, list), its token, bad
//! uploads, the durable store across restarts and crashes, and config reloads.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bytes::Bytes;
use http::{Method, StatusCode};
use serde_json::json;

use crate::support::{self, ADMIN_TOKEN, Conn, TestServer, demo, metric_is, send};

mod assets;
mod cli;

const HELLO: &str = "Hello from Tern!\n";

#[tokio::test]
async fn deploy_over_http_then_call_the_tenant() {
    let s = TestServer::start("").await;
    assert_eq!(s.get("/app").await.status, StatusCode::NOT_FOUND);
    let v = s.deploy("app", "/app", demo("hello")).await;
    let version = v["version"].as_str().unwrap();
    assert_eq!(version.len(), 64, "{v}");
    assert!(
        v["module_bytes"].as_u64().unwrap() > 0 && v["previous"].is_null(),
        "{v}"
    );
    assert_eq!(s.get("/app/x").await.text(), HELLO);

    let (status, list) = s.admin_call(Method::GET, "/admin/v1/tenants", "").await;
    assert_eq!(status, StatusCode::OK);
    let t = &list["tenants"][0];
    assert_eq!(
        (t["name"].as_str(), t["source"].as_str()),
        (Some("app"), Some("api"))
    );
    assert_eq!(t["current"]["id"], version);
    assert_eq!(t["paths"], json!(["/app"]));
    assert_eq!(t["requests"]["2xx"], 1, "{t}");
    let (status, one) = s.admin_call(Method::GET, "/admin/v1/tenants/app", "").await;
    assert_eq!((status, &one["name"]), (StatusCode::OK, &json!("app")));
    assert_eq!(
        s.admin_status(Method::GET, "/admin/v1/tenants/nope").await,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn partial_updates_change_only_what_they_name() {
    let s = TestServer::start("").await;
    s.deploy("app", "/app", demo("hello")).await;
    let spec = json!({ "paths": ["/app"], "env": { "A": "1" } }).to_string();
    let (status, v) = s
        .admin_call(Method::PUT, "/admin/v1/tenants/app", spec)
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let spec_of = |v: &serde_json::Value| v["spec"].clone();

    // A PUT naming only `outbound` would reset the routes (to every path) and the env: 409,
    // and nothing changes.
    let only_outbound =
        json!({ "outbound": { "backends": { "origin": { "url": "http://127.0.0.1:9" } } } });
    let (status, v) = s
        .admin_call(
            Method::PUT,
            "/admin/v1/tenants/app",
            only_outbound.to_string(),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    let e = v["error"].as_str().unwrap();
    assert!(
        e.contains("`paths`") && e.contains("`env`") && e.contains("PATCH"),
        "{e}"
    );
    assert_eq!(s.get("/elsewhere").await.status, StatusCode::NOT_FOUND);
    assert_eq!(s.get("/app").await.text(), HELLO);

    // PATCH changes what it names and keeps the rest.
    let (status, v) = s
        .admin_call(
            Method::PATCH,
            "/admin/v1/tenants/app",
            only_outbound.to_string(),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let spec = spec_of(&v);
    assert_eq!(spec["paths"], json!(["/app"]), "{v}");
    assert_eq!(spec["env"], json!({ "A": "1" }), "{v}");
    assert_eq!(
        spec["outbound"]["backends"]["origin"]["url"],
        "http://127.0.0.1:9"
    );
    assert_eq!(s.get("/elsewhere").await.status, StatusCode::NOT_FOUND);
    assert_eq!(s.get("/app").await.text(), HELLO);
    // A nested field merges; `null` resets a field to its default.
    let patch = json!({ "limits": { "timeout_ms": 900 }, "env": null });
    let (status, v) = s
        .admin_call(Method::PATCH, "/admin/v1/tenants/app", patch.to_string())
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let spec = spec_of(&v);
    assert_eq!(spec["limits"]["timeout_ms"], 900, "{v}");
    assert_eq!(spec["env"], json!({}), "{v}");
    assert_eq!(spec["paths"], json!(["/app"]), "{v}");
    assert!(spec["outbound"]["backends"]["origin"].is_object(), "{v}");

    // Widening the route is explicit: named, it is done.
    let (status, v) = s
        .admin_call(
            Method::PATCH,
            "/admin/v1/tenants/app",
            json!({ "paths": [] }).to_string(),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(s.get("/elsewhere").await.text(), HELLO);

    // Bad patches change nothing: unknown fields, bad values, a tenant that does not exist.
    for (path, body, want) in [
        (
            "/admin/v1/tenants/app",
            json!({ "pahts": ["/x"] }),
            StatusCode::BAD_REQUEST,
        ),
        (
            "/admin/v1/tenants/app",
            json!({ "limits": { "timeout_ms": 0 } }),
            StatusCode::BAD_REQUEST,
        ),
        (
            "/admin/v1/tenants/app",
            json!(["/x"]),
            StatusCode::BAD_REQUEST,
        ),
        (
            "/admin/v1/tenants/nope",
            json!({ "paths": ["/x"] }),
            StatusCode::NOT_FOUND,
        ),
    ] {
        let (status, v) = s.admin_call(Method::PATCH, path, body.to_string()).await;
        assert_eq!(status, want, "{body}: {v}");
    }
    let (_, v) = s.admin_call(Method::GET, "/admin/v1/tenants/app", "").await;
    assert_eq!(spec_of(&v)["limits"]["timeout_ms"], 900, "{v}");
}

#[tokio::test]
async fn redeploys_under_load_fail_no_request() {
    let s = TestServer::start("").await;
    s.deploy("app", "/app", demo("hello")).await;
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut load = Vec::new();
    for _ in 0..4 {
        let (addr, stop, ok, failed) = (s.addr(), stop.clone(), ok.clone(), failed.clone());
        load.push(tokio::spawn(async move {
            let mut conn = Conn::open(addr).await;
            while !stop.load(Ordering::Relaxed) {
                let r = conn.get("/app").await;
                if r.status == StatusCode::OK {
                    ok.fetch_add(1, Ordering::Relaxed);
                } else {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    // Alternate two versions while the load runs: every request must succeed.
    for i in 0..6 {
        let wasm = if i % 2 == 0 {
            demo("counter")
        } else {
            demo("hello")
        };
        let (status, v) = s
            .admin_call(Method::PUT, "/admin/v1/tenants/app/module", wasm.to_vec())
            .await;
        assert_eq!(status, StatusCode::OK, "{v}");
    }
    stop.store(true, Ordering::Relaxed);
    for l in load {
        l.await.unwrap();
    }
    assert_eq!(failed.load(Ordering::Relaxed), 0);
    assert!(ok.load(Ordering::Relaxed) > 0);
}

#[tokio::test]
async fn rollback_returns_to_the_previous_version_and_back() {
    let s = TestServer::start("").await;
    let first = s.deploy("app", "/app", demo("hello")).await;
    let second = s.deploy("app", "/app", demo("counter")).await;
    assert_eq!(second["previous"], first["version"]);
    assert_ne!(s.get("/app").await.text(), HELLO);
    let (status, v) = s
        .admin_call(Method::POST, "/admin/v1/tenants/app/rollback", "")
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["version"], first["version"]);
    assert_eq!(s.get("/app").await.text(), HELLO);
    // A second rollback undoes the first.
    s.admin_call(Method::POST, "/admin/v1/tenants/app/rollback", "")
        .await;
    assert_ne!(s.get("/app").await.text(), HELLO);

    s.deploy("solo", "/solo", demo("hello")).await;
    let (status, v) = s
        .admin_call(Method::POST, "/admin/v1/tenants/solo/rollback", "")
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    assert!(v["error"].as_str().unwrap().contains("no previous version"));

    assert_eq!(
        s.admin_status(Method::DELETE, "/admin/v1/tenants/app")
            .await,
        StatusCode::OK
    );
    assert_eq!(s.get("/app").await.status, StatusCode::NOT_FOUND);
    assert_eq!(
        s.admin_status(Method::DELETE, "/admin/v1/tenants/app")
            .await,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn bad_uploads_are_refused_and_the_running_version_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let config =
        "[pool]\ninstances = 8\nmax_memory_mib = 64\n[server]\nmax_upload_bytes = 300000\n";
    let s = TestServer::try_start_in(dir, config).await.unwrap();
    s.deploy("app", "/app", demo("hello")).await;
    let hello = demo("hello");
    let wat = |w: &str| wat::parse_str(w).unwrap();
    let cases: Vec<(&str, Vec<u8>, StatusCode, &str)> = vec![
        (
            "text",
            b"hello world".to_vec(),
            StatusCode::BAD_REQUEST,
            "not a WebAssembly module",
        ),
        ("empty", Vec::new(), StatusCode::BAD_REQUEST, "empty"),
        (
            "truncated",
            hello[..hello.len() / 2].to_vec(),
            StatusCode::BAD_REQUEST,
            "not a valid WebAssembly module",
        ),
        (
            "too large",
            vec![0u8; 400_000],
            StatusCode::PAYLOAD_TOO_LARGE,
            "larger than",
        ),
        (
            "artifact",
            b"\x7fELF\x02\x01\x01\0".to_vec(),
            StatusCode::BAD_REQUEST,
            "compiled artifact",
        ),
        (
            "component",
            b"\0asm\x0d\0\x01\0".to_vec(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "component",
        ),
        (
            "unknown import",
            wat(
                r#"(module (import "env" "socket" (func)) (memory (export "memory") 1) (func (export "_start")))"#,
            ),
            StatusCode::UNPROCESSABLE_ENTITY,
            "env::socket",
        ),
        (
            "no handler",
            wat(r#"(module (memory (export "memory") 1))"#),
            StatusCode::UNPROCESSABLE_ENTITY,
            "_start",
        ),
    ];
    for (what, body, want, message) in cases {
        let (status, v) = s
            .admin_call(Method::PUT, "/admin/v1/tenants/app/module", body)
            .await;
        assert_eq!(status, want, "{what}: {v}");
        let error = v["error"].as_str().unwrap_or_default();
        assert!(error.contains(message), "{what}: {error}");
        assert_eq!(s.get("/app").await.text(), HELLO, "after {what}");
    }
    let metrics = s.metrics().await;
    assert!(
        metric_is(
            &metrics,
            r#"tern_deploys_total{outcome="error",tenant="app"}"#,
            7.0
        ),
        "{metrics}"
    );
    // Unknown tenants and bad specs.
    let (status, _) = s
        .admin_call(
            Method::PUT,
            "/admin/v1/tenants/ghost/module",
            hello.to_vec(),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    for spec in [r#"{"paths": ["nope"]}"#, r#"{"bogus": 1}"#, "not json"] {
        let (status, v) = s.admin_call(Method::PUT, "/admin/v1/tenants/x", spec).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{spec}: {v}");
    }
    let (status, _) = s
        .admin_call(Method::PUT, "/admin/v1/tenants/bad%20name", "{}")
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn route_clashes_and_config_tenants_are_409() {
    let s = TestServer::start(
        "[[tenant]]\nname = \"hello\"\nmodule = \"builtin:hello\"\npaths = [\"/hello\"]\n",
    )
    .await;
    let (status, v) = s
        .admin_call(
            Method::PUT,
            "/admin/v1/tenants/intruder",
            r#"{"paths": ["/hello/"]}"#,
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    assert!(v["error"].as_str().unwrap().contains("\"hello\""), "{v}");
    for (method, path) in [
        (Method::PUT, "/admin/v1/tenants/hello/module"),
        (Method::DELETE, "/admin/v1/tenants/hello"),
        (Method::POST, "/admin/v1/tenants/hello/rollback"),
    ] {
        let (status, v) = s.admin_call(method, path, demo("json").to_vec()).await;
        assert_eq!(status, StatusCode::CONFLICT, "{path}: {v}");
        assert!(v["error"].as_str().unwrap().contains("config file"), "{v}");
    }
    // A tenant created without a module reserves its routes too.
    let (status, _) = s
        .admin_call(
            Method::PUT,
            "/admin/v1/tenants/a",
            r#"{"hosts": ["a.test"]}"#,
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, v) = s
        .admin_call(
            Method::PUT,
            "/admin/v1/tenants/b",
            r#"{"hosts": ["A.test"]}"#,
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    let (status, v) = s
        .admin_call(
            Method::PUT,
            "/admin/v1/tenants/a",
            r#"{"hosts": ["a.test"], "paths": ["/v2"]}"#,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(s.get("/hello").await.text(), HELLO);
}

#[tokio::test]
async fn unauthorised_requests_are_refused_and_the_public_port_has_no_admin_api() {
    let s = TestServer::start("").await;
    for auth in [
        None,
        Some("Bearer wrong"),
        Some("test-admin-token"),
        Some("Bearer "),
    ] {
        let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("authorization", *a)).collect();
        let r = send(
            s.admin(),
            Method::GET,
            "/admin/v1/tenants",
            None,
            &headers,
            Bytes::new(),
        )
        .await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{auth:?}");
        assert!(r.header("www-authenticate").starts_with("Bearer"));
        let r = send(
            s.admin(),
            Method::PUT,
            "/admin/v1/tenants/x/module",
            None,
            &headers,
            Bytes::from_static(demo("hello")),
        )
        .await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    }
    let auth = format!("Bearer {ADMIN_TOKEN}");
    let r = send(
        s.addr(),
        Method::GET,
        "/admin/v1/tenants",
        None,
        &[("authorization", &auth)],
        Bytes::new(),
    )
    .await;
    assert_eq!(
        r.status,
        StatusCode::NOT_FOUND,
        "public listener: {}",
        r.text()
    );
    assert!(!r.text().contains("tenants\""));
}

#[tokio::test]
async fn restart_brings_every_tenant_back_without_recompiling() {
    let config = "[pool]\ninstances = 8\nmax_memory_mib = 64\n";
    let first = TestServer::try_start_in(tempfile::tempdir().unwrap(), config)
        .await
        .unwrap();
    for (name, guest) in [("a", "hello"), ("b", "json")] {
        let spec = format!(r#"{{"paths": ["/{name}"], "env": {{"K": "v"}}}}"#);
        let (status, v) = first
            .admin_call(Method::PUT, &format!("/admin/v1/tenants/{name}"), spec)
            .await;
        assert_eq!(status, StatusCode::CREATED, "{v}");
        let (status, v) = first
            .admin_call(
                Method::PUT,
                &format!("/admin/v1/tenants/{name}/module"),
                demo(guest).to_vec(),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{v}");
    }
    // A second server on the same data directory.
    let TestServer { running, dir } = first;
    running.shutdown.trigger();
    running.wait().await;
    let second = TestServer::try_start_in(dir, config).await.unwrap();
    assert_eq!(second.get("/a").await.text(), HELLO);
    let r = send(
        second.addr(),
        Method::POST,
        "/b",
        None,
        &[],
        Bytes::from_static(b"[1]"),
    )
    .await;
    assert!(r.text().contains("\"array\""), "{}", r.text());
    let metrics = second.metrics().await;
    assert!(
        metric_is(&metrics, "tern_module_compile_duration_seconds_count", 0.0),
        "the restart recompiled: {}",
        metrics
            .lines()
            .filter(|l| l.contains("compile"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[tokio::test]
async fn a_crash_between_writes_is_recovered_at_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = "[pool]\ninstances = 8\nmax_memory_mib = 64\n";
    let s = TestServer::try_start_in(dir, config).await.unwrap();
    s.deploy("app", "/app", demo("hello")).await;
    let TestServer { running, dir } = s;
    running.shutdown.trigger();
    running.wait().await;
    // What a kill -9 in the middle of a deploy leaves: temp files next to complete ones.
    std::fs::write(
        data.join(".manifest.json.tmp-99-0"),
        b"{\"format\": 1, \"tena",
    )
    .unwrap();
    std::fs::write(data.join("blobs/.0123.tmp-99-1"), b"\0asm\x01").unwrap();
    std::fs::write(data.join("artifacts/.x.cwasm.tmp-99-2"), b"\x7fELF").unwrap();
    let s = TestServer::try_start_in(dir, config).await.unwrap();
    assert_eq!(s.get("/app").await.text(), HELLO);
    for leftover in [
        ".manifest.json.tmp-99-0",
        "blobs/.0123.tmp-99-1",
        "artifacts/.x.cwasm.tmp-99-2",
    ] {
        assert!(!data.join(leftover).exists(), "{leftover} was not removed");
    }
    // A damaged artifact is not trusted: the module is compiled again from the stored .wasm.
    let TestServer { running, dir } = s;
    running.shutdown.trigger();
    running.wait().await;
    for entry in std::fs::read_dir(data.join("artifacts")).unwrap() {
        let path = entry.unwrap().path();
        let mut bytes = std::fs::read(&path).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0xff;
        crate::support::replace_file(&path, &bytes);
    }
    let s = TestServer::try_start_in(dir, config).await.unwrap();
    assert_eq!(s.get("/app").await.text(), HELLO);
}

fn config_file(dir: &std::path::Path) -> std::path::PathBuf {
    let p = dir.join("notes.txt");
    std::fs::write(&p, "not wasm").unwrap();
    p
}

/// The stored files (blobs and artifacts) of a data directory, by the module hash they start
/// with.
fn stored_hashes(data: &std::path::Path) -> Vec<String> {
    let mut hashes: Vec<String> = ["blobs", "artifacts"]
        .iter()
        .flat_map(|d| {
            std::fs::read_dir(data.join(d))
                .into_iter()
                .flatten()
                .flatten()
        })
        .map(|e| e.file_name().to_string_lossy()[..64].to_string())
        .collect();
    hashes.sort();
    hashes.dedup();
    hashes
}

fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest;
    tern::hex::encode(&sha2::Sha256::digest(bytes))
}

#[tokio::test]
async fn modules_that_do_not_fit_are_422_and_nothing_refused_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = "[pool]\ninstances = 8\nmax_memory_mib = 64\ntable_elements = 1000\n";
    let s = TestServer::try_start_in(dir, config).await.unwrap();
    s.deploy("app", "/app", demo("hello")).await;
    let module = |memory: &str, table: &str| {
        wat::parse_str(format!(
            r#"(module {memory} {table} (func (export "_start")))"#
        ))
        .unwrap()
    };
    let one_page = r#"(memory (export "memory") 1)"#;
    let cases = [
        (
            "4 GiB memory",
            module(r#"(memory (export "memory") 65536)"#, ""),
            "4096 MiB",
        ),
        (
            "memory a page over",
            module(r#"(memory (export "memory") 1025)"#, ""),
            "65 MiB",
        ),
        (
            "two memories",
            module(&format!("(memory 1) {one_page}"), ""),
            "2 memories",
        ),
        (
            "table over",
            module(one_page, "(table 1001 funcref)"),
            "1001 elements",
        ),
        (
            "two tables",
            module(one_page, "(table 1 funcref) (table 1 funcref)"),
            "2 tables",
        ),
        (
            "no handler",
            wat::parse_str(r#"(module (memory (export "memory") 1))"#).unwrap(),
            "_start",
        ),
    ];
    for (what, wasm, message) in cases {
        let (status, v) = s
            .admin_call(Method::PUT, "/admin/v1/tenants/app/module", wasm)
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{what}: {v}");
        let error = v["error"].as_str().unwrap_or_default();
        assert!(error.contains(message), "{what}: {error}");
        assert!(
            !error.contains(&data.display().to_string()),
            "{what}: {error}"
        );
        assert_eq!(s.get("/app").await.text(), HELLO, "after {what}");
    }
    // Nothing refused is kept: only the serving version's files are stored.
    assert_eq!(stored_hashes(&data), vec![sha256(demo("hello"))]);

    // Right at the limits, a module fits.
    let edge = module(r#"(memory (export "memory") 1024)"#, "(table 1000 funcref)");
    s.deploy_as("edge", "/edge", &edge, "tern").await;
    assert_eq!(s.get("/edge").await.status, StatusCode::OK);

    // Versions a change drops are removed while the server runs.
    s.deploy("app", "/app", demo("echo")).await;
    s.deploy("app", "/app", demo("json")).await; // hello is now older than `previous`
    let mut want = vec![sha256(demo("echo")), sha256(demo("json")), sha256(&edge)];
    want.sort();
    assert_eq!(stored_hashes(&data), want);
    let (status, _) = s
        .admin_call(Method::DELETE, "/admin/v1/tenants/app", Bytes::new())
        .await;
    assert!(status.is_success(), "{status}");
    assert_eq!(stored_hashes(&data), vec![sha256(&edge)]);
}

/// A module whose one function is `blocks` empty blocks in a row.
fn many_blocks(blocks: usize) -> Vec<u8> {
    fn leb(mut n: usize, out: &mut Vec<u8>) {
        loop {
            let b = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    }
    fn section(id: u8, payload: &[u8], out: &mut Vec<u8>) {
        out.push(id);
        leb(payload.len(), out);
        out.extend_from_slice(payload);
    }
    let mut body = vec![0u8]; // no locals
    for _ in 0..blocks {
        body.extend_from_slice(&[0x02, 0x40, 0x0b]);
    }
    body.push(0x0b);
    let mut code = vec![1u8];
    leb(body.len(), &mut code);
    code.extend_from_slice(&body);
    let mut m = b"\0asm\x01\0\0\0".to_vec();
    section(1, &[1, 0x60, 0, 0], &mut m);
    section(3, &[1, 0], &mut m);
    section(5, &[1, 0, 1], &mut m);
    let mut exports = vec![2u8, 6];
    exports.extend_from_slice(b"_start\x00\x00\x06memory\x02\x00");
    section(7, &exports, &mut m);
    section(10, &code, &mut m);
    m
}

/// Compiling takes memory in proportion to a function's blocks: past the bound a deploy is
/// refused before it is compiled, and at the bound it is served.
#[tokio::test]
async fn functions_too_costly_to_compile_are_422() {
    let s = TestServer::start("").await;
    s.deploy("app", "/app", demo("hello")).await;
    let max = tern::artifact::MAX_BLOCKS_PER_FUNCTION;
    let (status, v) = s
        .admin_call(
            Method::PUT,
            "/admin/v1/tenants/app/module",
            many_blocks(max + 1),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    let error = v["error"].as_str().unwrap_or_default();
    assert!(
        error.contains(&format!("{} control blocks", max + 1)),
        "{error}"
    );
    assert_eq!(s.get("/app").await.text(), HELLO);
    s.deploy_as("edge", "/edge", &many_blocks(max), "tern")
        .await;
    assert_eq!(s.get("/edge").await.status, StatusCode::OK);
}

#[tokio::test]
async fn a_module_that_imports_nothing_from_tern_is_cgi_unless_deployed_as_tern() {
    let s = TestServer::start("").await;
    let plain = wat::parse_str(r#"(module (memory (export "memory") 1) (func (export "_start")))"#)
        .unwrap();
    // Detected as a CGI program: it writes nothing, which CGI answers with 502.
    let v = s.deploy("plain", "/plain", &plain).await;
    assert_eq!(
        (v["kind"].as_str(), &v["warnings"]),
        (Some("cgi"), &serde_json::json!([]))
    );
    let r = s.get("/plain").await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY);
    assert!(r.text().contains("wrote nothing to stdout"), "{}", r.text());
    // Deployed as `tern`, it is run as before, with a warning saying what it cannot do.
    let v = s.deploy_as("plain", "/plain", &plain, "tern").await;
    let warning = v["warnings"][0].as_str().unwrap_or_default();
    assert!(
        warning.contains("imports nothing from `tern`") && warning.contains("kind `cgi`"),
        "{v}"
    );
    assert_eq!(s.get("/plain").await.status, StatusCode::OK);
    let v = s.deploy("sdk", "/sdk", demo("hello")).await;
    assert_eq!(v["kind"], "tern");
    assert_eq!(v["warnings"], serde_json::json!([]), "{v}");
}
