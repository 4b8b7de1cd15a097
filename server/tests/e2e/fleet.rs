//! The registry a fleet shares on object storage, against a real S3 server (versitygw, started
//! here on 127.0.0.1): the probe of a store's conditional writes passes on a store that keeps
//! them, and says clearly why it cannot check one it cannot reach.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{demo, tern_bin, tools_dir};

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

#[test]
fn the_probe_finds_a_real_s3_server_keeps_conditional_writes_and_names_what_it_cannot_reach() {
    let s3 = S3::start();
    let out = probe(&s3, "s3://fleet/registry", |_| {});
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for check in [
        "create-if-absent",
        "update-if-match",
        "conditional-read",
        "create-race",
        "update-race",
    ] {
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with("ok") && l.contains(check)),
            "{check}: {stdout}"
        );
    }
    assert!(
        stdout.contains("8 writers created one name at once: 1 succeeded"),
        "{stdout}"
    );
    // It leaves no object behind.
    let left = walk(&s3.root.path().join("fleet"));
    assert!(left.is_empty(), "{left:?}");

    // Wrong credentials, a bucket that does not exist: nothing could be checked, said so.
    let out = probe(&s3, "s3://fleet/registry", |c| {
        c.env("AWS_SECRET_ACCESS_KEY", "wrong");
    });
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cannot write to the store"), "{stderr}");
    let out = probe(&s3, "s3://no-such-bucket/registry", |_| {});
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot write to the store"));
    // Not a store URL at all.
    let out = probe(&s3, "ftp://fleet/registry", |_| {});
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not supported"));
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_objects_on_a_real_s3_server_are_digest_checked_and_the_manifest_swapped_by_one_writer()
 {
    use tern::fleet::objects::{Remote, RemoteError, open_with};
    let s3 = S3::start();
    let options = s3.options();
    let options: Vec<(&str, &str)> = options.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (store, prefix) = open_with("s3://fleet/registry", &options).unwrap();
    let remote = Remote::new(store, prefix);

    // A blob is written once, named by its digest, and read back whole.
    let wasm = bytes::Bytes::from(vec![7u8; 100_000]);
    let hash = remote.put_blob(wasm.clone()).await.unwrap();
    assert_eq!(remote.put_blob(wasm.clone()).await.unwrap(), hash);
    assert_eq!(remote.get_blob(&hash).await.unwrap(), wasm);
    // Changed behind the registry's back (on the S3 server's disk): refused, never used.
    let on_disk = s3.root.path().join("fleet/registry/blobs").join(&hash);
    std::fs::write(&on_disk, b"tampered").unwrap();
    let e = remote.get_blob(&hash).await.unwrap_err();
    assert!(matches!(e, RemoteError::Damaged(_)), "{e}");
    assert!(e.to_string().contains("do not match their digest"), "{e}");

    // Two writers change the manifest from the same version at once (each adding its own
    // tenant): one wins, one is told and nothing of the winner's is lost.
    // Each change records its own id.
    let with_tenant = |name: &str, change: &str| -> tern::datadir::Manifest {
        serde_json::from_value(serde_json::json!({
            "format": tern::datadir::MANIFEST_FORMAT,
            "tenants": { name: { "spec": {}, "current": null, "previous": null, "created_at": 1 } },
            "changes": [change],
        }))
        .unwrap()
    };
    let base = remote
        .put_manifest(&tern::datadir::Manifest::default(), None, "first")
        .await
        .unwrap()
        .version()
        .unwrap();
    let (a, b) = (remote.clone(), remote.clone());
    let (base_a, base_b) = (base.clone(), base.clone());
    let (ma, mb) = (with_tenant("a", "change-a"), with_tenant("b", "change-b"));
    let results = tokio::join!(
        tokio::spawn(async move { a.put_manifest(&ma, Some(&base_a), "change-a").await }),
        tokio::spawn(async move { b.put_manifest(&mb, Some(&base_b), "change-b").await }),
    );
    let results = [results.0.unwrap(), results.1.unwrap()];
    assert_eq!(
        results.iter().filter(|r| r.is_ok()).count(),
        1,
        "{results:?}"
    );
    assert!(
        results
            .iter()
            .any(|r| matches!(r, Err(RemoteError::Conflict(_)))),
        "{results:?}"
    );
    let (stored, now) = remote.manifest().await.unwrap().expect("a manifest");
    let winner = if results[0].is_ok() { "a" } else { "b" };
    assert_eq!(stored.tenants.keys().collect::<Vec<_>>(), [winner]);
    // A watcher holding the new version learns that nothing changed from one small request.
    assert!(
        remote
            .manifest_if_changed(Some(&now))
            .await
            .unwrap()
            .is_none()
    );

    // The store goes away: said so, distinctly from a conflict.
    drop(s3);
    let e = remote.manifest().await.unwrap_err();
    assert!(matches!(e, RemoteError::Unreachable(_)), "{e}");
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
    replica_via(s3, None, name, dir, config, poll_ms)
}

