//! "Hello from Tern!" as a `wasi:http/proxy` component, for `wasmtime serve`.

use wasip2::http::types::{
    Fields, IncomingRequest, OutgoingBody, OutgoingResponse, ResponseOutparam,
};

struct Hello;

wasip2::http::proxy::export!(Hello);

impl wasip2::exports::http::incoming_handler::Guest for Hello {
    fn handle(_request: IncomingRequest, out: ResponseOutparam) {
        let headers = Fields::from_list(&[("content-type".into(), b"text/plain".to_vec())])
            .expect("valid header");
        let response = OutgoingResponse::new(headers);
        let body = response.body().expect("body taken once");
        ResponseOutparam::set(out, Ok(response));
        let stream = body.write().expect("stream taken once");
        stream
            .blocking_write_and_flush(b"Hello from Tern!\n")
            .expect("write body");
        drop(stream);
        OutgoingBody::finish(body, None).expect("finish body");
    }
}
