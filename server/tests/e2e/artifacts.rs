//! Ahead-of-time artifacts: `tern compile` output loads by mmap; tampered, truncated and
//! foreign-engine artifacts are refused; `.wasm` modules go through a content-addressed cache.

use http::StatusCode;

use crate::support::{TestServer, demo_file, tern_bin};

fn compile(dir: &std::path::Path) -> std::path::PathBuf {
    let wasm = demo_file(dir, "hello");
    let out = dir.join("hello.cwasm");
    let result = tern_bin()
        .arg("compile")
        .arg(&wasm)
        .arg("-o")
        .arg(&out)
        .output()
        .expect("run tern");
    assert!(
        result.status.success(),
        "{}",
        String::from_utf8_lossy(&result.stderr)
    );
    out
}

async fn start_with(dir: tempfile::TempDir, module: &str) -> anyhow::Result<TestServer> {
    let config = format!("[[tenant]]\nname = \"t\"\nmodule = \"{module}\"\n");
    TestServer::try_start_in(dir, &config).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compiled_artifact_loads_and_serves() {
    let dir = tempfile::tempdir().unwrap();
    let out = compile(dir.path());
    let bytes = std::fs::read(&out).unwrap();
    assert!(bytes.ends_with(tern::artifact::SEAL_MAGIC));
    let s = start_with(dir, "hello.cwasm")
        .await
        .expect("artifact loads");
    let r = s.get("/").await;
    assert_eq!(
        (r.status, r.text().as_str()),
        (StatusCode::OK, "Hello from Tern!\n")
    );
    // A .cwasm is used in place: nothing is compiled into the cache.
    assert!(!s.path("cache").exists() || std::fs::read_dir(s.path("cache")).unwrap().count() == 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tampered_or_truncated_artifacts_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = compile(dir.path());
    let mut bytes = std::fs::read(&out).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(dir.path().join("tampered.cwasm"), &bytes).unwrap();
    let good = std::fs::read(&out).unwrap();
    std::fs::write(dir.path().join("truncated.cwasm"), &good[..good.len() - 10]).unwrap();

    let dir2 = tempfile::tempdir().unwrap();
    std::fs::copy(
        dir.path().join("truncated.cwasm"),
        dir2.path().join("truncated.cwasm"),
    )
    .unwrap();
    let e = start_with(dir, "tampered.cwasm")
        .await
        .map(|_| ())
        .expect_err("tampered refused");
    let e = format!("{e:#}");
    assert!(
        e.contains("refused") && e.contains("do not match its seal"),
        "{e}"
    );

    let e = start_with(dir2, "truncated.cwasm")
        .await
        .map(|_| ())
        .expect_err("truncated refused");
    assert!(format!("{e:#}").contains("refused"), "{e:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn artifact_from_another_engine_configuration_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    // A different engine: no epoch interruption, no pooling.
    let mut config = wasmtime::Config::new();
    config.epoch_interruption(false);
    let engine = wasmtime::Engine::new(&config).unwrap();
    let mut artifact = engine
        .precompile_module(tern::demo::module("hello").unwrap())
        .unwrap();
    tern::artifact::seal(&mut artifact);
    std::fs::write(dir.path().join("foreign.cwasm"), &artifact).unwrap();
    let e = start_with(dir, "foreign.cwasm")
        .await
        .map(|_| ())
        .expect_err("foreign refused");
    let e = format!("{e:#}");
    assert!(
        e.contains("incompatible with this server's engine") && e.contains("tern compile"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wasm_modules_are_compiled_once_into_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    demo_file(dir.path(), "hello");
    let cache = dir.path().join("cache");
    let s = start_with(dir, "hello.wasm").await.expect("start");
    assert_eq!(s.get("/").await.status, StatusCode::OK);
    let entries: Vec<_> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
    let artifact = &entries[0];
    assert!(artifact.extension().is_some_and(|e| e == "cwasm"));
    let modified = std::fs::metadata(artifact).unwrap().modified().unwrap();

    // A second server over the same cache maps the artifact instead of compiling again.
    let dir = s.dir;
    drop(s.running);
    let s = TestServer::try_start_in(dir, "[[tenant]]\nname = \"t\"\nmodule = \"hello.wasm\"\n")
        .await
        .expect("restart");
    assert_eq!(
        std::fs::metadata(artifact).unwrap().modified().unwrap(),
        modified
    );
    assert_eq!(s.get("/").await.status, StatusCode::OK);

    // A damaged cache entry is replaced, never trusted.
    let mut bytes = std::fs::read(artifact).unwrap();
    let n = bytes.len();
    bytes[n / 3] ^= 1;
    // Replaced, not rewritten in place: the file may still be mapped by the server just
    // dropped (its last tasks end asynchronously), and a mapped file cut short is a SIGBUS.
    crate::support::replace_file(artifact, &bytes);
    let dir = s.dir;
    drop(s.running);
    let s = TestServer::try_start_in(dir, "[[tenant]]\nname = \"t\"\nmodule = \"hello.wasm\"\n")
        .await
        .expect("recompiles");
    assert_eq!(s.get("/").await.status, StatusCode::OK);
    assert_ne!(std::fs::read(artifact).unwrap(), bytes);
    // No temporary files are left behind.
    assert_eq!(std::fs::read_dir(&cache).unwrap().count(), 1);
}

#[test]
fn compile_refuses_garbage_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("junk.wasm");
    std::fs::write(&input, b"\0asm junk").unwrap();
    let out = tern_bin()
        .arg("compile")
        .arg(&input)
        .arg("-o")
        .arg(dir.path().join("o.cwasm"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("junk.wasm") && err.contains("not a valid WebAssembly module"),
        "{err}"
    );
    assert!(!dir.path().join("o.cwasm").exists());
}

#[test]
fn compile_refuses_what_a_deploy_would_refuse_and_leaves_no_artifact() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, &[u8], &str); 3] = [
        (
            "text.wasm",
            b"hello, not wasm",
            "does not start with the `\\0asm` magic bytes",
        ),
        (
            "nostart.wasm",
            &wat::parse_str(r#"(module (memory (export "memory") 1) (func (export "handle")))"#)
                .unwrap(),
            "no `_start` export",
        ),
        (
            "badsig.wasm",
            &wat::parse_str(
                r#"(module (import "tern" "response_set_status" (func (param i32 i32) (result i32)))
                   (memory (export "memory") 1) (func (export "_start")))"#,
            )
            .unwrap(),
            "Tern's `response_set_status` is (i32) -> (i32)",
        ),
    ];
    for (name, bytes, why) in cases {
        let input = dir.path().join(name);
        std::fs::write(&input, bytes).unwrap();
        let out = dir.path().join(format!("{name}.cwasm"));
        let result = tern_bin()
            .arg("compile")
            .arg(&input)
            .arg("-o")
            .arg(&out)
            .output()
            .expect("run tern");
        let stderr = String::from_utf8_lossy(&result.stderr);
        assert!(!result.status.success(), "{name}: {stderr}");
        assert!(stderr.contains(why), "{name}: {stderr}");
        assert!(!stderr.contains("[0x"), "{name}: no byte dumps: {stderr}");
        assert!(!out.exists(), "{name}: an artifact was left behind");
    }
}
