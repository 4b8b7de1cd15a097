//! What a fleet shares besides modules: certificates (uploaded or from ACME), cache purges,
//! variables, and WebSocket publishes.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_uploaded_or_obtained_by_acme_on_one_replica_are_served_by_every_replica() {
    let mut s3 = S3::start();
    let root = tempfile::tempdir().unwrap();
    // b first, on a port of its own choosing (a port picked free beforehand may be taken by
    // another test's connection before b binds it). Only a orders (b has no [tls.acme]), and
    // Pebble validates TLS-ALPN-01 on b's port, so b can answer only from what a put in the
    // registry.
    let b = replica_with(
        &s3,
        "b",
        &root.path().join("b"),
        "[server]\ntls_listen = \"127.0.0.1:0\"\n",
        100,
    );
    let b_tls = b.tls.clone().expect("b serves HTTPS");
    let b_port = addr(&b_tls).port();
    let pebble = crate::acme::Pebble::start(crate::support::free_port(), b_port, 3600);
    let acme = format!(
        "[tls.acme]\ndirectory = \"{}\"\nca_root = {:?}\nhosts = [\"a.test\"]\n\
         contact = [\"mailto:ops@a.test\"]\ncheck_interval_seconds = 1\nretry_seconds = 1\n",
        pebble.directory,
        pebble.api_ca().display().to_string()
    );
    let a = replica_with(
        &s3,
        "a",
        &root.path().join("a"),
        &format!("[server]\ntls_listen = \"127.0.0.1:0\"\n{acme}"),
        100,
    );
    let a_tls = a.tls.clone().expect("a serves HTTPS");

    // Uploaded on a, served by b; its key is in the bucket only encrypted.
    let (cert, key) = self_signed("up.test");
    let body = serde_json::json!({"hosts": ["up.test"], "cert": cert, "key": key}).to_string();
    let (status, reply) = admin(
        &a,
        http::Method::PUT,
        "/admin/v1/certificates/up",
        body.clone(),
    )
    .await;
    assert_eq!(status, 201, "{reply}");
    let leaf = {
        use rustls::pki_types::pem::PemObject;
        rustls::pki_types::CertificateDer::from_pem_slice(cert.as_bytes()).unwrap()
    };
    presents(&b_tls, "up.test", |c| c == Some(&leaf)).await;
    let objects = walk(s3.root.path());
    let sealed: Vec<&String> = objects.iter().filter(|o| o.ends_with(".sealed")).collect();
    assert!(!sealed.is_empty(), "no sealed bundle in {objects:?}");
    for o in &sealed {
        let bytes = std::fs::read(o).unwrap();
        assert!(
            !bytes.windows(11).any(|w| w == b"PRIVATE KEY")
                && !bytes.windows(5).any(|w| w == b"BEGIN"),
            "{o} holds readable PEM"
        );
    }
    assert!(
        objects
            .iter()
            .any(|o| o.ends_with("registry/certificates/index.json")),
        "{objects:?}"
    );

    // Obtained by a, validated through b, served by both to a client trusting only Pebble.
    let pebble_root = pebble.root();
    for tls in [&a_tls, &b_tls] {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !crate::acme::trusted(addr(tls), "a.test", &pebble_root).await {
            assert!(
                Instant::now() < deadline,
                "{tls} serves no certificate from Pebble for a.test within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let reply = crate::acme::get_verified(addr(&b_tls), "a.test", &pebble_root).await;
    assert!(reply.starts_with("HTTP/1.1 "), "{reply}");
    let (_, listed) = admin(&b, http::Method::GET, "/admin/v1/certificates", "").await;
    let names: Vec<&str> = listed["certificates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"up") && names.contains(&"a.test"),
        "{listed}"
    );

    // Deleted on b: a stops serving it.
    let (status, reply) = admin(&b, http::Method::DELETE, "/admin/v1/certificates/up", "").await;
    assert_eq!(status, 200, "{reply}");
    presents(&a_tls, "up.test", |c| c != Some(&leaf)).await;

    // The registry down: a change is 503 naming it, and nothing changes; the replicas keep
    // serving what they have.
    s3.stop();
    let (status, reply) = admin(&a, http::Method::PUT, "/admin/v1/certificates/up", body).await;
    assert_eq!(status, 503, "{reply}");
    assert!(reply.to_string().contains(REGISTRY), "{reply}");
    assert!(crate::acme::trusted(addr(&b_tls), "a.test", &pebble_root).await);
    presents(&a_tls, "up.test", |c| c != Some(&leaf)).await;
}

/// A purge asked of any replica reaches every replica: at once through the nudge (polls here
/// are a minute apart), and at the next poll for a replica the nudge cannot reach.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_on_any_replica_reaches_every_replica() {
    let s3 = S3::start();
    let root = tempfile::tempdir().unwrap();
    let wasm = std::fs::read(crate::support::test_guest(root.path(), "cache_headers")).unwrap();
    let a = replica_with(&s3, "a", &root.path().join("a"), "", 60_000);
    let b = replica_with(&s3, "b", &root.path().join("b"), "", 60_000);
    knows_peers(&a, 1.0).await;
    knows_peers(&b, 1.0).await;
    let spec = serde_json::json!({"paths": ["/site"], "cache": {"enabled": true}}).to_string();
    let (status, v) = admin(&a, http::Method::PUT, "/admin/v1/tenants/site", spec).await;
    assert!(status.is_success(), "{v}");
    let (status, v) = deploy(addr(&a.admin), "site", &wasm).await;
    assert_eq!(status, http::StatusCode::OK, "{v}");
    serves(&b, "/site/x", "run ").await;

    let mut took = Vec::new();
    for i in 0..20 {
        let path = format!("/site/p{i}?h=cache-control:max-age%3D600&h=cache-tag:p{i}");
        get(&b, &path).await;
        let hit = get(&b, &path).await;
        assert!(
            hit.header("cache-status").starts_with("tern; hit"),
            "{:?}",
            hit.headers
        );
        let started = Instant::now();
        let body = if i % 2 == 0 {
            serde_json::json!({"prefixes": [format!("/site/p{i}")]})
        } else {
            serde_json::json!({"tags": [format!("p{i}")]})
        };
        let (status, v) = admin(
            &a,
            http::Method::POST,
            "/admin/v1/tenants/site/cache/purge",
            body.to_string(),
        )
        .await;
        assert_eq!(status, http::StatusCode::OK, "{v}");
        assert_eq!(
            v["replicas"], "every replica (through the shared registry)",
            "{v}"
        );
        took.push(no_longer_cached(&b, &path, started).await);
    }
    took.sort();
    eprintln!(
        "a purge on replica a, until replica b no longer serves the entry, over {} purges: p50 \
         {:?}, max {:?}",
        took.len(),
        took[took.len() / 2],
        took[took.len() - 1]
    );
    let applied = crate::support::metric_value(
        &metrics(&b).await,
        "tern_cache_purges_total{from=\"fleet\"}",
    );
    assert!(applied >= 20.0, "{applied}");

    // A replica the nudges cannot reach (its advertised URL is dead) applies purges at its
    // next poll; a purge asked of it reaches the others.
    let c = crate::support::TernProcess::serve_with(
        &[
            "--config",
            &{
                let dir = root.path().join("c");
                std::fs::create_dir_all(&dir).unwrap();
                let config = dir.join("tern.toml");
                std::fs::write(
                    &config,
                    "[pool]\ninstances = 16\nmax_memory_mib = 64\n[registry]\npoll_interval_ms = 300\n",
                )
                .unwrap();
                config.display().to_string()
            },
            "--registry",
            REGISTRY,
        ],
        &root.path().join("c"),
        |cmd| {
            s3.env(cmd);
            cmd.env("TERN_ADMIN_TOKEN", FLEET_TOKEN)
                .env("TERN_REPLICA", "c")
                .env("TERN_ADVERTISE_URL", "http://127.0.0.1:9");
        },
    );
    serves(&c, "/site/x", "run ").await;
    let path = "/site/late?h=cache-control:max-age%3D600";
    get(&c, path).await;
    assert!(
        get(&c, path)
            .await
            .header("cache-status")
            .starts_with("tern; hit")
    );
    let started = Instant::now();
    let (status, v) = admin(
        &b,
        http::Method::POST,
        "/admin/v1/tenants/site/cache/purge",
        r#"{"prefixes": ["/site/late"]}"#,
    )
    .await;
    assert_eq!(status, http::StatusCode::OK, "{v}");
    let polled = no_longer_cached(&c, path, started).await;
    eprintln!(
        "a purge reached the replica that missed its nudge in {polled:?} (polls every 300 ms)"
    );
    // Asked of c, a purge reaches a and b.
    get(&a, path).await;
    assert!(
        get(&a, path)
            .await
            .header("cache-status")
            .starts_with("tern; hit")
    );
    let started = Instant::now();
    let (status, v) = admin(
        &c,
        http::Method::POST,
        "/admin/v1/tenants/site/cache/purge",
        r#"{"all": true}"#,
    )
    .await;
    assert_eq!(status, http::StatusCode::OK, "{v}");
    no_longer_cached(&a, path, started).await;
}

/// Variables set on one replica are read by the guests of every replica without a deploy; a
/// secret is sealed in the bucket and the data directories (a grep of versitygw's root finds
/// no clear text), in no replica's log; a replica without the fleet's secrets key serves,
/// sets no secret and reads none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn variables_set_on_one_replica_reach_every_replica_and_no_secret_is_in_clear_text() {
    const SECRET: &str = "sk-live-FLEETSECRET-777";
    let s3 = S3::start();
    let root = tempfile::tempdir().unwrap();
    let key = root.path().join("secrets-key");
    std::fs::write(&key, "ab".repeat(32)).unwrap();
    let keyed = format!("[server]\nsecrets_key_file = \"{}\"\n", key.display());
    let a = replica_with(&s3, "a", &root.path().join("a"), &keyed, 100);
    let b = replica_with(&s3, "b", &root.path().join("b"), &keyed, 100);
    let c = replica(&s3, "c", &root.path().join("c"));
    let wasm = std::fs::read(crate::support::spin_module(root.path(), 5, "spin5")).unwrap();
    create(addr(&a.admin), "spin", "/spin").await;
    let (status, v) = deploy(addr(&a.admin), "spin", &wasm).await;
    assert_eq!(status, http::StatusCode::OK, "{v}");
    serves(&b, "/spin/hello", "hello from").await;
    serves(&c, "/spin/hello", "hello from").await;

    let set = |r: &crate::support::TernProcess, name: &str, value: &str, secret: bool| {
        let body = serde_json::json!({"value": value, "secret": secret}).to_string();
        let path = format!("/admin/v1/tenants/spin/variables/{name}");
        let at = addr(&r.admin);
        async move {
            crate::support::admin_request(at, FLEET_TOKEN, http::Method::PUT, &path, body.into())
                .await
        }
    };
    let (status, v) = set(&a, "api_key", SECRET, true).await;
    assert_eq!(status, http::StatusCode::OK, "{v}");
    let (status, v) = set(&a, "region", "eu-west", false).await;
    assert_eq!(status, http::StatusCode::OK, "{v}");
    let took = serves(&b, "/spin/var/api_key", SECRET).await;
    eprintln!("a secret set on replica a was read on replica b after {took:?}");
    serves(&b, "/spin/config/region", "eu-west").await;
    // Changed on b: a reads the new value.
    let (status, v) = set(&b, "region", "us-east", false).await;
    assert_eq!(status, http::StatusCode::OK, "{v}");
    serves(&a, "/spin/var/region", "us-east").await;

    // The replica without the key serves, and says why it neither sets nor reads secrets.
    let (status, v) = set(&c, "other", "x", true).await;
    assert_eq!(status, http::StatusCode::CONFLICT, "{v}");
    assert!(v.to_string().contains("TERN_SECRETS_KEY"), "{v}");
    let r = get(&c, "/spin/var/api_key").await;
    assert_eq!(
        r.status,
        http::StatusCode::INTERNAL_SERVER_ERROR,
        "{}",
        r.text()
    );
    assert!(r.text().contains("no secrets key"), "{}", r.text());

    // No clear text in the bucket, the data directories or the logs.
    let holding: Vec<String> = walk(s3.root.path())
        .into_iter()
        .chain(walk(root.path()))
        .filter(|f| {
            std::fs::read(f).is_ok_and(|b| b.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()))
        })
        .collect();
    assert!(holding.is_empty(), "clear text in {holding:?}");
    let records = walk(s3.root.path());
    assert!(!records.is_empty());
    for r in [&a, &b, &c] {
        let log = all_logged(r);
        assert!(!log.contains(SECRET), "{log}");
        assert!(!log.is_empty());
    }
}

