//! Tenants are routed by Host (exact and wildcard) and by longest path prefix; no match is 404.

use bytes::Bytes;
use http::{Method, StatusCode};

use crate::support::{TestServer, guest_wat, send, wat_file};

/// A guest that answers with a fixed word.
fn says(word: &str) -> String {
    guest_wat(
        &format!(
            "(drop (call $write (i32.const 16) (i32.const {})))",
            word.len()
        ),
        word,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_by_host_and_by_path() {
    let dir = tempfile::tempdir().unwrap();
    for w in ["root", "api", "apiv2", "shop", "wild"] {
        wat_file(dir.path(), &format!("{w}.wasm"), &says(w));
    }
    let config = r#"
[pool]
instances = 8
[[tenant]]
name = "root"
module = "root.wasm"
[[tenant]]
name = "api"
module = "api.wasm"
paths = ["/api"]
[[tenant]]
name = "apiv2"
module = "apiv2.wasm"
paths = ["/api/v2"]
[[tenant]]
name = "shop"
module = "shop.wasm"
hosts = ["shop.example.com"]
[[tenant]]
name = "wild"
module = "wild.wasm"
hosts = ["*.example.com"]
"#;
    let s = TestServer::try_start_in(dir, config).await.expect("start");
    let cases = [
        (None, "/", "root"),
        (None, "/api", "api"),
        (None, "/apix", "root"),
        (None, "/api/v2/users", "apiv2"),
        (Some("shop.example.com"), "/api", "shop"),
        (Some("Shop.Example.Com:8080"), "/", "shop"),
        (Some("x.example.com"), "/api/v2", "wild"),
        (Some("example.com"), "/api", "api"),
    ];
    for (host, path, want) in cases {
        let r = send(s.addr(), Method::GET, path, host, &[], Bytes::new()).await;
        assert_eq!(r.status, StatusCode::OK, "{host:?} {path}");
        assert_eq!(r.text(), want, "{host:?} {path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_route_is_404_with_a_short_body() {
    let s = TestServer::demo().await;
    let r = s.get("/nothing-here").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.text(), "no tenant is routed for this host and path\n");
    assert!(r.header("server-timing").starts_with("route;dur="));
    let r = s.get("/hellox").await;
    assert_eq!(
        r.status,
        StatusCode::NOT_FOUND,
        "prefixes match whole path segments"
    );
}
