//! Uses the rate counter API (`tern_sdk::rate_limit`) as its query says and answers with one
//! line (`blocked=0|1`, `rate=N`, `count=N`, `has=0|1`, `ok`), or `500` and the error.
//!
//! Query: `op=check|increment|rate|count|add|has`, `counter=` (`rc`), `box=` (`pb`), `entry=`
//! (`e`; `size=N`: N bytes of `e` instead), `delta=` (1), `window=` (10), `limit=` (1),
//! `ttl=` (60), `times=N` (the call made N times, the last one's answer given).
use tern_sdk::rate_limit::{PenaltyBox, RateCounter, RateError};
use tern_test_guests::{query_number, query_text};

fn once(op: &str, entry: &str) -> Result<String, RateError> {
    let counter_name = query_text("counter").unwrap_or_else(|| "rc".into());
    let box_name = query_text("box").unwrap_or_else(|| "pb".into());
    let counter = RateCounter::open(&counter_name);
    let pbox = PenaltyBox::open(&box_name);
    let window = query_number("window", 10);
    let ttl = query_number("ttl", 60);
    Ok(match op {
        "increment" => {
            counter.increment(entry, query_number("delta", 1))?;
            "ok".into()
        }
        "rate" => format!("rate={}", counter.lookup_rate(entry, window)?),
        "count" => format!("count={}", counter.lookup_count(entry, window)?),
        "add" => {
            pbox.add(entry, ttl)?;
            "ok".into()
        }
        "has" => format!("has={}", u8::from(pbox.has(entry)?)),
        _ => {
            let blocked = counter.check_rate(
                entry,
                query_number("delta", 1),
                window,
                query_number("limit", 1),
                &pbox,
                ttl,
            )?;
            format!("blocked={}", u8::from(blocked))
        }
    })
}

fn main() {
    let op = query_text("op").unwrap_or_else(|| "check".into());
    let entry = match query_text("size").and_then(|n| n.parse().ok()) {
        Some(n) => "e".repeat(n),
        None => query_text("entry").unwrap_or_else(|| "e".into()),
    };
    let mut answer = Ok(String::new());
    for _ in 0..query_number("times", 1u32) {
        answer = once(&op, &entry);
        if answer.is_err() {
            break;
        }
    }
    let (status, text) = match answer {
        Ok(text) => (200, text),
        Err(e) => (500, e.to_string()),
    };
    tern_sdk::serve(move |_| {
        tern_sdk::http::Response::builder()
            .status(status)
            .body(text.clone().into_bytes())
            .expect("a valid answer")
    });
}