/// A message published on any replica (by a guest in an events batch or in an ordinary request,
/// or by the admin API) reaches the events-mode WebSocket connections subscribed to its
/// channel on every replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_publish_on_any_replica_reaches_subscribers_on_every_replica() {
    use crate::websocket_events::{talk, talk_all};
    let s3 = S3::start();
    let root = tempfile::tempdir().unwrap();
    let wasm = std::fs::read(crate::support::test_guest(root.path(), "ws_events")).unwrap();
    let a = replica_with(&s3, "a", &root.path().join("a"), "", 60_000);
    let b = replica_with(&s3, "b", &root.path().join("b"), "", 60_000);
    knows_peers(&a, 1.0).await;
    knows_peers(&b, 1.0).await;
    let spec = serde_json::json!({"paths": ["/chat"], "websocket": {"mode": "events"}});
    let (status, v) = admin(
        &a,
        http::Method::PUT,
        "/admin/v1/tenants/chat",
        spec.to_string(),
    )
    .await;
    assert!(status.is_success(), "{v}");
    let (status, v) = deploy(addr(&a.admin), "chat", &wasm).await;
    assert_eq!(status, http::StatusCode::OK, "{v}");
    serves(&b, "/chat", "").await;
    // bob on b, carol on a, both in the lobby.
    let bob = talk(&format!("ws://{}/chat?user=bob", b.addr), &["--recv", "4"]).await;
    let carol = talk(
        &format!("ws://{}/chat?user=carol", a.addr),
        &["--recv", "4"],
    )
    .await;
    for r in [&a, &b] {
        let deadline = Instant::now() + Duration::from_secs(20);
        while crate::support::metric_value(
            &metrics(r).await,
            "tern_websocket_connections{mode=\"events\",tenant=\"chat\"}",
        ) < 1.0
        {
            assert!(
                Instant::now() < deadline,
                "{} never had its connection",
                r.addr
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // alice speaks on a (her guest publishes); the operator publishes on b.
    let alice = talk_all(
        &format!("ws://{}/chat?user=alice", a.addr),
        &["--recv", "1", "--send", "say hi", "--recv", "1"],
    )
    .await;
    assert_eq!(
        alice["received"],
        serde_json::json!(["welcome", "alice: hi"]),
        "{alice}"
    );
    let publish = serde_json::json!({"items": [
        {"channel": "lobby", "formats": {"ws-message": {"content": "from b"}}}
    ]});
    let (status, v) = admin(
        &b,
        http::Method::POST,
        "/admin/v1/tenants/chat/publish",
        publish.to_string(),
    )
    .await;
    assert_eq!(status, http::StatusCode::OK, "{v}");
    assert_eq!(v["replicas"], "this one, and sent on to the others", "{v}");
    // A webhook on a: its guest publishes with the host call (carol is the one here).
    let hook = crate::support::send(
        addr(&a.addr),
        http::Method::POST,
        "/chat/notify?room=lobby",
        None,
        &[],
        bytes::Bytes::from_static(b"from a webhook"),
    )
    .await;
    assert_eq!(hook.text(), "delivered 1\n");
    // (In either order: alice's message reaches b through a's publish to it, which may come
    // after the operator's on b.)
    let heard = |v: &serde_json::Value| {
        let mut got: Vec<String> = v["received"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m.as_str().unwrap_or("?").to_string())
            .collect();
        got[1..].sort();
        got
    };
    let bob = bob.end().await;
    assert_eq!(
        heard(&bob),
        ["welcome", "alice: hi", "from a webhook", "from b"],
        "bob on b: {bob}"
    );
    let carol = carol.end().await;
    assert_eq!(
        heard(&carol),
        ["welcome", "alice: hi", "from a webhook", "from b"],
        "carol on a: {carol}"
    );
    for r in [&a, &b] {
        let m = metrics(r).await;
        assert!(
            crate::support::metric_value(
                &m,
                "tern_websocket_fleet_publishes_total{outcome=\"sent\"}"
            ) >= 1.0,
            "{m}"
        );
    }
    assert!(
        crate::support::metric_value(
            &metrics(&a).await,
            "tern_websocket_fleet_publishes_total{outcome=\"sent\"}"
        ) >= 2.0,
        "a sent alice's message and the webhook's on"
    );
}

/// `tern logs -f` pointed at one replica follows the requests of every replica, merged in
/// time order; without `-f` it reads what every replica kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tern_logs_follows_the_requests_of_every_replica() {
    use std::io::BufRead;
    let s3 = S3::start();
    let root = tempfile::tempdir().unwrap();
    let replicas = [
        replica(&s3, "a", &root.path().join("a")),
        replica(&s3, "b", &root.path().join("b")),
        replica(&s3, "c", &root.path().join("c")),
    ];
    let a = &replicas[0];
    knows_peers(a, 2.0).await;
    create(addr(&a.admin), "site", "/site").await;
    let (status, v) = deploy(addr(&a.admin), "site", demo("hello")).await;
    assert_eq!(status, http::StatusCode::OK, "{v}");
    for r in &replicas {
        serves(r, "/site", "Hello").await;
    }
    let logs = |follow: bool| {
        let mut cmd = crate::support::tern_bin();
        cmd.args(["logs", "site", "--json", "--token", FLEET_TOKEN])
            .args(["--server", &format!("http://{}", a.admin)]);
        if follow {
            cmd.arg("-f");
        }
        cmd
    };
    let mut tailer = logs(true)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run tern logs");
    let stdout = tailer.stdout.take().unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // Attached on a, and through a on b and c.
    for r in &replicas {
        let deadline = Instant::now() + Duration::from_secs(20);
        while crate::support::metric_value(&metrics(r).await, "tern_live_log_tailers") < 1.0 {
            assert!(
                Instant::now() < deadline,
                "{} never had the tailer",
                r.admin
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let mut sent = std::collections::BTreeSet::new();
    for i in 0..3 {
        for (r, name) in replicas.iter().zip(["a", "b", "c"]) {
            let reply = get(r, &format!("/site/{name}{i}")).await;
            assert_eq!(reply.status, http::StatusCode::OK);
            sent.insert((name.to_string(), reply.header("x-request-id").to_string()));
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    let mut times = Vec::new();
    while seen.len() < sent.len() {
        let line = lines
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("only {seen:?} of {sent:?}"));
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        let Some(id) = v["request_id"].as_str() else {
            panic!("a notice in the stream: {line}");
        };
        let replica = v["replica"].as_str().unwrap();
        assert_eq!(v["path"].as_str().unwrap()[6..7], *replica, "{line}");
        seen.insert((replica.to_string(), id.to_string()));
        times.push(v["time"].as_str().unwrap().to_string());
    }
    assert_eq!(seen, sent);
    assert!(
        times.windows(2).all(|w| w[0] <= w[1]),
        "in time order: {times:?}"
    );
    let _ = tailer.kill();
    let _ = tailer.wait();
    // Without -f: what each replica kept (the checks of `serves` too), merged.
    let out = crate::support::ran(&mut logs(false));
    let text = String::from_utf8_lossy(&out.stdout);
    let kept: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for (replica, id) in &sent {
        assert!(
            kept.iter()
                .any(|v| v["request_id"] == id.as_str() && v["replica"] == replica.as_str()),
            "{replica} {id} not in {text}"
        );
    }
    let times: Vec<&str> = kept.iter().map(|v| v["time"].as_str().unwrap()).collect();
    assert!(
        times.windows(2).all(|w| w[0] <= w[1]),
        "in time order: {times:?}"
    );
}

/// A candidate deployed on one replica serves on both with the same split (500 keys, one
/// version each whichever replica answers); a stage is taken once for the fleet (one
/// replica's step, both serve it); failures seen on both replicas abort the rollout once
/// (one replica's step, the same abort on both), after which neither gives the candidate a
/// request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_splits_alike_on_every_replica_steps_once_and_aborts_everywhere() {
    use crate::rollout::{share, user_keys, variant, version_of, versions};
    let s3 = S3::start();
    let root = tempfile::tempdir().unwrap();
    let (a, b, current) = site_on_two_replicas(&s3, root.path()).await;
    let current = current[..12].to_string();
    let deploy_candidate = async |wasm: Vec<u8>, query: &str| {
        let path = format!("/admin/v1/tenants/site/module?{query}");
        let (status, v) = admin(&a, http::Method::PUT, &path, wasm).await;
        assert_eq!(status, http::StatusCode::OK, "{v}");
        v["version"].as_str().unwrap()[..12].to_string()
    };
    let on = async |r: &crate::support::TernProcess,
                    what: &str,
                    done: &dyn Fn(&serde_json::Value) -> bool| {
        let started = Instant::now();
        loop {
            let (_, t) = admin(r, http::Method::GET, "/admin/v1/tenants/site", "").await;
            if done(&t) {
                return t;
            }
            assert!(
                started.elapsed() < Duration::from_secs(15),
                "{what} on {}: {t}",
                r.addr
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    // The same split on both.
    let cand = deploy_candidate(
        variant(demo("hello"), "2"),
        "percent=30&key=header%3Ax-user",
    )
    .await;
    let serving = |c: &str| {
        let c = c.to_string();
        move |t: &serde_json::Value| {
            t["candidate"]["serving_here"] == true
                && t["candidate"]["version"]["id"]
                    .as_str()
                    .is_some_and(|id| id.starts_with(&c))
        }
    };
    on(&b, "the candidate", &serving(&cand)).await;
    let keys = user_keys(500);
    let (on_a, on_b) = (
        versions(addr(&a.addr), "/site/k", &keys).await,
        versions(addr(&b.addr), "/site/k", &keys).await,
    );
    assert_eq!(on_a, on_b, "one key, one version, on every replica");
    let n = share(&on_a, &cand);
    assert!((100..=200).contains(&n), "{n} of 500 at 30 %");

    // A new candidate in stages, with an abort rule: its next stage is taken by one replica.
    let probe = std::fs::read(crate::support::test_guest(root.path(), "log_probe")).unwrap();
    let query = "stages=30%25%3A2s%2C60%25&key=header%3Ax-user&abort=5&abort_min_requests=30";
    let cand = deploy_candidate(probe, query).await;
    for r in [&a, &b] {
        on(r, "stage 2", &|t| t["candidate"]["plan"]["stage"] == 1).await;
    }
    let after = versions(addr(&b.addr), "/site/k", &keys).await;
    assert!((250..=350).contains(&share(&after, &cand)), "60 %");
    let steps = async |step: &str| {
        let series = format!(r#"tern_rollout_steps_total{{step="{step}",tenant="site"}}"#);
        // (A replica that took no step has no series of it.)
        let count = async |r: &crate::support::TernProcess| {
            let m = metrics(r).await;
            let line = m.lines().find(|l| l.starts_with(&series));
            line.map_or(0.0, |l| l[series.len()..].trim().parse::<f64>().unwrap())
        };
        (count(&a).await, count(&b).await)
    };
    let (sa, sb) = steps("advance").await;
    assert_eq!(
        sa + sb,
        1.0,
        "the stage was taken once for the fleet ({sa} + {sb})"
    );
    // Failures on both replicas: one abort, the same on both.
    let mut conns = [
        crate::support::Conn::open(addr(&a.addr)).await,
        crate::support::Conn::open(addr(&b.addr)).await,
    ];
    for (i, key) in keys.iter().cycle().take(600).enumerate() {
        let r = conns[i % 2]
            .send(crate::support::request(
                http::Method::GET,
                "/site/k?trap=1",
                None,
                &[("x-user", key)],
                bytes::Bytes::new(),
            ))
            .await;
        if version_of(&r) == current {
            assert_eq!(r.status, http::StatusCode::OK);
        }
    }
    let aborted = |t: &serde_json::Value| t["candidate"]["state"] == "aborted";
    let (ta, tb) = (
        on(&a, "the abort", &aborted).await,
        on(&b, "the abort", &aborted).await,
    );
    let reason = &ta["candidate"]["plan"]["aborted"];
    assert!(
        reason["reason"]
            .as_str()
            .is_some_and(|r| r.contains("percentage points worse")),
        "{ta}"
    );
    assert_eq!(
        *reason, tb["candidate"]["plan"]["aborted"],
        "one abort for the fleet"
    );
    let (sa, sb) = steps("abort").await;
    assert_eq!(sa + sb, 1.0, "aborted once for the fleet ({sa} + {sb})");
    for r in [&a, &b] {
        let now = versions(addr(&r.addr), "/site/k", &keys).await;
        assert!(
            now.iter().all(|v| *v == current),
            "after the abort on {}",
            r.addr
        );
    }
    // Promoted on a: b serves it to every key, as its current version.
    let (status, v) = admin(&a, http::Method::POST, "/admin/v1/tenants/site/promote", "").await;
    assert_eq!(status, http::StatusCode::OK, "{v}");
    on(&b, "the promotion", &|t| {
        t["candidate"].is_null()
            && t["current"]["id"]
                .as_str()
                .is_some_and(|id| id.starts_with(&cand))
    })
    .await;
    let now = versions(addr(&b.addr), "/site/k", &keys).await;
    assert!(now.iter().all(|v| *v == cand), "after the promotion on b");
}

/// A candidate one replica cannot load (the registry failing its reads of modules for a
/// while) is tried again there as a tenant is, with no later change in the registry to make
/// it: once the registry answers again the replica serves it, with no other step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_a_replica_could_not_load_is_tried_again() {
    use crate::rollout::{variant, version_of};
    let s3 = S3::start();
    let root = tempfile::tempdir().unwrap();
    let proxy = crate::faults::S3Proxy::start(&s3.endpoint).await;
    let a = replica(&s3, "a", &root.path().join("a"));
    let b = replica_via(
        &s3,
        Some(&proxy.endpoint),
        "b",
        &root.path().join("b"),
        "",
        100,
        "2s",
    );
    create(addr(&a.admin), "site", "/site").await;
    let (status, v) = deploy(addr(&a.admin), "site", demo("hello")).await;
    assert_eq!(status, http::StatusCode::OK, "{v}");
    let current = v["version"].as_str().unwrap()[..12].to_string();
    serves(&b, "/site", "Hello").await;

    // b's reads of modules and compiled artifacts fail; a candidate for every client.
    proxy.fail_reads(&["/blobs/", "/artifacts/"]);
    let path = "/admin/v1/tenants/site/module?percent=100";
    let (status, v) = admin(&a, http::Method::PUT, path, variant(demo("hello"), "2")).await;
    assert_eq!(status, http::StatusCode::OK, "{v}");
    let cand = v["version"].as_str().unwrap()[..12].to_string();
    let serving_here = async |r: &crate::support::TernProcess| {
        let (_, t) = admin(r, http::Method::GET, "/admin/v1/tenants/site", "").await;
        t["candidate"]["serving_here"] == true
    };
    assert!(serving_here(&a).await, "a made it");
    let started = Instant::now();
    let failed = r#"tern_registry_syncs_total{outcome="failed"}"#;
    while crate::support::metric_value_or_zero(&metrics(&b).await, failed) < 1.0 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "b never failed to load the candidate ({} reads failed)",
            proxy.failed_reads()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!serving_here(&b).await, "b cannot have loaded it");
    assert_eq!(
        version_of(&get(&b, "/site").await),
        current,
        "b's current serves"
    );
    assert_eq!(
        version_of(&get(&a, "/site").await),
        cand,
        "a's candidate serves"
    );

    // The registry answers again; nothing else changes in it.
    proxy.heal();
    let healed = Instant::now();
    while !serving_here(&b).await {
        assert!(
            healed.elapsed() < Duration::from_secs(60),
            "b never tried the candidate again"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "b loaded the candidate {:?} after the registry healed",
        healed.elapsed()
    );
    assert_eq!(
        version_of(&get(&b, "/site").await),
        cand,
        "b's candidate serves"
    );
}

/// A replica that has not seen a tenant deleted and created again under its name (its reads
/// of the registry's index failing) keeps the two tenants apart: a publish of either reaches
/// only its own connections, and a live log read through the other replica does not give the
/// new tenant's readers the old one's requests (that replica is said to know another tenant).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_behind_on_a_tenant_made_again_keeps_the_two_apart() {
    use crate::websocket_events::talk;
    let s3 = S3::start();
    let root = tempfile::tempdir().unwrap();
    let proxy = crate::faults::S3Proxy::start(&s3.endpoint).await;
    let wasm = std::fs::read(crate::support::test_guest(root.path(), "ws_events")).unwrap();
    let a = replica(&s3, "a", &root.path().join("a"));
    let b = replica_via(
        &s3,
        Some(&proxy.endpoint),
        "b",
        &root.path().join("b"),
        "",
        100,
        "2s",
    );
    knows_peers(&a, 1.0).await;
    knows_peers(&b, 1.0).await;
    let make = async || {
        let spec = serde_json::json!({"paths": ["/chat"], "websocket": {"mode": "events"}});
        let path = "/admin/v1/tenants/chat";
        let (status, v) = admin(&a, http::Method::PUT, path, spec.to_string()).await;
        assert!(status.is_success(), "{v}");
        let (status, v) = deploy(addr(&a.admin), "chat", &wasm).await;
        assert_eq!(status, http::StatusCode::OK, "{v}");
    };
    let connections = async |r: &crate::support::TernProcess| {
        let series = "tern_websocket_connections{mode=\"events\",tenant=\"chat\"}";
        let deadline = Instant::now() + Duration::from_secs(20);
        while crate::support::metric_value_or_zero(&metrics(r).await, series) < 1.0 {
            assert!(Instant::now() < deadline, "{} has no connection", r.addr);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    make().await;
    serves(&b, "/chat", "").await;
    // bob on b, on the tenant as it was.
    let bob = talk(&format!("ws://{}/chat?user=bob", b.addr), &["--recv", "2"]).await;
    assert_eq!(bob.first["opened"], true, "{}", bob.first);
    connections(&b).await;

    // b misses the delete and the tenant made again on a.
    proxy.fail_reads(&["/index.json"]);
    let (status, v) = admin(&a, http::Method::DELETE, "/admin/v1/tenants/chat", "").await;
    assert!(status.is_success(), "{v}");
    make().await;
    // (b reads the index after the change: its next poll.)
    let failed = proxy.failed_reads();
    let deadline = Instant::now() + Duration::from_secs(20);
    while proxy.failed_reads() <= failed {
        assert!(Instant::now() < deadline, "b never read the index again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The fleet's view: a serves the new tenant, b does not (it serves the old one's version,
    // the same module).
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, view) = admin(&a, http::Method::GET, "/admin/v1/fleet", "").await;
        assert_eq!(status, http::StatusCode::OK, "{view}");
        let chat = &view["tenants"]["chat"];
        if chat["serving"] == 1 {
            assert_eq!(chat["converged"], false, "{view}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "b counted as serving the new chat: {view}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // carol on a, on the new tenant.
    let carol = talk(
        &format!("ws://{}/chat?user=carol", a.addr),
        &["--recv", "3"],
    )
    .await;
    assert_eq!(carol.first["opened"], true, "{}", carol.first);
    connections(&a).await;

    // Publishes on a, on b, on a again: each replica's sent on to the other (waited for).
    let forwarded = async |r: &crate::support::TernProcess| {
        let m = metrics(r).await;
        let series = |o: &str| format!("tern_websocket_fleet_publishes_total{{outcome=\"{o}\"}}");
        let value = |o: &str| crate::support::series_value(&m, &series(o)).unwrap_or(0.0);
        value("sent") + value("failed")
    };
    for (r, text) in [
        (&a, "from the new chat"),
        (&b, "from the old chat"),
        (&a, "again from the new chat"),
    ] {
        let before = forwarded(r).await;
        let publish = serde_json::json!({"items": [
            {"channel": "lobby", "formats": {"ws-message": {"content": text}}}
        ]});
        let path = "/admin/v1/tenants/chat/publish";
        let (status, v) = admin(r, http::Method::POST, path, publish.to_string()).await;
        assert_eq!(status, http::StatusCode::OK, "{v}");
        assert_eq!(
            v["delivered"], 1,
            "its own connection here (none: it ended on a message of the other tenant): {v}"
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while forwarded(r).await <= before {
            assert!(
                Instant::now() < deadline,
                "{} never sent {text:?} on",
                r.addr
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let bob = bob.end().await;
    assert_eq!(
        bob["received"],
        serde_json::json!(["welcome", "from the old chat"]),
        "bob on b's old tenant: {bob}"
    );
    let carol = carol.end().await;
    assert_eq!(
        carol["received"],
        serde_json::json!(["welcome", "from the new chat", "again from the new chat"]),
        "carol on a's new tenant: {carol}"
    );
    for r in [&a, &b] {
        let m = metrics(r).await;
        let series = "tern_websocket_fleet_publishes_total{outcome=\"failed\"}";
        assert!(
            crate::support::metric_value_or_zero(&m, series) >= 1.0,
            "{}: the other replica refused its publishes",
            r.addr
        );
    }

    // The new tenant's live log read through a: a's records, and b said to know another.
    let reply = crate::support::send(
        addr(&a.admin),
        http::Method::GET,
        "/admin/v1/tenants/chat/logs",
        None,
        &[("authorization", &format!("Bearer {FLEET_TOKEN}"))],
        bytes::Bytes::new(),
    )
    .await;
    assert_eq!(reply.status, http::StatusCode::OK, "{}", reply.text());
    let lines: Vec<serde_json::Value> = reply
        .text()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        lines.iter().all(|v| v["replica"] != "b"),
        "the old tenant's requests on b: {lines:#?}"
    );
    assert!(
        lines
            .iter()
            .any(|v| v["replica"] == "a" && v["path"] == "/chat"),
        "carol's opening on a: {lines:#?}"
    );
    assert!(
        lines.iter().any(|v| v["error"]
            .as_str()
            .is_some_and(|e| e.contains("409") && e.contains("know different tenants"))),
        "b said to know another tenant: {lines:#?}"
    );
}

/// A route change on a replica that could not load a tenant of the registry (its reads of
/// modules failing) is checked against that tenant's routes all the same: its path stays
/// taken there, and a path beside it is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_a_replica_could_not_load_keeps_its_routes_taken_there() {
    let s3 = S3::start();
    let root = tempfile::tempdir().unwrap();
    let proxy = crate::faults::S3Proxy::start(&s3.endpoint).await;
    let a = replica(&s3, "a", &root.path().join("a"));
    let b = replica_via(
        &s3,
        Some(&proxy.endpoint),
        "b",
        &root.path().join("b"),
        "",
        100,
        "2s",
    );
    proxy.fail_reads(&["/blobs/", "/artifacts/"]);
    create(addr(&a.admin), "shop", "/shop").await;
    let (status, v) = deploy(addr(&a.admin), "shop", demo("hello")).await;
    assert_eq!(status, http::StatusCode::OK, "{v}");
    let failed = r#"tern_registry_syncs_total{outcome="failed"}"#;
    let deadline = Instant::now() + Duration::from_secs(20);
    while crate::support::metric_value_or_zero(&metrics(&b).await, failed) < 1.0 {
        assert!(Instant::now() < deadline, "b never failed to load shop");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(get(&b, "/shop").await.status, http::StatusCode::NOT_FOUND);
    let put = async |name: &str, path: &str| {
        let spec = serde_json::json!({ "paths": [path] }).to_string();
        admin(
            &b,
            http::Method::PUT,
            &format!("/admin/v1/tenants/{name}"),
            spec,
        )
        .await
    };
    let (status, v) = put("outlet", "/shop").await;
    assert_eq!(status, http::StatusCode::CONFLICT, "{v}");
    let said = v["error"].as_str().unwrap_or_default();
    assert!(said.contains(r#"routed to tenant "shop""#), "{v}");
    let (status, v) = put("outlet", "/shopping").await;
    assert!(status.is_success(), "{status} {v}");
}
