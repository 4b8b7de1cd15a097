//! Readthrough: a backend with `cache = true` has its answers kept in the tenant's cache by
//! their own headers; guests find them there, concurrent misses send one request, a guest says
//! otherwise with `Tern-Cache`, purges reach them. Against a real backend on 127.0.0.1 that
//! counts what it is asked.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tern_sdk::abi::errno;

use crate::support::{TestServer, metric_value, send, test_component, test_guest};

/// A backend that counts the requests it gets by path and query:
/// - `/users`, `/orders`: JSON, `max-age=60`, after 100 ms;
/// - `/fresh`: `max-age=60`, the request's number in the body, after 300 ms;
/// - `/plain`: no `Cache-Control`, the request's number;
/// - `/private`: `private, max-age=60`;
/// - `/headers`: `max-age=60`, the `Tern-Cache` header it got (or `none`);
/// - `/sized?n=N`: `max-age=60`, N bytes;
/// - `/swr`: `max-age=3, stale-while-revalidate=30`, the request's number;
/// - `/etag`: `max-age=3` and `ETag: "v1"`, `304` to `If-None-Match: "v1"`;
/// - `/sie`: the first time `max-age=3, stale-if-error=30`, then `500`.
struct CountingBackend {
    addr: SocketAddr,
    asked: Arc<Mutex<HashMap<String, usize>>>,
}

impl CountingBackend {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let asked = Arc::new(Mutex::new(HashMap::new()));
        let counts = asked.clone();
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let counts = counts.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let counts = counts.clone();
                        async move { Ok::<_, Infallible>(answer(req, &counts).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self { addr, asked }
    }

    /// How often `target` (path and query) was asked.
    fn asked(&self, target: &str) -> usize {
        self.asked.lock().unwrap().get(target).copied().unwrap_or(0)
    }
}

async fn answer(
    req: Request<Incoming>,
    counts: &Mutex<HashMap<String, usize>>,
) -> Response<Full<Bytes>> {
    let target = req
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let n = {
        let mut counts = counts.lock().unwrap();
        let n = counts.entry(target).or_insert(0);
        *n += 1;
        *n
    };
    let (cache_control, delay, body) = match req.uri().path() {
        "/users" | "/orders" => (
            Some("max-age=60"),
            100,
            format!("{{\"from\":\"{}\"}}", &req.uri().path()[1..]),
        ),
        "/fresh" => (Some("max-age=60"), 300, format!("answer {n}")),
        "/plain" => (None, 0, format!("answer {n}")),
        "/private" => (Some("private, max-age=60"), 0, format!("answer {n}")),
        "/headers" => (
            Some("max-age=60"),
            0,
            format!(
                "tern-cache: {}",
                req.headers()
                    .get("tern-cache")
                    .map_or("none", |v| v.to_str().unwrap_or("?"))
            ),
        ),
        "/sized" => {
            let n = req
                .uri()
                .query()
                .and_then(|q| q.strip_prefix("n="))
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            (Some("max-age=60"), 0, "s".repeat(n))
        }
        "/swr" => (
            Some("max-age=3, stale-while-revalidate=30"),
            0,
            format!("answer {n}"),
        ),
        "/etag" => {
            let mut resp = if req
                .headers()
                .get("if-none-match")
                .is_some_and(|v| v == "\"v1\"")
            {
                let mut r = Response::new(Full::new(Bytes::new()));
                *r.status_mut() = StatusCode::NOT_MODIFIED;
                r
            } else {
                Response::new(Full::new(Bytes::from(format!("answer {n}"))))
            };
            resp.headers_mut().insert("etag", "\"v1\"".parse().unwrap());
            resp.headers_mut()
                .insert("cache-control", "max-age=3".parse().unwrap());
            return resp;
        }
        "/sie" if n > 1 => {
            let mut r = Response::new(Full::new(Bytes::from("down")));
            *r.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
            return r;
        }
        "/sie" => (
            Some("max-age=3, stale-if-error=30"),
            0,
            format!("answer {n}"),
        ),
        _ => (None, 0, "no such path".into()),
    };
    tokio::time::sleep(Duration::from_millis(delay)).await;
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    if let Some(cc) = cache_control {
        resp.headers_mut()
            .insert("cache-control", cc.parse().unwrap());
    }
    resp
}

async fn metrics_of(s: &TestServer) -> String {
    s.metrics().await
}

/// The outbound probe at `/probe` with the backend `origin` (`cache = true`) on `backend`, its
/// cache's settings `cache` and more TOML `extra` for the tenant.
async fn probe(backend: &CountingBackend, cache: &str, extra: &str) -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    test_guest(dir.path(), "outbound_probe");
    let config = format!(
        "[[tenant]]\nname = \"probe\"\nmodule = \"outbound_probe.wasm\"\npaths = [\"/probe\"]\n\
         [tenant.cache]\nenabled = true\n{cache}\n{extra}\n\
         [tenant.outbound.backends.origin]\nurl = \"http://{}\"\ncache = true\n",
        backend.addr
    );
    TestServer::try_start_in(dir, &config).await.expect("start")
}

