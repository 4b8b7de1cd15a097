//! `visits`: counts its visitors in the tenant's `default` key-value store.
//!
//! Unlike `counter` (a static, back at zero for every request), the count lives in the store:
//! it goes up across requests and survives a restart of the server. The tenant is granted the
//! store in its config:
//!
//! ```toml
//! [[tenant]]
//! name = "visits"
//! module = "builtin:visits"
//! paths = ["/visits"]
//! kv = ["default"]
//! ```
//!
//! Build: `cargo build -p tern-sdk --example visits --target wasm32-wasip1 --profile guest`

use tern_sdk::Body;
use tern_sdk::http::{Request, Response, StatusCode};
use tern_sdk::kv::Store;

fn visits(_req: Request<Body>) -> Response<String> {
    let counted = Store::open("default").and_then(|store| store.increment("visits", 1));
    let (status, body) = match counted {
        Ok(n) => (StatusCode::OK, format!("visit {n}\n")),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")),
    };
    Response::builder()
        .status(status)
        .header("content-type", "text/plain")
        .body(body)
        .expect("static head is valid")
}

fn main() {
    tern_sdk::serve(visits);
}
