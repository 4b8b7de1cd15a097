//! Scoped admin tokens: a token reaches its own tenants with its own scopes, every other tenant
//! reads as one that does not exist and stays unchanged; revoked and expired tokens are
//! refused; the token is kept only as a digest; bad input gets clear errors; the CLI.

use http::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::{self, ADMIN_TOKEN, TestServer, admin_request, demo};

/// Makes a token with the operator's; returns its id and the whole token.
async fn make(s: &TestServer, body: Value) -> (String, String) {
    let (status, v) = s
        .admin_call(Method::POST, "/admin/v1/tokens", body.to_string())
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    let token = v["token"]
        .as_str()
        .expect("the token, shown once")
        .to_string();
    (v["id"].as_str().unwrap().to_string(), token)
}

/// A call with the scoped `token`.
async fn as_token(
    s: &TestServer,
    token: &str,
    method: Method,
    path: &str,
    body: &str,
) -> (StatusCode, Value) {
    admin_request(s.admin(), token, method, path, body.to_string().into()).await
}

/// What the operator sees of tenant `name`: its spec and version, and its variables.
async fn state_of(s: &TestServer, name: &str) -> (Value, Value) {
    let (_, t) = s
        .admin_call(Method::GET, &format!("/admin/v1/tenants/{name}"), "")
        .await;
    let (_, vars) = s
        .admin_call(
            Method::GET,
            &format!("/admin/v1/tenants/{name}/variables"),
            "",
        )
        .await;
    (
        json!([t["current"], t["paths"], t["hosts"], t["etag"]]),
        vars["variables"].clone(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_reaches_its_own_tenants_and_no_other() {
    let s = TestServer::start("").await;
    s.deploy("a", "/a", demo("hello")).await;
    s.deploy("b", "/b", demo("echo")).await;
    let cache = json!({ "cache": { "enabled": true } }).to_string();
    let (status, v) = s
        .admin_call(Method::PATCH, "/admin/v1/tenants/a", cache)
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let var = json!({ "value": "kept", "secret": false }).to_string();
    let (status, _) = s
        .admin_call(Method::PUT, "/admin/v1/tenants/b/variables/greeting", var)
        .await;
    assert_eq!(status, StatusCode::OK);
    let b_before = state_of(&s, "b").await;

    let (id, token) = make(
        &s,
        json!({ "name": "ci", "tenants": ["a", "team-*"], "scopes": ["deploy", "variables", "purge"] }),
    )
    .await;
    assert!(token.starts_with("tern_") && token.contains(&id), "{token}");

    // Its own tenant: read, deploy, variables, purge.
    let (status, list) = as_token(&s, &token, Method::GET, "/admin/v1/tenants", "").await;
    assert_eq!(status, StatusCode::OK);
    let names: Vec<&str> = list["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(names, ["a"], "listing shows its tenants only: {list}");
    assert_eq!(
        as_token(&s, &token, Method::GET, "/admin/v1/tenants/a", "")
            .await
            .0,
        StatusCode::OK
    );
    let r = admin_request(
        s.admin(),
        &token,
        Method::PUT,
        "/admin/v1/tenants/a/module",
        demo("counter").to_vec().into(),
    )
    .await;
    assert_eq!(r.0, StatusCode::OK, "{}", r.1);
    let plain = json!({ "value": "v" }).to_string();
    let path = "/admin/v1/tenants/a/variables/x";
    assert_eq!(
        as_token(&s, &token, Method::PUT, path, &plain).await.0,
        StatusCode::OK
    );
    let purge = json!({ "all": true }).to_string();
    let (status, v) = as_token(
        &s,
        &token,
        Method::POST,
        "/admin/v1/tenants/a/cache/purge",
        &purge,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    // A scope it lacks: 403 naming it.
    let secret = json!({ "value": "s", "secret": true }).to_string();
    let (status, v) = as_token(
        &s,
        &token,
        Method::PUT,
        "/admin/v1/tenants/a/variables/k",
        &secret,
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{v}");
    assert!(v["error"].as_str().unwrap().contains("\"secrets\""), "{v}");
    // Nor may it replace a secret the operator set with a plain value of its own choosing
    // (a guest would read that as the secret): 403, the secret as it was.
    let (status, _) = s
        .admin_call(
            Method::PUT,
            "/admin/v1/tenants/a/variables/api_key",
            secret.clone(),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let a_vars = state_of(&s, "a").await.1;
    let over = json!({ "value": "chosen", "secret": false }).to_string();
    let (status, v) = as_token(
        &s,
        &token,
        Method::PUT,
        "/admin/v1/tenants/a/variables/api_key",
        &over,
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{v}");
    assert!(v["error"].as_str().unwrap().contains("\"secrets\""), "{v}");
    assert_eq!(state_of(&s, "a").await.1, a_vars, "the secret was replaced");

    // Another tenant reads as one that does not exist: the same answer for `b` (which
    // exists) and `ghost` (which does not), on every endpoint.
    for (method, path, body) in [
        (Method::GET, "/admin/v1/tenants/{}", ""),
        (Method::PUT, "/admin/v1/tenants/{}", r#"{"paths": ["/x"]}"#),
        (
            Method::PATCH,
            "/admin/v1/tenants/{}",
            r#"{"paths": ["/x"]}"#,
        ),
        (Method::DELETE, "/admin/v1/tenants/{}", ""),
        (Method::PUT, "/admin/v1/tenants/{}/module", "\0asm"),
        (Method::POST, "/admin/v1/tenants/{}/rollback", ""),
        (
            Method::POST,
            "/admin/v1/tenants/{}/cache/purge",
            r#"{"all": true}"#,
        ),
        (Method::GET, "/admin/v1/tenants/{}/variables", ""),
        (
            Method::PUT,
            "/admin/v1/tenants/{}/variables/greeting",
            r#"{"value": "x"}"#,
        ),
        (
            Method::DELETE,
            "/admin/v1/tenants/{}/variables/greeting",
            "",
        ),
    ] {
        let mut answers = Vec::new();
        for name in ["b", "ghost"] {
            let (status, v) =
                as_token(&s, &token, method.clone(), &path.replace("{}", name), body).await;
            answers.push((status, v.to_string().replace(name, "NAME")));
        }
        let (b, ghost) = (answers[0].clone(), answers[1].clone());
        assert_eq!(b.0, StatusCode::NOT_FOUND, "{method} {path}: {}", b.1);
        assert_eq!(b, ghost, "{method} {path}");
    }
    assert_eq!(state_of(&s, "b").await, b_before, "b is unchanged");
    assert_eq!(s.get("/b").await.status, StatusCode::OK, "b still serves");

    // It creates tenants inside its pattern only.
    let spec = json!({ "paths": ["/tn"] }).to_string();
    let (status, v) = as_token(&s, &token, Method::PUT, "/admin/v1/tenants/team-new", &spec).await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    let (status, _) = as_token(
        &s,
        &token,
        Method::PUT,
        "/admin/v1/tenants/other-new",
        &spec,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(
        s.admin_status(Method::GET, "/admin/v1/tenants/other-new")
            .await,
        StatusCode::NOT_FOUND,
        "nothing was created"
    );

    // The operator's endpoints.
    for (method, path) in [
        (Method::GET, "/admin/v1/tokens"),
        (Method::POST, "/admin/v1/tokens"),
        (Method::POST, "/admin/v1/reload"),
        (Method::GET, "/admin/v1/certificates"),
        (Method::GET, "/admin/v1/fleet"),
        (Method::POST, "/admin/v1/secrets/reseal"),
    ] {
        let (status, v) = as_token(&s, &token, method.clone(), path, "{}").await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{method} {path}: {v}");
    }

    // Listed for the operator without a secret or a digest; kept only as a digest.
    let (_, listed) = s.admin_call(Method::GET, "/admin/v1/tokens", "").await;
    let t = &listed["tokens"][0];
    assert_eq!(t["id"], json!(id), "{listed}");
    assert_eq!(
        t["scopes"],
        json!(["deploy", "variables", "purge"]),
        "{listed}"
    );
    assert!(
        t.get("digest").is_none() && t.get("token").is_none(),
        "{listed}"
    );
    let secret_part = token.rsplit('_').next().unwrap();
    let mut files = 0;
    for entry in walk(&s.data_dir()) {
        let bytes = std::fs::read(&entry).unwrap();
        files += 1;
        assert!(
            !String::from_utf8_lossy(&bytes).contains(secret_part),
            "the token is in {}",
            entry.display()
        );
    }
    assert!(files > 0);
    let manifest = std::fs::read_to_string(s.data_dir().join("manifest.json")).unwrap();
    assert!(manifest.contains(&id), "the token's record is stored");

    // Revoked: refused from the next request.
    let (status, _) = s
        .admin_call(Method::DELETE, &format!("/admin/v1/tokens/{id}"), "")
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, v) = as_token(&s, &token, Method::GET, "/admin/v1/tenants/a", "").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{v}");
    let (status, _) = s
        .admin_call(Method::DELETE, &format!("/admin/v1/tokens/{id}"), "")
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "revoked once");

    // The audit log: a line per change and per refusal, who and from where, never a value
    // or a token.
    let log = s.data_dir().join("audit.log");
    let mut lines: Vec<Value> = Vec::new();
    for _ in 0..100 {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        lines = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
            .collect();
        if lines.iter().any(|l| l["who"] == "unknown") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let find = |what: &dyn Fn(&Value) -> bool| lines.iter().find(|l| what(l)).cloned();
    let deploy = find(&|l| l["path"] == "/admin/v1/tenants/a/module" && l["who"] == "token")
        .expect("the token's deploy is logged");
    assert_eq!(
        (
            &deploy["token"],
            &deploy["token_name"],
            &deploy["tenant"],
            &deploy["outcome"]
        ),
        (&json!(id), &json!("ci"), &json!("a"), &json!("done")),
        "{deploy}"
    );
    assert!(
        deploy["version"].as_str().is_some_and(|v| v.len() == 64),
        "{deploy}"
    );
    assert_eq!(deploy["client"], "127.0.0.1", "{deploy}");
    assert!(
        deploy["request_id"].as_str().is_some_and(|r| r.len() > 8),
        "{deploy}"
    );
    let patch = find(&|l| l["method"] == "PATCH" && l["who"] == "operator").unwrap();
    assert_eq!(patch["fields"], json!(["cache"]), "{patch}");
    let other = find(&|l| l["tenant"] == "b" && l["who"] == "token" && l["method"] == "DELETE")
        .expect("a refused attempt on another tenant is logged");
    assert_eq!(
        (&other["status"], &other["outcome"]),
        (&json!(404), &json!("refused"))
    );
    let scope = find(&|l| l["path"] == "/admin/v1/tenants/a/variables/k").unwrap();
    assert_eq!(
        (&scope["status"], &scope["outcome"]),
        (&json!(403), &json!("refused"))
    );
    let revoked = find(&|l| l["who"] == "unknown").unwrap();
    assert_eq!(
        (&revoked["token"], &revoked["status"]),
        (&json!(id), &json!(401)),
        "{revoked}"
    );
    assert!(
        find(&|l| l["method"] == "GET" && l["status"] == 200).is_none(),
        "reads are not changes"
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        !text.contains("kept") && !text.contains(secret_part),
        "no value, no token"
    );
    let mode = std::fs::metadata(&log).unwrap().permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
        0o600
    );
}

/// Every file below `dir`.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_tokens_are_refused_and_bad_input_is_explained() {
    let s = TestServer::start("").await;
    s.deploy("a", "/a", demo("hello")).await;
    let (_, token) = make(
        &s,
        json!({ "name": "short", "tenants": ["a"], "scopes": ["read"], "expires": "2s" }),
    )
    .await;
    let read = || {
        admin_request(
            s.admin(),
            &token,
            Method::GET,
            "/admin/v1/tenants/a",
            "".into(),
        )
    };
    assert_eq!(read().await.0, StatusCode::OK);
    tokio::time::sleep(std::time::Duration::from_millis(3100)).await;
    let (status, v) = read().await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{v}");
    assert!(v["error"].as_str().unwrap().contains("expired"), "{v}");
    // A scoped token's shape with a wrong secret is a wrong token.
    let mut wrong = token.clone();
    wrong.replace_range(wrong.len() - 4.., "0000");
    let (status, _) = admin_request(
        s.admin(),
        &wrong,
        Method::GET,
        "/admin/v1/tenants",
        "".into(),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    for (body, says) in [
        (
            json!({ "name": "x", "tenants": ["a"], "scopes": ["admin"] }),
            "unknown scope \"admin\"",
        ),
        (
            json!({ "name": "x", "tenants": [], "scopes": ["read"] }),
            "at least one tenant",
        ),
        (
            json!({ "name": "x", "tenants": ["*"], "scopes": ["read"] }),
            "only the operator",
        ),
        (
            json!({ "name": "x", "tenants": ["a"], "scopes": [] }),
            "at least one scope",
        ),
        (
            json!({ "name": "x", "tenants": ["a"], "scopes": ["read"], "expires": "0d" }),
            "expiry",
        ),
        (
            json!({ "name": "x", "tenants": ["a"], "scopes": ["read"], "expires": "-1d" }),
            "expiry",
        ),
        (
            json!({ "name": "", "tenants": ["a"], "scopes": ["read"] }),
            "token name",
        ),
        (
            json!({ "name": "x", "tenants": ["a"], "scopes": ["read"], "admin": true }),
            "unknown field",
        ),
    ] {
        let (status, v) = s
            .admin_call(Method::POST, "/admin/v1/tokens", body.to_string())
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {v}");
        assert!(v["error"].as_str().unwrap().contains(says), "{body}: {v}");
    }
    let (_, listed) = s.admin_call(Method::GET, "/admin/v1/tokens", "").await;
    assert_eq!(listed["tokens"].as_array().unwrap().len(), 1, "{listed}");

    // At most MAX_TOKENS: one under and at the limit are made, one more is refused.
    let max = tern::access::MAX_TOKENS;
    for i in 1..max {
        let body = json!({ "name": format!("t{i}"), "tenants": ["a"], "scopes": ["read"] });
        let (status, v) = s
            .admin_call(Method::POST, "/admin/v1/tokens", body.to_string())
            .await;
        assert_eq!(status, StatusCode::CREATED, "token {i}: {v}");
    }
    let body = json!({ "name": "over", "tenants": ["a"], "scopes": ["read"] });
    let (status, v) = s
        .admin_call(Method::POST, "/admin/v1/tokens", body.to_string())
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    assert!(v["error"].as_str().unwrap().contains("revoke"), "{v}");
    // The operator is never locked out.
    assert_eq!(
        admin_request(
            s.admin(),
            ADMIN_TOKEN,
            Method::GET,
            "/admin/v1/tenants",
            "".into()
        )
        .await
        .0,
        StatusCode::OK
    );
}

#[test]
fn the_cli_makes_lists_rotates_and_revokes_tokens_and_shows_the_audit() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let p = support::TernProcess::serve(&[], &cache);
    let tern = |args: &[&str], token: Option<&str>| {
        let mut cmd = support::tern_bin();
        cmd.args(args)
            .args(["--server", &format!("http://{}", p.admin)])
            .env("TERN_DATA_DIR", cache.join("data"))
            .env_remove("TERN_ADMIN_TOKEN");
        if let Some(t) = token {
            cmd.env("TERN_ADMIN_TOKEN", t);
        }
        let out = cmd.output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    };
    let (ok, out) = tern(
        &[
            "token",
            "create",
            "--tenant",
            "hello",
            "--scope",
            "read,purge",
            "--name",
            "ci",
        ],
        None,
    );
    assert!(ok, "{out}");
    let token = out.lines().last().unwrap().trim().to_string();
    assert!(
        token.starts_with("tern_"),
        "the token alone on the last line: {out}"
    );
    let (ok, out) = tern(&["token", "list"], None);
    assert!(
        ok && out.contains("ci") && out.contains("read,purge"),
        "{out}"
    );
    assert!(!out.contains(&token), "{out}");
    let id = token.split('_').nth(1).unwrap().to_string();
    // The scoped token lists its tenant only, and may not make tokens.
    let (ok, out) = tern(&["tenants"], Some(&token));
    assert!(
        ok && out.contains("hello") && !out.contains("echo"),
        "{out}"
    );
    let (ok, out) = tern(&["token", "list"], Some(&token));
    assert!(!ok && out.contains("403"), "{out}");
    // Its use shows in the listing.
    let (ok, out) = tern(&["token", "list"], None);
    let row = out.lines().find(|l| l.starts_with(&id)).unwrap_or("");
    assert!(
        ok && row.matches(" ago").count() == 2,
        "created and last used: {out}"
    );
    assert!(
        out.lines().next().is_some_and(|h| h.contains("LAST USED")),
        "{out}"
    );

    // Rotated: a new secret, alone on the last line; the old one is refused at once.
    let (ok, out) = tern(&["token", "rotate", &id, "--expires", "7d"], None);
    // (7d less the time since the rotation: 6d, or 7d within its second.)
    assert!(
        ok && out.contains("rotated")
            && (out.contains("expires in 6d") || out.contains("expires in 7d")),
        "{out}"
    );
    let rotated = out.lines().last().unwrap().trim().to_string();
    assert!(
        rotated.starts_with(&format!("tern_{id}_")) && rotated != token,
        "{out}"
    );
    let (ok, out) = tern(&["tenants"], Some(&token));
    assert!(!ok && out.contains("401"), "the old secret: {out}");
    let (ok, out) = tern(&["tenants"], Some(&rotated));
    assert!(ok && out.contains("hello"), "{out}");
    let (ok, out) = tern(&["token", "rotate", &id, "--expires", "0s"], None);
    assert!(
        !ok && out.contains("400") && out.contains("expiry"),
        "{out}"
    );
    let (ok, out) = tern(&["token", "rotate", "0123456789abcdef"], None);
    assert!(!ok && out.contains("404"), "{out}");

    let (ok, out) = tern(&["token", "revoke", &id], None);
    assert!(ok && out.contains("revoked"), "{out}");
    let (ok, out) = tern(&["tenants"], Some(&rotated));
    assert!(!ok && out.contains("401"), "{out}");

    // The audit: the changes in order, who made them and the refusals; operator's only.
    let (ok, out) = tern(&["audit", "--since", "1h"], None);
    assert!(ok, "{out}");
    let lines: Vec<&str> = out.lines().collect();
    let at = |needle: &str| {
        lines
            .iter()
            .position(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no {needle:?} in {out}"))
    };
    let (made, rotate, revoke) = (
        at("POST /admin/v1/tokens  201 done"),
        at(&format!("POST /admin/v1/tokens/{id}/rotate  200 done")),
        at(&format!("DELETE /admin/v1/tokens/{id}  200 done")),
    );
    assert!(made < rotate && rotate < revoke, "{out}");
    assert!(
        out.contains(&format!("unknown token {id}")) && out.contains("401 refused"),
        "{out}"
    );
    assert!(out.contains(&format!("token ci ({id})")), "{out}");
    assert!(!out.contains(&token) && !out.contains(&rotated), "{out}");
    let (ok, out) = tern(&["audit", "--json", "--limit", "1"], None);
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert!(ok && v["records"].as_array().unwrap().len() == 1, "{out}");
    assert_eq!(
        (&v["truncated"], &v["source"]),
        (&json!(true), &json!("data-dir"))
    );
    let (ok, out) = tern(&["audit", "--tenant", "echo"], None);
    assert!(ok && out.contains("no audit records match"), "{out}");
    let (ok, out) = tern(&["audit", "--since", "yesterday"], None);
    assert!(!ok && out.contains("--since"), "{out}");
    let (ok, out) = tern(&["audit", "--limit", "0"], None);
    assert!(!ok && out.contains("400"), "{out}");
    let (_, out) = tern(
        &["token", "create", "--tenant", "hello", "--scope", "read"],
        None,
    );
    let reader = out.lines().last().unwrap().trim().to_string();
    let (ok, out) = tern(&["audit"], Some(&reader));
    assert!(!ok && out.contains("403"), "{out}");
    let (ok, out) = tern(
        &["token", "create", "--tenant", "hello", "--scope", "root"],
        None,
    );
    assert!(!ok && out.contains("unknown scope"), "{out}");
}

/// The status of `GET path` on the admin listener with bearer `token`, sent from the local
/// address `from` (any of 127.0.0.0/8 reaches a listener on 127.0.0.1).
async fn status_from(from: &str, admin: std::net::SocketAddr, token: &str, path: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    let mut stream = socket.connect(admin).await.unwrap();
    let request = format!(
        "GET {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {token}\r\nconnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    let text = String::from_utf8_lossy(&answer);
    text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// A thousand wrong tokens from one address: past `FAILURES_PER_SECOND` a second they are
/// answered `429`; the operator's token is answered from that address and from another, during
/// the flood and after it; another address's wrong token is still a `401`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_tokens_from_one_address_are_slowed_and_lock_no_one_out() {
    let s = TestServer::start("").await;
    let admin = s.admin();
    let started = std::time::Instant::now();
    let flood = tokio::spawn(async move {
        let mut counts = std::collections::BTreeMap::<u16, u64>::new();
        for i in 0..1000 {
            let status = status_from(
                "127.0.0.1",
                admin,
                &format!("wrong-{i}"),
                "/admin/v1/tenants",
            )
            .await;
            *counts.entry(status).or_default() += 1;
        }
        counts
    });
    let mut operator = 0;
    while !flood.is_finished() {
        for from in ["127.0.0.1", "127.0.0.2"] {
            let status = status_from(from, admin, ADMIN_TOKEN, "/admin/v1/tenants").await;
            assert_eq!(status, 200, "the operator's token from {from}");
            operator += 1;
        }
    }
    let counts = flood.await.unwrap();
    let seconds = started.elapsed().as_secs() + 2;
    let limit = u64::from(tern::access::FAILURES_PER_SECOND);
    assert_eq!(counts.values().sum::<u64>(), 1000, "{counts:?}");
    assert!(
        counts.get(&401).copied().unwrap_or(0) <= limit * seconds,
        "at most {limit} answered per second over {seconds} s: {counts:?}"
    );
    let throttled = counts.get(&429).copied().unwrap_or(0);
    assert!(throttled > 0 && counts.len() == 2, "{counts:?}");
    assert!(operator > 0);
    assert_eq!(
        status_from("127.0.0.2", admin, "wrong", "/admin/v1/tenants").await,
        401
    );
    let m = s.metrics().await;
    assert_eq!(
        support::metric_value(&m, "tern_admin_throttled_total"),
        throttled as f64,
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_takes_no_request_from_a_tenant_it_does_not_reach() {
    let s = TestServer::start("").await;
    // The operator's: `b` serves every path of shop.b.test, `api` every host's /api.
    for (name, spec) in [
        ("b", json!({ "hosts": ["shop.b.test"], "paths": ["/"] })),
        ("api", json!({ "paths": ["/api"] })),
    ] {
        let at = format!("/admin/v1/tenants/{name}");
        let (status, v) = s.admin_call(Method::PUT, &at, spec.to_string()).await;
        assert_eq!(status, StatusCode::CREATED, "{v}");
        let (status, v) = s
            .admin_call(Method::PUT, &format!("{at}/module"), demo("hello").to_vec())
            .await;
        assert_eq!(status, StatusCode::OK, "{v}");
    }
    let (_, token) = make(
        &s,
        json!({ "name": "team", "tenants": ["team-*"], "scopes": ["deploy"] }),
    )
    .await;
    // Refused, 409 without the other tenant's name: a path of b's host, the whole of it, a
    // path under `api`'s on every host.
    for (name, spec) in [
        (
            "team-login",
            json!({ "hosts": ["shop.b.test"], "paths": ["/login"] }),
        ),
        ("team-same", json!({ "hosts": ["shop.b.test"] })),
        ("team-api", json!({ "paths": ["/api/v2"] })),
    ] {
        let at = format!("/admin/v1/tenants/{name}");
        let (status, v) = as_token(&s, &token, Method::PUT, &at, &spec.to_string()).await;
        assert_eq!(status, StatusCode::CONFLICT, "{name}: {v}");
        let error = v["error"].as_str().unwrap();
        assert!(
            !error.contains("\"b\"") && !error.contains("\"api\""),
            "{name}: the answer names the other tenant: {error}"
        );
        let (status, _) = as_token(&s, &token, Method::GET, &at, "").await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{name} was made");
    }
    let login = support::send(
        s.addr(),
        Method::GET,
        "/login",
        Some("shop.b.test"),
        &[],
        bytes::Bytes::new(),
    )
    .await;
    assert_eq!(login.status, StatusCode::OK, "b no longer answers its host");
    // Created: its own host, over `api`'s route for any host (a host no tenant names falls to
    // such a route; a team claims its own by naming it); a path beside the others.
    for (name, spec) in [
        (
            "team-site",
            json!({ "hosts": ["www.team.test"], "paths": ["/"] }),
        ),
        ("team-docs", json!({ "paths": ["/docs"] })),
    ] {
        let at = format!("/admin/v1/tenants/{name}");
        let (status, v) = as_token(&s, &token, Method::PUT, &at, &spec.to_string()).await;
        assert_eq!(status, StatusCode::CREATED, "{name}: {v}");
    }
    // The operator's token moves routes as it likes.
    let spec = json!({ "hosts": ["shop.b.test"], "paths": ["/login"] }).to_string();
    let (status, v) = s
        .admin_call(Method::PUT, "/admin/v1/tenants/ops-login", spec)
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
}
