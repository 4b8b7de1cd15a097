//! The registry a fleet shares on object storage, against a real S3 server (versitygw, started
//! here on 127.0.0.1): the probe of a store's conditional writes passes on a store that keeps
//! them, and says clearly why it cannot check one it cannot reach.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{demo, tern_bin, tools_dir};

mod deploys;
mod lost_answers;
mod registry;
mod schedules;
mod shared;
mod tokens;

/// The versitygw release the suite runs (installed by scripts/test under [`tools_dir`]).
const VERSITYGW: &str = "versitygw-1.8.0";

const ACCESS_KEY: &str = "tern-test-access";
const SECRET_KEY: &str = "tern-test-secret";

/// A versitygw S3 server on 127.0.0.1 over a temporary directory with the bucket `fleet`,
/// stopped when dropped.
pub struct S3 {
    child: Child,
    root: tempfile::TempDir,
    port: u16,
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
}

impl S3 {
    pub fn start() -> Self {
        let root = tempfile::tempdir().unwrap();
        // A top-level directory is a bucket.
        std::fs::create_dir(root.path().join("fleet")).unwrap();
        let port = crate::support::free_port();
        let child = Self::spawn(root.path(), port);
        Self {
            child,
            root,
            port,
            endpoint: format!("http://127.0.0.1:{port}"),
        }
    }

    /// Stops the server (its objects stay on disk).
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts it again on the same port over the same objects.
    pub fn restart(&mut self) {
        self.child = Self::spawn(self.root.path(), self.port);
    }

    fn spawn(root: &Path, port: u16) -> Child {
        let bin = tools_dir().join(VERSITYGW).join("versitygw");
        assert!(
            bin.is_file(),
            "versitygw is not installed at {} (bash scripts/test installs it)",
            bin.display()
        );
        let child = Command::new(bin)
            .args(["--port", &format!("127.0.0.1:{port}")])
            .args(["--access", ACCESS_KEY, "--secret", SECRET_KEY, "--quiet"])
            .arg("posix")
            .arg(root)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start versitygw");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "versitygw did not start listening"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        child
    }

    /// The settings a client of this server needs, as object_store's keys.
    pub fn options(&self) -> Vec<(&'static str, String)> {
        vec![
            ("aws_access_key_id", ACCESS_KEY.into()),
            ("aws_secret_access_key", SECRET_KEY.into()),
            ("aws_region", "us-east-1".into()),
            ("aws_endpoint", self.endpoint.clone()),
            ("aws_allow_http", "true".into()),
        ]
    }

    /// The AWS settings a client of this server needs, for a `Command`.
    pub fn env(&self, cmd: &mut Command) {
        cmd.env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
            .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ENDPOINT_URL", &self.endpoint)
            .env("AWS_ALLOW_HTTP", "true");
    }
}

impl Drop for S3 {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn probe(s3: &S3, url: &str, change: impl FnOnce(&mut Command)) -> std::process::Output {
    let mut cmd = tern_bin();
    cmd.args(["registry", "probe", url])
        .current_dir(Path::new("/"));
    s3.env(&mut cmd);
    change(&mut cmd);
    cmd.output().expect("run tern registry probe")
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p.display().to_string());
        }
    }
    out
}

/// The admin token the replicas of a test fleet share.
const FLEET_TOKEN: &str = "fleet-test-token";

/// The registry the test fleets share.
const REGISTRY: &str = "s3://fleet/registry";

/// A `tern serve` replica of the fleet on `s3`, named `name`, keeping its data in `dir`
/// (checking the registry every 100 ms).
fn replica(s3: &S3, name: &str, dir: &Path) -> crate::support::TernProcess {
    replica_with(s3, name, dir, "", 100)
}

/// [`replica`] with more of its config file (`[server]` and `[tls.*]` settings), checking the
/// registry every `poll_ms`.
fn replica_with(
    s3: &S3,
    name: &str,
    dir: &Path,
    config: &str,
    poll_ms: u64,
) -> crate::support::TernProcess {
    replica_via(s3, None, name, dir, config, poll_ms, "2s")
}

