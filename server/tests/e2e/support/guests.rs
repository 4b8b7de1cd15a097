//! The suite's guests, built as their users build them: the test guests and component of
//! `server/guests`, JavaScript (componentize-js), Python (componentize-py), Spin SDKs, Go (TinyGo)
//! and C (clang with wasi-libc), each once per test run.

use std::path::{Path, PathBuf};

#[path = "../../../guest_build.rs"]
mod guest_build;

/// Builds the guests of `server/guests` (once per test run) and copies `name` into `dir`.
pub fn test_guest(dir: &Path, name: &str) -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let out = BUILT.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let target = root.join("target/test-guests");
        let status = guest_build::command(&root, &["-p", "tern-test-guests", "--bins"], &target)
            .status()
            .expect("run cargo to build the test guests");
        assert!(
            status.success(),
            "building server/guests for wasm32-wasip1 failed"
        );
        target.join("wasm32-wasip1/guest")
    });
    let to = dir.join(format!("{name}.wasm"));
    std::fs::copy(out.join(format!("{name}.wasm")), &to)
        .unwrap_or_else(|e| panic!("test guest {name}: {e}"));
    to
}

/// Builds the `wasi:http` test component of `server/guests/component` (once per test run) and
/// copies it into `dir` as `name.wasm`.
pub fn test_component(dir: &Path, name: &str) -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let built = BUILT.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        guest_build::component(
            &root.join("server/guests/component"),
            "tern_test_component",
            &root.join("target/test-guests"),
        )
    });
    let to = dir.join(format!("{name}.wasm"));
    std::fs::copy(built, &to).unwrap_or_else(|e| panic!("test component: {e}"));
    to
}

/// Where the test command (`bash scripts/test`) keeps the toolchains it installs, outside the
/// checkout: `$TERN_TOOLS`, else `~/.cache/tern-tools`.
pub fn tools_dir() -> PathBuf {
    std::env::var_os("TERN_TOOLS").map_or_else(
        || Path::new(&std::env::var_os("HOME").expect("HOME is set")).join(".cache/tern-tools"),
        PathBuf::from,
    )
}

/// The componentize-js version the suite builds JavaScript guests with (the one
/// scripts/toolchains.sh pins; `bash scripts/test` installs it under [`tools_dir`]).
pub const COMPONENTIZE_JS: &str = "0.23.0";

/// Builds `server/guests/js/handler.js` into a `wasi:http` component with componentize-js
/// (once per test run) and copies it into `dir` as `name.wasm`.
///
/// componentize-js 0.23's engine exports `wasi:http/incoming-handler@0.2.10` and needs the WIT
/// of that version to build: it is made from the WASI 0.2.12 WIT that its jco dependency ships
/// (the same interfaces), in a temporary directory.
pub fn js_component(dir: &Path, name: &str) -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let built = BUILT.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let modules = tools_dir().join(format!("componentize-js-{COMPONENTIZE_JS}/node_modules"));
        let cli = modules.join(".bin/componentize-js");
        assert!(
            cli.exists(),
            "componentize-js {COMPONENTIZE_JS} is not installed at {} (bash scripts/test installs it)",
            cli.display()
        );
        let wit = wasi_wit(
            &modules,
            "@0.2.10",
            "world handler {\n  export wasi:http/incoming-handler@0.2.10;\n}\n",
        );
        let out_dir = root.join("target/test-guests/js");
        std::fs::create_dir_all(&out_dir).unwrap();
        let out = out_dir.join("handler.wasm");
        let output = std::process::Command::new(&cli)
            .arg(root.join("server/guests/js/handler.js"))
            .arg("--wit")
            .arg(wit.path())
            .args(["--world-name", "handler", "-o"])
            .arg(&out)
            .output()
            .expect("run componentize-js (needs node)");
        assert!(
            output.status.success(),
            "componentize-js failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        out
    });
    let to = dir.join(format!("{name}.wasm"));
    std::fs::copy(built, &to).unwrap_or_else(|e| panic!("js component: {e}"));
    to
}

/// Builds the Spin components of `server/guests/spin` (spin-sdk 3.x and 5.x for
/// wasm32-wasip1, as Spin's docs build them; once per test run) and copies the one of SDK
/// major version `sdk` (3 or 5) into `dir` as `name.wasm`.
pub fn spin_module(dir: &Path, sdk: u32, name: &str) -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let out = BUILT
        .get_or_init(|| spin_build(&["tern-spin-sdk3", "tern-spin-sdk5"], guest_build::TARGET));
    let to = dir.join(format!("{name}.wasm"));
    std::fs::copy(out.join(format!("tern_spin_sdk{sdk}.wasm")), &to)
        .unwrap_or_else(|e| panic!("spin-sdk {sdk} module: {e}"));
    to
}

/// Builds the spin-sdk 7 component of `server/guests/spin` (a WASI 0.3 component, for
/// wasm32-wasip2; once per test run) and copies it into `dir` as `name.wasm`.
pub fn spin_p3_component(dir: &Path, name: &str) -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let out = BUILT.get_or_init(|| spin_build(&["tern-spin-sdk7"], guest_build::COMPONENT_TARGET));
    let to = dir.join(format!("{name}.wasm"));
    std::fs::copy(out.join("tern_spin_sdk7.wasm"), &to)
        .unwrap_or_else(|e| panic!("spin-sdk 7 component: {e}"));
    to
}

