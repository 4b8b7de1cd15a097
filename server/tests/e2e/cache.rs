//! The cache in front of guests (`[tenant.cache]`): what is stored and served without a guest,
//! what never is, variants, validators, invalidation, isolation between tenants and hosts.
//!
//! The guest (`cache_headers`) answers with the headers its query names and a body starting
//! with the instant it ran, so an answer from the cache is the first run's body, byte for byte,
//! and a guest that ran again gives another.

use bytes::Bytes;
use http::{Method, StatusCode};

use crate::support::{
    H2Conn, Reply, TestServer, metric_is, metric_value, metric_value_or_zero, send, test_guest,
};

/// A server with `cache_headers` cached at `/c` (any host) and uncached at `/u`, and a second
/// cached tenant on the host `other.test`.
async fn server() -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    test_guest(dir.path(), "cache_headers");
    let config = "[pool]\ninstances = 16\nmax_memory_mib = 64\n\
         [[tenant]]\nname = \"c\"\nmodule = \"cache_headers.wasm\"\npaths = [\"/c\"]\n\
         [tenant.cache]\nenabled = true\n\
         [[tenant]]\nname = \"u\"\nmodule = \"cache_headers.wasm\"\npaths = [\"/u\"]\n\
         [[tenant]]\nname = \"o\"\nmodule = \"cache_headers.wasm\"\nhosts = [\"other.test\"]\n\
         paths = [\"/c\"]\n[tenant.cache]\nenabled = true\n";
    TestServer::try_start_in(dir, config).await.expect("start")
}

async fn ask(s: &TestServer, path: &str, headers: &[(&str, &str)]) -> Reply {
    send(s.addr(), Method::GET, path, None, headers, Bytes::new()).await
}

async fn ask_host(s: &TestServer, host: &str, path: &str) -> Reply {
    send(s.addr(), Method::GET, path, Some(host), &[], Bytes::new()).await
}

/// The instant the guest ran, from its body.
fn run_of(r: &Reply) -> String {
    let text = r.text();
    assert!(text.starts_with("run "), "not the guest's body: {text}");
    text.lines().next().unwrap_or_default().to_string()
}

async fn guest_runs(s: &TestServer, tenant: &str) -> f64 {
    let m = s.metrics().await;
    metric_value_or_zero(
        &m,
        &format!("tern_guest_outcomes_total{{outcome=\"ok\",tenant=\"{tenant}\"}}"),
    )
}

/// Waits until a guest holds a slot: the first request of a key has passed the cache and is
/// filling it (those sent from now on find it filling). Never a sleep that guesses.
async fn leader_running(s: &TestServer) {
    s.wait_metric(r#"tern_pool_slots{kind="instances",state="in_use"}"#, 1.0)
        .await;
}

/// Waits until no guest holds a slot (the last one's teardown is over), so that
/// [`leader_running`] sees the next one.
async fn no_guest_running(s: &TestServer) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !metric_is(
        &s.metrics().await,
        r#"tern_pool_slots{kind="instances",state="in_use"}"#,
        0.0,
    ) {
        assert!(
            std::time::Instant::now() < deadline,
            "a guest kept its slot"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

const FRESH: &str = "/c/page?h=cache-control:max-age%3D60";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_answers_are_served_from_memory_without_a_guest() {
    let s = server().await;
    let first = ask(&s, FRESH, &[]).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.text());
    assert_eq!(first.header("cache-status"), "tern; fwd=uri-miss; stored");
    assert_eq!(guest_runs(&s, "c").await, 1.0);

    // HTTP/1.1, HTTP/2 and HEAD are answered from the stored GET; no guest runs.
    let second = ask(&s, FRESH, &[]).await;
    assert_eq!(second.status, StatusCode::OK);
    assert_eq!(second.body, first.body, "the stored body, byte for byte");
    assert!(
        second.header("cache-status").starts_with("tern; hit; ttl="),
        "{:?}",
        second.headers
    );
    assert!(second.header("age").parse::<u64>().is_ok_and(|a| a <= 1));
    assert_eq!(second.header("content-type"), "text/plain");
    assert!(!second.header("x-request-id").is_empty());
    assert!(
        second.header("server-timing").contains("cache;dur="),
        "{}",
        second.header("server-timing")
    );
    // HTTP/2 carries the host in `:authority`: the same host over HTTP/1.1 is the same key.
    let by_addr = ask_host(&s, &s.addr().to_string(), FRESH).await;
    assert_ne!(run_of(&by_addr), run_of(&first), "another host");
    let h2 = H2Conn::open(s.addr()).await.get(FRESH).await;
    assert_eq!(h2.body, by_addr.body);
    assert!(h2.header("cache-status").starts_with("tern; hit"));
    let head = send(s.addr(), Method::HEAD, FRESH, None, &[], Bytes::new()).await;
    assert_eq!(head.status, StatusCode::OK);
    assert!(head.body.is_empty());
    assert_eq!(head.header("content-length"), first.body.len().to_string());
    assert!(head.header("cache-status").starts_with("tern; hit"));
    assert_eq!(guest_runs(&s, "c").await, 2.0, "no guest ran for a hit");

    // The same resource by another spelling of its path is the same key (the normal path).
    let spelled = ask(&s, "/c/./x/../p%61ge?h=cache-control:max-age%3D60", &[]).await;
    assert_eq!(spelled.body, first.body);

    let m = s.metrics().await;
    assert_eq!(
        metric_value(&m, "tern_cache_requests_total{result=\"hit\",tenant=\"c\"}"),
        4.0
    );
    assert_eq!(
        metric_value(
            &m,
            "tern_cache_requests_total{result=\"miss\",tenant=\"c\"}"
        ),
        2.0
    );
    assert!(metric_value(&m, "tern_cache_stored_bytes{tenant=\"c\"}") > 0.0);

    // A tenant without a cache runs its guest every time and says nothing of a cache.
    let a = ask(&s, "/u/page?h=cache-control:max-age%3D60", &[]).await;
    let b = ask(&s, "/u/page?h=cache-control:max-age%3D60", &[]).await;
    assert_ne!(run_of(&a), run_of(&b));
    assert_eq!(b.header("cache-status"), "");
}

/// Each of these answers is served and never stored: the guest runs for every request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_a_shared_cache_must_not_keep_are_not_stored() {
    let s = server().await;
    for (what, path) in [
        ("no freshness", "/c/a?h=x-y:z"),
        ("no-store", "/c/b?h=cache-control:max-age%3D60,%20no-store"),
        ("private", "/c/c?h=cache-control:private,%20max-age%3D60"),
        ("max-age=0", "/c/d?h=cache-control:max-age%3D0"),
        (
            "set-cookie",
            "/c/e?h=cache-control:max-age%3D60&h=set-cookie:id%3D1",
        ),
        ("vary *", "/c/f?h=cache-control:max-age%3D60&h=vary:*"),
        ("a 500", "/c/g?h=cache-control:max-age%3D60&status=500"),
        ("a 404 without freshness", "/c/h?status=404"),
        ("too large", "/c/i?h=cache-control:max-age%3D60&n=1048577"),
        (
            "CDN-Cache-Control no-store over Cache-Control",
            "/c/j?h=cache-control:max-age%3D60&h=cdn-cache-control:no-store",
        ),
    ] {
        let a = ask(&s, path, &[]).await;
        let b = ask(&s, path, &[]).await;
        assert_ne!(run_of(&a), run_of(&b), "{what}: the guest ran once");
        assert!(
            b.header("cache-status").starts_with("tern; fwd=")
                && !b.header("cache-status").contains("stored"),
            "{what}: {}",
            b.header("cache-status")
        );
    }
    // The request's own no-store, and a GET with a body (which the key does not hold).
    let path = "/c/k?h=cache-control:max-age%3D60";
    ask(&s, path, &[("cache-control", "no-store")]).await;
    let b = ask(&s, path, &[]).await;
    assert_eq!(b.header("cache-status"), "tern; fwd=uri-miss; stored");
    let path = "/c/l?h=cache-control:max-age%3D60";
    let fat = send(
        s.addr(),
        Method::GET,
        path,
        None,
        &[],
        Bytes::from_static(b"a body"),
    )
    .await;
    assert!(!fat.header("cache-status").contains("stored"));
    let b = ask(&s, path, &[]).await;
    assert_eq!(b.header("cache-status"), "tern; fwd=uri-miss; stored");
    // A fresh stored answer is also not given to a request that asks for a new one.
    let c = ask(&s, path, &[("cache-control", "no-cache")]).await;
    assert_ne!(run_of(&c), run_of(&b));
    assert_eq!(c.header("cache-status"), "tern; fwd=request; stored");
}

/// `CDN-Cache-Control` (RFC 9213) decides for the edge over `Cache-Control`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cdn_cache_control_decides_for_the_edge() {
    let s = server().await;
    let path = "/c/cdn?h=cache-control:no-store&h=cdn-cache-control:max-age%3D60";
    let a = ask(&s, path, &[]).await;
    let b = ask(&s, path, &[]).await;
    assert_eq!(run_of(&a), run_of(&b));
    assert_eq!(
        b.header("cache-control"),
        "no-store",
        "sent on as the guest set it"
    );
}

