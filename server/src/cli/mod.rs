//! The admin API's client: what `tern deploy`, `tern tenants`, `tern rollback`, `tern delete`
//! and `tern reload` do, with `tern var` / `tern secret` in [`variables`], `tern cert` in
//! [`certs`], `tern logs` in [`logs`], `tern token` in [`tokens`] and `tern audit` in [`audit`]. Plain HTTP/1.1 to the admin listener, readable output, and an error (non-zero
//! exit) for every refusal, with the server's message.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use bytes::Bytes;
use http::{Method, StatusCode};
use serde_json::{Value, json};

mod admin_client;
mod audit;
mod certs;
mod logs;
mod schedules;
mod tokens;
mod variables;

pub use admin_client::AdminClient;
pub use audit::{AuditQuery, audit};
pub use certs::{cert_delete, cert_list, cert_put};
pub use logs::{Logs, logs};
pub use schedules::{cron_next, schedule_list, schedule_next, schedule_run};
pub use tokens::{Create as TokenCreate, create_token, list_tokens, revoke_token, rotate_token};
pub use variables::{delete_variable, list_variables, read_secret, reseal, set_variable};

/// What `tern deploy` is asked to do (its command-line arguments).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Deploy {
    /// The tenant's name.
    pub tenant: String,
    /// The .wasm file: a Tern module (wasm32-wasip1, the guest SDK), a wasi:http component
    /// (wasm32-wasip2) or a WASI program to run as CGI. Left out with --percent: the
    /// candidate in rollout gets that share.
    pub module: Option<PathBuf>,
    /// Deploy it as the tenant's candidate, serving this share of its clients (0-100, e.g.
    /// 10 or 0.5) beside the current version until `tern promote` or `tern rollback`;
    /// without a module: give the candidate this share now (its stages end).
    #[arg(long)]
    pub percent: Option<String>,
    /// Deploy it as the candidate with shares that follow each other by time: `5%:5m,25%:10m,
    /// 100%` (s, m, h, d); only the last may have no time (held until promoted; with a time,
    /// promoted when it ends).
    #[arg(long)]
    pub stages: Option<String>,
    /// What splits the clients between the versions: `client` (their address, the default),
    /// `header:NAME` or `cookie:NAME` (the address when the request has none). One key gets
    /// one version on every replica, and a larger share moves no key back.
    #[arg(long)]
    pub key: Option<String>,
    /// Abort the rollout (the candidate gets no more clients) when its rate of 5xx answers
    /// (traps and timeouts are 5xx) is this many percentage points above the current
    /// version's (default 5 when --abort-min-requests is given).
    #[arg(long, value_name = "POINTS")]
    pub abort: Option<f64>,
    /// The candidate's requests before the abort rule judges it (default 100).
    #[arg(long, value_name = "N")]
    pub abort_min_requests: Option<u64>,
    /// Client networks that may ask for a version with `Tern-Version` without a token
    /// (repeatable; e.g. 10.0.0.0/8). Others need `Tern-Version-Token` with a deploy token.
    #[arg(long, value_name = "NET")]
    pub override_from: Vec<String>,
    /// Guest kind: tern, wasi-http or cgi (default: detected from the module).
    #[arg(long)]
    pub kind: Option<crate::config::GuestKind>,
    /// Host routed to the tenant (repeatable; replaces its hosts).
    #[arg(long = "host")]
    pub hosts: Vec<String>,
    /// Path prefix routed to the tenant (repeatable; replaces its paths).
    #[arg(long = "path")]
    pub paths: Vec<String>,
    /// Environment variable for its guests, KEY=VALUE (repeatable; with --env-from, replaces
    /// its env). The API shows the value: put secrets in a variable and use --env-from.
    #[arg(long = "env", value_parser = parse_env)]
    pub env: Vec<(String, String)>,
    /// Environment variable for its guests taken from one of its variables, KEY=VARIABLE
    /// (e.g. API_KEY=api_key after `tern secret set TENANT api_key`; repeatable; with --env,
    /// replaces its env). Read when each guest starts; left out while the variable is unset.
    #[arg(long = "env-from", value_parser = parse_env, value_name = "KEY=VARIABLE")]
    pub env_from: Vec<(String, String)>,
    /// A backend its guests may call, NAME=URL (repeatable; adds or replaces that backend,
    /// keeps the others): a guest calls it by NAME and a path.
    #[arg(long = "backend", value_parser = parse_backend)]
    pub backends: Vec<(String, String)>,
    /// A directory or .tar archive served read-only to the guests as /assets.
    #[arg(long)]
    pub assets: Option<PathBuf>,
    /// A key-value store its guests may open, e.g. `default` (repeatable; replaces its
    /// stores). The server's stores are `default` and its `[kv.NAME]` sections.
    #[arg(long = "kv", value_name = "STORE")]
    pub kv: Vec<String>,
}

