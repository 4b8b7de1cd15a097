//! A schedule's ledger: its last runs, and the rule by which one replica of a fleet takes
//! each tick ([`Ledger::claim`]).
//!
//! The ledger is one record per schedule, changed only by compare-and-swap (in a fleet's
//! registry, or in the data directory for a lone server). A replica takes tick `T` by writing
//! a `running` run of `T` with a lease; another replica that reads the ledger and finds `T`
//! there leaves it. So each tick is started once while its holder lives. A holder that dies
//! mid-run (or cannot record the run's end) leaves a `running` run whose lease passes: the
//! first replica to look after that marks it `lost` and runs the tick once more (attempt 2,
//! never a third), so a tick runs at most twice, and never twice within a lease. The lease is
//! the longest a run can take: the guest's time limit times the server's wall-time factor,
//! and a margin.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use super::config::Overlap;

/// Runs kept per schedule (older ones are dropped).
pub const KEPT: usize = 20;

/// Other tenants of the name whose runs a ledger keeps ([`Ledger::others`]).
pub const OTHERS_KEPT: usize = 4;

/// How many times a tick is started at most (the first run, and one after a lost one).
pub const MAX_ATTEMPTS: u8 = 2;

/// A schedule's ledger.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ledger {
    /// Whose runs `runs` are ([`crate::tenant::Tenant::data`]); `None` in a ledger written
    /// before it was kept (taken as the reader's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Its last runs, oldest first.
    #[serde(default)]
    pub runs: VecDeque<Run>,
    /// The runs of other tenants of the name with a schedule of this name, by their key: a
    /// tenant deleted and created again is another, and a replica that has not seen the
    /// change yet goes on running the old one's (each keeps its own runs and claims here, in
    /// the one record every replica changes by compare-and-swap). At most [`OTHERS_KEPT`].
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub others: BTreeMap<String, VecDeque<Run>>,
    /// The change ids of the writes that made it (the registry's write check).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<String>,
}

/// One run (or skipped tick) of a schedule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Run {
    /// The tick (Unix milliseconds); for a run asked by hand, when it was asked.
    pub tick_ms: i64,
    /// Asked by hand (`tern schedule run`), not by the schedule.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub manual: bool,
    /// The replica that took it.
    pub replica: String,
    /// The token of the take that wrote it (one per tick a replica takes): the taker knows
    /// its own write when the registry's answer to it was lost and it reads the ledger again.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub token: String,
    /// 1, or 2 for the run after a lost one.
    pub attempt: u8,
    /// When it started (Unix milliseconds).
    pub started_ms: i64,
    /// Until when its holder holds it (Unix milliseconds).
    pub lease_until_ms: i64,
    /// Where it is.
    pub state: State,
    /// The status its guest answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// How long it ran (milliseconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub took_ms: Option<u64>,
}

/// Where a run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// Started, its end not recorded yet.
    Running,
    /// Its guest answered 1xx-3xx.
    Ok,
    /// Its guest answered 4xx/5xx, or failed.
    Failed,
    /// The tick came while the last run still ran (`overlap = "skip"`).
    Skipped,
    /// Its holder's lease passed without its end recorded (the holder died, or could not
    /// reach the ledger).
    Lost,
}

impl State {
    /// Its name in metrics and listings.
    pub fn name(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Ok => "ok",
            Self::Failed => "failed",
            Self::Skipped => "skipped",
            Self::Lost => "lost",
        }
    }
}

/// What [`Ledger::claim`] decided for a replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// This replica runs the tick (its attempt).
    Run(u8),
    /// This replica's own take of the tick is in the ledger already (written by an earlier try
    /// whose answer was lost): it runs the tick (its attempt), nothing to write.
    Resumed(u8),
    /// The tick is skipped (the last run still runs): recorded so.
    Skipped,
    /// Another replica has the tick (running until the lease given), or it is done.
    Taken(Option<i64>),
}