/// An answer for one tenant, host or set of credentials is never another's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_are_kept_apart_by_tenant_host_and_credentials() {
    let s = server().await;
    let path = "/c/shared?h=cache-control:public,%20max-age%3D60";
    let a = ask_host(&s, "a.test", path).await;
    let o = ask_host(&s, "other.test", path).await;
    let b = ask_host(&s, "b.test", path).await;
    assert_ne!(run_of(&a), run_of(&o), "another tenant");
    assert_ne!(run_of(&a), run_of(&b), "another host");
    assert_eq!(run_of(&ask_host(&s, "A.TEST", path).await), run_of(&a));
    assert_eq!(run_of(&ask_host(&s, "other.test", path).await), run_of(&o));

    // Credentials: an answer to them (stored only because it says `public`) goes to the same
    // credentials only; the anonymous answer never to a request that has some.
    let alice = [("authorization", "Bearer alice")];
    let bob = [("authorization", "Bearer bob")];
    let with_alice = ask(&s, path, &alice).await;
    assert!(with_alice.text().contains("authorization Bearer alice"));
    let anonymous = ask(&s, path, &[]).await;
    assert_ne!(run_of(&anonymous), run_of(&with_alice));
    assert!(anonymous.text().contains("authorization -"));
    let with_bob = ask(&s, path, &bob).await;
    assert!(with_bob.text().contains("authorization Bearer bob"));
    assert_eq!(run_of(&ask(&s, path, &alice).await), run_of(&with_alice));
    assert_eq!(run_of(&ask(&s, path, &[]).await), run_of(&anonymous));
    // Without `public` (or `s-maxage`, `must-revalidate`) an answer to credentials is not kept.
    let private = "/c/mine?h=cache-control:max-age%3D60";
    let first = ask(&s, private, &alice).await;
    assert_ne!(run_of(&ask(&s, private, &alice).await), run_of(&first));
}

/// `Vary` keeps one answer per value of the fields it names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vary_keeps_a_variant_per_value() {
    let s = server().await;
    let path = "/c/v?h=cache-control:max-age%3D60&h=vary:accept-language";
    let en = ask(&s, path, &[("accept-language", "en")]).await;
    let fr = ask(&s, path, &[("accept-language", "fr")]).await;
    assert_ne!(run_of(&en), run_of(&fr));
    assert_eq!(fr.header("cache-status"), "tern; fwd=vary-miss; stored");
    let none = ask(&s, path, &[]).await;
    assert_ne!(run_of(&none), run_of(&en));
    for _ in 0..2 {
        assert_eq!(
            run_of(&ask(&s, path, &[("accept-language", "en")]).await),
            run_of(&en)
        );
        assert_eq!(
            run_of(&ask(&s, path, &[("accept-language", "fr")]).await),
            run_of(&fr)
        );
        assert_eq!(run_of(&ask(&s, path, &[]).await), run_of(&none));
    }
}

/// Conditional requests are answered `304` from the cache, and on a miss the guest answers in
/// full (so the answer can be stored) while the client still gets its `304`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validators_are_answered_from_the_cache() {
    let s = server().await;
    let path = "/c/e?h=cache-control:max-age%3D60&h=etag:%22v1%22\
                &h=last-modified:Wed,%2021%20Oct%202015%2007:28:00%20GMT";
    let first = ask(&s, path, &[("if-none-match", "\"v1\"")]).await;
    assert_eq!(first.status, StatusCode::NOT_MODIFIED);
    assert!(first.body.is_empty());
    assert_eq!(first.header("etag"), "\"v1\"");
    assert_eq!(first.header("cache-status"), "tern; fwd=uri-miss; stored");
    // The guest got no validator: its full answer is what was stored.
    let full = ask(&s, path, &[]).await;
    assert_eq!(full.status, StatusCode::OK);
    assert!(full.text().contains("if-none-match -"), "{}", full.text());
    assert!(full.header("cache-status").starts_with("tern; hit"));
    for (name, value, status) in [
        ("if-none-match", "\"v1\"", StatusCode::NOT_MODIFIED),
        ("if-none-match", "W/\"v1\"", StatusCode::NOT_MODIFIED),
        ("if-none-match", "\"v0\", \"v1\"", StatusCode::NOT_MODIFIED),
        ("if-none-match", "\"v2\"", StatusCode::OK),
        (
            "if-modified-since",
            "Wed, 21 Oct 2015 07:28:00 GMT",
            StatusCode::NOT_MODIFIED,
        ),
        (
            "if-modified-since",
            "Tue, 20 Oct 2015 07:28:00 GMT",
            StatusCode::OK,
        ),
    ] {
        let r = ask(&s, path, &[(name, value)]).await;
        assert_eq!(r.status, status, "{name}: {value}");
        assert!(r.header("cache-status").starts_with("tern; hit"));
        if status == StatusCode::OK {
            assert_eq!(r.body, full.body);
        } else {
            assert!(r.body.is_empty());
        }
    }
}

