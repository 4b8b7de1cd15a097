//! A CGI program (plain Rust, no SDK) with one behaviour per `PATH_INFO`, for the tests of
//! malformed and edge-case CGI output:
//!
//! - `/raw`: text without a header block: `502`.
//! - `/nothing`: no output at all: `502`.
//! - `/bad-status`: `Status: abc`: `502`.
//! - `/huge-header`: a header line longer than the 64 KiB header block limit: `502`.
//! - `/exit-early`: a header line, then exit status 3 before the blank line: `502`.
//! - `/exit-after`: a complete response, then exit status 3: the response stands.
//! - `/headers-only`: `Status: 204` and no blank line before the end: `204`.
//! - `/location`: `Location: /elsewhere` and nothing else: `302`.
//! - `/big?n=N`: `200` with N bytes of `x`, written in one go after the headers.
//! - `/read`: reads stdin to its end and reports how many bytes it got (or the error).
//! - `/args`: its arguments, one per line.
//! - `/env`: its environment (the request's meta-variables), one `NAME=value` per line.
//! - `/handoff`: hands the client's WebSocket to the tenant's backend `echo` (`Tern-Handoff:
//!   echo`) with `X-User: cgi`.
//! - `/cached`: `Cache-Control: max-age=60`, `ETag: "c1"`, `Surrogate-Key: cgi` and a body
//!   naming the instant it ran; `Status: 304` when `If-None-Match` is `"c1"`.

use std::io::{Read, Write};

fn main() {
    let path = std::env::var("PATH_INFO").unwrap_or_default();
    let query = std::env::var("QUERY_STRING").unwrap_or_default();
    let mut out = std::io::stdout().lock();
    match path.as_str() {
        "/raw" => {
            let _ = writeln!(out, "Hello without headers");
        }
        "/nothing" => {}
        "/handoff" => {
            let _ = write!(out, "Tern-Handoff: echo\nX-User: cgi\n\n");
        }
        "/bad-status" => {
            let _ = write!(out, "Status: abc\r\n\r\nbody");
        }
        "/huge-header" => {
            let _ = write!(out, "X-Big: {}", "y".repeat(70 * 1024));
        }
        "/exit-early" => {
            let _ = write!(out, "Content-Type: text/plain\r\n");
            let _ = out.flush();
            std::process::exit(3);
        }
        "/exit-after" => {
            let _ = write!(out, "Content-Type: text/plain\r\n\r\ncomplete\n");
            let _ = out.flush();
            std::process::exit(3);
        }
        "/headers-only" => {
            let _ = writeln!(out, "Status: 204 No Content");
        }
        "/location" => {
            let _ = write!(out, "Location: /elsewhere\n\n");
        }
        "/big" => {
            let n: usize = query
                .strip_prefix("n=")
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            let mut all = b"Content-Type: application/octet-stream\n\n".to_vec();
            all.resize(all.len() + n, b'x');
            let _ = out.write_all(&all);
        }
        "/read" => {
            let mut body = Vec::new();
            let result = std::io::stdin().read_to_end(&mut body);
            let _ = write!(out, "Content-Type: text/plain\n\n");
            let _ = match result {
                Ok(n) => writeln!(out, "read {n} bytes"),
                Err(e) => writeln!(out, "read failed after {} bytes: {e}", body.len()),
            };
        }
        "/args" => {
            let _ = write!(out, "Content-Type: text/plain\n\n");
            for a in std::env::args() {
                let _ = writeln!(out, "{a}");
            }
        }
        "/cached" => {
            let head = "Cache-Control: max-age=60\nETag: \"c1\"\nSurrogate-Key: cgi\n";
            if std::env::var("HTTP_IF_NONE_MATCH").as_deref() == Ok("\"c1\"") {
                let _ = write!(out, "Status: 304 Not Modified\n{head}\n");
            } else {
                let nanos = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos());
                let _ = write!(out, "Content-Type: text/plain\n{head}\nrun {nanos}\n");
            }
        }
        "/env" => {
            let _ = write!(out, "Content-Type: text/plain\n\n");
            for (k, v) in std::env::vars() {
                let _ = writeln!(out, "{k}={v}");
            }
        }
        _ => {
            let _ = write!(out, "Status: 404 Not Found\n\nno such test path\n");
        }
    }
    let _ = out.flush();
}
