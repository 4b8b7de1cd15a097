//! `counter`: increments a static and answers with its value.
//!
//! Every request runs in a fresh instance, so the answer is always `1`: proof that no state
//! survives from one request to the next.
//!
//! Build: `cargo build -p tern-sdk --example counter --target wasm32-wasip1 --profile guest`

use std::sync::atomic::{AtomicU64, Ordering};
use tern_sdk::Body;
use tern_sdk::http::{Request, Response};

static COUNT: AtomicU64 = AtomicU64::new(0);

fn count(_req: Request<Body>) -> Response<String> {
    let n = COUNT.fetch_add(1, Ordering::Relaxed) + 1;
    Response::builder()
        .header("content-type", "text/plain")
        .body(format!("{n}\n"))
        .expect("static head is valid")
}

fn main() {
    tern_sdk::serve(count);
}
