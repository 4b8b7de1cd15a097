use std::net::{IpAddr, Ipv4Addr};

use http::{HeaderMap, HeaderValue};

use super::*;

fn plan(share: u16, key: &str) -> Plan {
    let mut p = Plan::new(Some(share), Vec::new(), 0).unwrap();
    p.key = Key::parse(key).unwrap();
    p
}

fn with_header(name: &'static str, value: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(name, HeaderValue::from_str(value).unwrap());
    h
}

const NOBODY: IpAddr = IpAddr::V4(Ipv4Addr::UNSPECIFIED);

/// 10,000 keys at 10 %: the candidate's share is within one point of 10 %, and each key's
/// version is the same for another `Split` of the same rollout (what a second replica
/// builds).
#[test]
fn ten_percent_of_random_keys_go_to_the_candidate_and_stay_there() {
    let split = Split::new("shop", "abc123", &plan(1000, "header:x-user")).unwrap();
    let again = Split::new("shop", "abc123", &plan(1000, "header:x-user")).unwrap();
    // Keys as an application names its users: the share must hold for them, not only for
    // random bytes.
    let keys: Vec<String> = (0..10_000).map(|i| format!("user-{i}")).collect();
    let mut candidates = 0;
    for k in &keys {
        let h = with_header("x-user", k);
        let role = split.role(&h, NOBODY);
        assert_eq!(again.role(&h, NOBODY), role, "{k} on another replica");
        candidates += usize::from(role == Role::Candidate);
    }
    assert!((900..=1100).contains(&candidates), "{candidates} of 10,000");
}

#[test]
fn a_larger_share_moves_no_client_back() {
    let keys: Vec<IpAddr> = (0..5_000u32)
        .map(|i| IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i * 7)))
        .collect();
    let mut had: Vec<bool> = vec![false; keys.len()];
    let mut last = 0;
    for share in [1000, 2000, 5000, 10_000] {
        let split = Split::new("t", "v2", &plan(share, "client")).unwrap();
        let now: Vec<bool> = keys
            .iter()
            .map(|ip| split.role(&HeaderMap::new(), *ip) == Role::Candidate)
            .collect();
        for (i, (before, after)) in had.iter().zip(&now).enumerate() {
            assert!(
                !before || *after,
                "client {} moved back at {share}",
                keys[i]
            );
        }
        let n = now.iter().filter(|c| **c).count();
        assert!(n >= last, "{n} < {last}");
        last = n;
        had = now;
    }
    assert_eq!(last, keys.len(), "100 % is everyone");
    let none = Split::new("t", "v2", &plan(0, "client")).unwrap();
    assert!(
        keys.iter()
            .all(|ip| none.role(&HeaderMap::new(), *ip) == Role::Current)
    );
}

#[test]
fn each_rollout_splits_its_own_way() {
    let a = Split::new("t", "v2", &plan(5000, "client")).unwrap();
    let b = Split::new("t", "v3", &plan(5000, "client")).unwrap();
    let c = Split::new("u", "v2", &plan(5000, "client")).unwrap();
    let differ = |x: &Split, y: &Split| {
        (0..1000u32)
            .map(|i| IpAddr::V4(Ipv4Addr::from(i)))
            .filter(|ip| x.role(&HeaderMap::new(), *ip) != y.role(&HeaderMap::new(), *ip))
            .count()
    };
    assert!(differ(&a, &b) > 300, "another candidate");
    assert!(differ(&a, &c) > 300, "another tenant");
}

#[test]
fn a_cookie_or_header_key_falls_back_to_the_client_address() {
    let split = Split::new("t", "v", &plan(5000, "cookie:uid")).unwrap();
    let ip = |i: u32| IpAddr::V4(Ipv4Addr::from(i));
    // The cookie decides, wherever the client is; among other cookies and spaces.
    let h = with_header("cookie", "a=1; uid=u-42 ; b=2");
    let role = split.role(&h, ip(1));
    assert!((2..200).all(|i| split.role(&h, ip(i)) == role));
    assert_eq!(split.role(&with_header("cookie", "uid=u-42"), ip(9)), role);
    // Without it (or empty, or only a name that ends the same), the address decides.
    for h in [
        HeaderMap::new(),
        with_header("cookie", "uid="),
        with_header("cookie", "xuid=u-42"),
    ] {
        assert_eq!(split.role(&h, ip(7)), split.role(&HeaderMap::new(), ip(7)));
    }
}

