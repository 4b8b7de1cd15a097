//! `tern schedule`: a tenant's schedules (`[[tenant.schedule]]`) on a running server — their
//! next times and last runs (`list`, `next`), one run now (`run`) — and the next times of an
//! expression before it is deployed (`next --cron`).

use http::Method;
use serde_json::{Value, json};

use super::admin_client::AdminClient;

/// `tern schedule list [NAME]`: each schedule of tenant `NAME`, or of every tenant the token
/// reaches that has some, its next time and its last runs.
///
/// # Errors
/// The server refuses (no such tenant, no access).
pub async fn schedule_list(
    target: &AdminClient,
    tenant: Option<&str>,
    json: bool,
) -> anyhow::Result<()> {
    let names: Vec<String> = match tenant {
        Some(name) => vec![name.to_string()],
        None => {
            let listing = target.send(Method::GET, "/admin/v1/tenants").await?;
            listing["tenants"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| t["name"].as_str().map(str::to_string))
                .collect()
        }
    };
    let mut answers = Vec::new();
    for name in &names {
        let asked = target
            .send(Method::GET, &format!("/admin/v1/tenants/{name}/schedules"))
            .await;
        let v = match (asked, tenant) {
            (Ok(v), _) => v,
            (Err(e), Some(_)) => return Err(e),
            // Every tenant: one that does not serve here (no module yet, or it failed to
            // load) has no schedules running.
            (Err(_), None) => continue,
        };
        let has = v["schedules"].as_array().is_some_and(|s| !s.is_empty());
        // Every tenant: only those with schedules.
        if tenant.is_some() || has {
            answers.push(v);
        }
    }
    if json {
        let out = match (tenant, answers.as_slice()) {
            (Some(_), [one]) => one.clone(),
            _ => Value::Array(answers),
        };
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    if answers.is_empty() && tenant.is_none() {
        println!("no tenant has schedules ([[tenant.schedule]])");
    }
    for v in &answers {
        let name = text(&v["tenant"]);
        if tenant.is_none() {
            println!("{name}:");
        }
        print_schedules(name, v);
    }
    Ok(())
}

/// A tenant's schedules (its answer `v`) for people.
fn print_schedules(tenant: &str, v: &Value) {
    let empty = Vec::new();
    let schedules = v["schedules"].as_array().unwrap_or(&empty);
    if schedules.is_empty() {
        println!("tenant {tenant} has no schedules ([[tenant.schedule]])");
        return;
    }
    for s in schedules {
        println!(
            "{}  cron {:?} ({})  path {}  next {}",
            text(&s["name"]),
            text(&s["cron"]),
            text(&s["timezone"]),
            text(&s["path"]),
            s["next"][0].as_str().unwrap_or("never"),
        );
        if let Some(e) = s["runs_error"].as_str() {
            println!("  runs unknown: {e}");
        }
        let runs = s["runs"].as_array().unwrap_or(&empty);
        if runs.is_empty() {
            println!("  no runs yet");
        }
        for r in runs.iter().take(10) {
            println!("  {}", run_line(r));
        }
    }
}

/// One run as a line: its tick, state, status, time, replica.
fn run_line(r: &Value) -> String {
    let mut line = format!("{}  {:<8}", text(&r["tick"]), text(&r["state"]));
    if let Some(s) = r["status"].as_u64() {
        line.push_str(&format!(" {s}"));
    }
    if let Some(t) = r["took_ms"].as_u64() {
        line.push_str(&format!(" in {t} ms"));
    }
    line.push_str(&format!("  on {}", text(&r["replica"])));
    if r["manual"].as_bool() == Some(true) {
        line.push_str("  (by hand)");
    }
    if r["attempt"].as_u64().is_some_and(|a| a > 1) {
        line.push_str("  (run again: the first holder's lease passed)");
    }
    line
}

/// `tern schedule next NAME`: each schedule's next five times.
///
/// # Errors
/// The server refuses.
pub async fn schedule_next(target: &AdminClient, tenant: &str) -> anyhow::Result<()> {
    let v = target
        .send(
            Method::GET,
            &format!("/admin/v1/tenants/{tenant}/schedules"),
        )
        .await?;
    let empty = Vec::new();
    let schedules = v["schedules"].as_array().unwrap_or(&empty);
    if schedules.is_empty() {
        println!("tenant {tenant} has no schedules ([[tenant.schedule]])");
    }
    for s in schedules {
        println!("{}  ({}):", text(&s["name"]), text(&s["timezone"]));
        for t in s["next"].as_array().unwrap_or(&empty) {
            println!("  {}", t.as_str().unwrap_or_default());
        }
    }
    Ok(())
}

/// `tern schedule next --cron EXPR [--timezone TZ]`: the next `n` times of an expression,
/// from now, without a server.
///
/// # Errors
/// The expression or the zone is wrong.
pub fn cron_next(expression: &str, zone: Option<&str>, n: usize) -> anyhow::Result<()> {
    let cron = crate::schedule::Cron::parse(expression, zone).map_err(anyhow::Error::msg)?;
    let now = crate::schedule::Clock::System.now_ms();
    for t in cron.next_n(now, n) {
        println!("{}", cron.local_text(t));
    }
    Ok(())
}

/// `tern schedule run NAME SCHEDULE`: runs it now, on the server asked, and waits for its end.
///
/// # Errors
/// The server refuses (no such schedule), or the run failed (its status is printed).
pub async fn schedule_run(
    target: &AdminClient,
    tenant: &str,
    schedule: &str,
) -> anyhow::Result<()> {
    let v = target
        .send_json(
            Method::POST,
            &format!("/admin/v1/tenants/{tenant}/schedules/run"),
            &json!({ "schedule": schedule }),
        )
        .await?;
    let run = &v["run"];
    println!(
        "ran {tenant} {schedule:?}: {} {} in {} ms",
        text(&run["state"]),
        run["status"],
        run["took_ms"]
    );
    if run["state"].as_str() != Some("ok") {
        anyhow::bail!("the run failed (status {})", run["status"]);
    }
    Ok(())
}

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or("-")
}
