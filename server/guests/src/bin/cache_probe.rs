//! Uses the guest cache API (`tern_sdk::cache`) as its query says and answers with one line:
//! `found=0|1 stale=0|1 must=0|1 age=SECONDS body=BYTES` (the entry after what it did), or
//! `500` and the error.
//!
//! Query: `key=K` (the entry; `size=N`: N bytes of `k` instead), `op=`:
//! - `lookup`: a plain lookup;
//! - `tx` (the default): a transactional lookup; when it is this request's turn to insert,
//!   spins `spin=MS` milliseconds first, then with `trap=1` traps, with `close=1` gives the turn
//!   up, else inserts `made by REQUEST-ID` (or `value=V`, or `bytes=N` bytes of `v`) for
//!   `ttl=N` seconds (60), `swr=N` more stale, tags `tags=a,b`, varying on `vary=h1,h2`;
//! - `set`: a plain lookup, then inserts as `tx` would whatever it found;
//! - `get_or_set`: `tern_sdk::cache::get_or_set` with `ttl` and the same value;
//! - `purge`: purges the tag `tag=T` (`soft=1`: soft) and answers `purged=N`.
//!
//! Every lookup gives all of the request's headers.
use std::time::{Duration, Instant};

use tern_sdk::cache::{self, CacheError, Entry, Write};
use tern_test_guests::{query_number, query_text};

fn value() -> Vec<u8> {
    if let Some(n) = query_text("bytes").and_then(|n| n.parse().ok()) {
        return vec![b'v'; n];
    }
    query_text("value")
        .unwrap_or_else(|| {
            let id = tern_sdk::context::request_id().unwrap_or_default();
            format!("made by {id}")
        })
        .into_bytes()
}

fn write() -> Write {
    let mut write =
        Write::new(query_number("ttl", 60)).stale_while_revalidate(query_number("swr", 0));
    for tag in query_text("tags")
        .unwrap_or_default()
        .split(',')
        .filter(|t| !t.is_empty())
    {
        write = write.tag(tag);
    }
    for name in query_text("vary")
        .unwrap_or_default()
        .split(',')
        .filter(|t| !t.is_empty())
    {
        write = write.vary(name);
    }
    write
}

fn describe(entry: &Entry) -> Result<String, CacheError> {
    let body = entry.body()?.unwrap_or_default();
    Ok(format!(
        "found={} stale={} must={} age={} body={}",
        u8::from(entry.is_found()),
        u8::from(entry.is_stale()),
        u8::from(entry.must_insert()),
        entry.age().map_or(0, |a| a.as_secs()),
        String::from_utf8_lossy(&body)
    ))
}

fn run(headers: &[(&str, &str)]) -> Result<String, CacheError> {
    let key = match query_text("size").and_then(|n| n.parse().ok()) {
        Some(n) => vec![b'k'; n],
        None => query_text("key").unwrap_or_default().into_bytes(),
    };
    let op = query_text("op").unwrap_or_else(|| "tx".into());
    match op.as_str() {
        "lookup" => describe(&cache::lookup(&key, headers)?),
        "set" => {
            let entry = cache::lookup(&key, headers)?;
            entry.insert(&value(), &write())?;
            describe(&entry)
        }
        "get_or_set" => {
            let body = cache::get_or_set(&key, query_number("ttl", 60), value)?;
            Ok(format!("body={}", String::from_utf8_lossy(&body)))
        }
        "purge" => {
            let tag = query_text("tag").unwrap_or_default();
            let purged = if query_text("soft").is_some() {
                cache::purge_tag_soft(&tag)?
            } else {
                cache::purge_tag(&tag)?
            };
            Ok(format!("purged={purged}"))
        }
        _ => {
            let entry = cache::transaction_lookup(&key, headers)?;
            if entry.must_insert() {
                let until = Instant::now() + Duration::from_millis(query_number("spin", 0));
                while Instant::now() < until {
                    std::hint::spin_loop();
                }
                assert!(
                    query_text("trap").is_none(),
                    "trapped with the turn to insert"
                );
                if query_text("close").is_some() {
                    drop(entry);
                    return Ok("closed".into());
                }
                entry.insert(&value(), &write())?;
            }
            describe(&entry)
        }
    }
}

fn main() {
    tern_sdk::serve(|req| {
        let pairs: Vec<(String, String)> = req
            .headers()
            .iter()
            .map(|(n, v)| {
                (
                    n.to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect();
        let headers: Vec<(&str, &str)> = pairs
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        let (status, text) = match run(&headers) {
            Ok(text) => (200, text),
            Err(e) => (500, e.to_string()),
        };
        tern_sdk::http::Response::builder()
            .status(status)
            .body(text.into_bytes())
            .expect("a valid answer")
    });
}
