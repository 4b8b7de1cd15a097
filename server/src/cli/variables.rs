//! `tern var` and `tern secret`: a tenant's variables through the admin API. A secret's value
//! is read from standard input or a file (never an argument) and never printed.

use http::Method;

use super::admin_client::AdminClient;

/// `tern var set` / `tern secret set`: sets a tenant's variable (`secret`: sealed, never
/// shown again).
///
/// # Errors
/// If the server refuses it (the message says why, never with the value).
pub async fn set_variable(
    target: &AdminClient,
    tenant: &str,
    name: &str,
    value: &str,
    secret: bool,
) -> anyhow::Result<()> {
    let path = format!("/admin/v1/tenants/{tenant}/variables/{name}");
    let body = serde_json::json!({ "value": value, "secret": secret });
    let v = target.send_json(Method::PUT, &path, &body).await?;
    let var = &v["variable"];
    if secret {
        println!(
            "secret {name} of {tenant} set (digest {}); its guests read it from the next request",
            var["digest"].as_str().unwrap_or("?")
        );
    } else {
        println!("variable {name} of {tenant} set; its guests read it from the next request");
    }
    Ok(())
}

/// `tern var list` (every variable) / `tern secret list` (`secrets`: only secrets).
///
/// # Errors
/// If the server refuses (an unknown tenant, a config-file tenant).
pub async fn list_variables(
    target: &AdminClient,
    tenant: &str,
    secrets: Option<bool>,
) -> anyhow::Result<()> {
    let v = target
        .send(
            Method::GET,
            &format!("/admin/v1/tenants/{tenant}/variables"),
        )
        .await?;
    let empty = Vec::new();
    let vars = v["variables"].as_array().unwrap_or(&empty);
    let shown: Vec<_> = vars
        .iter()
        .filter(|x| secrets.is_none_or(|s| x["secret"].as_bool() == Some(s)))
        .collect();
    if shown.is_empty() {
        println!(
            "{tenant} has no {}",
            if secrets.is_some() {
                "secrets"
            } else {
                "variables"
            }
        );
        return Ok(());
    }
    println!("{:<32} {:<8} {:<20} VALUE / DIGEST", "NAME", "KIND", "SET");
    for x in shown {
        let secret = x["secret"].as_bool() == Some(true);
        let when = x["updated_at"]
            .as_u64()
            .map_or_else(|| "?".into(), crate::logwriter::utc_seconds);
        let shown = if secret {
            format!("digest {}", x["digest"].as_str().unwrap_or("?"))
        } else {
            x["value"].as_str().unwrap_or_default().to_string()
        };
        println!(
            "{:<32} {:<8} {:<20} {shown}",
            x["name"].as_str().unwrap_or_default(),
            if secret { "secret" } else { "plain" },
            when
        );
    }
    Ok(())
}

/// `tern var delete` / `tern secret delete`.
///
/// # Errors
/// If the server refuses (no such tenant or variable).
pub async fn delete_variable(target: &AdminClient, tenant: &str, name: &str) -> anyhow::Result<()> {
    target
        .send(
            Method::DELETE,
            &format!("/admin/v1/tenants/{tenant}/variables/{name}"),
        )
        .await?;
    println!("{name} of {tenant} deleted");
    Ok(())
}

/// `tern secret reseal`: every secret sealed again under the server's current key.
///
/// # Errors
/// If a secret opens with neither key, or the registry cannot be written.
pub async fn reseal(target: &AdminClient) -> anyhow::Result<()> {
    let v = target
        .send(Method::POST, "/admin/v1/secrets/reseal")
        .await?;
    println!(
        "{} secret(s) sealed again under the secrets key {}",
        v["resealed"],
        v["key"].as_str().unwrap_or("?")
    );
    Ok(())
}

/// A secret's value from `file`, else from standard input; one final newline is dropped
/// (what `echo` and editors add).
///
/// # Errors
/// If it cannot be read, or is not UTF-8.
pub fn read_secret(file: Option<&std::path::Path>) -> anyhow::Result<String> {
    let mut value = match file {
        Some(f) => std::fs::read_to_string(f)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", f.display()))?,
        None => {
            if std::io::IsTerminal::is_terminal(&std::io::stdin()) {
                eprintln!("the secret's value (then Enter and Ctrl-D):");
            }
            let mut s = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)
                .map_err(|e| anyhow::anyhow!("cannot read the value from standard input: {e}"))?;
            s
        }
    };
    if value.ends_with('\n') {
        value.pop();
        if value.ends_with('\r') {
            value.pop();
        }
    }
    Ok(value)
}
