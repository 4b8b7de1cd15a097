//! The body types: of every response Tern sends (complete bytes, a stream from a guest, or a
//! backend's body that a guest forwarded), and of a client's request as a guest or the server
//! reads it (counted against the tenant's limit as it streams in); and a backend's answer as a
//! guest reads it, live or from the tenant's cache ([`Fetched`]).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::mpsc;

use http::header::CONTENT_TYPE;
use http::{HeaderValue, Response, StatusCode};
use std::future::Future;

use crate::metrics::Undelivered;

/// What `Body::poll_frame` answers: the next frame, an error `E`, or the end.
pub type Framed<E> = Poll<Option<Result<Frame<Bytes>, E>>>;

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

/// The header of a guest's answer that hands the client's WebSocket to a backend of its
/// tenant (its value: the backend's name; `crate::websocket`). The guest's response keeps it
/// apart: it never reaches a client.
pub static HANDOFF: http::HeaderName = http::HeaderName::from_static("tern-handoff");

/// A body a guest was streaming ended early: the guest failed or ended before finishing it (a
/// response whose head was sent, or an outbound request's body).
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the guest ended before finishing the body; it is incomplete")]
pub struct BodyAborted;

/// Why a response body ended before its end (the client sees it cut).
#[derive(Debug, thiserror::Error)]
pub enum BodyCut {
    /// Its guest failed.
    #[error(transparent)]
    Guest(#[from] BodyAborted),
    /// The backend's body a guest forwarded failed, ran past the backend's total timeout or
    /// past the tenant's response limit.
    #[error("the forwarded response body stopped: {0}")]
    Backend(String),
    /// Compressing it failed.
    #[error("compressing the response body failed: {0}")]
    Compress(String),
}

/// A response body.
#[derive(Debug)]
pub enum ResponseBody {
    /// Complete bytes (sent with a `Content-Length`); `None` once sent.
    Full(Option<Bytes>),
    /// Chunks from a guest, which may still be running.
    Stream(GuestStream),
    /// A backend's body, forwarded by a guest that has ended.
    Forwarded(Box<Forwarded>),
    /// A body whose request's access line is written when it ends.
    Logged(Box<Logged>),
    /// A body kept as it streams to the client, and handed on when it ends whole (the cache
    /// stores a guest's streamed answer so).
    Kept(Box<Kept>),
    /// A body a front-end step made of another as it streams (compression).
    Transformed(Transformed),
}

/// A body a front-end step made of another (say, compressed) as it streams.
pub struct Transformed(Pin<Box<dyn Body<Data = Bytes, Error = BodyCut> + Send>>);

impl Transformed {
    /// Wraps `body`.
    pub fn new(body: impl Body<Data = Bytes, Error = BodyCut> + Send + 'static) -> Self {
        Self(Box::pin(body))
    }
}

impl std::fmt::Debug for Transformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Transformed").finish_non_exhaustive()
    }
}

/// What is done with a [`Kept`] body that reached its end whole.
pub type KeptBody = Box<dyn FnOnce(Bytes) + Send>;

/// A body whose bytes are kept (at most `max`) as they are sent, and handed to `then` when it
/// reaches its end. A body that fails, outgrows `max` or is dropped before its end (the
/// client left) is not handed on.
pub struct Kept {
    body: ResponseBody,
    kept: Vec<Bytes>,
    len: usize,
    max: usize,
    then: Option<KeptBody>,
}

debug_fields!(Kept: body, len);

impl Kept {
    fn ended(&mut self) {
        if let Some(then) = self.then.take() {
            let mut whole = bytes::BytesMut::with_capacity(self.len);
            for chunk in self.kept.drain(..) {
                whole.extend_from_slice(&chunk);
            }
            then(whole.freeze());
        }
    }
}

/// A response body and its request's access line, written (with the body bytes sent, and
/// whether the body reached its end) when the server is done with it: sent whole, cut short,
/// or dropped because the client left.
pub struct Logged {
    body: ResponseBody,
    record: crate::logwriter::AccessRecord,
    bytes: u64,
    ended: bool,
}

debug_fields!(Logged: body, bytes);