fn cache_series(tenant: &str, backend: &str, result: &str) -> String {
    format!(
        "tern_outbound_cache_requests_total{{backend=\"{backend}\",result=\"{result}\",tenant=\"{tenant}\"}}"
    )
}

/// The aggregate example asks each of its backends once for many clients, and again after a
/// purge; the tenant's front (off here) adds nothing to its answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_aggregate_example_asks_each_backend_once_for_many_clients() {
    let backend = CountingBackend::start().await;
    let b = backend.addr;
    let config = format!(
        "[[tenant]]\nname = \"dash\"\nmodule = \"builtin:aggregate\"\n\
         [tenant.cache]\nenabled = true\nfront = false\n\
         [tenant.outbound.backends.users]\nurl = \"http://{b}\"\ncache = true\n\
         [tenant.outbound.backends.orders]\nurl = \"http://{b}\"\ncache = true\n"
    );
    let s = TestServer::start(&config).await;
    let expected =
        serde_json::json!({ "users": { "from": "users" }, "orders": { "from": "orders" } });
    for _ in 0..10 {
        let r = s.get("/").await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v, expected);
        assert_eq!(r.header("cache-status"), "", "the front has no cache");
    }
    assert_eq!((backend.asked("/users"), backend.asked("/orders")), (1, 1));
    let m = metrics_of(&s).await;
    for name in ["users", "orders"] {
        assert_eq!(metric_value(&m, &cache_series("dash", name, "miss")), 1.0);
        assert_eq!(metric_value(&m, &cache_series("dash", name, "hit")), 9.0);
        let sent = format!(
            "tern_outbound_requests_total{{backend=\"{name}\",status=\"2xx\",tenant=\"dash\"}}"
        );
        assert_eq!(metric_value(&m, &sent), 1.0, "the backend was asked once");
    }
    assert!(metric_value(&m, "tern_cache_stored_bytes{tenant=\"dash\"}") > 0.0);

    let (status, v) = s
        .admin_call(
            Method::POST,
            "/admin/v1/tenants/dash/cache/purge",
            r#"{"all": true}"#,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["purged"], 2, "{v}");
    let r = s.get("/").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!((backend.asked("/users"), backend.asked("/orders")), (2, 2));
}

