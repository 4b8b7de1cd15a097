//! `proxy`: a reverse proxy in front of the tenant's backend `origin`.
//!
//! The path below the tenant's route prefix (and the query) goes to the backend with the
//! client's headers; the backend learns who asked (`x-forwarded-for`, `-host`, `-proto`), and
//! responses without a `cache-control` get `public, max-age=60`. Bodies are forwarded: the
//! server streams the client's body to the backend and the backend's to the client, never
//! through the guest (which is gone before a long answer has finished). A backend that cannot
//! be reached gives `502`, one too slow `504`.
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

use tern_sdk::abi::errno;
use tern_sdk::http::{Method, Response, StatusCode};
use tern_sdk::outbound::Outgoing;
use tern_sdk::{FetchError, context, raw};

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
    let unreadable = |e: tern_sdk::Error| FetchError {
        code: e.0,
        message: "the request could not be read".into(),
    };
    let method = raw::method().map_err(unreadable)?;
    let method = Method::from_bytes(&method)
        .map_err(|_| unreadable(tern_sdk::Error(errno::INVALID_ARGUMENT)))?;
    let target = raw::uri().map_err(unreadable)?;
    let below = context::path_info().unwrap_or_default();
    let mut path = if below.is_empty() {
        "/".to_string()
    } else {
        below
    };
    if let Some(q) = target.iter().position(|b| *b == b'?') {
        path.push_str(&String::from_utf8_lossy(&target[q..]));
    }
    let mut out = Outgoing::to_backend(&method, "origin", &path)?;
    // The client's headers (the server drops `Host` and the hop-by-hop ones) and its body,
    // streamed to the backend by the server.
    out.forward_request()?;
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
    let pending = out.send()?;
    let cacheable = pending.response_header("cache-control")?.is_none();
    // The backend's answer is ours: the server streams its body to the client once this
    // instance is gone.
    pending.forward_response()?;
    if cacheable {
        // Past the tenant's header limit the answer goes without it.
        let _ = raw::header_append(b"cache-control", b"public, max-age=60");
    }
    Ok(())
}
