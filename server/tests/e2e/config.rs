//! The `tern` command: bad configs are refused with file:line, `--help` documents every command.

use crate::support::tern_bin;

#[test]
fn bad_config_exits_nonzero_naming_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "[server]\nlisten = \"127.0.0.1:0\"\n\n[[tenant]]\nname = \"a b\"\nmodule = \"x.wasm\"\n",
    )
    .unwrap();
    let out = tern_bin()
        .arg("serve")
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("{}:5:", path.display())) && err.contains("tenant.name"),
        "{err}"
    );

    std::fs::write(&path, "[pool]\ninstances = \"many\"\n").unwrap();
    let out = tern_bin()
        .arg("serve")
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("{}:2:", path.display())), "{err}");

    let out = tern_bin()
        .arg("serve")
        .arg("--config")
        .arg(dir.path().join("missing.toml"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.toml: cannot read"));
}

#[test]
fn every_command_has_help() {
    for args in [
        &["--help"][..],
        &["serve", "--help"],
        &["compile", "--help"],
    ] {
        let out = tern_bin().args(args).output().unwrap();
        assert!(out.status.success(), "{args:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("Usage: tern"), "{args:?}: {text}");
    }
    let out = tern_bin().args(["serve", "--help"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("--listen") && text.contains("--admin-listen") && text.contains("--config")
    );
}
