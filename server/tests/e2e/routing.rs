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

/// The `context` guest's `KEY=value` lines for a raw HTTP/1 request on a fresh connection, with
/// the connection's local port (the client port the guest should see) and the `x-request-id`.
async fn context_of(
    addr: std::net::SocketAddr,
    request: &'static str,
) -> (std::collections::HashMap<String, String>, u16, String) {
    let (reply, port) = tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut conn = std::net::TcpStream::connect(addr).expect("connect");
        let port = conn.local_addr().expect("local addr").port();
        conn.set_read_timeout(Some(std::time::Duration::from_secs(20)))
            .expect("timeout");
        conn.write_all(request.as_bytes()).expect("send");
        let mut reply = Vec::new();
        let _ = conn.read_to_end(&mut reply);
        (String::from_utf8_lossy(&reply).into_owned(), port)
    })
    .await
    .expect("client thread");
    let (head, body) = reply.split_once("\r\n\r\n").expect("a whole response");
    assert!(
        head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200"),
        "{reply}"
    );
    let id = head
        .lines()
        .find_map(|l| l.strip_prefix("x-request-id: "))
        .expect("x-request-id")
        .to_string();
    (parse_context(body), port, id)
}

fn parse_context(body: &str) -> std::collections::HashMap<String, String> {
    body.lines()
        .filter_map(|l| {
            let at = l.find(['=', '!'])?;
            Some((l[..at].to_string(), l[at..].to_string()))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guests_read_their_request_context() {
    let dir = tempfile::tempdir().unwrap();
    crate::support::test_guest(dir.path(), "context");
    let config = "[[tenant]]\nname = \"api\"\nmodule = \"context.wasm\"\npaths = [\"/api/\"]\n\
                  [[tenant]]\nname = \"root\"\nmodule = \"context.wasm\"\npaths = [\"/\"]\n";
    let s = TestServer::try_start_in(dir, config).await.expect("start");
    let unavailable = format!("!{}", tern_sdk::abi::errno::UNAVAILABLE);

    let (c, port, id) = context_of(
        s.addr(),
        "GET /api/users/7?full=1 HTTP/1.1\r\nhost: Example.test:8080\r\nconnection: close\r\n\r\n",
    )
    .await;
    let want = [
        ("CLIENT_IP", "=127.0.0.1".to_string()),
        ("CLIENT_PORT", format!("={port}")),
        ("REQUEST_ID", format!("={id}")),
        ("ROUTE_PREFIX", "=/api".into()),
        ("PATH_INFO", "=/users/7".into()),
        ("SCHEME", "=http".into()),
        ("HOST", "=Example.test:8080".into()),
        ("URL", "=http://Example.test:8080/api/users/7?full=1".into()),
        ("HTTP_VERSION", "=HTTP/1.1".into()),
        ("TLS_PROTOCOL", unavailable.clone()),
        ("TLS_SNI", unavailable.clone()),
        ("TENANT", "=api".into()),
        (
            "UNKNOWN",
            format!("!{}", tern_sdk::abi::errno::INVALID_ARGUMENT),
        ),
        ("sdk client_addr", format!("=127.0.0.1:{port}")),
        ("sdk split", "=/api|/users/7".into()),
    ];
    for (key, value) in &want {
        assert_eq!(c.get(*key), Some(value), "{key} in {c:?}");
    }
    // Every key the ABI defines was answered.
    for (name, _) in tern_sdk::abi::info::ALL {
        assert!(c.contains_key(name), "{name} missing from {c:?}");
    }

    // The prefix exactly, with a trailing slash, percent-encoded and below: path info is what
    // follows the prefix; prefix + path info is the whole path.
    for (target, prefix, info) in [
        ("/api", "=/api", "="),
        ("/api/", "=/api", "=/"),
        ("/api/a%20b/", "=/api", "=/a%20b/"),
        ("/apix/y", "=", "=/apix/y"),
        ("/", "=", "=/"),
    ] {
        let request: &'static str = Box::leak(
            format!("GET {target} HTTP/1.1\r\nhost: h\r\nconnection: close\r\n\r\n")
                .into_boxed_str(),
        );
        let (c, _, _) = context_of(s.addr(), request).await;
        assert_eq!(c["ROUTE_PREFIX"], prefix, "{target}");
        assert_eq!(c["PATH_INFO"], info, "{target}");
        let tenant = if prefix == "=" { "=root" } else { "=api" };
        assert_eq!(c["TENANT"], tenant, "{target}");
    }

    // HTTP/1.0 without a Host: no host and so no URL, the rest as usual.
    let (c, _, _) = context_of(s.addr(), "GET /api/x HTTP/1.0\r\n\r\n").await;
    assert_eq!(c["HTTP_VERSION"], "=HTTP/1.0");
    assert_eq!(c["HOST"], unavailable);
    assert_eq!(c["URL"], unavailable);
    assert_eq!(c["PATH_INFO"], "=/x");

    // HTTP/2 carries the host in `:authority`.
    let r = crate::support::send_h2(s.addr(), "/api/h2?q").await;
    assert_eq!(r.status, StatusCode::OK);
    let c = parse_context(&r.text());
    assert_eq!(c["HTTP_VERSION"], "=HTTP/2");
    assert_eq!(c["HOST"], format!("={}", s.addr()));
    assert_eq!(c["URL"], format!("=http://{}/api/h2?q", s.addr()));
    assert_eq!(c["REQUEST_ID"], format!("={}", r.header("x-request-id")));
}

/// The CGI environment lines of `reply` (the demo's `/cgi/env`).
fn cgi_var<'a>(reply: &'a crate::support::Reply, name: &str) -> Option<&'a str> {
    let text = std::str::from_utf8(&reply.body).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix('='))
}