fn parse_backend(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .filter(|(k, v)| !k.is_empty() && !v.is_empty())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("{s:?} is not NAME=URL (e.g. origin=http://10.0.0.5:8080)"))
}

fn parse_env(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .filter(|(k, _)| !k.is_empty())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("{s:?} is not KEY=VALUE"))
}

/// `tern deploy`: creates the tenant if needed (routed at `/<tenant>` unless `--host` or
/// `--path` say otherwise), uploads the assets, deploys the module, and prints the version.
///
/// # Errors
/// If a file cannot be read or the server refuses a step (its message is in the error).
pub async fn deploy(target: &AdminClient, d: &Deploy) -> anyhow::Result<()> {
    let Some(module) = &d.module else {
        return share(target, d).await;
    };
    let wasm =
        std::fs::read(module).with_context(|| format!("cannot read {}", module.display()))?;
    let path = format!("/admin/v1/tenants/{}", d.tenant);
    let (status, existing) = target.call(Method::GET, &path, Bytes::new(), "").await?;
    let exists = status.is_success();
    if !exists && status != StatusCode::NOT_FOUND {
        bail!("{}: {}", status, existing["error"].as_str().unwrap_or(""));
    }
    // Only what the flags name changes: a new tenant is created with PUT, an existing one
    // changed with PATCH (the server merges it, so nothing else of its spec is touched).
    let mut spec = json!({});
    if !d.hosts.is_empty() || !exists {
        spec["hosts"] = json!(d.hosts);
    }
    if !d.paths.is_empty() || !exists {
        let paths = if d.paths.is_empty() && d.hosts.is_empty() {
            vec![format!("/{}", d.tenant)]
        } else {
            d.paths.clone()
        };
        spec["paths"] = json!(paths);
    }
    if !d.env.is_empty() || !d.env_from.is_empty() {
        let text = d.env.iter().map(|(k, v)| (k.clone(), json!(v)));
        let from = (d.env_from.iter()).map(|(k, v)| (k.clone(), json!({ "variable": v })));
        spec["env"] = text.chain(from).collect();
    }
    if !d.kv.is_empty() {
        spec["kv"] = json!(d.kv);
    }
    if !d.backends.is_empty() {
        let backends: serde_json::Map<String, serde_json::Value> = d
            .backends
            .iter()
            .map(|(name, url)| (name.clone(), json!({ "url": url })))
            .collect();
        spec["outbound"] = json!({ "backends": backends });
    }
    if spec.as_object().is_some_and(|o| !o.is_empty()) {
        let method = if exists { Method::PATCH } else { Method::PUT };
        target.send_json(method, &path, &spec).await?;
        if !exists {
            println!("created tenant {} (routes: {})", d.tenant, routes(&spec));
        }
    }
    let uploaded = upload(target, d, &path, wasm).await;
    if uploaded.is_err() && !exists {
        // A first deploy that failed leaves nothing behind: no tenant holding its routes.
        match target.send(Method::DELETE, &path).await {
            Ok(_) => eprintln!("removed the new tenant {} again", d.tenant),
            Err(e) => eprintln!("could not remove the new tenant {}: {e:#}", d.tenant),
        }
    }
    uploaded
}

