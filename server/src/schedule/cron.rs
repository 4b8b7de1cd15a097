//! Cron expressions as a schedule writes them: 5 fields (minute first), 6 (seconds first, as
//! Spin's cron trigger) or 7 (a year last); names (`MON`, `JAN`), ranges, lists and steps;
//! `L` (last day of the month; `6L` or `FRIL` in the weekday field: the month's last Friday),
//! `W` (the weekday nearest a day, `LW`: the month's last weekday), `#` (`2#1`: its first
//! Monday), `?` (no condition), `1/20` (from 1, every 20). Weekdays are numbered as Cloudflare's Cron Triggers and Spin
//! number them (Quartz): 1-7, Sunday = 1. Times are in UTC unless a time zone is named (IANA:
//! `Europe/Berlin`); a wall time a daylight-saving change skips fires at the change.

use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::Tz;

/// A checked cron expression and its time zone.
#[derive(Debug, Clone)]
pub struct Cron {
    expression: String,
    zone: Option<Tz>,
    parsed: croner::Cron,
}

impl Cron {
    /// Reads `expression` (in `zone`, an IANA name; UTC when `None`).
    ///
    /// # Errors
    /// What is wrong with it, in words (a field out of range, too few fields, an unknown zone).
    pub fn parse(expression: &str, zone: Option<&str>) -> Result<Self, String> {
        let fields = expression.split_whitespace().count();
        if !(5..=7).contains(&fields) {
            return Err(format!(
                "cron {expression:?} has {fields} fields: 5 (minute hour day-of-month month \
                 day-of-week), 6 (seconds first) or 7 (a year last)"
            ));
        }
        let parser = croner::parser::CronParser::builder()
            .seconds(croner::parser::Seconds::Optional)
            .alternative_weekdays(true)
            // `1/20` (from 1, every 20), as Spin's and Quartz's expressions write it.
            .sloppy_ranges(true)
            .build();
        let parsed = parser.parse(expression).map_err(|e| {
            format!(
                "cron {expression:?}: {e} (fields: [seconds] minute 0-59, hour 0-23, \
                 day-of-month 1-31, month 1-12 or JAN-DEC, day-of-week 1-7 (Sunday = 1) or \
                 SUN-SAT[, year])"
            )
        })?;
        let zone = match zone {
            None | Some("UTC" | "Etc/UTC") => None,
            Some(name) => Some(name.parse::<Tz>().map_err(|_| {
                format!("timezone {name:?} is not an IANA time zone name (e.g. \"Europe/Berlin\")")
            })?),
        };
        let cron = Self {
            expression: expression.to_string(),
            zone,
            parsed,
        };
        // An expression no date ever matches again (`0 0 30 2 *`, a past year) is refused, not
        // kept silent.
        if cron.next_after(now_floor()).is_none() {
            return Err(format!("cron {expression:?} never fires"));
        }
        Ok(cron)
    }

    /// The expression as written.
    pub fn expression(&self) -> &str {
        &self.expression
    }

    /// Its time zone's name.
    pub fn zone(&self) -> &str {
        self.zone.as_ref().map_or("UTC", |z| z.name())
    }

    /// The first time it fires strictly after `ms` (Unix milliseconds), in Unix
    /// milliseconds.
    pub fn next_after(&self, ms: i64) -> Option<i64> {
        self.occurrence(ms, croner::Direction::Forward, false)
    }

    /// The last time it fired at or before `ms`.
    pub fn last_at_or_before(&self, ms: i64) -> Option<i64> {
        self.occurrence(ms, croner::Direction::Backward, true)
    }

    /// The first time it fires from `ms` on in `direction` (`ms` itself if `inclusive`), read
    /// in its zone.
    fn occurrence(&self, ms: i64, direction: croner::Direction, inclusive: bool) -> Option<i64> {
        let at = Utc.timestamp_millis_opt(ms).single()?;
        match &self.zone {
            None => find(&self.parsed, &at, direction, inclusive),
            Some(z) => find(&self.parsed, &at.with_timezone(z), direction, inclusive),
        }
    }

    /// The next `n` times after `ms`.
    pub fn next_n(&self, ms: i64, n: usize) -> Vec<i64> {
        let mut out = Vec::with_capacity(n);
        let mut at = ms;
        while out.len() < n {
            let Some(next) = self.next_after(at) else {
                break;
            };
            out.push(next);
            at = next;
        }
        out
    }

    /// `ms` as its zone's wall time, RFC 3339 (`2026-12-01T09:00:00+01:00`).
    pub fn local_text(&self, ms: i64) -> String {
        let Some(at) = Utc.timestamp_millis_opt(ms).single() else {
            return ms.to_string();
        };
        match &self.zone {
            None => rfc3339(ms),
            Some(z) => at
                .with_timezone(z)
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        }
    }
}

/// The first time `cron` matches from `at` on in `direction`, in Unix milliseconds.
fn find<Z: TimeZone>(
    cron: &croner::Cron,
    at: &DateTime<Z>,
    direction: croner::Direction,
    inclusive: bool,
) -> Option<i64>
where
    DateTime<Z>: croner::CronDateTime,
{
    let found = match direction {
        croner::Direction::Forward => cron.find_next_occurrence(at, inclusive),
        croner::Direction::Backward => cron.find_previous_occurrence(at, inclusive),
    };
    Some(found.ok()?.timestamp_millis())
}

/// `ms` (Unix milliseconds) in UTC, RFC 3339 to the second (`2026-12-01T08:00:00Z`).
pub fn rfc3339(ms: i64) -> String {
    DateTime::<Utc>::from_timestamp_millis(ms).map_or_else(
        || ms.to_string(),
        |t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
    )
}

/// Now, to the millisecond, for the check that an expression fires at all.
fn now_floor() -> i64 {
    Utc::now().timestamp_millis()
}