/// One path, one meaning (RFC 3986 §6.2.2, RFC 9110 §4.2.3): a path is routed, and its guest
/// sees it, in its normal form — percent-encoded unreserved characters decoded, dot and empty
/// segments removed — as a normalising proxy in front of Tern reads it. What proxies disagree
/// on is refused with `400` naming why; the query is left as sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_are_routed_and_seen_in_their_normal_form() {
    let s = TestServer::demo().await;
    for path in [
        "/h%65llo",
        "/%68ello",
        "/./hello",
        "/x/../hello",
        "/%2e%2e/hello",
        "//hello",
        "/hello/.",
        "/cgi/../hello",
    ] {
        let r = s.get(path).await;
        assert_eq!(r.status, StatusCode::OK, "{path}: {}", r.text());
        assert_eq!(r.text(), "Hello from Tern!\n", "{path} reached hello");
    }
    // Another tenant's path hidden behind a dot segment reaches that tenant, which sees the
    // normal path, over HTTP/1.1 and HTTP/2 alike.
    for r in [
        s.get("/hello/../cgi/./env?a=%2F&b=../x").await,
        crate::support::send_h2(s.addr(), "/hello/%2E%2E/cgi//env?a=%2F&b=../x").await,
    ] {
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        assert_eq!(cgi_var(&r, "SCRIPT_NAME"), Some("/cgi"), "{}", r.text());
        assert_eq!(cgi_var(&r, "PATH_INFO"), Some("/env"));
        assert_eq!(cgi_var(&r, "REQUEST_URI"), Some("/cgi/env?a=%2F&b=../x"));
        assert_eq!(cgi_var(&r, "QUERY_STRING"), Some("a=%2F&b=../x"));
    }

    for (path, why) in [
        ("/cgi/a%2Fb", "encoded slash"),
        ("/cgi/a%2fb", "encoded slash"),
        ("/hello%5c..%5ccgi", "backslash"),
        ("/hello\\..\\cgi", "backslash"),
        ("/cgi/%zz", "two hex digits"),
        ("/cgi/100%", "two hex digits"),
    ] {
        let r = s.get(path).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{path}");
        assert!(r.text().contains(why), "{path}: {}", r.text());
    }
}

/// A transfer coding Tern does not read is `501` and the connection closed (RFC 9112 §6.1),
/// never a body handed on still encoded; `chunked` twice is `400`.
#[test]
fn unknown_transfer_codings_are_501_and_the_connection_closed() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let s = rt.block_on(TestServer::demo());
    for (coding, status) in [
        ("gzip, chunked", "501"),
        ("br, chunked", "501"),
        ("identity, chunked", "501"),
        ("chunked, chunked", "400"),
    ] {
        let request = format!(
            "POST /echo HTTP/1.1\r\nhost: x\r\ntransfer-encoding: {coding}\r\n\r\n\
             5\r\nhello\r\n0\r\n\r\nGET /hello HTTP/1.1\r\nhost: x\r\n\r\n"
        );
        let reply = crate::support::raw_exchange(
            s.addr(),
            request.as_bytes(),
            std::time::Duration::from_secs(10),
        );
        let text = String::from_utf8_lossy(&reply);
        assert!(
            text.starts_with(&format!("HTTP/1.1 {status} ")),
            "{coding}: {text}"
        );
        assert!(text.contains("connection: close"), "{coding}: {text}");
        assert_eq!(text.matches("HTTP/1.1 ").count(), 1, "closed: {text}");
        assert!(!text.contains("hello"), "no body passed on: {text}");
    }
    // Plain chunked is read as ever.
    let reply = crate::support::raw_exchange(
        s.addr(),
        b"POST /echo HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        std::time::Duration::from_secs(10),
    );
    let text = String::from_utf8_lossy(&reply);
    assert!(
        text.starts_with("HTTP/1.1 200 ") && text.contains("hello"),
        "{text}"
    );
}

/// `OPTIONS *` is answered by the server (`200` with `Allow`), not routed to a tenant; any
/// other method with the target `*` is `400`.
#[test]
fn options_asterisk_is_answered_by_the_server() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let s = rt.block_on(TestServer::demo());
    let exchange = |req: &str| {
        let reply = crate::support::raw_exchange(
            s.addr(),
            req.as_bytes(),
            std::time::Duration::from_secs(10),
        );
        String::from_utf8_lossy(&reply).into_owned()
    };
    let text = exchange("OPTIONS * HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
    assert!(text.starts_with("HTTP/1.1 200 "), "{text}");
    assert!(
        text.to_ascii_lowercase()
            .contains("allow: get, head, post, put, patch, delete, options"),
        "{text}"
    );
    let text = exchange("GET * HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
    assert!(
        text.starts_with("HTTP/1.1 400 ") && text.contains("only for OPTIONS"),
        "{text}"
    );
}
