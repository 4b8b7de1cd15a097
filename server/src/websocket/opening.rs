//! A client's opening of a WebSocket, told from other requests and checked, and the keys of
//! the handshake.

use http::header::{CONNECTION, SEC_WEBSOCKET_KEY, SEC_WEBSOCKET_VERSION, UPGRADE};
use http::{HeaderName, HeaderValue, Method, Request, StatusCode, Version};

/// The backend a guest's answer hands the client's WebSocket to (a response extension from
/// the guest's run to the front end; never sent).
#[derive(Debug, Clone)]
pub struct HandoffTo(pub HeaderValue);

/// A client's request to open a WebSocket, taken off the request before its guest sees it.
pub struct Opening {
    /// The client's `Sec-WebSocket-Key` (HTTP/1.1), or `None` over HTTP/2, which has none.
    pub key: Option<HeaderValue>,
    /// The connection (HTTP/1.1) or stream (HTTP/2) once the answer has switched it.
    pub upgrade: hyper::upgrade::OnUpgrade,
    /// The HTTP version it came over.
    pub version: Version,
}

/// Why an opening request is refused before any guest runs.
#[derive(Debug, PartialEq, Eq)]
pub struct BadOpening {
    /// Its status: `400`, or `426` for a WebSocket version other than 13 (answered `400` with
    /// `Sec-WebSocket-Version: 13`, RFC 6455 §4.4).
    pub status: StatusCode,
    /// What is wrong.
    pub why: &'static str,
}

/// Whether a request opens a WebSocket as every guest sees an opening: a `GET` over HTTP/1.1
/// or HTTP/2 with `Upgrade: websocket` and `Connection: Upgrade` (what [`opening`] lets
/// through, and makes of an HTTP/2 opening).
pub fn is_opening(method: &Method, version: Version, headers: &http::HeaderMap) -> bool {
    method == Method::GET
        && matches!(version, Version::HTTP_11 | Version::HTTP_2)
        && has_token(headers, &UPGRADE, "websocket")
        && has_token(headers, &CONNECTION, "upgrade")
}

/// Whether a header's comma-separated values hold `token` (case-insensitive).
fn has_token(headers: &http::HeaderMap, name: &HeaderName, token: &str) -> bool {
    headers.get_all(name).iter().any(|v| {
        v.to_str()
            .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
    })
}

/// Whether `req` opens a WebSocket: `None` when it does not; the opening, with the request
/// put in the one shape every guest sees (a `GET` with `Upgrade: websocket`, `Connection:
/// Upgrade`, version 13 and a key); or why it is refused. The connection's upgrade is taken
/// off the request here.
pub fn opening<B>(req: &mut Request<B>) -> Option<Result<Opening, BadOpening>> {
    let h2 = req.method() == Method::CONNECT
        && req
            .extensions()
            .get::<hyper::ext::Protocol>()
            .is_some_and(|p| p.as_str().eq_ignore_ascii_case("websocket"));
    let h1 = req.method() == Method::GET
        && req.version() == Version::HTTP_11
        && has_token(req.headers(), &UPGRADE, "websocket")
        && has_token(req.headers(), &CONNECTION, "upgrade");
    if !h1 && !h2 {
        return None;
    }
    let bad = |status, why| Some(Err(BadOpening { status, why }));
    if req
        .headers()
        .get(SEC_WEBSOCKET_VERSION)
        .map(HeaderValue::as_bytes)
        != Some(b"13")
    {
        return bad(
            StatusCode::UPGRADE_REQUIRED,
            "a WebSocket opening needs Sec-WebSocket-Version: 13",
        );
    }
    let key = if h1 {
        match req.headers().get(SEC_WEBSOCKET_KEY) {
            Some(k) if valid_key(k.as_bytes()) => Some(k.clone()),
            _ => {
                return bad(
                    StatusCode::BAD_REQUEST,
                    "a WebSocket opening needs a Sec-WebSocket-Key of 16 bytes in base64",
                );
            }
        }
    } else {
        None
    };
    let Some(upgrade) = req.extensions_mut().remove::<hyper::upgrade::OnUpgrade>() else {
        // (A request that came another way, HTTP/3 or a test's, has no connection to switch.)
        return bad(
            StatusCode::BAD_REQUEST,
            "WebSockets open over HTTP/1.1 or HTTP/2 (not HTTP/3)",
        );
    };
    let version = req.version();
    if h2 {
        // The guest sees what an HTTP/1.1 client would have sent.
        *req.method_mut() = Method::GET;
        let headers = req.headers_mut();
        headers.insert(UPGRADE, HeaderValue::from_static("websocket"));
        headers.insert(CONNECTION, HeaderValue::from_static("Upgrade"));
        headers.insert(SEC_WEBSOCKET_KEY, new_key());
    }
    Some(Ok(Opening {
        key,
        upgrade,
        version,
    }))
}

