//! Tenants' variables and secrets: set through the admin API (and the config file), read by
//! guests through the APIs they already use (a Spin component built with spin-sdk reads them
//! with `spin_sdk::variables` and `wasi:config/store`; a CGI program in its environment),
//! a secret never shown by the API nor written in clear text, another key opening nothing,
//! and a rotation of the key keeping every secret.

use http::{Method, StatusCode};

use crate::support::{
    TestServer, restart_dir, spin_module, spin_p3_component, test_component, test_guest,
};

const SECRET: &str = "sk-live-TESTSECRET-4242";

/// A server (its secrets key in the file `key` holding `key`) with a spin-sdk 5 component at
/// `/spin` and a CGI program at `/cgi`, both API tenants.
async fn server_in(dir: tempfile::TempDir, key: &str, previous: Option<&str>) -> TestServer {
    std::fs::write(dir.path().join("key"), format!("{key}\n")).unwrap();
    let mut server = format!(
        "[server]\nsecrets_key_file = \"{}\"\n",
        dir.path().join("key").display()
    );
    if let Some(p) = previous {
        std::fs::write(dir.path().join("previous"), p).unwrap();
        server.push_str(&format!(
            "secrets_previous_key_file = \"{}\"\n",
            dir.path().join("previous").display()
        ));
    }
    TestServer::try_start_in(
        dir,
        &format!("{server}[pool]\ninstances = 8\nmax_memory_mib = 64\n"),
    )
    .await
    .expect("start")
}

async fn deploy_guests(s: &TestServer) {
    test_guest(s.dir.path(), "config_probe");
    let abi = std::fs::read(s.dir.path().join("config_probe.wasm")).unwrap();
    s.deploy("abi", "/abi", &abi).await;
    let spin = std::fs::read(spin_module(s.dir.path(), 5, "spin5")).unwrap();
    s.deploy("spin", "/spin", &spin).await;
    test_guest(s.dir.path(), "cgi_probe");
    let cgi = std::fs::read(s.dir.path().join("cgi_probe.wasm")).unwrap();
    s.deploy_as("cgi", "/cgi", &cgi, "cgi").await;
}

/// `PUT /admin/v1/tenants/{tenant}/variables/{name}` with `body`: its status and answer.
async fn put(
    s: &TestServer,
    tenant: &str,
    name: &str,
    body: impl Into<bytes::Bytes>,
) -> (StatusCode, serde_json::Value) {
    s.admin_call(
        Method::PUT,
        &format!("/admin/v1/tenants/{tenant}/variables/{name}"),
        body,
    )
    .await
}

/// Sets a variable; its answer.
async fn set(
    s: &TestServer,
    tenant: &str,
    name: &str,
    value: &str,
    secret: bool,
) -> serde_json::Value {
    let body = serde_json::json!({ "value": value, "secret": secret }).to_string();
    let (status, v) = put(s, tenant, name, body).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    v
}

/// Every file under `dir` that holds `needle`.
fn files_holding(dir: &std::path::Path, needle: &[u8]) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if std::fs::read(&path)
                .is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle))
            {
                found.push(path);
            }
        }
    }
    found
}