/// 100 clients of the proxy example asking at once for an answer nobody has yet: the backend
/// is asked once, and every client gets its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_concurrent_misses_send_the_backend_one_request() {
    let backend = CountingBackend::start().await;
    let b = backend.addr;
    let config = format!(
        "[pool]\ninstances = 128\nmax_memory_mib = 64\n\
         [[tenant]]\nname = \"shop\"\nmodule = \"builtin:proxy\"\npaths = [\"/shop\"]\n\
         [tenant.limits]\nmax_concurrency = 128\ntimeout_ms = 20000\n\
         [tenant.cache]\nenabled = true\nfront = false\n\
         [tenant.outbound]\nmax_concurrent = 128\n\
         [tenant.outbound.backends.origin]\nurl = \"http://{b}\"\ncache = true\n"
    );
    let dir = tempfile::tempdir().unwrap();
    let s = TestServer::try_start_in(dir, &config).await.expect("start");
    let addr = s.addr();
    let asks: Vec<_> = (0..100)
        .map(|_| {
            tokio::spawn(async move {
                send(
                    addr,
                    Method::GET,
                    "/shop/fresh?k=1",
                    None,
                    &[],
                    Bytes::new(),
                )
                .await
            })
        })
        .collect();
    for ask in asks {
        let r = ask.await.unwrap();
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        assert_eq!(r.text(), "answer 1");
    }
    assert_eq!(backend.asked("/fresh?k=1"), 1, "one request for 100 misses");
    let m = metrics_of(&s).await;
    let count = |result| metric_value(&m, &cache_series("shop", "origin", result));
    assert_eq!(count("miss"), 1.0);
    assert_eq!(count("hit") + count("collapsed"), 99.0);
    assert!(count("collapsed") > 0.0, "some waited for the first");
}

/// A guest says what the cache does with its request in `Tern-Cache` (taken off before the
/// backend sees it, and never taken from a client); the backend's own headers decide the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guests_say_what_the_cache_does_with_tern_cache() {
    let backend = CountingBackend::start().await;
    let direct = format!(
        "[tenant.outbound]\nmax_requests = 5\n\
         [tenant.outbound.backends.direct]\nurl = \"http://{}\"",
        backend.addr
    );
    let s = probe(&backend, "", &direct).await;
    let lines = |text: String| text.lines().map(str::to_string).collect::<Vec<_>>();

    // By the answer's headers: stored with `max-age`, not without it, not when `private`.
    let r = s.get("/probe?backend=origin&path=/plain&times=2").await;
    assert_eq!(
        lines(r.text()),
        [
            "status=200 bytes=8 body=answer 1",
            "status=200 bytes=8 body=answer 2"
        ]
    );
    let r = s.get("/probe?backend=origin&path=/private&times=2").await;
    assert!(r.text().ends_with("body=answer 2\n"), "{}", r.text());
    let r = s.get("/probe?backend=origin&path=/fresh&times=3").await;
    assert_eq!(r.text().matches("body=answer 1").count(), 3, "{}", r.text());
    // A backend without `cache = true` is asked every time.
    let r = s.get("/probe?backend=direct&path=/fresh&times=2").await;
    assert!(r.text().ends_with("body=answer 3\n"), "{}", r.text());

    // `ttl`: stored though the answer says nothing.
    let r = s
        .get("/probe?backend=origin&path=/plain?t=1&times=3&cache=ttl=60")
        .await;
    assert_eq!(r.text().matches("body=answer 1").count(), 3, "{}", r.text());
    // ... but never one the backend says is one user's.
    let r = s
        .get("/probe?backend=origin&path=/private?t=1&times=2&cache=ttl=60")
        .await;
    assert!(r.text().ends_with("body=answer 2\n"), "{}", r.text());
    // `pass`: asked every time, stored answer or not.
    let before = backend.asked("/fresh");
    let r = s
        .get("/probe?backend=origin&path=/fresh&times=2&cache=pass")
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(backend.asked("/fresh"), before + 2);
    // The backend never sees the header; a client's own never gets through a guest.
    let r = s
        .get("/probe?backend=origin&path=/headers&cache=tag=x")
        .await;
    assert!(r.text().contains("body=tern-cache: none"), "{}", r.text());
    let r = send(
        s.addr(),
        Method::GET,
        "/probe?backend=direct&path=/headers&forward=1",
        None,
        &[("tern-cache", "ttl=31536000")],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.text(), "tern-cache: none");
    // A header Tern cannot read is refused, with the reason, and nothing is sent.
    let before = backend.asked("/plain");
    let r = s
        .get("/probe?backend=origin&path=/plain&cache=keep-forever")
        .await;
    let text = r.text();
    assert!(
        text.starts_with(&format!("error={} Tern-Cache:", errno::INVALID_ARGUMENT)),
        "{text}"
    );
    assert!(text.contains("keep-forever"), "{text}");
    assert_eq!(backend.asked("/plain"), before);
    // To a backend without `cache = true` it is taken off and not read.
    let r = s
        .get("/probe?backend=direct&path=/headers&cache=keep-forever")
        .await;
    assert!(r.text().contains("body=tern-cache: none"), "{}", r.text());

    // Tags: a purge by the guest's tag drops what it tagged, and only that.
    let tagged = "/probe?backend=origin&path=/plain?t=2&cache=ttl=60,tag=mine";
    let first = s.get(tagged).await.text();
    assert_eq!(s.get(tagged).await.text(), first);
    let (status, v) = s
        .admin_call(
            Method::POST,
            "/admin/v1/tenants/probe/cache/purge",
            r#"{"tags": ["mine"]}"#,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["purged"], 1, "{v}");
    assert_ne!(s.get(tagged).await.text(), first);
    let r = s
        .get("/probe?backend=origin&path=/plain?t=1&cache=ttl=60")
        .await;
    assert!(
        r.text().contains("body=answer 1"),
        "untouched by the purge: {}",
        r.text()
    );
    let m = metrics_of(&s).await;
    assert!(metric_value(&m, &cache_series("probe", "origin", "bypass")) >= 2.0);
}

