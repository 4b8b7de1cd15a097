//! `tern audit`: the admin API's audit log (`GET /admin/v1/audit`), oldest first; in a fleet,
//! every replica's changes merged in time order.

use http::Method;
use serde_json::Value;

use super::admin_client::AdminClient;

/// What `tern audit` asks for.
#[derive(Debug, Clone, Default)]
pub struct AuditQuery {
    /// Only this tenant's records.
    pub tenant: Option<String>,
    /// Only the records of the last span (`1h`, `30m`, `7d`).
    pub since: Option<String>,
    /// The last this many.
    pub limit: usize,
    /// Print the server's JSON answer.
    pub json: bool,
}

/// `tern audit`.
///
/// # Errors
/// A bad `--since`, or the server refuses.
pub async fn audit(target: &AdminClient, q: &AuditQuery) -> anyhow::Result<()> {
    let mut path = format!("/admin/v1/audit?limit={}", q.limit);
    if let Some(since) = &q.since {
        let back =
            crate::access::parse_lifetime(since).map_err(|e| anyhow::anyhow!("--since: {e}"))?;
        path.push_str(&format!(
            "&since={}",
            crate::datadir::now().saturating_sub(back)
        ));
    }
    if let Some(t) = &q.tenant {
        path.push_str(&format!("&tenant={t}"));
    }
    let v = target.send(Method::GET, &path).await?;
    if q.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let empty = Vec::new();
    let records = v["records"].as_array().unwrap_or(&empty);
    if v["truncated"].as_bool() == Some(true) {
        println!(
            "(older records match too: the last {} are shown; --limit N for more)",
            records.len()
        );
    }
    if records.is_empty() {
        println!("no audit records match");
        return Ok(());
    }
    let fleet = v["source"].as_str() == Some("registry");
    for r in records {
        println!("{}", line(r, fleet));
    }
    Ok(())
}

/// One record for people: when, where, who, from where, what, how it ended.
fn line(r: &Value, fleet: bool) -> String {
    let s = |k: &str| r[k].as_str().unwrap_or("");
    let who = match (s("who"), r["token"].as_str()) {
        ("operator", _) => "operator".to_string(),
        ("token", Some(id)) => format!("token {} ({id})", s("token_name")),
        (_, Some(id)) => format!("unknown token {id}"),
        (other, None) => other.to_string(),
    };
    let mut text = crate::logwriter::access::utc_seconds(r["time"].as_u64().unwrap_or(0));
    if fleet {
        text.push_str(&format!("  {}", s("replica")));
    }
    text.push_str(&format!(
        "  {who}  {}  {} {}  {} {}",
        s("client"),
        s("method"),
        s("path"),
        r["status"].as_u64().unwrap_or(0),
        s("outcome")
    ));
    if let Some(v) = r["version"].as_str() {
        text.push_str(&format!("  version {v}"));
    }
    if let Some(fields) = r["fields"].as_array() {
        let names: Vec<&str> = fields.iter().filter_map(Value::as_str).collect();
        text.push_str(&format!("  fields {}", names.join(",")));
    }
    if let Some(step) = r["step"].as_str() {
        text.push_str(&format!("  step {step}"));
    }
    text.push_str(&format!("  [{}]", s("request_id")));
    text
}
