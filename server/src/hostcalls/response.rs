//! `tern::response_*`: the guest sets the status and headers and writes the body.
//!
//! Bodies up to [`abi::STREAM_THRESHOLD`] are buffered, so most responses go out complete, with
//! a `Content-Length` and every phase in `Server-Timing`. A body that grows past it *commits* the
//! head: status and headers go to the client at once (through [`Head`]) and the body streams
//! through a bounded channel, so a guest can send more than it could hold and waits (yields)
//! while the client is slow to read.

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use tern_sdk::abi::{self, errno, func};
use tokio::sync::{mpsc, oneshot};
use wasmtime::{Caller, Linker};

use super::{GuestFault, GuestState, guest_range, memory};
use crate::body::{BodyAborted, StreamItem};

/// How many body chunks may wait for the client before the guest's writes block.
const STREAM_CHANNEL_CHUNKS: usize = 8;

/// Headers the server sets itself: the response's framing and connection management belong to
/// the server, not the guest. A guest's attempt to set one is ignored. (`content-length` is
/// taken as a declaration the server holds the body to, see [`GuestResponse::declared`].)
const SERVER_OWNED: [&str; 7] = [
    "transfer-encoding",
    "connection",
    "keep-alive",
    "upgrade",
    "te",
    "trailer",
    "proxy-connection",
];

/// A response head whose body streams: sent to the front end when the head commits.
#[derive(Debug)]
pub struct Head {
    /// Status set by the guest.
    pub status: StatusCode,
    /// Headers set by the guest.
    pub headers: HeaderMap,
    /// The body, chunk by chunk; an `Err` aborts the response.
    pub body: mpsc::Receiver<StreamItem>,
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
    /// The streaming body, once the head has committed.
    pub stream: Option<mpsc::Sender<StreamItem>>,
    /// The body length the guest declared with a `content-length` header: a streamed response
    /// is sent with it instead of chunked, writes past it fail, and a body that ends short of
    /// it fails the request.
    pub declared: Option<u64>,
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
        }
    }

    /// Why the body the guest wrote does not match the length it declared, if it does not.
    pub fn length_mismatch(&self) -> Option<String> {
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
    /// than a complete-looking truncated one.
    pub async fn abort_stream(&mut self) {
        if let Some(tx) = self.stream.take() {
            let _ = tx.send(Err(BodyAborted)).await;
        }
    }

    /// Adds `bytes` to the body: buffered up to [`abi::STREAM_THRESHOLD`], past it the head
    /// commits and the body streams (waiting while the client is slow to read). Returns the
    /// bytes taken or the ABI error: `LIMIT_EXCEEDED` past the tenant's body limit or the
    /// declared length, `IO` if the client is gone.
    pub async fn write(&mut self, bytes: &[u8]) -> i32 {
        let n = bytes.len();
        if self.written + n as u64 > self.max_bytes {
            self.limit_hit = true;
            return errno::LIMIT_EXCEEDED;
        }
        if self.declared.is_some_and(|d| self.written + n as u64 > d) {
            // Past its own declared length: refused, and the request fails at its end.
            self.written = self.written.saturating_add(n as u64);
            return errno::LIMIT_EXCEEDED;
        }
        self.written += n as u64;
        let taken = i32::try_from(n).unwrap_or(i32::MAX);
        if !self.is_streaming() {
            if self.body.len() + n <= abi::STREAM_THRESHOLD {
                self.body.extend_from_slice(bytes);
                return taken;
            }
            if !self.commit() {
                return errno::IO;
            }
            let buffered = self.body.split().freeze();
            if self.send(buffered).await.is_err() {
                return errno::IO;
            }
        }
        match self.send(Bytes::copy_from_slice(bytes)).await {
            Ok(()) => taken,
            Err(()) => errno::IO,
        }
    }

    /// Adds a header as `response_header_append` does: framing headers are the server's and
    /// ignored, `content-length` declares the body's length. Returns 0 or the ABI error:
    /// `HEADERS_SENT`, `INVALID_ARGUMENT`, `LIMIT_EXCEEDED` (too many headers, or a declared
    /// length over the body limit).
    pub fn append_header(&mut self, name: HeaderName, value: HeaderValue) -> i32 {
        if self.is_streaming() {
            return errno::HEADERS_SENT;
        }
        if SERVER_OWNED.contains(&name.as_str()) {
            return 0;
        }
        if name == http::header::CONTENT_LENGTH {
            let n = std::str::from_utf8(value.as_bytes())
                .ok()
                .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|v| v.parse::<u64>().ok());
            return match (n, self.declared) {
                (None, _) => errno::INVALID_ARGUMENT,
                (Some(n), Some(d)) if n != d => errno::INVALID_ARGUMENT,
                (Some(n), _) if n > self.max_bytes => {
                    self.limit_hit = true;
                    errno::LIMIT_EXCEEDED
                }
                (Some(n), _) => {
                    self.declared = Some(n);
                    0
                }
            };
        }
        if self.headers.len() >= self.max_headers {
            self.limit_hit = true;
            return errno::LIMIT_EXCEEDED;
        }
        self.headers.append(name, value);
        0
    }

    /// Sends one chunk of a streaming body; `Err` if the client is gone.
    async fn send(&self, chunk: Bytes) -> Result<(), ()> {
        let tx = self.stream.as_ref().ok_or(())?;
        tx.send(Ok(chunk)).await.map_err(drop)
    }

    /// Sends the head and switches to streaming. Returns `false` if the client is gone.
    fn commit(&mut self) -> bool {
        let Some(commit) = self.commit.take() else {
            return false;
        };
        let (tx, rx) = mpsc::channel(STREAM_CHANNEL_CHUNKS);
        let mut headers = std::mem::take(&mut self.headers);
        if let Some(n) = self.declared {
            headers.insert(http::header::CONTENT_LENGTH, HeaderValue::from(n));
        }
        let head = Head {
            status: self.status,
            headers,
            body: rx,
        };
        if commit.send(head).is_err() {
            return false;
        }
        self.stream = Some(tx);
        true
    }
}

