//! Writes to stdout and stderr and answers as its query says, for the live log's tests:
//! `?say=TEXT` prints `TEXT` on stdout and `err TEXT` on stderr; `?status=N` answers `N`;
//! `?trap=1` panics (a Wasm `unreachable`, `500`) after a line on stderr; `?spin=1` runs past
//! its time limit (`504`); `?odd=1` writes invalid UTF-8, ANSI escapes, a carriage return and
//! a last line without its newline; `?flood=N` writes `N` bytes of `e` to stderr (cut at the
//! tenant's `stdio_bytes`); `?cache=1` answers with `Cache-Control: public, max-age=60`.
use std::io::Write;

fn main() {
    let say = tern_test_guests::query_text("say").unwrap_or_default();
    if !say.is_empty() {
        println!("{say}");
        eprintln!("err {say}");
    }
    if tern_test_guests::query_number("trap", 0) == 1 {
        eprintln!("about to trap");
        let v: Vec<u32> = std::hint::black_box(Vec::new());
        println!("{}", v[3]);
    }
    if tern_test_guests::query_number("spin", 0) == 1 {
        loop {
            std::hint::black_box(0u64);
        }
    }
    if tern_test_guests::query_number("odd", 0) == 1 {
        let mut out = std::io::stdout();
        let _ = out.write_all(b"bad \xff\xfe utf8\n\x1b[31mred\x1b[0m\r\nno newline at the end");
        let _ = out.flush();
    }
    let flood: usize = tern_test_guests::query_number("flood", 0);
    let chunk = [b'e'; 1024];
    let mut err = std::io::stderr();
    let mut written = 0;
    while written < flood {
        if err
            .write_all(&chunk[..(flood - written).min(1024)])
            .is_err()
        {
            break;
        }
        written += 1024;
    }
    let status: u16 = tern_test_guests::query_number("status", 200);
    let cache = tern_test_guests::query_number("cache", 0) == 1;
    tern_sdk::serve(move |_req| {
        let mut r = tern_sdk::http::Response::builder()
            .status(status)
            .header("content-type", "text/plain");
        if cache {
            r = r.header("cache-control", "public, max-age=60");
        }
        r.body(b"logged\n".to_vec()).expect("a valid head")
    });
}
