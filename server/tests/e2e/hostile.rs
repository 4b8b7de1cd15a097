//! The hostile suite: each guest of `server/guests` misbehaves in one way; the client gets the
//! documented status, and a well-behaved tenant served at the same time sees every request
//! succeed. Timing never decides a verdict; generous bounds only catch hangs.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, StatusCode};

use crate::support::{
    Conn, TestServer, metric_is, metric_value, metric_value_or_zero, raw, send, test_guest,
};

const GUESTS: [&str; 13] = [
    "loop_forever",
    "read_body_forever",
    "memory_bomb",
    "stack_overflow",
    "panic",
    "out_of_bounds",
    "bad_indirect_call",
    "bad_pointers",
    "output_flood",
    "exit_code",
    "env_dump",
    "cpu_burn",
    "canary",
];

/// One server with a tenant per hostile guest (at `/NAME`) and the demo hello at `/hello`.
async fn hostile_server() -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    let mut config = String::from("[pool]\ninstances = 16\nmax_memory_mib = 64\n");
    for g in GUESTS {
        test_guest(dir.path(), g);
        config.push_str(&format!(
            "[[tenant]]\nname = \"{g}\"\nmodule = \"{g}.wasm\"\npaths = [\"/{g}\"]\n"
        ));
        let limits = match g {
            "loop_forever" | "read_body_forever" => "timeout_ms = 300\n",
            "memory_bomb" => "max_memory_mib = 16\n",
            "output_flood" => "max_response_bytes = 1048576\nmax_response_headers = 50\n",
            "cpu_burn" => "timeout_ms = 10000\nmax_concurrency = 4\n",
            _ => "",
        };
        if g == "env_dump" {
            config.push_str("env = { ONLY_MINE = \"dump\" }\n");
        }
        config.push_str(&format!("[tenant.limits]\n{limits}"));
    }
    config.push_str(
        "[[tenant]]\nname = \"hello\"\nmodule = \"builtin:hello\"\npaths = [\"/hello\"]\n\
         env = { SECRET_OF_HELLO = \"never shown to others\" }\n",
    );
    TestServer::try_start_in(dir, &config).await.expect("start")
}

