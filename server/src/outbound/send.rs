//! Sending: the outbound body (whole, streamed by the guest, or a component's) and the wait
//! for the response head.

use std::time::Duration;

use http::{Request, Response};

use super::body::OutBody;
use super::client::HttpClient;

/// Why [`send`] got no response head.
#[derive(Debug)]
pub enum HeadError {
    /// Connecting or sending failed (the connector's connect timeout included).
    Failed(hyper_util::client::legacy::Error),
    /// The request was sent but no head came within `first_byte_timeout_ms`.
    FirstByte,
}

/// Sends `req` with `client` and waits for the response head. The connect is bounded by the
/// connector (`connect_timeout_ms`); the head must come within `first_byte` of the request's
/// end reaching the connection, so a pooled connection gives up after `first_byte`, not
/// `connect + first_byte`, and a long streamed upload is not cut by it. (The guest's own
/// deadline and the backend's `total_timeout_ms` bound the whole exchange.)
///
/// # Errors
/// [`HeadError`].
pub async fn send(
    client: &HttpClient,
    req: Request<OutBody>,
    first_byte: Duration,
) -> Result<Response<hyper::body::Incoming>, HeadError> {
    let sent = req.body().sent();
    let mut response = std::pin::pin!(client.request(req));
    tokio::select! {
        biased;
        r = &mut response => return r.map_err(HeadError::Failed),
        () = sent.wait() => {}
    }
    match tokio::time::timeout(first_byte, response).await {
        Ok(r) => r.map_err(HeadError::Failed),
        Err(_) => Err(HeadError::FirstByte),
    }
}