/// A stored answer leaves when it goes stale; a non-error answer to an unsafe method
/// invalidates its URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_and_invalidated_answers_are_asked_again() {
    let s = server().await;
    let path = "/c/short?h=cache-control:max-age%3D1";
    let a = ask(&s, path, &[]).await;
    assert_eq!(run_of(&ask(&s, path, &[]).await), run_of(&a));
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    let b = ask(&s, path, &[]).await;
    assert_ne!(run_of(&b), run_of(&a), "stale after its max-age");

    let path = "/c/doc?h=cache-control:max-age%3D60";
    let a = ask(&s, path, &[]).await;
    assert_eq!(run_of(&ask(&s, path, &[]).await), run_of(&a));
    // A failed unsafe request leaves it; a successful one invalidates it.
    let failed = send(
        s.addr(),
        Method::DELETE,
        &format!("{path}&status=500"),
        None,
        &[],
        Bytes::new(),
    )
    .await;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(failed.header("cache-status"), "tern; fwd=method");
    assert_eq!(run_of(&ask(&s, path, &[]).await), run_of(&a));
    // (Its own query is another URL: the unsafe request must name the stored one.)
    let posted = send(s.addr(), Method::POST, path, None, &[], Bytes::from("x")).await;
    assert_eq!(posted.status, StatusCode::OK);
    assert_ne!(run_of(&ask(&s, path, &[]).await), run_of(&a));
    let m = s.metrics().await;
    assert_eq!(
        metric_value(
            &m,
            "tern_cache_requests_total{result=\"bypass\",tenant=\"c\"}"
        ),
        2.0
    );
}

/// Bad cache settings are refused with the setting named, in the file and through the API;
/// good ones are kept in the tenant's spec.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_settings_are_checked_and_kept() {
    let err = TestServer::try_start(
        "[[tenant]]\nname = \"t\"\nmodule = \"builtin:hello\"\n[tenant.cache]\nenabled = true\nmax_mib = 0\n",
    )
    .await
    .err()
    .expect("refused");
    assert!(format!("{err:#}").contains("cache.max_mib"), "{err:#}");
    let err = TestServer::try_start(
        "[[tenant]]\nname = \"t\"\nmodule = \"builtin:hello\"\n[tenant.cache]\nenabled = true\nmax_bytes = 1\n",
    )
    .await
    .err()
    .expect("refused");
    assert!(format!("{err:#}").contains("max_bytes"), "{err:#}");

    let s = TestServer::start("").await;
    s.deploy("h", "/h", crate::support::demo("hello")).await;
    let (status, body) = s
        .admin_call(
            Method::PATCH,
            "/admin/v1/tenants/h",
            serde_json::json!({"cache": {"enabled": true, "max_mib": 0}}).to_string(),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.to_string().contains("cache.max_mib"), "{body}");
    let (status, body) = s
        .admin_call(
            Method::PATCH,
            "/admin/v1/tenants/h",
            serde_json::json!({"cache": {"enabled": true, "max_mib": 8}}).to_string(),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (_, tenant) = s.admin_call(Method::GET, "/admin/v1/tenants/h", "").await;
    assert_eq!(tenant["spec"]["cache"]["max_mib"], 8, "{tenant}");
    assert_eq!(tenant["spec"]["cache"]["enabled"], true, "{tenant}");
}

/// Concurrent misses of one key run one guest and get its answer; when that answer proves not
/// storable they run their own, side by side, and later misses of the key no longer wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_misses_of_a_key_run_one_guest() {
    let s = server().await;
    let path = "/c/slow?h=cache-control:max-age%3D60&wait_ms=400";
    let addr = s.addr();
    let get = move |path: &'static str| {
        tokio::spawn(async move { send(addr, Method::GET, path, None, &[], Bytes::new()).await })
    };
    no_guest_running(&s).await;
    let first = get(path);
    leader_running(&s).await;
    let followers: Vec<_> = (0..10).map(|_| get(path)).collect();
    let first = first.await.unwrap();
    assert_eq!(first.header("cache-status"), "tern; fwd=uri-miss; stored");
    for f in followers {
        let r = f.await.unwrap();
        assert_eq!(r.body, first.body, "the first request's answer");
        assert!(
            r.header("cache-status").starts_with("tern; hit;")
                && r.header("cache-status").ends_with("; collapsed"),
            "{}",
            r.header("cache-status")
        );
    }
    assert_eq!(
        guest_runs(&s, "c").await,
        1.0,
        "one guest ran for 11 requests"
    );
    let m = s.metrics().await;
    assert_eq!(
        metric_value(
            &m,
            "tern_cache_requests_total{result=\"collapsed\",tenant=\"c\"}"
        ),
        10.0
    );

    // Not storable: the waiting misses run their own guests once the first answer is in, and
    // the key's next misses run at once.
    let path = "/c/uncached?h=cache-control:no-store&wait_ms=300";
    no_guest_running(&s).await;
    let first = get(path);
    leader_running(&s).await;
    let followers: Vec<_> = (0..4).map(|_| get(path)).collect();
    let first = first.await.unwrap();
    let mut runs = vec![run_of(&first)];
    for f in followers {
        let r = f.await.unwrap();
        assert_eq!(r.header("cache-status"), "tern; fwd=uri-miss; collapsed");
        runs.push(run_of(&r));
    }
    let later: Vec<_> = (0..4).map(|_| get(path)).collect();
    for l in later {
        let r = l.await.unwrap();
        assert_eq!(
            r.header("cache-status"),
            "tern; fwd=uri-miss",
            "no waiting in line"
        );
        runs.push(run_of(&r));
    }
    runs.sort();
    runs.dedup();
    assert_eq!(runs.len(), 9, "every request ran its own guest");
}

