//! Scheduled runs: a tenant's guest called on a cron schedule (`[[tenant.schedule]]`), as
//! for a request, once per tick across a fleet.
//!
//! - [`cron`]: the expressions (5, 6 or 7 fields, `L`, `W`, `#`, names, a time zone) and
//!   their fire times.
//! - [`config`]: a schedule's settings as written ([`ScheduleConfig`]), checked and prepared
//!   when its tenant loads ([`Schedule`], kept on the tenant).
//! - [`ledger`]: a schedule's last runs and the rule by which one replica takes each tick
//!   ([`Ledger::claim`], written back by compare-and-swap).
//! - [`clock`]: the system's clock, or a simulated one for tests.
//!
//! The runner (`crate::scheduler`) watches the live tenants' schedules, takes each tick
//! through the ledger, and hands the run to the front end (`crate::http::scheduled`), so a
//! scheduled run has a request's limits, records and grants.

pub mod clock;
pub mod config;
pub mod cron;
pub mod ledger;

pub use clock::Clock;
pub use config::{Overlap, Schedule, ScheduleConfig, prefix_len, prepare_all};
pub use cron::{Cron, rfc3339};
pub use ledger::{Claim, Ledger, Run, State};

/// The header naming the schedule's cron expression on a scheduled run's request.
pub static TERN_SCHEDULE: http::HeaderName = http::HeaderName::from_static("tern-schedule");

/// The header naming the schedule on a scheduled run's request.
pub static TERN_SCHEDULE_NAME: http::HeaderName =
    http::HeaderName::from_static("tern-schedule-name");

/// The header giving the tick a scheduled run is for (RFC 3339, UTC).
pub static TERN_SCHEDULED_TIME: http::HeaderName =
    http::HeaderName::from_static("tern-scheduled-time");

#[cfg(test)]
mod tests;
