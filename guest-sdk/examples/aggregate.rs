//! `aggregate`: asks two backends at once and answers with one JSON object.
//!
//! Both requests are sent before either response is read, so the answer takes as long as the
//! slower backend, not the sum. Each part is the backend's JSON, or an object saying what
//! went wrong with it; the response is `200` if both answered `2xx`, else `502`.
//!
//! ```toml
//! [[tenant]]
//! name = "dashboard"
//! module = "builtin:aggregate"
//! [tenant.outbound.backends.users]
//! url = "http://10.0.0.5:8080"
//! [tenant.outbound.backends.orders]
//! url = "http://10.0.0.6:8080"
//! ```
//!
//! Build: `cargo build -p tern-sdk --example aggregate --target wasm32-wasip1 --profile guest`

use serde_json::{Value, json};
use tern_sdk::http::{Method, Response};
use tern_sdk::outbound::{Outgoing, Pending};

fn main() {
    let users = Outgoing::to_backend(&Method::GET, "users", "/users").and_then(Outgoing::send);
    let orders = Outgoing::to_backend(&Method::GET, "orders", "/orders").and_then(Outgoing::send);
    let (users, users_ok) = part(users);
    let (orders, orders_ok) = part(orders);
    let body = json!({ "users": users, "orders": orders }).to_string();
    let resp = Response::builder()
        .status(if users_ok && orders_ok { 200 } else { 502 })
        .header("content-type", "application/json")
        .body(body.into_bytes())
        .expect("static head is valid");
    tern_sdk::respond(resp).expect("response accepted");
}

/// One backend's answer as JSON, and whether it was a `2xx` with a JSON body.
fn part(sent: Result<Pending, tern_sdk::FetchError>) -> (Value, bool) {
    let resp = match sent.and_then(Pending::response) {
        Ok(resp) => resp,
        Err(e) => return (json!({ "error": e.to_string() }), false),
    };
    let status = resp.status;
    match resp.into_bytes() {
        Ok(body) => match serde_json::from_slice::<Value>(&body) {
            Ok(v) if status.is_success() => (v, true),
            Ok(v) => (json!({ "status": status.as_u16(), "body": v }), false),
            Err(_) => (
                json!({ "status": status.as_u16(), "error": "the body is not JSON" }),
                false,
            ),
        },
        Err(e) => (
            json!({ "status": status.as_u16(), "error": e.to_string() }),
            false,
        ),
    }
}