const KEY1: &str = "1111111111111111111111111111111111111111111111111111111111111111";
const KEY2: &str = "2222222222222222222222222222222222222222222222222222222222222222";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guests_read_variables_and_secrets_that_the_api_never_shows() {
    let s = server_in(tempfile::tempdir().unwrap(), KEY1, None).await;
    deploy_guests(&s).await;
    // Undefined is Spin's `undefined` and wasi:config's `none`, not a trap.
    let r = s.get("/spin/var/region").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text());
    assert!(r.text().starts_with("undefined"), "{}", r.text());
    assert_eq!(
        s.get("/spin/config/region").await.status,
        StatusCode::NOT_FOUND
    );

    set(&s, "spin", "region", "eu-west", false).await;
    let v = set(&s, "spin", "api_key", SECRET, true).await;
    assert!(!v.to_string().contains(SECRET), "{v}");
    assert_eq!(v["variable"]["secret"], true);
    assert_eq!(v["variable"]["digest"].as_str().unwrap().len(), 16);
    set(&s, "cgi", "api_key", SECRET, true).await;
    set(&s, "cgi", "region", "eu-west", false).await;
    set(&s, "abi", "api_key", SECRET, true).await;

    // The next request reads them, with no new version.
    for (path, want) in [
        ("/spin/var/region", "eu-west"),
        ("/spin/var/api_key", SECRET),
        ("/spin/config/api_key", SECRET),
        ("/spin/config/region", "eu-west"),
        ("/spin/config/", "api_key,region"),
    ] {
        let r = s.get(path).await;
        assert_eq!(r.status, StatusCode::OK, "{path}: {}", r.text());
        assert_eq!(r.text(), want, "{path}");
    }
    // The Tern ABI's `config_get` (tern_sdk::config::get).
    let r = s.get("/abi?name=api_key").await;
    assert_eq!((r.status, r.text()), (StatusCode::OK, SECRET.to_string()));
    assert_eq!(
        s.get("/abi?name=region").await.status,
        StatusCode::NOT_FOUND
    );
    let r = s.get("/abi?name=Bad").await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(r.text().contains("not a variable name"), "{}", r.text());
    let long = "y".repeat(10_000);
    set(&s, "abi", "long", &long, false).await;
    assert_eq!(
        s.get("/abi?name=long").await.text(),
        long,
        "a value past the first buffer"
    );
    let env = s.get("/cgi/env").await.text();
    assert!(env.contains(&format!("API_KEY={SECRET}\n")), "{env}");
    assert!(env.contains("REGION=eu-west\n"), "{env}");
    // A variable cannot override a CGI meta-variable.
    set(&s, "cgi", "request_method", "POST", false).await;
    assert!(
        s.get("/cgi/env")
            .await
            .text()
            .contains("REQUEST_METHOD=GET\n")
    );

    // The API lists a secret's name and digest, never its value, wherever a tenant is shown.
    let (status, listed) = s
        .admin_call(Method::GET, "/admin/v1/tenants/spin/variables", "")
        .await;
    assert_eq!(status, StatusCode::OK);
    let vars = listed["variables"].as_array().unwrap();
    assert_eq!(vars.len(), 2, "{listed}");
    assert_eq!(vars[0]["name"], "api_key");
    assert!(vars[0].get("value").is_none(), "{listed}");
    assert_eq!(vars[1]["value"], "eu-west");
    for path in [
        "/admin/v1/tenants/spin/variables",
        "/admin/v1/tenants/spin",
        "/admin/v1/tenants",
    ] {
        let (_, v) = s.admin_call(Method::GET, path, "").await;
        assert!(!v.to_string().contains(SECRET), "{path}: {v}");
    }
    // Setting the same value again gives the same digest; another value another one.
    let again = set(&s, "spin", "api_key", SECRET, true).await;
    assert_eq!(again["variable"]["digest"], v["variable"]["digest"]);
    let other = set(&s, "cgi", "other", "x", true).await;
    assert_ne!(other["variable"]["digest"], v["variable"]["digest"]);

    // Bad input: a clear error, and never the value back.
    for (body, status) in [
        (
            serde_json::json!({"value": SECRET, "secret": true, "extra": 1}).to_string(),
            StatusCode::BAD_REQUEST,
        ),
        (format!("{{\"value\": {SECRET}}}"), StatusCode::BAD_REQUEST),
        (
            serde_json::json!({"value": "x".repeat(32 * 1024 + 1), "secret": true}).to_string(),
            StatusCode::BAD_REQUEST,
        ),
    ] {
        let (got, v) = put(&s, "spin", "bad", body).await;
        assert_eq!(got, status, "{v}");
        assert!(
            !v.to_string().contains(SECRET) && !v.to_string().contains("xxxx"),
            "{v}"
        );
    }
    let limit = "x".repeat(32 * 1024);
    set(&s, "spin", "big", &limit, true).await;
    assert_eq!(s.get("/spin/var/big").await.text(), limit);
    let (got, v) = put(
        &s,
        "spin",
        "Bad-Name",
        serde_json::json!({"value": "x"}).to_string(),
    )
    .await;
    assert_eq!(got, StatusCode::BAD_REQUEST, "{v}");
    assert!(v.to_string().contains("not a variable name"), "{v}");
    let (got, _) = put(
        &s,
        "nobody",
        "a",
        serde_json::json!({"value": "x"}).to_string(),
    )
    .await;
    assert_eq!(got, StatusCode::NOT_FOUND);

    // Deleted: undefined again at once.
    let (got, _) = s
        .admin_call(
            Method::DELETE,
            "/admin/v1/tenants/spin/variables/region",
            "",
        )
        .await;
    assert_eq!(got, StatusCode::OK);
    assert_eq!(
        s.get("/spin/var/region").await.status,
        StatusCode::NOT_FOUND
    );
    let (got, _) = s
        .admin_call(
            Method::DELETE,
            "/admin/v1/tenants/spin/variables/region",
            "",
        )
        .await;
    assert_eq!(got, StatusCode::NOT_FOUND);

    // Nothing on disk holds the secret in clear text (the manifest holds it sealed).
    let found = files_holding(s.dir.path(), SECRET.as_bytes());
    assert!(found.is_empty(), "clear text in {found:?}");
    let manifest = std::fs::read_to_string(s.dir.path().join("data/manifest.json")).unwrap();
    assert!(manifest.contains("\"sealed\""), "{manifest}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_key_opens_no_secret_and_a_rotation_keeps_every_one() {
    let s = server_in(tempfile::tempdir().unwrap(), KEY1, None).await;
    deploy_guests(&s).await;
    set(&s, "spin", "api_key", SECRET, true).await;
    set(&s, "abi", "api_key", SECRET, true).await;
    set(&s, "spin", "region", "eu-west", false).await;
    assert_eq!(s.get("/spin/var/api_key").await.text(), SECRET);

    // Restarted with another key: the tenant serves, its reads fail and say why.
    let s = server_in(restart_dir(s), KEY2, None).await;
    let r = s.get("/abi?name=api_key").await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "{}", r.text());
    assert!(
        r.text().contains("cannot open the tenant's secrets"),
        "{}",
        r.text()
    );
    let r = s.get("/spin/var/api_key").await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "{}", r.text());
    assert!(
        r.text().contains("Provider") && r.text().contains("TERN_SECRETS_KEY"),
        "{}",
        r.text()
    );
    assert!(!r.text().contains(SECRET));
    assert_eq!(
        s.get("/spin/config/region").await.status,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    assert_eq!(
        s.get("/spin/hello").await.status,
        StatusCode::OK,
        "the tenant still serves"
    );

    // A rotation: the new key with the old as the previous one opens them; a reseal moves
    // them to the new key; then the old key is no longer needed.
    let s = server_in(restart_dir(s), KEY2, Some(KEY1)).await;
    assert_eq!(s.get("/spin/var/api_key").await.text(), SECRET);
    let (status, v) = s
        .admin_call(Method::POST, "/admin/v1/secrets/reseal", "")
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["resealed"], 2, "{v}");
    let (_, v) = s
        .admin_call(Method::POST, "/admin/v1/secrets/reseal", "")
        .await;
    assert_eq!(v["resealed"], 0, "{v}");
    let s = server_in(restart_dir(s), KEY2, None).await;
    assert_eq!(s.get("/spin/var/api_key").await.text(), SECRET);
    assert_eq!(s.get("/spin/var/region").await.text(), "eu-west");
}

