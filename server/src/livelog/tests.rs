use std::sync::Arc;
use std::time::Duration;

use http::Method;

use super::filter::Asked;
use super::record::lines;
use super::*;
use crate::guest::Output;
use crate::metrics::{Phase, Timings};

fn counts() -> Counts {
    Counts::new(&crate::metrics::Metrics::new(10))
}

fn tail(history: usize, history_bytes: usize, per_second: u32) -> Arc<Tail> {
    Arc::new(Tail::new(
        Settings {
            history,
            history_bytes,
            max_tailers: 2,
            per_second,
        },
        counts(),
    ))
}

/// A record of `GET path` answered `status`, ended at `ended_ms`, its guest having written
/// `stdout`.
fn record(path: &str, status: u16, ended_ms: u64, stdout: &[u8]) -> Record {
    Record {
        seq: 0,
        ended_ms,
        total: Duration::from_micros(1500),
        timings: Timings::default(),
        reached: Phase::Teardown,
        request_id: format!("id-{path}").into(),
        version: "v1".into(),
        client: "127.0.0.1".parse().unwrap(),
        trigger: crate::trigger::Trigger::Request,
        method: Method::GET,
        target: path.into(),
        http: http::Version::HTTP_11,
        status,
        outcome: Ended::Guest(if status >= 500 {
            crate::outcome::Outcome::TrapUnreachable
        } else {
            crate::outcome::Outcome::Ok
        }),
        cache: None,
        output: Some(Output {
            stdout: bytes::Bytes::copy_from_slice(stdout),
            ..Output::default()
        }),
        error: None,
        sample: 1,
        json: std::sync::OnceLock::new(),
    }
}

fn read_all(t: &Tail, cursor: &mut u64) -> (u64, Vec<String>) {
    let mut into = Vec::new();
    let missed = t.read(cursor, usize::MAX, &mut into);
    (
        missed,
        into.iter().map(|r| r.path(false).to_string()).collect(),
    )
}

#[test]
fn the_ring_keeps_the_last_records_by_count_and_by_output_bytes() {
    let t = tail(3, 1 << 20, 0);
    for i in 0..5 {
        t.push(record(&format!("/{i}"), 200, 1000, b""));
    }
    let mut cursor = 0;
    let (missed, paths) = read_all(&t, &mut cursor);
    assert_eq!(
        (missed, paths),
        (2, vec!["/2".into(), "/3".into(), "/4".into()])
    );
    assert_eq!(cursor, 5);
    assert_eq!(read_all(&t, &mut cursor), (0, vec![]));
    // 10 bytes of output at most: a record of 6 bytes pushes out the older ones past it, but
    // the last record stays even when it alone is over.
    let t = tail(100, 10, 0);
    t.push(record("/a", 200, 1000, b"aaaa"));
    t.push(record("/b", 200, 1000, b"bbbbbb"));
    t.push(record("/c", 200, 1000, b"cc"));
    let mut cursor = 0;
    assert_eq!(
        read_all(&t, &mut cursor),
        (1, vec!["/b".into(), "/c".into()])
    );
    t.push(record("/d", 200, 1000, &[b'd'; 50]));
    // (This reader had read the two records pushed out; a new one missed three.)
    assert_eq!(read_all(&t, &mut cursor), (0, vec!["/d".into()]));
    assert_eq!(read_all(&t, &mut 0), (3, vec!["/d".into()]));
}

#[test]
fn a_reader_reads_from_where_it_was_and_since_an_instant() {
    let t = tail(10, 1 << 20, 0);
    for (i, ms) in [1000, 2000, 3000].into_iter().enumerate() {
        t.push(record(&format!("/{i}"), 200, ms, b""));
    }
    assert_eq!(t.seq_since(2000), 1);
    assert_eq!(t.seq_since(2001), 2);
    assert_eq!(t.seq_since(9000), 3);
    let mut cursor = 1;
    let mut into = Vec::new();
    assert_eq!(t.read(&mut cursor, 1, &mut into), 0);
    assert_eq!((cursor, into[0].path(false)), (2, "/1"));
}

