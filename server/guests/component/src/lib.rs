//! A `wasi:http` component with one behaviour per path (its last segment), for the e2e tests:
//!
//! - `/hello`: `200` "Hello from a component!" with `x-kind: wasi-http`.
//! - `/handoff`: hands the client's WebSocket to the tenant's backend `echo` (`tern-handoff:
//!   echo`) with `x-user: component`.
//! - `/info`: the method, path and query, the `x-test` and `spin-path-info` headers, the
//!   body's length and the scheme.
//! - `/big?n=N`: `200` with a body of N bytes (`x`), written in 4 KiB pieces (streams past 64 KiB).
//! - `/echo`: the request body back, as it streams in.
//! - `/trap-mid`: 100 KiB of body, then a panic (a trap): the client sees a cut body.
//! - `/panic`: a panic before any response: `500`.
//! - `/loop`: loops forever: `504`.
//! - `/bomb`: grows memory until the tenant's limit: `500` (memory limit).
//! - `/none`: returns without setting a response: `502`.
//! - `/unfinished?n=N`: what StarlingMonkey (componentize-js) does when the JavaScript
//!   throws: sets a `500` response, writes N bytes of body and returns without finishing or
//!   dropping the body.
//! - `/forgotten`: returns without setting or dropping its response-outparam.
//! - `/status?code=N`: an empty response with status N.
//! - `/fetch?url=U`: sends `GET U` with `wasi:http/outgoing-handler` and answers with its
//!   status, `Cache-Status` and body, or `502` with the error code if the request fails
//!   (`/fetch?cache=V&url=U`: with the header `Tern-Cache: V`).
//! - `/keep`: grows its memory by 24 pages (1.5 MiB), counts the bytes 0xA5 in them, fills
//!   the middle 512 KiB of them with 0xA5 and reads the whole request body before it answers
//!   with the count (4 bytes, little endian): a client that holds the body back holds the
//!   secret in a live guest.
//! - `/seek`: grows its memory by 24 pages and answers how many bytes 0xA5 they hold.
//! - `/cached`: `cache-control: max-age=60`, `etag: "w1"`, `surrogate-key: component` and a
//!   body naming the instant it ran; `304` when `if-none-match` is `"w1"`.
//! - `/upload?url=U&n=N[&trap=1]`: sends `POST U` and streams N bytes of body after the
//!   request is on its way, then finishes the body and answers with the backend's status and
//!   body length; with `trap=1` it panics after writing the bytes, before finishing the body.
//! - `/cache?key=K[&value=V][&tag=T][&trap=1]`: a `tern:cache` transactional lookup of K with
//!   the request's headers; on its turn to insert it inserts V (else `made by component`) for
//!   60 s, tagged T, varying on `accept-language` (with `trap=1` it panics instead), and
//!   answers `found=0|1 must=0|1 body=B` as it found the entry; `/cache?purge=T` purges the
//!   tag T and answers `purged=N`.
//! - `/rate?entry=E[&counter=C][&window=W][&limit=L]`: `tern:rate-limit` check-rate of E in C
//!   (`rc`) by 1 over W s (10) at L per second (1), boxed in `pb` for 60 s; answers
//!   `blocked=0|1 count=N` (its count over 10 s), or `error: ...`.
//! - `/env`: its environment, one `NAME=value` per line.
//! - `/config?name=N`: the value of N read through `wasi:config/store@0.2.0-draft`: `200` and
//!   the value, `404` "none", or `500` and the error; `/config` alone: every name (`get-all`).
//!
//! It also exports Spin's `handle-cron-event` (`server/wit/spin-cron`): it prints `cron-event
//! TIMESTAMP` to stdout and returns `Ok`, or, when its environment has `CRON_FAIL`, the error
//! `other("CRON_FAIL is set")`.

use wasip2::http::outgoing_handler;
use wasip2::http::types::{
    Fields, IncomingRequest, OutgoingBody, OutgoingRequest, OutgoingResponse, ResponseOutparam,
    Scheme,
};
use wasip2::io::streams::{OutputStream, StreamError};

mod config {
    wit_bindgen::generate!({
        inline: "package tern:test-component;
                 world config { import wasi:config/store@0.2.0-draft; }",
        path: "../../wit/variables/deps/config-draft",
        generate_all,
    });
}