/// A component's outgoing requests read through the cache too, and see what it did in
/// `Cache-Status`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn components_read_through_the_cache_and_see_cache_status() {
    let backend = CountingBackend::start().await;
    let b = backend.addr;
    let dir = tempfile::tempdir().unwrap();
    test_component(dir.path(), "component");
    let config = format!(
        "[[tenant]]\nname = \"c\"\nmodule = \"component.wasm\"\n\
         [tenant.cache]\nenabled = true\nfront = false\n\
         [tenant.outbound.backends.origin]\nurl = \"http://{b}\"\ncache = true\n"
    );
    let s = TestServer::try_start_in(dir, &config).await.expect("start");
    // What the component answers: the backend's status, `Cache-Status` and body.
    let said = |text: String, cache_status: &str, body: &str| {
        let expected = format!("backend said 200 ({cache_status}");
        assert!(text.starts_with(&expected), "{text}");
        assert!(text.ends_with(&format!(": {body}")), "{text}");
    };
    // (Stored as its body ends, after the head the guest reads this in.)
    let r = s.get("/fetch?url=http://origin/fresh").await;
    said(r.text(), "tern; fwd=uri-miss", "answer 1");
    let r = s.get("/fetch?url=http://origin/fresh").await;
    said(r.text(), "tern; hit", "answer 1");
    let r = s.get("/fetch?cache=pass&url=http://origin/fresh").await;
    assert!(r.text().ends_with(": answer 2"), "{}", r.text());
    let r = s.get("/fetch?cache=ttl=0&url=http://origin/fresh").await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY, "{}", r.text());
    assert_eq!(backend.asked("/fresh"), 2);
}

/// A backend with `cache = true` needs the tenant's cache: refused at start, with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_backend_without_a_tenant_cache_is_refused() {
    let config = "[[tenant]]\nname = \"dash\"\nmodule = \"builtin:aggregate\"\n\
         [tenant.outbound.backends.users]\nurl = \"http://127.0.0.1:9\"\ncache = true\n";
    let err = TestServer::try_start(config).await.err().expect("refused");
    let text = format!("{err:#}");
    assert!(
        text.contains("outbound.backends.users.cache = true needs the tenant's cache"),
        "{text}"
    );
}