impl Drop for Logged {
    fn drop(&mut self) {
        self.record
            .write(self.bytes, self.ended || self.body.is_end_stream());
    }
}

impl ResponseBody {
    /// A complete body.
    pub fn full(bytes: impl Into<Bytes>) -> Self {
        Self::Full(Some(bytes.into()))
    }

    /// This body with `record` written as its request's access line when it ends. `no_body`:
    /// the response has none to send (a `HEAD`, a `204`, a `304`), so it is complete as it is.
    pub fn logged(self, record: crate::logwriter::AccessRecord, no_body: bool) -> Self {
        Self::Logged(Box::new(Logged {
            body: self,
            record,
            bytes: 0,
            ended: no_body,
        }))
    }

    /// This body, with its bytes (at most `max`) handed to `then` if it reaches its end whole.
    pub fn kept(self, max: usize, then: KeptBody) -> Self {
        Self::Kept(Box::new(Kept {
            body: self,
            kept: Vec::new(),
            len: 0,
            max,
            then: Some(then),
        }))
    }

    /// A body streamed from a guest through `rx`; `aborted`, once set, makes the channel's
    /// close the guest's failure rather than the body's end. Unless the request was a `HEAD`
    /// (whose body is never sent), a stream that does not reach its end is counted in
    /// `undelivered`.
    pub fn stream(
        rx: mpsc::Receiver<Bytes>,
        aborted: Arc<std::sync::atomic::AtomicBool>,
        undelivered: Undelivered,
        head: bool,
    ) -> Self {
        Self::Stream(GuestStream {
            rx,
            aborted,
            undelivered: (!head).then_some(undelivered),
        })
    }
}

/// A guest's streamed body. It counts itself as undelivered if it is aborted by its guest or
/// dropped (the client left) before its end.
#[derive(Debug)]
pub struct GuestStream {
    rx: mpsc::Receiver<Bytes>,
    /// Set by a guest that failed before the body's end (read at the channel's close).
    aborted: Arc<std::sync::atomic::AtomicBool>,
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
    type Error = BodyCut;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Framed<BodyCut> {
        match self.get_mut() {
            Self::Full(bytes) => Poll::Ready(
                bytes
                    .take()
                    .filter(|b| !b.is_empty())
                    .map(|b| Ok(Frame::data(b))),
            ),
            Self::Stream(s) => {
                Poll::Ready(match std::task::ready!(s.rx.poll_recv(cx)) {
                    Some(chunk) => Some(Ok(Frame::data(chunk))),
                    None if s.aborted.load(std::sync::atomic::Ordering::Acquire) => {
                        if let Some(u) = s.undelivered.take() {
                            u.guest_failed.inc();
                        }
                        Some(Err(BodyCut::Guest(BodyAborted)))
                    }
                    // The end: delivered as far as the server can tell.
                    None => {
                        s.undelivered = None;
                        None
                    }
                })
            }
            Self::Forwarded(f) => f.poll_data(cx),
            Self::Logged(l) => {
                let polled = Pin::new(&mut l.body).poll_frame(cx);
                match &polled {
                    Poll::Ready(Some(Ok(frame))) => {
                        l.bytes += frame.data_ref().map_or(0, |d| d.len() as u64);
                        l.ended |= l.body.is_end_stream();
                    }
                    Poll::Ready(None) => l.ended = true,
                    Poll::Ready(Some(Err(_))) | Poll::Pending => {}
                }
                polled
            }
            Self::Kept(k) => {
                let polled = Pin::new(&mut k.body).poll_frame(cx);
                match &polled {
                    Poll::Ready(Some(Ok(frame))) => {
                        if let Some(data) = frame.data_ref()
                            && k.then.is_some()
                        {
                            k.len += data.len();
                            if k.len > k.max {
                                k.then = None;
                                k.kept = Vec::new();
                            } else {
                                k.kept.push(data.clone());
                            }
                        }
                        if k.body.is_end_stream() {
                            k.ended();
                        }
                    }
                    Poll::Ready(None) => k.ended(),
                    Poll::Ready(Some(Err(_))) => {
                        k.then = None;
                        k.kept = Vec::new();
                    }
                    Poll::Pending => {}
                }
                polled
            }
            Self::Transformed(t) => t.0.as_mut().poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Full(b) => b.is_none(),
            Self::Stream(_) => false,
            Self::Forwarded(f) => f.body.is_end_stream(),
            Self::Logged(l) => l.body.is_end_stream(),
            Self::Kept(k) => k.body.is_end_stream(),
            Self::Transformed(t) => t.0.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            Self::Full(None) => SizeHint::with_exact(0),
            Self::Stream(_) => SizeHint::default(),
            Self::Forwarded(f) => f.body.size_hint(),
            Self::Logged(l) => l.body.size_hint(),
            Self::Kept(k) => k.body.size_hint(),
            Self::Transformed(t) => t.0.size_hint(),
        }
    }
}