impl Ledger {
    /// Makes `runs` tenant `data`'s ([`crate::tenant::Tenant::data`]): those of another
    /// tenant of the name (a deleted one, or one a replica behind still serves) move to
    /// `others`, and `data`'s own come back from there. A ledger naming no tenant (written
    /// before ledgers did) is taken as `data`'s.
    pub fn of(&mut self, data: &str) {
        let Some(was) = self.tenant.replace(data.to_string()) else {
            return;
        };
        if was == data {
            return;
        }
        let own = self.others.remove(data).unwrap_or_default();
        let theirs = std::mem::replace(&mut self.runs, own);
        if !theirs.is_empty() {
            self.others.insert(was, theirs);
        }
        while self.others.len() > OTHERS_KEPT {
            // The tenant whose last run is the oldest goes first.
            let oldest = (self.others.iter())
                .min_by_key(|(_, runs)| runs.back().map_or(i64::MIN, |r| r.started_ms))
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                self.others.remove(&k);
            }
        }
    }

    /// Drops deleted tenant `data`'s runs (another tenant's, if any, become `runs`); whether
    /// it held any.
    pub fn forget(&mut self, data: &str) -> bool {
        if self.tenant.as_deref() != Some(data) {
            return self.others.remove(data).is_some();
        }
        let (tenant, runs) = match self.others.pop_first() {
            Some((k, runs)) => (Some(k), runs),
            None => (None, VecDeque::new()),
        };
        self.tenant = tenant;
        self.runs = runs;
        true
    }

    /// Whether it holds no run of any tenant.
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty() && self.others.is_empty()
    }

    /// Decides who runs tick `tick_ms` at `now_ms` and records it here (to be written back by
    /// compare-and-swap): a tick not in the ledger is this replica's (or skipped, while
    /// another run holds a live lease and overlap is `skip`); a tick whose run lost its lease
    /// is run once more; any other tick is taken. A run that lost its lease is marked `lost`.
    /// `(replica, token)`: who takes it, and the token of this take (the same for each try of
    /// one take: a run it wrote already is its own, [`Claim::Resumed`]).
    pub fn claim(
        &mut self,
        tick_ms: i64,
        now_ms: i64,
        (replica, token): (&str, &str),
        lease_ms: i64,
        overlap: Overlap,
    ) -> Claim {
        if let Some(own) = self.mine(tick_ms, token) {
            return own;
        }
        let mut retry = None;
        for run in self.runs.iter_mut() {
            if run.state == State::Running && run.lease_until_ms <= now_ms {
                run.state = State::Lost;
            }
        }
        if let Some(last) = self
            .runs
            .iter()
            .filter(|r| !r.manual && r.tick_ms == tick_ms)
            .max_by_key(|r| r.attempt)
        {
            match last.state {
                State::Running => return Claim::Taken(Some(last.lease_until_ms)),
                State::Lost if last.attempt < MAX_ATTEMPTS => retry = Some(last.attempt + 1),
                _ => return Claim::Taken(None),
            }
        } else if self.runs.iter().any(|r| !r.manual && r.tick_ms > tick_ms) {
            // A later tick was taken already: this one is past.
            return Claim::Taken(None);
        }
        let busy = self.runs.iter().any(|r| r.state == State::Running);
        let attempt = retry.unwrap_or(1);
        let skip = busy && overlap == Overlap::Skip;
        self.push(Run {
            tick_ms,
            manual: false,
            replica: replica.to_string(),
            token: token.to_string(),
            attempt,
            started_ms: now_ms,
            lease_until_ms: if skip {
                now_ms
            } else {
                now_ms.saturating_add(lease_ms)
            },
            state: if skip { State::Skipped } else { State::Running },
            status: None,
            took_ms: None,
        });
        if skip {
            Claim::Skipped
        } else {
            Claim::Run(attempt)
        }
    }

    /// What this take (`token`) already wrote of tick `tick_ms`, if its answer was lost: its
    /// run still running ([`Claim::Resumed`]), or the tick it recorded skipped.
    pub fn mine(&self, tick_ms: i64, token: &str) -> Option<Claim> {
        if token.is_empty() {
            return None;
        }
        let run = self
            .runs
            .iter()
            .find(|r| !r.manual && r.tick_ms == tick_ms && r.token == token)?;
        match run.state {
            State::Running => Some(Claim::Resumed(run.attempt)),
            State::Skipped => Some(Claim::Skipped),
            _ => None,
        }
    }

    /// Records a run asked by hand, starting now; its key (`tick_ms`: now, moved on by a
    /// millisecond past another run by hand at the same time).
    pub fn manual(&mut self, now_ms: i64, replica: &str, lease_ms: i64) -> i64 {
        let mut at = now_ms;
        while self.runs.iter().any(|r| r.manual && r.tick_ms == at) {
            at += 1;
        }
        self.push(Run {
            tick_ms: at,
            manual: true,
            replica: replica.to_string(),
            token: String::new(),
            attempt: 1,
            started_ms: now_ms,
            lease_until_ms: now_ms.saturating_add(lease_ms),
            state: State::Running,
            status: None,
            took_ms: None,
        });
        at
    }

    /// Records the end of this replica's run of `tick_ms` (its `attempt`); whether it found it
    /// (a run marked lost meanwhile is left lost).
    pub fn end(
        &mut self,
        (tick_ms, manual, attempt): (i64, bool, u8),
        replica: &str,
        state: State,
        status: Option<u16>,
        took_ms: u64,
    ) -> bool {
        let Some(run) = self.runs.iter_mut().find(|r| {
            r.tick_ms == tick_ms
                && r.manual == manual
                && r.attempt == attempt
                && r.replica == replica
        }) else {
            return false;
        };
        if run.state != State::Running {
            return false;
        }
        run.state = state;
        run.status = status;
        run.took_ms = Some(took_ms);
        true
    }

    /// The last tick the schedule itself took or skipped (not a run by hand), if any.
    pub fn last_tick(&self) -> Option<i64> {
        self.runs
            .iter()
            .filter(|r| !r.manual)
            .map(|r| r.tick_ms)
            .max()
    }

    /// Adds `run`, dropping the oldest ended ones past [`KEPT`] (a run still running is never
    /// dropped: it holds its tick, and `overlap = "skip"` reads it).
    fn push(&mut self, run: Run) {
        self.runs.push_back(run);
        while self.runs.len() > KEPT {
            match self.runs.iter().position(|r| r.state != State::Running) {
                Some(i) => {
                    self.runs.remove(i);
                }
                None => break,
            }
        }
    }
}
