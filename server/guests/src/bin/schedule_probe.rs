//! Records each run it gets in the `default` key-value store, for the scheduled runs' tests.
//! A `POST` appends the line `PATH|Tern-Schedule|Tern-Schedule-Name|Tern-Scheduled-Time|body`
//! (key `run:N`, `N` counting from 1 in key `count`) and answers `?status=N` (default 200)
//! after `?sleep_ms=N` (sleeping, and `running` set to 1 while it does: a run that finds it set
//! records `OVERLAP` first); with `?clock=1` the line ends with `|` and when the run started
//! by the guest's clock (Unix milliseconds). A `GET` answers every recorded line, one per line,
//! up to the first a run has counted and not yet stored.
use tern_sdk::kv::Store;

fn header(req: &tern_sdk::http::Request<tern_sdk::Body>, name: &str) -> String {
    req.headers().get(name).map_or("-".into(), |v| {
        String::from_utf8_lossy(v.as_bytes()).into_owned()
    })
}

fn main() {
    tern_sdk::serve(|req| {
        let store = Store::open("default").expect("the default store");
        let mut text = String::new();
        let mut status = 200u16;
        if req.method() == "POST" {
            let line = format!(
                "{}|{}|{}|{}",
                req.uri().path(),
                header(&req, "tern-schedule"),
                header(&req, "tern-schedule-name"),
                header(&req, "tern-scheduled-time"),
            );
            let body = req.into_body().into_bytes().unwrap_or_default();
            let mut line = format!("{line}|{}", String::from_utf8_lossy(&body));
            if tern_test_guests::query_number("clock", 0) == 1 {
                // When this run started, by the guest's wall clock (Unix milliseconds).
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis());
                line.push_str(&format!("|{now}"));
            }
            if store.get("running").ok().flatten().as_deref() == Some(b"1") {
                let n = store.increment("count", 1).expect("count");
                store.set(format!("run:{n}"), "OVERLAP").expect("set");
            }
            let n = store.increment("count", 1).expect("count");
            store.set(format!("run:{n}"), &line).expect("set");
            let sleep: u64 = tern_test_guests::query_number("sleep_ms", 0);
            if sleep > 0 {
                store.set("running", "1").expect("set");
                std::thread::sleep(std::time::Duration::from_millis(sleep));
                store.set("running", "0").expect("set");
            }
            status = tern_test_guests::query_number("status", 200);
            text.push_str(&format!("{n}\n"));
        } else {
            let count: i64 = store
                .get("count")
                .ok()
                .flatten()
                .and_then(|v| String::from_utf8_lossy(&v).parse().ok())
                .unwrap_or(0);
            // A run counts itself before it stores its line: one counted and not yet
            // stored (a run under way) ends the answer, which has every line before it.
            for n in 1..=count {
                let Some(line) = store.get(format!("run:{n}")).ok().flatten() else {
                    break;
                };
                text.push_str(&String::from_utf8_lossy(&line));
                text.push('\n');
            }
        }
        tern_sdk::http::Response::builder()
            .status(status)
            .header("content-type", "text/plain")
            .body(text.into_bytes())
            .expect("a valid head")
    });
}