mod cache {
    wit_bindgen::generate!({
        path: "../../wit/cache",
        world: "tern:cache/host",
        generate_all,
    });
}

mod rate {
    wit_bindgen::generate!({
        path: "../../wit/rate-limit",
        world: "tern:rate-limit/host",
        generate_all,
    });
}

mod cron {
    wit_bindgen::generate!({
        path: "../../wit/spin-cron",
        world: "fermyon:spin-cron/spin-cron",
    });
}

struct Component;

wasip2::http::proxy::export!(Component);
cron::export!(Component with_types_in cron);

impl cron::Guest for Component {
    fn handle_cron_event(metadata: cron::Metadata) -> Result<(), cron::Error> {
        println!("cron-event {}", metadata.timestamp);
        if std::env::var_os("CRON_FAIL").is_some() {
            return Err(cron::Error::Other("CRON_FAIL is set".into()));
        }
        Ok(())
    }
}

fn query(path: &str, key: &str) -> Option<String> {
    let (_, q) = path.split_once('?')?;
    q.split('&')
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=').map(str::to_string))
}

fn respond(out: ResponseOutparam, status: u16, headers: &[(&str, &str)], body: &[u8]) {
    let fields = Fields::new();
    for (k, v) in headers {
        fields
            .append(&k.to_string(), &v.as_bytes().to_vec())
            .expect("a valid header");
    }
    let response = OutgoingResponse::new(fields);
    response.set_status_code(status).expect("a valid status");
    let out_body = response.body().expect("the body is taken once");
    ResponseOutparam::set(out, Ok(response));
    let stream = out_body.write().expect("the stream is taken once");
    write_all(&stream, body);
    drop(stream);
    OutgoingBody::finish(out_body, None).expect("the body ends");
}

fn write_all(stream: &OutputStream, bytes: &[u8]) {
    for piece in bytes.chunks(4096) {
        stream
            .blocking_write_and_flush(piece)
            .expect("the client reads");
    }
}

fn read_all(request: IncomingRequest) -> Vec<u8> {
    let body = request.consume().expect("the body is consumed once");
    let input = body.stream().expect("the stream is taken once");
    let mut all = Vec::new();
    loop {
        match input.blocking_read(64 * 1024) {
            Ok(chunk) => all.extend_from_slice(&chunk),
            Err(StreamError::Closed) => break,
            Err(StreamError::LastOperationFailed(e)) => panic!("body: {}", e.to_debug_string()),
        }
    }
    all
}