/// [`replica_with`], reaching S3 at `endpoint` (a proxy in front of it) when given, with
/// requests to it timing out after `timeout` (`2s`).
fn replica_via(
    s3: &S3,
    endpoint: Option<&str>,
    name: &str,
    dir: &Path,
    config: &str,
    poll_ms: u64,
    timeout: &str,
) -> crate::support::TernProcess {
    std::fs::create_dir_all(dir).unwrap();
    let text = format!(
        "{config}\n[pool]\ninstances = 16\nmax_memory_mib = 64\n[registry]\npoll_interval_ms = {poll_ms}\n"
    );
    let config = dir.join("tern.toml");
    std::fs::write(&config, text).unwrap();
    let config = config.display().to_string();
    crate::support::TernProcess::serve_with(
        &["--config", &config, "--registry", REGISTRY],
        dir,
        |cmd| {
            s3.env(cmd);
            cmd.env("TERN_ADMIN_TOKEN", FLEET_TOKEN)
                .env("TERN_REPLICA", name);
            if let Some(endpoint) = endpoint {
                cmd.env("AWS_ENDPOINT_URL", endpoint)
                    .env("AWS_TIMEOUT", timeout);
            }
        },
    )
}

fn addr(a: &str) -> std::net::SocketAddr {
    a.parse().expect("an address")
}

async fn admin(
    r: &crate::support::TernProcess,
    method: http::Method,
    path: &str,
    body: impl Into<bytes::Bytes>,
) -> (http::StatusCode, serde_json::Value) {
    crate::support::admin_request(addr(&r.admin), FLEET_TOKEN, method, path, body.into()).await
}

async fn get(r: &crate::support::TernProcess, path: &str) -> crate::support::Reply {
    crate::support::get_at(addr(&r.addr), path).await
}

async fn get_admin(r: &crate::support::TernProcess, path: &str) -> crate::support::Reply {
    crate::support::get_at(addr(&r.admin), path).await
}