#[test]
fn past_the_rate_successes_are_sampled_and_say_so_and_failures_are_all_kept() {
    let t = tail(100_000, 1 << 30, 100);
    // Second 10: 1000 records, all kept (the rate is known only after a second).
    for _ in 0..1000 {
        t.push(record("/ok", 200, 10_000, b""));
    }
    let mut cursor = 0;
    assert_eq!(read_all(&t, &mut cursor).1.len(), 1000);
    // Second 11: one in ten kept, each saying so; every failure kept.
    for i in 0..1000 {
        let status = if i % 100 == 7 { 500 } else { 200 };
        t.push(record("/x", status, 11_000, b""));
    }
    let mut into = Vec::new();
    t.read(&mut cursor, usize::MAX, &mut into);
    let failures = into.iter().filter(|r| r.status == 500).count();
    assert_eq!(failures, 10);
    let sampled: Vec<_> = into.iter().filter(|r| r.status == 200).collect();
    assert!((95..=105).contains(&sampled.len()), "{}", sampled.len());
    assert!(sampled.iter().all(|r| r.sample == 10));
    assert!(
        into.iter()
            .filter(|r| r.status == 500)
            .all(|r| r.sample == 1)
    );
    let mut line = Vec::new();
    sampled[0].write_json("a", "t", false, &mut line);
    let v: serde_json::Value = serde_json::from_slice(&line).unwrap();
    assert_eq!(v["sample"], serde_json::json!(0.1));
    // A quiet second (12) and then second 14: back to every record.
    t.push(record("/y", 200, 14_000, b""));
    t.push(record("/y", 200, 14_000, b""));
    into.clear();
    t.read(&mut cursor, usize::MAX, &mut into);
    assert_eq!(into.len(), 2);
    assert!(into.iter().all(|r| r.sample == 1));
}

#[test]
fn records_from_many_threads_are_sampled_to_the_rate_together() {
    // Each thread keeps one in `step` of its own records: together, about the rate. (Each
    // second is begun by one record from this thread, so no thread samples with the step of
    // the second before while the new one is set.)
    let t = tail(100_000, 1 << 30, 100);
    let push = |ms: u64| {
        t.push(record("/first", 200, ms, b""));
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..1000 {
                        t.push(record("/ok", 200, ms, b""));
                    }
                });
            }
        });
    };
    push(10_000);
    let mut cursor = 0;
    assert_eq!(
        read_all(&t, &mut cursor).1.len(),
        4001,
        "the first second: all"
    );
    push(11_000);
    let mut into = Vec::new();
    t.read(&mut cursor, usize::MAX, &mut into);
    // 4001 in second 10, at 100 a second: one in 41 of each thread's own 1000 (24 or 25
    // each; two threads sharing a shard count together), this thread's record perhaps.
    let kept = into.iter().filter(|r| r.path(false) == "/ok").count();
    assert!((94..=101).contains(&kept), "{kept}");
    assert!(into.iter().all(|r| r.sample == 41), "each says its rate");
}

#[test]
fn a_clock_set_back_begins_a_new_window() {
    let t = tail(100_000, 1 << 30, 10);
    for _ in 0..100 {
        t.push(record("/a", 200, 50_000, b""));
    }
    for _ in 0..100 {
        t.push(record("/b", 200, 51_000, b""));
    }
    // One in ten in second 51; set back to second 20 (a quiet second before it): all kept
    // again, not one in ten until second 52.
    t.push(record("/c", 200, 20_000, b""));
    t.push(record("/c", 200, 20_000, b""));
    let mut cursor = 0;
    let mut into = Vec::new();
    t.read(&mut cursor, usize::MAX, &mut into);
    assert_eq!(into.iter().filter(|r| r.path(false) == "/b").count(), 10);
    assert_eq!(into.iter().filter(|r| r.path(false) == "/c").count(), 2);
    // Second 21 after a quiet one: every record. Then second 22, one in ten; a record that
    // ended in second 21 (another thread's, late) does not begin a window: the rest of
    // second 22 is still sampled one in ten.
    for _ in 0..100 {
        t.push(record("/d", 200, 21_000, b""));
    }
    for _ in 0..50 {
        t.push(record("/f", 200, 22_000, b""));
    }
    t.push(record("/late", 200, 21_000, b""));
    for _ in 0..50 {
        t.push(record("/f", 200, 22_000, b""));
    }
    into.clear();
    t.read(&mut cursor, usize::MAX, &mut into);
    assert_eq!(into.iter().filter(|r| r.path(false) == "/d").count(), 100);
    let f = into.iter().filter(|r| r.path(false) == "/f").count();
    assert!((9..=11).contains(&f), "{f}");
}

