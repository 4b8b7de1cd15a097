//! Links the SDK's examples (Tern's demo guests) with a 64 KiB stack instead of Rust's 1 MiB
//! default for wasm32. A Rust guest's stack sits below its data, so with 1 MiB every request
//! touches pages a megabyte apart and the instance's memory starts at 17 wasm pages; with
//! 64 KiB the `hello` guest fits in two, and Tern resets fewer pages after each request. A
//! guest that overflows it traps cleanly (the stack runs off the bottom of linear memory).
//! Guests of your own get the same with `-C link-arg=-zstack-size=65536` (see the crate docs).

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("wasm32") {
        println!("cargo:rustc-link-arg-examples=-zstack-size=65536");
    }
}
