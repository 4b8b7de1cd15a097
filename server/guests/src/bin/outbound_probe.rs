//! Sends the outbound requests its query describes and answers with what happened, one line
//! per request: `status=S bytes=N body=FIRST_BYTES` or `error=CODE MESSAGE`.
//!
//! Query: `backend=NAME&path=/p` (a named backend) or `url=http://...` (last: the rest of the
//! query is the URL); `times=N` sends N one after the other; `parallel=N` sends N, then reads
//! them all; `method=POST&size=N` sends a body of N bytes; `stream=N` streams a body of N
//! bytes after sending the head (`&trap=1`: then traps instead of finishing it).
//! `forward=1` forwards instead: the client's headers and body go to the backend and the
//! backend's answer is the answer (`&read=1`: reads a byte of the client's body first, which
//! forbids it; `&bad_write=1`: then tries to write a body, and reports the code in the header
//! `x-write-after-forward`). `cache=VALUE` sends `Tern-Cache: VALUE` (`cache=pass`,
//! `cache=ttl=60,tag=t`). `headers=N` adds N headers `hI: v` (I from 0).
use tern_sdk::http::Method;
use tern_sdk::outbound::{Outgoing, Pending};

fn param<'a>(query: &'a str, name: &str) -> Option<&'a str> {
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
}

fn main() {
    let target = tern_test_guests::target();
    let query = target.split_once('?').map_or("", |(_, q)| q);
    let url = query.split_once("url=").map(|(_, u)| u.to_string());
    let query = query.split("url=").next().unwrap_or("");
    let backend = param(query, "backend").unwrap_or("").to_string();
    let path = param(query, "path").unwrap_or("/").to_string();
    let times: usize = param(query, "times")
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    let parallel: usize = param(query, "parallel")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let method = Method::from_bytes(param(query, "method").unwrap_or("GET").as_bytes())
        .unwrap_or(Method::GET);
    let size: usize = param(query, "size")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let stream: usize = param(query, "stream")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let trap = param(query, "trap").is_some();
    let cache = param(query, "cache");
    let headers: usize = param(query, "headers")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    if param(query, "forward").is_some() {
        forward(
            &method,
            &backend,
            &path,
            param(query, "read").is_some(),
            param(query, "bad_write").is_some(),
        );
        return;
    }

    let start = || -> Result<Pending, tern_sdk::FetchError> {
        let mut out = match &url {
            Some(u) => Outgoing::to_url(&method, u)?,
            None => Outgoing::to_backend(&method, &backend, &path)?,
        };
        for i in 0..headers {
            out.header(&format!("h{i}"), b"v")?;
        }
        if let Some(cache) = cache {
            out.header(tern_sdk::outbound::CACHE_HEADER, cache.as_bytes())?;
        }
        if size > 0 {
            out.write_body(&vec![b'b'; size])?;
        }
        if stream == 0 {
            return out.send();
        }
        let mut body = out.send_streaming()?;
        for _ in 0..stream / 1000 {
            std::io::Write::write_all(&mut body, &[b's'; 1000]).map_err(|e| {
                // The SDK's writer carries the host's error inside the io::Error.
                e.get_ref()
                    .and_then(|inner| inner.downcast_ref::<tern_sdk::FetchError>())
                    .cloned()
                    .unwrap_or(tern_sdk::FetchError {
                        code: tern_sdk::abi::errno::IO,
                        message: e.to_string(),
                    })
            })?;
        }
        if trap {
            panic!("trapping with the request body half sent");
        }
        body.finish()
    };
    let finish = |sent: Result<Pending, tern_sdk::FetchError>| -> String {
        let result = sent.and_then(Pending::response).and_then(|r| {
            let status = r.status.as_u16();
            r.into_bytes().map(|b| (status, b))
        });
        match result {
            Ok((status, body)) => {
                let shown = String::from_utf8_lossy(&body[..body.len().min(2000)]).into_owned();
                format!("status={status} bytes={} body={shown}\n", body.len())
            }
            Err(e) => format!("error={} {}\n", e.code, e.message),
        }
    };
    let mut text = String::new();
    if parallel > 0 {
        let sent: Vec<_> = (0..parallel).map(|_| start()).collect();
        for s in sent {
            text.push_str(&finish(s));
        }
    } else {
        for _ in 0..times {
            text.push_str(&finish(start()));
        }
    }
    tern_test_guests::reply(&text);
}

/// Forwards the client's request to `backend` at `path` and the backend's answer to the
/// client; on failure answers `error=CODE MESSAGE`.
fn forward(method: &Method, backend: &str, path: &str, read_first: bool, bad_write: bool) {
    if read_first {
        let _ = tern_sdk::raw::body_read(&mut [0u8; 1]);
    }
    let forwarded = (|| -> Result<(), tern_sdk::FetchError> {
        let mut out = Outgoing::to_backend(method, backend, path)?;
        out.forward_request()?;
        out.send()?.forward_response()?;
        Ok(())
    })();
    match forwarded {
        Ok(()) if bad_write => {
            let code = tern_sdk::raw::body_write(b"more").err().map_or(0, |e| e.0);
            let _ =
                tern_sdk::raw::header_append(b"x-write-after-forward", code.to_string().as_bytes());
        }
        Ok(()) => {}
        Err(e) => tern_test_guests::reply(&format!("error={} {}\n", e.code, e.message)),
    }
}
