//! Rate counters and penalty boxes for guests (`[[tenant.rate_counter]]`,
//! `[[tenant.penalty_box]]`): what a guest, which keeps nothing between requests, counts its
//! clients with, after Fastly's Edge Rate Limiting: `check_rate` adds to an entry's count and,
//! when its rate over a window is past a limit, puts the entry in a penalty box for a while.
//!
//! A counter keeps, per entry, its counts of the last 61 seconds (one a second), so a rate
//! over any window of 1 to 60 seconds is read as a sliding window: the window's whole seconds,
//! the current second so far, and of the second it started in the part still inside it. A
//! penalty box keeps, per entry, when it leaves the box. Both are bounded ([`Shards`]): past
//! `max_entries` the entries that count for nothing go first, then the least recently seen.
//! Entries are keyed by a keyed hash of their text. Counts live in each process (each replica
//! of a fleet counts its own, as Fastly's per POP).
//!
//! The tenant declares its counters and boxes; the guest names them in its calls. Several
//! versions of a tenant keep the same counts when a redeploy leaves a declaration as it was.

use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::shards::{Shards, Slot};

/// Most counters (and most penalty boxes) one tenant declares.
pub const MAX_TABLES: usize = 16;

/// Entries a counter or a box keeps unless it says otherwise.
pub const DEFAULT_MAX_ENTRIES: usize = 10_000;

/// Most entries of one counter or box.
pub const MAX_ENTRIES: usize = 1_000_000;

/// Bytes a counter's entry costs at most (documented): 61 counts, its key and the slack.
pub const BYTES_PER_COUNTER_ENTRY: usize = 320;

/// Bytes a penalty box's entry costs at most (documented).
pub const BYTES_PER_BOX_ENTRY: usize = 48;

/// Longest entry, in bytes.
pub const MAX_ENTRY_BYTES: usize = 256;

/// Longest window of a rate or a count, in seconds.
pub const MAX_WINDOW_SECS: u32 = 60;

/// Longest stay in a penalty box, in seconds.
pub const MAX_TTL_SECS: u32 = 86_400;

/// Calls one request makes at most.
pub const MAX_CALLS: u32 = 1_000;

/// Seconds of counts an entry keeps: a window of 60 and the second it started in.
const SECONDS: usize = MAX_WINDOW_SECS as usize + 1;

/// A counter or a box as declared.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TableConfig {
    /// Its name, as the guest names it.
    pub name: String,
    /// Entries it keeps at most; past it the least recently seen are forgotten.
    #[serde(default = "default_max_entries")]
    pub max_entries: usize,
}

fn default_max_entries() -> usize {
    DEFAULT_MAX_ENTRIES
}

/// Checks a tenant's counters or boxes (`what`: `rate_counter` or `penalty_box`).
///
/// # Errors
/// What is wrong, naming the table.
pub fn check_all(what: &str, tables: &[TableConfig]) -> Result<(), String> {
    if tables.len() > MAX_TABLES {
        return Err(format!(
            "at most {MAX_TABLES} of {what}, not {}",
            tables.len()
        ));
    }
    for (i, t) in tables.iter().enumerate() {
        let name = &t.name;
        if name.is_empty()
            || name.len() > 64
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        {
            return Err(format!("{what} name {name:?}: 1-64 of A-Z a-z 0-9 . _ -"));
        }
        if tables[..i].iter().any(|o| o.name == t.name) {
            return Err(format!("{what} name {name:?} is used twice"));
        }
        if t.max_entries == 0 || t.max_entries > MAX_ENTRIES {
            return Err(format!(
                "{what} {name:?}: max_entries is 1 to {MAX_ENTRIES}"
            ));
        }
    }
    Ok(())
}

/// Why a call failed, in words for the guest's developer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CounterError {
    /// A bad argument: an unknown counter or box, an entry too long, a window out of range.
    #[error("{0}")]
    Invalid(String),
    /// More calls than a request may make.
    #[error("{0}")]
    Limit(String),
}

/// One entry's counts: the last 61 seconds', by second.
#[derive(Debug, Clone, Copy)]
pub struct Counts {
    /// The second of its newest count (since the counter's start).
    newest: u32,
    /// Counts by second (`second % SECONDS`).
    by_second: [u32; SECONDS],
}

impl Slot for Counts {
    fn last_seen(&self) -> u64 {
        u64::from(self.newest)
    }
}

