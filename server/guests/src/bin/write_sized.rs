//! Writes `?n=BYTES` of body (default 65,537), byte `i` being `i % 251`, in writes of
//! `?chunk=BYTES` (default: all at once) and answers `200` with exactly that body. `?slow=1`
//! computes for about 2 ms before each write, so the head leaves while the guest still runs;
//! without it the guest usually finishes before the server looks at its head. `?declare=N`
//! first sets `content-length: N` (the server holds the body to it); `?type=T` sets
//! `content-type: T`.
fn main() {
    let n: usize = tern_test_guests::query_number("n", 65_537);
    for (name, header) in [("declare", "content-length"), ("type", "content-type")] {
        if let Some(value) = tern_test_guests::query_text(name)
            && tern_sdk::raw::header_append(header.as_bytes(), value.as_bytes()).is_err()
        {
            std::process::exit(2);
        }
    }
    let chunk: usize = tern_test_guests::query_number("chunk", n).max(1);
    let slow = tern_test_guests::query_number("slow", 0u8) == 1;
    let body: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
    for piece in body.chunks(chunk) {
        if slow {
            let start = std::time::Instant::now();
            let mut x: u64 = 1;
            while start.elapsed().as_micros() < 2_000 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
        }
        let mut rest = piece;
        while !rest.is_empty() {
            match tern_sdk::raw::body_write(rest) {
                Ok(w) => rest = &rest[w..],
                // Past a declared length: stop writing (the server fails the request).
                Err(e) if e.0 == tern_sdk::abi::errno::LIMIT_EXCEEDED => return,
                Err(_) => std::process::exit(1),
            }
        }
    }
}
