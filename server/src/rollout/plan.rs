//! A rollout as the registry stores it with its candidate, and as operators write it.

use serde::{Deserialize, Serialize};

/// Every share is in hundredths of a percent: 10,000 buckets.
pub const BUCKETS: u16 = 10_000;

/// A candidate's rollout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    /// The candidate's share of the tenant's clients, in hundredths of a percent
    /// (0-10,000): a client whose bucket is below it gets the candidate.
    pub share: u16,
    /// What splits clients (`client`, `header:NAME`, `cookie:NAME`).
    #[serde(default, skip_serializing_if = "Key::is_client")]
    pub key: Key,
    /// Shares that follow each other by time; empty: the share moves only when asked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<Stage>,
    /// The stage in effect (an index into `stages`).
    #[serde(default)]
    pub stage: usize,
    /// When the share last changed (Unix milliseconds): the stage in effect began then.
    pub since_ms: u64,
    /// Since when the abort rule judges the candidate (Unix milliseconds): when it began
    /// serving, or was given a share again after an abort. Each replica counts anew when it
    /// changes.
    #[serde(default)]
    pub judged_since_ms: u64,
    /// When to abort by itself: the candidate failing more than the current version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abort: Option<Abort>,
    /// Client networks whose requests may ask for a version (`Tern-Version`) without a token.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub override_from: Vec<String>,
    /// Why and when it was aborted (its share is then 0 until it is given one again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aborted: Option<Aborted>,
}

/// One stage: a share, held for a time (the last stage may be held until promoted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stage {
    /// Hundredths of a percent.
    pub share: u16,
    /// How long it lasts, in seconds; `None` (only the last stage): until promoted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secs: Option<u64>,
}

/// When a rollout aborts by itself: the candidate's failure rate (5xx answers, which traps
/// and timeouts are) above the current version's by more than `margin` percentage points,
/// once the candidate has served `min_requests`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Abort {
    /// Percentage points.
    pub margin: f64,
    /// The candidate's requests before it is judged.
    pub min_requests: u64,
}

impl Abort {
    /// The margin when a deploy names none (`--abort` alone).
    pub const MARGIN: f64 = 5.0;
    /// The candidate's requests before it is judged when a deploy names no number.
    pub const MIN_REQUESTS: u64 = 100;
}

/// An abort: when, and the figures that decided it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Aborted {
    /// Unix milliseconds.
    pub at_ms: u64,
    /// What was seen, in words.
    pub reason: String,
}

/// What splits a tenant's clients between its versions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Key {
    /// The client's address (through `trusted_proxies`).
    #[default]
    Client,
    /// A request header's value; the client's address without it.
    Header(http::HeaderName),
    /// A cookie's value; the client's address without it.
    Cookie(String),
}

impl Key {
    fn is_client(&self) -> bool {
        *self == Self::Client
    }

    /// Reads `client`, `header:NAME` or `cookie:NAME`.
    ///
    /// # Errors
    /// Anything else, in words.
    pub fn parse(s: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "split key {s:?}: `client`, `header:NAME` or `cookie:NAME` (e.g. \
                 cookie:session)"
            )
        };
        match s.split_once(':') {
            None if s == "client" => Ok(Self::Client),
            Some(("header", name)) => http::HeaderName::try_from(name)
                .map(Self::Header)
                .map_err(|_| bad()),
            Some(("cookie", name))
                if !name.is_empty()
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_graphic() && !b"=;,\"".contains(&b)) =>
            {
                Ok(Self::Cookie(name.to_string()))
            }
            _ => Err(bad()),
        }
    }
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Client => f.write_str("client"),
            Self::Header(h) => write!(f, "header:{h}"),
            Self::Cookie(c) => write!(f, "cookie:{c}"),
        }
    }
}

impl Serialize for Key {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// How long after a stage's end a replica may find it and still take the next step as if on
/// time (rollouts are tended every second; a slow registry write may hold one a while).
pub const LATE_MS: u64 = 30_000;

/// What [`Plan::advance`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advanced {
    /// Nothing was due.
    Not,
    /// The stage (its index) is the one in effect now.
    Stage(usize),
    /// The last timed stage ended: the candidate is to be promoted (the plan is unchanged).
    Promote,
    /// The stage in effect ended `late_ms` ago, before this server tended rollouts: it runs
    /// again from now.
    Again {
        /// How long ago it ended.
        late_ms: u64,
    },
}

impl Plan {
    /// A rollout at `share` from now, stepped by `stages` when there are any (the first
    /// stage's share then).
    pub fn new(share: Option<u16>, stages: Vec<Stage>, now_ms: u64) -> Result<Self, String> {
        let share = match (share, stages.first()) {
            (Some(s), _) => s,
            (None, Some(first)) => first.share,
            (None, None) => return Err("a rollout needs a share (percent) or stages".into()),
        };
        if !stages.is_empty() && stages[0].share != share {
            return Err(format!(
                "the first stage's share ({}) is the rollout's share: leave --percent out or \
                 make them the same",
                percent_text(stages[0].share)
            ));
        }
        Ok(Self {
            share,
            key: Key::Client,
            stages,
            stage: 0,
            since_ms: now_ms,
            judged_since_ms: now_ms,
            abort: None,
            override_from: Vec::new(),
            aborted: None,
        })
    }

