//! What an answer is kept apart by: tenant, host, credentials, `Vary`, the key options; headers that must not steer it (unkeyed, a trusted proxy's forwarding headers); every guest kind's headers.

use super::*;

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
