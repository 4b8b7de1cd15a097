//! Answers with the value of the tenant's variable its query names (`?name=api_key`) through
//! `tern_sdk::config::get`: `200` and the value, `404` "none", or `500` and the error. It
//! reads its request's body first (a test holds the body back to have it read the variable
//! later).
fn main() {
    tern_sdk::serve(|req| {
        let query = req.uri().query().unwrap_or("");
        let name = query.strip_prefix("name=").unwrap_or(query).to_string();
        if let Err(e) = req.into_body().into_bytes() {
            let text = format!("the body: {e}");
            return tern_sdk::http::Response::builder()
                .status(400)
                .body(text.into_bytes())
                .expect("a valid answer");
        }
        let (status, text) = match tern_sdk::config::get(&name) {
            Ok(Some(value)) => (200, value),
            Ok(None) => (404, "none".to_string()),
            Err(e) => (500, e.to_string()),
        };
        tern_sdk::http::Response::builder()
            .status(status)
            .body(text.into_bytes())
            .expect("a valid answer")
    });
}
