//! Writes far more body than the tenant allows: the head and the first chunks stream, then the
//! host refuses (`LIMIT_EXCEEDED`), the guest exits 1, and the stream is aborted, so the client
//! sees an incomplete response. `?headers` floods headers instead: `500` before anything is sent.
use std::io::Write;

fn main() {
    if tern_test_guests::target().contains("headers") {
        for i in 0..10_000 {
            if tern_sdk::raw::header_append(format!("x-flood-{i}").as_bytes(), b"1").is_err() {
                std::process::exit(1);
            }
        }
        tern_test_guests::reply("all headers accepted");
        return;
    }
    let head = tern_sdk::http::Response::new(()).into_parts().0;
    let mut out = tern_sdk::ResponseWriter::start(&head).expect("head");
    let chunk = vec![b'x'; 64 * 1024];
    loop {
        if out.write_all(&chunk).is_err() {
            std::process::exit(1);
        }
    }
}