/// Builds `packages` of `server/guests/spin` for `target` (release, locked); the directory
/// their `.wasm` files land in.
fn spin_build(packages: &[&str], target: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let target_dir = root.join("target/test-guests/spin");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = std::process::Command::new(cargo);
    cmd.current_dir(root.join("server/guests/spin")).args([
        "build",
        "--quiet",
        "--locked",
        "--release",
        "--target",
        target,
    ]);
    for p in packages {
        cmd.args(["-p", p]);
    }
    cmd.arg("--target-dir").arg(&target_dir);
    guest_build::clean_env(&mut cmd);
    let status = cmd.status().expect("run cargo to build the Spin guests");
    assert!(
        status.success(),
        "building {packages:?} of server/guests/spin failed"
    );
    target_dir.join(format!("{target}/release"))
}

/// A WIT directory in a new temporary directory: the WASI 0.2.12 packages that componentize-js's
/// jco dependency ships (in `modules`, its `node_modules`), their version written as `version`
/// (`@0.2.12` leaves them as they are), and a package `tern:guest` holding `world`.
fn wasi_wit(modules: &Path, version: &str, world: &str) -> tempfile::TempDir {
    let wit = tempfile::tempdir().expect("temp dir");
    let deps = wit.path().join("deps");
    let shipped = modules.join("@bytecodealliance/jco/lib/wit/builtin/0.2.12");
    for package in std::fs::read_dir(&shipped).expect("jco's WASI WIT") {
        let package = package.unwrap();
        let to = deps.join(package.file_name());
        std::fs::create_dir_all(&to).unwrap();
        for file in std::fs::read_dir(package.path()).unwrap() {
            let file = file.unwrap();
            let text = std::fs::read_to_string(file.path()).unwrap();
            std::fs::write(to.join(file.file_name()), text.replace("@0.2.12", version)).unwrap();
        }
    }
    std::fs::write(
        wit.path().join("world.wit"),
        format!("package tern:guest;\n\n{world}"),
    )
    .unwrap();
    wit
}

/// The componentize-py version the suite builds Python guests with (the one
/// scripts/toolchains.sh pins; `bash scripts/test` installs it under [`tools_dir`]).
pub const COMPONENTIZE_PY: &str = "0.25.1";

/// Builds `server/guests/python/app.py` into a `wasi:http` component with componentize-py
/// (once per test run; bindings for `wasi:http/proxy@0.2.12` made as it builds) and copies it
/// into `dir` as `name.wasm`.
pub fn python_component(dir: &Path, name: &str) -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let built = BUILT.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let tools = tools_dir();
        let home = tools.join(format!("componentize-py-{COMPONENTIZE_PY}"));
        let cli = home.join("bin/componentize-py");
        assert!(
            cli.exists(),
            "componentize-py {COMPONENTIZE_PY} is not installed at {} (bash scripts/test installs it)",
            cli.display()
        );
        let modules = tools.join(format!("componentize-js-{COMPONENTIZE_JS}/node_modules"));
        let wit = wasi_wit(
            &modules,
            "@0.2.12",
            "world handler {\n  include wasi:http/proxy@0.2.12;\n}\n",
        );
        let out_dir = root.join("target/test-guests/python");
        std::fs::create_dir_all(&out_dir).unwrap();
        let out = out_dir.join("app.wasm");
        let output = std::process::Command::new("python3")
            .arg(&cli)
            .env("PYTHONPATH", &home)
            .arg("-d")
            .arg(wit.path())
            .args(["-w", "handler", "componentize", "-p"])
            .arg(root.join("server/guests/python"))
            .args(["app", "-o"])
            .arg(&out)
            .output()
            .expect("run componentize-py (needs python3)");
        assert!(
            output.status.success(),
            "componentize-py failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        out
    });
    let to = dir.join(format!("{name}.wasm"));
    std::fs::copy(built, &to).unwrap_or_else(|e| panic!("python component: {e}"));
    to
}

/// Builds the Go program in `package` (relative to the repository) with Go's own toolchain for
/// `GOOS=wasip1 GOARCH=wasm` (the toolchain Go users deploy with; no module downloads, the
/// standard library only) into `dir/name.wasm`. Go's build cache keeps rebuilds quick.
pub fn go_program(dir: &Path, package: &str, name: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = dir.join(format!("{name}.wasm"));
    let status = std::process::Command::new("go")
        .current_dir(root.join(package))
        .args(["build", "-o"])
        .arg(&out)
        .arg(".")
        .env("GOOS", "wasip1")
        .env("GOARCH", "wasm")
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "-mod=mod")
        .status()
        .expect("Go is required for the Go guests (https://go.dev; scripts/test checks it)");
    assert!(status.success(), "go build of {package} for wasip1 failed");
    out
}

/// Compiles the C program `source` (relative to the repository) with clang for wasm32-wasi
/// into `dir/name.wasm`.
pub fn c_program(dir: &Path, source: &str, name: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = dir.join(format!("{name}.wasm"));
    let status = std::process::Command::new("clang")
        .args(["--target=wasm32-wasi", "-O2", "-I"])
        .arg(root.join("guest-sdk/include"))
        .arg("-o")
        .arg(&out)
        .arg(root.join(source))
        .status()
        .expect("clang is required for C guests (scripts/test installs clang lld wasi-libc)");
    assert!(status.success(), "clang failed to build {source}");
    out
}
