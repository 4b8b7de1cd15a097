//! Waits in a host call for a request body the client never finishes sending: `504` at the
//! deadline, and the wait holds no worker thread.
use std::io::Read;

fn main() {
    let mut body = tern_sdk::Body::default();
    let mut buf = [0u8; 1024];
    while body.read(&mut buf).map(|n| n > 0).unwrap_or(false) {}
    tern_test_guests::reply("body ended");
}