/// Uploads `d`'s assets (if any) and module to tenant `path`.
async fn upload(target: &AdminClient, d: &Deploy, path: &str, wasm: Vec<u8>) -> anyhow::Result<()> {
    let mut query = String::new();
    if let Some(assets) = &d.assets {
        let archive = tokio::task::spawn_blocking({
            let a = assets.clone();
            move || archive(&a)
        })
        .await??;
        let v = target
            .ok(
                Method::POST,
                "/admin/v1/assets",
                Bytes::from(archive),
                "application/x-tar",
            )
            .await?;
        let hash = v["assets"].as_str().unwrap_or_default();
        println!(
            "uploaded assets {} ({} entries, {} bytes)",
            short(hash),
            v["entries"],
            v["bytes"]
        );
        query = format!("?assets={hash}");
    }
    let mut params: Vec<(&str, String)> = Vec::new();
    if let Some(kind) = d.kind {
        params.push(("kind", kind.name().to_string()));
    }
    let rollout = [
        ("percent", d.percent.clone()),
        ("stages", d.stages.clone()),
        ("key", d.key.clone()),
        ("abort", d.abort.map(|a| a.to_string())),
        (
            "abort_min_requests",
            d.abort_min_requests.map(|n| n.to_string()),
        ),
        (
            "override_from",
            (!d.override_from.is_empty()).then(|| d.override_from.join(",")),
        ),
    ];
    params.extend(rollout.into_iter().filter_map(|(k, v)| Some((k, v?))));
    for (k, v) in params {
        query.push(if query.is_empty() { '?' } else { '&' });
        query.push_str(k);
        query.push('=');
        query.extend(url::form_urlencoded::byte_serialize(v.as_bytes()));
    }
    let v = target
        .ok(
            Method::PUT,
            &format!("{path}/module{query}"),
            Bytes::from(wasm),
            "application/wasm",
        )
        .await?;
    if v["candidate"].is_object() {
        let c = &v["candidate"];
        println!(
            "deployed {} version {} as its candidate ({}, {} bytes, compiled in {:.0} ms): {} \
             of its clients{}, beside version {}",
            d.tenant,
            short(v["version"].as_str().unwrap_or("?")),
            v["kind"].as_str().unwrap_or("?"),
            v["module_bytes"],
            v["compile_ms"].as_f64().unwrap_or(0.0),
            c["percent"].as_str().unwrap_or("?"),
            stages_text(&c["plan"]),
            short(v["previous"].as_str().unwrap_or("?")),
        );
        println!(
            "  promote: tern promote {0}    roll back: tern rollback {0}    watch: tern tenants {0}",
            d.tenant
        );
        for w in v["warnings"].as_array().into_iter().flatten() {
            eprintln!("warning: {}", w.as_str().unwrap_or_default());
        }
        return Ok(());
    }
    println!(
        "deployed {} version {} ({}, {} bytes, compiled in {:.0} ms, serving {:.0} ms after upload){}",
        d.tenant,
        short(v["version"].as_str().unwrap_or("?")),
        v["kind"].as_str().unwrap_or("?"),
        v["module_bytes"],
        v["compile_ms"].as_f64().unwrap_or(0.0),
        v["deploy_ms"].as_f64().unwrap_or(0.0),
        v["previous"]
            .as_str()
            .map(|p| format!("; previous {}", short(p)))
            .unwrap_or_default()
    );
    for w in v["warnings"].as_array().into_iter().flatten() {
        eprintln!("warning: {}", w.as_str().unwrap_or_default());
    }
    Ok(())
}

/// `tern deploy NAME --percent N` without a module: the candidate's share moved.
async fn share(target: &AdminClient, d: &Deploy) -> anyhow::Result<()> {
    let Some(percent) = &d.percent else {
        bail!(
            "name the .wasm to deploy, or give the candidate in rollout a share with --percent N"
        );
    };
    if d.stages.is_some() || d.key.is_some() || d.abort.is_some() || !d.override_from.is_empty() {
        bail!(
            "--stages, --key, --abort and --override-from come with a module: deploy it as a new candidate"
        );
    }
    let path = format!("/admin/v1/tenants/{}/rollout", d.tenant);
    let v = target
        .send_json(Method::POST, &path, &json!({ "percent": percent }))
        .await?;
    println!(
        "{}: candidate {} now serves {} of its clients (current version {})",
        d.tenant,
        short(v["candidate"]["version"]["id"].as_str().unwrap_or("?")),
        v["candidate"]["percent"].as_str().unwrap_or("?"),
        short(v["current"]["id"].as_str().unwrap_or("?")),
    );
    Ok(())
}

/// A plan's stages as written (`, then 25% at +10m, 100%`), or nothing.
fn stages_text(plan: &Value) -> String {
    let stages = plan["stages"].as_array().into_iter().flatten();
    let text: Vec<String> = stages
        .map(|s| {
            let share = crate::rollout::percent_text(s["share"].as_u64().unwrap_or(0) as u16);
            match s["secs"].as_u64() {
                Some(secs) => format!("{share} for {}", tokens::span(secs)),
                None => format!("{share} until promoted"),
            }
        })
        .collect();
    if text.is_empty() {
        String::new()
    } else {
        format!(" (stages: {})", text.join(", "))
    }
}

