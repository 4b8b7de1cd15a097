//! `json`: parses the request body as JSON and answers with a summary of it.
//!
//! `{"a":1}` becomes `{"kind":"object","keys":["a"],"echo":{"a":1},"bytes":7}`;
//! a body that is not JSON gets `400` with the parser's message.
//!
//! Build: `cargo build -p tern-sdk --example json --target wasm32-wasip1 --profile guest`

use serde_json::{Value, json};
use tern_sdk::Body;
use tern_sdk::http::{Request, Response, StatusCode};

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn transform(req: Request<Body>) -> Response<Vec<u8>> {
    let bytes = match req.into_body().into_bytes() {
        Ok(bytes) => bytes,
        Err(e) => return reply(StatusCode::BAD_REQUEST, json!({ "error": e.to_string() })),
    };
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(value) => {
            let keys: Vec<&String> = value
                .as_object()
                .map(|o| o.keys().collect())
                .unwrap_or_default();
            let summary = json!({
                "kind": kind(&value),
                "keys": keys,
                "echo": value,
                "bytes": bytes.len(),
            });
            reply(StatusCode::OK, summary)
        }
        Err(e) => reply(StatusCode::BAD_REQUEST, json!({ "error": e.to_string() })),
    }
}

fn reply(status: StatusCode, body: Value) -> Response<Vec<u8>> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&body).expect("a Value always serialises"))
        .expect("static head is valid")
}

fn main() {
    tern_sdk::serve(transform);
}
