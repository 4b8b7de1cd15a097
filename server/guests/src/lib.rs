//! Guests for Tern's tests, one behaviour per binary; each binary's `//!` states what the
//! server must answer. Built for `wasm32-wasip1` by the server's test harness.

/// Answers `200` with `body` as plain text.
pub fn reply(body: &str) {
    tern_sdk::serve(|_req| {
        tern_sdk::http::Response::builder()
            .header("content-type", "text/plain")
            .body(body.as_bytes().to_vec())
            .expect("static head is valid")
    });
}
