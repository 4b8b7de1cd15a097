use chrono::{TimeZone, Utc};

use super::Overlap;
use super::config::{ScheduleConfig, prepare_all};
use super::cron::{Cron, rfc3339};
use super::ledger::{Claim, Ledger, OTHERS_KEPT, State};

fn ms(y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> i64 {
    Utc.with_ymd_and_hms(y, mo, d, h, mi, s)
        .unwrap()
        .timestamp_millis()
}

/// The next five fire times of `expr` (in `zone`) after `from`, as RFC 3339 text.
fn next5(expr: &str, zone: Option<&str>, from: i64) -> Vec<String> {
    let c = Cron::parse(expr, zone).unwrap_or_else(|e| panic!("{expr}: {e}"));
    c.next_n(from, 5)
        .into_iter()
        .map(|t| c.local_text(t))
        .collect()
}

#[test]
fn cloudflare_examples_fire_when_their_docs_say() {
    // From Sunday 2026-11-29 12:00 UTC.
    let from = ms(2026, 11, 29, 12, 0, 0);
    // Every 3 minutes.
    assert_eq!(
        next5("*/3 * * * *", None, from),
        [
            "2026-11-29T12:03:00Z",
            "2026-11-29T12:06:00Z",
            "2026-11-29T12:09:00Z",
            "2026-11-29T12:12:00Z",
            "2026-11-29T12:15:00Z"
        ]
    );
    // 15:00 on the first of every month.
    assert_eq!(
        next5("0 15 1 * *", None, from),
        [
            "2026-12-01T15:00:00Z",
            "2027-01-01T15:00:00Z",
            "2027-02-01T15:00:00Z",
            "2027-03-01T15:00:00Z",
            "2027-04-01T15:00:00Z"
        ]
    );
    // 23:59 on the last weekday of the month (`LW`): Thu 31 Dec, Fri 29 Jan (31 Jan is a
    // Sunday), Fri 26 Feb (28 Feb a Sunday), Wed 31 Mar, Fri 30 Apr; November's last weekday,
    // Mon 30 Nov, first.
    assert_eq!(
        next5("59 23 LW * *", None, from),
        [
            "2026-11-30T23:59:00Z",
            "2026-12-31T23:59:00Z",
            "2027-01-29T23:59:00Z",
            "2027-02-26T23:59:00Z",
            "2027-03-31T23:59:00Z"
        ]
    );
    // The last Friday of the month at 10:30 (`6L`: weekdays count from Sunday = 1).
    let last_friday = [
        "2026-12-25T10:30:00Z",
        "2027-01-29T10:30:00Z",
        "2027-02-26T10:30:00Z",
        "2027-03-26T10:30:00Z",
        "2027-04-30T10:30:00Z",
    ];
    assert_eq!(next5("30 10 * * 6L", None, from), last_friday);
    assert_eq!(next5("30 10 * * FRIL", None, from), last_friday);
    // Weekday names and numbers: Sunday is 1, Monday 2 (mon-fri = 2-6).
    let weekdays = [
        "2026-11-30T07:10:00Z",
        "2026-12-01T07:10:00Z",
        "2026-12-02T07:10:00Z",
        "2026-12-03T07:10:00Z",
        "2026-12-04T07:10:00Z",
    ];
    assert_eq!(next5("10 7 * * mon-fri", None, from), weekdays);
    assert_eq!(next5("10 7 * * 2-6", None, from), weekdays);
    assert_eq!(
        next5("0 17 * * sun", None, from)[..2],
        ["2026-11-29T17:00:00Z", "2026-12-06T17:00:00Z"]
    );
    assert_eq!(
        next5("0 17 * * 1", None, from)[..2],
        ["2026-11-29T17:00:00Z", "2026-12-06T17:00:00Z"]
    );
    // The first Monday of the month (`#`).
    assert_eq!(
        next5("0 9 * * 2#1", None, from)[..3],
        [
            "2026-12-07T09:00:00Z",
            "2027-01-04T09:00:00Z",
            "2027-02-01T09:00:00Z"
        ]
    );
}

#[test]
fn spin_six_fields_count_seconds_and_a_zone_reads_wall_time() {
    let from = ms(2026, 11, 29, 12, 0, 0);
    assert_eq!(
        next5("*/2 * * * * *", None, from),
        [
            "2026-11-29T12:00:02Z",
            "2026-11-29T12:00:04Z",
            "2026-11-29T12:00:06Z",
            "2026-11-29T12:00:08Z",
            "2026-11-29T12:00:10Z"
        ]
    );
    // Spin's docs: `1/20 * * * * *`, at 1, 21 and 41 seconds.
    assert_eq!(
        next5("1/20 * * * * *", None, from)[..3],
        [
            "2026-11-29T12:00:01Z",
            "2026-11-29T12:00:21Z",
            "2026-11-29T12:00:41Z"
        ]
    );
    // 09:00 in Berlin is 08:00 UTC in winter; the summer change (29 March 2027) moves it.
    let c = Cron::parse("0 9 * * *", Some("Europe/Berlin")).unwrap();
    let next = c.next_after(from).unwrap();
    assert_eq!(rfc3339(next), "2026-11-30T08:00:00Z");
    assert_eq!(c.local_text(next), "2026-11-30T09:00:00+01:00");
    let summer = c.next_after(ms(2027, 3, 29, 0, 0, 0)).unwrap();
    assert_eq!(rfc3339(summer), "2027-03-29T07:00:00Z");
    assert_eq!(c.zone(), "Europe/Berlin");
}

#[test]
fn bad_expressions_are_refused_in_words() {
    for (expr, says) in [
        ("61 * * * *", "61"),
        ("* * *", "3 fields"),
        ("* * * * * * * *", "8 fields"),
        ("0 0 30 2 *", "never fires"),
        ("0 0 0 1 1 * 2020", "never fires"),
        ("0 0 * * 8", "cron"),
        ("0 0 * * 0", "cron"),
        ("x * * * *", "cron"),
        ("", "0 fields"),
    ] {
        let e = Cron::parse(expr, None).expect_err(expr);
        assert!(e.contains(says), "{expr}: {e}");
    }
    let e = Cron::parse("* * * * *", Some("Mars/Olympus")).unwrap_err();
    assert!(e.contains("Mars/Olympus"), "{e}");
}

fn one(cron: &str, path: &str) -> ScheduleConfig {
    ScheduleConfig {
        name: None,
        cron: cron.into(),
        timezone: None,
        path: path.into(),
        body: String::new(),
        headers: Default::default(),
        timeout_ms: None,
        overlap: Overlap::Skip,
        catch_up: false,
    }
}

#[test]
fn settings_are_checked_with_the_schedule_named() {
    let ok = prepare_all(&[one("*/5 * * * *", "/api/cron")], &["/api"], 60_000).unwrap();
    assert_eq!(ok[0].name, "*/5 * * * *");
    let e = prepare_all(&[one("*/5 * * * *", "/other")], &["/api"], 60_000).unwrap_err();
    assert!(e.contains("not under the tenant's paths"), "{e}");
    let e = prepare_all(&[one("*/5 * * * *", "/api/../admin")], &["/api"], 60_000).unwrap_err();
    assert!(e.contains("normal form"), "{e}");
    let e = prepare_all(&[one("*/5 * * * *", "cron")], &[], 60_000).unwrap_err();
    assert!(e.contains("absolute path"), "{e}");
    let twice = [one("* * * * *", "/a"), one("* * * * *", "/b")];
    let e = prepare_all(&twice, &[], 60_000).unwrap_err();
    assert!(e.contains("two schedules"), "{e}");
    let mut t = one("* * * * *", "/a");
    t.timeout_ms = Some(60_001);
    assert!(
        prepare_all(&[t], &[], 60_000)
            .unwrap_err()
            .contains("timeout_ms")
    );
    let mut h = one("* * * * *", "/a");
    h.headers.insert("tern-schedule".into(), "x".into());
    assert!(
        prepare_all(&[h], &[], 60_000)
            .unwrap_err()
            .contains("set by the server")
    );
    let many: Vec<_> = (0..33)
        .map(|i| ScheduleConfig {
            name: Some(format!("s{i}")),
            ..one("* * * * *", "/a")
        })
        .collect();
    assert!(
        prepare_all(&many, &[], 60_000)
            .unwrap_err()
            .contains("at most 32")
    );
}

#[test]
fn a_tick_is_taken_once_and_a_lost_one_runs_once_more() {
    let mut l = Ledger::default();
    let t = 60_000;
    assert_eq!(
        l.claim(t, t + 5, ("a", ""), 10_000, Overlap::Allow),
        Claim::Run(1)
    );
    // Another replica finds it running, and leaves it.
    assert_eq!(
        l.claim(t, t + 6, ("b", ""), 10_000, Overlap::Allow),
        Claim::Taken(Some(t + 5 + 10_000))
    );
    // Its holder dies; after the lease the tick runs once more, and never a third time.
    assert_eq!(
        l.claim(t, t + 10_005, ("b", ""), 10_000, Overlap::Allow),
        Claim::Run(2)
    );
    assert_eq!(l.runs[0].state, State::Lost);
    assert_eq!(
        l.claim(t, t + 15_000, ("c", ""), 10_000, Overlap::Allow),
        Claim::Taken(Some(t + 10_005 + 10_000))
    );
    // The ended run is recorded, and nobody takes the tick a third time.
    assert!(l.end((t, false, 2), "b", State::Ok, Some(200), 12));
    assert_eq!(
        l.claim(t, t + 30_000, ("c", ""), 10_000, Overlap::Allow),
        Claim::Taken(None)
    );
    assert!(
        !l.end((t, false, 1), "a", State::Ok, Some(200), 12),
        "lost stays lost"
    );
    assert_eq!(
        l.claim(t - 60_000, t + 30_000, ("c", ""), 10_000, Overlap::Allow),
        Claim::Taken(None)
    );
    assert_eq!(l.last_tick(), Some(t));
}

/// A take whose write reached the ledger but whose answer was lost tries again with the same
/// token: it finds its own run and runs the tick (attempt 1, nothing written again), where a
/// take with another token (another replica, or a later take) leaves it to its holder.
#[test]
fn a_take_whose_answer_was_lost_finds_its_own_run() {
    let mut l = Ledger::default();
    let t = 60_000;
    assert_eq!(
        l.claim(t, t + 5, ("a", "take-1"), 10_000, Overlap::Skip),
        Claim::Run(1)
    );
    let written = l.clone();
    assert_eq!(
        l.claim(t, t + 1_005, ("a", "take-1"), 10_000, Overlap::Skip),
        Claim::Resumed(1)
    );
    assert_eq!(l, written, "nothing to write again");
    // Before any other rule (the runner asks first, before its catch-up and late checks).
    assert_eq!(l.mine(t, "take-1"), Some(Claim::Resumed(1)));
    assert_eq!(l.mine(t, "take-2"), None);
    // A tick this take recorded skipped is its own skip (counted once, not written again).
    assert_eq!(
        l.claim(t + 1_000, t + 1_001, ("a", "take-3"), 10_000, Overlap::Skip),
        Claim::Skipped
    );
    assert_eq!(l.mine(t + 1_000, "take-3"), Some(Claim::Skipped));
    for who in [("a", "take-2"), ("b", "take-1x"), ("a", "")] {
        assert_eq!(
            l.claim(t, t + 1_005, who, 10_000, Overlap::Skip),
            Claim::Taken(Some(t + 5 + 10_000)),
            "{who:?}"
        );
    }
}

#[test]
fn overlap_skip_records_the_tick_skipped_while_a_run_holds_its_lease() {
    let mut l = Ledger::default();
    assert_eq!(
        l.claim(0, 1, ("a", ""), 100_000, Overlap::Skip),
        Claim::Run(1)
    );
    assert_eq!(
        l.claim(60_000, 60_001, ("b", ""), 100_000, Overlap::Skip),
        Claim::Skipped
    );
    assert_eq!(l.runs[1].state, State::Skipped);
    // Skipped is taken: nobody runs it.
    assert_eq!(
        l.claim(60_000, 60_002, ("c", ""), 100_000, Overlap::Skip),
        Claim::Taken(None)
    );
    assert!(l.end((0, false, 1), "a", State::Ok, Some(204), 70_000));
    assert_eq!(
        l.claim(120_000, 120_001, ("b", ""), 100_000, Overlap::Skip),
        Claim::Run(1)
    );
    // `allow` runs beside.
    let mut l = Ledger::default();
    assert_eq!(
        l.claim(0, 1, ("a", ""), 100_000, Overlap::Allow),
        Claim::Run(1)
    );
    assert_eq!(
        l.claim(60_000, 60_001, ("a", ""), 100_000, Overlap::Allow),
        Claim::Run(1)
    );
}

#[test]
fn a_running_run_is_never_dropped_and_runs_by_hand_keep_apart() {
    let mut l = Ledger::default();
    assert_eq!(
        l.claim(0, 1, ("a", ""), 10_000_000, Overlap::Skip),
        Claim::Run(1)
    );
    // Ticks skipped while it runs, more than the ledger keeps: the run stays, and skips go on.
    for i in 1..40 {
        let t = i * 1000;
        assert_eq!(
            l.claim(t, t + 1, ("b", ""), 10_000_000, Overlap::Skip),
            Claim::Skipped,
            "{i}"
        );
    }
    assert_eq!(l.runs.len(), super::ledger::KEPT);
    assert_eq!(l.runs[0].state, State::Running);
    assert!(l.end((0, false, 1), "a", State::Ok, Some(200), 5));
    // Two runs by hand in one millisecond are two runs, each ended on its own.
    let (x, y) = (l.manual(50_000, "a", 1000), l.manual(50_000, "a", 1000));
    assert_ne!(x, y);
    assert!(l.end((y, true, 1), "a", State::Ok, Some(200), 1));
    assert!(l.end((x, true, 1), "a", State::Failed, Some(500), 1));
    assert!(!l.runs.iter().any(|r| r.state == State::Running));
}

#[test]
fn the_ledger_keeps_its_last_runs_only() {
    let mut l = Ledger::default();
    for i in 0..50 {
        let t = i * 60_000;
        assert_eq!(
            l.claim(t, t, ("a", ""), 1000, Overlap::Allow),
            Claim::Run(1)
        );
        assert!(l.end((t, false, 1), "a", State::Ok, Some(200), 1));
    }
    assert_eq!(l.runs.len(), super::ledger::KEPT);
    assert_eq!(l.last_tick(), Some(49 * 60_000));
}

/// A ledger keeps each tenant's runs apart: read for another tenant of the name (one created
/// again after a delete) it holds none of the old one's, which stay there for the old one (a
/// replica behind still serving it) and come back when that one reads it; a deleted tenant's
/// runs are dropped; one written before ledgers named their tenant is taken as the reader's;
/// at most [`OTHERS_KEPT`] other tenants are kept.
#[test]
fn a_ledger_keeps_the_runs_of_each_tenant_of_the_name_apart() {
    let t = 60_000;
    let mut l = Ledger::default();
    l.of("job/1");
    assert_eq!(
        l.claim(t, t + 5, ("a", ""), 10_000, Overlap::Skip),
        Claim::Run(1)
    );
    let mut same = l.clone();
    same.of("job/1");
    assert_eq!(same, l, "its own ledger is left as it is");
    // The new tenant claims the tick too: the old one's run holds none of its ticks.
    l.of("job/2");
    assert!(l.runs.is_empty(), "{l:?}");
    assert_eq!(l.tenant.as_deref(), Some("job/2"));
    assert_eq!(
        l.claim(t, t + 6, ("b", ""), 10_000, Overlap::Skip),
        Claim::Run(1),
        "the old tenant's run holds no tick of the new one"
    );
    // Read again for the old one: its run is there (taken), and the new one's stays too.
    l.of("job/1");
    assert_eq!(
        l.claim(t, t + 7, ("c", ""), 10_000, Overlap::Skip),
        Claim::Taken(Some(t + 5 + 10_000))
    );
    l.of("job/2");
    assert_eq!(
        l.claim(t, t + 8, ("c", ""), 10_000, Overlap::Skip),
        Claim::Taken(Some(t + 6 + 10_000))
    );
    // The old one deleted: its runs go, the new one's stay.
    assert!(l.forget("job/1"));
    assert!(!l.forget("job/1"), "nothing left of it");
    assert_eq!((l.tenant.as_deref(), l.runs.len()), (Some("job/2"), 1));
    assert!(l.others.is_empty());
    assert!(l.forget("job/2"));
    assert!(l.is_empty() && l.tenant.is_none(), "{l:?}");
    // Written before ledgers named their tenant: the reader's.
    let mut older = Ledger::default();
    older.claim(t, t + 5, ("a", ""), 10_000, Overlap::Skip);
    let runs = older.runs.clone();
    older.of("job");
    assert_eq!(older.runs, runs, "a ledger naming no tenant is kept");
    assert_eq!(older.tenant.as_deref(), Some("job"));
    // Many tenants made again in turn: the ones whose last run is oldest go.
    let mut many = Ledger::default();
    for n in 0..(OTHERS_KEPT as i64 + 3) {
        many.of(&format!("job/{n}"));
        many.claim(
            t + n * 60_000,
            t + n * 60_000 + 5,
            ("a", ""),
            10_000,
            Overlap::Skip,
        );
    }
    many.of("job/new");
    assert_eq!(many.others.len(), OTHERS_KEPT);
    let kept: Vec<&str> = many.others.keys().map(String::as_str).collect();
    assert_eq!(kept, ["job/3", "job/4", "job/5", "job/6"]);
}
