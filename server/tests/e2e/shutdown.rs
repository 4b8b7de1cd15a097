//! The `tern serve` binary: with no config it serves the built-in demo tenants; SIGTERM stops
//! accepting, lets the in-flight request finish, and exits 0.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::Stdio;
use std::time::Duration;

use crate::support::tern_bin;

#[test]
fn demo_server_drains_in_flight_requests_on_sigterm() {
    let cache = tempfile::tempdir().unwrap();
    let mut child = tern_bin()
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .env("TERN_CACHE_DIR", cache.path())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tern");
    let mut log = BufReader::new(child.stderr.take().unwrap());
    let mut addr = None;
    let mut line = String::new();
    while addr.is_none() {
        line.clear();
        assert!(
            log.read_line(&mut line).unwrap() > 0,
            "tern exited before listening"
        );
        if let Some(rest) = line.split("serving tenants on http://").nth(1) {
            addr = rest.split(',').next().map(str::to_string);
        }
    }
    let addr = addr.unwrap();

    // A request whose body is only half sent when the signal arrives.
    let mut conn = TcpStream::connect(&addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    conn.write_all(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\nhello")
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let status = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    std::thread::sleep(Duration::from_millis(300));
    // New connections are refused once the server stops accepting.
    assert!(
        TcpStream::connect(&addr).is_err(),
        "listener still accepting after SIGTERM"
    );
    conn.write_all(b"world").unwrap();
    let mut reply = String::new();
    let _ = conn.read_to_string(&mut reply);
    assert!(reply.starts_with("HTTP/1.1 200 OK"), "{reply}");
    assert!(reply.ends_with("helloworld"), "{reply}");

    let exit = child.wait().unwrap();
    assert!(exit.success(), "tern exited with {exit}");
    let mut rest = String::new();
    log.read_to_string(&mut rest).unwrap();
    assert!(rest.contains("shutting down"), "{rest}");
}