impl Counts {
    /// Moves on to second `sec`: the seconds between are zero.
    fn advance(&mut self, sec: u32) {
        if sec <= self.newest {
            return;
        }
        if (sec - self.newest) as usize >= SECONDS {
            self.by_second = [0; SECONDS];
        } else {
            for s in self.newest + 1..=sec {
                self.by_second[s as usize % SECONDS] = 0;
            }
        }
        self.newest = sec;
    }

    /// Adds `delta` at `now_ms` (a call a little behind another worker's counts in the newest
    /// second).
    fn add(&mut self, now_ms: u64, delta: u32) {
        let sec = second(now_ms).max(self.newest);
        self.advance(sec);
        let c = &mut self.by_second[sec as usize % SECONDS];
        *c = c.saturating_add(delta);
    }

    /// Its count over the `window` seconds up to `now_ms`, in thousandths: the whole seconds,
    /// the current one so far, and of the second the window started in the part inside it.
    fn count_milli(&self, now_ms: u64, window: u32) -> u64 {
        let sec = second(now_ms);
        // The window is (now - window, now]: of its first second, the part after `now`'s
        // place in its own second (none of it before the counter started).
        let (first, part_in) = match sec.checked_sub(window) {
            Some(first) => (first, 1000 - now_ms % 1000),
            None => (0, 1000),
        };
        let mut total = 0u64;
        for s in first..=sec.min(self.newest) {
            if self.newest - s >= SECONDS as u32 {
                continue; // Its place holds a later second.
            }
            let n = u64::from(self.by_second[s as usize % SECONDS]);
            total += n * if s == first { part_in } else { 1000 };
        }
        total
    }
}

fn second(ms: u64) -> u32 {
    u32::try_from(ms / 1000).unwrap_or(u32::MAX)
}

/// Entries of a counter or a box, and what they are kept with.
#[derive(Debug)]
pub struct Entries<V> {
    /// As declared.
    pub config: TableConfig,
    entries: Shards<V>,
    hasher: std::hash::RandomState,
    /// The clock's zero.
    epoch: Instant,
}

/// A rate counter: entries and their counts by second.
pub type Counter = Entries<Counts>;

/// A penalty box: entries and when they leave it (ms since its start).
pub type PenaltyBox = Entries<Until>;