impl wasip2::exports::http::incoming_handler::Guest for Component {
    fn handle(request: IncomingRequest, out: ResponseOutparam) {
        let path = request.path_with_query().unwrap_or_default();
        // The component sees the whole path (its tenant may be mounted under a prefix): the
        // behaviour is named by the last segment.
        let route = path.split('?').next().unwrap_or_default();
        let route = format!("/{}", route.rsplit('/').next().unwrap_or_default());
        match route.as_str() {
            "/hello" => respond(
                out,
                200,
                &[("x-kind", "wasi-http")],
                b"Hello from a component!\n",
            ),
            "/info" => {
                let method = format!("{:?}", request.method());
                let header = |name: &str| {
                    request
                        .headers()
                        .get(&name.to_string())
                        .first()
                        .map(|v| String::from_utf8_lossy(v).into_owned())
                        .unwrap_or_default()
                };
                let (test, info) = (header("x-test"), header("spin-path-info"));
                // The trace context the server gives its guest, when it traces.
                let traceparent = match header("traceparent") {
                    t if t.is_empty() => t,
                    t => format!(" traceparent={t}"),
                };
                let scheme = match request.scheme() {
                    Some(Scheme::Http) => "http",
                    Some(Scheme::Https) => "https",
                    Some(Scheme::Other(_)) => "other",
                    None => "none",
                };
                let body = read_all(request);
                let text = format!(
                    "method={method} path={path} x-test={test} spin-path-info={info} body={} \
                     scheme={scheme}{traceparent}\n",
                    body.len()
                );
                respond(out, 200, &[("content-type", "text/plain")], text.as_bytes());
            }
            "/cached" => {
                let headers = [
                    ("cache-control", "max-age=60"),
                    ("etag", "\"w1\""),
                    ("surrogate-key", "component"),
                ];
                let matched = request
                    .headers()
                    .get(&"if-none-match".to_string())
                    .first()
                    .is_some_and(|v| v.as_slice() == b"\"w1\"");
                if matched {
                    respond(out, 304, &headers, b"");
                } else {
                    let nanos = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_nanos());
                    respond(out, 200, &headers, format!("run {nanos}\n").as_bytes());
                }
            }
            "/big" => {
                let n: usize = query(&path, "n").and_then(|n| n.parse().ok()).unwrap_or(0);
                let body = vec![b'x'; n];
                match query(&path, "type") {
                    Some(kind) => respond(out, 200, &[("content-type", kind.as_str())], &body),
                    None => respond(out, 200, &[], &body),
                }
            }
            "/echo" => {
                let response = OutgoingResponse::new(Fields::new());
                let out_body = response.body().expect("the body is taken once");
                ResponseOutparam::set(out, Ok(response));
                let stream = out_body.write().expect("the stream is taken once");
                let body = request.consume().expect("the body is consumed once");
                let input = body.stream().expect("the stream is taken once");
                loop {
                    match input.blocking_read(64 * 1024) {
                        Ok(chunk) => write_all(&stream, &chunk),
                        Err(StreamError::Closed) => break,
                        Err(StreamError::LastOperationFailed(e)) => {
                            panic!("body: {}", e.to_debug_string())
                        }
                    }
                }
                drop(stream);
                OutgoingBody::finish(out_body, None).expect("the body ends");
            }
            "/trap-mid" => {
                let response = OutgoingResponse::new(Fields::new());
                let out_body = response.body().expect("the body is taken once");
                ResponseOutparam::set(out, Ok(response));
                let stream = out_body.write().expect("the stream is taken once");
                write_all(&stream, &vec![b'x'; 100 * 1024]);
                panic!("trapping after 100 KiB of body");
            }
            "/unfinished" => {
                let n: usize = query(&path, "n").and_then(|n| n.parse().ok()).unwrap_or(0);
                let response = OutgoingResponse::new(Fields::new());
                response.set_status_code(500).expect("a valid status");
                let out_body = response.body().expect("the body is taken once");
                ResponseOutparam::set(out, Ok(response));
                let stream = out_body.write().expect("the stream is taken once");
                write_all(&stream, &vec![b'x'; n]);
                // Neither finished nor dropped: the handles stay in the host's table.
                std::mem::forget(stream);
                std::mem::forget(out_body);
            }
            "/forgotten" => std::mem::forget(out),
            "/keep" => {
                let fresh = grown_pages(24);
                let count = fresh.iter().filter(|&&b| b == SECRET).count() as u32;
                fresh[512 * 1024..1024 * 1024].fill(SECRET);
                read_all(request);
                respond(out, 200, &[], &count.to_le_bytes());
            }
            "/scatter" => {
                // Dirties one byte in every other page of 1 MiB (128 separate regions), after
                // counting the secret bytes a previous request may have left there.
                let fresh = grown_pages(24);
                let count = fresh.iter().filter(|&&b| b == SECRET).count() as u32;
                for page in fresh[512 * 1024..1536 * 1024].chunks_mut(8192) {
                    page[0] = SECRET;
                }
                read_all(request);
                respond(out, 200, &[], &count.to_le_bytes());
            }
            "/seek" => {
                let fresh = grown_pages(24);
                let count = fresh.iter().filter(|&&b| b == SECRET).count() as u32;
                respond(out, 200, &[], &count.to_le_bytes());
            }
            "/panic" => panic!("a panic before any response"),
            "/loop" => {
                let mut n = 0u64;
                loop {
                    n = std::hint::black_box(n.wrapping_add(1));
                }
            }
            "/bomb" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(vec![1u8; 1 << 20]);
                    std::hint::black_box(&hoard);
                }
            }
            "/none" => drop(out),
            "/env" => {
                let text: String = std::env::vars().map(|(k, v)| format!("{k}={v}\n")).collect();
                respond(out, 200, &[], text.as_bytes());
            }
            "/config" => {
                use config::wasi::config::store;
                let (status, text) = match query(&path, "name") {
                    None => match store::get_all() {
                        Ok(all) => {
                            let names: Vec<String> = all.into_iter().map(|(k, _)| k).collect();
                            (200, names.join(","))
                        }
                        Err(e) => (500, format!("{e:?}")),
                    },
                    Some(name) => match store::get(&name) {
                        Ok(Some(value)) => (200, value),
                        Ok(None) => (404, "none".to_string()),
                        Err(e) => (500, format!("{e:?}")),
                    },
                };
                respond(out, status, &[], text.as_bytes());
            }
            "/cache" => {
                let text = match use_cache(&request, &path) {
                    Ok(text) => text,
                    Err(e) => format!("error: {e:?}"),
                };
                respond(out, 200, &[], text.as_bytes());
            }
            "/rate" => {
                use rate::tern::rate_limit::rate_limit as rl;
                let entry = query(&path, "entry").unwrap_or_else(|| "e".into());
                let counter = query(&path, "counter").unwrap_or_else(|| "rc".into());
                let number = |k: &str, d: u32| query(&path, k).and_then(|v| v.parse().ok()).unwrap_or(d);
                let blocked = rl::check_rate(
                    &counter,
                    &entry,
                    1,
                    number("window", 10),
                    number("limit", 1),
                    "pb",
                    60,
                );
                let text = match blocked.and_then(|b| Ok((b, rl::lookup_count(&counter, &entry, 10)?))) {
                    Ok((b, n)) => format!("blocked={} count={n}", u8::from(b)),
                    Err(e) => format!("error: {e:?}"),
                };
                respond(out, 200, &[], text.as_bytes());
            }
            "/handoff" => respond(
                out,
                200,
                &[("tern-handoff", "echo"), ("x-user", "component")],
                b"",
            ),
            "/status" => {
                let code = query(&path, "code")
                    .and_then(|c| c.parse().ok())
                    .unwrap_or(200);
                respond(out, code, &[], b"");
            }
            "/fetch" => {
                let url = query(&path, "url").unwrap_or_default();
                let cache = query(&path, "cache");
                match fetch(&url, cache.as_deref()) {
                    Ok((status, cache_status, body)) => {
                        let shown = if cache_status.is_empty() {
                            String::new()
                        } else {
                            format!(" ({cache_status})")
                        };
                        let text = format!(
                            "backend said {status}{shown}: {}",
                            String::from_utf8_lossy(&body)
                        );
                        respond(out, 200, &[], text.as_bytes());
                    }
                    Err(e) => respond(out, 502, &[], format!("fetch failed: {e}\n").as_bytes()),
                }
            }
            "/upload" => {
                let url = query(&path, "url").unwrap_or_default();
                let n = query(&path, "n").and_then(|n| n.parse().ok()).unwrap_or(0);
                let trap = query(&path, "trap").is_some();
                match upload(&url, n, trap) {
                    Ok((status, body)) => {
                        let text = format!("backend said {status}: {} bytes", body.len());
                        respond(out, 200, &[], text.as_bytes());
                    }
                    Err(e) => respond(out, 502, &[], format!("upload failed: {e}\n").as_bytes()),
                }
            }
            _ => respond(out, 404, &[], b"no such test path\n"),
        }
    }
}

