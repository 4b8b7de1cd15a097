//! HTTP/2 conformance, judged by a suite nobody here wrote: h2spec 2.2.1 (its 145 cases of
//! RFC 7540/9113 and RFC 7541) against the cleartext listener (HTTP/2 with prior knowledge)
//! and the TLS listener (h2 by ALPN). Every case passes, but one on the cleartext port:
//! `http2/3.5/2` (an invalid connection preface must close the connection) cannot, because
//! that port serves HTTP/1.1 and HTTP/2 side by side and tells them apart by the first
//! bytes: an invalid HTTP/2 preface is a request line to it, answered as HTTP/1.1 (`400`).

use std::path::PathBuf;
use std::process::Command;

use crate::support::{TestServer, tools_dir};

/// The h2spec the suite runs (installed by scripts/test under [`tools_dir`]).
fn h2spec() -> PathBuf {
    let bin = tools_dir().join("h2spec-2.2.1").join("h2spec");
    assert!(
        bin.is_file(),
        "h2spec is not installed at {} (bash scripts/test installs it)",
        bin.display()
    );
    bin
}

/// Every case of an h2spec JUnit report by its id (`http2/6.9.1/3`: package, then its place
/// in its section), and whether it passed.
fn cases(report: &str) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    for suite in report.split("<testsuite ").skip(1) {
        let package = suite
            .split("package=\"")
            .nth(1)
            .and_then(|p| p.split('"').next())
            .expect("a package");
        for (i, case) in suite.split("<testcase ").skip(1).enumerate() {
            let body = case.split("</testcase>").next().unwrap_or(case);
            let failed = body.contains("<failure") || body.contains("<error");
            let skipped = body.contains("<skipped");
            out.push((format!("{package}/{}", i + 1), !failed && !skipped));
        }
    }
    out
}

/// Runs h2spec against `port` (over TLS with `tls`) on the echo tenant (its handler reads the
/// whole request body, so a stream stays open while h2spec sends what it tests); the cases.
fn run(port: u16, tls: bool) -> Vec<(String, bool)> {
    let report = tempfile::NamedTempFile::new().unwrap();
    let mut cmd = Command::new(h2spec());
    cmd.args([
        "-h",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "-P",
        "/echo",
        "-o",
        "5",
    ])
    .arg("-j")
    .arg(report.path());
    if tls {
        cmd.args(["-t", "-k"]);
    }
    let out = cmd.output().expect("run h2spec");
    let text = std::fs::read_to_string(report.path()).unwrap_or_default();
    let cases = cases(&text);
    assert_eq!(
        cases.len(),
        145,
        "h2spec ran {} cases: {}{}",
        cases.len(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    cases
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2spec_passes_on_the_cleartext_and_tls_listeners() {
    let dir = tempfile::tempdir().unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    std::fs::write(dir.path().join("cert.pem"), cert.pem()).unwrap();
    std::fs::write(dir.path().join("key.pem"), key.serialize_pem()).unwrap();
    let config = "[server]\ntls_listen = \"127.0.0.1:0\"\n\
                  [pool]\ninstances = 16\nmax_memory_mib = 64\n\
                  [[tenant]]\nname = \"echo\"\nmodule = \"builtin:echo\"\npaths = [\"/echo\"]\n\
                  [[certificate]]\ncert = \"cert.pem\"\nkey = \"key.pem\"\n";
    let s = TestServer::try_start_in(dir, config).await.expect("start");
    let (plain, tls) = (s.addr().port(), s.running.tls_addr.unwrap().port());
    let results = tokio::task::spawn_blocking(move || (run(plain, false), run(tls, true)))
        .await
        .unwrap();

    let failed = |cases: &[(String, bool)]| -> Vec<String> {
        cases
            .iter()
            .filter(|(_, ok)| !ok)
            .map(|(id, _)| id.clone())
            .collect()
    };
    // The one case the shared cleartext port cannot pass (see the module's doc).
    assert_eq!(failed(&results.0), ["http2/3.5/2"], "cleartext");
    assert_eq!(failed(&results.1), Vec::<String>::new(), "TLS");
    // And the server still serves.
    assert_eq!(s.get("/echo").await.status, http::StatusCode::OK);
}
