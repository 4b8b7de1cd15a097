//! Computes for `?ms=N` milliseconds of wall time (default 300) and answers `200`: a CPU-bound
//! tenant that yields only at epoch ticks.
fn main() {
    let ms: u128 = tern_test_guests::query_number("ms", 300);
    let start = std::time::Instant::now();
    let mut x: u64 = 1;
    while start.elapsed().as_millis() < ms {
        for _ in 0..10_000 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
    tern_test_guests::reply(&format!("burned {ms} ms ({x})"));
}