impl<V: Slot> Entries<V> {
    fn new(config: &TableConfig, tracked: prometheus::IntGauge) -> Self {
        Self {
            config: config.clone(),
            entries: Shards::new(config.max_entries, tracked),
            hasher: std::hash::RandomState::new(),
            epoch: Instant::now(),
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// How many entries it keeps (a box's may include some that have left it and are not
    /// yet forgotten).
    pub fn entries(&self) -> usize {
        self.entries.keys()
    }
}

/// When an entry leaves a penalty box (ms since the box's start).
#[derive(Debug, Clone, Copy)]
pub struct Until(u64);

impl Slot for Until {
    fn last_seen(&self) -> u64 {
        // The soonest to leave go first.
        self.0
    }
}

/// Checks an entry's text.
fn entry_key(hasher: &std::hash::RandomState, entry: &[u8]) -> Result<u64, CounterError> {
    if entry.is_empty() || entry.len() > MAX_ENTRY_BYTES {
        return Err(CounterError::Invalid(format!(
            "an entry is 1 to {MAX_ENTRY_BYTES} bytes, not {}",
            entry.len()
        )));
    }
    Ok(hasher.hash_one(entry))
}

fn check_window(what: &str, secs: u32) -> Result<(), CounterError> {
    if secs == 0 || secs > MAX_WINDOW_SECS {
        return Err(CounterError::Invalid(format!(
            "a {what} is 1 to {MAX_WINDOW_SECS} seconds, not {secs}"
        )));
    }
    Ok(())
}

fn check_ttl(secs: u32) -> Result<(), CounterError> {
    if secs == 0 || secs > MAX_TTL_SECS {
        return Err(CounterError::Invalid(format!(
            "a penalty is 1 to {MAX_TTL_SECS} seconds, not {secs}"
        )));
    }
    Ok(())
}

impl Counter {
    /// Adds `delta` to `entry`'s count now.
    ///
    /// # Errors
    /// A bad entry.
    pub fn increment(&self, entry: &[u8], delta: u32) -> Result<(), CounterError> {
        let key = entry_key(&self.hasher, entry)?;
        self.add(key, self.now_ms(), delta);
        Ok(())
    }

    fn add(&self, key: u64, now: u64, delta: u32) {
        let sec = second(now);
        self.entries.with(
            key,
            |counts| match counts {
                Some(c) => {
                    c.add(now, delta);
                    ((), None)
                }
                None => {
                    let mut c = Counts {
                        newest: sec,
                        by_second: [0; SECONDS],
                    };
                    c.add(now, delta);
                    ((), Some(c))
                }
            },
            // Entries with nothing in the last minute count for nothing.
            |c| sec.saturating_sub(c.newest) > MAX_WINDOW_SECS,
        );
    }

    fn count_milli(&self, key: u64, now: u64, window: u32) -> u64 {
        self.entries.with(
            key,
            |counts| (counts.map_or(0, |c| c.count_milli(now, window)), None),
            |_| false,
        )
    }

    /// `entry`'s rate over the last `window` seconds (1 to 60), in requests per second.
    ///
    /// # Errors
    /// A bad entry or window.
    pub fn lookup_rate(&self, entry: &[u8], window: u32) -> Result<u32, CounterError> {
        check_window("window", window)?;
        let key = entry_key(&self.hasher, entry)?;
        let milli = self.count_milli(key, self.now_ms(), window);
        Ok(u32::try_from(milli / 1000 / u64::from(window)).unwrap_or(u32::MAX))
    }

    /// `entry`'s count over the last `duration` seconds (1 to 60).
    ///
    /// # Errors
    /// A bad entry or duration.
    pub fn lookup_count(&self, entry: &[u8], duration: u32) -> Result<u32, CounterError> {
        check_window("duration", duration)?;
        let key = entry_key(&self.hasher, entry)?;
        let milli = self.count_milli(key, self.now_ms(), duration);
        Ok(u32::try_from(milli.div_ceil(1000)).unwrap_or(u32::MAX))
    }
}

impl PenaltyBox {
    /// Puts `entry` in the box for `ttl` seconds from now (a longer stay it has is kept).
    ///
    /// # Errors
    /// A bad entry or ttl.
    pub fn add(&self, entry: &[u8], ttl: u32) -> Result<(), CounterError> {
        check_ttl(ttl)?;
        let key = entry_key(&self.hasher, entry)?;
        self.put(key, self.now_ms(), ttl);
        Ok(())
    }

    fn put(&self, key: u64, now: u64, ttl: u32) {
        let until = now + u64::from(ttl) * 1000;
        self.entries.with(
            key,
            |old| ((), Some(Until(old.map_or(until, |o| o.0.max(until))))),
            |u| u.0 <= now,
        );
    }

    /// Whether `entry` is in the box.
    ///
    /// # Errors
    /// A bad entry.
    pub fn has(&self, entry: &[u8]) -> Result<bool, CounterError> {
        let key = entry_key(&self.hasher, entry)?;
        Ok(self.holds(key, self.now_ms()))
    }

    fn holds(&self, key: u64, now: u64) -> bool {
        self.entries
            .with(key, |u| (u.is_some_and(|u| u.0 > now), None), |_| false)
    }
}

/// A tenant's counters and penalty boxes: what its guests are granted.
#[derive(Debug, Default)]
pub struct Grant {
    counters: Vec<Arc<Counter>>,
    boxes: Vec<Arc<PenaltyBox>>,
}

impl Grant {
    /// A tenant's counters and boxes from its (checked) declarations; one `carried` from the
    /// version it replaces with the same declaration keeps its counts.
    pub fn prepare(
        counters: &[TableConfig],
        boxes: &[TableConfig],
        carried: Option<&Grant>,
        gauge: &prometheus::IntGaugeVec,
        label: &str,
    ) -> Self {
        let tracked = |kind: &str, name: &str| gauge.with_label_values(&[label, kind, name]);
        Self {
            counters: counters
                .iter()
                .map(|c| {
                    carried
                        .and_then(|g| g.counters.iter().find(|o| o.config == *c))
                        .cloned()
                        .unwrap_or_else(|| {
                            Arc::new(Counter::new(c, tracked("rate_counter", &c.name)))
                        })
                })
                .collect(),
            boxes: boxes
                .iter()
                .map(|b| {
                    carried
                        .and_then(|g| g.boxes.iter().find(|o| o.config == *b))
                        .cloned()
                        .unwrap_or_else(|| {
                            Arc::new(PenaltyBox::new(b, tracked("penalty_box", &b.name)))
                        })
                })
                .collect(),
        }
    }

    /// The counter `name`.
    ///
    /// # Errors
    /// None of that name is declared.
    pub fn counter(&self, name: &[u8]) -> Result<&Counter, CounterError> {
        self.counters
            .iter()
            .find(|c| c.config.name.as_bytes() == name)
            .map(|c| &**c)
            .ok_or_else(|| {
                CounterError::Invalid(format!(
                    "the tenant declares no rate counter {:?} ([[tenant.rate_counter]])",
                    String::from_utf8_lossy(name)
                ))
            })
    }

    /// The penalty box `name`.
    ///
    /// # Errors
    /// None of that name is declared.
    pub fn penalty_box(&self, name: &[u8]) -> Result<&PenaltyBox, CounterError> {
        self.boxes
            .iter()
            .find(|b| b.config.name.as_bytes() == name)
            .map(|b| &**b)
            .ok_or_else(|| {
                CounterError::Invalid(format!(
                    "the tenant declares no penalty box {:?} ([[tenant.penalty_box]])",
                    String::from_utf8_lossy(name)
                ))
            })
    }

    /// Fastly's `check_rate`: an entry in `penalty_box` is blocked (and not counted); else
    /// `delta` is added to its count in `counter`, and when its rate over `window` seconds is
    /// then over `limit` requests per second it goes in the box for `ttl` seconds, blocked.
    ///
    /// # Errors
    /// An unknown counter or box, a bad entry, window or ttl.
    pub fn check_rate(&self, c: &CheckRate<'_>) -> Result<bool, CounterError> {
        let counter = self.counter(c.counter)?;
        let pbox = self.penalty_box(c.penalty_box)?;
        check_window("window", c.window)?;
        check_ttl(c.ttl)?;
        let in_counter = entry_key(&counter.hasher, c.entry)?;
        let in_box = entry_key(&pbox.hasher, c.entry)?;
        if pbox.holds(in_box, pbox.now_ms()) {
            return Ok(true);
        }
        let now = counter.now_ms();
        counter.add(in_counter, now, c.delta);
        let milli = counter.count_milli(in_counter, now, c.window);
        if milli > u64::from(c.limit) * u64::from(c.window) * 1000 {
            pbox.put(in_box, pbox.now_ms(), c.ttl);
            return Ok(true);
        }
        Ok(false)
    }
}

/// The arguments of [`Grant::check_rate`].
pub struct CheckRate<'a> {
    /// The counter's name.
    pub counter: &'a [u8],
    /// The entry (a client's address, a user, a key).
    pub entry: &'a [u8],
    /// What to add to its count.
    pub delta: u32,
    /// Seconds its rate is read over (1 to 60).
    pub window: u32,
    /// Requests per second over the window past which it is blocked.
    pub limit: u32,
    /// The penalty box's name.
    pub penalty_box: &'a [u8],
    /// Seconds it stays in the box (1 to 86,400).
    pub ttl: u32,
}

/// One request's use of its tenant's counters: the calls it made.
pub struct Session {
    grant: Arc<Grant>,
    calls: u32,
}

impl Session {
    /// Nothing used yet.
    pub fn new(grant: Arc<Grant>) -> Self {
        Self { grant, calls: 0 }
    }