/// Purges drop what they name (every answer, a path prefix, a tag), through the API and
/// `tern cache purge`; tags never reach the client; bad purges are refused with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purges_drop_what_they_name() {
    let s = server().await;
    let tagged = |path: &str, tags: &str| {
        format!("{path}?h=cache-control:max-age%3D60&h=surrogate-key:{tags}&h=cache-tag:shared")
    };
    let a = tagged("/c/blog/a", "post%20blog");
    let b = tagged("/c/blog/b", "blog");
    let n = tagged("/c/news/n", "news");
    for p in [&a, &b, &n] {
        let r = ask(&s, p, &[]).await;
        assert_eq!(r.header("cache-status"), "tern; fwd=uri-miss; stored");
        assert_eq!(r.header("surrogate-key"), "", "tags are the edge's");
    }
    let ra = ask(&s, &a, &[]).await;
    assert!(ra.header("cache-status").starts_with("tern; hit"));
    assert_eq!(ra.header("surrogate-key"), "", "tags are the edge's");
    assert_eq!(ra.header("cache-tag"), "");
    let (rb, rn) = (ask(&s, &b, &[]).await, ask(&s, &n, &[]).await);

    let purge = |body: serde_json::Value| {
        let s = &s;
        async move {
            s.admin_call(
                Method::POST,
                "/admin/v1/tenants/c/cache/purge",
                body.to_string(),
            )
            .await
        }
    };
    // By tag: only `post` is `a`'s.
    let (status, v) = purge(serde_json::json!({"tags": ["post"]})).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["purged"], 1, "{v}");
    assert_eq!(v["replicas"], "this one");
    assert_ne!(run_of(&ask(&s, &a, &[]).await), run_of(&ra));
    assert_eq!(run_of(&ask(&s, &b, &[]).await), run_of(&rb));
    // By prefix (in its normal form): the blog, not the news.
    let (status, v) = purge(serde_json::json!({"prefixes": ["/c/./blog/"]})).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["purged"], 2, "{v}");
    assert_ne!(run_of(&ask(&s, &b, &[]).await), run_of(&rb));
    assert_eq!(run_of(&ask(&s, &n, &[]).await), run_of(&rn));
    // Everything, with the command line.
    let out = crate::support::tern_bin()
        .args(["cache", "purge", "c", "--all"])
        .args(["--server", &format!("http://{}", s.admin())])
        .args(["--token", crate::support::ADMIN_TOKEN])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("purged 2 stored URL(s) of c"), "{text}");
    assert_ne!(run_of(&ask(&s, &n, &[]).await), run_of(&rn));

    for (body, status, says) in [
        (
            serde_json::json!({}),
            StatusCode::BAD_REQUEST,
            "a purge names one of",
        ),
        (
            serde_json::json!({"all": true, "tags": ["x"]}),
            StatusCode::BAD_REQUEST,
            "a purge names one of",
        ),
        (
            serde_json::json!({"prefixes": ["blog"]}),
            StatusCode::BAD_REQUEST,
            "starting with '/'",
        ),
        (
            serde_json::json!({"all": true, "hard": true}),
            StatusCode::BAD_REQUEST,
            "unknown field `hard`",
        ),
    ] {
        let (got, v) = purge(body.clone()).await;
        assert_eq!(got, status, "{body}: {v}");
        assert!(v.to_string().contains(says), "{body}: {v}");
    }
    let (got, v) = s
        .admin_call(
            Method::POST,
            "/admin/v1/tenants/u/cache/purge",
            r#"{"all": true}"#,
        )
        .await;
    assert_eq!(got, StatusCode::BAD_REQUEST, "{v}");
    assert!(v.to_string().contains("has no cache"), "{v}");
    let (got, _) = s
        .admin_call(
            Method::POST,
            "/admin/v1/tenants/nope/cache/purge",
            r#"{"all": true}"#,
        )
        .await;
    assert_eq!(got, StatusCode::NOT_FOUND);
}

/// A request carrying a header that proxies read as its host, scheme, URL or method (which the
/// key does not hold) cannot shape what others get: its answer is served and not stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unkeyed_headers_cannot_poison_the_cache() {
    let s = server().await;
    let path = "/c/poison?h=cache-control:max-age%3D60";
    for header in [
        "x-forwarded-host",
        "x-forwarded-proto",
        "x-original-url",
        "x-http-method-override",
        "forwarded",
    ] {
        let shaped = ask(&s, path, &[(header, "evil.example")]).await;
        assert_eq!(shaped.status, StatusCode::OK);
        assert_eq!(
            shaped.header("cache-status"),
            "tern; fwd=uri-miss; detail=unkeyed-header",
            "{header}"
        );
    }
    let clean = ask(&s, path, &[]).await;
    assert_eq!(clean.header("cache-status"), "tern; fwd=uri-miss; stored");
    // Once stored, the same request with such a header gets the stored answer.
    let again = ask(&s, path, &[("x-forwarded-host", "evil.example")]).await;
    assert_eq!(run_of(&again), run_of(&clean));
    // A second Host header, or a target whose authority differs from Host: refused before
    // the cache.
    let r = crate::support::raw(
        s.addr(),
        format!("GET {path} HTTP/1.1\r\nhost: a.test\r\nhost: b.test\r\n\r\n"),
    )
    .await;
    assert!(r.starts_with("HTTP/1.1 400"), "{r}");
    let r = crate::support::raw(
        s.addr(),
        format!("GET http://b.test{path} HTTP/1.1\r\nhost: a.test\r\n\r\n"),
    )
    .await;
    assert!(r.starts_with("HTTP/1.1 400"), "{r}");
}

/// Behind a trusted proxy (`[server] trusted_proxies`), the headers it adds do not keep its
/// requests' answers out of the cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trusted_proxys_forwarding_headers_do_not_stop_storing() {
    let dir = tempfile::tempdir().unwrap();
    test_guest(dir.path(), "cache_headers");
    let config = "[server]\ntrusted_proxies = [\"127.0.0.1\"]\n\
         [pool]\ninstances = 16\nmax_memory_mib = 64\n\
         [[tenant]]\nname = \"c\"\nmodule = \"cache_headers.wasm\"\npaths = [\"/c\"]\n\
         [tenant.cache]\nenabled = true\n";
    let s = TestServer::try_start_in(dir, config).await.expect("start");
    let path = "/c/behind?h=cache-control:max-age%3D60";
    let proxied = [
        ("x-forwarded-proto", "https"),
        ("x-forwarded-for", "192.0.2.7"),
    ];
    let first = ask(&s, path, &proxied).await;
    assert_eq!(first.header("cache-status"), "tern; fwd=uri-miss; stored");
    let second = ask(&s, path, &proxied).await;
    assert_eq!(run_of(&second), run_of(&first));
}

async fn metric(s: &TestServer, result: &str) -> f64 {
    metric_value_or_zero(
        &s.metrics().await,
        &format!("tern_cache_requests_total{{result=\"{result}\",tenant=\"c\"}}"),
    )
}

