//! The request a guest reads, whatever its kind: method, target, headers, its context, and
//! its body, read on demand within the tenant's limit (by the guest, or by the server as a
//! [`ClientBody`] when a component reads it or a guest forwards it to a backend; the body
//! types live in [`crate::body`], which `outbound` uses too).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Uri};

pub use crate::body::RequestBody;
use crate::body::{BodyFlags, ClientBody};
use crate::context::RequestContext;

/// Why the next bytes of the body cannot be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyError {
    /// The body went past the tenant's limit (the client gets `413`).
    TooLarge,
    /// The client's body failed: bad framing, cut off (the client gets `400`).
    Failed,
}

/// The request as the guest sees it.
#[derive(Debug)]
pub struct GuestRequest {
    /// Request method.
    pub method: Method,
    /// Request target; the guest sees its path and query.
    pub uri: Uri,
    /// Request headers.
    pub headers: HeaderMap,
    /// The body, read on demand.
    pub body: RequestBody,
    /// Bytes of the current body frame the guest has not read yet.
    leftover: Bytes,
    /// Largest body the tenant accepts.
    pub max_bytes: u64,
    /// Body bytes received so far.
    received: u64,
    /// Set when the body went past `max_bytes`: the client gets `413`.
    pub too_large: bool,
    /// Why the client's body could not be read (bad framing, cut off): the client gets `400`.
    pub body_error: Option<String>,
    /// The client, the request id, the route prefix and the HTTP version.
    pub context: RequestContext,
    /// What the body did once the server took it to stream (`take_body`).
    taken: Option<Arc<BodyFlags>>,
}

impl GuestRequest {
    /// A request for a guest whose body may be at most `max_bytes` long.
    pub fn new(
        method: Method,
        uri: Uri,
        headers: HeaderMap,
        body: RequestBody,
        max_bytes: u64,
        context: RequestContext,
    ) -> Self {
        Self {
            method,
            uri,
            headers,
            body,
            context,
            leftover: Bytes::new(),
            max_bytes,
            received: 0,
            too_large: false,
            body_error: None,
            taken: None,
        }
    }

    /// The body, for the server to stream elsewhere (a guest forwards it to a backend), counted
    /// against the same limit; what it then runs into still decides the answer
    /// ([`Self::body_end`]).
    ///
    /// # Errors
    /// Why it cannot be taken: the guest read some of it, or it was taken before.
    pub fn take_body(&mut self) -> Result<ClientBody, &'static str> {
        if self.taken.is_some() {
            return Err("the request body was forwarded already");
        }
        if self.received > 0
            || !self.leftover.is_empty()
            || self.too_large
            || self.body_error.is_some()
        {
            return Err("the guest has read from the request body");
        }
        let flags = Arc::new(BodyFlags::default());
        self.taken = Some(flags.clone());
        let body = std::mem::replace(&mut self.body, RequestBody::Empty);
        Ok(ClientBody::new(body, self.max_bytes, flags))
    }

    /// Whether the body went past the tenant's limit, and why it failed if it did, as the guest
    /// read it or as the server streamed it on.
    pub fn body_end(&self) -> (bool, Option<String>) {
        match &self.taken {
            None => (self.too_large, self.body_error.clone()),
            Some(flags) => (
                flags.too_large.load(Ordering::Relaxed),
                flags
                    .failed
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone(),
            ),
        }
    }

    /// The next bytes of the body; empty at its end.
    ///
    /// # Errors
    /// [`BodyError::TooLarge`] past the tenant's body limit (counted as the body streams in,
    /// never buffered whole), [`BodyError::Failed`] if the client's body fails mid-stream.
    pub async fn next_chunk(&mut self) -> Result<Bytes, BodyError> {
        if !self.leftover.is_empty() {
            return Ok(std::mem::take(&mut self.leftover));
        }
        if self.too_large {
            return Err(BodyError::TooLarge);
        }
        if self.body_error.is_some() {
            return Err(BodyError::Failed);
        }
        let chunk = self.next_frame().await.map_err(|e| {
            tracing::debug!("request body failed: {e}");
            self.body_error = Some(e.to_string());
            BodyError::Failed
        })?;
        self.received += chunk.len() as u64;
        if self.received > self.max_bytes {
            self.too_large = true;
            return Err(BodyError::TooLarge);
        }
        Ok(chunk)
    }

    /// Whether a body is coming whose length the client did not declare (HTTP/1.1 chunked,
    /// or HTTP/2 without `content-length`).
    pub fn length_unknown(&self) -> bool {
        crate::body::declared_length(&self.headers).is_none()
            && !http_body::Body::is_end_stream(&self.body)
    }

    /// Reads the whole body into memory, within the tenant's limit, and presents it with its
    /// length: `Content-Length` replaces `Transfer-Encoding`. CGI programs need this: RFC 3875
    /// gives them the body with its length (`CONTENT_LENGTH`), and programs that follow it
    /// read nothing without one. A body over the limit or broken is not kept:
    /// [`Self::too_large`] or [`Self::body_error`] says so.
    pub async fn buffer_whole(&mut self) {
        let mut whole = bytes::BytesMut::new();
        loop {
            match self.next_chunk().await {
                Ok(chunk) if chunk.is_empty() => break,
                Ok(chunk) => whole.extend_from_slice(&chunk),
                Err(_) => return,
            }
        }
        self.headers.remove(http::header::TRANSFER_ENCODING);
        self.headers
            .insert(http::header::CONTENT_LENGTH, HeaderValue::from(whole.len()));
        self.received = 0;
        self.body = RequestBody::Full(whole.freeze());
    }

    /// At most `max` next bytes of the body (the rest stays for the next read); empty at its
    /// end.
    ///
    /// # Errors
    /// As [`Self::next_chunk`].
    pub async fn read_up_to(&mut self, max: usize) -> Result<Bytes, BodyError> {
        let mut chunk = self.next_chunk().await?;
        if chunk.len() > max {
            self.leftover = chunk.split_off(max);
        }
        Ok(chunk)
    }

    async fn next_frame(&mut self) -> Result<Bytes, crate::body::BodyFailure> {
        use http_body_util::BodyExt;
        loop {
            match self.body.frame().await {
                None => return Ok(Bytes::new()),
                Some(Err(e)) => return Err(e),
                Some(Ok(frame)) => {
                    // Trailers are not read by any kind; skip them and empty frames.
                    if let Ok(data) = frame.into_data()
                        && !data.is_empty()
                    {
                        return Ok(data);
                    }
                }
            }
        }
    }
}
