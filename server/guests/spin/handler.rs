//! A Spin HTTP component, as a Spin user writes one: answers with what it read of the
//! request. Built against each spin-sdk version of this workspace (the package name says which).

use spin_sdk::http::{IntoResponse, Request, Response};
use spin_sdk::http_component;

#[http_component]
fn handle(req: Request) -> anyhow::Result<impl IntoResponse> {
    let text = format!(
        "hello from {}: {} {} body={}\n",
        env!("CARGO_PKG_NAME"),
        req.method(),
        req.path(),
        req.body().len()
    );
    Ok(Response::builder()
        .status(200)
        .header("content-type", "text/plain")
        .header("x-toolchain", env!("CARGO_PKG_NAME"))
        .body(text)
        .build())
}
