//! `proxy`: a reverse proxy in front of the tenant's backend `origin`.
//!
//! The path below the tenant's route prefix (and the query) goes to the backend; request and
//! response bodies stream through in both directions without being held whole; the backend
//! learns who asked (`x-forwarded-for`, `-host`, `-proto`), and responses without a
//! `cache-control` get `public, max-age=60`. A backend that cannot be reached gives `502`, one
//! too slow `504`.
//!
//! ```toml
//! [[tenant]]
//! name = "shop"
//! module = "builtin:proxy"
//! paths = ["/shop"]
//! [tenant.outbound.backends.origin]
//! url = "http://10.0.0.5:8080"
//! ```
//!
//! Build: `cargo build -p tern-sdk --example proxy --target wasm32-wasip1 --profile guest`

use std::io::{self, Read, Write};

use tern_sdk::abi::errno;
use tern_sdk::http::{HeaderValue, Response, StatusCode};
use tern_sdk::outbound::{Incoming, Outgoing};
use tern_sdk::{Body, FetchError, ResponseWriter, context};

/// Request headers that describe one connection, not the request: never forwarded.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
];

fn main() {
    if let Err(e) = proxy() {
        let status = match e.code {
            errno::TIMEOUT => StatusCode::GATEWAY_TIMEOUT,
            _ => StatusCode::BAD_GATEWAY,
        };
        let resp = Response::builder()
            .status(status)
            .header("content-type", "text/plain")
            .body(format!("proxy: {e}\n").into_bytes())
            .expect("static head is valid");
        tern_sdk::respond(resp).expect("error response accepted");
    }
}

fn proxy() -> Result<(), FetchError> {
    let req = tern_sdk::request().map_err(|e| FetchError {
        code: e.0,
        message: "the request could not be read".into(),
    })?;
    let (parts, body) = req.into_parts();
    let below = context::path_info().unwrap_or_default();
    let mut path = if below.is_empty() {
        "/".to_string()
    } else {
        below
    };
    if let Some(q) = parts.uri.query() {
        path.push('?');
        path.push_str(q);
    }
    let mut out = Outgoing::to_backend(&parts.method, "origin", &path)?;
    for (name, value) in &parts.headers {
        if !HOP_BY_HOP.contains(&name.as_str()) {
            out.header(name.as_str(), value.as_bytes())?;
        }
    }
    if let Some(ip) = context::client_addr().map(|a| a.ip().to_string()) {
        out.header("x-forwarded-for", ip.as_bytes())?;
    }
    if let Some(host) = context::host() {
        out.header("x-forwarded-host", host.as_bytes())?;
    }
    out.header(
        "x-forwarded-proto",
        context::scheme().unwrap_or_default().as_bytes(),
    )?;

    // One buffer for both directions, small enough that a request needs no more memory than
    // the guest starts with: growing it would cost the server page-protection changes on every
    // request.
    let mut buf = vec![0u8; BUFFER];
    let has_body = parts.headers.contains_key("content-length")
        || parts.headers.contains_key("transfer-encoding");
    let pending = if has_body {
        let mut upstream = out.send_streaming()?;
        copy(body, &mut upstream, &mut buf)?;
        upstream.finish()?
    } else {
        out.send()?
    };
    let resp = pending.response()?;
    respond(resp, &mut buf)
}

/// Bytes relayed per host call.
const BUFFER: usize = 16 * 1024;

/// Streams the client's body to the backend.
fn copy(mut from: Body, to: &mut impl Write, buf: &mut [u8]) -> Result<(), FetchError> {
    let io_failure = |e: io::Error| FetchError {
        code: errno::IO,
        message: format!("relaying the request body: {e}"),
    };
    loop {
        let n = from.read(buf).map_err(io_failure)?;
        if n == 0 {
            return Ok(());
        }
        to.write_all(&buf[..n]).map_err(io_failure)?;
    }
}

/// Sends the backend's response on to the client, its body streamed.
fn respond(mut resp: Incoming, buf: &mut [u8]) -> Result<(), FetchError> {
    let mut head = Response::new(());
    *head.status_mut() = resp.status;
    *head.headers_mut() = std::mem::take(&mut resp.headers);
    head.headers_mut()
        .entry("cache-control")
        .or_insert(HeaderValue::from_static("public, max-age=60"));
    let (head, ()) = head.into_parts();
    let mut client = ResponseWriter::start(&head).map_err(|e| FetchError {
        code: e.0,
        message: "the response head was refused".into(),
    })?;
    loop {
        let n = resp.body.read_chunk(buf)?;
        if n == 0 {
            return Ok(());
        }
        // The client left: nothing more to do.
        if client.write_all(&buf[..n]).is_err() {
            return Ok(());
        }
    }
}