/// Whether `key` is 16 bytes in base64 (RFC 6455 §4.1).
fn valid_key(key: &[u8]) -> bool {
    use base64::Engine;
    key.len() == 24
        && base64::engine::general_purpose::STANDARD
            .decode(key)
            .is_ok_and(|k| k.len() == 16)
}

/// A new `Sec-WebSocket-Key`: 16 random bytes in base64.
pub(super) fn new_key() -> HeaderValue {
    use base64::Engine;
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&crate::random_u64().to_le_bytes());
    k[8..].copy_from_slice(&crate::random_u64().to_le_bytes());
    let text = base64::engine::general_purpose::STANDARD.encode(k);
    HeaderValue::from_str(&text).expect("base64 is a header value")
}

/// The `Sec-WebSocket-Accept` that answers `key` (RFC 6455 §4.2.2).
pub(super) fn accept_for(key: &[u8]) -> HeaderValue {
    use base64::Engine;
    const GUID: &[u8] = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
    let mut ctx = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA1_FOR_LEGACY_USE_ONLY);
    ctx.update(key);
    ctx.update(GUID);
    let text = base64::engine::general_purpose::STANDARD.encode(ctx.finish().as_ref());
    HeaderValue::from_str(&text).expect("base64 is a header value")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_accept_value_is_the_rfcs_example() {
        // RFC 6455 §1.3.
        assert_eq!(
            accept_for(b"dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
        assert!(valid_key(b"dGhlIHNhbXBsZSBub25jZQ=="));
        assert!(valid_key(new_key().as_bytes()));
        assert!(!valid_key(b"dGhlIHNhbXBsZSBub25jZQ="));
        assert!(!valid_key(b"dGhlIHNhbXBsZSBub25jZQ==x"));
    }

    #[test]
    fn an_opening_is_told_from_other_requests_and_checked() {
        let req = |method: Method, headers: &[(&str, &str)]| {
            let mut b = Request::builder().method(method).uri("/chat");
            for (n, v) in headers {
                b = b.header(*n, *v);
            }
            b.body(()).unwrap()
        };
        let ws = [
            ("upgrade", "WebSocket"),
            ("connection", "keep-alive, Upgrade"),
            ("sec-websocket-version", "13"),
            ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ];
        // Not an opening: no upgrade, another upgrade, a POST.
        assert!(opening(&mut req(Method::GET, &[])).is_none());
        assert!(
            opening(&mut req(
                Method::GET,
                &[("upgrade", "h2c"), ("connection", "upgrade")]
            ))
            .is_none()
        );
        assert!(opening(&mut req(Method::POST, &ws)).is_none());
        // A version other than 13, a bad key.
        let mut v8 = ws;
        v8[2].1 = "8";
        let e = opening(&mut req(Method::GET, &v8)).unwrap().err().unwrap();
        assert_eq!(e.status, StatusCode::UPGRADE_REQUIRED);
        let mut short = ws;
        short[3].1 = "c2hvcnQ=";
        let e = opening(&mut req(Method::GET, &short))
            .unwrap()
            .err()
            .unwrap();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        // A good one with no connection to switch (not from hyper): refused, not served.
        let e = opening(&mut req(Method::GET, &ws)).unwrap().err().unwrap();
        assert!(e.why.contains("HTTP/1.1 or HTTP/2"), "{e:?}");
    }
}