/// The byte `/keep` leaves in memory and `/seek` looks for.
const SECRET: u8 = 0xA5;

/// `n` new pages of linear memory, as the slot gives them (the allocator never hands them out).
fn grown_pages(n: usize) -> &'static mut [u8] {
    let first = core::arch::wasm32::memory_grow(0, n);
    assert_ne!(first, usize::MAX, "memory.grow refused");
    // SAFETY: the pages were just added to the memory and nothing else refers to them.
    unsafe { std::slice::from_raw_parts_mut((first * 65536) as *mut u8, n * 65536) }
}

/// A request to `url` (`http://host[:port]/path`).
fn request_to(url: &str) -> Result<OutgoingRequest, String> {
    request_with(url, Fields::new())
}

/// A request to `url` with `headers`.
fn request_with(url: &str, headers: Fields) -> Result<OutgoingRequest, String> {
    let rest = url.strip_prefix("http://").ok_or("only http:// URLs")?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let req = OutgoingRequest::new(headers);
    req.set_scheme(Some(&Scheme::Http)).map_err(|()| "scheme")?;
    req.set_authority(Some(authority))
        .map_err(|()| "authority")?;
    req.set_path_with_query(Some(path)).map_err(|()| "path")?;
    Ok(req)
}

/// `GET url` (with `Tern-Cache: cache`), its status, `Cache-Status` and body.
fn fetch(url: &str, cache: Option<&str>) -> Result<(u16, String, Vec<u8>), String> {
    let headers = Fields::new();
    if let Some(cache) = cache {
        headers
            .append(&"tern-cache".to_string(), &cache.as_bytes().to_vec())
            .map_err(|e| format!("{e:?}"))?;
    }
    let req = request_with(url, headers)?;
    let future = outgoing_handler::handle(req, None).map_err(|e| format!("{e:?}"))?;
    let (status, headers, body) = response_with_headers(future)?;
    let cache_status = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("cache-status"))
        .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
        .unwrap_or_default();
    Ok((status, cache_status, body))
}

