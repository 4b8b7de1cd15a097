//! `tern token`: scoped admin tokens through the admin API (the operator's token makes, lists,
//! rotates and revokes them). A new token is printed once, alone on the last line (or in the JSON with
//! `--json`); it is never shown again.

use http::Method;
use serde_json::{Value, json};

use super::admin_client::AdminClient;

/// What `tern token create` asks for.
#[derive(Debug, Clone)]
pub struct Create {
    /// Its name.
    pub name: String,
    /// The tenants (or patterns) it reaches.
    pub tenants: Vec<String>,
    /// Its scopes.
    pub scopes: Vec<String>,
    /// Its lifetime (`30d`).
    pub expires: Option<String>,
    /// Print the server's JSON answer instead.
    pub json: bool,
}

/// `tern token create`.
///
/// # Errors
/// If the server refuses it (the message says why).
pub async fn create_token(target: &AdminClient, c: &Create) -> anyhow::Result<()> {
    let body = json!({
        "name": c.name,
        "tenants": c.tenants,
        "scopes": c.scopes,
        "expires": c.expires,
    });
    let v = target
        .send_json(Method::POST, "/admin/v1/tokens", &body)
        .await?;
    if c.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!(
        "token {} ({}) made for {}: {}; {}",
        v["id"].as_str().unwrap_or("?"),
        c.name,
        joined(&v["tenants"]),
        joined(&v["scopes"]),
        expiry(&v),
    );
    println!("it is shown this once; keep it (e.g. in your CI's secrets):");
    println!("{}", v["token"].as_str().unwrap_or(""));
    Ok(())
}

/// `tern token list`.
///
/// # Errors
/// If the server refuses.
pub async fn list_tokens(target: &AdminClient, as_json: bool) -> anyhow::Result<()> {
    let v = target.send(Method::GET, "/admin/v1/tokens").await?;
    if as_json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let empty = Vec::new();
    let tokens = v["tokens"].as_array().unwrap_or(&empty);
    if tokens.is_empty() {
        println!("no scoped tokens (the operator's token reaches everything)");
        return Ok(());
    }
    println!(
        "{:<16}  {:<20}  {:<24}  {:<28}  {:<12}  {:<16}  EXPIRES",
        "ID", "NAME", "TENANTS", "SCOPES", "CREATED", "LAST USED"
    );
    let now = crate::datadir::now();
    let ago = |at: u64| format!("{} ago", span(now.saturating_sub(at)));
    for t in tokens {
        println!(
            "{:<16}  {:<20}  {:<24}  {:<28}  {:<12}  {:<16}  {}",
            t["id"].as_str().unwrap_or("?"),
            t["name"].as_str().unwrap_or("?"),
            joined(&t["tenants"]),
            joined(&t["scopes"]),
            t["created"].as_u64().map_or_else(|| "?".into(), ago),
            t["last_used"].as_u64().map_or_else(|| "never".into(), ago),
            expiry(t),
        );
    }
    Ok(())
}

/// `tern token rotate`: a new secret for token `id` (printed once, alone on the last line);
/// `expires` gives it a new lifetime.
///
/// # Errors
/// If there is no such token, or the server refuses.
pub async fn rotate_token(
    target: &AdminClient,
    id: &str,
    expires: Option<&str>,
    as_json: bool,
) -> anyhow::Result<()> {
    let v = target
        .send_json(
            Method::POST,
            &format!("/admin/v1/tokens/{id}/rotate"),
            &json!({ "expires": expires }),
        )
        .await?;
    if as_json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!(
        "token {id} ({}) rotated: the old secret is refused from the next request; {}",
        v["name"].as_str().unwrap_or("?"),
        expiry(&v),
    );
    println!("the new one is shown this once:");
    println!("{}", v["token"].as_str().unwrap_or(""));
    Ok(())
}

/// `tern token revoke`.
///
/// # Errors
/// If there is no such token, or the server refuses.
pub async fn revoke_token(target: &AdminClient, id: &str) -> anyhow::Result<()> {
    target
        .send(Method::DELETE, &format!("/admin/v1/tokens/{id}"))
        .await?;
    println!("token {id} revoked: refused from the next request");
    Ok(())
}

fn joined(v: &Value) -> String {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default()
}

fn expiry(t: &Value) -> String {
    match (t["expires"].as_u64(), t["expired"].as_bool()) {
        (None, _) => "never expires".into(),
        (Some(_), Some(true)) => "expired".into(),
        (Some(at), _) => {
            let left = at.saturating_sub(crate::datadir::now());
            format!("expires in {}", span(left))
        }
    }
}

/// `s` seconds in the largest unit that fits: `45s`, `12m`, `3h`, `30d`.
pub(super) fn span(s: u64) -> String {
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}