/// `tern promote NAME [--if-match ETAG]`: the candidate becomes the current version.
///
/// # Errors
/// If the server refuses (no candidate, the tenant changed: `412`, ...).
pub async fn promote(
    target: &AdminClient,
    name: &str,
    if_match: Option<String>,
) -> anyhow::Result<()> {
    let path = format!("/admin/v1/tenants/{name}/promote");
    let v = change_tenant(target, (Method::POST, path), name, if_match, "promote").await?;
    println!(
        "promoted {name}'s candidate: version {} serves every client (previous {}; ETag now {})",
        short(v["current"]["id"].as_str().unwrap_or("?")),
        short(v["previous"]["id"].as_str().unwrap_or("-")),
        v["etag"].as_str().unwrap_or("-")
    );
    Ok(())
}

/// A tar archive of a directory (symlinks stored as links, which the server refuses), or the
/// bytes of a `.tar` file.
fn archive(path: &Path) -> anyhow::Result<Vec<u8>> {
    if path.is_file() {
        return std::fs::read(path).with_context(|| format!("cannot read {}", path.display()));
    }
    let mut b = tar::Builder::new(Vec::new());
    b.follow_symlinks(false);
    b.append_dir_all(".", path)
        .with_context(|| format!("cannot archive {}", path.display()))?;
    Ok(b.into_inner()?)
}

fn short(id: &str) -> &str {
    &id[..id.len().min(12)]
}

