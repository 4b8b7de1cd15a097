//! `tern::request_*`: the guest reads the request's method, target, headers and body, and its
//! context (`request_info`: who asks, where the tenant is mounted, the URL).

use std::borrow::Cow;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Uri, Version};
use http_body_util::BodyExt;
use tern_sdk::abi::{self, func};
use wasmtime::{Caller, Linker};

use super::{GuestFault, GuestState, copy_to_guest, guest_range, memory};
use crate::context::{self, RequestContext};

/// Where a request's body comes from.
#[derive(Debug)]
pub enum RequestBody {
    /// No body.
    Empty,
    /// A body already in memory (benchmarks and tests drive guests without a socket).
    Full(Bytes),
    /// A body still streaming in from the client.
    Incoming(hyper::body::Incoming),
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
    /// Headers serialised as `name NUL value NUL`, built on the first `request_headers` call.
    headers_blob: Option<Vec<u8>>,
    /// The client, the request id, the route prefix and the HTTP version.
    pub context: RequestContext,
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
            headers_blob: None,
            max_bytes,
            received: 0,
            too_large: false,
            body_error: None,
        }
    }

    fn headers_blob(&mut self) -> &[u8] {
        let headers = &self.headers;
        self.headers_blob
            .get_or_insert_with(|| super::headers_blob(headers))
    }

    /// The value of `request_info` key `key` for a guest of tenant `tenant`, or the error code:
    /// `INVALID_ARGUMENT` for a key this server does not know, `UNAVAILABLE` for a value this
    /// request has not got.
    fn info(&self, key: i32, tenant: &str) -> Result<Cow<'_, [u8]>, i32> {
        use abi::info;
        let text = |s: &'static str| Ok(Cow::Borrowed(s.as_bytes()));
        let owned = |s: String| Ok(Cow::Owned(s.into_bytes()));
        let path = self.uri.path();
        let split = self.context.prefix_len.min(path.len());
        match key {
            // An IPv4 client of a dual-stack listener arrives as `::ffff:a.b.c.d`.
            info::CLIENT_IP => owned(self.context.client().ip().to_canonical().to_string()),
            info::CLIENT_PORT => owned(self.context.client().port().to_string()),
            info::REQUEST_ID => Ok(Cow::Borrowed(self.context.request_id.as_bytes())),
            info::ROUTE_PREFIX => Ok(Cow::Borrowed(&path.as_bytes()[..split])),
            info::PATH_INFO => Ok(Cow::Borrowed(&path.as_bytes()[split..])),
            info::SCHEME => text(self.context.scheme()),
            info::HOST => context::host(&self.uri, &self.headers)
                .map(Cow::Borrowed)
                .ok_or(abi::errno::UNAVAILABLE),
            info::URL => {
                context::host(&self.uri, &self.headers).ok_or(abi::errno::UNAVAILABLE)?;
                Ok(Cow::Owned(context::url(
                    &self.context,
                    &self.uri,
                    &self.headers,
                )))
            }
            info::HTTP_VERSION => text(match self.context.version {
                Version::HTTP_09 => "HTTP/0.9",
                Version::HTTP_10 => "HTTP/1.0",
                Version::HTTP_2 => "HTTP/2",
                Version::HTTP_3 => "HTTP/3",
                _ => "HTTP/1.1",
            }),
            info::TLS_PROTOCOL => match &self.context.conn.tls {
                Some(tls) => text(tls.protocol),
                None => Err(abi::errno::UNAVAILABLE),
            },
            info::TLS_SNI => match self.context.conn.tls.as_ref().and_then(|t| t.sni.as_ref()) {
                Some(sni) => Ok(Cow::Borrowed(sni.as_bytes())),
                None => Err(abi::errno::UNAVAILABLE),
            },
            info::TENANT => Ok(Cow::Owned(tenant.as_bytes().to_vec())),
            _ => Err(abi::errno::INVALID_ARGUMENT),
        }
    }

    /// The host the client asked for: the target's authority (HTTP/2, absolute-form), else the
    /// `Host` header (the front end has checked that they agree where both are given).
    /// The next bytes of the body; empty at its end.
    ///
    /// # Errors
    /// The ABI error code: `LIMIT_EXCEEDED` past the tenant's body limit (counted as the body
    /// streams in, never buffered whole), `IO` if the client's body fails mid-stream.
    async fn next_chunk(&mut self) -> Result<Bytes, i32> {
        if !self.leftover.is_empty() {
            return Ok(std::mem::take(&mut self.leftover));
        }
        if self.too_large {
            return Err(abi::errno::LIMIT_EXCEEDED);
        }
        if self.body_error.is_some() {
            return Err(abi::errno::IO);
        }
        let chunk = self.next_frame().await.map_err(|e| {
            tracing::debug!("request body failed: {e}");
            self.body_error = Some(e.to_string());
            abi::errno::IO
        })?;
        self.received += chunk.len() as u64;
        if self.received > self.max_bytes {
            self.too_large = true;
            return Err(abi::errno::LIMIT_EXCEEDED);
        }
        Ok(chunk)
    }

    /// Whether a body is coming whose length the client did not declare (HTTP/1.1 chunked,
    /// or HTTP/2 without `content-length`).
    pub fn length_unknown(&self) -> bool {
        crate::body::declared_length(&self.headers).is_none()
            && match &self.body {
                RequestBody::Incoming(i) => !http_body::Body::is_end_stream(i),
                RequestBody::Full(b) => !b.is_empty(),
                RequestBody::Empty => false,
            }
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
        self.headers_blob = None;
        self.received = 0;
        self.body = RequestBody::Full(whole.freeze());
    }

    /// At most `max` next bytes of the body (the rest stays for the next read); empty at its
    /// end.
    ///
    /// # Errors
    /// As [`Self::next_chunk`].
    pub(super) async fn read_up_to(&mut self, max: usize) -> Result<Bytes, i32> {
        let mut chunk = self.next_chunk().await?;
        if chunk.len() > max {
            self.leftover = chunk.split_off(max);
        }
        Ok(chunk)
    }

    async fn next_frame(&mut self) -> Result<Bytes, hyper::Error> {
        match &mut self.body {
            RequestBody::Empty => Ok(Bytes::new()),
            RequestBody::Full(b) => Ok(std::mem::take(b)),
            RequestBody::Incoming(incoming) => loop {
                match incoming.frame().await {
                    None => return Ok(Bytes::new()),
                    Some(Err(e)) => return Err(e),
                    Some(Ok(frame)) => {
                        // Trailers are not part of ABI v1; skip them and empty frames.
                        if let Ok(data) = frame.into_data()
                            && !data.is_empty()
                        {
                            return Ok(data);
                        }
                    }
                }
            },
        }
    }
}