#[test]
fn percentages_and_stages_are_read_as_written_or_refused() {
    assert_eq!(parse_percent("10"), Ok(1000));
    assert_eq!(parse_percent("12.5%"), Ok(1250));
    assert_eq!(parse_percent("0.01"), Ok(1));
    assert_eq!(parse_percent("100"), Ok(10_000));
    assert_eq!(parse_percent("0"), Ok(0));
    for bad in [
        "100.01", "101", "-1", "1.234", "", "ten", "1e2", ".5", "1000",
    ] {
        assert!(parse_percent(bad).is_err(), "{bad}");
    }
    let s = parse_stages("5%:5m, 25%:10m,100%").unwrap();
    assert_eq!(
        s,
        vec![
            Stage {
                share: 500,
                secs: Some(300)
            },
            Stage {
                share: 2500,
                secs: Some(600)
            },
            Stage {
                share: 10_000,
                secs: None
            },
        ]
    );
    for bad in [
        "5%,25%:1m",
        "25%:1m,5%:1m",
        "5%:1m,5%:1m",
        "5%:0m",
        "5%:10x",
        "5%:1m,",
    ] {
        let e = parse_stages(bad).unwrap_err();
        assert!(e.contains("stage"), "{bad}: {e}");
    }
    assert_eq!(Plan::new(None, s.clone(), 0).unwrap().share, 500);
    assert!(Plan::new(Some(1000), s, 0).is_err());
    assert_eq!(Plan::new(Some(1250), vec![], 0).unwrap().percent(), "12.5%");
    assert_eq!(Plan::new(Some(5), vec![], 0).unwrap().percent(), "0.05%");
    for bad in ["ip", "header:", "header:a b", "cookie:", "cookie:a=b"] {
        assert!(Key::parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn a_stage_is_due_when_its_time_is_up_and_never_once_aborted() {
    let mut p = Plan::new(None, parse_stages("5%:1m,50%:1m,100%").unwrap(), 1_000).unwrap();
    assert_eq!(p.due(60_999), None);
    assert_eq!(p.due(61_000), Some(1));
    p.stage = 2;
    assert_eq!(
        p.due(u64::MAX),
        None,
        "the last stage is held until promoted"
    );
    let mut timed = Plan::new(None, parse_stages("5%:1m,100%:1m").unwrap(), 0).unwrap();
    timed.stage = 1;
    assert_eq!(
        timed.due(60_000),
        Some(2),
        "after the last timed stage: promoted"
    );
    timed.aborted = Some(Aborted {
        at_ms: 0,
        reason: String::new(),
    });
    assert_eq!(timed.due(u64::MAX), None);
}

/// On time (up to `LATE_MS` after a stage's end), or however late while this server was
/// tending rollouts when it ended, the next stage begins when the last ended; found later by
/// a server that began tending after its end (it was down) the stage runs again from now,
/// the last timed one too (no promotion that no one watched).
#[test]
fn a_stage_found_long_ended_runs_again_instead_of_advancing() {
    let stages = parse_stages("5%:1m,50%:1m,100%:1m").unwrap();
    let plan = Plan::new(None, stages, 1_000).unwrap();
    let mut p = plan.clone();
    assert_eq!(p.advance(60_999, 0), Advanced::Not);
    assert_eq!(p, plan, "nothing changed before its end");
    // Started after the stage ended (at `now`), or tending since before it ended (at 0).
    for (late, watched_since) in [
        (0, 61_000 + 1),
        (1, 61_000 + 1),
        (LATE_MS - 1, 61_000 + LATE_MS),
        (LATE_MS, 61_000 + LATE_MS),
        (LATE_MS + 1, 0),
        (LATE_MS + 1, 61_000),
        (3_600_000, 61_000),
    ] {
        let mut p = plan.clone();
        let now = 61_000 + late;
        assert_eq!(
            p.advance(now, watched_since),
            Advanced::Stage(1),
            "{late} ms late, tending since {watched_since}"
        );
        // Begun when the last ended, or now when found long after (its full time).
        let begun = if late > LATE_MS { now } else { 61_000 };
        assert_eq!((p.stage, p.share, p.since_ms), (1, 5000, begun), "{late}");
        assert_eq!(
            p.advance(begun + 59_999, watched_since),
            Advanced::Not,
            "{late}: stage 2 serves its full minute"
        );
    }
    let mut p = plan.clone();
    let now = 61_000 + LATE_MS + 1;
    assert_eq!(
        p.advance(now, 61_001),
        Advanced::Again {
            late_ms: LATE_MS + 1
        }
    );
    assert_eq!((p.stage, p.share, p.since_ms), (0, 500, now));
    assert_eq!(
        p.advance(now + 59_999, now),
        Advanced::Not,
        "its full time again"
    );
    assert_eq!(
        p.advance(now + 60_000 + LATE_MS * 2, now),
        Advanced::Stage(1)
    );
    // The last timed stage: promoted on time, run again when found late after a restart.
    p.stage = 2;
    p.since_ms = 0;
    let before = p.clone();
    assert_eq!(p.advance(60_000 + LATE_MS, 60_001), Advanced::Promote);
    assert_eq!(p.advance(3_600_000, 0), Advanced::Promote);
    assert_eq!(p, before, "a promotion leaves the plan as it is");
    let hours = 3 * 3_600_000;
    assert_eq!(
        p.advance(hours, hours),
        Advanced::Again {
            late_ms: hours - 60_000
        }
    );
    assert_eq!((p.stage, p.since_ms), (2, hours));
    // Held or aborted: nothing.
    p.aborted = Some(Aborted {
        at_ms: 0,
        reason: String::new(),
    });
    assert_eq!(p.advance(u64::MAX, u64::MAX), Advanced::Not);
}

#[test]
fn the_judge_waits_for_its_minimum_then_compares_failure_rates() {
    let abort = Abort {
        margin: 5.0,
        min_requests: 20,
    };
    let j = Judge::default();
    for i in 0..100 {
        j.count(Role::Current, if i % 50 == 0 { 500 } else { 200 });
    }
    // 19 requests, all failed: not judged yet.
    for _ in 0..19 {
        j.count(Role::Candidate, 500);
    }
    assert_eq!(j.verdict(&abort), None);
    j.count(Role::Candidate, 200);
    let why = j.verdict(&abort).expect("19 of 20 failed against 2 of 100");
    assert!(why.contains("19 of 20"), "{why}");
    // Within the margin: 2 % + 5 points is 7 %.
    let k = Judge::default();
    for i in 0..100 {
        k.count(Role::Current, if i % 50 == 0 { 500 } else { 200 });
        k.count(Role::Candidate, if i % 15 == 0 { 503 } else { 200 });
    }
    assert_eq!(k.counts(Role::Candidate).failures, 7);
    assert_eq!(
        k.verdict(&abort),
        None,
        "7 % is not more than 5 points above 2 %"
    );
    k.count(Role::Candidate, 500);
    assert!(k.verdict(&abort).is_some(), "8 of 101");
}

/// The buckets are the same in every process and build (no per-process seed): these numbers
/// are what every replica, before and after a restart, computes.
#[test]
fn buckets_are_fixed_numbers_of_the_tenant_candidate_and_key() {
    let split = Split::new("shop", "abc123", &plan(1000, "header:x-user")).unwrap();
    let got: Vec<u16> = ["user-1", "user-2", "alice"]
        .iter()
        .map(|k| split.bucket(k.as_bytes()))
        .collect();
    assert_eq!(got, vec![513, 7939, 8531]);
    assert_eq!(
        split.role(&with_header("x-user", "user-1"), NOBODY),
        Role::Candidate
    );
    assert_eq!(
        split.role(&with_header("x-user", "user-2"), NOBODY),
        Role::Current
    );
}
