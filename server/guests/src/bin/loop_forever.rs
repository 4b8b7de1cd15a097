//! Loops forever without a host call: `504` at the tenant's deadline; other tenants keep
//! answering meanwhile (the loop yields at every epoch tick).
fn main() {
    let mut x: u64 = 0;
    loop {
        x = std::hint::black_box(x.wrapping_add(1));
    }
}