fn routes(spec: &Value) -> String {
    let list = |k: &str| -> Vec<String> {
        spec[k]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    let (hosts, paths) = (list("hosts"), list("paths"));
    let hosts = if hosts.is_empty() {
        vec!["*".to_string()]
    } else {
        hosts
    };
    let paths = if paths.is_empty() {
        vec!["/".to_string()]
    } else {
        paths
    };
    hosts
        .iter()
        .flat_map(|h| paths.iter().map(move |p| format!("{h}{p}")))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `tern tenants [NAME]`: a table of tenants, or one tenant as JSON.
///
/// # Errors
/// If the server cannot be reached or refuses.
pub async fn tenants(
    target: &AdminClient,
    name: Option<&str>,
    as_json: bool,
) -> anyhow::Result<()> {
    let path = match name {
        Some(n) => format!("/admin/v1/tenants/{n}"),
        None => "/admin/v1/tenants".into(),
    };
    let v = target.send(Method::GET, &path).await?;
    if as_json || name.is_some() {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    // A replica of a fleet also says how many replicas serve each tenant's version.
    let fleet = target.send(Method::GET, "/admin/v1/fleet").await.ok();
    let mut rows = vec![[
        "NAME".to_string(),
        "SOURCE".into(),
        "KIND".into(),
        "VERSION".into(),
        "DEPLOYED".into(),
        "REQUESTS".into(),
        "ROUTES".into(),
    ]];
    for t in v["tenants"].as_array().into_iter().flatten() {
        let mut version = match t["current"]["id"].as_str() {
            Some(id) => short(id).to_string(),
            None => t["module"].as_str().unwrap_or("-").to_string(),
        };
        let c = &t["candidate"];
        if let Some(id) = c["version"]["id"].as_str() {
            let state = match c["state"].as_str() {
                Some("aborted") => " ABORTED",
                _ => "",
            };
            version = format!(
                "{version} + {} at {}{state}",
                short(id),
                c["percent"].as_str().unwrap_or("?")
            );
        }
        if let Some(f) = fleet
            .as_ref()
            .map(|f| &f["tenants"][t["name"].as_str().unwrap_or("")])
            .filter(|f| f.is_object())
        {
            let (serving, replicas) = (&f["serving"], &f["replicas"]);
            version = format!("{version} ({serving}/{replicas} replicas)");
        }
        let deployed = t["current"]["deployed_at"]
            .as_u64()
            .map_or("-".to_string(), ago);
        let serving = if t["serving"].as_bool() == Some(true) {
            ""
        } else {
            "  (not serving: no module deployed)"
        };
        rows.push([
            t["name"].as_str().unwrap_or("?").to_string(),
            t["source"].as_str().unwrap_or("?").to_string(),
            t["kind"].as_str().unwrap_or("-").to_string(),
            version,
            deployed,
            t["requests"]["total"].as_u64().unwrap_or(0).to_string(),
            format!("{}{serving}", routes(t)),
        ]);
    }
    print!("{}", table(&rows));
    Ok(())
}

/// Rows as aligned columns (each as wide as its widest cell; the sixth, a count, right-aligned;
/// the last unpadded).
fn table(rows: &[[String; 7]]) -> String {
    let mut widths = [0usize; 7];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        for (i, (cell, w)) in row.iter().zip(widths).enumerate() {
            let pad = " ".repeat(w - cell.chars().count());
            match i {
                5 => out.push_str(&format!("{pad}{cell}  ")),
                6 => out.push_str(cell),
                _ => out.push_str(&format!("{cell}{pad}  ")),
            }
        }
        out.push('\n');
    }
    out
}

fn ago(at: u64) -> String {
    format!(
        "{} ago",
        tokens::span(crate::datadir::now().saturating_sub(at))
    )
}

/// The entity tag a conditional change of tenant `name` names: `given`, else the tenant's as
/// read now (`None` for a tenant that has none, one of the config file: the server says why
/// it cannot be changed).
async fn etag_of(
    target: &AdminClient,
    name: &str,
    given: Option<String>,
) -> anyhow::Result<Option<String>> {
    if let Some(tag) = given {
        // As `tern tenants NAME` prints it, with or without its quotes.
        let tag = tag.trim().trim_matches('"');
        return Ok(Some(format!("\"{tag}\"")));
    }
    let v = target
        .send(Method::GET, &format!("/admin/v1/tenants/{name}"))
        .await?;
    Ok(v["etag"].as_str().map(String::from))
}

/// `err` with what to do next when the server could not say whether a conditional change of
/// tenant `name` (made with `etag`, by `command`) was applied: retrying with the same ETag is
/// safe.
fn with_retry_advice(
    err: anyhow::Error,
    name: &str,
    etag: Option<&str>,
    command: &str,
) -> anyhow::Error {
    let text = format!("{err:#}");
    if let Some(etag) = etag
        && text.starts_with("503")
        && text.contains("may have been applied")
    {
        return err.context(format!(
            "the change was made with If-Match {etag}: `tern {command} {name} --if-match {}` \
             applies it if it was not, and is refused (412) if it was",
            etag.trim_matches('"')
        ));
    }
    err
}

/// `command`'s change of tenant `name` (`method` on `path`), conditional on the tenant as read
/// just before or on `if_match`; its answer.
async fn change_tenant(
    target: &AdminClient,
    (method, path): (Method, String),
    name: &str,
    if_match: Option<String>,
    command: &str,
) -> anyhow::Result<Value> {
    let etag = etag_of(target, name, if_match).await?;
    target
        .conditional(etag.clone())
        .send(method, &path)
        .await
        .map_err(|e| with_retry_advice(e, name, etag.as_deref(), command))
}

/// `tern rollback NAME [--if-match ETAG]`: conditional on the tenant as read just before (or
/// on `if_match`), so it is never applied twice.
///
/// # Errors
/// If the server refuses (no previous version, unknown tenant, the tenant changed: `412`, ...).
pub async fn rollback(
    target: &AdminClient,
    name: &str,
    if_match: Option<String>,
) -> anyhow::Result<()> {
    let path = format!("/admin/v1/tenants/{name}/rollback");
    let v = change_tenant(target, (Method::POST, path), name, if_match, "rollback").await?;
    if let Some(dropped) = v["dropped_candidate"].as_str() {
        println!(
            "rolled {name}'s candidate {} back: version {} serves every client (ETag now {})",
            short(dropped),
            short(v["version"].as_str().unwrap_or("?")),
            v["etag"].as_str().unwrap_or("-")
        );
        return Ok(());
    }
    println!(
        "rolled {name} back to version {} (was {}; ETag now {})",
        short(v["version"].as_str().unwrap_or("?")),
        short(v["previous"].as_str().unwrap_or("-")),
        v["etag"].as_str().unwrap_or("-")
    );
    Ok(())
}

/// `tern delete NAME [--if-match ETAG]`: conditional on the tenant as read just before (or on
/// `if_match`), so a tenant changed meanwhile is not deleted.
///
/// # Errors
/// If the server refuses.
pub async fn delete(
    target: &AdminClient,
    name: &str,
    if_match: Option<String>,
) -> anyhow::Result<()> {
    let path = format!("/admin/v1/tenants/{name}");
    change_tenant(target, (Method::DELETE, path), name, if_match, "delete").await?;
    println!("deleted tenant {name}");
    Ok(())
}

/// `tern cache purge NAME --all | --prefix PATH... | --tag TAG... [--soft]`.
///
/// # Errors
/// If the server refuses (no such tenant, no cache, a purge naming nothing, the fleet's
/// registry cannot be written).
pub async fn cache_purge(
    target: &AdminClient,
    name: &str,
    purge: &crate::cache::Purge,
) -> anyhow::Result<()> {
    if let Err(why) = purge.check() {
        anyhow::bail!("name what to purge (--all, --prefix PATH or --tag TAG): {why}");
    }
    let path = format!("/admin/v1/tenants/{name}/cache/purge");
    let v = target.send_json(Method::POST, &path, purge).await?;
    let what = if purge.soft { "marked stale" } else { "purged" };
    let whom = match v["replicas"].as_str() {
        Some("this one") => "on this server",
        _ => "on this replica, and sent to every replica of the fleet",
    };
    println!("{what} {} stored URL(s) of {name} {whom}", v["purged"]);
    Ok(())
}

/// `tern reload`: the config file is re-read, as on `SIGHUP`.
///
/// # Errors
/// If the server refuses the new config (the old one keeps serving).
pub async fn reload(target: &AdminClient) -> anyhow::Result<()> {
    let v = target.send(Method::POST, "/admin/v1/reload").await?;
    println!("config reloaded: {} config tenants", v["config_tenants"]);
    Ok(())
}

/// `tern registry probe URL`: the store's conditional-write checks, one line each.
///
/// # Errors
/// If the store cannot be reached, or a check fails.
pub async fn registry_probe(url: &str) -> anyhow::Result<()> {
    let (store, prefix) = crate::fleet::objects::open(url).map_err(anyhow::Error::msg)?;
    let checks = crate::fleet::objects::probe(&store, &prefix)
        .await
        .map_err(|e| anyhow::anyhow!("{url}: {e}"))?;
    for c in &checks {
        println!(
            "{} {:<18} {}",
            if c.passed { "ok  " } else { "FAIL" },
            c.name,
            c.detail
        );
    }
    let failed: Vec<&str> = checks
        .iter()
        .filter(|c| !c.passed)
        .map(|c| c.name)
        .collect();
    if !failed.is_empty() {
        bail!(
            "{url} is not safe for a shared registry: {} failed (two replicas changing one \
             tenant at once could lose a change without an error)",
            failed.join(", ")
        );
    }
    println!("{url}: every check passed; this store can hold a shared registry");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::table;

    #[test]
    fn table_columns_line_up_whatever_their_width() {
        let row = |c: [&str; 7]| c.map(String::from);
        let t = table(&[
            row([
                "NAME", "SOURCE", "KIND", "VERSION", "DEPLOYED", "REQUESTS", "ROUTES",
            ]),
            row([
                "a",
                "config",
                "wasi-http",
                "builtin:a-rather-long-module",
                "1h ago",
                "7",
                "/a",
            ]),
            row([
                "bb",
                "api",
                "cgi",
                "1234abcd",
                "2m ago",
                "123456789012",
                "/b",
            ]),
        ]);
        let lines: Vec<&str> = t.lines().collect();
        let col = |l: &str, word: &str| l.find(word).unwrap();
        assert_eq!(col(lines[0], "KIND"), col(lines[2], "cgi"));
        assert_eq!(col(lines[0], "DEPLOYED"), col(lines[1], "1h ago"));
        assert_eq!(col(lines[0], "DEPLOYED"), col(lines[2], "2m ago"));
        // Counts end where their header ends.
        let end = |l: &str, word: &str| l.find(word).unwrap() + word.len();
        assert_eq!(end(lines[1], " 7"), end(lines[2], "123456789012"));
        assert_eq!(end(lines[0], "REQUESTS"), end(lines[2], "123456789012"));
        assert_eq!(col(lines[0], "ROUTES"), col(lines[1], "/a"));
    }
}
