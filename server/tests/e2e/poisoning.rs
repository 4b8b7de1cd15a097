//! The edge cache as an attacker tries it: requests shaped so that the answer one client
//! made would be served to another. Each test is over every protocol the trick works on
//! (HTTP/1.1, h2 with prior knowledge, HTTP/3 with aioquic): field lines split under `Vary`,
//! a body with no declared length, a port or userinfo in the authority, headers frameworks
//! read that the key does not hold, cookies, and a purge that races a fill.
//!
//! The guest (`cache_headers`) starts its body with the instant it ran: two answers with the
//! same first line came from one run, so the second was served from the cache.

use std::net::SocketAddr;
use std::path::PathBuf;

use bytes::Bytes;
use http::{Method, StatusCode};
use serde_json::Value;

use crate::support::{H2Conn, Reply, TestServer, raw, send, test_guest};
use crate::tls::Pki;

/// A server with `cache_headers` cached at `/c` (any host), `/k` cached with
/// `store_cookie_requests`, over cleartext and over TLS with HTTP/3 (a certificate for
/// `a.test`).
struct Edge {
    s: TestServer,
    tls: SocketAddr,
    ca_file: PathBuf,
    _pki: Pki,
}

async fn edge() -> Edge {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    pki.issue(dir.path(), "a", &["a.test"]);
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &pki.ca_pem).unwrap();
    test_guest(dir.path(), "cache_headers");
    let config = "[server]\ntls_listen = \"127.0.0.1:0\"\nhttp3 = true\n\
         [pool]\ninstances = 16\nmax_memory_mib = 64\n\
         [[certificate]]\ncert = \"a.crt\"\nkey = \"a.key\"\n\
         [[tenant]]\nname = \"c\"\nmodule = \"cache_headers.wasm\"\npaths = [\"/c\"]\n\
         [tenant.cache]\nenabled = true\n\
         [[tenant]]\nname = \"k\"\nmodule = \"cache_headers.wasm\"\npaths = [\"/k\"]\n\
         [tenant.cache]\nenabled = true\nstore_cookie_requests = true\n";
    let s = TestServer::try_start_in(dir, config)
        .await
        .unwrap_or_else(|e| panic!("server failed to start: {e:#}"));
    let tls = s.running.tls_addr.expect("a TLS listener");
    Edge {
        s,
        tls,
        ca_file,
        _pki: pki,
    }
}

/// An answer as the tests compare them: its status, `Cache-Status`, and the guest's run.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    status: u16,
    cache: String,
    run: String,
}

impl Seen {
    fn of(r: &Reply) -> Self {
        Self {
            status: r.status.as_u16(),
            cache: r.header("cache-status").to_string(),
            run: r.text().lines().next().unwrap_or_default().to_string(),
        }
    }

    fn of_h3(v: &Value) -> Self {
        Self {
            status: v["status"]
                .as_u64()
                .unwrap_or_else(|| panic!("no status: {v}")) as u16,
            cache: v["headers"]["cache-status"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            run: v["body"]
                .as_str()
                .unwrap_or_default()
                .lines()
                .next()
                .unwrap_or_default()
                .to_string(),
        }
    }

    fn stored(&self) -> bool {
        self.cache.ends_with("; stored")
    }

    fn hit(&self) -> bool {
        self.cache.starts_with("tern; hit")
    }
}

/// A protocol to ask over.
#[derive(Debug, Clone, Copy)]
enum Over {
    H1,
    H2,
    H3,
}

impl Edge {
    /// `GET path` over `over` with `headers` (each pair one field line, in order).
    async fn get(&self, over: Over, path: &str, headers: &[(&str, &str)]) -> Seen {
        match over {
            Over::H1 => Seen::of(
                &send(
                    self.s.addr(),
                    Method::GET,
                    path,
                    None,
                    headers,
                    Bytes::new(),
                )
                .await,
            ),
            Over::H2 => Seen::of(
                &H2Conn::open(self.s.addr())
                    .await
                    .get_with(path, headers)
                    .await,
            ),
            Over::H3 => {
                let mut args = vec!["--path".to_string(), path.to_string()];
                for (k, v) in headers {
                    args.push("--header".into());
                    args.push(format!("{k}:{v}"));
                }
                self.h3(&args).await
            }
        }
    }