/// A WASI 0.3 component (spin-sdk 7, `spin:variables@3.0.0`, an async function) and a
/// component built against `wasi:config/store@0.2.0-draft` read the same variables; the next
/// request sees a change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wasi_p3_components_and_the_wasi_config_draft_read_variables() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("key"), format!("{KEY1}\n")).unwrap();
    let config = format!(
        "[server]\nsecrets_key_file = \"{}\"\n\
         [pool]\ninstances = 4\nmax_memory_mib = 64\nwasi_p3 = true\n",
        dir.path().join("key").display()
    );
    let s = TestServer::try_start_in(dir, &config).await.expect("start");
    let p3 = std::fs::read(spin_p3_component(s.dir.path(), "p3")).unwrap();
    s.deploy("p3", "/p3", &p3).await;
    let c = std::fs::read(test_component(s.dir.path(), "component")).unwrap();
    s.deploy("c", "/c", &c).await;

    let r = s.get("/p3/var/region").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text());
    assert!(r.text().starts_with("undefined"), "{}", r.text());
    let r = s.get("/c/config?name=region").await;
    assert_eq!((r.status, r.text()), (StatusCode::NOT_FOUND, "none".into()));

    for tenant in ["p3", "c"] {
        set(&s, tenant, "region", "eu-west", false).await;
        set(&s, tenant, "api_key", SECRET, true).await;
    }
    for (path, want) in [
        ("/p3/var/region", "eu-west"),
        ("/p3/var/api_key", SECRET),
        ("/c/config?name=region", "eu-west"),
        ("/c/config?name=api_key", SECRET),
        ("/c/config", "api_key,region"),
    ] {
        let r = s.get(path).await;
        assert_eq!(
            (r.status, r.text()),
            (StatusCode::OK, want.into()),
            "{path}"
        );
    }
    let r = s.get("/p3/var/Region").await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(r.text().contains("InvalidName"), "{}", r.text());
    set(&s, "p3", "region", "us-east", false).await;
    assert_eq!(s.get("/p3/var/region").await.text(), "us-east");
    // One tenant's variables are not another's.
    set(&s, "c", "only_c", "x", false).await;
    assert_eq!(s.get("/p3/var/only_c").await.status, StatusCode::NOT_FOUND);
}

