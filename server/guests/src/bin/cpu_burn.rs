//! Computes for `?ms=N` milliseconds of wall time (default 300) and answers `200`: a CPU-bound
//! tenant that yields only at epoch ticks. With `?work=N` it computes a fixed amount instead
//! (N rounds of 10,000 steps), whatever the wall time.
fn main() {
    let work: u64 = tern_test_guests::query_number("work", 0);
    let ms: u128 = tern_test_guests::query_number("ms", 300);
    let start = std::time::Instant::now();
    let mut x: u64 = 1;
    let mut rounds = 0;
    while if work > 0 {
        rounds < work
    } else {
        start.elapsed().as_millis() < ms
    } {
        for _ in 0..10_000 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        rounds += 1;
    }
    if work > 0 {
        tern_test_guests::reply(&format!("computed {rounds} rounds ({x})"));
    } else {
        tern_test_guests::reply(&format!("burned {ms} ms ({x})"));
    }
}