/// A backend's response body that a guest made its own answer's (`response_forward`): the
/// server streams it to the client after the guest has ended (its instance is gone by then),
/// within the tenant's response limit and the backend's total timeout, and holds the
/// backend's concurrency slot until it ends.
#[derive(Debug)]
pub struct Forwarded {
    /// (It holds the backend's concurrency slot.)
    body: Fetched,
    /// Bytes sent so far, and the most the tenant may send.
    sent: u64,
    max: u64,
    /// The backend's total timeout, and when it runs out.
    total: Duration,
    deadline: Pin<Box<tokio::time::Sleep>>,
    /// Where a body that does not reach its end is counted; `None` once it has (or for the
    /// answer to a `HEAD`, whose body is never sent).
    undelivered: Option<Undelivered>,
}

impl Forwarded {
    /// `body`, at most `max` bytes, ending by `deadline` (the backend's total timeout,
    /// `total`).
    pub fn new(
        body: Fetched,
        max: u64,
        (deadline, total): (tokio::time::Instant, Duration),
    ) -> Self {
        Self {
            body,
            sent: 0,
            max,
            total,
            deadline: Box::pin(tokio::time::sleep_until(deadline)),
            undelivered: None,
        }
    }

    /// Counts a body that does not reach its end in `undelivered` (unless it answers a `HEAD`).
    pub fn count_in(&mut self, undelivered: Undelivered, head: bool) {
        self.undelivered = (!head).then_some(undelivered);
    }

    fn cut(&mut self, why: String) -> Poll<Option<Result<Frame<Bytes>, BodyCut>>> {
        if let Some(u) = self.undelivered.take() {
            u.backend_failed.inc();
        }
        Poll::Ready(Some(Err(BodyCut::Backend(why))))
    }

