//! Allocates 1 MiB blocks until allocation fails: the tenant's memory limit stops the growth,
//! the allocation failure aborts the guest, and the client gets `500` saying the memory limit
//! was hit.
fn main() {
    let mut hoard: Vec<Vec<u8>> = Vec::new();
    loop {
        hoard.push(vec![1u8; 1 << 20]);
        std::hint::black_box(&hoard);
    }
}
