//! Builds the demo guests (guest-sdk/examples) for wasm32-wasip1 so `tern serve` can embed
//! them: the README's first command then needs no setup beyond `cargo`.
//!
//! The guests get their own target directory under OUT_DIR, so this nested cargo never waits
//! on the outer build's lock.

use std::path::PathBuf;
use std::process::Command;

#[path = "guest_build.rs"]
mod guest_build;

const GUESTS: [&str; 9] = [
    "hello",
    "echo",
    "json",
    "counter",
    "visits",
    "static",
    "proxy",
    "aggregate",
    "cgi",
];

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let root = manifest
        .parent()
        .expect("server/ is inside the workspace")
        .to_path_buf();
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("set by cargo"));
    let target_dir = out.join("guests");
    for watched in [
        "guest-sdk/src",
        "guest-sdk/examples",
        "guest-sdk/examples/wasi-http/src",
        "guest-sdk/examples/wasi-http/Cargo.toml",
        "guest-sdk/Cargo.toml",
        "guest-sdk/build.rs",
        "Cargo.lock",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(watched).display());
    }
    println!("cargo:rerun-if-changed=guest_build.rs");

    let mut cmd = guest_build::command(&root, &["-p", "tern-sdk", "--examples"], &target_dir);
    let mut status = cmd.status().expect("run cargo for the demo guests");
    if !status.success() && add_wasm_target() {
        status = cmd.status().expect("run cargo for the demo guests");
    }
    assert!(
        status.success(),
        "building the demo guests failed; is the wasm32-wasip1 target installed? \
         (`rustup target add wasm32-wasip1`)"
    );
    for name in GUESTS {
        let wasm = target_dir.join(format!("wasm32-wasip1/guest/examples/{name}.wasm"));
        assert!(wasm.exists(), "{} was not built", wasm.display());
        println!(
            "cargo:rustc-env=TERN_GUEST_{}={}",
            name.to_uppercase(),
            wasm.display()
        );
    }
    let component = guest_build::component(
        &root.join("guest-sdk/examples/wasi-http"),
        "wasi_http_example",
        &target_dir,
    );
    println!(
        "cargo:rustc-env=TERN_GUEST_WASI_HTTP={}",
        component.display()
    );
}

/// On a fresh machine the wasm32-wasip1 standard library may be missing although
/// rust-toolchain.toml names it; add it once and say so.
fn add_wasm_target() -> bool {
    println!("cargo:warning=installing the wasm32-wasip1 target for the demo guests");
    Command::new("rustup")
        .args(["target", "add", "wasm32-wasip1"])
        .status()
        .is_ok_and(|s| s.success())
}
