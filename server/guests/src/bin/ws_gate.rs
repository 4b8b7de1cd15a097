//! Lets a WebSocket through to a backend only with the right token: an opening with
//! `?token=good` is handed to the backend `to=` names (`echo` by default) with `x-user: alice`
//! and `tern-handoff`; one without gets `401` and no backend is opened. What the guest saw of
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
        tern_sdk::http::Response::builder()
            .header("tern-handoff", to)
            .header("x-user", "alice")
            .body(Vec::new())
            .expect("a valid answer")
    });
}
