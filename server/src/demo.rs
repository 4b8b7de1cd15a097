//! The demo guests, built from `guest-sdk/examples` by `build.rs` and embedded in the binary,
//! so `tern serve` works with no files at all (`module = "builtin:NAME"`).

/// Names of the built-in modules (`proxy` and `aggregate` call backends the tenant configures
/// under `[tenant.outbound.backends]`: `origin`; `users` and `orders`). `cgi` is a plain Rust
/// program served as CGI, `wasi-http` a `wasi:http` component; the rest use the Tern ABI.
pub const NAMES: [&str; 10] = [
    "hello",
    "echo",
    "json",
    "counter",
    "visits",
    "static",
    "proxy",
    "aggregate",
    "cgi",
    "wasi-http",
];

/// The `.wasm` bytes of built-in module `name`.
pub fn module(name: &str) -> Option<&'static [u8]> {
    Some(match name {
        "hello" => include_bytes!(env!("TERN_GUEST_HELLO")),
        "echo" => include_bytes!(env!("TERN_GUEST_ECHO")),
        "json" => include_bytes!(env!("TERN_GUEST_JSON")),
        "counter" => include_bytes!(env!("TERN_GUEST_COUNTER")),
        "visits" => include_bytes!(env!("TERN_GUEST_VISITS")),
        "static" => include_bytes!(env!("TERN_GUEST_STATIC")),
        "proxy" => include_bytes!(env!("TERN_GUEST_PROXY")),
        "aggregate" => include_bytes!(env!("TERN_GUEST_AGGREGATE")),
        "cgi" => include_bytes!(env!("TERN_GUEST_CGI")),
        "wasi-http" => include_bytes!(env!("TERN_GUEST_WASI_HTTP")),
        _ => return None,
    })
}
