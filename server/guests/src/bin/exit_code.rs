//! Responds, then calls `proc_exit` with the code in `?code=N`: `0` keeps the response (`200`),
//! anything else is `500`.
fn main() {
    let uri = tern_sdk::raw::uri().unwrap_or_default();
    let uri = String::from_utf8_lossy(&uri).into_owned();
    let code: i32 = uri
        .split("code=")
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    tern_test_guests::reply("responded before exiting");
    std::process::exit(code);
}
