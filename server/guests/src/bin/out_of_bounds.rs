//! Reads far outside its linear memory: an out-of-bounds memory trap, `500`.
fn main() {
    let addr = std::hint::black_box(0xFFFF_FFF0usize) as *const u64;
    // SAFETY: none; this guest exists to make exactly this invalid access.
    #[allow(unsafe_code)]
    let v = unsafe { std::ptr::read_volatile(addr) };
    println!("{v}");
}
