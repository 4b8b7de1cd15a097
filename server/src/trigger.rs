//! What made a guest run: a client's request or a tenant's schedule. Its own small module (as
//! `outcome`) so that the front end, the lifecycle, the logs, metrics and traces can all name
//! it without depending on one another.

/// What made a guest run: a client's request, or its tenant's schedule (`[[tenant.schedule]]`).
/// Counted apart (`tern_requests_total{trigger}`) and shown on the access line, the live log
/// and the span of a scheduled run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Trigger {
    /// A client's request.
    #[default]
    Request = 0,
    /// A tick of one of the tenant's schedules, or a run of one by hand.
    Schedule = 1,
}

impl Trigger {
    /// Its name: the `trigger` label, the access line's and the live log's `trigger`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Request => "request",
            Self::Schedule => "schedule",
        }
    }
}
