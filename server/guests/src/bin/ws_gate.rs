//! Lets a WebSocket through to a backend only with the right token: an opening with
//! `?token=good` is handed to the backend `to=` names (`echo` by default) with `x-user: alice`,
//! by a `tern-handoff` header, or with `via=abi` by `handoff_websocket` (whose error, if any,
//! is answered `500` with its code and message); one without gets `401` and no backend is
//! opened. What the guest saw of
//! the opening (`upgrade` and `sec-websocket-version`) is echoed in `x-saw` on the `401`.
use tern_test_guests::query_text;

fn main() {
    tern_sdk::serve(|req| {
        let saw = format!(
            "{} {} {}",
            req.method(),
            req.headers()
                .get("upgrade")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("-"),
            req.headers()
                .get("sec-websocket-version")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("-"),
        );
        if query_text("token").as_deref() != Some("good") {
            return tern_sdk::http::Response::builder()
                .status(401)
                .header("x-saw", saw)
                .body(b"no token\n".to_vec())
                .expect("a valid answer");
        }
        let to = query_text("to").unwrap_or_else(|| "echo".into());
        let builder = tern_sdk::http::Response::builder();
        let builder = if query_text("via").as_deref() == Some("abi") {
            if let Err(e) = tern_sdk::outbound::handoff_websocket(&to) {
                return builder
                    .status(500)
                    .body(format!("{} {e}", e.code).into_bytes())
                    .expect("a valid answer");
            }
            builder
        } else {
            builder.header("tern-handoff", to)
        };
        builder
            .header("x-user", "alice")
            .body(Vec::new())
            .expect("a valid answer")
    });
}