    fn poll_data(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyCut>>> {
        loop {
            // (Checked before reading too: a body that always has bytes ready is still cut.)
            if self.deadline.is_elapsed() {
                let ms = self.total.as_millis();
                return self.cut(format!("no end within {ms} ms (total_timeout_ms)"));
            }
            let frame = match Pin::new(&mut self.body).poll_frame(cx) {
                Poll::Pending => {
                    if self.deadline.as_mut().poll(cx).is_ready() {
                        continue;
                    }
                    return Poll::Pending;
                }
                Poll::Ready(None) => {
                    self.undelivered = None;
                    return Poll::Ready(None);
                }
                Poll::Ready(Some(Err(e))) => return self.cut(e.to_string()),
                Poll::Ready(Some(Ok(frame))) => frame,
            };
            // Trailers are not sent (as for every answer).
            let Ok(data) = frame.into_data() else {
                continue;
            };
            self.sent += data.len() as u64;
            if self.sent > self.max {
                let max = self.max;
                return self.cut(format!("larger than {max} bytes (max_response_bytes)"));
            }
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
    }
}

impl Drop for Forwarded {
    fn drop(&mut self) {
        if let Some(u) = self.undelivered.take() {
            u.client_gone.inc();
        }
    }
}

/// The body length a request declares (`Content-Length`), if it declares a valid one.
pub fn declared_length(headers: &http::HeaderMap) -> Option<u64> {
    length_of(headers.get(http::header::CONTENT_LENGTH))
}

/// [`declared_length`] of a `Content-Length` found already.
pub fn length_of(content_length: Option<&HeaderValue>) -> Option<u64> {
    content_length.and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
}

static TEXT_PLAIN: HeaderValue = HeaderValue::from_static("text/plain; charset=utf-8");

/// A short plain-text response.
pub fn plain(status: StatusCode, text: &str) -> Response<ResponseBody> {
    plain_owned(status, text.to_string())
}

/// [`plain`] of a text already made for it (kept, not copied).
pub fn plain_owned(status: StatusCode, text: String) -> Response<ResponseBody> {
    let mut resp = Response::new(ResponseBody::full(text));
    *resp.status_mut() = status;
    resp.headers_mut().insert(CONTENT_TYPE, TEXT_PLAIN.clone());
    resp
}

/// Where a request's body comes from.
pub enum RequestBody {
    /// No body.
    Empty,
    /// A body already in memory (benchmarks and tests drive guests without a socket).
    Full(Bytes),
    /// A body still streaming in from the client, as its listener reads it (each transport's
    /// body type lives with its listener: hyper's for HTTP/1 and HTTP/2, `listener::quic`'s
    /// for HTTP/3).
    Streaming(Pin<Box<dyn Body<Data = Bytes, Error = BodyFailure> + Send + Sync>>),
}

impl RequestBody {
    /// A listener's body: [`Self::Empty`] if it has already ended (a `GET` costs no
    /// allocation), else boxed as it is.
    pub fn streaming(
        body: impl Body<Data = Bytes, Error = BodyFailure> + Send + Sync + 'static,
    ) -> Self {
        if body.is_end_stream() {
            Self::Empty
        } else {
            Self::Streaming(Box::pin(body))
        }
    }
}

impl std::fmt::Debug for RequestBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Empty => f.write_str("Empty"),
            Self::Full(b) => write!(f, "Full({} bytes)", b.len()),
            Self::Streaming(_) => f.write_str("Streaming"),
        }
    }
}

/// Why a client's body could not be read (bad framing, cut off, reset, longer or shorter than
/// its `Content-Length`), whatever its transport: its listener's error, as its text.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct BodyFailure(Box<dyn std::error::Error + Send + Sync>);

impl BodyFailure {
    /// A listener's error reading a body.
    pub fn new(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self(e.into())
    }
}

/// Every kind of request body read one way: by frames, data only (trailers are read by no
/// guest kind and are skipped).
impl Body for RequestBody {
    type Data = Bytes;
    type Error = BodyFailure;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Framed<Self::Error> {
        match self.get_mut() {
            Self::Empty => Poll::Ready(None),
            Self::Full(b) if b.is_empty() => Poll::Ready(None),
            Self::Full(b) => Poll::Ready(Some(Ok(Frame::data(std::mem::take(b))))),
            Self::Streaming(s) => s.as_mut().poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Empty => true,
            Self::Full(b) => b.is_empty(),
            Self::Streaming(s) => s.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Empty => SizeHint::with_exact(0),
            Self::Full(b) => SizeHint::with_exact(b.len() as u64),
            Self::Streaming(s) => s.size_hint(),
        }
    }
}

/// What the client's body did while the server streamed it (to a component, or to a backend):
/// the shared lifecycle answers `413` or `400` for it, whatever the guest made of the error.
#[derive(Debug, Default)]
pub struct BodyFlags {
    /// The body went past the tenant's limit.
    pub too_large: AtomicBool,
    /// The body could not be read (bad framing, cut off).
    pub failed: std::sync::Mutex<Option<String>>,
}

/// Why the client's body stopped short.
#[derive(Debug)]
pub enum ClientBodyError {
    /// Past the tenant's limit, at this many bytes.
    TooLarge(u64),
    /// The client's body failed.
    Failed(BodyFailure),
}

/// The client's body streamed by the server, counted against the tenant's limit as it comes
/// in; what it runs into is recorded in its [`BodyFlags`].
#[derive(Debug)]
pub struct ClientBody {
    body: RequestBody,
    seen: u64,
    max: u64,
    flags: Arc<BodyFlags>,
}

