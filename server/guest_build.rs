//! The one command that builds Wasm guests from this workspace, shared by `build.rs` (the demo
//! guests `tern serve` embeds) and the e2e tests (the guests of `server/guests`).

use std::path::Path;
use std::process::Command;

/// The Rust target every core-module guest is built for.
pub const TARGET: &str = "wasm32-wasip1";

/// The Rust target `wasi:http` components are built for.
pub const COMPONENT_TARGET: &str = "wasm32-wasip2";

/// `cargo build` of `what` (e.g. `-p tern-sdk --examples`) for [`TARGET`] with the `guest`
/// profile into `target_dir`, run from the workspace `root`; the outputs land in
/// `target_dir/wasm32-wasip1/guest`.
pub fn command(root: &Path, what: &[&str], target_dir: &Path) -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(root)
        .args(["build", "--quiet"])
        .args(what)
        .args(["--target", TARGET, "--profile", "guest", "--target-dir"])
        .arg(target_dir);
    clean_env(&mut cmd);
    cmd
}

/// Builds the `wasi:http` component crate at `dir` (outside the workspace, with its own lock
/// file), whose library is named `lib`, for [`COMPONENT_TARGET`] into `target_dir`, and returns
/// the component's path; installs the target first if it is missing.
///
/// # Panics
/// If the build fails.
#[allow(dead_code)] // not every includer builds components
pub fn component(dir: &Path, lib: &str, target_dir: &Path) -> std::path::PathBuf {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let build = || {
        let mut cmd = Command::new(&cargo);
        cmd.current_dir(dir)
            .args([
                "build",
                "--quiet",
                "--release",
                "--target",
                COMPONENT_TARGET,
            ])
            .arg("--target-dir")
            .arg(target_dir);
        clean_env(&mut cmd);
        cmd.status().is_ok_and(|s| s.success())
    };
    if !build() {
        let added = Command::new("rustup")
            .args(["target", "add", COMPONENT_TARGET])
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            added && build(),
            "building the wasi:http component in {} failed; is the {COMPONENT_TARGET} target \
             installed? (`rustup target add {COMPONENT_TARGET}`)",
            dir.display()
        );
    }
    target_dir.join(format!("{COMPONENT_TARGET}/release/{lib}.wasm"))
}

/// Host-build settings must not leak into a guest build.
pub fn clean_env(cmd: &mut Command) {
    for var in [
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "CARGO_BUILD_RUSTFLAGS",
        "RUSTC_WORKSPACE_WRAPPER",
        "CLIPPY_ARGS",
    ] {
        cmd.env_remove(var);
    }
}
