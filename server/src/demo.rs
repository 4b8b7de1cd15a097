//! The demo guests, built from `guest-sdk/examples` by `build.rs` and embedded in the binary,
//! so `tern serve` works with no files at all (`module = "builtin:NAME"`). `proxy` and
//! `aggregate` call backends the tenant configures under `[tenant.outbound.backends]`
//! (`origin`; `users` and `orders`); `cgi` is a plain Rust program served as CGI, `wasi-http`
//! a `wasi:http` component; the rest use the Tern ABI.

// `NAMES` and `module(name)`, written by build.rs from its one list of demo guests.
include!(concat!(env!("OUT_DIR"), "/demo_guests.rs"));
