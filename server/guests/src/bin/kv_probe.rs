//! Runs the key-value operations its query lists, in order, and answers one line per
//! operation: the result, or `error=NAME MESSAGE`.
//!
//! Query: `store=NAME` (default `default`), then `op=...` pairs: `get:KEY`, `set:KEY:VALUE`,
//! `setn:KEY:N` (a value of N bytes), `delete:KEY`, `exists:KEY`, `incr:KEY:DELTA`,
//! `cas:KEY:OLD:NEW` (`OLD` `-` for "absent"), `list` (every key, comma-separated),
//! `open:NAME` (opens another store and uses it from then on), `many:N` (N `exists` calls,
//! stopping at the first error).
use tern_sdk::kv::{KvError, Store};

fn error(e: &KvError) -> String {
    let name = tern_sdk::abi::errno::name(e.code);
    format!("error={name} {}", e.message)
}

fn run(store: &mut Option<Store>, op: &str) -> Result<String, KvError> {
    let mut parts = op.splitn(4, ':');
    let verb = parts.next().unwrap_or("");
    let key = parts.next().unwrap_or("");
    if verb == "open" {
        *store = Some(Store::open(key)?);
        return Ok("opened".into());
    }
    let s = match store {
        Some(s) => *s,
        None => return Ok("no store".into()),
    };
    Ok(match verb {
        "get" => match s.get(key)? {
            Some(v) => String::from_utf8_lossy(&v).into_owned(),
            None => "none".into(),
        },
        "set" => {
            s.set(key, parts.next().unwrap_or(""))?;
            "ok".into()
        }
        "setn" => {
            let n: usize = parts.next().and_then(|n| n.parse().ok()).unwrap_or(0);
            s.set(key, vec![b'v'; n])?;
            "ok".into()
        }
        "delete" => {
            s.delete(key)?;
            "ok".into()
        }
        "exists" => s.exists(key)?.to_string(),
        "incr" => {
            let by: i64 = parts.next().and_then(|n| n.parse().ok()).unwrap_or(1);
            s.increment(key, by)?.to_string()
        }
        "cas" => {
            let old = parts.next().unwrap_or("-");
            let new = parts.next().unwrap_or("");
            let expected = (old != "-").then_some(old.as_bytes());
            s.compare_and_swap(key, expected, new)?.to_string()
        }
        "list" => {
            let keys: Result<Vec<_>, _> = s.keys().collect();
            keys?
                .iter()
                .map(|k| String::from_utf8_lossy(k).into_owned())
                .collect::<Vec<_>>()
                .join(",")
        }
        "many" => {
            let n: usize = key.parse().unwrap_or(0);
            for i in 0..n {
                if let Err(e) = s.exists("k") {
                    return Ok(format!("{i} ok, then {}", error(&e)));
                }
            }
            format!("{n} ok")
        }
        other => format!("unknown op {other:?}"),
    })
}

fn main() {
    let target = tern_test_guests::target();
    let query = target.split_once('?').map_or("", |(_, q)| q);
    let mut store = None;
    let mut lines = Vec::new();
    for pair in query.split('&') {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let line = match name {
            "store" => run(&mut store, &format!("open:{value}")),
            "op" => {
                if store.is_none() {
                    store = Store::open("default").ok();
                }
                run(&mut store, value)
            }
            _ => continue,
        };
        lines.push(line.unwrap_or_else(|e| error(&e)));
    }
    let body = lines.join("\n") + "\n";
    tern_test_guests::reply(&body);
}
