//! Hostile admin input: every value is checked and bounded, and what is refused is named.

use bytes::Bytes;
use http::{Method, StatusCode};

use crate::support::{ADMIN_TOKEN, TestServer, send, wat_file};

#[tokio::test]
async fn the_token_is_compared_exactly() {
    let s = TestServer::start("").await;
    for auth in [
        format!("Bearer {ADMIN_TOKEN}"),
        format!("Bearer   {ADMIN_TOKEN}"),
        format!("Bearer \t{ADMIN_TOKEN}"),
        format!("Bearer {ADMIN_TOKEN}x"),
    ] {
        let r = send(
            s.admin(),
            Method::GET,
            "/admin/v1/tenants",
            None,
            &[("authorization", &auth)],
            Bytes::new(),
        )
        .await;
        let exact = auth == format!("Bearer {ADMIN_TOKEN}");
        let want = if exact {
            StatusCode::OK
        } else {
            StatusCode::UNAUTHORIZED
        };
        assert_eq!(r.status, want, "{auth:?}");
    }
}

#[tokio::test]
async fn tenant_specs_out_of_bounds_are_400_naming_the_value() {
    let s = TestServer::start("").await;
    let cases = [
        (
            r#"{"paths": ["/x"], "limits": {"timeout_ms": 18446744073709551615}}"#,
            "limits.timeout_ms",
        ),
        (
            r#"{"paths": ["/x"], "limits": {"timeout_ms": 0}}"#,
            "limits.timeout_ms",
        ),
        (
            r#"{"paths": ["/x"], "limits": {"stdio_bytes": 1099511627776}}"#,
            "limits.stdio_bytes",
        ),
        (
            r#"{"paths": ["/x"], "limits": {"max_request_bytes": 18446744073709551615}}"#,
            "limits.max_request_bytes",
        ),
        (
            r#"{"paths": ["/x"], "limits": {"max_concurrency": 100000}}"#,
            "limits.max_concurrency",
        ),
        (r#"{"paths": ["/x"], "env": {"A": "a\u0000b"}}"#, "NUL"),
        (r#"{"paths": ["/../x"]}"#, "segments"),
        (r#"{"paths": ["/a/./b"]}"#, "segments"),
        (r#"{"paths": ["/a//b"]}"#, "segments"),
        (r#"{"paths": ["/%2e%2e"]}"#, "plain path"),
        (r#"{"hosts": [""]}"#, "empty host"),
        (r#"{"paths": ["/a", "/a/"]}"#, "listed twice"),
        (r#"{"hosts": ["a.example", "A.example"]}"#, "listed twice"),
    ];
    for (spec, message) in cases {
        let (status, v) = s.admin_call(Method::PUT, "/admin/v1/tenants/x", spec).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{spec}: {v}");
        let error = v["error"].as_str().unwrap_or_default();
        assert!(error.contains(message), "{spec}: {error}");
    }
    // At the ceilings, a spec is accepted.
    let (status, v) = s
        .admin_call(
            Method::PUT,
            "/admin/v1/tenants/x",
            r#"{"paths": ["/x"], "limits": {"timeout_ms": 900000, "max_concurrency": 16}}"#,
        )
        .await;
    assert!(status.is_success(), "{v}");
}

#[tokio::test]
async fn an_empty_assets_archive_is_422() {
    let s = TestServer::start("").await;
    // An empty body, and a tar archive of nothing (its end-of-archive blocks only).
    for archive in [Vec::new(), vec![0u8; 1024]] {
        let (status, v) = s
            .admin_call(Method::POST, "/admin/v1/assets", archive)
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
        assert!(
            v["error"].as_str().unwrap_or_default().contains("no files"),
            "{v}"
        );
    }
}

/// Opens a path in fds 99, -1, 0 (stdin), 1 (stdout), 3 and i32::MAX and answers each WASI
/// errno (4 bytes, little endian, in that order).
const OPEN_BAD_FD: &str = r#"(module
  (import "wasi_snapshot_preview1" "path_open"
    (func $open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "tern" "response_body_write" (func $write (param i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 512) "x.txt")
  (func $try (param $slot i32) (param $fd i32)
    (i32.store (i32.mul (local.get $slot) (i32.const 4))
      (call $open (local.get $fd) (i32.const 0) (i32.const 512) (i32.const 5) (i32.const 0)
        (i64.const 0) (i64.const 0) (i32.const 0) (i32.const 256))))
  (func (export "_start")
    (call $try (i32.const 0) (i32.const 99))
    (call $try (i32.const 1) (i32.const -1))
    (call $try (i32.const 2) (i32.const 0))
    (call $try (i32.const 3) (i32.const 1))
    (call $try (i32.const 4) (i32.const 3))
    (call $try (i32.const 5) (i32.const 2147483647))
    (drop (call $write (i32.const 0) (i32.const 24)))))"#;

#[tokio::test]
async fn path_open_on_a_bad_fd_gets_a_wasi_error() {
    let dir = tempfile::tempdir().unwrap();
    wat_file(dir.path(), "open.wasm", OPEN_BAD_FD);
    std::fs::create_dir(dir.path().join("site")).unwrap();
    std::fs::write(dir.path().join("site/x.txt"), "x").unwrap();
    let config = "[[tenant]]\nname = \"plain\"\nmodule = \"open.wasm\"\npaths = [\"/plain\"]\n\
                  [[tenant]]\nname = \"files\"\nmodule = \"open.wasm\"\npaths = [\"/files\"]\n\
                  assets = \"site\"\n";
    let s = TestServer::try_start_in(dir, &format!("[pool]\ninstances = 4\n{config}"))
        .await
        .expect("start");
    // EBADF (8) for fds that are not open, ENOTDIR (54) for stdio; fd 3 is `/assets` for a
    // tenant with assets (its `x.txt` opens) and nothing for one without.
    for (path, want) in [
        ("/plain", [8, 8, 8, 8, 8, 8]),
        ("/files", [8, 8, 54, 54, 0, 8]),
    ] {
        let r = s.get(path).await;
        assert_eq!(r.status, StatusCode::OK, "{path}: {}", r.text());
        let errnos: Vec<u32> = r
            .body
            .chunks(4)
            .map(|e| u32::from_le_bytes(e.try_into().unwrap()))
            .collect();
        assert_eq!(errnos, want, "{path}");
    }
}

/// An upload over `server.max_upload_bytes` is answered `413` even to a client that keeps
/// sending it whole, with or without a declared length.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_upload_is_413_to_a_client_still_sending() {
    let config = "[server]\nmax_upload_bytes = 8388608\n";
    let s = TestServer::try_start_in(tempfile::tempdir().unwrap(), config)
        .await
        .expect("start");
    // Larger than the socket buffers on both sides together, so the client is still sending.
    let body = vec![b'x'; 12 << 20];
    let auth = format!("authorization: Bearer {ADMIN_TOKEN}\r\n");
    for chunked in [false, true] {
        let mut request =
            format!("POST /admin/v1/assets HTTP/1.1\r\nhost: x\r\nconnection: close\r\n{auth}");
        let mut payload = Vec::new();
        if chunked {
            request.push_str("transfer-encoding: chunked\r\n\r\n");
            for piece in body.chunks(64 * 1024) {
                payload.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
                payload.extend_from_slice(piece);
                payload.extend_from_slice(b"\r\n");
            }
            payload.extend_from_slice(b"0\r\n\r\n");
        } else {
            request.push_str(&format!("content-length: {}\r\n\r\n", body.len()));
            payload.extend_from_slice(&body);
        }
        let mut bytes = request.into_bytes();
        bytes.extend_from_slice(&payload);
        let reply = crate::support::raw(s.admin(), bytes).await;
        assert!(
            reply.starts_with("HTTP/1.1 413"),
            "chunked {chunked}: {}",
            &reply[..reply.len().min(300)]
        );
    }
}

/// Conditional changes: each change answers with the tenant's ETag; one naming another
/// (`If-Match`), or creating one that exists (`If-None-Match: *`), is `412` and changes
/// nothing; a malformed tag is `400`.
#[tokio::test]
async fn changes_conditional_on_a_tenants_etag_are_refused_with_412_when_it_moved() {
    let s = TestServer::start("").await;
    let auth = format!("Bearer {ADMIN_TOKEN}");
    let call = |method: Method,
                path: &'static str,
                body: &'static str,
                pre: Vec<(&'static str, String)>| {
        let (admin, auth) = (s.admin(), auth.clone());
        async move {
            let mut headers = vec![("authorization", auth.as_str())];
            headers.extend(pre.iter().map(|(k, v)| (*k, v.as_str())));
            let r = send(
                admin,
                method,
                path,
                None,
                &headers,
                Bytes::from_static(body.as_bytes()),
            )
            .await;
            let etag = r.header("etag").to_string();
            let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
            (r.status, etag, v)
        }
    };
    let spec = r#"{"paths": ["/c"]}"#;
    let (status, created, v) = call(
        Method::PUT,
        "/admin/v1/tenants/c",
        spec,
        vec![("if-none-match", "*".into())],
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    assert!(
        created.starts_with('"') && created.len() == 34,
        "{created:?}"
    );
    assert_eq!(v["etag"], created.as_str());
    // Created once: the same create again is refused.
    let (status, _, v) = call(
        Method::PUT,
        "/admin/v1/tenants/c",
        spec,
        vec![("if-none-match", "*".into())],
    )
    .await;
    assert_eq!(status, StatusCode::PRECONDITION_FAILED, "{v}");
    let (status, etag, _) = call(Method::GET, "/admin/v1/tenants/c", "", vec![]).await;
    assert_eq!((status, etag.as_str()), (StatusCode::OK, created.as_str()));

    // A change from the tag read: applied, and the tag moves; from the old tag: refused.
    let patch = r#"{"env": {"A": "1"}}"#;
    let (status, changed, v) = call(
        Method::PATCH,
        "/admin/v1/tenants/c",
        patch,
        vec![("if-match", created.clone())],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_ne!(changed, created);
    let (status, _, v) = call(
        Method::PATCH,
        "/admin/v1/tenants/c",
        r#"{"env": {"A": "2"}}"#,
        vec![("if-match", created.clone())],
    )
    .await;
    assert_eq!(status, StatusCode::PRECONDITION_FAILED, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains(&changed),
        "names the current tag: {v}"
    );
    let (_, now, _) = call(Method::GET, "/admin/v1/tenants/c", "", vec![]).await;
    assert_eq!(now, changed, "nothing changed");
    // A delete from the old tag: refused; `*` or the current one: applied.
    let (status, _, _) = call(
        Method::DELETE,
        "/admin/v1/tenants/c",
        "",
        vec![("if-match", created.clone())],
    )
    .await;
    assert_eq!(status, StatusCode::PRECONDITION_FAILED);
    for bad in ["abc", "*, \"x\""] {
        let (status, _, v) = call(
            Method::DELETE,
            "/admin/v1/tenants/c",
            "",
            vec![("if-match", bad.into())],
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {v}");
    }
    let (status, _, v) = call(
        Method::DELETE,
        "/admin/v1/tenants/c",
        "",
        vec![("if-match", changed.clone())],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let (status, _, _) = call(
        Method::DELETE,
        "/admin/v1/tenants/c",
        "",
        vec![("if-match", "*".into())],
    )
    .await;
    assert_eq!(
        status,
        StatusCode::PRECONDITION_FAILED,
        "no tenant to match `*`"
    );
}
