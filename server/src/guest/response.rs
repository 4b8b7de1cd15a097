//! The response a guest writes, whatever its kind: status, headers, body.
//!
//! Bodies up to [`abi::STREAM_THRESHOLD`] are buffered, so most responses go out complete, with
//! a `Content-Length` and every phase in `Server-Timing`. A body that grows past it *commits* the
//! head: status and headers go to the client at once (through [`Head`]) and the body streams
//! through a bounded channel, so a guest can send more than it could hold and waits (yields)
//! while the client is slow to read.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use tern_sdk::abi;
use tokio::sync::{mpsc, oneshot};

use crate::body::FRAMING_HEADERS;

/// Why a body write was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteError {
    /// Past the tenant's response body limit, or past the length the guest declared.
    Limit,
    /// The client is gone.
    ClientGone,
    /// The body is a backend's, forwarded ([`GuestResponse::forward`]).
    Forwarded,
}

/// Why a backend's response cannot become the guest's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardError {
    /// The guest has written body bytes already, or forwarded a response before.
    BodyWritten,
    /// The head has been sent: the body is streaming.
    HeadersSent,
    /// The backend's headers go past the tenant's header limit, or declare a body over its
    /// body limit.
    Limit,
}

/// Why a header was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderError {
    /// The head has been sent: the body is streaming.
    HeadersSent,
    /// A `content-length` that is not a length, or disagrees with one declared before.
    Invalid,
    /// Too many headers, or a declared length over the tenant's body limit.
    Limit,
}

/// How many body chunks may wait for the client before the guest's writes block.
const STREAM_CHANNEL_CHUNKS: usize = 8;

/// A response head whose body streams: sent to the front end when the head commits.
#[derive(Debug)]
pub struct Head {
    /// Status set by the guest.
    pub status: StatusCode,
    /// Headers set by the guest.
    pub headers: HeaderMap,
    /// The body, chunk by chunk.
    pub body: mpsc::Receiver<Bytes>,
    /// Set when the guest failed before the body's end: the channel's close is then an
    /// abort, not the end (the chunks before it are still sent).
    pub aborted: Arc<AtomicBool>,
}

/// The response as the guest builds it.
#[derive(Debug)]
pub struct GuestResponse {
    /// Status; `200` unless the guest sets one.
    pub status: StatusCode,
    /// Headers set by the guest.
    pub headers: HeaderMap,
    /// The buffered body (until the head commits).
    pub body: BytesMut,
    /// Body bytes written so far.
    pub written: u64,
    /// Largest body the tenant may send.
    pub max_bytes: u64,
    /// Most headers the tenant may set.
    pub max_headers: usize,
    /// Set when a write went past `max_bytes`.
    pub limit_hit: bool,
    /// Where the head goes when the body starts streaming; `None` once it has.
    commit: Option<oneshot::Sender<Head>>,
    /// The streaming body, once the head has committed, and its abort mark.
    pub stream: Option<(mpsc::Sender<Bytes>, Arc<AtomicBool>)>,
    /// The body length the guest declared with a `content-length` header: a streamed response
    /// is sent with it instead of chunked, writes past it fail, and a body that ends short of
    /// it fails the request.
    pub declared: Option<u64>,
    /// The backend's body the guest made its own, sent once the guest has ended.
    pub forwarded: Option<crate::body::Forwarded>,
    /// The backend the guest hands the client's WebSocket to (its `tern-handoff` header, or
    /// the Tern ABI's `handoff_websocket`): never a header of the answer.
    pub handoff: Option<HeaderValue>,
}

impl GuestResponse {
    /// An empty `200` response whose head, if the body streams, is sent through `commit`.
    pub fn new(max_bytes: u64, max_headers: usize, commit: oneshot::Sender<Head>) -> Self {
        Self {
            status: StatusCode::OK,
            headers: HeaderMap::new(),
            body: BytesMut::new(),
            written: 0,
            max_bytes,
            max_headers,
            limit_hit: false,
            commit: Some(commit),
            stream: None,
            declared: None,
            forwarded: None,
            handoff: None,
        }
    }

    /// Makes a backend's answer this response: its `status`, its `headers` added to the ones
    /// the guest set (under the same rules and limits) and its `body`, which the server sends
    /// after the guest has ended. The guest may still set the status and add headers; it can
    /// write no body.
    ///
    /// # Errors
    /// [`ForwardError`]; nothing is changed.
    pub fn forward(
        &mut self,
        status: StatusCode,
        headers: HeaderMap,
        body: crate::body::Forwarded,
    ) -> Result<(), ForwardError> {
        if self.is_streaming() {
            return Err(ForwardError::HeadersSent);
        }
        if self.written > 0 || self.forwarded.is_some() {
            return Err(ForwardError::BodyWritten);
        }
        let kept = (self.headers.clone(), self.declared, self.limit_hit);
        for (name, value) in &headers {
            // A `content-length` the guest declared first must agree with the backend's.
            if let Err(e) = self.append_header(name.clone(), value.clone()) {
                (self.headers, self.declared, self.limit_hit) = kept;
                return Err(match e {
                    HeaderError::HeadersSent => ForwardError::HeadersSent,
                    HeaderError::Invalid | HeaderError::Limit => ForwardError::Limit,
                });
            }
        }
        self.status = status;
        self.forwarded = Some(body);
        Ok(())
    }

