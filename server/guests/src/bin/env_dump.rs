//! Answers with every environment variable it can see, one `NAME=value` per line, and whether
//! it can open any file: a tenant sees only its own env and no files.
fn main() {
    let mut text = String::new();
    for (k, v) in std::env::vars() {
        text.push_str(&format!("{k}={v}\n"));
    }
    for path in ["/", ".", "/etc/passwd"] {
        if std::fs::read_dir(path).is_ok() || std::fs::read(path).is_ok() {
            text.push_str(&format!("can read {path}\n"));
        }
    }
    tern_test_guests::reply(&text);
}
