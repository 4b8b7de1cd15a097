//! Builds the demo guests (guest-sdk/examples) for wasm32-wasip1 so `tern serve` can embed
//! them: the README's first command then needs no setup beyond `cargo`.
//!
//! The guests get their own target directory under OUT_DIR, so this nested cargo never waits
//! on the outer build's lock.

use std::path::PathBuf;
use std::process::Command;

#[path = "guest_build.rs"]
mod guest_build;

/// The demo guests built from guest-sdk/examples (`cgi` a plain Rust program served as CGI,
/// the rest on the Tern ABI), in the order `tern serve` lists them; the `wasi-http` component
/// follows. This is the one list: `src/demo.rs` embeds what `demo_guests.rs` (written here)
/// names.
const GUESTS: [&str; 10] = [
    "hello",
    "echo",
    "json",
    "counter",
    "visits",
    "static",
    "proxy",
    "aggregate",
    "chat",
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
    let mut embedded = Vec::new();
    for name in GUESTS {
        let wasm = target_dir.join(format!("wasm32-wasip1/guest/examples/{name}.wasm"));
        assert!(wasm.exists(), "{} was not built", wasm.display());
        embedded.push((name, wasm));
    }
    let component = guest_build::component(
        &root.join("guest-sdk/examples/wasi-http"),
        "wasi_http_example",
        &target_dir,
    );
    embedded.push(("wasi-http", component));
    write_embedded(&out.join("demo_guests.rs"), &embedded);
}

/// Writes the names of the demo guests and a function giving each one's embedded bytes.
fn write_embedded(file: &std::path::Path, guests: &[(&str, PathBuf)]) {
    let names: Vec<String> = guests.iter().map(|(n, _)| format!("{n:?}")).collect();
    let arms: Vec<String> = guests
        .iter()
        .map(|(n, wasm)| {
            let path = wasm.to_str().expect("the build directory's path is UTF-8");
            format!("        {n:?} => include_bytes!({path:?}),\n")
        })
        .collect();
    let code = format!(
        "/// Names of the built-in modules.\n\
         pub const NAMES: [&str; {}] = [{}];\n\n\
         /// The `.wasm` bytes of built-in module `name`.\n\
         pub fn module(name: &str) -> Option<&'static [u8]> {{\n    \
         Some(match name {{\n{}        _ => return None,\n    }})\n}}\n",
        guests.len(),
        names.join(", "),
        arms.concat()
    );
    std::fs::write(file, code).expect("write demo_guests.rs");
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
