//! Tenants through the command line and signals: `tern deploy/list/rollback/delete`, SIGHUP reloads, `--no-demo`.

use super::*;

#[test]
fn sighup_reloads_a_good_config_and_refuses_a_bad_one() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tern.toml");
    let a = "[[tenant]]\nname = \"a\"\nmodule = \"builtin:hello\"\npaths = [\"/a\"]\n";
    std::fs::write(&config, a).unwrap();
    let p = support::TernProcess::serve(
        &["--config", config.to_str().unwrap()],
        &dir.path().join("cache"),
    );
    let get = |path: &str| get_closing(&p.addr, path);
    assert!(get("/b").starts_with("HTTP/1.1 404"));
    let hup = || {
        let status = std::process::Command::new("kill")
            .args(["-HUP", &p.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    };
    std::fs::write(
        &config,
        format!("{a}[[tenant]]\nname = \"b\"\nmodule = \"builtin:counter\"\npaths = [\"/b\"]\n"),
    )
    .unwrap();
    hup();
    p.wait_for("config reloaded");
    assert!(get("/b").starts_with("HTTP/1.1 200"));
    // A bad file is refused; both tenants keep serving.
    std::fs::write(
        &config,
        "[[tenant]]\nname = \"a\"\nmodule = \"builtin:nope\"\n",
    )
    .unwrap();
    hup();
    let line = p.wait_for("reload refused");
    assert!(line.contains("nope"), "{line}");
    // `tern reload` says the same in one readable line.
    let out = support::tern_bin()
        .args(["reload", "--server", &format!("http://{}", p.admin)])
        .env("TERN_DATA_DIR", dir.path().join("cache/data"))
        .env_remove("TERN_ADMIN_TOKEN")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("1 tenant(s) failed to load: tenant \"a\"") && !err.contains(":;"),
        "{err}"
    );
    std::fs::write(&config, "[[tenant]\n").unwrap();
    hup();
    let line = p.wait_for("reload refused");
    assert!(line.contains("tern.toml:1"), "{line}");
    assert!(get("/a").contains(HELLO) && get("/b").starts_with("HTTP/1.1 200"));
}

