//! `[[tenant.schedule]]`: one schedule's settings as written in the config file and in the
//! admin API's tenant spec, checked, and prepared ([`Schedule`]).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::cron::Cron;

/// The most schedules a tenant may have.
pub const MAX_SCHEDULES: usize = 32;

/// The largest body a schedule sends its guest.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// One `[[tenant.schedule]]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleConfig {
    /// Its name within the tenant (`tern schedule run NAME SCHEDULE`); the cron expression
    /// when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// When it fires: a cron expression ([`super::cron`]).
    pub cron: String,
    /// The time zone the expression is read in (IANA name); UTC when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    /// The path its guest is called with (a `POST`), under one of the tenant's paths.
    pub path: String,
    /// The request's body (text).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub body: String,
    /// More request headers.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// The guest's time limit for a scheduled run (the tenant's `limits.timeout_ms` when left
    /// out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// A tick while the schedule's last run still runs: `skip` it, or `allow` both.
    #[serde(default, skip_serializing_if = "Overlap::is_skip")]
    pub overlap: Overlap,
    /// After an outage (every replica down, or the fleet's registry unreachable), run the
    /// last tick missed, once, when the schedule is served again. Off: missed ticks are not
    /// run.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub catch_up: bool,
}

/// What a tick does while the schedule's last run still runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Overlap {
    /// The tick is skipped (recorded as `skipped`).
    #[default]
    Skip,
    /// The tick runs too.
    Allow,
}

impl Overlap {
    fn is_skip(&self) -> bool {
        *self == Self::Skip
    }
}

impl ScheduleConfig {
    /// Its name: `name`, or the cron expression.
    pub fn name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.cron)
    }
}

/// A schedule ready to fire: its settings checked, its expression read.
#[derive(Debug, Clone)]
pub struct Schedule {
    /// Its name within the tenant.
    pub name: String,
    /// When it fires.
    pub cron: Cron,
    /// The path its guest is called with.
    pub path: String,
    /// The request's body.
    pub body: bytes::Bytes,
    /// More request headers (checked names and values).
    pub headers: Vec<(http::HeaderName, http::HeaderValue)>,
    /// The guest's time limit (`None`: the tenant's).
    pub timeout: Option<Duration>,
    /// Overlapping runs.
    pub overlap: Overlap,
    /// Whether the last missed tick runs after an outage.
    pub catch_up: bool,
}

/// The headers a schedule may not set (the server's own, and framing).
const RESERVED: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "tern-schedule",
    "tern-schedule-name",
    "tern-scheduled-time",
];

/// Checks a tenant's schedules and prepares them; `paths`: the tenant's route prefixes
/// (empty: `/`), which each schedule's path must be under; `max_timeout_ms`: the largest
/// time limit a guest may have.
///
/// # Errors
/// The first wrong setting, named (`schedule "nightly": ...`).
pub fn prepare_all(
    schedules: &[ScheduleConfig],
    paths: &[&str],
    max_timeout_ms: u64,
) -> Result<Vec<Schedule>, String> {
    if schedules.len() > MAX_SCHEDULES {
        return Err(format!(
            "schedule: {} schedules; at most {MAX_SCHEDULES} per tenant",
            schedules.len()
        ));
    }
    let mut out: Vec<Schedule> = Vec::with_capacity(schedules.len());
    for s in schedules {
        let name = s.name();
        let bad = |m: String| format!("schedule {name:?}: {m}");
        if name.is_empty() || name.len() > 128 || name.chars().any(char::is_control) {
            return Err(bad(
                "its name must be 1-128 characters, no control characters".into(),
            ));
        }
        if out.iter().any(|o| o.name == name) {
            return Err(bad(
                "two schedules have this name (give each a `name`)".into()
            ));
        }
        let cron = Cron::parse(&s.cron, s.timezone.as_deref()).map_err(bad)?;
        if !s.path.starts_with('/') || s.path.parse::<http::Uri>().is_err() {
            return Err(bad(format!(
                "path {:?} must be an absolute path (\"/cron/cleanup\")",
                s.path
            )));
        }
        let only = s.path.split(['?', '#']).next().unwrap_or_default();
        if !matches!(
            crate::target::normalize(only),
            Ok(std::borrow::Cow::Borrowed(_))
        ) {
            return Err(bad(format!(
                "path {:?} is not in its normal form (no `.` or `..` segments, no `//`, no \
                 needless percent-encoding)",
                s.path
            )));
        }
        if !paths.is_empty() && prefix_len(paths, only).is_none() {
            return Err(bad(format!(
                "path {:?} is not under the tenant's paths ({})",
                s.path,
                paths.join(", ")
            )));
        }
        if s.body.len() > MAX_BODY_BYTES {
            return Err(bad(format!(
                "body is {} bytes; at most {MAX_BODY_BYTES}",
                s.body.len()
            )));
        }
        let mut headers = Vec::with_capacity(s.headers.len());
        for (k, v) in &s.headers {
            let name = http::HeaderName::from_bytes(k.as_bytes())
                .map_err(|_| bad(format!("header name {k:?} is not a valid field name")))?;
            if RESERVED.contains(&name.as_str()) {
                return Err(bad(format!("header {k:?} is set by the server")));
            }
            let value = http::HeaderValue::from_str(v)
                .map_err(|_| bad(format!("header {k:?}: its value is not valid")))?;
            headers.push((name, value));
        }
        if let Some(t) = s.timeout_ms
            && !(1..=max_timeout_ms).contains(&t)
        {
            return Err(bad(format!("timeout_ms {t} must be 1-{max_timeout_ms}")));
        }
        out.push(Schedule {
            name: name.to_string(),
            cron,
            path: s.path.clone(),
            body: bytes::Bytes::copy_from_slice(s.body.as_bytes()),
            headers,
            timeout: s.timeout_ms.map(Duration::from_millis),
            overlap: s.overlap,
            catch_up: s.catch_up,
        });
    }
    Ok(out)
}

/// The bytes of `path` that the longest of `paths` (route prefixes) matches, as the router
/// reads them (`0` for `/`); `None`: under none of them.
pub fn prefix_len(paths: &[&str], path: &str) -> Option<usize> {
    paths
        .iter()
        .map(|p| crate::router::normalise_prefix(p))
        .filter(|p| crate::router::prefix_matches(p, path))
        .map(|p| if p == "/" { 0 } else { p.len() })
        .max()
}
