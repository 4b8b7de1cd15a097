//! Each version's requests and failures while a candidate serves, and the abort rule's
//! verdict over them.

use crate::counter::Counter;

use super::plan::Abort;
use super::split::Role;

/// Requests and failures (5xx answers) of each version since the candidate began serving
/// here (or was given a share again after an abort). Kept across share changes.
#[derive(Debug, Default)]
pub struct Judge {
    /// By [`Role`]: requests, then failures (each thread counts in its own shard: every
    /// request of a rolling tenant adds to them).
    counts: [[Counter; 2]; 2],
}

/// What a [`Judge`] counted, by version.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counts {
    /// Requests answered.
    pub requests: u64,
    /// Of them, answered with a 5xx (a trap, a deadline, the guest's own 5xx).
    pub failures: u64,
}

impl Counts {
    fn rate(self) -> f64 {
        if self.requests == 0 {
            0.0
        } else {
            self.failures as f64 * 100.0 / self.requests as f64
        }
    }
}

impl Judge {
    /// Counts one answer of `role` with `status`.
    pub fn count(&self, role: Role, status: u16) {
        let c = &self.counts[role as usize];
        c[0].inc();
        if status >= 500 {
            c[1].inc();
        }
    }

    /// One more failure of `role`, for an answer counted by its head's status that failed
    /// after it (a streamed body cut by a trap, a deadline, a limit).
    pub fn failed_after_head(&self, role: Role) {
        self.counts[role as usize][1].inc();
    }

    /// What `role` was counted.
    pub fn counts(&self, role: Role) -> Counts {
        let c = &self.counts[role as usize];
        Counts {
            requests: c[0].get(),
            failures: c[1].get(),
        }
    }

    /// Why the rollout aborts under `abort`, if it does now.
    pub fn verdict(&self, abort: &Abort) -> Option<String> {
        let (candidate, current) = (self.counts(Role::Candidate), self.counts(Role::Current));
        if candidate.requests < abort.min_requests.max(1) {
            return None;
        }
        let (c, p) = (candidate.rate(), current.rate());
        (c - p > abort.margin).then(|| {
            format!(
                "the candidate failed {} of {} requests ({c:.1} %) against the current \
                 version's {} of {} ({p:.1} %): more than {} percentage points worse",
                candidate.failures,
                candidate.requests,
                current.failures,
                current.requests,
                abort.margin
            )
        })
    }
}
