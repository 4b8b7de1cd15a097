//! Panics (with `panic = "abort"`, a Wasm `unreachable`): `500` naming the trap.
fn main() {
    let v: Vec<u32> = std::hint::black_box(Vec::new());
    eprintln!("about to index an empty vector");
    println!("{}", v[3]);
}
