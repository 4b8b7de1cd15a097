//! `static`: serves the tenant's assets, read-only files the guest sees under `/assets`.
//!
//! `GET /index.html` answers `/assets/index.html`; a path ending in `/` answers its
//! `index.html`. When the tenant is routed at a prefix (`/site`), `/site/index.html` works too:
//! a path that is not found is tried again without its first segment. Missing files get `404`;
//! paths the host refuses (`..` past the root, for example) get `403`.
//!
//! Deploy: `tern deploy site static.wasm --assets ./public`.
//! Build: `cargo build -p tern-sdk --example static --target wasm32-wasip1 --profile guest`

use std::io::ErrorKind;

use tern_sdk::Body;
use tern_sdk::http::{Request, Response, StatusCode};

fn content_type(path: &str) -> &'static str {
    match path.rsplit('.').next() {
        Some("html") => "text/html; charset=utf-8",
        Some("css") => "text/css",
        Some("js") => "text/javascript",
        Some("json") => "application/json",
        Some("txt") => "text/plain; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        _ => "application/octet-stream",
    }
}

fn reply(status: StatusCode, ty: &str, body: Vec<u8>) -> Response<Vec<u8>> {
    Response::builder()
        .status(status)
        .header("content-type", ty)
        .body(body)
        .expect("a valid response")
}

fn serve_file(req: Request<Body>) -> Response<Vec<u8>> {
    let path = req.uri().path();
    let without_prefix = path
        .get(1..)
        .and_then(|p| p.find('/').map(|i| &p[i..]))
        .unwrap_or("/");
    for candidate in [path, without_prefix] {
        let mut file = format!("/assets{candidate}");
        if file.ends_with('/') {
            file.push_str("index.html");
        }
        match std::fs::read(&file) {
            Ok(bytes) => return reply(StatusCode::OK, content_type(&file), bytes),
            Err(e) if e.kind() == ErrorKind::NotFound => continue,
            Err(e) if e.kind() == ErrorKind::IsADirectory => {
                if let Ok(bytes) = std::fs::read(format!("{file}/index.html")) {
                    return reply(StatusCode::OK, content_type(".html"), bytes);
                }
            }
            Err(_) => break,
        }
    }
    let status = if path.split('/').any(|s| s == "..") {
        StatusCode::FORBIDDEN
    } else {
        StatusCode::NOT_FOUND
    };
    let text = format!("{}\n", status.canonical_reason().unwrap_or("error"));
    reply(status, "text/plain; charset=utf-8", text.into_bytes())
}

fn main() {
    tern_sdk::serve(serve_file);
}