    /// Why the body the guest wrote does not match the length it declared, if it does not.
    pub fn length_mismatch(&self) -> Option<String> {
        // A forwarded body's length is the backend's, held to its header by the HTTP layer.
        if self.forwarded.is_some() {
            return None;
        }
        let declared = self.declared?;
        (declared != self.written).then(|| {
            format!(
                "the guest declared a body of {declared} bytes (content-length) but wrote {}",
                self.written
            )
        })
    }

    /// Whether the head has been sent and the body is streaming.
    pub fn is_streaming(&self) -> bool {
        self.stream.is_some()
    }

    /// Ends a streaming body with an error, so the client sees an aborted response rather
    /// than a complete-looking truncated one. It never waits: a client that stopped reading
    /// leaves the channel full, and waiting for room would hold the guest's slot for as long
    /// as the client likes. The mark is read at the channel's close, after the chunks
    /// waiting in it.
    pub fn abort_stream(&mut self) {
        if let Some((tx, aborted)) = self.stream.take() {
            aborted.store(true, Ordering::Release);
            drop(tx);
        }
    }

    /// Adds `bytes` to the body: buffered up to [`abi::STREAM_THRESHOLD`], past it the head
    /// commits and the body streams (waiting while the client is slow to read).
    ///
    /// # Errors
    /// [`WriteError::Limit`] past the tenant's body limit or the declared length (nothing is
    /// taken), [`WriteError::ClientGone`].
    pub async fn write(&mut self, bytes: &[u8]) -> Result<(), WriteError> {
        if self.forwarded.is_some() {
            return Err(WriteError::Forwarded);
        }
        let n = bytes.len();
        if self.written + n as u64 > self.max_bytes {
            self.limit_hit = true;
            return Err(WriteError::Limit);
        }
        if self.declared.is_some_and(|d| self.written + n as u64 > d) {
            // Past its own declared length: refused, and the request fails at its end.
            self.written = self.written.saturating_add(n as u64);
            return Err(WriteError::Limit);
        }
        self.written += n as u64;
        if !self.is_streaming() {
            if self.body.len() + n <= abi::STREAM_THRESHOLD {
                self.body.extend_from_slice(bytes);
                return Ok(());
            }
            if !self.commit() {
                return Err(WriteError::ClientGone);
            }
            let buffered = self.body.split().freeze();
            self.send(buffered).await?;
        }
        self.send(Bytes::copy_from_slice(bytes)).await
    }

    /// Adds a header: framing headers are the server's and ignored, `content-length`
    /// declares the body's length.
    ///
    /// # Errors
    /// [`HeaderError`]: the head is sent, a bad `content-length`, too many headers or a
    /// declared length over the body limit.
    pub fn append_header(
        &mut self,
        name: HeaderName,
        value: HeaderValue,
    ) -> Result<(), HeaderError> {
        if self.is_streaming() {
            return Err(HeaderError::HeadersSent);
        }
        // Framing and connection management are the server's: a guest's attempt is ignored.
        // (`content-length` is a declaration the server holds the body to: `declared`.)
        if FRAMING_HEADERS.contains(&name.as_str()) {
            return Ok(());
        }
        if name == crate::body::HANDOFF {
            self.handoff = Some(value);
            return Ok(());
        }
        if name == http::header::CONTENT_LENGTH {
            let n = std::str::from_utf8(value.as_bytes())
                .ok()
                .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|v| v.parse::<u64>().ok());
            return match (n, self.declared) {
                (None, _) => Err(HeaderError::Invalid),
                (Some(n), Some(d)) if n != d => Err(HeaderError::Invalid),
                (Some(n), _) if n > self.max_bytes => {
                    self.limit_hit = true;
                    Err(HeaderError::Limit)
                }
                (Some(n), _) => {
                    self.declared = Some(n);
                    Ok(())
                }
            };
        }
        if self.headers.len() >= self.max_headers {
            self.limit_hit = true;
            return Err(HeaderError::Limit);
        }
        self.headers.append(name, value);
        Ok(())
    }

    /// Sends one chunk of a streaming body.
    async fn send(&self, chunk: Bytes) -> Result<(), WriteError> {
        let (tx, _) = self.stream.as_ref().ok_or(WriteError::ClientGone)?;
        tx.send(chunk).await.map_err(|_| WriteError::ClientGone)
    }

    /// Sends the head and switches to streaming. Returns `false` if the client is gone.
    fn commit(&mut self) -> bool {
        let Some(commit) = self.commit.take() else {
            return false;
        };
        let (tx, rx) = mpsc::channel(STREAM_CHANNEL_CHUNKS);
        let mut headers = std::mem::take(&mut self.headers);
        if let Some(n) = self.declared {
            headers.insert(
                http::header::CONTENT_LENGTH,
                crate::decimal::header_value(n),
            );
        }
        let aborted = Arc::new(AtomicBool::new(false));
        let head = Head {
            status: self.status,
            headers,
            body: rx,
            aborted: aborted.clone(),
        };
        if commit.send(head).is_err() {
            return false;
        }
        self.stream = Some((tx, aborted));
        true
    }
}