/// A backend's answers count against the tenant's cache like its guests' do: one over
/// `max_object_kib` reaches the guest whole and is not stored; past `max_mib` older answers
/// are evicted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_answers_live_within_the_tenants_cache_budget() {
    let backend = CountingBackend::start().await;
    let s = probe(
        &backend,
        "front = false\nmax_mib = 1\nmax_object_kib = 64",
        "[tenant.outbound]\nmax_response_bytes = 1000000",
    )
    .await;
    // 64 KiB - 1, 64 KiB and 64 KiB + 1: the last is too large to keep.
    for (n, asked) in [(65_535, 1), (65_536, 1), (65_537, 2)] {
        let r = s
            .get(&format!("/probe?backend=origin&path=/sized?n={n}&times=2"))
            .await;
        assert_eq!(
            r.text().matches(&format!("status=200 bytes={n} ")).count(),
            2,
            "{}",
            r.text()
        );
        assert_eq!(backend.asked(&format!("/sized?n={n}")), asked, "n = {n}");
    }
    // 40 answers of 60 KB (2.4 MB) in a 1 MiB cache: the store keeps within it.
    for i in 0..40 {
        let r = s
            .get(&format!(
                "/probe?backend=origin&path=/sized?n={}",
                60_000 + i
            ))
            .await;
        assert_eq!(r.status, StatusCode::OK);
    }
    let mut evicted = 0.0;
    for _ in 0..50 {
        let m = metrics_of(&s).await;
        evicted = metric_value(&m, "tern_cache_evictions_total{tenant=\"probe\"}");
        let stored = metric_value(&m, "tern_cache_stored_bytes{tenant=\"probe\"}");
        if evicted > 0.0 && stored <= 1024.0 * 1024.0 {
            break;
        }
        // (A full store evicts as it is written to; a request gives it the chance.)
        s.get("/probe?backend=origin&path=/plain").await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(evicted > 0.0, "answers past max_mib were evicted");
    let m = metrics_of(&s).await;
    assert!(metric_value(&m, "tern_cache_stored_bytes{tenant=\"probe\"}") <= 1024.0 * 1024.0);
}

/// Stale answers of a backend as the front cache treats stale guests' answers: served within
/// `stale-while-revalidate` while the backend is asked again in the background, revalidated
/// with its `ETag` (a `304` keeps the stored body), served within `stale-if-error` when the
/// backend fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_backend_answers_are_refreshed_revalidated_or_served_on_error() {
    let backend = CountingBackend::start().await;
    let s = probe(&backend, "front = false", "").await;
    let body = |text: String| {
        text.split("body=")
            .nth(1)
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    for path in ["/swr", "/etag", "/sie"] {
        let r = s.get(&format!("/probe?backend=origin&path={path}")).await;
        assert_eq!(body(r.text()), "answer 1", "{path}");
    }
    // (Fresh for 3 s less their age when stored, under a second: stale after 3.2 s.)
    tokio::time::sleep(Duration::from_millis(3200)).await;
    // Stale within its window: the stored answer at once, a new one asked for behind it.
    let r = s.get("/probe?backend=origin&path=/swr").await;
    assert_eq!(body(r.text()), "answer 1");
    let mut refreshed = String::new();
    for _ in 0..50 {
        refreshed = body(s.get("/probe?backend=origin&path=/swr").await.text());
        if refreshed == "answer 2" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(refreshed, "answer 2", "refreshed in the background");
    assert_eq!(backend.asked("/swr"), 2);
    // Revalidated: the backend says `304`, the stored body is served again and fresh.
    let r = s.get("/probe?backend=origin&path=/etag&times=2").await;
    assert_eq!(r.text().matches("body=answer 1").count(), 2, "{}", r.text());
    assert_eq!(
        backend.asked("/etag"),
        2,
        "one request to revalidate, then fresh"
    );
    // The backend fails: the stale answer instead of its `500`.
    let r = s.get("/probe?backend=origin&path=/sie").await;
    assert_eq!(r.text(), "status=200 bytes=8 body=answer 1\n");
    assert_eq!(backend.asked("/sie"), 2);
    let m = metrics_of(&s).await;
    assert!(metric_value(&m, &cache_series("probe", "origin", "stale")) >= 2.0);
    assert_eq!(
        metric_value(&m, &cache_series("probe", "origin", "revalidated")),
        1.0
    );
}