    /// aioquic with `args`: its one answer.
    async fn h3(&self, args: &[String]) -> Seen {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (ok, mut lines) = crate::http3::aioquic_at(self.tls, &self.ca_file, &args).await;
        assert!(ok, "aioquic failed: {lines:?}");
        Seen::of_h3(&lines.remove(0))
    }
}

/// `Vary: Cookie` and `Vary: Accept-Language` with a field sent as two lines: a request whose
/// first line is the same but whose second differs is another variant (HTTP/2 and HTTP/3
/// clients send every cookie as a line of its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vary_matches_every_line_of_a_field_over_every_protocol() {
    let e = edge().await;
    for over in [Over::H1, Over::H2, Over::H3] {
        for (field, shared, a, b) in [
            ("cookie", "theme=dark", "session=alice", "session=bob"),
            ("accept-language", "fr", "de", "en"),
        ] {
            let path =
                format!("/c/vary-{field}-{over:?}?h=cache-control:max-age%3D60&h=vary:{field}");
            let alice = e.get(over, &path, &[(field, shared), (field, a)]).await;
            assert_eq!(alice.status, 200, "{over:?} {field}");
            assert!(alice.stored(), "{over:?} {field}: {alice:?}");
            let bob = e.get(over, &path, &[(field, shared), (field, b)]).await;
            assert_ne!(bob.run, alice.run, "{over:?} {field}: B got A's answer");
            assert!(!bob.hit(), "{over:?} {field}: {bob:?}");
            // The first line alone is another variant too.
            let first = e.get(over, &path, &[(field, shared)]).await;
            assert_ne!(first.run, alice.run, "{over:?} {field}");
            // A's own lines still find A's answer.
            let again = e.get(over, &path, &[(field, shared), (field, a)]).await;
            assert!(again.hit(), "{over:?} {field}: {again:?}");
            assert_eq!(again.run, alice.run, "{over:?} {field}");
        }
    }
}

/// A `GET` with a body and no `Content-Length` (HTTP/2: HEADERS then DATA; HTTP/3: HEADERS
/// without FIN) is answered and never stored; the plain `GET` after it runs the guest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_with_a_body_of_no_declared_length_is_never_stored() {
    let e = edge().await;
    let path = "/c/get-body-h2?h=cache-control:max-age%3D60";
    let with_body = Seen::of(
        &H2Conn::send_unsized(
            e.s.addr(),
            Method::GET,
            path,
            vec![Bytes::from_static(b"q=shaped")],
        )
        .await,
    );
    assert_eq!(with_body.status, 200);
    assert!(!with_body.stored(), "{with_body:?}");
    let plain = e.get(Over::H2, path, &[]).await;
    assert_ne!(
        plain.run, with_body.run,
        "the body-shaped answer was served"
    );
    assert!(plain.stored(), "{plain:?}");

    let path = "/c/get-body-h3?h=cache-control:max-age%3D60";
    let with_body = e
        .h3(&[
            "--path".into(),
            path.into(),
            "--body".into(),
            "q=shaped".into(),
        ])
        .await;
    assert_eq!(with_body.status, 200);
    assert!(!with_body.stored(), "{with_body:?}");
    let plain = e.get(Over::H3, path, &[]).await;
    assert_ne!(
        plain.run, with_body.run,
        "the body-shaped answer was served"
    );
    // A GET whose stream ends with its head is stored over HTTP/3 too.
    assert!(plain.stored(), "{plain:?}");
    assert!(e.get(Over::H3, path, &[]).await.hit());
}

/// The port is part of the key (the guest sees it in `Host`, `SERVER_PORT` and the URL), in
/// whichever way the authority came; userinfo in the authority is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_port_is_keyed_and_userinfo_is_refused() {
    let e = edge().await;
    let addr = e.s.addr();
    let raw_get = |target: String, host: &'static str| async move {
        raw(
            addr,
            format!("GET {target} HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n"),
        )
        .await
    };
    let path = "/c/port?h=cache-control:max-age%3D60";
    // Host header, absolute-form target, and h2's `:authority`, each with port 1337.
    let shaped = [
        raw_get(path.to_string(), "localhost:1337").await,
        raw_get(
            format!("http://localhost:1337{path}&form=absolute"),
            "localhost:1337",
        )
        .await,
    ];
    for r in &shaped {
        assert!(r.starts_with("HTTP/1.1 200"), "{r}");
        assert!(
            r.contains("cache-status: tern; fwd=uri-miss; stored"),
            "{r}"
        );
    }
    let h2 = Seen::of(
        &H2Conn::open(addr)
            .await
            .get_uri(&format!("http://localhost:1337{path}&form=h2"))
            .await,
    );
    assert!(h2.stored(), "{h2:?}");
    for target in [
        path.to_string(),
        format!("{path}&form=absolute"),
        format!("{path}&form=h2"),
    ] {
        let plain = raw_get(target.clone(), "localhost").await;
        assert!(plain.starts_with("HTTP/1.1 200"), "{plain}");
        assert!(
            plain.contains("cache-status: tern; fwd=uri-miss; stored"),
            "{target}: the answer made for port 1337 was served: {plain}"
        );
    }
    // The same port again is the stored answer.
    let again = raw_get(path.to_string(), "localhost:1337").await;
    assert!(again.contains("cache-status: tern; hit"), "{again}");

    // Userinfo: refused, in the target and in Host.
    for (target, host) in [
        (format!("http://evil@localhost{path}"), "localhost"),
        (path.to_string(), "evil@localhost"),
    ] {
        let r = raw_get(target.clone(), host).await;
        assert!(r.starts_with("HTTP/1.1 400"), "{target} {host}: {r}");
        assert!(r.contains("userinfo"), "{r}");
    }
}

