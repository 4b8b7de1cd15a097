//! A `wasi:http` proxy component: `GET /` says hello; `POST /echo` streams the request body
//! back as it arrives (any size: nothing is held whole).
//!
//! Nothing here is Tern's: the same component runs under `wasmtime serve` and Spin.

use wasip2::http::types::{
    Fields, IncomingRequest, OutgoingBody, OutgoingResponse, ResponseOutparam,
};
use wasip2::io::streams::StreamError;

struct Handler;

wasip2::http::proxy::export!(Handler);

impl wasip2::exports::http::incoming_handler::Guest for Handler {
    fn handle(request: IncomingRequest, out: ResponseOutparam) {
        let path = request.path_with_query().unwrap_or_default();
        let echo = path.ends_with("/echo");
        let kind = if echo {
            "application/octet-stream"
        } else {
            "text/plain; charset=utf-8"
        };
        let headers = Fields::from_list(&[("content-type".into(), kind.as_bytes().to_vec())])
            .expect("a valid header");
        let response = OutgoingResponse::new(headers);
        let body = response.body().expect("the body is taken once");
        ResponseOutparam::set(out, Ok(response));
        let stream = body.write().expect("the stream is taken once");
        if echo {
            let incoming = request.consume().expect("the body is consumed once");
            let input = incoming.stream().expect("the stream is taken once");
            loop {
                match input.blocking_read(64 * 1024) {
                    Ok(chunk) => write_all(&stream, &chunk),
                    Err(StreamError::Closed) => break,
                    Err(StreamError::LastOperationFailed(e)) => {
                        panic!("reading the request body failed: {}", e.to_debug_string())
                    }
                }
            }
        } else {
            write_all(&stream, b"Hello from a wasi:http component on Tern!\n");
        }
        drop(stream);
        OutgoingBody::finish(body, None).expect("the body ends");
    }
}

/// Writes `bytes` in the pieces `blocking_write_and_flush` takes (at most 4096 bytes each).
fn write_all(stream: &wasip2::io::streams::OutputStream, bytes: &[u8]) {
    for piece in bytes.chunks(4096) {
        stream
            .blocking_write_and_flush(piece)
            .expect("the client is reading");
    }
}