#[test]
fn output_becomes_lines_escaped_by_json_whatever_the_guest_wrote() {
    assert_eq!(lines(b""), Vec::<String>::new());
    assert_eq!(lines(b"a\n"), vec!["a"]);
    assert_eq!(lines(b"a\n\nb"), vec!["a", "", "b"]);
    assert_eq!(lines(b"\xff\n"), vec!["\u{fffd}"]);
    let r = record("/p", 200, 1_700_000_000_123, b"\x1b[31mred\r\n\"q\"\n");
    let mut line = Vec::new();
    r.write_json("rep", "ten", false, &mut line);
    assert!(!line.contains(&0x1b) && !line.contains(&b'\r') && !line.contains(&b'\n'));
    let v: serde_json::Value = serde_json::from_slice(&line).unwrap();
    assert_eq!(v["stdout"], serde_json::json!(["\u{1b}[31mred\r", "\"q\""]));
    assert_eq!(v["time"], "2023-11-14T22:13:20.122Z");
    assert_eq!(v["ms"]["total"], 1.5);
    assert_eq!(v["replica"], "rep");
    assert_eq!(v["outcome"], "ok");
    // Fields in reading order.
    let text = String::from_utf8(line).unwrap();
    let at = |k: &str| text.find(&format!("\"{k}\":")).unwrap();
    assert!(at("time") < at("request_id") && at("status") < at("stdout"));
}

#[test]
fn the_query_is_checked_and_filters_select_what_they_name() {
    let now = 1_000_000_000;
    let bad = |q: &str| Asked::parse(Some(q), false, now).unwrap_err();
    assert!(bad("status=600").contains("status"));
    assert!(bad("status=6xx").contains("status"));
    assert!(bad("outcome=trapped").contains("trap_unreachable"));
    assert!(bad("sample=0").contains("sample"));
    assert!(bad("sample=1.5").contains("sample"));
    assert!(bad("since=yesterday").contains("since"));
    assert!(bad("path=api").contains("path"));
    assert!(bad("method=G%20T").contains("method"));
    assert!(bad("follow=maybe").contains("follow"));
    assert!(bad("colour=red").contains("unknown parameter"));
    let a = Asked::parse(Some("since=10m&follow=1&format=sse"), false, now).unwrap();
    assert_eq!(a.since_ms, Some(now - 600_000));
    assert!(a.follow && a.sse && !a.local);
    let a = Asked::parse(Some("since=123"), false, now).unwrap();
    assert_eq!(a.since_ms, Some(123));

    let f = |q: &str| Asked::parse(Some(q), false, now).unwrap().filter;
    let ok = record("/api/a", 200, 0, b"hello World");
    let missing = record("/api/b", 404, 0, b"");
    let trap = record("/c", 500, 0, b"");
    let pick = |q: &str| {
        let f = f(q);
        [&ok, &missing, &trap]
            .iter()
            .filter(|r| f.matches(r))
            .map(|r| r.path(false))
            .collect::<Vec<_>>()
    };
    assert_eq!(pick(""), ["/api/a", "/api/b", "/c"]);
    assert_eq!(pick("status=5xx"), ["/c"]);
    assert_eq!(pick("status=404,500"), ["/api/b", "/c"]);
    assert_eq!(pick("outcome=trap"), ["/c"]);
    assert_eq!(pick("outcome=ok"), ["/api/a", "/api/b"]);
    assert_eq!(pick("path=/api"), ["/api/a", "/api/b"]);
    assert_eq!(pick("search=WORLD"), ["/api/a"]);
    assert_eq!(pick("method=get"), ["/api/a", "/api/b", "/c"]);
    assert_eq!(pick("method=POST"), Vec::<&str>::new());
    assert_eq!(pick("version=v2"), Vec::<&str>::new());
    assert_eq!(
        pick("version=v"),
        Vec::<&str>::new(),
        "a prefix needs 8 digits"
    );
    assert_eq!(pick("version=v1&status=2xx"), ["/api/a"]);
    // A sample is chosen by request id: the same records each time.
    let many: Vec<Record> = (0..1000)
        .map(|i| record(&format!("/{i}"), 200, 0, b""))
        .collect();
    let sample = f("sample=0.25");
    let chosen: Vec<bool> = many.iter().map(|r| sample.matches(r)).collect();
    let n = chosen.iter().filter(|c| **c).count();
    assert!((200..=300).contains(&n), "{n}");
    assert_eq!(
        chosen,
        many.iter().map(|r| sample.matches(r)).collect::<Vec<_>>()
    );
    assert_eq!(
        Asked::for_peers(Some("follow=1&since=10m&status=5xx&format=sse"), Some(77)),
        "follow=1&status=5xx&since=77&local=1"
    );
}

#[test]
fn a_tenant_takes_at_most_its_tailers() {
    let t = tail(10, 100, 0);
    let a = t.attach().unwrap();
    let b = t.attach().unwrap();
    assert!(t.attach().is_none());
    drop(a);
    let c = t.attach();
    assert!(c.is_some());
    drop((b, c));
}
