//! A Spin HTTP component as spin-sdk 7 writes one: an async handler, built for
//! wasm32-wasip2 into a WASI 0.3 (component-model async) component. One behaviour per path
//! (its last segment):
//!
//! - anything else: `hello from tern-spin-sdk7: PATH`.
//! - `/echo`: the request body's length.
//! - `/big?n=N`: N bytes of `x`.
//! - `/fetch?url=U`: `spin_sdk::http::send` to U; the backend's status and body, or 502.
//! - `/panic`: panics. `/loop`: never ends.
//! - `/var/NAME`: the variable NAME as Spin's docs read one (`spin_sdk::variables::get`,
//!   `spin:variables@3.0.0`): `200` and the value, `404` "undefined: ...", or `500`.

use spin_sdk::http::body::IncomingBodyExt;
use spin_sdk::http::{IntoResponse, Request};
use spin_sdk::http_service;

fn query(req: &Request, key: &str) -> Option<String> {
    req.uri()
        .query()?
        .split('&')
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=').map(str::to_string))
}

#[http_service]
async fn handle(req: Request) -> anyhow::Result<impl IntoResponse> {
    let path = req.uri().path().to_string();
    if let Some((_, name)) = path.split_once("/var/") {
        return Ok(match spin_sdk::variables::get(name).await {
            Ok(value) => (http::StatusCode::OK, value),
            Err(spin_sdk::variables::Error::Undefined(why)) => {
                (http::StatusCode::NOT_FOUND, format!("undefined: {why}"))
            }
            Err(e) => (http::StatusCode::INTERNAL_SERVER_ERROR, format!("{e:?}")),
        });
    }
    let last = path.rsplit('/').next().unwrap_or_default().to_string();
    Ok(match last.as_str() {
        "echo" => {
            let body = req.into_body().bytes().await.map_err(|e| anyhow::anyhow!("{e:?}"))?;
            (http::StatusCode::OK, format!("read {} bytes\n", body.len()))
        }
        "big" => {
            let n: usize = query(&req, "n").and_then(|n| n.parse().ok()).unwrap_or(0);
            (http::StatusCode::OK, "x".repeat(n))
        }
        "fetch" => {
            let url = query(&req, "url").unwrap_or_default();
            let outgoing = http::Request::get(url)
                .body(http_body_util::Empty::<bytes::Bytes>::new())?;
            match spin_sdk::http::send(outgoing).await {
                Ok(r) => {
                    let status = r.status().as_u16();
                    let body = r.into_body().bytes().await.map_err(|e| anyhow::anyhow!("{e:?}"))?;
                    (http::StatusCode::OK, format!("backend said {status}: {}", String::from_utf8_lossy(&body)))
                }
                Err(e) => (http::StatusCode::BAD_GATEWAY, format!("fetch failed: {e:?}\n")),
            }
        }
        "panic" => panic!("a panic in a WASI 0.3 handler"),
        "loop" => {
            let mut n = 0u64;
            loop {
                n = std::hint::black_box(n.wrapping_add(1));
            }
        }
        _ => (http::StatusCode::OK, format!("hello from tern-spin-sdk7: {path}\n")),
    })
}
