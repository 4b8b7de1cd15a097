//! Rate limits at the edge (`[[tenant.rate_limit]]`): the same traffic gets the same answers
//! as nginx's `limit_req` (started here), refused requests cost no guest and say when to come
//! back, a spoofed `X-Forwarded-For` changes nothing unless the peer is a trusted proxy, a dry
//! run refuses nothing, one flooding client leaves another's rate alone, keys by header and
//! query, path and method filters, bad settings are explained.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, StatusCode};

use crate::support::{self, TestServer};

const HELLO: &str =
    "[[tenant]]\nname = \"hello\"\nmodule = \"builtin:hello\"\npaths = [\"/hello\"]\n";

/// `hello` with one rate limit (the TOML lines of its table).
fn limited(limit: &str) -> String {
    format!("{HELLO}[[tenant.rate_limit]]\nname = \"rl\"\n{limit}\n")
}

/// nginx (Debian's, as the reference) serving a file `/hello` behind `limit_req zone=z <args>`
/// with `rate`, stopped when dropped.
struct Nginx {
    child: Child,
    _dir: tempfile::TempDir,
    addr: SocketAddr,
}

impl Nginx {
    fn start(rate: &str, args: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let port = support::free_port();
        let d = dir.path().display();
        let conf = format!(
            "daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\n\
             error_log {d}/error.log warn;\nevents {{ worker_connections 1024; }}\n\
             http {{\n access_log off;\n client_body_temp_path {d}/body;\n\
             proxy_temp_path {d}/proxy;\n\
             limit_req_zone $binary_remote_addr zone=z:1m rate={rate};\n limit_req_status 429;\n\
             server {{ listen 127.0.0.1:{port}; root {d}/www; \
             location / {{ limit_req zone=z {args}; }} }}\n}}\n"
        );
        std::fs::write(dir.path().join("nginx.conf"), conf).unwrap();
        // A file, not `return`: `return` answers before `limit_req`'s phase.
        std::fs::create_dir(dir.path().join("www")).unwrap();
        std::fs::write(dir.path().join("www/hello"), "ok\n").unwrap();
        let child = Command::new(nginx_bin())
            .args(["-p", &d.to_string(), "-c", "nginx.conf"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nginx (bash scripts/test installs Debian's nginx)");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "nginx did not start: {}",
                std::fs::read_to_string(dir.path().join("error.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Self {
            child,
            _dir: dir,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
        }
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn nginx_bin() -> &'static Path {
    let p = Path::new("/usr/sbin/nginx");
    assert!(
        p.is_file(),
        "nginx is not installed (bash scripts/test installs it)"
    );
    p
}

/// A GET with `headers` on a fresh connection; its status.
async fn status(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> StatusCode {
    support::send(addr, Method::GET, path, None, headers, Bytes::new())
        .await
        .status
}

/// The traffic script run against every server in `addrs` at the same instants: 100
/// requests at once, then one every 50 ms for 5 s. For each server, the requests accepted
/// (`200`) by checkpoint: the burst, then each second of the paced part (cumulative), and
/// the statuses that were neither 200 nor 429.
async fn script(addrs: &[SocketAddr], path: &'static str) -> Vec<(Vec<usize>, Vec<StatusCode>)> {
    let mut tasks = Vec::new();
    for _ in 0..100 {
        for (i, &a) in addrs.iter().enumerate() {
            tasks.push((i, 0usize, tokio::spawn(status(a, path, &[]))));
        }
    }
    let started = Instant::now();
    for step in 1..=100u32 {
        let at = started + Duration::from_millis(50) * step;
        tokio::time::sleep_until(at.into()).await;
        let checkpoint = (step as usize - 1) / 20 + 1;
        for (i, &a) in addrs.iter().enumerate() {
            tasks.push((i, checkpoint, tokio::spawn(status(a, path, &[]))));
        }
    }
    let mut out = vec![(vec![0usize; 6], Vec::new()); addrs.len()];
    for (i, checkpoint, task) in tasks {
        let s = task.await.unwrap();
        if s == StatusCode::OK {
            for c in checkpoint..6 {
                out[i].0[c] += 1;
            }
        } else if s != StatusCode::TOO_MANY_REQUESTS {
            out[i].1.push(s);
        }
    }
    out
}

/// Runs the script against Tern (`limit`) and nginx (`rate`, `args`) side by side.
async fn same_as_nginx(limit: &str, rate: &str, args: &str) {
    let s = TestServer::start(&limited(limit)).await;
    let nginx = Nginx::start(rate, args);
    let got = script(&[s.addr(), nginx.addr], "/hello").await;
    let (tern, reference) = (&got[0], &got[1]);
    eprintln!(
        "accepted by checkpoint: tern {:?}, nginx {:?}",
        tern.0, reference.0
    );
    assert!(tern.1.is_empty() && reference.1.is_empty(), "{got:?}");
    for (c, (t, n)) in tern.0.iter().zip(&reference.0).enumerate() {
        assert!(
            t.abs_diff(*n) <= 1,
            "checkpoint {c}: tern accepted {t}, nginx {n} (all: {:?} vs {:?})",
            tern.0,
            reference.0
        );
    }
    // (22 if the 100 concurrent requests took over 100 ms to arrive: one more drained.)
    assert!(
        (21..=22).contains(&tern.0[0]),
        "the burst: the first request and 20 more: {}",
        tern.0[0]
    );
    let m = s.metrics().await;
    let refused = support::metric_value(
        &m,
        "tern_rate_limited_total{limit=\"rl\",mode=\"enforce\",tenant=\"hello\"}",
    );
    assert_eq!(refused as usize, 200 - tern.0[5], "every refusal counted");
    // A guest ran for each accepted request and for no refused one.
    let ran = support::metric_value_or_zero(
        &m,
        "tern_guest_outcomes_total{outcome=\"ok\",tenant=\"hello\"}",
    );
    assert_eq!(
        ran as usize, tern.0[5],
        "guests run for {} accepted",
        tern.0[5]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_then_a_steady_pace_get_the_same_answers_as_nginx_nodelay() {
    same_as_nginx("rate = \"10/s\"\nburst = 20", "10r/s", "burst=20 nodelay").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_delay_the_same_answers_as_nginx_delay() {
    same_as_nginx(
        "rate = \"10/s\"\nburst = 20\ndelay = 5",
        "10r/s",
        "burst=20 delay=5",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_says_when_to_come_back_and_costs_no_guest() {
    let config = HELLO.to_string()
        + "error_pages = { \"429\" = \"slow down, {request_id}\" }\n\
           [[tenant.rate_limit]]\nname = \"rl\"\nrate = \"1/s\"\n";
    let s = TestServer::start(&config).await;
    assert_eq!(s.get("/hello").await.status, StatusCode::OK);
    let r = s.get("/hello").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.text());
    assert_eq!(r.header("retry-after"), "1");
    assert_eq!(r.header("ratelimit-policy"), "\"rl\";q=1;w=1");
    assert_eq!(r.header("ratelimit"), "\"rl\";r=0;t=1");
    assert!(
        r.text().starts_with("slow down, "),
        "the tenant's page: {}",
        r.text()
    );
    // After the time it said, one more is taken.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(s.get("/hello").await.status, StatusCode::OK);
    // HTTP/2 too.
    let r = support::send_h2(s.addr(), "/hello").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    let m = s.metrics().await;
    assert!(
        support::metric_is(
            &m,
            "tern_guest_outcomes_total{outcome=\"rate_limited\",tenant=\"hello\"}",
            2.0
        ),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_for_counts_only_from_a_trusted_proxy() {
    let spoof = |i: usize| format!("203.0.113.{i}");
    // No trusted proxy: every request is 127.0.0.1's, whatever it claims.
    // (4/h: nothing drains within the test.)
    let s = TestServer::start(&limited("rate = \"4/h\"\nburst = 2")).await;
    let mut codes = Vec::new();
    for i in 0..6 {
        codes.push(status(s.addr(), "/hello", &[("x-forwarded-for", &spoof(i))]).await);
    }
    assert_eq!(
        codes.iter().filter(|c| **c == StatusCode::OK).count(),
        3,
        "one client: {codes:?}"
    );
    // Behind a trusted proxy: each forwarded client has its own count.
    let config = format!(
        "[server]\ntrusted_proxies = [\"127.0.0.1\"]\n{}",
        limited("rate = \"4/h\"\nburst = 2")
    );
    let s = TestServer::start(&config).await;
    for i in 0..6 {
        let c = status(s.addr(), "/hello", &[("x-forwarded-for", &spoof(i))]).await;
        assert_eq!(c, StatusCode::OK, "client {i}");
    }
    // The proxy's own requests (no header) are one client.
    let mut own = Vec::new();
    for _ in 0..4 {
        own.push(status(s.addr(), "/hello", &[]).await);
    }
    assert_eq!(own.last(), Some(&StatusCode::TOO_MANY_REQUESTS), "{own:?}");
}

/// A dual-stack listener (`[::]`) sees an IPv4 client as `::ffff:127.0.0.1`, a trusted proxy
/// names it `127.0.0.1` or `::ffff:127.0.0.1`: one client however its address is spelt, for its
/// rate limit and for what a guest sees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ipv4_client_is_one_client_however_its_address_is_spelt() {
    let config = format!(
        "[server]\nlisten = \"[::]:0\"\ntrusted_proxies = [\"127.0.0.1\"]\n{}\
         [[tenant]]\nname = \"cgi\"\nmodule = \"builtin:cgi\"\npaths = [\"/cgi\"]\n",
        limited("rate = \"4/h\"\nburst = 1")
    );
    let s = TestServer::start(&config).await;
    assert!(s.addr().is_ipv6(), "a dual-stack listener: {}", s.addr());
    // Over IPv4, to the dual-stack listener.
    let v4: SocketAddr = ([127, 0, 0, 1], s.addr().port()).into();
    // The proxy's own request (the peer `::ffff:127.0.0.1`), then the same client named by
    // the proxy both ways: one count, burst 1 lets two through.
    let mut codes = Vec::new();
    for forwarded in [None, Some("127.0.0.1"), Some("::ffff:127.0.0.1"), None] {
        let headers: Vec<(&str, &str)> = forwarded
            .map(|f| ("x-forwarded-for", f))
            .into_iter()
            .collect();
        codes.push(status(v4, "/hello", &headers).await);
    }
    assert_eq!(
        codes,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::TOO_MANY_REQUESTS
        ],
        "one client's count"
    );
    // Another client through the proxy still has its own.
    assert_eq!(
        status(v4, "/hello", &[("x-forwarded-for", "198.51.100.7")]).await,
        StatusCode::OK
    );
    // What a guest sees.
    let reply = support::send(v4, Method::GET, "/cgi/env", None, &[], Bytes::new()).await;
    let env = String::from_utf8_lossy(&reply.body);
    assert!(env.contains("REMOTE_ADDR=127.0.0.1\n"), "{env}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_refuses_nothing_and_counts_everything() {
    let s = TestServer::start(&limited("rate = \"4/h\"\nmode = \"dry_run\"")).await;
    for _ in 0..10 {
        assert_eq!(s.get("/hello").await.status, StatusCode::OK);
    }
    let m = s.metrics().await;
    assert!(
        support::metric_is(
            &m,
            "tern_rate_limited_total{limit=\"rl\",mode=\"dry_run\",tenant=\"hello\"}",
            9.0
        ),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_by_header_and_query_and_filters_by_path_and_method() {
    let limits = "[[tenant]]\nname = \"hello\"\nmodule = \"builtin:hello\"\npaths = [\"/hello\"]\n\
        [[tenant.rate_limit]]\nname = \"by-key\"\nkey = \"header:x-api-key\"\nrate = \"1/s\"\n\
        paths = [\"/hello/api\"]\n\
        [[tenant.rate_limit]]\nname = \"by-user\"\nkey = [\"query:user\", \"tenant\"]\nrate = \"1/s\"\n\
        paths = [\"/hello/q\"]\nmethods = [\"POST\"]\n";
    let s = TestServer::start(limits).await;
    let key = |k: &'static str| [("x-api-key", k)];
    assert_eq!(
        status(s.addr(), "/hello/api", &key("a")).await,
        StatusCode::OK
    );
    assert_eq!(
        status(s.addr(), "/hello/api", &key("a")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        status(s.addr(), "/hello/api", &key("b")).await,
        StatusCode::OK,
        "another key"
    );
    // No key at all: not counted (as nginx's empty key).
    for _ in 0..3 {
        assert_eq!(status(s.addr(), "/hello/api", &[]).await, StatusCode::OK);
    }
    // Outside its paths: not counted.
    for _ in 0..3 {
        assert_eq!(
            status(s.addr(), "/hello/other", &key("a")).await,
            StatusCode::OK
        );
    }
    // By query parameter, POST only.
    let post = |q: &'static str| {
        support::send(
            s.addr(),
            Method::POST,
            q,
            None,
            &[],
            Bytes::from_static(b"x"),
        )
    };
    assert_eq!(post("/hello/q?user=1").await.status, StatusCode::OK);
    assert_eq!(
        post("/hello/q?user=1").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(post("/hello/q?x=0&user=2").await.status, StatusCode::OK);
    for _ in 0..3 {
        assert_eq!(
            status(s.addr(), "/hello/q?user=1", &[]).await,
            StatusCode::OK,
            "GET"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_flooding_client_leaves_another_its_rate() {
    let config = format!(
        "[server]\ntrusted_proxies = [\"127.0.0.1\"]\n{}",
        limited("rate = \"5/s\"\nburst = 2")
    );
    let s = TestServer::start(&config).await;
    let addr = s.addr();
    let flood = tokio::spawn(async move {
        let (mut sent, mut refused) = (0, 0);
        let until = Instant::now() + Duration::from_secs(3);
        while Instant::now() < until {
            let c = status(addr, "/hello", &[("x-forwarded-for", "198.51.100.1")]).await;
            sent += 1;
            refused += usize::from(c == StatusCode::TOO_MANY_REQUESTS);
        }
        (sent, refused)
    });
    // The other client, at a third of the rate during the flood: every request answered.
    for _ in 0..10 {
        let c = status(addr, "/hello", &[("x-forwarded-for", "198.51.100.2")]).await;
        assert_eq!(c, StatusCode::OK);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let (sent, refused) = flood.await.unwrap();
    // The flood got about 5/s and its burst; the rest was refused.
    assert!(
        refused > 0 && sent - refused <= 2 + 1 + 5 * 4,
        "{sent} sent, {refused} refused"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_limits_are_refused_at_start_and_by_the_api() {
    for (limit, says) in [
        ("rate = \"0/s\"", "at least one request"),
        ("rate = \"10/s\"\nburst = -1", "expected u32"),
        ("rate = \"10/s\"\nkey = \"cookie:x\"", "unknown key"),
        ("rate = \"10/s\"\nburst = 2\ndelay = 3", "more than burst"),
        (
            "rate = \"10/s\"\nmode = \"log\"",
            "expected `enforce` or `dry_run`",
        ),
    ] {
        let e = TestServer::try_start(&limited(limit))
            .await
            .err()
            .expect(limit);
        let text = format!("{e:#}");
        assert!(text.contains(says), "{limit}: {text}");
    }
    let s = TestServer::start("").await;
    for (spec, says) in [
        (
            serde_json::json!({"paths": ["/a"], "rate_limit": [{"name": "x", "rate": "0/s"}]}),
            "at least one request",
        ),
        (
            serde_json::json!({"paths": ["/a"], "rate_limit": [{"name": "x", "rate": "1/s", "max_keys": 0}]}),
            "max_keys",
        ),
    ] {
        let (code, v) = s
            .admin_call(Method::PUT, "/admin/v1/tenants/a", spec.to_string())
            .await;
        assert_eq!(code, StatusCode::BAD_REQUEST, "{v}");
        assert!(v.to_string().contains(says), "{v}");
    }
    // A good one through the API is enforced once deployed.
    let spec = serde_json::json!({"paths": ["/a"], "rate_limit": [{"name": "x", "rate": "1/s"}]});
    let (code, v) = s
        .admin_call(Method::PUT, "/admin/v1/tenants/a", spec.to_string())
        .await;
    assert!(code.is_success(), "{v}");
    let (code, v) = s
        .admin_call(
            Method::PUT,
            "/admin/v1/tenants/a/module",
            support::demo("hello").to_vec(),
        )
        .await;
    assert_eq!(code, StatusCode::OK, "{v}");
    assert_eq!(s.get("/a").await.status, StatusCode::OK);
    assert_eq!(s.get("/a").await.status, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_wide_limits_count_every_tenants_requests_per_client_or_per_tenant() {
    let config = "[server]\ntrusted_proxies = [\"127.0.0.1\"]\n\
        [[server.rate_limit]]\nname = \"per-client\"\nrate = \"4/h\"\nburst = 2\n\
        [[server.rate_limit]]\nname = \"per-tenant\"\nkey = \"tenant\"\nrate = \"4/h\"\nburst = 4\n\
        [[tenant]]\nname = \"one\"\nmodule = \"builtin:hello\"\npaths = [\"/one\"]\n\
        [[tenant]]\nname = \"two\"\nmodule = \"builtin:hello\"\npaths = [\"/two\"]\n";
    let s = TestServer::start(config).await;
    let from = |c: &'static str| [("x-forwarded-for", c)];
    // One client across both tenants: one request and its burst of 2, then refused by the
    // server's per-client limit (each tenant's count: 2 and 1, within theirs).
    let mut codes = Vec::new();
    for path in ["/one", "/two", "/one", "/two"] {
        let r = support::send(
            s.addr(),
            Method::GET,
            path,
            None,
            &from("192.0.2.1"),
            Bytes::new(),
        )
        .await;
        codes.push(r.status);
        if r.status == StatusCode::TOO_MANY_REQUESTS {
            assert_eq!(r.header("ratelimit-policy"), "\"per-client\";q=6;w=3600");
        }
    }
    assert_eq!(
        codes,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    // Per tenant: "one" has taken 2 of its 5, three more clients get in, the next is refused
    // by the per-tenant limit; "two" (1 of 5 taken) still takes four more.
    for c in ["192.0.2.2", "192.0.2.3", "192.0.2.4"] {
        assert_eq!(
            status(s.addr(), "/one", &from(c)).await,
            StatusCode::OK,
            "{c}"
        );
    }
    let r = support::send(
        s.addr(),
        Method::GET,
        "/one",
        None,
        &from("192.0.2.5"),
        Bytes::new(),
    )
    .await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("ratelimit-policy"), "\"per-tenant\";q=8;w=3600");
    for c in ["192.0.2.6", "192.0.2.7", "192.0.2.8", "192.0.2.9"] {
        assert_eq!(
            status(s.addr(), "/two", &from(c)).await,
            StatusCode::OK,
            "{c}"
        );
    }
    assert_eq!(
        status(s.addr(), "/two", &from("192.0.2.10")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    let m = s.metrics().await;
    for (limit, n) in [("per-client", 1.0), ("per-tenant", 2.0)] {
        let series =
            format!("tern_rate_limited_total{{limit=\"{limit}\",mode=\"enforce\",tenant=\"*\"}}");
        assert!(support::metric_is(&m, &series, n), "{series}: {m}");
    }
    // A bad one stops the start, named as the server's.
    let e = TestServer::try_start(
        "[server]\n[[server.rate_limit]]\nname = \"x\"\nrate = \"1/s\"\nkey = \"cookie:a\"\n",
    )
    .await
    .err()
    .expect("refused");
    let text = format!("{e:#}");
    assert!(
        text.contains("server.rate_limit") && text.contains("unknown key"),
        "{text}"
    );
}

/// Two replicas with a shared limit count once for the fleet (in their Redis store): a flood
/// through both gets the configured rate in total (not twice it); with Redis gone, each limit
/// does what its `when_unreachable` says; a shared limit needs a Redis store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_limit_counts_for_the_fleet_and_follows_its_choice_without_redis() {
    let mut redis = crate::kv::Redis::start();
    let config = format!(
        "[kv.fleet]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:{}\"\ntimeout_ms = 300\n{HELLO}\
         [[tenant.rate_limit]]\nname = \"paced\"\nrate = \"20/s\"\nshared = true\nstore = \"fleet\"\n\
         paths = [\"/hello/paced\"]\n\
         [[tenant.rate_limit]]\nname = \"open\"\nrate = \"4/h\"\nburst = 4\nshared = true\n\
         store = \"fleet\"\npaths = [\"/hello/open\"]\n\
         [[tenant.rate_limit]]\nname = \"closed\"\nrate = \"4/h\"\nburst = 4\nshared = true\n\
         store = \"fleet\"\nwhen_unreachable = \"refuse\"\npaths = [\"/hello/closed\"]\n",
        redis.port
    );
    let one = TestServer::start(&config).await;
    let two = TestServer::start(&config).await;
    // Exact counts: 1 + burst 4 through either replica, then refused on both.
    let mut codes = Vec::new();
    for i in 0..8 {
        let s = if i % 2 == 0 { &one } else { &two };
        codes.push(status(s.addr(), "/hello/open", &[]).await);
    }
    let taken = codes.iter().filter(|c| **c == StatusCode::OK).count();
    assert_eq!(taken, 5, "{codes:?}");
    assert_eq!(codes[7], StatusCode::TOO_MANY_REQUESTS);
    // A flood through both for 2 s at 20/s (burst 0): about 40 taken in total (±10 %), where
    // two replicas counting apart would take about 80.
    let addrs = [one.addr(), two.addr(), one.addr(), two.addr()];
    let until = Instant::now() + Duration::from_secs(2);
    let floods: Vec<_> = addrs
        .into_iter()
        .map(|a| {
            tokio::spawn(async move {
                let mut ok = 0usize;
                while Instant::now() < until {
                    ok += usize::from(status(a, "/hello/paced", &[]).await == StatusCode::OK);
                }
                ok
            })
        })
        .collect();
    let mut taken = 0;
    for f in floods {
        taken += f.await.unwrap();
    }
    eprintln!("shared 20/s over 2 s through two replicas: {taken} taken");
    assert!((36..=45).contains(&taken), "{taken} taken");

    // Redis gone: "open" lets requests through, "closed" refuses them; both are counted.
    redis.stop();
    for _ in 0..3 {
        assert_eq!(status(one.addr(), "/hello/open", &[]).await, StatusCode::OK);
        assert_eq!(
            status(two.addr(), "/hello/closed", &[]).await,
            StatusCode::TOO_MANY_REQUESTS
        );
    }
    let m = one.metrics().await;
    let series = "tern_rate_limit_unreachable_total{limit=\"open\",tenant=\"hello\"}";
    assert!(support::metric_is(&m, series, 3.0), "{m}");

    // A shared limit needs a Redis store.
    let e = TestServer::try_start(&limited("rate = \"1/s\"\nshared = true"))
        .await
        .err()
        .expect("refused");
    let text = format!("{e:#}");
    assert!(
        text.contains("counts in a Redis store, and [kv.default] is sqlite"),
        "{text}"
    );
    let e = TestServer::try_start(&limited("rate = \"1/s\"\nwhen_unreachable = \"refuse\""))
        .await
        .err()
        .expect("refused");
    assert!(format!("{e:#}").contains("for a shared limit"), "{e:#}");
}

/// A shared limit of a tenant of the admin API counts under the tenant's name and id: a
/// tenant created again under a deleted one's name starts with counts of its own, while
/// the same tenant's counts outlive a redeploy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_created_again_under_a_deleted_ones_name_has_shared_counts_of_its_own() {
    let redis = crate::kv::Redis::start();
    let config = format!(
        "[kv.fleet]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:{}\"\ntimeout_ms = 10000\n",
        redis.port
    );
    let s = TestServer::start(&config).await;
    let spec = serde_json::json!({
        "paths": ["/api"],
        "rate_limit": [{"name": "few", "rate": "4/h", "shared": true, "store": "fleet"}],
    });
    let make = async || {
        s.create_and_deploy("api", spec.clone(), support::demo("hello"))
            .await;
    };
    make().await;
    assert_eq!(status(s.addr(), "/api", &[]).await, StatusCode::OK);
    assert_eq!(
        status(s.addr(), "/api", &[]).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Redeployed: the same tenant, the same count.
    let (status_, v) = s
        .admin_call(
            Method::PUT,
            "/admin/v1/tenants/api/module",
            support::demo("echo").to_vec(),
        )
        .await;
    assert_eq!(status_, StatusCode::OK, "{v}");
    assert_eq!(
        status(s.addr(), "/api", &[]).await,
        StatusCode::TOO_MANY_REQUESTS,
        "a redeploy keeps the count"
    );
    // Deleted and created again: another tenant, its own count.
    let (status_, v) = s
        .admin_call(Method::DELETE, "/admin/v1/tenants/api", "")
        .await;
    assert!(status_.is_success(), "{status_} {v}");
    make().await;
    assert_eq!(
        status(s.addr(), "/api", &[]).await,
        StatusCode::OK,
        "the deleted tenant's count"
    );
    assert_eq!(
        status(s.addr(), "/api", &[]).await,
        StatusCode::TOO_MANY_REQUESTS
    );
}

/// A server-wide limit keyed by tenant counts a tenant created again under a deleted one's
/// name apart from it (limit 1: the old one's count would refuse the new one's first request).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_limit_by_tenant_counts_a_tenant_created_again_apart() {
    let config = "[server]\n\
        [[server.rate_limit]]\nname = \"per-tenant\"\nkey = \"tenant\"\nrate = \"4/h\"\n";
    let s = TestServer::start(config).await;
    let spec = serde_json::json!({ "paths": ["/api"] });
    let make = async || {
        s.create_and_deploy("api", spec.clone(), support::demo("hello"))
            .await;
    };
    make().await;
    assert_eq!(status(s.addr(), "/api", &[]).await, StatusCode::OK);
    assert_eq!(
        status(s.addr(), "/api", &[]).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    let (code, v) = s
        .admin_call(Method::DELETE, "/admin/v1/tenants/api", "")
        .await;
    assert!(code.is_success(), "{code} {v}");
    make().await;
    assert_eq!(
        status(s.addr(), "/api", &[]).await,
        StatusCode::OK,
        "the deleted tenant's count"
    );
    assert_eq!(
        status(s.addr(), "/api", &[]).await,
        StatusCode::TOO_MANY_REQUESTS
    );
}
