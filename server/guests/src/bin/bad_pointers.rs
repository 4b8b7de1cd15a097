//! Passes host calls pointers and lengths outside its memory: the guest traps (`500`), the host
//! reads and writes nothing. `?case=` picks the call (body_write, header, uri, body_read, info, info_unavailable: a bad
//! buffer traps even for a value the request has not got).
#[cfg(target_arch = "wasm32")]
#[allow(unsafe_code)]
#[link(wasm_import_module = "tern")]
unsafe extern "C" {
    fn response_body_write(buf: usize, len: usize) -> i32;
    fn response_header_append(name: usize, name_len: usize, value: usize, value_len: usize) -> i32;
    fn request_uri(buf: usize, len: usize) -> i32;
    fn request_body_read(buf: usize, len: usize) -> i32;
    fn request_info(key: i32, buf: usize, len: usize) -> i32;
}

#[cfg(not(target_arch = "wasm32"))]
fn main() {
    eprintln!("bad_pointers is a Tern guest: build it for wasm32-wasip1");
}

#[cfg(target_arch = "wasm32")]
#[allow(unsafe_code)]
fn main() {
    let uri = tern_test_guests::target();
    let far = std::hint::black_box(0xFFFF_0000usize);
    // SAFETY: the host bounds-checks every pointer; these calls test exactly that.
    let r = unsafe {
        if uri.contains("case=header") {
            response_header_append(16, 4, far, 8)
        } else if uri.contains("case=uri") {
            request_uri(far, 1024)
        } else if uri.contains("case=info_unavailable") {
            request_info(tern_sdk::abi::info::TLS_SNI, far, 1024)
        } else if uri.contains("case=info") {
            request_info(tern_sdk::abi::info::URL, 16, far)
        } else if uri.contains("case=body_read") {
            request_body_read(1024, far)
        } else {
            response_body_write(far, 1 << 20)
        }
    };
    println!("host call returned {r} instead of trapping");
    tern_test_guests::reply("not trapped");
}
