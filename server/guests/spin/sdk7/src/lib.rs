//! A Spin HTTP component as spin-sdk 7 writes one: an async handler, built for
//! wasm32-wasip2 into a WASI 0.3 (component-model async) component.

use spin_sdk::http::{IntoResponse, Request};
use spin_sdk::http_service;

#[http_service]
async fn handle(req: Request) -> anyhow::Result<impl IntoResponse> {
    Ok(format!("hello from tern-spin-sdk7: {}\n", req.uri().path()))
}
