//! `tern cert`: certificates uploaded through the admin API.

use std::path::Path;

use anyhow::Context;
use http::Method;
use serde_json::{Value, json};

use super::admin_client::AdminClient;

/// `tern cert put NAME --cert F --key F [--host H]...`.
///
/// # Errors
/// If a file cannot be read or the server refuses the certificate.
pub async fn cert_put(
    target: &AdminClient,
    name: &str,
    cert: &Path,
    key: &Path,
    hosts: &[String],
) -> anyhow::Result<()> {
    let read = |p: &Path| {
        std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))
    };
    let body = json!({ "hosts": hosts, "cert": read(cert)?, "key": read(key)? });
    let path = format!("/admin/v1/certificates/{name}");
    let v = target.send_json(Method::PUT, &path, &body).await?;
    let what = if hosts.is_empty() {
        "as the default certificate".to_string()
    } else {
        format!("for {}", hosts.join(", "))
    };
    let verb = if v["created"] == true {
        "stored"
    } else {
        "replaced"
    };
    println!("{verb} certificate {name} {what}; served from the next handshake");
    Ok(())
}

/// `tern cert list [--json]`.
///
/// # Errors
/// If the server cannot be reached or has no TLS listener.
pub async fn cert_list(target: &AdminClient, as_json: bool) -> anyhow::Result<()> {
    let v = target.send(Method::GET, "/admin/v1/certificates").await?;
    if as_json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let now = v["now"].as_i64().unwrap_or(0);
    println!("{:<24} {:<8} {:<12} HOSTS", "NAME", "SOURCE", "EXPIRES IN");
    for c in v["certificates"].as_array().into_iter().flatten() {
        let left = c["not_after"].as_i64().unwrap_or(0) - now;
        let expires = if left < 0 {
            "EXPIRED".to_string()
        } else {
            format!("{}d {}h", left / 86400, left % 86400 / 3600)
        };
        let hosts: Vec<&str> = c["hosts"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        println!(
            "{:<24} {:<8} {:<12} {}",
            c["name"].as_str().unwrap_or("?"),
            c["source"].as_str().unwrap_or("?"),
            expires,
            if hosts.is_empty() {
                "(default)".to_string()
            } else {
                hosts.join(", ")
            }
        );
    }
    Ok(())
}

/// `tern cert delete NAME`.
///
/// # Errors
/// If the server refuses (no such stored certificate).
pub async fn cert_delete(target: &AdminClient, name: &str) -> anyhow::Result<()> {
    target
        .send(Method::DELETE, &format!("/admin/v1/certificates/{name}"))
        .await?;
    println!("deleted certificate {name}");
    Ok(())
}
