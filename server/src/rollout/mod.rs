//! Gradual deployments: a tenant's new version (its candidate) serves a share of the
//! traffic beside the current one until it is promoted, rolled back or aborted.
//!
//! - [`plan`]: what a rollout is, as the registry stores it ([`Plan`]: the share, the stages,
//!   the key that splits clients, the abort rule) and as an operator writes it
//!   (`--percent 10`, `--stages 5%:5m,25%:10m,100%`, `--key cookie:session`).
//! - [`split`]: which version a request goes to ([`Split`]): the key hashed into 10,000
//!   buckets, salted by the tenant and the candidate, so one client sees one version on every
//!   replica and a larger share only adds buckets (no client moves back); the override header
//!   (`Tern-Version`) and who may use it.
//! - [`judge`]: each version's requests and failures while the candidate serves, and the abort
//!   rule's verdict over them ([`Judge`]).
//!
//! The registry keeps a candidate next to the version it may replace (`registry::serving`:
//! what a route leads to, the current version and the candidate; `registry::rollout`
//! advances stages and aborts, once for a fleet, through the registry's compare-and-swap);
//! the front end picks the version when it routes a request (`http::route`).

mod judge;
mod plan;
mod split;

pub use judge::{Counts, Judge};
pub use plan::{
    Abort, Aborted, Advanced, Key, LATE_MS, Plan, Stage, now_ms, parse_percent, parse_stages,
    percent_text,
};
pub use split::{Role, Split, TERN_VERSION, TERN_VERSION_TOKEN};

#[cfg(test)]
mod tests;