    /// The tenant's counters, counted as one more call.
    ///
    /// # Errors
    /// Past [`MAX_CALLS`] calls in this request.
    pub fn call(&mut self) -> Result<&Grant, CounterError> {
        self.calls += 1;
        if self.calls > MAX_CALLS {
            return Err(CounterError::Limit(format!(
                "a request makes at most {MAX_CALLS} rate counter calls"
            )));
        }
        Ok(&self.grant)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts() -> Counts {
        Counts {
            newest: 0,
            by_second: [0; SECONDS],
        }
    }

    #[test]
    fn a_window_slides_by_the_second_and_weighs_the_second_it_starts_in() {
        let mut c = counts();
        // 10 a second for 10 seconds (at .000 of each).
        for s in 0..10u64 {
            c.add(s * 1000, 10);
        }
        // At 9.999: the last 1 s holds second 9 (10) and of second 8, 0.1 %: 10.01.
        assert_eq!(c.count_milli(9_999, 1), 10_000 + 10);
        // At 10.5: the window of 1 s starts at 9.5: half of second 9 (second 10 has none).
        assert_eq!(c.count_milli(10_500, 1), 5_000);
        // Over 10 s at 10.0: seconds 1-9 whole and second 0 (weight 1): 100.
        assert_eq!(c.count_milli(10_000, 10), 100_000);
        // Over 60 s later: all 100 until a minute after the last.
        assert_eq!(c.count_milli(60_000, 60), 100_000);
        assert_eq!(
            c.count_milli(69_000, 60),
            10_000,
            "second 9 starts the window"
        );
        assert_eq!(c.count_milli(70_001, 60), 0);
        // Moving on past the ring forgets everything.
        c.add(200_000, 1);
        assert_eq!(c.count_milli(200_000, 60), 1_000);
    }

    fn grant() -> Grant {
        let gauge = prometheus::IntGaugeVec::new(
            prometheus::Opts::new("g", "g"),
            &["tenant", "kind", "name"],
        )
        .unwrap();
        let t = |name: &str, max| TableConfig {
            name: name.into(),
            max_entries: max,
        };
        Grant::prepare(&[t("rc", 100)], &[t("pb", 100)], None, &gauge, "t")
    }

    #[test]
    fn check_rate_blocks_past_the_limit_and_keeps_the_entry_boxed() {
        let g = grant();
        let ask = |entry: &'static [u8]| CheckRate {
            counter: b"rc",
            entry,
            delta: 1,
            window: 10,
            limit: 1,
            penalty_box: b"pb",
            ttl: 60,
        };
        // limit 1/s over 10 s: 10 requests fit, the 11th is over.
        for i in 0..10 {
            assert_eq!(g.check_rate(&ask(b"a")), Ok(false), "request {i}");
        }
        assert_eq!(g.check_rate(&ask(b"a")), Ok(true));
        assert_eq!(g.penalty_box(b"pb").unwrap().has(b"a"), Ok(true));
        assert_eq!(g.counter(b"rc").unwrap().lookup_count(b"a", 10), Ok(11));
        // Boxed: blocked, not counted.
        assert_eq!(g.check_rate(&ask(b"a")), Ok(true));
        assert_eq!(g.counter(b"rc").unwrap().lookup_count(b"a", 10), Ok(11));
        // Another entry is its own.
        assert_eq!(g.check_rate(&ask(b"b")), Ok(false));
        assert_eq!(g.penalty_box(b"pb").unwrap().has(b"b"), Ok(false));
        // Bad input.
        let bad = [
            CheckRate {
                window: 0,
                ..ask(b"a")
            },
            CheckRate {
                window: 61,
                ..ask(b"a")
            },
            CheckRate {
                ttl: 0,
                ..ask(b"a")
            },
            CheckRate {
                counter: b"nope",
                ..ask(b"a")
            },
            CheckRate {
                penalty_box: b"nope",
                ..ask(b"a")
            },
            ask(b""),
            ask(&[b'x'; 257]),
        ];
        for b in &bad {
            assert!(matches!(g.check_rate(b), Err(CounterError::Invalid(_))));
        }
    }