pub(super) fn add_to_linker(linker: &mut Linker<GuestState>) -> wasmtime::Result<()> {
    let m = abi::IMPORT_MODULE;
    linker.func_wrap(
        m,
        func::RESPONSE_SET_STATUS,
        |mut caller: Caller<'_, GuestState>, status: i32| {
            let resp = &mut caller.data_mut().response;
            if resp.is_streaming() {
                return errno::HEADERS_SENT;
            }
            match u16::try_from(status)
                .ok()
                .and_then(|s| StatusCode::from_u16(s).ok())
            {
                Some(s) => {
                    resp.status = s;
                    0
                }
                None => errno::INVALID_ARGUMENT,
            }
        },
    )?;
    linker.func_wrap(
        m,
        func::RESPONSE_HEADER_APPEND,
        |mut caller: Caller<'_, GuestState>, np: i32, nl: i32, vp: i32, vl: i32| {
            let (data, state) = memory(&caller)?.data_and_store_mut(&mut caller);
            let bad = || GuestFault::BadPointer(func::RESPONSE_HEADER_APPEND);
            let name = guest_range(np, nl, data.len()).ok_or_else(bad)?;
            let value = guest_range(vp, vl, data.len()).ok_or_else(bad)?;
            let resp = &mut state.response;
            if resp.is_streaming() {
                return Ok(errno::HEADERS_SENT);
            }
            let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(&data[name]),
                HeaderValue::from_bytes(&data[value]),
            ) else {
                return Ok(errno::INVALID_ARGUMENT);
            };
            Ok(resp.append_header(name, value))
        },
    )?;
    linker.func_wrap_async(
        m,
        func::RESPONSE_BODY_WRITE,
        |mut caller: Caller<'_, GuestState>, (ptr, len): (i32, i32)| {
            Box::new(async move {
                let mem = memory(&caller)?;
                let (data, state) = mem.data_and_store_mut(&mut caller);
                let range = guest_range(ptr, len, data.len())
                    .ok_or(GuestFault::BadPointer(func::RESPONSE_BODY_WRITE))?;
                Ok(state.response.write(&data[range]).await)
            })
        },
    )?;
    Ok(())
}
