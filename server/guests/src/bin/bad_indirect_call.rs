//! Calls through a function pointer that names no function: an indirect-call trap, `500`.
fn main() {
    let index = std::hint::black_box(0x7fff_0000usize);
    // SAFETY: none; this guest exists to make exactly this invalid call.
    #[allow(unsafe_code)]
    let f: fn() = unsafe { std::mem::transmute(index) };
    f();
}
