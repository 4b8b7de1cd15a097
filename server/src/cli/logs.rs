//! `tern logs`: a tenant's live log (`GET /admin/v1/tenants/{name}/logs`): the records kept,
//! then with `-f` each request as it ends, on every replica of a fleet. Filters run on the
//! server. Readable lines by default, the server's NDJSON with `--json`. What a guest wrote
//! is shown with its control characters escaped: a guest cannot drive the reader's terminal.

use std::io::Write;

use anyhow::{Context, bail};
use http_body_util::BodyExt;
use serde_json::Value;

use super::admin_client::AdminClient;

/// What `tern logs` asks for (its command-line arguments).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Logs {
    /// The tenant's name.
    pub tenant: String,
    /// Follow: after the records kept, show each request as it ends (until interrupted).
    #[arg(short, long)]
    pub follow: bool,
    /// Only these statuses: a status (404) or a class (5xx); repeatable or comma-separated.
    #[arg(long, value_name = "STATUS")]
    pub status: Vec<String>,
    /// Only these outcomes: ok, timeout, trap (any trap_*), trap_unreachable, exit,
    /// memory_limit, overload, rate_limited, cache_hit, cache_stale, cached, ...;
    /// repeatable or comma-separated.
    #[arg(long, value_name = "OUTCOME")]
    pub outcome: Vec<String>,
    /// Only these methods; repeatable or comma-separated.
    #[arg(long, value_name = "METHOD")]
    pub method: Vec<String>,
    /// Only paths starting with this prefix.
    #[arg(long, value_name = "PREFIX")]
    pub path: Option<String>,
    /// Only records with this text in the path, the guest's output or the error (ASCII
    /// letters in any case).
    #[arg(long, value_name = "TEXT")]
    pub search: Option<String>,
    /// Records of the last span (90s, 10m, 2h, 1d); by default all kept (without -f) or only
    /// new ones (with -f).
    #[arg(long, value_name = "SPAN")]
    pub since: Option<String>,
    /// Show this share of the records (0.1: one in ten, the same ones on every replica).
    #[arg(long, value_name = "SHARE")]
    pub sample: Option<f64>,
    /// Only requests served by this version of the tenant (its id as `tern deploy` prints it,
    /// or `config` for a config file's tenant).
    #[arg(long)]
    pub version: Option<String>,
    /// Only runs of the tenant's schedules (`schedule`) or only clients' requests (`request`).
    #[arg(long, value_name = "TRIGGER")]
    pub trigger: Option<String>,
    /// Print the server's records as they come, one JSON object a line (NDJSON).
    #[arg(long)]
    pub json: bool,
}

impl Logs {
    /// The query string the server is asked with.
    fn query(&self) -> String {
        let mut q = url::form_urlencoded::Serializer::new(String::new());
        if self.follow {
            q.append_pair("follow", "1");
        }
        for (key, values) in [
            ("status", &self.status),
            ("outcome", &self.outcome),
            ("method", &self.method),
        ] {
            if !values.is_empty() {
                q.append_pair(key, &values.join(","));
            }
        }
        for (key, value) in [
            ("path", &self.path),
            ("search", &self.search),
            ("since", &self.since),
            ("version", &self.version),
            ("trigger", &self.trigger),
        ] {
            if let Some(v) = value {
                q.append_pair(key, v);
            }
        }
        if let Some(share) = self.sample {
            q.append_pair("sample", &share.to_string());
        }
        q.finish()
    }
}

/// `tern logs`.
///
/// # Errors
/// The server cannot be reached, refuses (its message), or the stream breaks.
pub async fn logs(target: &AdminClient, l: &Logs) -> anyhow::Result<()> {
    let path = format!("/admin/v1/tenants/{}/logs?{}", l.tenant, l.query());
    let resp = target.open(&path).await?;
    let status = resp.status();
    let mut body = resp.into_body();
    if !status.is_success() {
        let bytes = body.collect().await?.to_bytes();
        let v: Value = serde_json::from_slice(&bytes).unwrap_or_default();
        let msg = v["error"].as_str().map_or_else(
            || String::from_utf8_lossy(&bytes).trim().to_string(),
            str::to_string,
        );
        bail!(
            "{} {}: {msg}",
            status.as_u16(),
            status.canonical_reason().unwrap_or("")
        );
    }
    let mut buf: Vec<u8> = Vec::new();
    let mut shown = 0u64;
    let stdout = std::io::stdout();
    while let Some(frame) = body.frame().await {
        let frame = frame.context("the stream of records broke")?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        buf.extend_from_slice(&data);
        let mut out = stdout.lock();
        while let Some(at) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=at).collect();
            let line = &line[..line.len() - 1];
            let Ok(v) = serde_json::from_slice::<Value>(line) else {
                continue;
            };
            if v.get("heartbeat").is_some() {
                continue;
            }
            if l.json {
                out.write_all(line)?;
                out.write_all(b"\n")?;
            } else {
                if v.get("request_id").is_some() {
                    shown += 1;
                }
                out.write_all(readable(&v).as_bytes())?;
            }
        }
        out.flush()?;
    }
    if !l.json && !l.follow && shown == 0 {
        println!(
            "no records match (the server keeps each tenant's last requests: server.live_logs)"
        );
    }
    Ok(())
}

