//! `tern new NAME [--kind tern|wasi-http|cgi] [--lang rust|c|zig]`: a complete handler project
//! outside Tern's repository that builds with one command (templates in `server/templates/`).
//!
//! A Rust project of the `tern` kind gets a copy of the guest SDK (`tern-sdk/`, the same sources
//! as Tern's `guest-sdk`), so it builds with nothing but `cargo` and the `wasm32-wasip1` target;
//! C and Zig projects get `tern.h` and `ABI.md`. A `wasi-http` project is a Rust component (the
//! `wasip2` bindings, pinned by its lock file), a `cgi` project a plain Rust `std` or C program;
//! their sources are Tern's own examples (`guest-sdk/examples/`), which the tests serve.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use crate::config::GuestKind;

/// The language of a new project.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    /// Rust (`cargo build --release`).
    Rust,
    /// C (clang and wasi-libc: `sh build.sh`).
    C,
    /// Zig against the ABI directly (`sh build.sh`).
    Zig,
}

/// A file of the Rust SDK (`guest-sdk/src/NAME`) as a project carries it: its path there and
/// its text.
macro_rules! sdk_file {
    ($name:literal) => {
        (
            concat!("tern-sdk/src/", $name),
            include_str!(concat!("../../guest-sdk/src/", $name)),
        )
    };
}

