//! `tern new NAME --lang rust|c|zig`: a complete handler project outside Tern's repository
//! that builds with one command (templates in `server/templates/`).
//!
//! A Rust project gets a copy of the guest SDK (`tern-sdk/`, the same sources as Tern's
//! `guest-sdk`), so it builds with nothing but `cargo` and the `wasm32-wasip1` target; C and
//! Zig projects get `tern.h` and `ABI.md`.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

/// The language of a new project.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    /// Rust with the Tern SDK (`cargo build --release`).
    Rust,
    /// C with `tern.h` (clang and wasi-libc).
    C,
    /// Zig against the ABI directly.
    Zig,
}

/// The files of a project in `lang`: relative path and contents with `{{name}}` and
/// `{{sdk_version}}` still in place.
fn files(lang: Lang) -> Vec<(&'static str, &'static str)> {
    let abi_md = include_str!("../../guest-sdk/ABI.md");
    match lang {
        Lang::Rust => vec![
            (
                "Cargo.toml",
                include_str!("../templates/rust/Cargo.toml.in"),
            ),
            (
                ".cargo/config.toml",
                include_str!("../templates/rust/cargo-config.toml.in"),
            ),
            ("src/main.rs", include_str!("../templates/rust/main.rs")),
            ("README.md", include_str!("../templates/rust/README.md")),
            (
                "tern-sdk/Cargo.toml",
                include_str!("../templates/rust/sdk-Cargo.toml.in"),
            ),
            (
                "tern-sdk/src/lib.rs",
                include_str!("../../guest-sdk/src/lib.rs"),
            ),
            (
                "tern-sdk/src/abi.rs",
                include_str!("../../guest-sdk/src/abi.rs"),
            ),
            (
                "tern-sdk/src/outbound.rs",
                include_str!("../../guest-sdk/src/outbound.rs"),
            ),
            ("tern-sdk/ABI.md", abi_md),
            (".gitignore", "/target\n"),
        ],
        Lang::C => vec![
            ("main.c", include_str!("../templates/c/main.c")),
            ("build.sh", include_str!("../templates/c/build.sh")),
            ("README.md", include_str!("../templates/c/README.md")),
            (
                "include/tern.h",
                include_str!("../../guest-sdk/include/tern.h"),
            ),
            ("ABI.md", abi_md),
            (".gitignore", "*.wasm\n"),
        ],
        Lang::Zig => vec![
            ("main.zig", include_str!("../templates/zig/main.zig")),
            ("build.sh", include_str!("../templates/zig/build.sh")),
            ("README.md", include_str!("../templates/zig/README.md")),
            ("ABI.md", abi_md),
            (".gitignore", "*.wasm\n*.o\n.zig-cache/\n"),
        ],
    }
}

/// Writes project `name` in `lang` into `parent/name` (which must not exist yet) and returns
/// its directory.
///
/// # Errors
/// A name that is not 1-64 of `a-z0-9_-` starting with a letter, an existing directory, or a
/// file that cannot be written.
pub fn create(parent: &Path, name: &str, lang: Lang) -> anyhow::Result<PathBuf> {
    let valid = name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if !valid {
        bail!(
            "{name:?} is not a project name: 1-64 of a-z, 0-9, '-' and '_', starting with a letter"
        );
    }
    let dir = parent.join(name);
    if dir.exists() {
        bail!(
            "{} already exists; choose another name or remove it",
            dir.display()
        );
    }
    for (path, text) in files(lang) {
        let to = dir.join(path);
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        let text = text
            .replace("{{name}}", name)
            .replace("{{sdk_version}}", env!("CARGO_PKG_VERSION"));
        std::fs::write(&to, text).with_context(|| format!("cannot write {}", to.display()))?;
    }
    Ok(dir)
}

/// The one command that builds a project of `lang`, and where its module lands.
pub fn build_hint(lang: Lang, name: &str) -> (&'static str, String) {
    match lang {
        Lang::Rust => (
            "cargo build --release",
            format!("target/wasm32-wasip1/release/{name}.wasm"),
        ),
        Lang::C | Lang::Zig => ("sh build.sh", format!("{name}.wasm")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn projects_are_written_once_with_their_name() {
        let dir = tempfile::tempdir().unwrap();
        let p = create(dir.path(), "my-handler", Lang::Rust).unwrap();
        let cargo = std::fs::read_to_string(p.join("Cargo.toml")).unwrap();
        assert!(cargo.contains("name = \"my-handler\"") && !cargo.contains("{{"));
        assert!(p.join("tern-sdk/src/outbound.rs").exists());
        assert!(create(dir.path(), "my-handler", Lang::C).is_err(), "exists");
        assert!(create(dir.path(), "Bad Name", Lang::C).is_err());
        let c = create(dir.path(), "c1", Lang::C).unwrap();
        assert!(
            std::fs::read_to_string(c.join("build.sh"))
                .unwrap()
                .contains("c1.wasm")
        );
    }
}