/// An `env` entry taken from a variable (`{"variable": "api_key"}`): a guest reading its
/// environment gets the secret, the tenant's spec holds only the variable's name, and the next
/// guest sees a change; an entry whose variable is undefined is left out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_env_entry_taken_from_a_secret_reaches_guests_and_stays_out_of_the_spec() {
    let s = server_in(tempfile::tempdir().unwrap(), KEY1, None).await;
    test_guest(s.dir.path(), "env_dump");
    let abi = std::fs::read(s.dir.path().join("env_dump.wasm")).unwrap();
    let component = std::fs::read(test_component(s.dir.path(), "component")).unwrap();
    let env = serde_json::json!({
        "PLAIN": "x",
        "API_KEY": { "variable": "api_key" },
        "MISSING": { "variable": "nope" },
    });
    for (tenant, path, wasm) in [("abi", "/abi", &abi), ("c", "/c", &component)] {
        s.deploy(tenant, path, wasm).await;
        let spec = serde_json::json!({ "env": env }).to_string();
        let (status, v) = s
            .admin_call(Method::PATCH, &format!("/admin/v1/tenants/{tenant}"), spec)
            .await;
        assert!(status.is_success(), "{v}");
        set(&s, tenant, "api_key", SECRET, true).await;
    }
    for path in ["/abi", "/c/env"] {
        let text = s.get(path).await.text();
        assert!(
            text.contains(&format!("API_KEY={SECRET}\n")),
            "{path}: {text}"
        );
        assert!(text.contains("PLAIN=x\n"), "{path}: {text}");
        assert!(!text.contains("MISSING"), "{path}: {text}");
    }
    let (_, v) = s.admin_call(Method::GET, "/admin/v1/tenants/c", "").await;
    assert_eq!(v["spec"]["env"]["API_KEY"]["variable"], "api_key", "{v}");
    assert!(!v.to_string().contains(SECRET), "{v}");
    assert!(
        files_holding(s.dir.path(), SECRET.as_bytes()).is_empty(),
        "a file holds the secret"
    );
    set(&s, "c", "api_key", "rotated", true).await;
    assert!(s.get("/c/env").await.text().contains("API_KEY=rotated\n"));
    // A reference to a name no variable may have is refused with why.
    let spec = serde_json::json!({ "env": { "K": { "variable": "Bad" } } }).to_string();
    let (status, v) = s
        .admin_call(Method::PATCH, "/admin/v1/tenants/c", spec)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert!(v.to_string().contains("not a variable name"), "{v}");
    let spec = serde_json::json!({ "env": { "K": { "value": "x" } } }).to_string();
    let (status, v) = s
        .admin_call(Method::PATCH, "/admin/v1/tenants/c", spec)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert!(v.to_string().contains("variable = "), "{v}");
}

