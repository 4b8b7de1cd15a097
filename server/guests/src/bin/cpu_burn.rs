//! Computes for `?ms=N` milliseconds of wall time (default 300) and answers `200`: a CPU-bound
//! tenant that yields only at epoch ticks.
fn main() {
    let uri = tern_sdk::raw::uri().unwrap_or_default();
    let uri = String::from_utf8_lossy(&uri).into_owned();
    let ms: u128 = uri
        .split("ms=")
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(300);
    let start = std::time::Instant::now();
    let mut x: u64 = 1;
    while start.elapsed().as_millis() < ms {
        for _ in 0..10_000 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
    tern_test_guests::reply(&format!("burned {ms} ms ({x})"));
}
