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

/// The request target (path and query) as text.
pub fn target() -> String {
    String::from_utf8_lossy(&tern_sdk::raw::uri().unwrap_or_default()).into_owned()
}

/// The text after `name=` in the request target, up to the next `&`.
pub fn query_text(name: &str) -> Option<String> {
    let target = target();
    let value = target.split(&format!("{name}=")).nth(1)?;
    Some(value.split('&').next().unwrap_or("").to_string())
}

/// The number after `name=` in the request target, or `default`.
pub fn query_number<T: std::str::FromStr>(name: &str, default: T) -> T {
    query_text(name)
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