/// `tern dev --var` and `--secret` (a secret from its environment): the guest reads both, and
/// nothing `tern dev` prints holds the secret.
#[test]
fn tern_dev_gives_its_guest_variables_and_prints_no_secret() {
    let dir = tempfile::tempdir().unwrap();
    let module = spin_module(dir.path(), 5, "spin5");
    let dev = crate::support::TernDev::start_with(
        &module,
        &dir.path().join("cache"),
        &[
            "--var",
            "region=eu-west",
            "--secret",
            "api_key=TERN_DEV_TEST_KEY",
        ],
        &[("TERN_DEV_TEST_KEY", SECRET), ("TERN_LOG", "debug")],
    );
    let r = dev.get("/var/api_key");
    assert!(r.starts_with("HTTP/1.1 200") && r.ends_with(SECRET), "{r}");
    assert!(dev.get("/var/region").ends_with("eu-west"));
    assert!(dev.get("/var/nope").starts_with("HTTP/1.1 404"));
    let r = dev.get("/config/");
    assert!(r.ends_with("api_key,region"), "{r}");
    let pid = dev.pid();
    let output = dev.stop();
    // Its generated config and data directory are gone with it.
    let left: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .filter(|e| (e.file_name().to_string_lossy()).starts_with(&format!("tern-dev-{pid}-")))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    assert!(
        output.iter().any(|l| l.contains("/var/api_key")),
        "the requests are in the output: {output:?}"
    );
    assert!(
        !output.iter().any(|l| l.contains(SECRET)),
        "the secret is in the output: {output:?}"
    );
}

/// A config-file tenant's variables: plain ones in the file, secrets from a file or the
/// server's environment (never a literal in the file).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_file_variables_and_secrets_from_files_and_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    spin_module(dir.path(), 5, "spin5");
    std::fs::write(dir.path().join("api-key"), format!("{SECRET}\n")).unwrap();
    let config = "[pool]\ninstances = 8\nmax_memory_mib = 64\n\
         [[tenant]]\nname = \"spin\"\nmodule = \"spin5.wasm\"\npaths = [\"/spin\"]\n\
         [tenant.variables]\nregion = \"eu-west\"\napi_key = { secret_file = \"api-key\" }\n\
         home = { secret_env = \"HOME\" }\n";
    let s = TestServer::try_start_in(dir, config).await.expect("start");
    assert_eq!(s.get("/spin/var/region").await.text(), "eu-west");
    assert_eq!(s.get("/spin/var/api_key").await.text(), SECRET);
    assert_eq!(
        s.get("/spin/var/home").await.text(),
        std::env::var("HOME").unwrap_or_default()
    );
    // The file's tenants are changed in the file.
    let (status, _) = put(
        &s,
        "spin",
        "region",
        serde_json::json!({"value": "x"}).to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT);

    for (vars, want) in [
        ("Region = \"x\"", "not a variable name"),
        (
            "a = { secret_env = \"A\", secret_file = \"b\" }",
            "one of secret_env or secret_file",
        ),
    ] {
        let err = TestServer::try_start(&format!(
            "[[tenant]]\nname = \"t\"\nmodule = \"builtin:hello\"\n[tenant.variables]\n{vars}\n"
        ))
        .await
        .err()
        .expect("refused");
        assert!(format!("{err:#}").contains(want), "{err:#}");
    }
}

