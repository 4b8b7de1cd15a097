//! Recurses without end: a Wasm stack overflow trap, `500` naming it; never a host crash.
#![allow(unconditional_recursion)]
/// Scalar arguments only, so every frame lives on the Wasm stack (not the shadow stack in
/// linear memory), and `black_box` keeps the recursion from becoming a loop.
fn deep(n: u64) -> u64 {
    std::hint::black_box(deep(std::hint::black_box(n + 1))) ^ n
}

fn main() {
    std::hint::black_box(deep(0));
}
