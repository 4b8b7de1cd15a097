//! The body type of every response Tern sends: complete bytes, or a stream from a guest.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use tokio::sync::mpsc;

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
    /// Chunks from a running guest.
    Stream(mpsc::Receiver<StreamItem>),
}

impl ResponseBody {
    /// A complete body.
    pub fn full(bytes: impl Into<Bytes>) -> Self {
        Self::Full(Some(bytes.into()))
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
            Self::Stream(rx) => rx
                .poll_recv(cx)
                .map(|item| item.map(|r| r.map(Frame::data))),
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