    /// What is due at `now_ms`: the next stage (its index), or the promotion after the last
    /// timed stage (`Some(len)`), or nothing.
    pub fn due(&self, now_ms: u64) -> Option<usize> {
        if self.aborted.is_some() {
            return None;
        }
        let stage = self.stages.get(self.stage)?;
        let secs = stage.secs?;
        (now_ms >= self.since_ms.saturating_add(secs.saturating_mul(1000)))
            .then_some(self.stage + 1)
    }

    /// The rollout's step at `now_ms`: nothing before its stage in effect ends; else the next
    /// stage, begun when this one ended (a tick late does not drift the ones after; found more
    /// than [`LATE_MS`] late, it begins now, so that it serves its full time however short it
    /// is), or the promotion after the last timed stage. A stage that ended before this server
    /// began to tend rollouts (`watched_since_ms`), found more than [`LATE_MS`] after its end
    /// (no replica advanced it: the server, or the whole fleet, was down) runs again for its
    /// full time from now instead: each stage serves its share, and is judged, for its time
    /// before the next one (or the promotion) comes. One that ended while this server was
    /// tending is advanced however late (a slow registry, a step that failed and is tried
    /// again).
    pub fn advance(&mut self, now_ms: u64, watched_since_ms: u64) -> Advanced {
        if self.due(now_ms).is_none() {
            return Advanced::Not;
        }
        let secs = self.stages[self.stage].secs.unwrap_or(0);
        let ended = self.since_ms.saturating_add(secs.saturating_mul(1000));
        let late_ms = now_ms - ended;
        if late_ms > LATE_MS && ended < watched_since_ms {
            self.since_ms = now_ms;
            return Advanced::Again { late_ms };
        }
        let Some(next) = self.stages.get(self.stage + 1) else {
            return Advanced::Promote;
        };
        self.share = next.share;
        self.stage += 1;
        self.since_ms = if late_ms > LATE_MS { now_ms } else { ended };
        Advanced::Stage(self.stage)
    }

    /// The stage in effect began at `now_ms`: its times count from then (the judge's too).
    pub fn starts(&mut self, now_ms: u64) {
        self.since_ms = now_ms;
        self.judged_since_ms = now_ms;
    }

    /// The share as operators read it (`12.5%`).
    pub fn percent(&self) -> String {
        percent_text(self.share)
    }
}

/// `1250` → `12.5%`.
pub fn percent_text(share: u16) -> String {
    let whole = share / 100;
    match share % 100 {
        0 => format!("{whole}%"),
        f if f % 10 == 0 => format!("{whole}.{}%", f / 10),
        f => format!("{whole}.{f:02}%"),
    }
}

/// A percentage as written (`10`, `12.5`, `0.25%`) in hundredths of a percent.
///
/// # Errors
/// Not a number from 0 to 100 with at most two decimals.
pub fn parse_percent(s: &str) -> Result<u16, String> {
    let bad = || format!("share {s:?}: a percentage from 0 to 100 (e.g. 10, 12.5)");
    let t = s.trim().trim_end_matches('%');
    let (whole, frac) = t.split_once('.').unwrap_or((t, ""));
    if whole.is_empty() || frac.len() > 2 || !whole.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    if !frac.bytes().all(|b| b.is_ascii_digit()) || whole.len() > 3 {
        return Err(bad());
    }
    let whole: u32 = whole.parse().map_err(|_| bad())?;
    let frac: u32 = format!("{frac:0<2}").parse().map_err(|_| bad())?;
    let share = whole * 100 + frac;
    if share > u32::from(BUCKETS) {
        return Err(bad());
    }
    Ok(share as u16)
}

/// Stages as written: `5%:5m,25%:10m,100%` (a share, then how long it lasts: `s`, `m`, `h`,
/// `d`; only the last may have no time, held until promoted). Shares only grow.
///
/// # Errors
/// What is wrong, naming the stage.
pub fn parse_stages(s: &str) -> Result<Vec<Stage>, String> {
    let mut stages: Vec<Stage> = Vec::new();
    let parts: Vec<&str> = s.split(',').map(str::trim).collect();
    for (i, part) in parts.iter().enumerate() {
        let (share, time) = match part.split_once(':') {
            Some((share, time)) => (share, Some(time)),
            None => (*part, None),
        };
        let share = parse_percent(share).map_err(|e| format!("stage {}: {e}", i + 1))?;
        let secs = time
            .map(|t| crate::access::parse_lifetime(t.trim()))
            .transpose()
            .map_err(|_| {
                format!(
                    "stage {} ({part:?}): its time is a positive number and s, m, h or d \
                     (e.g. 5%:10m)",
                    i + 1
                )
            })?;
        if secs.is_none() && i + 1 < parts.len() {
            return Err(format!(
                "stage {} ({part:?}) has no time: only the last stage is held until promoted",
                i + 1
            ));
        }
        if let Some(prev) = stages.last()
            && share <= prev.share
        {
            return Err(format!(
                "stage {} ({part:?}): shares grow from stage to stage (a client never moves \
                 back)",
                i + 1
            ));
        }
        stages.push(Stage { share, secs });
    }
    if stages.len() > 20 {
        return Err("at most 20 stages".into());
    }
    Ok(stages)
}

/// Now, in Unix milliseconds.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