/// Headers frameworks read as the request's prefix, scheme, host or method: an answer to a
/// request with one is served and not stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_frameworks_read_are_not_stored_from() {
    let e = edge().await;
    for header in [
        "x-forwarded-prefix",
        "x-forwarded-ssl",
        "x-forwarded-server",
        "x-host",
        "x-http-method",
        "x-method-override",
    ] {
        let path = format!("/c/unkeyed-{header}?h=cache-control:max-age%3D60");
        let shaped = e.get(Over::H1, &path, &[(header, "evil")]).await;
        assert_eq!(shaped.status, 200);
        assert_eq!(
            shaped.cache, "tern; fwd=uri-miss; detail=unkeyed-header",
            "{header}"
        );
        let clean = e.get(Over::H1, &path, &[]).await;
        assert_ne!(clean.run, shaped.run, "{header}");
        assert!(clean.stored(), "{header}: {clean:?}");
    }
}

/// A request with a cookie: its answer is stored only when it says it may be shared, or
/// varies on the cookie, or the tenant says so (`store_cookie_requests`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_to_requests_with_cookies_are_shared_only_when_they_say_so() {
    let e = edge().await;
    let alice = [("cookie", "session=alice")];
    for over in [Over::H1, Over::H2] {
        let only_max_age = format!("/c/cookie-{over:?}?h=cache-control:max-age%3D60");
        let mine = e.get(over, &only_max_age, &alice).await;
        assert!(!mine.stored(), "{over:?}: {mine:?}");
        let anonymous = e.get(over, &only_max_age, &[]).await;
        assert_ne!(
            anonymous.run, mine.run,
            "{over:?}: alice's page to an anonymous client"
        );
        assert!(anonymous.stored(), "{over:?}: no cookie, stored as before");
        for shared in [
            "public,%20max-age%3D60",
            "s-maxage%3D60",
            "max-age%3D60,%20must-revalidate",
        ] {
            let path = format!("/c/cookie-shared-{over:?}?h=cache-control:{shared}");
            let first = e.get(over, &path, &alice).await;
            assert!(first.stored(), "{over:?} {shared}: {first:?}");
            let anonymous = e.get(over, &path, &[]).await;
            assert_eq!(anonymous.run, first.run, "{over:?} {shared}");
        }
    }
    // The tenant that stores them.
    let path = "/k/cookie?h=cache-control:max-age%3D60";
    let first = e.get(Over::H1, path, &alice).await;
    assert!(first.stored(), "{first:?}");
    assert_eq!(e.get(Over::H1, path, &[]).await.run, first.run);
}

/// A purge sent while a guest is making an answer the purge names: the purge returns, and the
/// answer made before it is not stored afterwards (by prefix, by tag, and a soft purge).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_during_a_fill_keeps_the_fills_answer_out() {
    let e = edge().await;
    for (n, purge) in [
        serde_json::json!({"prefixes": ["/c/during"]}),
        serde_json::json!({"tags": ["during"]}),
        serde_json::json!({"tags": ["during"], "soft": true}),
        serde_json::json!({"all": true}),
    ]
    .into_iter()
    .enumerate()
    {
        let path = format!(
            "/c/during-{n}?h=cache-control:max-age%3D60&h=surrogate-key:during&wait_ms=800"
        );
        let addr = e.s.addr();
        let p = path.clone();
        let fill = tokio::spawn(async move {
            Seen::of(&send(addr, Method::GET, &p, None, &[], Bytes::new()).await)
        });
        // The guest computes for 0.8 s; the purge comes in its middle.
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let (status, v) =
            e.s.admin_call(
                Method::POST,
                "/admin/v1/tenants/c/cache/purge",
                purge.to_string(),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{purge}: {v}");
        let filled = fill.await.unwrap();
        assert_eq!(filled.status, 200);
        assert_eq!(
            filled.cache, "tern; fwd=uri-miss; detail=purged-during-fill",
            "{purge}"
        );
        let after = e.get(Over::H1, &path, &[]).await;
        assert_ne!(
            after.run, filled.run,
            "{purge}: the pre-purge answer was stored"
        );
        assert!(after.stored(), "{purge}: {after:?}");
        // A purge that names something else does not keep a fill out.
        let other = format!("/c/other-{n}?h=cache-control:max-age%3D60&wait_ms=800");
        let p = other.clone();
        let fill = tokio::spawn(async move {
            Seen::of(&send(addr, Method::GET, &p, None, &[], Bytes::new()).await)
        });
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let (status, _) =
            e.s.admin_call(
                Method::POST,
                "/admin/v1/tenants/c/cache/purge",
                serde_json::json!({"prefixes": ["/c/nothing-here"]}).to_string(),
            )
            .await;
        assert_eq!(status, StatusCode::OK);
        assert!(fill.await.unwrap().stored(), "{other}");
    }
}
