//! The one command that builds Wasm guests from this workspace, shared by `build.rs` (the demo
//! guests `tern serve` embeds) and the e2e tests (the guests of `server/guests`).

use std::path::Path;
use std::process::Command;

/// The Rust target every guest is built for.
pub const TARGET: &str = "wasm32-wasip1";

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
    // Host-build settings must not leak into the guest build.
    for var in [
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "CARGO_BUILD_RUSTFLAGS",
        "RUSTC_WORKSPACE_WRAPPER",
    ] {
        cmd.env_remove(var);
    }
    cmd
}
