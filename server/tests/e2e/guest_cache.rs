//! The guest cache API: a guest keeps entries of its own in its tenant's cache (Rust SDK, C and
//! a component), varied by request headers, fresh then stale, purged by tag and with the rest
//! of the cache, within its budget, never seen by another tenant; a transactional lookup makes
//! one request insert while the others wait, and a guest that traps with its turn releases
//! them.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, StatusCode};

use crate::support::{
    Reply, TestServer, c_program, metric_value, metric_value_or_zero, send, test_component,
    test_guest,
};

/// The cache probe at `/` for tenant `app` (and the same guest for `neighbour` at `/neighbour`), with
/// the cache settings `cache` and more TOML `extra`.
async fn probe(cache: &str, extra: &str) -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    test_guest(dir.path(), "cache_probe");
    let config = format!(
        "[pool]\ninstances = 48\n\
         [[tenant]]\nname = \"app\"\nmodule = \"cache_probe.wasm\"\n\
         [tenant.limits]\nmax_concurrency = 40\n\
         [tenant.cache]\nenabled = true\nfront = false\n{cache}\n{extra}\n\
         [[tenant]]\nname = \"neighbour\"\nmodule = \"cache_probe.wasm\"\npaths = [\"/neighbour\"]\n\
         [tenant.cache]\nenabled = true\nfront = false\n"
    );
    TestServer::try_start_in(dir, &config).await.expect("start")
}

async fn ask(s: &TestServer, path: &str, headers: &[(&str, &str)]) -> String {
    let r = send(s.addr(), Method::GET, path, None, headers, Bytes::new()).await;
    assert_eq!(r.status, StatusCode::OK, "{path}: {}", r.text());
    r.text()
}

/// `GET path` on a new connection, in a task of its own.
fn spawn_get(addr: SocketAddr, path: &str) -> tokio::task::JoinHandle<Reply> {
    let path = path.to_string();
    tokio::spawn(async move { send(addr, Method::GET, &path, None, &[], Bytes::new()).await })
}

fn series(tenant: &str, result: &str) -> String {
    format!("tern_guest_cache_requests_total{{result=\"{result}\",tenant=\"{tenant}\"}}")
}