/// Frames of a trap's backtrace shown in readable lines (the innermost).
const SHOWN_FRAMES: usize = 6;

/// One record (or a notice in the stream) for people: a line of what happened, then what the
/// guest wrote and why it failed, indented.
pub fn readable(v: &Value) -> String {
    if let Some(n) = v["dropped"].as_u64() {
        return format!("-- {n} records dropped: this reader fell behind\n");
    }
    if let Some(e) = v["error"]
        .as_str()
        .filter(|_| v.get("request_id").is_none())
    {
        return format!("-- {}\n", escaped(e));
    }
    let s = |k: &str| v[k].as_str().unwrap_or("-");
    // A deployed version's id as `tern deploy` and `tern tenants` show it (12 digits).
    let version = s("version");
    let version = match version.get(..12) {
        Some(short) if version.len() == 64 => short,
        _ => version,
    };
    let total = v["ms"]["total"].as_f64().unwrap_or(0.0);
    let mut text = format!(
        "{}  {}  {}  {} {}  {} {}  {total:.1} ms  {}",
        s("time"),
        s("replica"),
        version,
        s("method"),
        escaped(s("path")),
        v["status"].as_u64().unwrap_or(0),
        s("outcome"),
        s("client"),
    );
    if let Some(trigger) = v["trigger"].as_str() {
        text.push_str(&format!("  by {}", escaped(trigger)));
    }
    if let Some(cache) = v["cache"].as_str() {
        text.push_str(&format!("  cache: {}", escaped(cache)));
    }
    if let Some(share) = v["sample"].as_f64() {
        text.push_str(&format!("  (sampled: 1 in {:.0})", 1.0 / share));
    }
    text.push_str(&format!("  [{}]\n", s("request_id")));
    for stream in ["stdout", "stderr"] {
        for line in v[stream].as_array().into_iter().flatten() {
            text.push_str(&format!(
                "  {stream}| {}\n",
                escaped(line.as_str().unwrap_or(""))
            ));
        }
        if v["truncated"][stream].as_bool() == Some(true) {
            text.push_str(&format!(
                "  {stream}| (cut at the tenant's limits.stdio_bytes)\n"
            ));
        }
    }
    if let Some(e) = v["error"].as_str() {
        text.push_str(&format!("  error: {}\n", escaped(e)));
    }
    let frames = v["backtrace"].as_array().map_or(&[][..], Vec::as_slice);
    for frame in frames.iter().take(SHOWN_FRAMES) {
        text.push_str(&format!("    {}\n", escaped(frame.as_str().unwrap_or(""))));
    }
    if frames.len() > SHOWN_FRAMES {
        text.push_str(&format!(
            "    ({} more frames: --json has them all)\n",
            frames.len() - SHOWN_FRAMES
        ));
    }
    text
}

/// `s` with its control characters (an ANSI escape's ESC, a carriage return) written as
/// escapes, so that what a guest wrote cannot move the cursor or recolour the terminal.
fn escaped(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_control() && c != '\t' {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_guests_control_characters_never_reach_the_terminal() {
        let v = serde_json::json!({
            "time": "2026-11-29T19:36:14.291Z", "request_id": "r1", "replica": "a",
            "version": "v1", "method": "GET", "path": "/x\u{1b}[2J", "status": 500,
            "outcome": "trap_unreachable", "client": "127.0.0.1", "ms": {"total": 1.5},
            "stdout": ["\u{1b}[31mred\u{1b}[0m", "a\rb"], "stderr": [],
            "truncated": {"stdout": true, "stderr": false},
            "error": "guest trapped", "backtrace": ["0: main"]
        });
        let text = readable(&v);
        assert!(!text.contains('\u{1b}') && !text.contains('\r'), "{text}");
        assert!(text.contains(r"stdout| \u{1b}[31mred\u{1b}[0m"), "{text}");
        assert!(text.contains(r"a\rb") && text.contains("(cut at"), "{text}");
        assert!(
            text.starts_with(
                "2026-11-29T19:36:14.291Z  a  v1  GET /x\\u{1b}[2J  500 trap_unreachable  1.5 ms"
            ),
            "{text}"
        );
        assert!(
            text.contains("  error: guest trapped\n    0: main\n"),
            "{text}"
        );
        assert_eq!(
            readable(&serde_json::json!({"dropped": 7})),
            "-- 7 records dropped: this reader fell behind\n"
        );
    }

    #[test]
    fn the_query_names_every_filter_given() {
        let l = Logs {
            tenant: "t".into(),
            follow: true,
            status: vec!["5xx".into(), "404".into()],
            search: Some("a b&c".into()),
            sample: Some(0.5),
            ..Logs::default()
        };
        assert_eq!(
            l.query(),
            "follow=1&status=5xx%2C404&search=a+b%26c&sample=0.5"
        );
    }
}
