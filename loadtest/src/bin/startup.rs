//! Start-up with many tenants: writes a data directory holding N tenants deployed through the
//! admin API (as its manifest and content-addressed blobs), then times `tern serve` from spawn
//! until it listens and answers the last tenant. The first start compiles every distinct module
//! (cold); the second maps the stored artifacts (warm, the normal restart).
//!
//! Usage: `startup [TERN_BINARY] [N ...]` (defaults: `target/release/tern`, 1000 and 10000).
//! Each N runs twice: all tenants sharing one module, and every tenant with its own module.
//!
//! `startup write-store DATA_DIR N` only writes the data directory (N tenants `t0`..`t{N-1}` on
//! paths `/t0`.., one module each), for `loadtest/bench.sh density`.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A minimal ABI v1 guest answering `text`.
fn module(text: &str) -> Vec<u8> {
    wat::parse_str(format!(
        r#"(module
  (import "tern" "response_body_write" (func $write (param i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "{text}")
  (func (export "_start") (drop (call $write (i32.const 16) (i32.const {len})))))"#,
        len = text.len()
    ))
    .expect("valid WAT")
}

fn write_store(dir: &Path, n: usize, distinct: bool) -> std::io::Result<()> {
    std::fs::create_dir_all(dir.join("blobs"))?;
    let mut tenants = serde_json::Map::new();
    let shared = module("shared");
    for i in 0..n {
        let wasm = if distinct {
            module(&format!("tenant {i}"))
        } else {
            shared.clone()
        };
        let hash = hex(&Sha256::digest(&wasm));
        let blob = dir.join("blobs").join(&hash);
        if !blob.exists() {
            std::fs::write(&blob, &wasm)?;
        }
        let version = serde_json::json!({
            "id": hash, "module": hash, "module_bytes": wasm.len(), "assets": null,
            "deployed_at": 0, "compile_ms": 0.0,
        });
        tenants.insert(
            format!("t{i}"),
            serde_json::json!({
                "spec": { "paths": [format!("/t{i}")] },
                "current": version, "previous": null, "created_at": 0,
            }),
        );
    }
    let manifest = serde_json::json!({ "format": 1, "tenants": tenants });
    std::fs::write(dir.join("manifest.json"), serde_json::to_vec(&manifest)?)
}

struct Start {
    listening: Duration,
    loaded_ms: String,
    rss_mib: u64,
}

fn start(tern: &Path, dir: &Path, last: usize) -> Start {
    let config = dir.join("tern.toml");
    std::fs::write(
        &config,
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nadmin_token = \"x\"\n",
    )
    .expect("write config");
    let t0 = Instant::now();
    let mut child = Command::new(tern)
        .args(["serve", "--config"])
        .arg(&config)
        .arg("--data-dir")
        .arg(dir.join("data"))
        .env("TERN_LOG", "info")
        .env("TERN_CACHE_DIR", dir.join("cache"))
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tern");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let mut loaded_ms = String::from("?");
    let addr = loop {
        let line = lines
            .next()
            .expect("tern exited before listening")
            .expect("log");
        if let Some(rest) = line.split("tenants loaded in ").nth(1) {
            loaded_ms = rest.split(' ').next().unwrap_or("?").to_string();
        }
        if let Some(rest) = line.split("serving tenants on http://").nth(1) {
            break rest.split(',').next().expect("addr").to_string();
        }
        if line.contains("error") {
            panic!("{line}");
        }
    };
    let listening = t0.elapsed();
    let mut conn = std::net::TcpStream::connect(&addr).expect("connect");
    write!(
        conn,
        "GET /t{last} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
    )
    .expect("send");
    let mut reply = String::new();
    conn.read_to_string(&mut reply).expect("reply");
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    let status =
        std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap_or_default();
    let rss_mib = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0)
        / 1024;
    let _ = child.kill();
    let _ = child.wait();
    Start {
        listening,
        loaded_ms,
        rss_mib,
    }
}

fn main() {
    let mut args = std::env::args().skip(1).peekable();
    if args.peek().map(String::as_str) == Some("write-store") {
        let (Some(dir), Some(n)) = (args.nth(1), args.next().and_then(|n| n.parse().ok())) else {
            eprintln!("usage: startup write-store DATA_DIR N");
            std::process::exit(2);
        };
        write_store(Path::new(&dir), n, true).expect("write data dir");
        println!("{n} tenants in {dir}");
        return;
    }
    let tern = PathBuf::from(args.next().unwrap_or_else(|| "target/release/tern".into()));
    let sizes: Vec<usize> = {
        let v: Vec<usize> = args.filter_map(|a| a.parse().ok()).collect();
        if v.is_empty() { vec![1000, 10_000] } else { v }
    };
    println!("| tenants | modules | start | listening after | tenants loaded in | RSS |");
    println!("|---:|---|---|---:|---:|---:|");
    for &n in &sizes {
        for distinct in [false, true] {
            let tmp = std::env::temp_dir().join(format!(
                "tern-startup-{}-{n}-{distinct}",
                std::process::id()
            ));
            let _ = std::fs::remove_dir_all(&tmp);
            write_store(&tmp.join("data"), n, distinct).expect("write data dir");
            for phase in ["cold (compiles)", "warm (mmap)"] {
                let s = start(&tern, &tmp, n - 1);
                println!(
                    "| {n} | {} | {phase} | {:.2} s | {} ms | {} MiB |",
                    if distinct { "one each" } else { "one shared" },
                    s.listening.as_secs_f64(),
                    s.loaded_ms,
                    s.rss_mib
                );
            }
            let _ = std::fs::remove_dir_all(&tmp);
        }
    }
}
