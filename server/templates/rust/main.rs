//! {{name}}: a Tern request handler.

use tern_sdk::http::{Request, Response};
use tern_sdk::{Body, context};

fn handle(req: Request<Body>) -> Response<String> {
    let who = context::client_addr().map_or("someone".to_string(), |a| a.ip().to_string());
    let body = format!("Hello, {who}! You asked for {} {}\n", req.method(), req.uri());
    Response::builder()
        .header("content-type", "text/plain; charset=utf-8")
        .body(body)
        .expect("a valid head")
}

fn main() {
    tern_sdk::serve(handle);
}