/// Lookups find what was inserted, by key and by the request headers it varies on, until a
/// purge by its tag (the guest's or the admin API's), never in another tenant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_are_kept_varied_and_purged_and_stay_the_tenants() {
    let s = probe("", "").await;
    assert!(
        ask(&s, "/?op=lookup&key=a", &[])
            .await
            .starts_with("found=0 ")
    );
    let set = ask(&s, "/?op=set&key=a&value=hello&tags=t1,both", &[]).await;
    assert_eq!(set, "found=1 stale=0 must=0 age=0 body=hello");
    assert_eq!(
        ask(&s, "/?op=lookup&key=a", &[]).await,
        "found=1 stale=0 must=0 age=0 body=hello"
    );
    // Another tenant's same key is its own.
    assert!(
        ask(&s, "/neighbour?op=lookup&key=a", &[])
            .await
            .starts_with("found=0 ")
    );

    // Variants by `accept-language`; a header not named makes none.
    let fr = [("accept-language", "fr"), ("x-noise", "1")];
    let set = ask(&s, "/?op=set&key=m&value=bonjour&vary=accept-language", &fr).await;
    assert!(set.ends_with("body=bonjour"), "{set}");
    let de = [("accept-language", "de"), ("x-noise", "2")];
    assert!(
        ask(&s, "/?op=lookup&key=m", &de)
            .await
            .starts_with("found=0 ")
    );
    assert!(
        ask(&s, "/?op=lookup&key=m", &[])
            .await
            .starts_with("found=0 ")
    );
    ask(
        &s,
        "/?op=set&key=m&value=hallo&vary=accept-language&tags=both",
        &de,
    )
    .await;
    let fr_other = [("accept-language", "fr"), ("x-noise", "3")];
    assert!(
        ask(&s, "/?op=lookup&key=m", &fr_other)
            .await
            .ends_with("body=bonjour")
    );
    assert!(
        ask(&s, "/?op=lookup&key=m", &de)
            .await
            .ends_with("body=hallo")
    );
    // A client's `Cache-Control` does not steer a guest's entries.
    let no_cache = [("accept-language", "fr"), ("cache-control", "no-cache")];
    assert!(
        ask(&s, "/?op=lookup&key=m", &no_cache)
            .await
            .ends_with("body=bonjour")
    );

    // The guest purges a tag: the two keys tagged `both` (the one variant of `m` tagged
    // drops its key), not the other tenant's.
    ask(&s, "/neighbour?op=set&key=a&value=theirs&tags=both", &[]).await;
    assert_eq!(ask(&s, "/?op=purge&tag=both", &[]).await, "purged=2");
    assert!(
        ask(&s, "/?op=lookup&key=a", &[])
            .await
            .starts_with("found=0 ")
    );
    assert!(
        ask(&s, "/neighbour?op=lookup&key=a", &[])
            .await
            .ends_with("body=theirs")
    );

    // The admin API's purges reach them too (by tag, and everything); a purge by path prefix
    // does not name them.
    ask(&s, "/?op=set&key=b&value=kept&tags=admin", &[]).await;
    let purge = |body: &'static str| {
        let s = &s;
        async move {
            let (status, v) = s
                .admin_call(Method::POST, "/admin/v1/tenants/app/cache/purge", body)
                .await;
            assert_eq!(status, StatusCode::OK, "{v}");
            v["purged"].as_u64().unwrap()
        }
    };
    assert_eq!(purge(r#"{"prefixes": ["/"]}"#).await, 0);
    assert_eq!(purge(r#"{"tags": ["admin"]}"#).await, 1);
    assert!(
        ask(&s, "/?op=lookup&key=b", &[])
            .await
            .starts_with("found=0 ")
    );
    ask(&s, "/?op=set&key=c&value=x", &[]).await;
    assert_eq!(purge(r#"{"all": true}"#).await, 1);

    let m = s.metrics().await;
    assert!(metric_value(&m, &series("app", "hit")) >= 4.0);
    assert!(metric_value(&m, &series("app", "miss")) >= 5.0);
    assert_eq!(
        metric_value(&m, "tern_cache_purges_total{from=\"guest\"}"),
        1.0
    );
    // Only the results a guest's lookup can have.
    for never in ["bypass", "revalidated"] {
        assert!(!m.contains(&series("app", never)), "{never}");
    }
}

/// Keys, options and tags outside their limits are refused with the reason; a tenant without
/// a cache is told so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_with_the_reason() {
    let s = probe("", "").await;
    use tern::cache::guest::{MAX_KEY_BYTES, MAX_STALE, MAX_TAG_LEN, MAX_TAGS, MAX_TTL, MAX_VARY};
    let tag = "t".repeat(MAX_TAG_LEN);
    let tags = |n: usize| {
        (0..n)
            .map(|i| format!("t{i}"))
            .collect::<Vec<_>>()
            .join(",")
    };
    let vary = |n: usize| {
        (0..n)
            .map(|i| format!("x-v{i}"))
            .collect::<Vec<_>>()
            .join(",")
    };
    // Each limit (the implementation's own constant) at, and one past: what the answer starts
    // with, or the reason it is refused.
    let cases: [(String, Result<&str, String>); 18] = [
        (
            format!("/?op=set&size={MAX_KEY_BYTES}&value=k"),
            Ok("found=1"),
        ),
        (
            format!("/?op=lookup&size={}", MAX_KEY_BYTES + 1),
            Err(format!("1 to {MAX_KEY_BYTES} bytes")),
        ),
        ("/?op=lookup&key=".into(), Err("not 0".into())),
        (format!("/?op=set&key=t&ttl={MAX_TTL}"), Ok("found=1")),
        (
            format!("/?op=set&key=t&ttl={}", MAX_TTL + 1),
            Err("max-age".into()),
        ),
        ("/?op=set&key=t&ttl=0".into(), Err("max-age".into())),
        (format!("/?op=set&key=t&swr={MAX_STALE}"), Ok("found=1")),
        (
            format!("/?op=set&key=t&swr={}", MAX_STALE + 1),
            Err("stale-while-revalidate".into()),
        ),
        (format!("/?op=set&key=t&tags={tag}"), Ok("found=1")),
        (
            format!("/?op=set&key=t&tags={tag}t"),
            Err("a tag is".into()),
        ),
        (
            format!("/?op=set&key=t&tags={}", tags(MAX_TAGS)),
            Ok("found=1"),
        ),
        (
            format!("/?op=set&key=t&tags={}", tags(MAX_TAGS + 1)),
            Err(format!("at most {MAX_TAGS} tags")),
        ),
        (
            format!("/?op=set&key=t&vary={}", vary(MAX_VARY)),
            Ok("found=1"),
        ),
        (
            format!("/?op=set&key=t&vary={}", vary(MAX_VARY + 1)),
            Err(format!("at most {MAX_VARY} vary headers")),
        ),
        (
            "/?op=set&key=t&vary=bad%20name:".into(),
            Err("not a header name".into()),
        ),
        (
            "/?op=set&key=t&vary=range".into(),
            Err("steers caches".into()),
        ),
        ("/?op=purge&tag=".into(), Err("a tag is".into())),
        (
            format!("/?op=lookup&size={MAX_KEY_BYTES}"),
            Ok("found=1 stale=0 must=0 age=0 body=k"),
        ),
    ];
    for (path, expected) in cases {
        let r = send(s.addr(), Method::GET, &path, None, &[], Bytes::new()).await;
        let text = r.text();
        match expected {
            Ok(start) => {
                assert_eq!(r.status, StatusCode::OK, "{path}: {text}");
                assert!(text.starts_with(start), "{path}: {text}");
            }
            Err(words) => {
                assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "{path}");
                assert!(
                    text.contains("INVALID_ARGUMENT") && text.contains(words.as_str()),
                    "{path}: {text}"
                );
            }
        }
    }

    // Without a cache: UNAVAILABLE, saying why.
    let dir = tempfile::tempdir().unwrap();
    test_guest(dir.path(), "cache_probe");
    let bare = "[[tenant]]\nname = \"bare\"\nmodule = \"cache_probe.wasm\"\n";
    let s = TestServer::try_start_in(dir, bare).await.expect("start");
    let r = s.get("/?op=lookup&key=a").await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(r.text().contains("UNAVAILABLE"), "{}", r.text());
    assert!(r.text().contains("has no cache"), "{}", r.text());
}

/// 20 requests asking at once for a missing entry: one inserts it, the others wait and find
/// what it inserted. A guest that traps (or gives up) with its turn to insert releases the
/// requests waiting for it: the next one inserts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_request_inserts_while_the_others_wait_and_a_trap_releases_them() {
    let s = probe("", "").await;
    let addr = s.addr();
    let asks: Vec<_> = (0..20)
        .map(|_| spawn_get(addr, "/?key=x&spin=300"))
        .collect();
    let mut bodies = Vec::new();
    for ask in asks {
        let r = ask.await.unwrap();
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        bodies.push(r.text().split("body=").nth(1).unwrap().to_string());
    }
    assert!(bodies[0].starts_with("made by "), "{}", bodies[0]);
    assert!(
        bodies.iter().all(|b| *b == bodies[0]),
        "one insert: {bodies:?}"
    );
    let m = s.metrics().await;
    assert_eq!(metric_value(&m, &series("app", "miss")), 1.0);
    assert_eq!(
        metric_value_or_zero(&m, &series("app", "hit"))
            + metric_value_or_zero(&m, &series("app", "collapsed")),
        19.0
    );

    // The first request traps with its turn; those waiting go on well before the 30 s a
    // waiter gives up after, and one of them inserts.
    for (key, how) in [("y", "trap=1"), ("z", "close=1")] {
        // The first request has its turn (its lookup counted a miss) before the others ask.
        let misses = metric_value_or_zero(&s.metrics().await, &series("app", "miss"));
        let first = spawn_get(addr, &format!("/?key={key}&spin=500&{how}"));
        s.wait_metric(&series("app", "miss"), misses + 1.0).await;
        let started = Instant::now();
        let waiters: Vec<_> = (0..5)
            .map(|_| spawn_get(addr, &format!("/?key={key}")))
            .collect();
        let first = first.await.unwrap();
        match how {
            "trap=1" => assert_eq!(first.status, StatusCode::INTERNAL_SERVER_ERROR),
            _ => assert_eq!(first.text(), "closed"),
        }
        let mut bodies = Vec::new();
        for w in waiters {
            let r = w.await.unwrap();
            assert_eq!(r.status, StatusCode::OK, "{}", r.text());
            assert!(r.text().starts_with("found=1 "), "{}", r.text());
            bodies.push(r.text());
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the waiters were held: {:?}",
            started.elapsed()
        );
        let inserted = bodies[0].split("body=").nth(1).unwrap().to_string();
        assert!(bodies.iter().all(|b| b.ends_with(&inserted)), "{bodies:?}");
    }
}

/// An entry is fresh for its max-age, then found stale within its stale-while-revalidate (one
/// transactional lookup inserting it anew), then gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_go_stale_then_are_renewed_or_gone() {
    let s = probe("", "").await;
    let before_set = Instant::now();
    ask(&s, "/?op=set&key=s&value=old&ttl=1&swr=2", &[]).await;
    let after_set = Instant::now();
    ask(&s, "/?op=set&key=g&value=brief&ttl=1", &[]).await;
    assert!(
        ask(&s, "/?op=lookup&key=s", &[])
            .await
            .starts_with("found=1 stale=0")
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        ask(&s, "/?op=lookup&key=g", &[])
            .await
            .starts_with("found=0 ")
    );
    let before_lookup = Instant::now();
    let stale = ask(&s, "/?op=lookup&key=s", &[]).await;
    // Its age in whole seconds, as measured from here: between the shortest and the longest
    // time that can have passed between the insert and the lookup.
    let (least, most) = (
        before_lookup.duration_since(after_set).as_secs(),
        Instant::now().duration_since(before_set).as_secs(),
    );
    let age: u64 = stale
        .strip_prefix("found=1 stale=1 must=0 age=")
        .and_then(|rest| rest.split(' ').next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("not found stale: {stale}"));
    assert!(
        (least..=most).contains(&age),
        "age {age}, not {least}-{most}: {stale}"
    );
    assert!(stale.ends_with(" body=old"), "{stale}");
    // A transactional lookup gets the turn to insert it anew, then it is fresh.
    let renewed = ask(&s, "/?key=s&value=new&ttl=60", &[]).await;
    assert_eq!(renewed, "found=1 stale=0 must=0 age=0 body=new");
    assert_eq!(
        ask(&s, "/?op=lookup&key=s", &[]).await,
        "found=1 stale=0 must=0 age=0 body=new"
    );
    let m = s.metrics().await;
    assert!(metric_value(&m, &series("app", "stale")) >= 2.0);
}

/// Entries count against the tenant's cache budget: one over `max_object_kib` is refused
/// (one byte under and at it are kept), and past `max_mib` older ones are evicted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_live_within_the_cache_budget() {
    let s = probe("max_object_kib = 64\nmax_mib = 1", "").await;
    for n in [65_535, 65_536] {
        let r = ask(&s, &format!("/?op=set&key=o{n}&bytes={n}"), &[]).await;
        assert!(r.starts_with("found=1 "), "{n}: {}", &r[..40]);
    }
    let r = send(
        s.addr(),
        Method::GET,
        "/?op=set&key=o&bytes=65537",
        None,
        &[],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(r.text().contains("LIMIT_EXCEEDED"), "{}", r.text());
    assert!(r.text().contains("max_object_kib (64 KiB)"), "{}", r.text());
    assert!(
        ask(&s, "/?op=lookup&key=o", &[])
            .await
            .starts_with("found=0 ")
    );
    // 40 entries of 60 KiB in a 1 MiB cache.
    for i in 0..40 {
        ask(&s, &format!("/?op=set&key=e{i}&bytes=61440"), &[]).await;
    }
    let (mut evicted, mut stored) = (0.0, f64::MAX);
    for _ in 0..50 {
        let m = s.metrics().await;
        evicted = metric_value(&m, "tern_cache_evictions_total{tenant=\"app\"}");
        stored = metric_value(&m, "tern_cache_stored_bytes{tenant=\"app\"}");
        if evicted > 0.0 && stored <= 1024.0 * 1024.0 {
            break;
        }
        // (A full store evicts as it is written to; a lookup gives it the chance.)
        ask(&s, "/?op=lookup&key=e0", &[]).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(evicted > 0.0, "entries past max_mib were evicted");
    assert!(stored <= 1024.0 * 1024.0, "{stored}");
}

/// The C example keeps its rendered page: rendered once, then found, by `Accept-Language`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_c_example_renders_once_and_finds_it_after() {
    let dir = tempfile::tempdir().unwrap();
    c_program(dir.path(), "guest-sdk/examples/c/cache.c", "cache-c");
    let config = "[[tenant]]\nname = \"c\"\nmodule = \"cache-c.wasm\"\n\
                  [tenant.cache]\nenabled = true\nfront = false\n";
    let s = TestServer::try_start_in(dir, config).await.expect("start");
    let how = |r: &crate::support::Reply| r.header("x-cache").to_string();
    let fr = [("accept-language", "fr")];
    let r = send(s.addr(), Method::GET, "/menu", None, &fr, Bytes::new()).await;
    assert_eq!(
        (r.status, how(&r)),
        (StatusCode::OK, "rendered".into()),
        "{}",
        r.text()
    );
    assert_eq!(r.text(), "page /menu, rendered once\n");
    for _ in 0..3 {
        let r = send(s.addr(), Method::GET, "/menu", None, &fr, Bytes::new()).await;
        assert_eq!(how(&r), "found");
        assert_eq!(r.text(), "page /menu, rendered once\n");
    }
    let de = [("accept-language", "de")];
    let r = send(s.addr(), Method::GET, "/menu", None, &de, Bytes::new()).await;
    assert_eq!(how(&r), "rendered", "another variant");
}

/// A component keeps entries through `tern:cache`: inserted on its turn, found after, by its
/// request's `accept-language`, purged by tag; a trap with its turn releases the next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn components_keep_entries_through_tern_cache() {
    let dir = tempfile::tempdir().unwrap();
    test_component(dir.path(), "component");
    let config = "[[tenant]]\nname = \"c\"\nmodule = \"component.wasm\"\n\
                  [tenant.cache]\nenabled = true\nfront = false\n";
    let s = TestServer::try_start_in(dir, config).await.expect("start");
    let fr = [("accept-language", "fr")];
    let first = ask(&s, "/cache?key=k&value=v1&tag=mine", &fr).await;
    assert_eq!(first, "found=0 must=1 body=v1");
    assert_eq!(
        ask(&s, "/cache?key=k&value=v2", &fr).await,
        "found=1 must=0 body=v1"
    );
    let de = [("accept-language", "de")];
    assert_eq!(
        ask(&s, "/cache?key=k&value=v3", &de).await,
        "found=0 must=1 body=v3"
    );
    assert_eq!(ask(&s, "/cache?purge=mine", &[]).await, "purged=1");
    let r = send(
        s.addr(),
        Method::GET,
        "/cache?key=t&trap=1",
        None,
        &[],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        ask(&s, "/cache?key=t&value=after", &[]).await,
        "found=0 must=1 body=after"
    );
    // A tenant without a cache is told so.
    let dir = tempfile::tempdir().unwrap();
    test_component(dir.path(), "component");
    let bare = "[[tenant]]\nname = \"bare\"\nmodule = \"component.wasm\"\n";
    let s = TestServer::try_start_in(dir, bare).await.expect("start");
    let text = ask(&s, "/cache?key=k", &[]).await;
    assert!(
        text.contains("Unsupported(") && text.contains("has no cache"),
        "{text}"
    );
}