/// While `bad` runs, a neighbour tenant answers every request.
async fn with_neighbour<F: std::future::Future>(s: &TestServer, bad: F) -> F::Output {
    let addr = s.addr();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stop.clone();
    let neighbour = tokio::spawn(async move {
        let mut conn = Conn::open(addr).await;
        let mut n = 0;
        while !flag.load(std::sync::atomic::Ordering::Relaxed) || n < 5 {
            let r = conn.get("/hello").await;
            assert_eq!(
                r.status,
                StatusCode::OK,
                "neighbour request {n} failed: {}",
                r.text()
            );
            n += 1;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        n
    });
    let out = bad.await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let served = neighbour.await.expect("neighbour never failed");
    assert!(served >= 5);
    out
}

async fn expect(s: &TestServer, path: &str, status: StatusCode, body_has: &str) {
    with_neighbour(s, async {
        for _ in 0..3 {
            let r = s.get(path).await;
            assert_eq!(r.status, status, "{path}: {}", r.text());
            assert!(
                r.text().contains(body_has),
                "{path}: {:?} lacks {body_has:?}",
                r.text()
            );
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_hostile_guest_gets_its_status_and_the_neighbour_never_notices() {
    let s = hostile_server().await;
    expect(
        &s,
        "/loop_forever",
        StatusCode::GATEWAY_TIMEOUT,
        "time limit (300 ms)",
    )
    .await;
    expect(
        &s,
        "/memory_bomb",
        StatusCode::INTERNAL_SERVER_ERROR,
        "memory limit (16 MiB)",
    )
    .await;
    expect(
        &s,
        "/stack_overflow",
        StatusCode::INTERNAL_SERVER_ERROR,
        "call stack exhausted",
    )
    .await;
    expect(
        &s,
        "/panic",
        StatusCode::INTERNAL_SERVER_ERROR,
        "unreachable",
    )
    .await;
    expect(
        &s,
        "/out_of_bounds",
        StatusCode::INTERNAL_SERVER_ERROR,
        "out of bounds memory access",
    )
    .await;
    expect(
        &s,
        "/bad_indirect_call",
        StatusCode::INTERNAL_SERVER_ERROR,
        "guest trapped",
    )
    .await;
    for case in [
        "body_write",
        "header",
        "uri",
        "body_read",
        "info",
        "info_unavailable",
    ] {
        let path = format!("/bad_pointers?case={case}");
        expect(
            &s,
            &path,
            StatusCode::INTERNAL_SERVER_ERROR,
            "outside its memory",
        )
        .await;
    }
    expect(
        &s,
        "/output_flood?headers",
        StatusCode::INTERNAL_SERVER_ERROR,
        "header limit",
    )
    .await;
    expect(
        &s,
        "/exit_code?code=0",
        StatusCode::OK,
        "responded before exiting",
    )
    .await;
    expect(
        &s,
        "/exit_code?code=7",
        StatusCode::INTERNAL_SERVER_ERROR,
        "exited with status 7",
    )
    .await;

    // Each request counted once, by its outcome (`expect` sends three).
    let m = s.metrics().await;
    for (tenant, outcome, sent) in [
        ("loop_forever", "timeout", 3.0),
        ("memory_bomb", "memory_limit", 3.0),
        ("stack_overflow", "trap_stack_overflow", 3.0),
        ("panic", "trap_unreachable", 3.0),
        ("out_of_bounds", "trap_out_of_bounds", 3.0),
        ("bad_indirect_call", "trap_bad_indirect_call", 3.0),
        ("bad_pointers", "bad_pointer", 18.0),
        ("output_flood", "response_limit", 3.0),
        ("exit_code", "exit", 3.0),
        ("exit_code", "ok", 3.0),
    ] {
        let line =
            format!("tern_guest_outcomes_total{{outcome=\"{outcome}\",tenant=\"{tenant}\"}}");
        assert_eq!(metric_value(&m, &line), sent, "{line}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_flood_streams_then_aborts_the_response() {
    let s = hostile_server().await;
    let reply = with_neighbour(
        &s,
        raw(s.addr(), b"GET /output_flood HTTP/1.1\r\nhost: x\r\n\r\n"),
    )
    .await;
    let text = &reply[..reply.len().min(200)];
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
    assert!(text.contains("transfer-encoding: chunked"), "{text}");
    // The chunked body never gets its terminating zero-length chunk: the client knows it is cut.
    assert!(
        !reply.ends_with("0\r\n\r\n"),
        "aborted stream looked complete"
    );
    assert!(
        reply.len() <= 1_048_576 + 64 * 1024 + 4096,
        "{} bytes passed the limit",
        reply.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_for_a_body_that_never_comes_is_504() {
    let s = hostile_server().await;
    let request: &[u8] =
        b"POST /read_body_forever HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\nonly this";
    let reply = with_neighbour(&s, raw(s.addr(), request)).await;
    assert!(reply.starts_with("HTTP/1.1 504"), "{reply}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_sees_only_its_own_env_and_no_files() {
    let s = hostile_server().await;
    let r = s.get("/env_dump").await;
    assert_eq!(r.status, StatusCode::OK);
    let text = r.text();
    assert!(text.contains("ONLY_MINE=dump\n"), "{text}");
    assert!(!text.contains("SECRET_OF_HELLO"), "{text}");
    assert!(
        !text.contains("PATH=") && !text.contains("HOME="),
        "host env leaked: {text}"
    );
    assert!(!text.contains("can read"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_bound_guests_on_every_worker_leave_the_reactor_and_neighbours_responsive() {
    let s = hostile_server().await;
    let addr = s.addr();
    // Four CPU-bound guests (two per worker thread) for 6 s each: far longer than the checks.
    let burners: Vec<_> = (0..4)
        .map(|_| {
            tokio::spawn(async move {
                send(
                    addr,
                    Method::GET,
                    "/cpu_burn?ms=6000",
                    None,
                    &[],
                    Bytes::new(),
                )
                .await
            })
        })
        .collect();
    // Wait (bounded, to catch hangs) until all four burners hold a slot.
    s.wait_metric_is(
        crate::support::SLOTS_IN_USE,
        4.0,
        "burners never all started",
    )
    .await;
    // Admin endpoints and a light tenant answer while the burners run (bounds only catch hangs).
    let started = std::time::Instant::now();
    for _ in 0..10 {
        let h = tokio::time::timeout(
            Duration::from_secs(5),
            send(s.admin(), Method::GET, "/healthz", None, &[], Bytes::new()),
        )
        .await
        .expect("/healthz hung");
        assert_eq!(h.status, StatusCode::OK);
        let r = tokio::time::timeout(Duration::from_secs(5), s.get("/hello"))
            .await
            .expect("hello hung");
        assert_eq!(r.status, StatusCode::OK);
    }
    let m = s.metrics().await;
    assert!(
        metric_is(&m, crate::support::SLOTS_IN_USE, 4.0),
        "burners finished before 10 light requests did ({:?}): {}",
        started.elapsed(),
        m.lines()
            .filter(|l| l.starts_with("tern_pool_slots"))
            .collect::<Vec<_>>()
            .join("; ")
    );
    for b in burners {
        let r = b.await.unwrap();
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_state_crosses_requests_or_tenants_over_thousands_of_requests() {
    let dir = tempfile::tempdir().unwrap();
    test_guest(dir.path(), "canary");
    // Three tenants share two slots, so every slot is reused by every module.
    let config = "[pool]\ninstances = 2\n\
        [[tenant]]\nname = \"a\"\nmodule = \"canary.wasm\"\npaths = [\"/a\"]\n[tenant.limits]\nmax_concurrency = 2\n\
        [[tenant]]\nname = \"b\"\nmodule = \"canary.wasm\"\npaths = [\"/b\"]\n[tenant.limits]\nmax_concurrency = 2\n\
        [[tenant]]\nname = \"c\"\nmodule = \"builtin:counter\"\npaths = [\"/c\"]\n";
    let s = TestServer::try_start_in(dir, config).await.expect("start");
    let addr = s.addr();
    let clients: Vec<_> = ["/a", "/b", "/c"]
        .into_iter()
        .map(|path| {
            tokio::spawn(async move {
                let mut conn = Conn::open(addr).await;
                for i in 0..1500 {
                    let r = conn.get(path).await;
                    let want = if path == "/c" { "1\n" } else { "clean" };
                    assert_eq!(
                        (r.status, r.text().as_str()),
                        (StatusCode::OK, want),
                        "{path} #{i}"
                    );
                }
            })
        })
        .collect();
    for c in clients {
        c.await.expect("no request saw another request's state");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_exhaustion_and_tenant_caps_answer_503_with_retry_after() {
    let dir = tempfile::tempdir().unwrap();
    test_guest(dir.path(), "cpu_burn");
    let config = "[pool]\ninstances = 3\nqueue_timeout_ms = 200\n\
        [[tenant]]\nname = \"burn\"\nmodule = \"cpu_burn.wasm\"\npaths = [\"/burn\"]\n\
        [tenant.limits]\ntimeout_ms = 10000\nmax_concurrency = 2\n\
        [[tenant]]\nname = \"burn2\"\nmodule = \"cpu_burn.wasm\"\npaths = [\"/burn2\"]\n\
        [tenant.limits]\ntimeout_ms = 10000\n\
        [[tenant]]\nname = \"hello\"\nmodule = \"builtin:hello\"\npaths = [\"/hello\"]\n";
    let s = TestServer::try_start_in(dir, config).await.expect("start");
    let addr = s.addr();
    let burn = |path: &'static str| {
        tokio::spawn(async move { send(addr, Method::GET, path, None, &[], Bytes::new()).await })
    };
    let a = burn("/burn?ms=5000");
    let b = burn("/burn?ms=5000");
    slots_in_use(&s, 2).await;
    // The tenant's cap (2) is reached: its third request waits, then gets 503.
    let r = s.get("/burn?ms=10").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text());
    assert_eq!(r.header("retry-after"), "1");
    assert!(
        r.text().contains("at its limit of 2 concurrent requests"),
        "{}",
        r.text()
    );
    // Another tenant takes the last slot; now the pool is exhausted for everyone.
    let c = burn("/burn2?ms=5000");
    slots_in_use(&s, 3).await;
    let r = s.get("/hello").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text());
    assert_eq!(r.header("retry-after"), "1");
    assert!(r.text().contains("instance slots are busy"), "{}", r.text());
    for t in [a, b, c] {
        assert_eq!(t.await.unwrap().status, StatusCode::OK);
    }
    assert_eq!(
        s.get("/hello").await.status,
        StatusCode::OK,
        "slots come back"
    );
    let m = s.metrics().await;
    assert!(
        metric_is(
            &m,
            r#"tern_guest_outcomes_total{outcome="overload",tenant="hello"}"#,
            1.0
        ),
        "{m}"
    );
}

/// A run that uses its first time slice up is counted for its tenant
/// (`tern_guest_sliced_total`); runs that end within it are not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_past_their_first_time_slice_are_counted_by_tenant() {
    let dir = tempfile::tempdir().unwrap();
    test_guest(dir.path(), "cpu_burn");
    let config = "[[tenant]]\nname = \"burn\"\nmodule = \"cpu_burn.wasm\"\npaths = [\"/burn\"]\n\
        [tenant.limits]\ntimeout_ms = 20000\n\
        [[tenant]]\nname = \"hello\"\nmodule = \"builtin:hello\"\npaths = [\"/hello\"]\n";
    let s = TestServer::try_start_in(dir, config).await.expect("start");
    let sliced = |m: &str, tenant: &str, n: f64| {
        metric_is(
            m,
            &format!("tern_guest_sliced_total{{tenant=\"{tenant}\"}}"),
            n,
        )
    };
    for _ in 0..3 {
        assert_eq!(s.get("/hello").await.status, StatusCode::OK);
    }
    // 10 rounds of the burn's work: 0.2-0.3 ms of CPU, within the first slice (2 ms after
    // the first tick).
    let r = s.get("/burn?work=10").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let m = s.metrics().await;
    assert!(sliced(&m, "burn", 0.0) && sliced(&m, "hello", 0.0), "{m}");
    // 2,000 rounds: about 20 ms of CPU, past it whatever else runs on the machine (the slice
    // is counted in the worker thread's CPU time, not wall time).
    let r = s.get("/burn?work=2000").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let m = s.metrics().await;
    assert!(sliced(&m, "burn", 1.0), "{m}");
    assert!(sliced(&m, "hello", 0.0), "{m}");
}

/// A guest that used its first time slice up goes on before its tenant starts the requests
/// that arrived meanwhile: they wait in line (the `queue` phase, in `Server-Timing`) instead
/// of each running a slice ahead of it, and each ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_guest_goes_on_before_its_tenants_next_requests_begin() {
    let dir = tempfile::tempdir().unwrap();
    test_guest(dir.path(), "cpu_burn");
    let config = "[server]\nworker_threads = 1\n\
        [[tenant]]\nname = \"burn\"\nmodule = \"cpu_burn.wasm\"\npaths = [\"/burn\"]\n\
        [tenant.limits]\ntimeout_ms = 20000\n";
    let s = TestServer::try_start_in(dir, config).await.expect("start");
    let sliced = r#"tern_guest_sliced_total{tenant="burn"}"#;
    // A fixed amount of work that takes one guest alone at least 6 ms of run (the least of
    // three) and that each of the three used its first slice up with (a slice is CPU time: on
    // a busy machine 6 ms of wall time may be less).
    let mut work = 100u64;
    loop {
        let before = metric_value_or_zero(&s.metrics().await, sliced);
        let least = least_run_ms(&s, work).await;
        let cut = metric_value_or_zero(&s.metrics().await, sliced) - before;
        if least >= 6.0 && cut >= 3.0 {
            break;
        }
        assert!(
            work < 1_000_000,
            "work {work}: run {least} ms, {cut} of 3 cut"
        );
        work = (work as f64 * 8.0 / least.clamp(0.1, 6.0)).ceil() as u64;
    }
    let before = metric_value_or_zero(&s.metrics().await, sliced);
    // Six at once on the one worker: the first is cut while the others arrive.
    let path: &'static str = Box::leak(format!("/burn?work={work}").into_boxed_str());
    let addr = s.addr();
    let runs: Vec<_> = (0..6)
        .map(|_| {
            tokio::spawn(
                async move { send(addr, Method::GET, path, None, &[], Bytes::new()).await },
            )
        })
        .collect();
    let mut queued = Vec::new();
    for run in runs {
        let r = run.await.unwrap();
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        queued.push(phase_ms(r.header("server-timing"), "queue"));
    }
    // Without the line none waits before its run (the pool and the tenant have room for all
    // six): each queue is microseconds. In line, the last waits for the turns of those ahead.
    let cut = metric_value_or_zero(&s.metrics().await, sliced) - before;
    assert!(cut >= 1.0, "none of the six was cut");
    let longest = queued.iter().copied().fold(0.0, f64::max);
    assert!(longest >= 2.0, "queue phases (ms): {queued:?}");
}

/// Guests interleaved on one busy worker wait for it between their time slices; that wait is
/// the server's, not the guest's, so a guest within its own time limit is not cut off (counted
/// in wall time, such guests got `504`), and `Server-Timing` shows the wait as `ready`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_spent_waiting_for_a_busy_worker_is_not_counted_against_a_guests_limit() {
    let dir = tempfile::tempdir().unwrap();
    test_guest(dir.path(), "cpu_burn");
    // The tenant's guests run in turns on the one worker: the last of a batch waits in line
    // for ~750 ms of the others' work, past the pool's default bound on that wait (1 s) when
    // the machine is slower than measured (other tests running): a `503` that is not what
    // this test is about, so the bound is raised.
    let config = "[server]\nworker_threads = 1\n[pool]\ninstances = 40\nqueue_timeout_ms = 10000\n\
        [[tenant]]\nname = \"burn\"\nmodule = \"cpu_burn.wasm\"\npaths = [\"/burn\"]\n\
        [tenant.limits]\ntimeout_ms = 500\nmax_concurrency = 40\n";
    let s = TestServer::try_start_in(dir, config).await.expect("start");
    // A fixed amount of work that takes one guest alone 40-200 ms (the least of three runs),
    // scaled towards 60 ms until it does: a machine busy with other work can run the same
    // work several times slower from one measure to the next.
    let mut work = 100u64;
    let mut measured = Vec::new();
    let alone_ms = loop {
        let least = least_run_ms(&s, work).await;
        measured.push((work, least));
        if (40.0..200.0).contains(&least) {
            break least;
        }
        assert!(
            measured.len() < 10,
            "no work takes one guest alone 40-200 ms (work, ms): {measured:?}"
        );
        work = ((work as f64 * 60.0 / least.max(0.5)).ceil() as u64).max(1);
    };
    // Enough of them at once for ~750 ms of work on the one worker: the last ones end past
    // the 500 ms limit in wall time, and well before the 2 s bound (4 x the limit) even on a
    // busy machine. If none ended past the limit (the guest ran faster than measured alone),
    // twice as many.
    let mut n = ((750.0 / alone_ms).ceil() as usize).clamp(4, 40);
    let path: &'static str = Box::leak(format!("/burn?work={work}").into_boxed_str());
    let addr = s.addr();
    let waited = loop {
        let runs: Vec<_> = (0..n)
            .map(|_| {
                tokio::spawn(async move {
                    let sent = std::time::Instant::now();
                    let r = send(addr, Method::GET, path, None, &[], Bytes::new()).await;
                    (r, sent.elapsed())
                })
            })
            .collect();
        let mut slowest = Duration::ZERO;
        let mut waited = 0;
        for run in runs {
            let (r, took) = run.await.unwrap();
            assert_eq!(
                r.status,
                StatusCode::OK,
                "{n} guests of {alone_ms} ms: {}",
                r.text()
            );
            slowest = slowest.max(took);
            if r.header("server-timing").contains(", ready;dur=") {
                waited += 1;
            }
        }
        if slowest > Duration::from_millis(500) {
            break waited;
        }
        assert!(
            n < 40,
            "{n} guests of {alone_ms} ms all ended within the limit ({slowest:?}): nothing tested"
        );
        n = (n * 2).min(40);
    };
    assert!(waited > 0, "no answer showed a `ready` phase");
    let m = s.metrics().await;
    assert!(
        metric_value(
            &m,
            r#"tern_request_phase_duration_seconds_count{deployment="current",phase="ready"}"#
        ) > 0.0,
        "{m}"
    );
    let timeouts = r#"tern_guest_outcomes_total{outcome="timeout",tenant="burn"}"#;
    assert_eq!(metric_value_or_zero(&m, timeouts), 0.0, "{m}");
}

/// The least `run` phase of three `/burn?work={work}` requests one after another, in
/// milliseconds.
async fn least_run_ms(s: &TestServer, work: u64) -> f64 {
    let mut least = f64::MAX;
    for _ in 0..3 {
        let r = s.get(&format!("/burn?work={work}")).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        least = least.min(phase_ms(r.header("server-timing"), "run"));
    }
    least
}

/// The duration of `phase` in a `Server-Timing` value, in milliseconds.
fn phase_ms(timing: &str, phase: &str) -> f64 {
    timing
        .split(", ")
        .find_map(|p| p.strip_prefix(&format!("{phase};dur=")))
        .and_then(|d| d.parse().ok())
        .unwrap_or_else(|| panic!("no {phase} in {timing:?}"))
}

/// Waits until `n` instance slots are in use (bounded at 10 s, to catch hangs).
async fn slots_in_use(s: &TestServer, n: u32) {
    let want = format!(r#"tern_pool_slots{{kind="instances",state="in_use"}} {n}"#);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !s.metrics().await.contains(&want) {
        assert!(
            std::time::Instant::now() < deadline,
            "never {n} slots in use"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
