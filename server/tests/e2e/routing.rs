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

/// Requests whose authority or framing could be read two ways are refused: the router and the
/// guest always see one host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ambiguous_requests_are_400() {
    let config = "[[tenant]]\nname = \"a\"\nmodule = \"builtin:hello\"\nhosts = [\"a.example\"]\n\
                  [[tenant]]\nname = \"b\"\nmodule = \"builtin:echo\"\nhosts = [\"b.example\"]\n";
    let s = crate::support::TestServer::start(config).await;
    let ambiguous: [&[u8]; 4] = [
        b"GET / HTTP/1.1\r\nhost: a.example\r\nhost: b.example\r\n\r\n",
        b"GET http://b.example/ HTTP/1.1\r\nhost: a.example\r\n\r\n",
        b"GET http://b.example:8080/ HTTP/1.1\r\nhost: b.example:9090\r\n\r\n",
        b"POST / HTTP/1.1\r\nhost: b.example\r\ntransfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n",
    ];
    for request in ambiguous {
        let reply = crate::support::raw(s.addr(), request).await;
        assert!(
            reply.starts_with("HTTP/1.1 400") && reply.contains("ambiguous request"),
            "{:?}: {reply}",
            String::from_utf8_lossy(request)
        );
    }
    // One authority, given either way or both ways alike, routes as usual.
    for request in [
        &b"GET http://b.example/x HTTP/1.1\r\nhost: b.example\r\nconnection: close\r\n\r\n"[..],
        b"GET http://B.example:80/x HTTP/1.1\r\nhost: b.example\r\nconnection: close\r\n\r\n",
        b"GET /x HTTP/1.1\r\nhost: b.example\r\nconnection: close\r\n\r\n",
    ] {
        let reply = crate::support::raw(s.addr(), request).await;
        assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
        assert!(reply.contains("host: b.example"), "{reply}");
    }
}
