//! Responds, then calls `proc_exit` with the code in `?code=N`: `0` keeps the response (`200`),
//! anything else is `500`.
fn main() {
    let code: i32 = tern_test_guests::query_number("code", 0);
    tern_test_guests::reply("responded before exiting");
    std::process::exit(code);
}