impl ClientBody {
    /// `body`, at most `max` bytes, reporting to `flags`.
    pub fn new(body: RequestBody, max: u64, flags: Arc<BodyFlags>) -> Self {
        Self {
            body,
            seen: 0,
            max,
            flags,
        }
    }

    /// The body's exact length, when the client declared one (hyper checks it).
    pub fn exact_len(&self) -> Option<u64> {
        self.body.size_hint().exact()
    }
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = ClientBodyError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Framed<Self::Error> {
        let this = self.get_mut();
        let frame = std::task::ready!(Pin::new(&mut this.body).poll_frame(cx));
        Poll::Ready(match frame {
            None => None,
            Some(Err(e)) => {
                *this.flags.failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
                Some(Err(ClientBodyError::Failed(e)))
            }
            Some(Ok(frame)) => {
                this.seen += frame.data_ref().map_or(0, |d| d.len() as u64);
                if this.seen > this.max {
                    this.flags.too_large.store(true, Ordering::Relaxed);
                    Some(Err(ClientBodyError::TooLarge(this.seen)))
                } else {
                    Some(Ok(frame))
                }
            }
        })
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self.exact_len() {
            Some(n) => http_body::SizeHint::with_exact(n),
            None => http_body::SizeHint::default(),
        }
    }
}

/// A backend's answer body as the guest (or the client, when the guest forwards it) reads
/// it: live from the backend, or from the tenant's cache (a stored answer, or a live one kept
/// as it is read, to be stored when it ends). It holds the backend's in-flight slot until it
/// is dropped.
pub struct Fetched {
    body: FetchedBody,
    _permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

enum FetchedBody {
    Live(hyper::body::Incoming),
    /// Polled only through `&mut`: wrapped, it is `Sync` like a live body, so a response body
    /// holding it stays `Sync`; whether it has ended and what is left, as of its last poll.
    Cache {
        body: sync_wrapper::SyncWrapper<ResponseBody>,
        end: bool,
        hint: http_body::SizeHint,
    },
}

impl std::fmt::Debug for Fetched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.body {
            FetchedBody::Live(_) => "Fetched::Live",
            FetchedBody::Cache { .. } => "Fetched::Cache",
        })
    }
}

impl Fetched {
    /// The backend's body as it comes, holding its slot `permit`.
    pub fn live(body: hyper::body::Incoming, permit: tokio::sync::OwnedSemaphorePermit) -> Self {
        Self {
            body: FetchedBody::Live(body),
            _permit: Some(permit),
        }
    }

    /// A body from the cache (holding `permit` while it still reads from the backend).
    pub fn cache(body: ResponseBody, permit: Option<tokio::sync::OwnedSemaphorePermit>) -> Self {
        Self {
            body: FetchedBody::Cache {
                end: http_body::Body::is_end_stream(&body),
                hint: http_body::Body::size_hint(&body),
                body: sync_wrapper::SyncWrapper::new(body),
            },
            _permit: permit,
        }
    }

    /// The live body as a response body the cache can keep, and the slot it holds; a body
    /// from the cache as it is.
    pub fn into_response_body(self) -> (ResponseBody, Option<tokio::sync::OwnedSemaphorePermit>) {
        use http_body_util::BodyExt;
        let body = match self.body {
            FetchedBody::Live(live) => ResponseBody::Transformed(Transformed::new(
                live.map_err(|e| BodyCut::Backend(e.to_string())),
            )),
            FetchedBody::Cache { body, .. } => body.into_inner(),
        };
        (body, self._permit)
    }
}

impl http_body::Body for Fetched {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Framed<Self::Error> {
        match &mut self.get_mut().body {
            FetchedBody::Live(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
            FetchedBody::Cache { body, end, hint } => {
                let body = body.get_mut();
                let polled = Pin::new(&mut *body).poll_frame(cx).map_err(Into::into);
                *end = body.is_end_stream();
                *hint = body.size_hint();
                polled
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.body {
            FetchedBody::Live(b) => b.is_end_stream(),
            FetchedBody::Cache { end, .. } => *end,
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match &self.body {
            FetchedBody::Live(b) => b.size_hint(),
            FetchedBody::Cache { hint, .. } => *hint,
        }
    }
}
