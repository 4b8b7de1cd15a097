//! The body of a guest's outbound request as the client sends it.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;

use crate::body::BodyAborted;

/// The body of an outbound request: whole, or streamed from the guest through a channel.
///
/// A streamed body ends only at its end marker (an empty chunk, sent by
/// `outbound_body_finish`). If the guest goes away first (a trap, its deadline) the channel
/// closes without it and the body fails, so the backend sees an aborted request, never a
/// complete-looking truncated one.
///
/// The body also says when the whole request has been handed to a connection (its end was
/// reached): the wait for the response head ([`super::send`]'s `first_byte_timeout_ms`) starts then.
pub struct OutBody {
    kind: OutKind,
    sent: Arc<RequestSent>,
}

impl OutBody {
    /// What says when the request has been sent whole.
    pub(super) fn sent(&self) -> Arc<RequestSent> {
        self.sent.clone()
    }

    fn new(kind: OutKind) -> Self {
        Self {
            kind,
            sent: Arc::default(),
        }
    }

    /// Whether it may still carry bytes (read without marking it sent): a backend's answer
    /// to a request with a body is not stored, since the key does not hold the body.
    pub fn may_have_bytes(&self) -> bool {
        match &self.kind {
            OutKind::Full(bytes) => bytes.is_some(),
            OutKind::Stream(_, ended) => !ended,
            OutKind::Boxed(b, _) => !http_body::Body::is_end_stream(b),
            OutKind::Client(b) => !http_body::Body::is_end_stream(b),
        }
    }

    /// A body written whole before the request is sent.
    pub fn full(bytes: Bytes) -> Self {
        Self::new(OutKind::Full((!bytes.is_empty()).then_some(bytes)))
    }

    /// A body the guest streams through `chunks` after the request is sent; an empty chunk
    /// ends it, a closed channel aborts it.
    pub fn stream(chunks: tokio::sync::mpsc::Receiver<Bytes>) -> Self {
        Self::new(OutKind::Stream(chunks, false))
    }

    /// The client's request body, streamed on to the backend by the server.
    pub fn client(body: crate::body::ClientBody) -> Self {
        Self::new(OutKind::Client(body))
    }

    /// A component's outgoing body, aborted at its end if `calls` says the run failed.
    pub fn component(
        body: http_body_util::combinators::UnsyncBoxBody<Bytes, BodyAborted>,
        calls: Arc<ComponentCalls>,
    ) -> Self {
        Self::new(OutKind::Boxed(body, calls))
    }
}

impl Drop for OutBody {
    /// hyper drops the body once it is done with it: when it has sent all of it (it may stop
    /// polling a body whose declared length it has written), or when the request failed.
    fn drop(&mut self) {
        self.sent.mark();
    }
}

impl http_body::Body for OutBody {
    type Data = Bytes;
    type Error = BodyAborted;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> crate::body::Framed<Self::Error> {
        let this = self.get_mut();
        let frame = match &mut this.kind {
            OutKind::Full(b) => Poll::Ready(b.take().map(|b| Ok(http_body::Frame::data(b)))),
            OutKind::Stream(_, true) => Poll::Ready(None),
            OutKind::Stream(rx, ended) => match rx.poll_recv(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(Some(chunk)) if chunk.is_empty() => {
                    *ended = true;
                    Poll::Ready(None)
                }
                Poll::Ready(Some(chunk)) => Poll::Ready(Some(Ok(http_body::Frame::data(chunk)))),
                Poll::Ready(None) => Poll::Ready(Some(Err(BodyAborted))),
            },
            // Past the tenant's limit, or failed: the backend sees an aborted request (the
            // client gets 413 or 400 for it).
            OutKind::Client(b) => Pin::new(b).poll_frame(cx).map_err(|_| BodyAborted),
            OutKind::Boxed(b, calls) => match Pin::new(b).poll_frame(cx) {
                Poll::Ready(None) if calls.failed.load(std::sync::atomic::Ordering::Acquire) => {
                    Poll::Ready(Some(Err(BodyAborted)))
                }
                other => other,
            },
        };
        if let Poll::Ready(None) = frame {
            this.sent.mark();
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        let end = match &self.kind {
            OutKind::Boxed(b, _) => b.is_end_stream(),
            OutKind::Client(b) => b.is_end_stream(),
            kind => matches!(kind, OutKind::Full(None) | OutKind::Stream(_, true)),
        };
        // hyper asks this as it writes the head and after each frame: an ended body is sent.
        if end {
            self.sent.mark();
        }
        end
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match &self.kind {
            OutKind::Full(Some(b)) => http_body::SizeHint::with_exact(b.len() as u64),
            OutKind::Full(None) | OutKind::Stream(_, true) => http_body::SizeHint::with_exact(0),
            OutKind::Stream(..) => http_body::SizeHint::default(),
            OutKind::Boxed(b, _) => b.size_hint(),
            OutKind::Client(b) => b.size_hint(),
        }
    }
}

enum OutKind {
    /// Written before the request was sent (sent with a `Content-Length`).
    Full(Option<Bytes>),
    /// Written after: each write is a chunk; an empty chunk ends the body.
    Stream(tokio::sync::mpsc::Receiver<Bytes>, bool),
    /// A `wasi:http` component's outgoing body. wasmtime ends it cleanly both when the guest
    /// finishes it and when its store is dropped, so [`ComponentCalls::failed`] (set when the
    /// guest's run failed, before the store is dropped) tells the two apart: an end after a
    /// failed run is an abort.
    Boxed(
        http_body_util::combinators::UnsyncBoxBody<Bytes, BodyAborted>,
        Arc<ComponentCalls>,
    ),
    /// The client's own request body, forwarded as it streams in (its length, when the client
    /// declared one, goes with it).
    Client(crate::body::ClientBody),
}

/// Set once an outbound request's body has reached its end on a connection: the request is
/// sent and the backend's turn begins.
#[derive(Debug, Default)]
pub(super) struct RequestSent {
    done: std::sync::atomic::AtomicBool,
    notify: tokio::sync::Notify,
}

impl RequestSent {
    /// Waits until the request is sent (at once if it is already).
    pub(super) async fn wait(&self) {
        self.notify.notified().await;
    }

    fn mark(&self) {
        if !self.done.swap(true, std::sync::atomic::Ordering::AcqRel) {
            // A permit is stored if nobody waits yet, so the signal is never lost.
            self.notify.notify_one();
        }
    }
}

/// What a `wasi:http` component's outgoing requests share with its run (made by its first
/// request).
#[derive(Debug, Default)]
pub struct ComponentCalls {
    /// Nanoseconds spent waiting for response heads.
    pub waited_ns: std::sync::atomic::AtomicU64,
    /// Set when the guest's run failed, before its store is dropped: a body it did not finish
    /// then fails toward the backend instead of ending cleanly.
    pub failed: std::sync::atomic::AtomicBool,
}