/// Waits until the tenant `c`'s guest has run `runs` times.
async fn until_runs(s: &TestServer, runs: f64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while guest_runs(s, "c").await < runs {
        assert!(
            std::time::Instant::now() < deadline,
            "the guest never ran {runs} times"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// RFC 5861's `stale-while-revalidate`: once stale, the stored answer is served at once to
/// every request while exactly one refresh runs the guest in the background; then the new
/// answer is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_answers_are_served_at_once_while_one_refresh_runs() {
    let s = server().await;
    // The guest computes 300 ms: the refresh is still running while the stale ones are served.
    let path = "/c/swr?h=cache-control:max-age%3D1,%20stale-while-revalidate%3D30&wait_ms=300";
    let first = ask(&s, path, &[]).await;
    assert_eq!(first.header("cache-status"), "tern; fwd=uri-miss; stored");
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let addr = s.addr();
    let asks: Vec<_> = (0..10)
        .map(|_| {
            tokio::spawn(
                async move { send(addr, Method::GET, path, None, &[], Bytes::new()).await },
            )
        })
        .collect();
    let mut stale = Vec::new();
    for a in asks {
        stale.push(a.await.unwrap());
    }
    for r in &stale {
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(run_of(r), run_of(&first), "the stored answer, at once");
        let status = r.header("cache-status");
        assert!(
            status.starts_with("tern; hit; ttl=-")
                && status.ends_with("; detail=stale-while-revalidate"),
            "{status}"
        );
    }
    until_runs(&s, 2.0).await;
    // The refresh stored its answer: served fresh, by no further guest run.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let fresh = loop {
        let r = ask(&s, path, &[]).await;
        if run_of(&r) != run_of(&first) {
            break r;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the refresh was never stored"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert!(fresh.header("cache-status").starts_with("tern; hit; ttl="));
    assert!(!fresh.header("cache-status").contains("ttl=-"));
    assert_eq!(guest_runs(&s, "c").await, 2.0, "exactly one refresh");
    assert!(metric(&s, "stale").await >= 10.0);
    // A request whose headers could shape the answer is served stale but starts no refresh.
    let path = "/c/swr2?h=cache-control:max-age%3D1,%20stale-while-revalidate%3D30";
    let first = ask(&s, path, &[]).await;
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let r = ask(&s, path, &[("x-forwarded-host", "evil.test")]).await;
    assert_eq!(run_of(&r), run_of(&first));
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(guest_runs(&s, "c").await, 3.0, "no refresh from it");
    // `must-revalidate` forbids serving stale: the guest answers.
    let path =
        "/c/swr3?h=cache-control:max-age%3D1,%20stale-while-revalidate%3D30,%20must-revalidate";
    let first = ask(&s, path, &[]).await;
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let r = ask(&s, path, &[]).await;
    assert_ne!(run_of(&r), run_of(&first));
    // (Nothing could use it once stale: it left the store then.)
    assert_eq!(r.header("cache-status"), "tern; fwd=uri-miss; stored");
}

/// A soft purge makes answers stale instead of dropping them: the next request sends the guest
/// the stored validators, and its `304` keeps the stored body (the client gets it whole, or a
/// `304` for its own validators).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_soft_purge_revalidates_and_a_304_keeps_the_stored_body() {
    let s = server().await;
    let path = "/c/soft?h=cache-control:max-age%3D60&h=etag:%22v1%22";
    let first = ask(&s, path, &[]).await;
    assert_eq!(first.header("cache-status"), "tern; fwd=uri-miss; stored");
    let (status, v) = s
        .admin_call(
            Method::POST,
            "/admin/v1/tenants/c/cache/purge",
            serde_json::json!({"prefixes": ["/c/soft"], "soft": true}).to_string(),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(
        (v["purged"].as_u64(), v["soft"].as_bool()),
        (Some(1), Some(true))
    );
    // The guest saw the stored ETag and answered 304: the stored body, refreshed.
    let again = ask(&s, path, &[]).await;
    assert_eq!(again.status, StatusCode::OK);
    assert_eq!(again.body, first.body, "the stored body, byte for byte");
    assert_eq!(
        again.header("cache-status"),
        "tern; fwd=stale; fwd-status=304; stored"
    );
    assert_eq!(guest_runs(&s, "c").await, 2.0);
    assert_eq!(metric(&s, "revalidated").await, 1.0);
    // Fresh again: a hit, no guest.
    let hit = ask(&s, path, &[]).await;
    assert!(hit.header("cache-status").starts_with("tern; hit; ttl="));
    assert_eq!(hit.body, first.body);
    assert_eq!(guest_runs(&s, "c").await, 2.0);
    // A client with its own validator gets its 304 from a revalidation too.
    let (status, _) = s
        .admin_call(
            Method::POST,
            "/admin/v1/tenants/c/cache/purge",
            serde_json::json!({"all": true, "soft": true}).to_string(),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let conditional = ask(&s, path, &[("if-none-match", "\"v1\"")]).await;
    assert_eq!(conditional.status, StatusCode::NOT_MODIFIED);
    assert!(conditional.body.is_empty());
    // An answer that changed is stored whole.
    let changed = "/c/soft2?h=cache-control:max-age%3D60&h=last-modified:Wed,%2021%20Oct%202015%2007:28:00%20GMT";
    let a = ask(&s, changed, &[]).await;
    let out = crate::support::ran(
        crate::support::tern_bin()
            .args(["cache", "purge", "c", "--prefix", "/c/soft2", "--soft"])
            .args(["--server", &format!("http://{}", s.admin())])
            .args(["--token", crate::support::ADMIN_TOKEN]),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("marked stale 1 stored URL(s) of c on this server"),
        "{text}"
    );
    // No ETag: the guest saw If-Modified-Since, and (not answering 304) gave a new body.
    let b = ask(&s, changed, &[]).await;
    assert!(
        b.text()
            .contains("if-modified-since Wed, 21 Oct 2015 07:28:00 GMT"),
        "{}",
        b.text()
    );
    assert_ne!(run_of(&b), run_of(&a));
    assert_eq!(b.header("cache-status"), "tern; fwd=stale; stored");
}

/// RFC 5861's `stale-if-error`: a guest that traps or fails while its answer is stale is
/// answered for by the stored answer within the window; without the window the client gets
/// the failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_guest_is_answered_for_by_its_stale_answer_within_stale_if_error() {
    let s = server().await;
    let path = "/c/sie?h=cache-control:max-age%3D1,%20stale-if-error%3D60";
    let first = ask(&s, path, &[]).await;
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    for fail in ["trap", "503", "500"] {
        let r = ask(&s, path, &[("x-test-fail", fail)]).await;
        assert_eq!(r.status, StatusCode::OK, "{fail}: {}", r.text());
        assert_eq!(run_of(&r), run_of(&first), "{fail}");
        let status = r.header("cache-status");
        assert!(
            status.starts_with("tern; fwd=stale; fwd-status=5")
                && status.ends_with("; detail=stale-if-error"),
            "{fail}: {status}"
        );
    }
    assert_eq!(metric(&s, "stale").await, 3.0);
    // A 4xx is not a failure of the origin: it is the answer.
    let r = ask(&s, path, &[("x-test-fail", "404")]).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    // The guest recovered: its new answer is stored.
    let r = ask(&s, path, &[]).await;
    assert_ne!(run_of(&r), run_of(&first));
    assert_eq!(r.header("cache-status"), "tern; fwd=stale; stored");

    // Without stale-if-error the failure reaches the client.
    let path = "/c/nosie?h=cache-control:max-age%3D1";
    ask(&s, path, &[]).await;
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let r = ask(&s, path, &[("x-test-fail", "trap")]).await;
    assert!(r.status.is_server_error(), "{}", r.status);
}

/// A deploy or a settings change starts the tenant's cache empty, and gives its bytes back
/// in `tern_cache_stored_bytes`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_version_starts_with_an_empty_cache() {
    let dir = tempfile::tempdir().unwrap();
    test_guest(dir.path(), "cache_headers");
    let wasm = std::fs::read(dir.path().join("cache_headers.wasm")).unwrap();
    let s = TestServer::try_start_in(dir, "[pool]\ninstances = 8\nmax_memory_mib = 64\n")
        .await
        .expect("start");
    let (status, v) = s
        .admin_call(
            Method::PUT,
            "/admin/v1/tenants/api",
            serde_json::json!({"paths": ["/api"], "cache": {"enabled": true}}).to_string(),
        )
        .await;
    assert!(status.is_success(), "{v}");
    let deploy = || s.admin_call(Method::PUT, "/admin/v1/tenants/api/module", wasm.clone());
    let (status, v) = deploy().await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let path = "/api/x?h=cache-control:max-age%3D60";
    let a = ask(&s, path, &[]).await;
    assert_eq!(run_of(&ask(&s, path, &[]).await), run_of(&a));
    let bytes = |m: &str| metric_value_or_zero(m, "tern_cache_stored_bytes{tenant=\"api\"}");
    assert!(bytes(&s.metrics().await) > 0.0);
    let (status, v) = deploy().await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let b = ask(&s, path, &[]).await;
    assert_ne!(run_of(&b), run_of(&a), "the new version's cache was empty");
    assert_eq!(b.header("cache-status"), "tern; fwd=uri-miss; stored");
    // Only the one entry the new version stored is counted.
    let m = s.metrics().await;
    let one = bytes(&m);
    let (status, _) = s
        .admin_call(
            Method::POST,
            "/admin/v1/tenants/api/cache/purge",
            serde_json::json!({"all": true}).to_string(),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while bytes(&s.metrics().await) != 0.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "was {one}: {}",
            s.metrics().await
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// `Range` on a stored answer: one byte range answered `206` from memory (also on the miss that
/// stores it: the guest answers whole), past the end `416`, several ranges or an `If-Range`
/// that does not match the whole answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranges_are_cut_from_the_stored_answer() {
    let s = server().await;
    let path = "/c/big?h=cache-control:max-age%3D60&h=etag:%22r1%22&n=1000";
    // The miss: stored whole, the client gets its range.
    let first = ask(&s, path, &[("range", "bytes=0-9")]).await;
    assert_eq!(
        first.status,
        StatusCode::PARTIAL_CONTENT,
        "{:?}",
        first.headers
    );
    assert_eq!(first.header("content-range"), "bytes 0-9/1000");
    assert_eq!(first.body.len(), 10);
    assert_eq!(first.header("cache-status"), "tern; fwd=uri-miss; stored");
    let whole = ask(&s, path, &[]).await;
    assert_eq!(whole.body.len(), 1000);
    assert_eq!(&whole.body[..10], &first.body[..]);
    for (range, from, to) in [
        ("bytes=990-", 990, 1000),
        ("bytes=-5", 995, 1000),
        ("bytes=100-199", 100, 200),
    ] {
        let r = ask(&s, path, &[("range", range)]).await;
        assert_eq!(r.status, StatusCode::PARTIAL_CONTENT, "{range}");
        assert_eq!(
            r.header("content-range"),
            format!("bytes {from}-{}/1000", to - 1)
        );
        assert_eq!(&r.body[..], &whole.body[from..to], "{range}");
        assert!(r.header("cache-status").starts_with("tern; hit"));
    }
    let past = ask(&s, path, &[("range", "bytes=1000-")]).await;
    assert_eq!(past.status, StatusCode::RANGE_NOT_SATISFIABLE);
    assert_eq!(past.header("content-range"), "bytes */1000");
    assert!(past.body.is_empty());
    for (name, value) in [("range", "bytes=0-1,5-6"), ("range", "lines=1-2")] {
        let r = ask(&s, path, &[(name, value)]).await;
        assert_eq!(r.status, StatusCode::OK, "{value}");
        assert_eq!(r.body, whole.body);
    }
    let r = ask(&s, path, &[("range", "bytes=0-9"), ("if-range", "\"r1\"")]).await;
    assert_eq!(r.status, StatusCode::PARTIAL_CONTENT);
    let r = ask(&s, path, &[("range", "bytes=0-9"), ("if-range", "\"old\"")]).await;
    assert_eq!(r.status, StatusCode::OK, "a changed answer is sent whole");
    assert_eq!(r.body, whole.body);
    assert_eq!(guest_runs(&s, "c").await, 1.0);
    // Over HTTP/2 too (its `:authority` is another host: a miss, then a hit).
    let mut h2 = H2Conn::open(s.addr()).await;
    let miss = h2.get_with(path, &[("range", "bytes=10-19")]).await;
    let hit = h2.get_with(path, &[("range", "bytes=10-19")]).await;
    for r in [&miss, &hit] {
        assert_eq!(r.status, StatusCode::PARTIAL_CONTENT);
        assert_eq!(r.header("content-range"), "bytes 10-19/1000");
    }
    assert_eq!(miss.body, hit.body);
    assert!(hit.header("cache-status").starts_with("tern; hit"));
    assert_eq!(guest_runs(&s, "c").await, 2.0);
}

/// The raw HTTP/1.1 answer to `GET path` (read until the server closes), for answers whose body
/// may be cut.
async fn raw_get(s: &TestServer, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(s.addr()).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    tcp.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        tcp.read_to_end(&mut out),
    )
    .await
    .expect("the server closes");
    String::from_utf8_lossy(&out).into_owned()
}

/// Answers streamed past the guest's buffer are stored once they have reached the client whole
/// (the client is not held back for it); one cut mid-body (the guest traps) or larger than
/// `max_object_kib` is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_answers_are_stored_once_they_end_whole() {
    let s = server().await;
    let path = "/c/large?h=cache-control:max-age%3D60&n=200000";
    let first = ask(&s, path, &[]).await;
    assert_eq!(first.body.len(), 200_000);
    assert_eq!(
        first.header("cache-status"),
        "tern; fwd=uri-miss; detail=store-at-end"
    );
    let hit = ask(&s, path, &[]).await;
    assert!(
        hit.header("cache-status").starts_with("tern; hit"),
        "{:?}",
        hit.headers
    );
    assert_eq!(hit.body, first.body, "byte for byte");
    assert_eq!(hit.header("content-length"), "200000");
    let part = ask(&s, path, &[("range", "bytes=150000-150009")]).await;
    assert_eq!(part.status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(&part.body[..], &first.body[150_000..150_010]);
    assert_eq!(guest_runs(&s, "c").await, 1.0);

    // Over max_object_kib (1 MiB): served, not stored.
    let huge = "/c/huge?h=cache-control:max-age%3D60&n=1100000";
    for _ in 0..2 {
        let r = ask(&s, huge, &[]).await;
        assert_eq!(r.body.len(), 1_100_000);
        assert!(r.header("cache-status").starts_with("tern; fwd=uri-miss"));
    }

    // Cut mid-body by a trap: the client sees it cut, and nothing is stored.
    let cut = "/c/cut?h=cache-control:max-age%3D60&trap_after=100000";
    for _ in 0..2 {
        let text = raw_get(&s, cut).await;
        assert!(
            text.starts_with("HTTP/1.1 200"),
            "{}",
            &text[..text.len().min(300)]
        );
        assert!(
            text.contains("cache-status: tern; fwd=uri-miss; detail=store-at-end"),
            "not a hit: {}",
            &text[..text.len().min(500)]
        );
        assert!(!text.ends_with("0\r\n\r\n"), "the body was cut, not ended");
    }
}

/// A thousand concurrent cold requests for one URL run its guest once; the others wait for its
/// answer and get it, byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_cold_requests_run_one_guest() {
    let s = server().await;
    // The first request's guest computes 400 ms (well within the tenant's 1 s timeout) while
    // the others arrive.
    let path = "/c/cold?h=cache-control:max-age%3D60&wait_ms=400";
    let addr = s.addr();
    let get = move || {
        tokio::spawn(async move { send(addr, Method::GET, path, None, &[], Bytes::new()).await })
    };
    let mut asks = vec![get()];
    leader_running(&s).await;
    asks.extend((1..1000).map(|_| get()));
    let mut replies = Vec::new();
    for a in asks {
        replies.push(a.await.unwrap());
    }
    let first = &replies[0];
    let mut collapsed = 0;
    for r in &replies {
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        assert_eq!(r.body, first.body, "one guest's answer");
        collapsed += usize::from(r.header("cache-status").ends_with("; collapsed"));
    }
    assert_eq!(
        guest_runs(&s, "c").await,
        1.0,
        "one guest run for 1,000 requests"
    );
    // Those that came while it ran waited for it; any that came after it was stored hit.
    eprintln!("{collapsed} of 1,000 cold requests waited for the one guest run");
    assert!(collapsed >= 1, "none waited");
    assert_eq!(metric(&s, "collapsed").await as usize, collapsed);
    assert_eq!(metric(&s, "hit").await as usize, 999 - collapsed);

    // The one filling fails (a 500 after 400 ms): one of those waiting fills it next, the rest
    // wait on and get its answer; the guest runs twice, not once per request.
    let path = "/c/retry?h=cache-control:max-age%3D60&wait_ms=400";
    no_guest_running(&s).await;
    let failing = tokio::spawn(async move {
        send(
            addr,
            Method::GET,
            path,
            None,
            &[("x-test-fail", "500")],
            Bytes::new(),
        )
        .await
    });
    leader_running(&s).await;
    let asks: Vec<_> = (0..50)
        .map(|_| {
            tokio::spawn(
                async move { send(addr, Method::GET, path, None, &[], Bytes::new()).await },
            )
        })
        .collect();
    assert_eq!(
        failing.await.unwrap().status,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    let mut bodies = std::collections::HashSet::new();
    for a in asks {
        let r = a.await.unwrap();
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        bodies.insert(r.body);
    }
    assert_eq!(bodies.len(), 1, "one answer for all who waited");
    assert_eq!(
        guest_runs(&s, "c").await,
        3.0,
        "the failed fill and one more"
    );
}

/// `ignore_query`, `sort_query` and `key_headers`: requests differing only in ignored or
/// reordered parameters share one answer; requests differing in a keyed header do not; the
/// guest gets the query as it was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_options_share_and_split_answers() {
    let dir = tempfile::tempdir().unwrap();
    test_guest(dir.path(), "cache_headers");
    let config = "[pool]\ninstances = 8\nmax_memory_mib = 64\n\
         [[tenant]]\nname = \"k\"\nmodule = \"cache_headers.wasm\"\npaths = [\"/k\"]\n\
         [tenant.cache]\nenabled = true\nignore_query = [\"utm_*\", \"fbclid\"]\n\
         sort_query = true\nkey_headers = [\"x-tier\"]\n";
    let s = TestServer::try_start_in(dir, config).await.expect("start");
    let h = "h=cache-control:max-age%3D60";
    let first = ask(&s, &format!("/k/p?a=1&{h}&utm_source=mail"), &[]).await;
    assert_eq!(first.header("cache-status"), "tern; fwd=uri-miss; stored");
    for same in [
        format!("/k/p?a=1&{h}"),
        format!("/k/p?utm_medium=x&a=1&{h}&fbclid=42"),
        format!("/k/p?{h}&a=1"),
    ] {
        let r = ask(&s, &same, &[]).await;
        assert_eq!(run_of(&r), run_of(&first), "{same}: {:?}", r.headers);
    }
    // A parameter that only starts like an ignored one, or another value, is another key.
    for other in [format!("/k/p?a=1&{h}&fbclidx=1"), format!("/k/p?a=2&{h}")] {
        let r = ask(&s, &other, &[]).await;
        assert_ne!(run_of(&r), run_of(&first), "{other}");
    }
    // A keyed header splits the answers without a `Vary` from the guest.
    let path = format!("/k/t?{h}");
    let gold = ask(&s, &path, &[("x-tier", "gold")]).await;
    let free = ask(&s, &path, &[("x-tier", "free")]).await;
    let none = ask(&s, &path, &[]).await;
    assert_ne!(run_of(&gold), run_of(&free));
    assert_ne!(run_of(&none), run_of(&gold));
    assert_eq!(
        run_of(&ask(&s, &path, &[("x-tier", "gold")]).await),
        run_of(&gold)
    );
    assert_eq!(run_of(&ask(&s, &path, &[]).await), run_of(&none));
    // A prefix purge names keys by their path, whatever the key holds after it.
    let (status, v) = s
        .admin_call(
            Method::POST,
            "/admin/v1/tenants/k/cache/purge",
            serde_json::json!({"prefixes": ["/k/t"]}).to_string(),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["purged"], 3, "{v}");
    assert_ne!(
        run_of(&ask(&s, &path, &[("x-tier", "gold")]).await),
        run_of(&gold)
    );

    // The options are checked, in the file and the API.
    let err = TestServer::try_start(
        "[[tenant]]\nname = \"t\"\nmodule = \"builtin:hello\"\n[tenant.cache]\nenabled = true\n\
         key_headers = [\"Cookie\"]\n",
    )
    .await
    .err()
    .expect("refused");
    assert!(format!("{err:#}").contains("cache.key_headers"), "{err:#}");
    let (status, v) = s
        .admin_call(
            Method::PUT,
            "/admin/v1/tenants/bad",
            serde_json::json!({"paths": ["/bad"], "cache": {"enabled": true, "ignore_query": ["a=b"]}})
                .to_string(),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert!(v.to_string().contains("cache.ignore_query"), "{v}");
}

/// The server's cache budget (`server.cache_max_mib`): each tenant's `cache.max_mib` is reserved
/// from it; a share that does not fit is refused at start and by the API, and a change that
/// does not grow a share is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_shares_are_reserved_from_the_servers_budget() {
    let tenant = |name: &str, mib: u32| {
        format!(
            "[[tenant]]\nname = \"{name}\"\nmodule = \"builtin:hello\"\npaths = [\"/{name}\"]\n\
             [tenant.cache]\nenabled = true\nmax_mib = {mib}\n"
        )
    };
    let over = format!(
        "[server]\ncache_max_mib = 100\n{}{}",
        tenant("a", 60),
        tenant("b", 41)
    );
    let err = TestServer::try_start(&over).await.err().expect("refused");
    let err = format!("{err:#}");
    assert!(
        err.contains("tenant \"b\"") && err.contains("101 MiB") && err.contains("cache_max_mib"),
        "{err}"
    );
    let fits = format!(
        "[server]\ncache_max_mib = 100\n{}{}",
        tenant("a", 60),
        tenant("b", 40)
    );
    TestServer::try_start(&fits)
        .await
        .expect("100 of 100 MiB fits");

    let s = TestServer::try_start(&format!(
        "[server]\ncache_max_mib = 100\n{}",
        tenant("a", 60)
    ))
    .await
    .expect("start");
    let s = &s;
    let put = |name: &'static str, mib: u64| async move {
        let spec = serde_json::json!({
            "paths": [format!("/{name}")],
            "cache": {"enabled": true, "max_mib": mib}
        });
        s.admin_call(
            Method::PUT,
            &format!("/admin/v1/tenants/{name}"),
            spec.to_string(),
        )
        .await
    };
    let (status, v) = put("x", 41).await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    assert!(
        v.to_string().contains("at most 40") && v.to_string().contains("cache_max_mib"),
        "{v}"
    );
    let (status, v) = put("x", 30).await;
    assert!(status.is_success(), "{v}");
    let (status, v) = put("y", 11).await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    assert!(v.to_string().contains("at most 10"), "{v}");
    // Growing x past what is left is refused; changing it otherwise, or shrinking it, is not.
    let (status, v) = put("x", 41).await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    let (status, v) = put("x", 40).await;
    assert!(status.is_success(), "{v}");
    let (status, v) = s
        .admin_call(
            Method::PATCH,
            "/admin/v1/tenants/x",
            serde_json::json!({"cache": {"enabled": false}}).to_string(),
        )
        .await;
    assert!(status.is_success(), "{v}");
    let (status, v) = put("y", 40).await;
    assert!(
        status.is_success(),
        "a disabled cache reserves nothing: {v}"
    );
}

