//! Answers with every `request_info` value, one `KEY=value` per line (`KEY!code` for an error
//! code), and the code a key the server does not know gets (`UNKNOWN!code`): what the guest
//! can learn about its request beyond the message.
use tern_sdk::abi::info;

fn main() {
    let mut text = String::new();
    for (name, key) in info::ALL.into_iter().chain([("UNKNOWN", 1000)]) {
        match tern_sdk::raw::info(key) {
            Ok(v) => text.push_str(&format!("{name}={}\n", String::from_utf8_lossy(&v))),
            Err(e) => text.push_str(&format!("{name}!{}\n", e.0)),
        }
    }
    // The SDK's typed view must agree with the raw values.
    let addr = tern_sdk::context::client_addr().map_or("-".into(), |a| a.to_string());
    text.push_str(&format!("sdk client_addr={addr}\n"));
    text.push_str(&format!(
        "sdk split={}|{}\n",
        tern_sdk::context::route_prefix().unwrap_or_default(),
        tern_sdk::context::path_info().unwrap_or_default()
    ));
    tern_test_guests::reply(&text);
}