/// Waits until `r` answers `path` with a 200 whose body contains `needle`; how long it took.
async fn serves(r: &crate::support::TernProcess, path: &str, needle: &str) -> Duration {
    let started = Instant::now();
    loop {
        let reply = get(r, path).await;
        if reply.status == http::StatusCode::OK && reply.text().contains(needle) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{path} on {} still answers {} {:?}, not {needle:?}",
            r.addr,
            reply.status,
            reply.text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Creates tenant `name` on `path` through the admin listener at `at`.
async fn create(at: std::net::SocketAddr, name: &str, path: &str) {
    let spec = serde_json::json!({ "paths": [path] }).to_string();
    let (status, v) = crate::support::admin_request(
        at,
        FLEET_TOKEN,
        http::Method::PUT,
        &format!("/admin/v1/tenants/{name}"),
        spec.into(),
    )
    .await;
    assert!(status.is_success(), "create {name}: {status} {v}");
}

/// Deploys `wasm` to tenant `name` through the admin listener at `at`.
async fn deploy(
    at: std::net::SocketAddr,
    name: &str,
    wasm: &[u8],
) -> (http::StatusCode, serde_json::Value) {
    crate::support::admin_request(
        at,
        FLEET_TOKEN,
        http::Method::PUT,
        &format!("/admin/v1/tenants/{name}/module"),
        bytes::Bytes::copy_from_slice(wasm),
    )
    .await
}

/// Replicas `a` and `b` of the fleet on `s3` (data under `dir`), with tenant `site` on `/site`
/// created and deployed (`hello`) through a and served by both; the version deployed.
async fn site_on_two_replicas(
    s3: &S3,
    dir: &Path,
) -> (
    crate::support::TernProcess,
    crate::support::TernProcess,
    String,
) {
    let a = replica(s3, "a", &dir.join("a"));
    let b = replica(s3, "b", &dir.join("b"));
    create(addr(&a.admin), "site", "/site").await;
    let (status, v) = deploy(addr(&a.admin), "site", demo("hello")).await;
    assert_eq!(status, http::StatusCode::OK, "{v}");
    serves(&a, "/site", "Hello").await;
    serves(&b, "/site", "Hello").await;
    (a, b, v["version"].as_str().unwrap().to_string())
}

async fn metrics(r: &crate::support::TernProcess) -> String {
    get_admin(r, "/metrics").await.text()
}

/// A module unlike any other (its data differs by `n`), of about `kib` KiB.
fn module(n: usize, kib: usize) -> Vec<u8> {
    let filler = "x".repeat(kib * 1024);
    let data = format!("version {n} {filler}");
    let wat = crate::support::guest_wat(
        "(drop (call $status (i32.const 200))) (drop (call $write (i32.const 16) (i32.const 10)))",
        &data,
    );
    wat::parse_str(wat).unwrap()
}

/// A self-signed certificate for `host` and its key (PEM).
fn self_signed(host: &str) -> (String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec![host.to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    (cert.pem(), key.serialize_pem())
}

/// Waits until the TLS listener at `tls` presents, for `sni`, a certificate `check` accepts
/// (`None`: no handshake); panics after 20 s.
async fn presents(
    tls: &str,
    sni: &str,
    check: impl Fn(Option<&rustls::pki_types::CertificateDer<'static>>) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let got = crate::acme::presented(addr(tls), sni).await;
        if check(got.as_ref()) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{tls} did not present the expected certificate for {sni} within 20 s (got {})",
            if got.is_some() {
                "another"
            } else {
                "no handshake"
            }
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `method path` on replica `r`'s admin API, conditional on `if_match` when given.
async fn admin_if(
    r: &crate::support::TernProcess,
    method: http::Method,
    path: &str,
    body: impl Into<bytes::Bytes>,
    if_match: Option<&str>,
) -> (http::StatusCode, serde_json::Value) {
    let auth = format!("Bearer {FLEET_TOKEN}");
    let mut headers = vec![("authorization", auth.as_str())];
    if let Some(tag) = if_match {
        headers.push(("if-match", tag));
    }
    let reply =
        crate::support::send(addr(&r.admin), method, path, None, &headers, body.into()).await;
    let json = serde_json::from_slice(&reply.body).unwrap_or(serde_json::Value::Null);
    if let Some(tag) = json["etag"].as_str() {
        assert_eq!(
            reply.header("etag"),
            tag,
            "the ETag header and the JSON agree"
        );
    }
    (reply.status, json)
}

/// Tenant `name` as replica `r` describes it (`null` if it has none).
async fn tenant(r: &crate::support::TernProcess, name: &str) -> serde_json::Value {
    let (status, v) = admin(
        r,
        http::Method::GET,
        &format!("/admin/v1/tenants/{name}"),
        "",
    )
    .await;
    match status {
        http::StatusCode::OK => v,
        http::StatusCode::NOT_FOUND => serde_json::Value::Null,
        other => panic!("GET tenant {name}: {other} {v}"),
    }
}

/// A replica's `[server]`: a TLS listener too (for certificate uploads).
const TLS: &str = "[server]\ntls_listen = \"127.0.0.1:0\"\n";

/// Replica `a` (data under `dir/a`) reaching `s3` through a fault-injecting proxy, and the
/// proxy.
async fn replica_behind_a_proxy(
    s3: &S3,
    dir: &Path,
) -> (crate::support::TernProcess, crate::faults::S3Proxy) {
    let proxy = crate::faults::S3Proxy::start(&s3.endpoint).await;
    let a = replica_via(
        s3,
        Some(&proxy.endpoint),
        "a",
        &dir.join("a"),
        TLS,
        100,
        "2s",
    );
    (a, proxy)
}

/// Waits until replica `r` knows `n` other replicas to nudge.
async fn knows_peers(r: &crate::support::TernProcess, n: f64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while crate::support::metric_value(&metrics(r).await, "tern_registry_peers") < n {
        assert!(
            Instant::now() < deadline,
            "{} never learnt of {n} peer(s)",
            r.admin
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until `r` no longer answers `path` from its cache; how long that took.
async fn no_longer_cached(r: &crate::support::TernProcess, path: &str, since: Instant) -> Duration {
    loop {
        let reply = get(r, path).await;
        if !reply.header("cache-status").starts_with("tern; hit") {
            return since.elapsed();
        }
        assert!(
            since.elapsed() < Duration::from_secs(15),
            "{path} is still served from {}'s cache",
            r.addr
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Every line `r` logged so far (those a test already read and those still queued).
fn all_logged(r: &crate::support::TernProcess) -> String {
    let mut lines = r.lines.borrow().clone();
    lines.extend(r.log.try_iter());
    lines.join("\n")
}