/// A flood of unique URLs holds the tenant's cache within its share, and a URL asked often
/// through it is still answered from memory (TinyLFU admission resists the scan; `moka`
/// counts frequencies once the store is half full).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_unique_keys_stays_within_the_share_and_keeps_what_is_asked_often() {
    let dir = tempfile::tempdir().unwrap();
    test_guest(dir.path(), "cache_headers");
    let config = "[pool]\ninstances = 16\nmax_memory_mib = 64\n\
         [[tenant]]\nname = \"f\"\nmodule = \"cache_headers.wasm\"\npaths = [\"/f\"]\n\
         [tenant.cache]\nenabled = true\nmax_mib = 1\n\
         [[tenant]]\nname = \"o\"\nmodule = \"cache_headers.wasm\"\npaths = [\"/o\"]\n\
         [tenant.cache]\nenabled = true\nmax_mib = 1\n";
    let s = TestServer::try_start_in(dir, config).await.expect("start");
    let hot = "/f/hot?h=cache-control:max-age%3D600&n=8000";
    let other = "/o/kept?h=cache-control:max-age%3D600&n=8000";
    let hot_run = run_of(&ask(&s, hot, &[]).await);
    let other_run = run_of(&ask(&s, other, &[]).await);
    for _ in 0..30 {
        assert_eq!(run_of(&ask(&s, hot, &[]).await), hot_run);
    }
    // 1,000 unique 8 KB answers: 8 MB through a 1 MiB share.
    let addr = s.addr();
    for batch in 0..50 {
        let asks: Vec<_> = (0..20)
            .map(|i| {
                let path = format!("/f/scan{batch}-{i}?h=cache-control:max-age%3D600&n=8000");
                tokio::spawn(async move {
                    send(addr, Method::GET, &path, None, &[], Bytes::new()).await
                })
            })
            .collect();
        for a in asks {
            assert_eq!(a.await.unwrap().status, StatusCode::OK);
        }
        // The popular URL is asked on through the scan, as it would be.
        for _ in 0..3 {
            assert_eq!(
                run_of(&ask(&s, hot, &[]).await),
                hot_run,
                "the hot URL was evicted by batch {batch}"
            );
        }
    }
    assert_eq!(
        run_of(&ask(&s, hot, &[]).await),
        hot_run,
        "the hot URL stayed"
    );
    assert_eq!(
        run_of(&ask(&s, other, &[]).await),
        other_run,
        "another tenant's answers are not touched"
    );
    let gauge = |m: &str, t: &str| {
        metric_value_or_zero(m, &format!("tern_cache_stored_bytes{{tenant=\"{t}\"}}"))
    };
    // The store settles its accounts as it is used: a few reads let it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let m = s.metrics().await;
        let held = gauge(&m, "f");
        if held <= 1024.0 * 1024.0 {
            assert!(held > 0.0, "{m}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{held} bytes held past the 1 MiB share"
        );
        ask(&s, hot, &[]).await;
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let m = s.metrics().await;
    assert!(
        metric_value_or_zero(&m, "tern_cache_evictions_total{tenant=\"f\"}") > 0.0,
        "{m}"
    );
    assert_eq!(
        metric_value_or_zero(&m, "tern_cache_evictions_total{tenant=\"o\"}"),
        0.0
    );
}