#[test]
fn the_cli_deploys_lists_rolls_back_and_deletes() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let p = support::TernProcess::serve(&[], &cache);
    // No token configured: one was generated into the data directory, for its owner only.
    let token_file = cache.join("data/admin-token");
    let meta = std::fs::metadata(&token_file).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777,
        0o600
    );
    let hello = support::demo_file(dir.path(), "hello");
    let counter = support::demo_file(dir.path(), "counter");
    let tern = |args: &[&str]| {
        let out = support::tern_bin()
            .args(args)
            .args(["--server", &format!("http://{}", p.admin)])
            .env("TERN_DATA_DIR", cache.join("data"))
            .env_remove("TERN_ADMIN_TOKEN")
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    };
    let get = |path: &str| get_closing(&p.addr, path);
    let (ok, out) = tern(&["deploy", "site", hello.to_str().unwrap()]);
    assert!(
        ok && out.contains("created tenant site") && out.contains("deployed site version"),
        "{out}"
    );
    assert!(get("/site").contains(HELLO));
    let (ok, out) = tern(&["deploy", "site", counter.to_str().unwrap(), "--env", "A=1"]);
    assert!(ok && out.contains("previous"), "{out}");
    assert!(!get("/site").contains(HELLO));
    // A backend set from the command line changes only that: the route stays `/site`.
    let (ok, out) = tern(&[
        "deploy",
        "site",
        counter.to_str().unwrap(),
        "--backend",
        "origin=http://127.0.0.1:9",
    ]);
    assert!(ok, "{out}");
    let (ok, out) = tern(&[
        "deploy",
        "site",
        hello.to_str().unwrap(),
        "--backend",
        "nourl",
    ]);
    assert!(!ok && out.contains("NAME=URL"), "{out}");
    assert!(get("/other").contains("404"));
    // A key-value store granted from the command line; one the server does not have is
    // refused with the names of those it has.
    let visits = support::demo_file(dir.path(), "visits");
    let (ok, out) = tern(&["deploy", "v", visits.to_str().unwrap(), "--kv", "default"]);
    assert!(ok, "{out}");
    assert!(get("/v").contains("visit 1"), "{}", get("/v"));
    let (ok, out) = tern(&["deploy", "v", visits.to_str().unwrap(), "--kv", "nope"]);
    assert!(
        !ok && out.contains("no store named \"nope\"") && out.contains("default"),
        "{out}"
    );
    assert!(
        get("/v").contains("visit 2"),
        "the tenant kept its store: {}",
        get("/v")
    );
    let (ok, out) = tern(&["delete", "v"]);
    assert!(ok, "{out}");
    let (ok, out) = tern(&["tenants"]);
    assert!(
        ok && out.contains("site") && out.contains("api") && out.contains("/site"),
        "{out}"
    );
    let (_, before) = tern(&["tenants", "site"]);
    let before: serde_json::Value = serde_json::from_str(&before).expect("JSON");
    let etag = before["etag"].as_str().expect("an API tenant has an ETag");
    let (ok, out) = tern(&["rollback", "site"]);
    assert!(ok && out.contains("rolled site back"), "{out}");
    assert!(!out.contains(etag), "a new ETag: {out}");
    assert!(get("/site").contains(HELLO));
    // The same rollback again, as of the tenant before it (a retry after a lost answer): it
    // is refused, not applied a second time.
    let (ok, out) = tern(&["rollback", "site", "--if-match", etag]);
    assert!(!ok && out.contains("412"), "{out}");
    assert!(get("/site").contains(HELLO), "still rolled back once");
    let (ok, out) = tern(&["deploy", "site", config_file(dir.path()).to_str().unwrap()]);
    assert!(
        !ok && out.contains("400") && out.contains("not a WebAssembly module"),
        "{out}"
    );
    assert!(get("/site").contains(HELLO));
    // A failed first deploy leaves no tenant behind to hold its route.
    let (ok, out) = tern(&["deploy", "fresh", config_file(dir.path()).to_str().unwrap()]);
    assert!(
        !ok && out.contains("removed the new tenant fresh again"),
        "{out}"
    );
    let (_, out) = tern(&["tenants"]);
    assert!(!out.contains("fresh"), "{out}");
    // The table's columns line up under their headers.
    let header = out.lines().next().unwrap_or("");
    let row = out.lines().find(|l| l.starts_with("site ")).unwrap_or("");
    for (word, value) in [("SOURCE", "api"), ("ROUTES", "*/site")] {
        assert_eq!(header.find(word), row.find(value), "{word}:\n{out}");
    }
    let (ok, out) = tern(&["rollback", "hello"]);
    assert!(!ok && out.contains("409"), "{out}");
    assert!(
        out.contains("demo tenant of the built-in config") && out.contains("--no-demo"),
        "says how to run without the demo tenants: {out}"
    );
    let (ok, out) = tern(&["delete", "site"]);
    assert!(ok, "{out}");
    assert!(get("/site").starts_with("HTTP/1.1 404"));
    let (ok, out) = tern(&["delete", "site"]);
    assert!(!ok && out.contains("404"), "{out}");
    let out = support::tern_bin()
        .args([
            "tenants",
            "--server",
            &format!("http://{}", p.admin),
            "--token",
            "wrong",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("401") && err.contains("the token came from --token"),
        "{err}"
    );
}

#[test]
fn no_demo_serves_only_deployed_tenants() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let p = support::TernProcess::serve(&["--no-demo"], &cache);
    let get = |path: &str| get_closing(&p.addr, path);
    assert!(get("/hello").starts_with("HTTP/1.1 404"));
    let hello = support::demo_file(dir.path(), "hello");
    let out = support::tern_bin()
        .args([
            "deploy",
            "hello",
            hello.to_str().unwrap(),
            "--path",
            "/hello",
        ])
        .args(["--server", &format!("http://{}", p.admin)])
        .env("TERN_DATA_DIR", cache.join("data"))
        .env_remove("TERN_ADMIN_TOKEN")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(get("/hello").contains(HELLO));
    let refused = support::tern_bin()
        .args(["serve", "--no-demo", "--config", "x.toml"])
        .output()
        .unwrap();
    assert!(!refused.status.success());
}

/// The raw answer to `GET path` on a connection that closes after it.
fn get_closing(addr: &str, path: &str) -> String {
    let reply = support::raw_exchange(
        addr.parse().unwrap(),
        format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes(),
        std::time::Duration::from_secs(20),
    );
    String::from_utf8_lossy(&reply).into_owned()
}
