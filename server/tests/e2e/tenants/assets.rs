//! Assets served from memory; guests without assets see no files.

use super::*;

#[tokio::test]
async fn assets_are_served_from_memory_and_traversal_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let site = dir.path().join("site");
    std::fs::create_dir_all(site.join("css")).unwrap();
    std::fs::write(site.join("index.html"), "<h1>home</h1>").unwrap();
    std::fs::write(site.join("css/site.css"), "body{}").unwrap();
    std::fs::write(dir.path().join("secret.txt"), "top secret").unwrap();
    let config = "[pool]\ninstances = 8\nmax_memory_mib = 64\n\
        [[tenant]]\nname = \"site\"\nmodule = \"builtin:static\"\npaths = [\"/site\"]\nassets = \"site\"\n";
    let s = TestServer::try_start_in(dir, config).await.unwrap();
    let r = s.get("/site/").await;
    assert_eq!(
        (r.status, r.text().as_str()),
        (StatusCode::OK, "<h1>home</h1>")
    );
    assert_eq!(r.header("content-type"), "text/html; charset=utf-8");
    assert_eq!(s.get("/site/css/site.css").await.text(), "body{}");
    assert_eq!(s.get("/site/nope.txt").await.status, StatusCode::NOT_FOUND);
    // Climbing out of /assets: refused by the host, whatever the guest asks for.
    for path in [
        "/site/../secret.txt",
        "/site/../../../etc/passwd",
        "/site/css/../../secret.txt",
    ] {
        let reply = support::raw(
            s.addr(),
            format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"),
        )
        .await;
        assert!(
            reply.starts_with("HTTP/1.1 403") || reply.starts_with("HTTP/1.1 404"),
            "{path}: {reply}"
        );
        assert!(
            !reply.contains("top secret") && !reply.contains("root:"),
            "{path}: {reply}"
        );
    }

    // Deployed through the API as a tar archive; links in an archive are refused.
    let mut tar = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(5);
    h.set_mode(0o644);
    tar.append_data(&mut h, "index.html", &b"api!\n"[..])
        .unwrap();
    let archive = tar.into_inner().unwrap();
    let (status, v) = s
        .admin_call(Method::POST, "/admin/v1/assets", archive)
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    let hash = v["assets"].as_str().unwrap().to_string();
    let (status, _) = s
        .admin_call(
            Method::PUT,
            "/admin/v1/tenants/web",
            r#"{"paths": ["/web"]}"#,
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, v) = s
        .admin_call(
            Method::PUT,
            &format!("/admin/v1/tenants/web/module?assets={hash}"),
            demo("static").to_vec(),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["assets"], hash.as_str());
    assert_eq!(s.get("/web/index.html").await.text(), "api!\n");

    let mut tar = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_size(0);
    tar.append_link(&mut h, "passwd", "/etc/passwd").unwrap();
    let (status, v) = s
        .admin_call(Method::POST, "/admin/v1/assets", tar.into_inner().unwrap())
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert!(v["error"].as_str().unwrap().contains("symlink"), "{v}");
    let (status, _) = s
        .admin_call(
            Method::PUT,
            &format!("/admin/v1/tenants/web/module?assets={}", "0".repeat(64)),
            demo("static").to_vec(),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn guests_without_assets_see_no_files() {
    let s = TestServer::start("[[tenant]]\nname = \"s\"\nmodule = \"builtin:static\"\n").await;
    assert_eq!(s.get("/index.html").await.status, StatusCode::NOT_FOUND);
}
