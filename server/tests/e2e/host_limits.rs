//! The host's limits that many tenants meet: a server out of open files refuses a deploy with
//! `507` and says which limit, while every tenant it holds keeps serving its own module.

use http::{Method, StatusCode};

use crate::support::{TernProcess, admin_request, get_at, guest_wat};

const TOKEN: &str = "host-limits-token";
/// Open files the server may have: room for its own, a listener each, a few modules.
const LIMIT: usize = 64;

/// A guest that answers with `word`.
fn says(word: &str) -> Vec<u8> {
    let handler = format!(
        "(drop (call $write (i32.const 16) (i32.const {})))",
        word.len()
    );
    wat::parse_str(guest_wat(&handler, word)).expect("valid WAT")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_open_files_a_deploy_is_507_and_every_tenant_keeps_its_module() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tern.toml");
    std::fs::write(&config, "[pool]\ninstances = 4\n").unwrap();
    let config = config.display().to_string();
    let tern = TernProcess::serve_with_open_files(
        LIMIT,
        &["--config", &config],
        &dir.path().join("cache"),
        |cmd| {
            cmd.env("TERN_ADMIN_TOKEN", TOKEN);
        },
    );
    // Start-up said that the limit holds fewer connections than server.max_connections.
    let warning = tern
        .logged(&format!("the server may open {LIMIT} files"))
        .expect("a start-up warning about the limit of open files");
    assert!(warning.contains("server.max_connections"), "{warning}");
    let (admin, public) = (
        tern.admin.parse().expect("admin address"),
        tern.addr.parse().expect("public address"),
    );
    let call = |method: Method, path: String, body: Vec<u8>| async move {
        admin_request(admin, TOKEN, method, &path, body.into()).await
    };

    // Each deploy keeps one more file open (its module's artifact) until one finds none.
    let mut served = Vec::new();
    let (status, refusal) = loop {
        let name = format!("t{}", served.len());
        assert!(
            served.len() < LIMIT,
            "no deploy refused with {LIMIT} open files"
        );
        let spec = serde_json::json!({ "paths": [format!("/{name}")] }).to_string();
        let (status, v) = call(
            Method::PUT,
            format!("/admin/v1/tenants/{name}"),
            spec.into(),
        )
        .await;
        if status != StatusCode::OK && status != StatusCode::CREATED {
            break (status, v);
        }
        let module = format!("/admin/v1/tenants/{name}/module");
        let (status, v) = call(Method::PUT, module, says(&name)).await;
        if status != StatusCode::OK {
            break (status, v);
        }
        served.push(name);
    };
    assert_eq!(status, StatusCode::INSUFFICIENT_STORAGE, "{refusal}");
    let text = refusal["error"].as_str().unwrap_or_default().to_string();
    assert!(
        text.contains(&format!("no file descriptor left (limit {LIMIT}"))
            && text.contains("ulimit -n"),
        "{text}"
    );
    assert!(!served.is_empty(), "the first deploy was refused: {text}");

    // A new module for a tenant that has one is refused the same way and changes nothing.
    let (status, v) = call(
        Method::PUT,
        "/admin/v1/tenants/t0/module".into(),
        says("replaced"),
    )
    .await;
    assert_eq!(status, StatusCode::INSUFFICIENT_STORAGE, "{v}");
    for name in &served {
        let r = get_at(public, &format!("/{name}")).await;
        assert_eq!((r.status, r.text()), (StatusCode::OK, name.clone()));
    }
}