/// Links `name` as a copy-out function (see ABI.md) of the request value `value` returns.
fn copy_out(
    linker: &mut Linker<GuestState>,
    name: &'static str,
    value: fn(&mut GuestRequest) -> &[u8],
) -> wasmtime::Result<()> {
    linker.func_wrap(
        abi::IMPORT_MODULE,
        name,
        move |mut caller: Caller<'_, GuestState>, ptr: i32, len: i32| {
            let (data, state) = memory(&caller)?.data_and_store_mut(&mut caller);
            copy_to_guest(data, ptr, len, value(&mut state.request), name)
        },
    )?;
    Ok(())
}

pub(super) fn add_to_linker(linker: &mut Linker<GuestState>) -> wasmtime::Result<()> {
    let m = abi::IMPORT_MODULE;
    copy_out(linker, func::REQUEST_METHOD, |r| {
        r.method.as_str().as_bytes()
    })?;
    copy_out(linker, func::REQUEST_URI, |r| {
        context::path_and_query(&r.uri).as_bytes()
    })?;
    copy_out(linker, func::REQUEST_HEADERS, GuestRequest::headers_blob)?;
    linker.func_wrap(
        m,
        func::REQUEST_INFO,
        |mut caller: Caller<'_, GuestState>, key: i32, ptr: i32, len: i32| {
            let (data, state) = memory(&caller)?.data_and_store_mut(&mut caller);
            // A bad buffer traps whatever the key, as in every copy-out function.
            guest_range(ptr, len, data.len()).ok_or(GuestFault::BadPointer(func::REQUEST_INFO))?;
            match state.request.info(key, state.wasi.tenant()) {
                Ok(value) => copy_to_guest(data, ptr, len, &value, func::REQUEST_INFO),
                Err(code) => Ok(code),
            }
        },
    )?;
    linker.func_wrap_async(
        m,
        func::REQUEST_BODY_READ,
        |mut caller: Caller<'_, GuestState>, (ptr, len): (i32, i32)| {
            Box::new(async move {
                let mem = memory(&caller)?;
                // Check the buffer before waiting for data: a bad pointer traps even at the end.
                let range = guest_range(ptr, len, mem.data_size(&caller))
                    .ok_or(GuestFault::BadPointer(func::REQUEST_BODY_READ))?;
                if range.is_empty() {
                    return Ok(0);
                }
                let mut chunk = match caller.data_mut().request.next_chunk().await {
                    Ok(chunk) => chunk,
                    Err(code) => return Ok(code),
                };
                let n = range.len().min(chunk.len());
                let (data, state) = mem.data_and_store_mut(&mut caller);
                // The memory cannot shrink, so the range checked above is still inside it.
                data[range.start..range.start + n].copy_from_slice(&chunk[..n]);
                state.request.leftover = chunk.split_off(n);
                Ok(i32::try_from(n).unwrap_or(i32::MAX))
            })
        },
    )?;
    Ok(())
}
