//! The cache in front of guests (`[tenant.cache]`): what is stored and served without a guest,
//! what never is, variants, validators, invalidation, isolation between tenants and hosts.
//!
//! The guest (`cache_headers`) answers with the headers its query names and a body starting
//! with the instant it ran, so an answer from the cache is the first run's body, byte for byte,
//! and a guest that ran again gives another.

use bytes::Bytes;
use http::{Method, StatusCode};

use crate::support::{
    H2Conn, Reply, TestServer, metric_value, metric_value_or_zero, send, test_guest,
};

mod collapsing;
mod freshness;
mod keys;
mod space;

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
    s.wait_metric(crate::support::SLOTS_IN_USE, 1.0).await;
}

/// Waits until no guest holds a slot (the last one's teardown is over), so that
/// [`leader_running`] sees the next one.
async fn no_guest_running(s: &TestServer) {
    s.wait_metric_is(crate::support::SLOTS_IN_USE, 0.0, "a guest kept its slot")
        .await;
}

const FRESH: &str = "/c/page?h=cache-control:max-age%3D60";

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
