//! `echo`: answers with the request's method, target and headers, then its body, streamed back.
//!
//! Build: `cargo build -p tern-sdk --example echo --target wasm32-wasip1 --profile guest`

use std::io::{Read, Write};
use tern_sdk::http::{Request, Response};
use tern_sdk::{Body, ResponseWriter};

fn main() {
    let req: Request<Body> = match tern_sdk::request() {
        Ok(req) => req,
        Err(e) => {
            eprintln!("echo: {e}");
            std::process::exit(1);
        }
    };
    let (parts, mut body) = req.into_parts();
    let (head, ()) = Response::builder()
        .header("content-type", "text/plain; charset=utf-8")
        .header("x-echo-method", parts.method.as_str())
        .body(())
        .expect("static head is valid")
        .into_parts();

    let mut out = ResponseWriter::start(&head).expect("head accepted");
    let mut text = format!("{} {}\n", parts.method, parts.uri);
    for (name, value) in &parts.headers {
        text.push_str(&format!(
            "{}: {}\n",
            name,
            String::from_utf8_lossy(value.as_bytes())
        ));
    }
    text.push('\n');
    out.write_all(text.as_bytes()).expect("write head echo");

    // Stream the body back in chunks: the guest never holds all of it.
    let mut chunk = [0u8; 16 * 1024];
    loop {
        let n = body.read(&mut chunk).expect("read body");
        if n == 0 {
            break;
        }
        out.write_all(&chunk[..n]).expect("write body");
    }
}
