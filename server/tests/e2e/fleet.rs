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
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
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