    #[test]
    fn a_box_keeps_the_longer_stay_and_a_full_one_forgets_who_left() {
        let g = grant();
        let pb = g.penalty_box(b"pb").unwrap();
        pb.put(1, 0, 10);
        pb.put(1, 0, 5);
        assert!(pb.holds(1, 9_999));
        assert!(!pb.holds(1, 10_000));
        // 100 entries at most: the ones that left go first.
        for k in 0..10_000u64 {
            pb.put(k.wrapping_mul(0x9E37_79B9_7F4A_7C15), k, 1);
        }
        assert!(pb.entries() <= 100 + 16, "{}", pb.entries());
    }

    #[test]
    fn declarations_are_checked() {
        let t = |name: &str, max| TableConfig {
            name: name.into(),
            max_entries: max,
        };
        assert!(check_all("rate_counter", &[t("a", 10), t("b", 1)]).is_ok());
        for (bad, says) in [
            (vec![t("a", 0)], "max_entries"),
            (vec![t("a b", 1)], "1-64"),
            (vec![t("a", 1), t("a", 2)], "twice"),
            (
                (0..17).map(|i| t(&format!("c{i}"), 1)).collect(),
                "at most 16",
            ),
        ] {
            let e = check_all("rate_counter", &bad).unwrap_err();
            assert!(e.contains(says), "{e}");
        }
    }
}
