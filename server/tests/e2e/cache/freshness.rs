//! What is stored and for how long: fresh answers, what a shared cache must not keep, `CDN-Cache-Control`, validators, stale answers (while revalidating, on error, after a soft purge), ranges and streamed bodies.

use super::*;

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

/// The headers the edge sets on every hit (`Age`, `Cache-Status`, `x-request-id`,
/// `Server-Timing`) are one value each, its own, whatever the stored answer carried of them
/// (an origin's `Age` counts in it), and every other stored header keeps all its values in
/// order: on the store's answer and on a thread's own copy of it (the hits after the first),
/// over HTTP/1.1 and HTTP/2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hit_carries_each_header_the_edge_sets_once() {
    let s = server().await;
    let path = "/c/once?h=cache-control:max-age%3D600&h=age:100\
                &h=cache-status:origin%3B%20hit&h=x-request-id:from-origin\
                &h=server-timing:db%3Bdur%3D5&h=x-two:a&h=x-two:b";
    // HTTP/2 names the host in `:authority` (the address): HTTP/1.1 names the same host, so
    // that both ask for one key.
    let host = s.addr().to_string();
    let h1 = async |asked: &[(&str, &str)]| {
        send(
            s.addr(),
            Method::GET,
            path,
            Some(&host),
            asked,
            Bytes::new(),
        )
        .await
    };
    let first = h1(&[]).await;
    assert_eq!(first.header("cache-status"), "tern; fwd=uri-miss; stored");
    let all = |r: &Reply, name: &str| -> Vec<String> {
        (r.headers.get_all(name).iter())
            .map(|v| v.to_str().unwrap_or("?").to_string())
            .collect()
    };
    let mut h2 = H2Conn::open(s.addr()).await;
    for i in 0..8 {
        let id = format!("client-{i}");
        let asked = [("x-request-id", id.as_str())];
        let hit = if i % 2 == 0 {
            h1(&asked).await
        } else {
            h2.get_with(path, &asked).await
        };
        assert_eq!(hit.status, StatusCode::OK, "hit {i}");
        assert_eq!(hit.body, first.body, "hit {i}: the stored body");
        let age = all(&hit, "age");
        assert_eq!(age.len(), 1, "hit {i}: one Age: {:?}", hit.headers);
        let age: u64 = age[0].parse().expect("Age is whole seconds");
        assert!(
            (100..=160).contains(&age),
            "hit {i}: the origin's 100 s count: {age}"
        );
        let status = all(&hit, "cache-status");
        assert_eq!(status.len(), 1, "hit {i}: {:?}", hit.headers);
        let ttl = status[0]
            .strip_prefix("tern; hit; ttl=")
            .expect("the edge's status");
        assert!(ttl.parse::<u64>().is_ok_and(|t| t <= 500), "hit {i}: {ttl}");
        assert_eq!(
            all(&hit, "x-request-id"),
            [id],
            "hit {i}: the request's own id"
        );
        let timing = all(&hit, "server-timing");
        assert_eq!(timing.len(), 1, "hit {i}: {timing:?}");
        assert!(
            timing[0].contains("cache;dur=") && !timing[0].contains("db;dur"),
            "hit {i}: the edge's own timing: {timing:?}"
        );
        assert_eq!(all(&hit, "x-two"), ["a", "b"], "hit {i}");
        assert_eq!(all(&hit, "content-type"), ["text/plain"], "hit {i}");
    }
    assert_eq!(guest_runs(&s, "c").await, 1.0, "no guest ran for a hit");
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
