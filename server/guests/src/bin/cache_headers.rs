//! Answers with the response headers its query names, for the cache's tests: each
//! `h=NAME:VALUE` (percent-encoded) is appended, `status=N` sets the status (default `200`),
//! `n=BYTES` pads the body to that many bytes, `wait_ms=N` computes for N ms first. The body starts with `run NANOS` (the wall
//! clock when this instance ran), so two runs never give the same body, then the method and
//! the request's `If-None-Match`, `If-Modified-Since` and `Authorization` as the guest saw
//! them.
//!
//! Like an origin that keeps validators, it answers `304` (with the same headers, no body)
//! when the request's `If-None-Match` is the `ETag` its query sets. The request header
//! `x-test-fail` makes it fail as a guest can without changing the URL: `trap` traps, a
//! status (`500`) answers with it. `trap_after=BYTES` streams that many bytes of body with its
//! head, then traps (a body cut mid-stream).
fn main() {
    tern_sdk::serve(|req| {
        let query = req.uri().query().unwrap_or("").to_string();
        let mut resp = tern_sdk::http::Response::builder().header("content-type", "text/plain");
        let mut status = 200;
        let mut size = 0usize;
        let mut trap_after = None;
        for pair in query.split('&') {
            if let Some(h) = pair.strip_prefix("h=") {
                let h = decode(h);
                if let Some((name, value)) = h.split_once(':') {
                    resp = resp.header(name.trim(), value.trim());
                }
            } else if let Some(s) = pair.strip_prefix("status=") {
                status = s.parse().unwrap_or(200);
            } else if let Some(n) = pair.strip_prefix("trap_after=") {
                trap_after = n.parse::<usize>().ok();
            } else if let Some(n) = pair.strip_prefix("n=") {
                size = n.parse().unwrap_or(0);
            } else if let Some(ms) = pair.strip_prefix("wait_ms=") {
                // Computes for that long first (a slow origin).
                let start = std::time::Instant::now();
                let mut x: u64 = 1;
                while start.elapsed().as_millis() < ms.parse().unwrap_or(0) {
                    x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                }
            }
        }
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let seen = |name: &str| {
            req.headers().get(name).map_or("-".to_string(), |v| {
                String::from_utf8_lossy(v.as_bytes()).into_owned()
            })
        };
        match req.headers().get("x-test-fail").map(|v| v.as_bytes()) {
            Some(b"trap") => panic!("asked to trap"),
            Some(code) => {
                let code = std::str::from_utf8(code).ok().and_then(|c| c.parse().ok());
                return tern_sdk::http::Response::builder()
                    .status(code.unwrap_or(500))
                    .body(b"failed as asked\n".to_vec())
                    .expect("valid answer");
            }
            None => {}
        }
        if let Some(n) = trap_after {
            use std::io::Write;
            let head = resp.body(()).expect("valid head").into_parts().0;
            let mut out = tern_sdk::ResponseWriter::start(&head).expect("head");
            // In pieces, computing 2 ms before each, so the head leaves while it runs.
            for piece in vec![b'x'; n].chunks(8192) {
                let start = std::time::Instant::now();
                let mut x: u64 = 1;
                while start.elapsed().as_micros() < 2_000 {
                    x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                }
                out.write_all(piece).expect("body");
            }
            panic!("trapped after {n} bytes of body");
        }
        let etag = resp
            .headers_ref()
            .and_then(|h| h.get("etag"))
            .map(|v| v.as_bytes().to_vec());
        if etag.is_some()
            && etag.as_deref() == req.headers().get("if-none-match").map(|v| v.as_bytes())
        {
            return resp.status(304).body(Vec::new()).expect("valid answer");
        }
        let mut body = format!(
            "run {nanos}\nmethod {}\nif-none-match {}\nif-modified-since {}\nauthorization {}\n",
            req.method(),
            seen("if-none-match"),
            seen("if-modified-since"),
            seen("authorization"),
        )
        .into_bytes();
        if body.len() < size {
            body.resize(size, b'.');
        }
        resp.status(status).body(body).expect("valid answer")
    });
}

/// `%XX` escapes decoded (and `+` as a space).
fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