/// `tern var` and `tern secret` as an operator uses them: a secret read from standard input
/// (never an argument), listed with its digest, never its value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_line_sets_lists_and_deletes_variables_and_secrets() {
    let s = server_in(tempfile::tempdir().unwrap(), KEY1, None).await;
    deploy_guests(&s).await;
    let tern = |args: &[&str], stdin: Option<&str>| {
        let mut cmd = crate::support::tern_bin();
        cmd.args(args)
            .args(["--server", &format!("http://{}", s.admin())])
            .args(["--token", crate::support::ADMIN_TOKEN])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let input = stdin.unwrap_or_default().to_string();
        let mut pipe = child.stdin.take().unwrap();
        std::io::Write::write_all(&mut pipe, input.as_bytes()).unwrap();
        drop(pipe);
        let out = child.wait_with_output().unwrap();
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let (ok, text) = tern(
        &["secret", "set", "spin", "api_key"],
        Some(&format!("{SECRET}\n")),
    );
    assert!(
        ok && text.contains("secret api_key of spin set (digest "),
        "{text}"
    );
    assert!(!text.contains(SECRET), "{text}");
    let (ok, text) = tern(&["var", "set", "spin", "region", "eu-west"], None);
    assert!(ok, "{text}");
    assert_eq!(
        s.get("/spin/var/api_key").await.text(),
        SECRET,
        "the final newline dropped"
    );
    assert_eq!(s.get("/spin/var/region").await.text(), "eu-west");
    let (ok, text) = tern(&["secret", "list", "spin"], None);
    assert!(
        ok && text.contains("api_key") && text.contains("digest "),
        "{text}"
    );
    assert!(!text.contains("region") && !text.contains(SECRET), "{text}");
    let (ok, text) = tern(&["var", "list", "spin"], None);
    assert!(
        ok && text.contains("eu-west") && !text.contains(SECRET),
        "{text}"
    );
    let year = text
        .lines()
        .nth(1)
        .and_then(|l| l.split_whitespace().nth(2));
    assert!(
        year.is_some_and(|t| t.len() == 20 && t.starts_with("20") && t.ends_with('Z')),
        "a readable UTC time: {text}"
    );
    // `tern deploy --env-from` gives a guest's environment a secret by its variable's name.
    let cgi = s.dir.path().join("cgi_probe.wasm");
    let (ok, text) = tern(
        &[
            "deploy",
            "cgi",
            cgi.to_str().unwrap(),
            "--kind",
            "cgi",
            "--path",
            "/cgi",
            "--env",
            "MODE=test",
            "--env-from",
            "TOKEN=api_key",
        ],
        None,
    );
    assert!(ok, "{text}");
    let (ok, text) = tern(&["secret", "set", "cgi", "api_key"], Some(SECRET));
    assert!(ok, "{text}");
    let env = s.get("/cgi/env").await.text();
    assert!(
        env.contains(&format!("TOKEN={SECRET}\n")) && env.contains("MODE=test\n"),
        "{env}"
    );
    let (ok, text) = tern(&["tenants", "cgi"], None);
    assert!(
        ok && text.contains("api_key") && !text.contains(SECRET),
        "{text}"
    );
    let (ok, text) = tern(&["secret", "delete", "spin", "api_key"], None);
    assert!(ok, "{text}");
    assert_eq!(
        s.get("/spin/var/api_key").await.status,
        StatusCode::NOT_FOUND
    );
    let (ok, text) = tern(&["var", "set", "spin", "Bad", "x"], None);
    assert!(!ok && text.contains("not a variable name"), "{text}");
    let (ok, text) = tern(&["secret", "reseal"], None);
    assert!(ok && text.contains("0 secret(s) sealed again"), "{text}");
}

/// A request of a deleted tenant still running (its body still on its way) reads none of the
/// variables of the tenant created again under its name: each tenant's variables are its own
/// (by its name and id), not its name's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_tenants_request_still_running_reads_no_variable_of_its_successor() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let s = server_in(tempfile::tempdir().unwrap(), KEY1, None).await;
    test_guest(s.dir.path(), "config_probe");
    let wasm = std::fs::read(s.dir.path().join("config_probe.wasm")).unwrap();
    let make = async |value: &str| {
        let spec = serde_json::json!({"paths": ["/v"], "limits": {"timeout_ms": 30000}});
        s.create_and_deploy("v", spec, &wasm).await;
        set(&s, "v", "token", value, true).await;
    };
    make("first-tenants-secret").await;
    let read = s.get("/v?name=token").await;
    assert_eq!(read.text(), "first-tenants-secret");

    // A request whose body is held back, in flight at the guest.
    let mut conn = tokio::net::TcpStream::connect(s.addr()).await.unwrap();
    conn.write_all(
        b"POST /v?name=token HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\nconnection: close\r\n\r\na",
    )
    .await
    .unwrap();
    // Its guest running (an instance in use), waiting for the rest of the body.
    let running = |m: &str| {
        m.lines().any(|l| {
            l.starts_with("tern_pool_slots{")
                && l.contains("kind=\"instances\"")
                && l.contains("state=\"in_use\"")
                && l.ends_with(" 1")
        })
    };
    let started = std::time::Instant::now();
    while !running(&s.metrics().await) {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "the guest never ran"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    // Deleted, and another tenant made under its name, with a secret of its own.
    assert!(
        s.admin_status(Method::DELETE, "/admin/v1/tenants/v")
            .await
            .is_success()
    );
    make("successors-secret").await;
    conn.write_all(b"b").await.unwrap();
    let mut reply = Vec::new();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        conn.read_to_end(&mut reply),
    )
    .await;
    let reply = String::from_utf8_lossy(&reply);
    assert!(
        !reply.contains("successors-secret"),
        "the deleted tenant's request read its successor's secret: {reply}"
    );
    assert!(
        reply.starts_with("HTTP/1.1 404 "),
        "none of its own left: {reply}"
    );
    // The successor's own requests read it.
    assert_eq!(s.get("/v?name=token").await.text(), "successors-secret");
}
