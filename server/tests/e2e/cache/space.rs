//! The cache's settings, purges, a new version's empty cache, and memory: each tenant's share of the server's budget and a flood of unique keys within it.

use super::*;

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