/// [`replica_with`], reaching S3 at `endpoint` (a proxy in front of it) when given, with
/// requests to it timing out after 2 s.
fn replica_via(
    s3: &S3,
    endpoint: Option<&str>,
    name: &str,
    dir: &Path,
    config: &str,
    poll_ms: u64,
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
                    .env("AWS_TIMEOUT", "2s");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deploy_on_any_replica_is_served_by_all_and_a_later_replica_joins_without_compiling() {
    let s3 = S3::start();
    let dirs = tempfile::tempdir().unwrap();
    // Created and deployed on a: served by b.
    let (a, b, v1) = site_on_two_replicas(&s3, dirs.path()).await;

    // Deployed on b: served by a; rolled back on a: served by b again.
    let (status, v) = deploy(addr(&b.admin), "site", demo("echo")).await;
    assert_eq!(status, http::StatusCode::OK, "{v}");
    assert_eq!(v["previous"], v1.as_str(), "{v}");
    serves(&a, "/site", "GET /site").await;
    let (status, v) = admin(
        &a,
        http::Method::POST,
        "/admin/v1/tenants/site/rollback",
        "",
    )
    .await;
    assert_eq!(status, http::StatusCode::OK, "{v}");
    assert_eq!(v["version"], v1.as_str());
    serves(&b, "/site", "Hello").await;

    // Changes to different tenants on both replicas at once: none is lost (a change that
    // lost the race to the registry is made again on top of the winner's).
    let mut jobs = tokio::task::JoinSet::new();
    for (r, side) in [(&a, "a"), (&b, "b")] {
        let at = addr(&r.admin);
        for i in 0..4 {
            let name = format!("t-{side}-{i}");
            jobs.spawn(async move {
                create(at, &name, &format!("/{name}")).await;
                deploy(at, &name, demo("hello")).await
            });
        }
    }
    for (status, v) in jobs.join_all().await {
        assert_eq!(status, http::StatusCode::OK, "{v}");
    }
    for side in ["a", "b"] {
        for i in 0..4 {
            serves(&a, &format!("/t-{side}-{i}"), "Hello").await;
            serves(&b, &format!("/t-{side}-{i}"), "Hello").await;
        }
    }

    // The same tenant deployed on both at once: each deploy succeeds in turn or is told it
    // lost (409); nothing else, and both replicas end up serving the same version.
    let (ra, rb) = tokio::join!(
        deploy(addr(&a.admin), "site", demo("json")),
        deploy(addr(&b.admin), "site", demo("counter"))
    );
    for (status, v) in [&ra, &rb] {
        assert!(
            *status == http::StatusCode::OK || *status == http::StatusCode::CONFLICT,
            "{status} {v}"
        );
    }
    assert!(ra.0 == http::StatusCode::OK || rb.0 == http::StatusCode::OK);
    for (status, v) in [&ra, &rb] {
        if *status == http::StatusCode::CONFLICT {
            let e = v["error"].as_str().unwrap();
            assert!(
                e.contains("another replica at the same time; nothing was written")
                    || e.contains("kept changing during this change; nothing was written"),
                "{v}"
            );
        }
    }

    // The fleet view: both replicas report, every tenant converged.
    let started = Instant::now();
    let view = loop {
        let (status, view) = admin(&b, http::Method::GET, "/admin/v1/fleet", "").await;
        assert_eq!(status, http::StatusCode::OK, "{view}");
        let tenants = view["tenants"].as_object().unwrap();
        if view["replicas"].as_array().unwrap().len() == 2
            && tenants.len() == 9
            && tenants.values().all(|t| t["converged"] == true)
        {
            break view;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{view}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(view["registry"], REGISTRY);
    assert_eq!(view["tenants"]["site"]["serving"], 2, "{view}");
    let site = view["tenants"]["site"]["version"]
        .as_str()
        .unwrap()
        .to_string();
    // `tern tenants` shows it too.
    let out = crate::support::ran(
        crate::support::tern_bin()
            .args(["tenants", "--server", &format!("http://{}", b.admin)])
            .env("TERN_ADMIN_TOKEN", FLEET_TOKEN),
    );
    let table = String::from_utf8_lossy(&out.stdout);
    let row = table.lines().find(|l| l.starts_with("site ")).unwrap();
    assert!(
        row.contains(&site[..8]) && row.contains("(2/2 replicas)"),
        "{table}"
    );

    // A replica started later serves everything at once, from artifacts the others compiled.
    let c = replica(&s3, "c", &dirs.path().join("c"));
    let reply = get(&c, "/t-b-3").await;
    assert_eq!(reply.status, http::StatusCode::OK);
    let m = metrics(&c).await;
    assert_eq!(
        crate::support::metric_value(&m, "tern_module_compile_duration_seconds_count"),
        0.0,
        "the later replica compiled"
    );
    assert!(
        crate::support::metric_value(&m, "tern_registry_artifacts_total{outcome=\"downloaded\"}")
            >= 2.0,
        "{m}"
    );
    let (_, v) = admin(&c, http::Method::GET, "/admin/v1/tenants/site", "").await;
    assert_eq!(v["current"]["id"], site.as_str(), "{v}");
    let (_, view) = admin(&a, http::Method::GET, "/admin/v1/fleet", "").await;
    assert_eq!(view["replicas"].as_array().unwrap().len(), 3, "{view}");

    // A replica that stops (SIGTERM) leaves the fleet view.
    let mut c = c;
    crate::support::ran(Command::new("kill").args(["-TERM", &c.child.id().to_string()]));
    assert!(c.child.wait().unwrap().success());
    let (_, view) = admin(&a, http::Method::GET, "/admin/v1/fleet", "").await;
    let names: Vec<&str> = view["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["replica"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a", "b"], "{view}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_registry_down_replicas_keep_serving_deploys_are_503_and_a_restart_serves_the_snapshot()
 {
    let mut s3 = S3::start();
    let dirs = tempfile::tempdir().unwrap();
    let (a, b, _) = site_on_two_replicas(&s3, dirs.path()).await;

    s3.stop();
    // Both keep serving; a deploy or a new tenant is refused with 503 and says why.
    serves(&a, "/site", "Hello").await;
    serves(&b, "/site", "Hello").await;
    let (status, v) = deploy(addr(&b.admin), "site", demo("echo")).await;
    assert_eq!(status, http::StatusCode::SERVICE_UNAVAILABLE, "{v}");
    let error = v["error"].as_str().unwrap();
    assert!(
        error.contains("cannot be reached") && error.contains(REGISTRY),
        "{error}"
    );
    let spec = serde_json::json!({ "paths": ["/other"] }).to_string();
    let (status, _) = admin(&a, http::Method::PUT, "/admin/v1/tenants/other", spec).await;
    assert_eq!(status, http::StatusCode::SERVICE_UNAVAILABLE);
    serves(&b, "/site", "Hello").await;
    let ready = get_admin(&b, "/readyz").await;
    assert_eq!(ready.status, http::StatusCode::OK, "{}", ready.text());
    // b's watch meets the registry down (waited for, not slept on).
    let deadline = Instant::now() + Duration::from_secs(10);
    while crate::support::metric_value_or_zero(
        &metrics(&b).await,
        "tern_registry_syncs_total{outcome=\"unreachable\"}",
    ) < 1.0
    {
        assert!(Instant::now() < deadline, "b never met the registry down");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // b restarted while the registry is down serves its snapshot of it.
    drop(b);
    let b = replica(&s3, "b", &dirs.path().join("b"));
    serves(&b, "/site", "Hello").await;
    assert_eq!(get_admin(&b, "/readyz").await.status, http::StatusCode::OK);
    // A replica with nothing to serve is not ready until it has read the registry.
    let d = replica(&s3, "d", &dirs.path().join("d"));
    let not_ready = get_admin(&d, "/readyz").await;
    assert_eq!(not_ready.status, http::StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        not_ready.text().contains("registry"),
        "{}",
        not_ready.text()
    );

    // The registry back: d reads it and serves, a deploy on b reaches a.
    s3.restart();
    serves(&d, "/site", "Hello").await;
    assert_eq!(get_admin(&d, "/readyz").await.status, http::StatusCode::OK);
    let (status, v) = deploy(addr(&b.admin), "site", demo("echo")).await;
    assert_eq!(status, http::StatusCode::OK, "{v}");
    serves(&a, "/site", "GET /site").await;
    serves(&d, "/site", "GET /site").await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_mid_deploy_leaves_the_registry_consistent_and_tampered_artifacts_are_not_run()
 {
    use sha2::Digest as _;
    use tern::fleet::objects::{Remote, open_with};
    let s3 = S3::start();
    let dirs = tempfile::tempdir().unwrap();
    let mut a = replica(&s3, "a", &dirs.path().join("a"));
    create(addr(&a.admin), "site", "/site").await;
    let (status, v) = deploy(addr(&a.admin), "site", &module(0, 1)).await;
    assert_eq!(status, http::StatusCode::OK, "{v}");

    // kill -9 at each moment of a deploy, each seen to have come (never guessed with a
    // sleep): half the upload sent, all of it sent, the module stored in the registry, the
    // manifest naming it. A restart then serves what the registry names.
    let options = s3.options();
    let options: Vec<(&str, &str)> = options.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (store, prefix) = open_with(REGISTRY, &options).unwrap();
    let remote = Remote::new(store, prefix);
    async fn current(remote: &Remote) -> tern::datadir::Version {
        let (manifest, _) = remote.manifest().await.unwrap().expect("a manifest");
        manifest.tenants["site"]
            .current
            .clone()
            .expect("a current version")
    }
    let mut served = 0;
    for (i, moment) in [
        "half the upload sent",
        "the upload sent",
        "the module stored",
        "the manifest names it",
    ]
    .into_iter()
    .enumerate()
    {
        let i = i + 1;
        let wasm = module(i, 40);
        let hash = format!("{:x}", sha2::Sha256::digest(&wasm));
        let mut conn = tokio::net::TcpStream::connect(addr(&a.admin))
            .await
            .unwrap();
        let head = format!(
            "PUT /admin/v1/tenants/site/module HTTP/1.1\r\nhost: x\r\n\
             authorization: Bearer {FLEET_TOKEN}\r\ncontent-length: {}\r\n\r\n",
            wasm.len()
        );
        use tokio::io::AsyncWriteExt;
        conn.write_all(head.as_bytes()).await.unwrap();
        let half = wasm.len() / 2;
        conn.write_all(&wasm[..half]).await.unwrap();
        if i > 1 {
            conn.write_all(&wasm[half..]).await.unwrap();
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let came = match i {
                3 => remote.get_blob(&hash).await.is_ok(),
                4 => current(&remote).await.module == hash,
                _ => true,
            };
            if came {
                break;
            }
            assert!(Instant::now() < deadline, "{moment}: never came");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        crate::support::ran(Command::new("kill").args(["-KILL", &a.child.id().to_string()]));
        let _ = a.child.wait();
        drop(conn);
        a = replica(&s3, "a", &dirs.path().join("a"));
        // The new version is current only once its manifest is written; whichever it is, the
        // restarted replica serves it.
        let now = current(&remote).await;
        match i {
            1 => assert_ne!(now.module, hash, "{moment}: a half upload was deployed"),
            4 => assert_eq!(now.module, hash, "{moment}: the deploy was lost"),
            _ => {}
        }
        if now.module == hash {
            served = i;
        }
        let r = get(&a, "/site").await;
        assert_eq!(r.status, http::StatusCode::OK, "{moment}: {}", r.text());
        assert_eq!(
            r.text(),
            format!("version {served} "),
            "{moment}: not what the registry names"
        );
    }

    // The registry names only objects that are there and whole.
    let (manifest, _) = remote.manifest().await.unwrap().expect("a manifest");
    let site = &manifest.tenants["site"];
    for v in site.current.iter().chain(&site.previous) {
        remote.get_blob(&v.module).await.expect("a whole module");
    }
    // A new replica serves the same version.
    let b = replica(&s3, "b", &dirs.path().join("b"));
    let want = site.current.as_ref().unwrap().id.clone();
    let (_, v) = admin(&b, http::Method::GET, "/admin/v1/tenants/site", "").await;
    assert_eq!(v["current"]["id"], want.as_str(), "{v}");
    assert_eq!(get(&b, "/site").await.status, http::StatusCode::OK);

    // Every compiled artifact in the registry changed on the S3 server's disk (as by someone
    // with write access to the bucket but not the fleet's token): a new replica refuses them,
    // compiles the module itself, and serves it.
    let artifacts = s3.root.path().join("fleet/registry/artifacts");
    let mut changed = 0;
    for e in std::fs::read_dir(&artifacts).unwrap().flatten() {
        let mut bytes = std::fs::read(e.path()).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        std::fs::write(e.path(), bytes).unwrap();
        changed += 1;
    }
    assert!(changed >= 1);
    let c = replica(&s3, "c", &dirs.path().join("c"));
    let reply = get(&c, "/site").await;
    assert_eq!(reply.status, http::StatusCode::OK);
    assert!(reply.text().starts_with("version "), "{}", reply.text());
    let m = metrics(&c).await;
    assert_eq!(
        crate::support::metric_value(&m, "tern_registry_artifacts_total{outcome=\"refused\"}"),
        1.0,
        "{m}"
    );
    assert_eq!(
        crate::support::metric_value(&m, "tern_module_compile_duration_seconds_count"),
        1.0
    );
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_nudges_the_other_replicas_so_they_need_not_wait_for_their_poll() {
    let s3 = S3::start();
    let root = tempfile::tempdir().unwrap();
    // A minute between polls: b can serve a's deploy within the test's 20 s only if a tells it.
    let a = replica_with(&s3, "a", &root.path().join("a"), "", 60_000);
    let b = replica_with(&s3, "b", &root.path().join("b"), "", 60_000);
    // b's first report nudged a, which then read who to nudge.
    let deadline = Instant::now() + Duration::from_secs(20);
    while crate::support::metric_value(&metrics(&a).await, "tern_registry_peers") < 1.0 {
        assert!(Instant::now() < deadline, "a never learnt of b");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        crate::support::metric_value(
            &metrics(&a).await,
            "tern_registry_nudges_total{outcome=\"received\"}"
        ) >= 1.0
    );
    create(addr(&a.admin), "nudged", "/nudged").await;
    let (status, v) = deploy(addr(&a.admin), "nudged", demo("hello")).await;
    assert_eq!(status, http::StatusCode::OK, "{v}");
    serves(&b, "/nudged", "Hello").await;
    let sent = metrics(&a).await;
    assert!(
        crate::support::metric_value(&sent, "tern_registry_nudges_total{outcome=\"sent\"}") >= 2.0,
        "{sent}"
    );
    assert!(
        crate::support::metric_value(
            &metrics(&b).await,
            "tern_registry_nudges_total{outcome=\"received\"}"
        ) >= 2.0
    );
    // A nudge needs the fleet's token, and a server outside a fleet has nothing to sync.
    let (status, _) = crate::support::admin_request(
        addr(&b.admin),
        "wrong-token",
        http::Method::POST,
        "/admin/v1/fleet/sync",
        bytes::Bytes::new(),
    )
    .await;
    assert_eq!(status, http::StatusCode::UNAUTHORIZED);
    let (status, reply) = admin(&b, http::Method::GET, "/admin/v1/fleet/sync", "").await;
    assert_eq!(status, http::StatusCode::METHOD_NOT_ALLOWED, "{reply}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_reload_that_would_shadow_a_registry_tenant_is_refused_naming_the_registry() {
    let s3 = S3::start();
    let root = tempfile::tempdir().unwrap();
    let (_a, b, _) = site_on_two_replicas(&s3, root.path()).await;
    // b's file now declares a tenant of the same name: two owners; the reload changes nothing.
    let config = root.path().join("b/tern.toml");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str("[[tenant]]\nname = \"site\"\nmodule = \"builtin:echo\"\npaths = [\"/site\"]\n");
    std::fs::write(&config, text).unwrap();
    let (status, reply) = admin(&b, http::Method::POST, "/admin/v1/reload", "").await;
    assert_eq!(status, http::StatusCode::CONFLICT, "{reply}");
    let e = reply["error"].as_str().unwrap();
    assert!(
        e.contains("\"site\" is declared in the config file")
            && e.contains(&format!("the fleet's registry {REGISTRY}")),
        "{e}"
    );
    serves(&b, "/site", "Hello").await;
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

/// The five changes the registry's compare-and-swap writes carry, made on `a` (which reaches
/// S3 through `proxy`) with `fault` armed for each change's write: each answer is the
/// change's own, and replica `b` serves every change. `round` keeps the names apart.
async fn every_change_survives(
    a: &crate::support::TernProcess,
    b: &crate::support::TernProcess,
    proxy: &crate::faults::S3Proxy,
    fault: crate::faults::Fault,
    round: usize,
) {
    use http::Method;
    let site = format!("site{round}");
    let path = format!("/admin/v1/tenants/{site}");
    // Set up without faults: two versions, so there is one to roll back to.
    create(addr(&a.admin), &site, &format!("/{site}")).await;
    for module in ["hello", "echo"] {
        let (status, v) = deploy(addr(&a.admin), &site, demo(module)).await;
        assert_eq!(status, 200, "{v}");
    }
    let applied = proxy.applied();

    // A spec change.
    proxy.arm(fault, "registry/index.json");
    let (status, v) = admin_if(a, Method::PATCH, &path, r#"{"env": {"ROUND": "x"}}"#, None).await;
    assert_eq!(status, 200, "{fault:?}: the spec change was applied: {v}");
    assert_eq!(proxy.applied(), applied + 1, "the fault happened");
    assert_eq!(v["env"], serde_json::json!(["ROUND"]), "{v}");

    // A deploy.
    proxy.arm(fault, "registry/index.json");
    let (status, v) = deploy(addr(&a.admin), &site, demo("json")).await;
    assert_eq!(status, 200, "{fault:?}: the deploy was applied: {v}");
    assert_eq!(proxy.applied(), applied + 2);
    let deployed = v["version"].as_str().unwrap().to_string();
    let etag = v["etag"].as_str().unwrap().to_string();
    let started = Instant::now();
    while tenant(b, &site).await["current"]["id"] != deployed.as_str() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "b never saw it"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A rollback, conditional: answered as done, and its retry is refused, not applied again.
    proxy.arm(fault, "registry/index.json");
    let rollback = format!("{path}/rollback");
    let (status, v) = admin_if(a, Method::POST, &rollback, "", Some(&etag)).await;
    assert_eq!(status, 200, "{fault:?}: the rollback was applied: {v}");
    assert_eq!(proxy.applied(), applied + 3);
    assert_eq!(v["previous"], deployed.as_str(), "{v}");
    let rolled_back = v["version"].as_str().unwrap().to_string();
    let (status, v) = admin_if(a, Method::POST, &rollback, "", Some(&etag)).await;
    assert_eq!(status, 412, "a retried rollback is not applied twice: {v}");
    assert_eq!(
        tenant(a, &site).await["current"]["id"],
        rolled_back.as_str()
    );

    // A certificate upload.
    let (cert, key) = self_signed(&format!("r{round}.test"));
    let body = serde_json::json!({"hosts": [format!("r{round}.test")], "cert": cert, "key": key});
    proxy.arm(fault, "certificates/index.json");
    let (status, v) = admin(
        a,
        Method::PUT,
        &format!("/admin/v1/certificates/r{round}"),
        body.to_string(),
    )
    .await;
    assert_eq!(status, 201, "{fault:?}: the upload was applied: {v}");
    assert_eq!(v["created"], true, "{v}");
    assert_eq!(proxy.applied(), applied + 4);

    // A delete.
    proxy.arm(fault, "registry/index.json");
    let (status, v) = admin_if(a, Method::DELETE, &path, "", None).await;
    assert_eq!(status, 200, "{fault:?}: the delete was applied: {v}");
    assert_eq!(proxy.applied(), applied + 5);
    let started = Instant::now();
    while !tenant(b, &site).await.is_null() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "b still has it"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
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
    let a = replica_via(s3, Some(&proxy.endpoint), "a", &dir.join("a"), TLS, 100);
    (a, proxy)
}

/// A replica whose registry write S3 applied but whose answer was lost — the connection
/// closed instead of the answer, or the answer late past the client's timeout — answers the
/// change as done (it recognises its change id when it reads the registry back), for every
/// kind of change; a conditional retry of it is refused with 412 rather than applied twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_whose_answer_the_registry_lost_is_answered_as_done_not_as_a_conflict() {
    use crate::faults::Fault;
    let s3 = S3::start();
    let dirs = tempfile::tempdir().unwrap();
    let (a, proxy) = replica_behind_a_proxy(&s3, dirs.path()).await;
    let b = replica_with(&s3, "b", &dirs.path().join("b"), TLS, 100);
    every_change_survives(&a, &b, &proxy, Fault::Drop, 0).await;
    every_change_survives(&a, &b, &proxy, Fault::Delay(Duration::from_secs(3)), 1).await;
    // Every deploy counted as the success it was.
    let m = metrics(&a).await;
    assert_eq!(
        crate::support::metric_value(&m, "tern_deploys_total{outcome=\"ok\",tenant=\"site0\"}"),
        3.0,
        "{m}"
    );
}

/// The registry stops right after it applied a change, before its answer leaves: the replica
/// cannot read it back, so it answers 503 saying the change may or may not have been applied
/// (never "nothing was written"); once the registry is back the change is there, and the same
/// conditional change sent again is refused with 412 instead of being applied twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_the_registry_went_away_after_is_answered_as_unknown_and_a_conditional_retry_settles_it()
 {
    use crate::faults::{Fault, S3Proxy};
    use http::Method;
    let mut s3 = S3::start();
    let dirs = tempfile::tempdir().unwrap();
    let (a, proxy) = replica_behind_a_proxy(&s3, dirs.path()).await;
    create(addr(&a.admin), "site", "/site").await;
    for module in ["hello", "echo"] {
        let (status, v) = deploy(addr(&a.admin), "site", demo(module)).await;
        assert_eq!(status, 200, "{v}");
    }
    let path = "/admin/v1/tenants/site";

    // Each change: armed, sent, S3 stopped while its answer is held, then back.
    async fn unknown(
        a: &crate::support::TernProcess,
        s3: &mut S3,
        proxy: &S3Proxy,
        suffix: &str,
        change: impl std::future::Future<Output = (http::StatusCode, serde_json::Value)>,
    ) {
        proxy.arm(Fault::Hold, suffix);
        let (answer, ()) = tokio::join!(change, async {
            proxy.wait_held(Duration::from_secs(20)).await;
            s3.stop();
            proxy.release();
        });
        let (status, v) = answer;
        let error = v["error"].as_str().unwrap_or_default().to_string();
        assert_eq!(status, 503, "{v}");
        assert!(
            error.contains("may have been applied or not") && !error.contains("nothing was"),
            "{error}"
        );
        s3.restart();
        // The replica reads the registry again by itself.
        let started = Instant::now();
        while get_admin(a, "/readyz").await.status != 200
            || admin(a, http::Method::GET, "/admin/v1/fleet", "").await.0 != 200
        {
            assert!(started.elapsed() < Duration::from_secs(20));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    // A rollback: it was applied; its conditional retry is refused.
    let etag = tenant(&a, "site").await["etag"]
        .as_str()
        .unwrap()
        .to_string();
    let before = tenant(&a, "site").await;
    unknown(&a, &mut s3, &proxy, "registry/index.json", async {
        admin_if(
            &a,
            Method::POST,
            &format!("{path}/rollback"),
            "",
            Some(&etag),
        )
        .await
    })
    .await;
    let after = tenant(&a, "site").await;
    assert_eq!(after["current"], before["previous"], "{after}");
    let (status, v) = admin_if(
        &a,
        Method::POST,
        &format!("{path}/rollback"),
        "",
        Some(&etag),
    )
    .await;
    assert_eq!(status, 412, "{v}");
    assert_eq!(tenant(&a, "site").await["current"], before["previous"]);

    // A spec change and a deploy, the same.
    let etag = after["etag"].as_str().unwrap().to_string();
    unknown(&a, &mut s3, &proxy, "registry/index.json", async {
        admin_if(
            &a,
            Method::PATCH,
            path,
            r#"{"env": {"K": "v"}}"#,
            Some(&etag),
        )
        .await
    })
    .await;
    let after = tenant(&a, "site").await;
    assert_eq!(after["env"], serde_json::json!(["K"]), "{after}");
    let (status, _) = admin_if(
        &a,
        Method::PATCH,
        path,
        r#"{"env": {"K": "v"}}"#,
        Some(&etag),
    )
    .await;
    assert_eq!(status, 412);
    let etag = after["etag"].as_str().unwrap().to_string();
    let reply = async {
        let auth = format!("Bearer {FLEET_TOKEN}");
        let r = crate::support::send(
            addr(&a.admin),
            Method::PUT,
            &format!("{path}/module"),
            None,
            &[("authorization", &auth), ("if-match", &etag)],
            bytes::Bytes::from_static(demo("json")),
        )
        .await;
        (
            r.status,
            serde_json::from_slice(&r.body).unwrap_or_default(),
        )
    };
    unknown(&a, &mut s3, &proxy, "registry/index.json", reply).await;
    let after = tenant(&a, "site").await;
    assert_ne!(after["current"], before["previous"], "deployed: {after}");
    assert_eq!(after["previous"], before["previous"], "{after}");

    // A certificate upload: listed once the registry is back.
    let (cert, key) = self_signed("gone.test");
    let body = serde_json::json!({"hosts": ["gone.test"], "cert": cert, "key": key});
    unknown(&a, &mut s3, &proxy, "certificates/index.json", async {
        admin(
            &a,
            Method::PUT,
            "/admin/v1/certificates/gone",
            body.to_string(),
        )
        .await
    })
    .await;
    let started = Instant::now();
    loop {
        let (_, listed) = admin(&a, Method::GET, "/admin/v1/certificates", "").await;
        if listed.to_string().contains("gone.test") {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{listed}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A delete: gone, and its conditional retry refused rather than answered 404.
    let etag = after["etag"].as_str().unwrap().to_string();
    unknown(&a, &mut s3, &proxy, "registry/index.json", async {
        admin_if(&a, Method::DELETE, path, "", Some(&etag)).await
    })
    .await;
    assert!(tenant(&a, "site").await.is_null());
    let (status, v) = admin_if(&a, Method::DELETE, path, "", Some(&etag)).await;
    assert_eq!(status, 412, "{v}");
    assert_eq!(proxy.applied(), 5);
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

/// Every line `r` logged so far (those a test already read and those still queued).
fn all_logged(r: &crate::support::TernProcess) -> String {
    let mut lines = r.lines.borrow().clone();
    lines.extend(r.log.try_iter());
    lines.join("\n")
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
