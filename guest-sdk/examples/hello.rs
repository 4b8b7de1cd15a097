//! `hello`: answers every request with a short greeting.
//!
//! Build: `cargo build -p tern-sdk --example hello --target wasm32-wasip1 --profile guest`

use tern_sdk::Body;
use tern_sdk::http::{Request, Response};

fn hello(_req: Request<Body>) -> Response<&'static [u8]> {
    let mut response = Response::new(&b"Hello from Tern!\n"[..]);
    response.headers_mut().insert(
        "content-type",
        tern_sdk::http::HeaderValue::from_static("text/plain"),
    );
    response
}

fn main() {
    tern_sdk::serve(hello);
}