/// `POST url` with `n` bytes streamed after the request is sent; with `trap`, a panic before
/// the body is finished.
fn upload(url: &str, n: usize, trap: bool) -> Result<(u16, Vec<u8>), String> {
    let req = request_to(url)?;
    req.set_method(&wasip2::http::types::Method::Post)
        .map_err(|()| "method")?;
    let body = req.body().map_err(|()| "body")?;
    let future = outgoing_handler::handle(req, None).map_err(|e| format!("{e:?}"))?;
    let stream = body.write().map_err(|()| "stream")?;
    for piece in vec![b'u'; n].chunks(4096) {
        stream
            .blocking_write_and_flush(piece)
            .map_err(|e| format!("write: {e:?}"))?;
    }
    if trap {
        panic!("trapping before finishing the outgoing body");
    }
    drop(stream);
    OutgoingBody::finish(body, None).map_err(|e| format!("finish: {e:?}"))?;
    response_of(future)
}

/// The status and body of an outgoing request's response.
fn response_of(
    future: wasip2::http::types::FutureIncomingResponse,
) -> Result<(u16, Vec<u8>), String> {
    response_with_headers(future).map(|(status, _, body)| (status, body))
}

/// The response's status, headers and whole body.
#[allow(clippy::type_complexity)]
fn response_with_headers(
    future: wasip2::http::types::FutureIncomingResponse,
) -> Result<(u16, Vec<(String, Vec<u8>)>, Vec<u8>), String> {
    future.subscribe().block();
    let resp = future
        .get()
        .ok_or("no response")?
        .map_err(|()| "taken twice")?
        .map_err(|e| format!("{e:?}"))?;
    let status = resp.status();
    let headers = resp.headers().entries();
    let body = resp.consume().map_err(|()| "body")?;
    let input = body.stream().map_err(|()| "stream")?;
    let mut all = Vec::new();
    loop {
        match input.blocking_read(64 * 1024) {
            Ok(chunk) => all.extend_from_slice(&chunk),
            Err(StreamError::Closed) => break,
            Err(StreamError::LastOperationFailed(e)) => return Err(e.to_debug_string()),
        }
    }
    Ok((status, headers, all))
}

/// `/cache`: see the module docs.
fn use_cache(
    request: &IncomingRequest,
    path: &str,
) -> Result<String, cache::tern::cache::cache::Error> {
    use cache::tern::cache::cache::{self as api, Entry, LookupOptions, LookupState, WriteOptions};
    if let Some(tag) = query(path, "purge") {
        return Ok(format!("purged={}", api::purge_surrogate_key(&tag, false)?));
    }
    let key = query(path, "key").unwrap_or_default();
    let options = LookupOptions {
        request_headers: request.headers().entries(),
    };
    let entry = Entry::transaction_lookup(key.as_bytes(), &options)?;
    let state = entry.get_state();
    let must = state.contains(LookupState::MUST_INSERT_OR_UPDATE);
    if must {
        assert!(query(path, "trap").is_none(), "trapped with the turn to insert");
        let value = query(path, "value").unwrap_or_else(|| "made by component".into());
        let write = WriteOptions {
            max_age_seconds: 60,
            stale_while_revalidate_seconds: 0,
            surrogate_keys: query(path, "tag").into_iter().collect(),
            vary_rule: vec!["accept-language".into()],
        };
        entry.transaction_insert(value.as_bytes(), &write)?;
    }
    let body = entry.get_body().unwrap_or_default();
    Ok(format!(
        "found={} must={} body={}",
        u8::from(state.contains(LookupState::FOUND)),
        u8::from(must),
        String::from_utf8_lossy(&body)
    ))
}
