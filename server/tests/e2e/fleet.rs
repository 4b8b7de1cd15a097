//! The registry a fleet shares on object storage, against a real S3 server (versitygw, started
//! here on 127.0.0.1): the probe of a store's conditional writes passes on a store that keeps
//! them, and says clearly why it cannot check one it cannot reach.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{tern_bin, tools_dir};

/// The versitygw release the suite runs (installed by scripts/test under [`tools_dir`]).
const VERSITYGW: &str = "versitygw-1.8.0";

const ACCESS_KEY: &str = "tern-test-access";
const SECRET_KEY: &str = "tern-test-secret";

/// A versitygw S3 server on 127.0.0.1 over a temporary directory with the bucket `fleet`,
/// stopped when dropped.
pub struct S3 {
    child: Child,
    root: tempfile::TempDir,
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
}

impl S3 {
    pub fn start() -> Self {
        let bin = tools_dir().join(VERSITYGW).join("versitygw");
        assert!(
            bin.is_file(),
            "versitygw is not installed at {} (bash scripts/test installs it)",
            bin.display()
        );
        let root = tempfile::tempdir().unwrap();
        // A top-level directory is a bucket.
        std::fs::create_dir(root.path().join("fleet")).unwrap();
        let port = crate::support::free_port();
        let child = Command::new(bin)
            .args(["--port", &format!("127.0.0.1:{port}")])
            .args(["--access", ACCESS_KEY, "--secret", SECRET_KEY, "--quiet"])
            .arg("posix")
            .arg(root.path())
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
        Self {
            child,
            root,
            endpoint: format!("http://127.0.0.1:{port}"),
        }
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
    use tern::registry::objects::{Remote, RemoteError, open_with};
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
    let with_tenant = |name: &str| -> tern::store::Manifest {
        serde_json::from_value(serde_json::json!({
            "format": tern::store::MANIFEST_FORMAT,
            "tenants": { name: { "spec": {}, "current": null, "previous": null, "created_at": 1 } },
        }))
        .unwrap()
    };
    let base = remote
        .put_manifest(&tern::store::Manifest::default(), None)
        .await
        .unwrap();
    let (a, b) = (remote.clone(), remote.clone());
    let (base_a, base_b) = (base.clone(), base.clone());
    let (ma, mb) = (with_tenant("a"), with_tenant("b"));
    let results = tokio::join!(
        tokio::spawn(async move { a.put_manifest(&ma, Some(&base_a)).await }),
        tokio::spawn(async move { b.put_manifest(&mb, Some(&base_b)).await }),
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