/// The files of a project: relative path and contents with `{{name}}`, `{{crate}}` and
/// `{{sdk_version}}` still in place.
fn files(kind: GuestKind, lang: Lang) -> anyhow::Result<Vec<(&'static str, Cow<'static, str>)>> {
    let abi_md = include_str!("../../guest-sdk/ABI.md");
    let rust_config = include_str!("../templates/rust/cargo-config.toml.in");
    let files: Vec<(&str, &str)> = match (kind, lang) {
        (GuestKind::Tern, Lang::Rust) => vec![
            (
                "Cargo.toml",
                include_str!("../templates/rust/Cargo.toml.in"),
            ),
            (".cargo/config.toml", rust_config),
            ("src/main.rs", include_str!("../templates/rust/main.rs")),
            ("README.md", include_str!("../templates/rust/README.md")),
            (
                "tern-sdk/Cargo.toml",
                include_str!("../templates/rust/sdk-Cargo.toml.in"),
            ),
            sdk_file!("lib.rs"),
            sdk_file!("abi.rs"),
            sdk_file!("outbound.rs"),
            sdk_file!("kv.rs"),
            sdk_file!("config.rs"),
            sdk_file!("cache.rs"),
            sdk_file!("rate_limit.rs"),
            sdk_file!("websocket.rs"),
            ("tern-sdk/ABI.md", abi_md),
            (".gitignore", "/target\n"),
        ],
        (GuestKind::Tern, Lang::C) => vec![
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
        (GuestKind::Tern, Lang::Zig) => vec![
            ("main.zig", include_str!("../templates/zig/main.zig")),
            ("build.sh", include_str!("../templates/zig/build.sh")),
            ("README.md", include_str!("../templates/zig/README.md")),
            ("ABI.md", abi_md),
            (".gitignore", "*.wasm\n*.o\n.zig-cache/\n"),
        ],
        (GuestKind::WasiHttp, Lang::Rust) => {
            // The example's lock, so the project builds with the versions Tern's tests use.
            let lock = include_str!("../../guest-sdk/examples/wasi-http/Cargo.lock")
                .replace("\"wasi-http-example\"", "\"{{name}}\"");
            let mut v: Vec<(&str, Cow<str>)> = vec![("Cargo.lock", lock.into())];
            for (path, text) in [
                (
                    "Cargo.toml",
                    include_str!("../templates/wasi-http/Cargo.toml.in"),
                ),
                (
                    ".cargo/config.toml",
                    include_str!("../templates/wasi-http/cargo-config.toml"),
                ),
                (
                    "src/lib.rs",
                    include_str!("../../guest-sdk/examples/wasi-http/src/lib.rs"),
                ),
                (
                    "README.md",
                    include_str!("../templates/wasi-http/README.md"),
                ),
                (".gitignore", "/target\n"),
            ] {
                v.push((path, text.into()));
            }
            return Ok(v);
        }
        (GuestKind::Cgi, Lang::Rust) => vec![
            ("Cargo.toml", include_str!("../templates/cgi/Cargo.toml.in")),
            (".cargo/config.toml", rust_config),
            (
                "src/main.rs",
                include_str!("../../guest-sdk/examples/cgi.rs"),
            ),
            ("README.md", include_str!("../templates/cgi/README-rust.md")),
            (".gitignore", "/target\n"),
        ],
        (GuestKind::Cgi, Lang::C) => vec![
            ("main.c", include_str!("../../guest-sdk/examples/c/cgi.c")),
            ("build.sh", include_str!("../templates/cgi/build.sh")),
            ("README.md", include_str!("../templates/cgi/README-c.md")),
            (".gitignore", "*.wasm\n"),
        ],
        (GuestKind::WasiHttp, _) => bail!(
            "a wasi-http project is made in Rust only (--lang rust); components from other \
             languages (jco, componentize-py, TinyGo) deploy the same way once built"
        ),
        (GuestKind::Cgi, Lang::Zig) => bail!("a cgi project is made in Rust or C (--lang rust|c)"),
    };
    Ok(files.into_iter().map(|(p, t)| (p, t.into())).collect())
}

/// Writes project `name` of `kind` in `lang` into `parent/name` (which must not exist yet) and
/// returns its directory.
///
/// # Errors
/// A name that is not 1-64 of `a-z0-9_-` starting with a letter, a kind not made in `lang`, an
/// existing directory, or a file that cannot be written.
pub fn create(parent: &Path, name: &str, kind: GuestKind, lang: Lang) -> anyhow::Result<PathBuf> {
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
    let files = files(kind, lang)?;
    let dir = parent.join(name);
    if dir.exists() {
        bail!(
            "{} already exists; choose another name or remove it",
            dir.display()
        );
    }
    for (path, text) in files {
        let to = dir.join(path);
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        let text = text
            .replace("{{name}}", name)
            .replace("{{crate}}", &name.replace('-', "_"))
            .replace("{{sdk_version}}", env!("CARGO_PKG_VERSION"));
        std::fs::write(&to, text).with_context(|| format!("cannot write {}", to.display()))?;
    }
    Ok(dir)
}

/// The one command that builds a project, and where its module lands.
pub fn build_hint(kind: GuestKind, lang: Lang, name: &str) -> (&'static str, String) {
    match (kind, lang) {
        // A library crate's file name has `_` for `-`.
        (GuestKind::WasiHttp, _) => (
            "cargo build --release",
            format!(
                "target/wasm32-wasip2/release/{}.wasm",
                name.replace('-', "_")
            ),
        ),
        (_, Lang::Rust) => (
            "cargo build --release",
            format!("target/wasm32-wasip1/release/{name}.wasm"),
        ),
        (_, Lang::C | Lang::Zig) => ("sh build.sh", format!("{name}.wasm")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn projects_are_written_once_with_their_name() {
        let dir = tempfile::tempdir().unwrap();
        let p = create(dir.path(), "my-handler", GuestKind::Tern, Lang::Rust).unwrap();
        let cargo = std::fs::read_to_string(p.join("Cargo.toml")).unwrap();
        assert!(cargo.contains("name = \"my-handler\"") && !cargo.contains("{{"));
        assert!(p.join("tern-sdk/src/outbound.rs").exists());
        assert!(
            create(dir.path(), "my-handler", GuestKind::Tern, Lang::C).is_err(),
            "exists"
        );
        assert!(create(dir.path(), "Bad Name", GuestKind::Tern, Lang::C).is_err());
        let c = create(dir.path(), "c1", GuestKind::Tern, Lang::C).unwrap();
        assert!(
            std::fs::read_to_string(c.join("build.sh"))
                .unwrap()
                .contains("c1.wasm")
        );
    }

    #[test]
    fn a_rust_project_carries_every_file_of_the_sdk() {
        let written: Vec<&str> = files(GuestKind::Tern, Lang::Rust)
            .unwrap()
            .into_iter()
            .map(|(path, _)| path)
            .collect();
        let sdk = Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest-sdk/src");
        for entry in std::fs::read_dir(sdk).unwrap() {
            let name = entry.unwrap().file_name();
            let path = format!("tern-sdk/src/{}", name.to_string_lossy());
            assert!(
                written.contains(&path.as_str()),
                "tern new leaves out {path}"
            );
        }
    }

    #[test]
    fn components_and_cgi_programs_have_their_own_projects() {
        let dir = tempfile::tempdir().unwrap();
        let p = create(dir.path(), "my-comp", GuestKind::WasiHttp, Lang::Rust).unwrap();
        let lock = std::fs::read_to_string(p.join("Cargo.lock")).unwrap();
        assert!(lock.contains("name = \"my-comp\"") && !lock.contains("wasi-http-example"));
        let readme = std::fs::read_to_string(p.join("README.md")).unwrap();
        assert!(readme.contains("release/my_comp.wasm") && !readme.contains("{{"));
        assert_eq!(
            build_hint(GuestKind::WasiHttp, Lang::Rust, "my-comp").1,
            "target/wasm32-wasip2/release/my_comp.wasm"
        );
        let e = create(dir.path(), "c-comp", GuestKind::WasiHttp, Lang::C).unwrap_err();
        assert!(e.to_string().contains("Rust only"), "{e}");
        assert!(!dir.path().join("c-comp").exists(), "nothing written");
        let e = create(dir.path(), "z", GuestKind::Cgi, Lang::Zig).unwrap_err();
        assert!(e.to_string().contains("Rust or C"), "{e}");
        let p = create(dir.path(), "my-cgi", GuestKind::Cgi, Lang::C).unwrap();
        assert!(
            std::fs::read_to_string(p.join("main.c"))
                .unwrap()
                .contains("getenv")
        );
    }
}