/// Every guest kind's answers are cached by their headers: a `wasi:http` component and a CGI
/// program beside the Tern ABI guest of the other tests (stored, hit, a client's `304`, a
/// soft purge by tag revalidated with the guest's own `304`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn components_and_cgi_programs_are_cached_by_their_headers() {
    let dir = tempfile::tempdir().unwrap();
    crate::support::test_component(dir.path(), "component");
    test_guest(dir.path(), "cgi_probe");
    let config = "[pool]\ninstances = 8\nmax_memory_mib = 64\n\
         [[tenant]]\nname = \"comp\"\nmodule = \"component.wasm\"\npaths = [\"/comp\"]\n\
         [tenant.cache]\nenabled = true\n\
         [[tenant]]\nname = \"cgi\"\nmodule = \"cgi_probe.wasm\"\npaths = [\"/cgi\"]\n\
         [tenant.cache]\nenabled = true\n";
    let s = TestServer::try_start_in(dir, config).await.expect("start");
    for (tenant, path, etag, tag) in [
        ("comp", "/comp/cached", "\"w1\"", "component"),
        ("cgi", "/cgi/cached", "\"c1\"", "cgi"),
    ] {
        let first = ask(&s, path, &[]).await;
        assert_eq!(first.status, StatusCode::OK, "{tenant}: {}", first.text());
        assert_eq!(first.header("cache-status"), "tern; fwd=uri-miss; stored");
        assert_eq!(first.header("surrogate-key"), "", "tags are not sent on");
        let hit = ask(&s, path, &[]).await;
        assert!(
            hit.header("cache-status").starts_with("tern; hit"),
            "{tenant}"
        );
        assert_eq!(hit.body, first.body);
        let not_modified = ask(&s, path, &[("if-none-match", etag)]).await;
        assert_eq!(not_modified.status, StatusCode::NOT_MODIFIED, "{tenant}");
        assert!(not_modified.body.is_empty());
        assert_eq!(guest_runs(&s, tenant).await, 1.0, "{tenant}");

        let (status, v) = s
            .admin_call(
                Method::POST,
                &format!("/admin/v1/tenants/{tenant}/cache/purge"),
                serde_json::json!({"tags": [tag], "soft": true}).to_string(),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{v}");
        assert_eq!(v["purged"], 1, "{v}");
        let again = ask(&s, path, &[]).await;
        assert_eq!(again.status, StatusCode::OK);
        assert_eq!(
            again.header("cache-status"),
            "tern; fwd=stale; fwd-status=304; stored",
            "{tenant}"
        );
        assert_eq!(again.body, first.body, "{tenant}: the stored body, kept");
        assert_eq!(guest_runs(&s, tenant).await, 2.0, "{tenant}");
    }
}
