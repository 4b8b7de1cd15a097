//! Concurrent misses of one key run one guest; the others wait for its answer.

use super::*;

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
