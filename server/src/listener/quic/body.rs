//! A request's body as it streams in over HTTP/3 ([`H3Body`]), handed to the front end as a
//! [`crate::body::RequestBody`] like every listener's.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use crate::body::{BodyFailure, Framed};

/// A request's body streaming in over HTTP/3: its stream's receiving side, held to its
/// `Content-Length` when it declares one (a body longer or shorter fails, as hyper's do).
///
/// Dropped before its end (a guest that did not read it all), it hands its stream back to the
/// request's task, which asks the client to stop sending once the answer is complete — with
/// `H3_NO_ERROR`, as RFC 9114 §4.1.2 says, and never before the answer (a client may not
/// have finished sending its request when its answer is ready).
pub struct H3Body {
    receive: Option<H3Receive>,
    /// Bytes still due under the declared length.
    remaining: Option<u64>,
    ended: bool,
    /// What [`Self::look_ahead`] read, given to the first poll.
    ahead: Option<Result<Frame<Bytes>, String>>,
    back: Option<tokio::sync::oneshot::Sender<H3Receive>>,
}

impl Drop for H3Body {
    fn drop(&mut self) {
        let (Some(receive), Some(back)) = (self.receive.take(), self.back.take()) else {
            return;
        };
        if self.ended {
            return;
        }
        // The request's task is gone (the answer was written already): stop it here.
        if let Err(mut receive) = back.send(receive) {
            receive.stop_sending(h3::error::Code::H3_NO_ERROR);
        }
    }
}

/// The receiving side of an HTTP/3 request stream (its frames bounded, and stopping it
/// safe while a read waits: [`super::streams`]).
pub type H3Receive = h3::server::RequestStream<super::streams::Framed, Bytes>;

impl H3Body {
    /// The body of a request stream's receiving side, held to `declared` bytes if given;
    /// and where the stream comes back if the body is dropped before its end.
    pub fn new(
        receive: H3Receive,
        declared: Option<u64>,
    ) -> (Self, tokio::sync::oneshot::Receiver<H3Receive>) {
        let (back, returned) = tokio::sync::oneshot::channel();
        let body = Self {
            receive: Some(receive),
            remaining: declared,
            ended: declared == Some(0),
            ahead: None,
            back: Some(back),
        };
        (body, returned)
    }

    /// Reads what the stream already holds past the head, without waiting: a request whose
    /// stream ended with its head (FIN in the same frame, as clients send a `GET`) is known
    /// to have no body ([`Self::is_end_stream`]), so its answer may be stored.
    pub fn look_ahead(&mut self) {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        if let Poll::Ready(Some(item)) = self.poll_data(&mut cx) {
            self.ahead = Some(item);
        }
    }

    /// The next DATA frame.
    fn poll_data(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, String>>> {
        if let Some(item) = self.ahead.take() {
            return Poll::Ready(Some(item));
        }
        if self.ended {
            return Poll::Ready(None);
        }
        let Some(receive) = self.receive.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = std::task::ready!(receive.poll_recv_data(cx));
        Poll::Ready(match polled {
            Err(e) => {
                self.ended = true;
                Some(Err(e.to_string()))
            }
            Ok(None) => {
                self.ended = true;
                match self.remaining {
                    Some(n) if n > 0 => Some(Err(format!(
                        "the body ended {n} bytes short of its Content-Length"
                    ))),
                    _ => None,
                }
            }
            Ok(Some(mut data)) => {
                let len = bytes::Buf::remaining(&data);
                let data = bytes::Buf::copy_to_bytes(&mut data, len);
                match &mut self.remaining {
                    Some(n) if data.len() as u64 > *n => {
                        self.ended = true;
                        Some(Err("the body is longer than its Content-Length".into()))
                    }
                    Some(n) => {
                        *n -= data.len() as u64;
                        Some(Ok(Frame::data(data)))
                    }
                    None => Some(Ok(Frame::data(data))),
                }
            }
        })
    }
}

impl Body for H3Body {
    type Data = Bytes;
    type Error = BodyFailure;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Framed<BodyFailure> {
        self.get_mut().poll_data(cx).map_err(BodyFailure::new)
    }

    fn is_end_stream(&self) -> bool {
        self.ended && self.ahead.is_none()
    }

    /// The declared length, while none of it is read.
    fn size_hint(&self) -> SizeHint {
        let ahead = match &self.ahead {
            Some(Ok(frame)) => frame.data_ref().map_or(0, |d| d.len() as u64),
            _ => 0,
        };
        match self.remaining {
            Some(n) => SizeHint::with_exact(n + ahead),
            None if self.is_end_stream() => SizeHint::with_exact(0),
            None => SizeHint::default(),
        }
    }
}
