//! A CGI program in plain Rust: no SDK, only `std` (served by Tern as the `cgi` guest kind,
//! and by any CGI server that runs WASI programs). The request arrives in the environment
//! (RFC 3875 meta-variables) and on stdin; the answer leaves on stdout as CGI headers, a blank
//! line, and the body.
//!
//! `GET /` says hello, `GET /env` lists the meta-variables, `POST /echo` copies the body back
//! as it streams in.

use std::io::{Read, Write};

fn main() -> std::io::Result<()> {
    let path = std::env::var("PATH_INFO").unwrap_or_default();
    let mut out = std::io::stdout().lock();
    match path.as_str() {
        "/env" => {
            write!(out, "Content-Type: text/plain; charset=utf-8\r\n\r\n")?;
            let mut vars: Vec<(String, String)> = std::env::vars().collect();
            vars.sort();
            for (k, v) in vars {
                writeln!(out, "{k}={v}")?;
            }
        }
        "/echo" => {
            write!(out, "Content-Type: application/octet-stream\r\n\r\n")?;
            let mut buf = vec![0u8; 16 * 1024];
            let mut input = std::io::stdin().lock();
            loop {
                let n = input.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                out.write_all(&buf[..n])?;
            }
        }
        "" | "/" => {
            write!(out, "Content-Type: text/plain; charset=utf-8\r\n\r\n")?;
            writeln!(out, "Hello from a CGI program on Tern!")?;
        }
        other => {
            write!(
                out,
                "Status: 404 Not Found\r\nContent-Type: text/plain\r\n\r\n"
            )?;
            writeln!(out, "no page {other:?}")?;
        }
    }
    out.flush()
}
