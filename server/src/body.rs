//! The body type of every response Tern sends: complete bytes, or a stream from a guest.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use tokio::sync::mpsc;

use http::header::CONTENT_TYPE;
use http::{HeaderValue, Response, StatusCode};

use crate::metrics::Undelivered;

/// Headers that frame a message and manage its connection (hop-by-hop): the server's to set on
/// every message it sends, never a guest's. (`content-length` is not among them: a guest may
/// declare its body's length.)
pub const FRAMING_HEADERS: [&str; 7] = [
    "transfer-encoding",
    "connection",
    "keep-alive",
    "upgrade",
    "te",
    "trailer",
    "proxy-connection",
];

/// A streaming body ended early because its guest failed after the head was sent.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the guest failed after its response had started; the body is incomplete")]
pub struct BodyAborted;

/// One chunk of a streaming body, or the reason it stopped.
pub type StreamItem = Result<Bytes, BodyAborted>;

/// A response body.
#[derive(Debug)]
pub enum ResponseBody {
    /// Complete bytes (sent with a `Content-Length`); `None` once sent.
    Full(Option<Bytes>),
    /// Chunks from a guest, which may still be running.
    Stream(GuestStream),
}

impl ResponseBody {
    /// A complete body.
    pub fn full(bytes: impl Into<Bytes>) -> Self {
        Self::Full(Some(bytes.into()))
    }

    /// A body streamed from a guest through `rx`. Unless the request was a `HEAD` (whose
    /// body is never sent), a stream that does not reach its end is counted in `undelivered`.
    pub fn stream(rx: mpsc::Receiver<StreamItem>, undelivered: Undelivered, head: bool) -> Self {
        Self::Stream(GuestStream {
            rx,
            undelivered: (!head).then_some(undelivered),
        })
    }
}

/// A guest's streamed body. It counts itself as undelivered if it is aborted by its guest or
/// dropped (the client left) before its end.
#[derive(Debug)]
pub struct GuestStream {
    rx: mpsc::Receiver<StreamItem>,
    /// Where a cut body is counted; `None` once the body has ended (or for a `HEAD`).
    undelivered: Option<Undelivered>,
}

impl Drop for GuestStream {
    fn drop(&mut self) {
        if let Some(u) = self.undelivered.take() {
            u.client_gone.inc();
        }
    }
}

impl http_body::Body for ResponseBody {
    type Data = Bytes;
    type Error = BodyAborted;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyAborted>>> {
        match self.get_mut() {
            Self::Full(bytes) => Poll::Ready(
                bytes
                    .take()
                    .filter(|b| !b.is_empty())
                    .map(|b| Ok(Frame::data(b))),
            ),
            Self::Stream(s) => {
                let item = std::task::ready!(s.rx.poll_recv(cx));
                match &item {
                    Some(Ok(_)) => {}
                    // The end: delivered as far as the server can tell.
                    None => s.undelivered = None,
                    Some(Err(BodyAborted)) => {
                        if let Some(u) = s.undelivered.take() {
                            u.guest_failed.inc();
                        }
                    }
                }
                Poll::Ready(item.map(|r| r.map(Frame::data)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, Self::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            Self::Full(None) => SizeHint::with_exact(0),
            Self::Stream(_) => SizeHint::default(),
        }
    }
}

/// The body length a request declares (`Content-Length`), if it declares a valid one.
pub fn declared_length(headers: &http::HeaderMap) -> Option<u64> {
    headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
}

static TEXT_PLAIN: HeaderValue = HeaderValue::from_static("text/plain; charset=utf-8");

/// A short plain-text response.
pub fn plain(status: StatusCode, text: &str) -> Response<ResponseBody> {
    let mut resp = Response::new(ResponseBody::full(text.to_string()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(CONTENT_TYPE, TEXT_PLAIN.clone());
    resp
}
