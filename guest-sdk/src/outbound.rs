//! Outbound HTTP: call the tenant's backends and allowed hosts (ABI `outbound_*`).
//!
//! The server denies every request the tenant's config does not allow: a **named backend**
//! (`[tenant.outbound.backends.NAME]`, reached by name and a path) or, by absolute `http(s)://`
//! URL, a host in `outbound.allowed_hosts` whose addresses are public.
//!
//! ```no_run
//! use tern_sdk::http::{Method, Request};
//! // Whole bodies, `http` types:
//! let req = Request::get("/users/7").body(Vec::new()).unwrap();
//! let resp = tern_sdk::fetch_backend("origin", req)?;
//! assert!(resp.status().is_success());
//!
//! // Two at once: send both, then read both.
//! use tern_sdk::outbound::Outgoing;
//! let a = Outgoing::to_backend(&Method::GET, "users", "/7")?.send()?;
//! let b = Outgoing::to_backend(&Method::GET, "orders", "/?user=7")?.send()?;
//! let (a, b) = (a.response()?.into_bytes()?, b.response()?.into_bytes()?);
//! # Ok::<(), tern_sdk::FetchError>(())
//! ```
//!
//! Bodies stream both ways when asked: [`Outgoing::send_streaming`] gives an [`io::Write`]
//! for the request body, and [`Incoming::body`] is an [`io::Read`] of the response's.
//! Redirects are not followed.
//!
//! **Forwarding.** A proxy need not carry bodies itself: [`Outgoing::forward_request`] gives
//! the backend request the client's headers and body, and [`Pending::forward_response`] makes
//! the backend's response the guest's answer. The server then streams both bodies itself; they
//! never pass through the guest's memory, and the guest's instance is gone while the answer's
//! body is still flowing:
//!
//! ```no_run
//! use tern_sdk::outbound::Outgoing;
//! let req = tern_sdk::raw::method()?;
//! let method = tern_sdk::http::Method::from_bytes(&req).unwrap();
//! let mut out = Outgoing::to_backend(&method, "origin", "/")?;
//! out.forward_request()?;
//! out.header("x-via", b"tern")?;
//! out.send()?.forward_response()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![allow(unsafe_code)]

use std::io;

use crate::abi;
use crate::sys;

interface_error!(
    /// Why an outbound request failed: the host's error code and its message (what to change).
    FetchError,
    "outbound request",
    outbound_last_error,
    "The ABI error code ([`abi::errno`]): `DENIED`, `TIMEOUT`, `IO`, `LIMIT_EXCEEDED`, ..."
);

/// Hands the client's WebSocket to `backend`, one of the tenant's backends: once the guest
/// has answered, the server opens the backend's WebSocket with the client's request and the
/// headers of the guest's answer (an identity it checked, say), and relays the frames both
/// ways; the guest's instance is gone by then. The answer's status and body are not sent.
///
/// ```no_run
/// use tern_sdk::http::Response;
/// tern_sdk::serve(|req| {
///     if req.headers().get("authorization").is_none() {
///         return Response::builder().status(401).body(Vec::new()).unwrap();
///     }
///     match tern_sdk::outbound::handoff_websocket("chat") {
///         Ok(()) => Response::builder().header("x-user", "alice").body(Vec::new()).unwrap(),
///         Err(e) => Response::builder().status(502).body(e.to_string().into_bytes()).unwrap(),
///     }
/// });
/// ```
///
/// # Errors
/// `UNAVAILABLE` when the request opens no WebSocket, `DENIED` for a backend the tenant does
/// not have.
pub fn handoff_websocket(backend: &str) -> Result<(), FetchError> {
    // SAFETY: the host reads `backend.len()` bytes at its pointer.
    check(unsafe { sys::handoff_websocket(backend.as_ptr(), backend.len()) }).map(drop)
}

/// An outbound request handle, closed when dropped.
#[derive(Debug)]
struct Handle(i32);

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: no pointers.
        unsafe { sys::outbound_close(self.0) };
    }
}

/// An outbound request being built: add headers and body, then send it.
#[derive(Debug)]
pub struct Outgoing(Handle);

/// The request header a guest tells the tenant's cache what to do with a request to a
/// backend with `cache = true` (`pass`, `ttl=SECONDS`, `tag=NAME`, comma-separated); the
/// server takes it off before the backend sees it, and drops a client's own before the guest
/// sees it (for tenants with a cached backend).
pub const CACHE_HEADER: &str = "tern-cache";

impl Outgoing {
    fn new(method: &http::Method, backend: &str, url: &str) -> Result<Self, FetchError> {
        let m = method.as_str();
        // SAFETY: the three slices are valid for their lengths; the host only reads them.
        let h = check(unsafe {
            sys::outbound_request(
                m.as_ptr(),
                m.len(),
                backend.as_ptr(),
                backend.len(),
                url.as_ptr(),
                url.len(),
            )
        })?;
        Ok(Self(Handle(h as i32)))
    }

    /// A request to the tenant's backend `backend` at `path` (path and query, starting with
    /// `/`; appended to the backend's base path).
    ///
    /// # Errors
    /// `DENIED` for a backend the tenant does not have, `LIMIT_EXCEEDED` past the tenant's
    /// outbound requests per request.
    pub fn to_backend(
        method: &http::Method,
        backend: &str,
        path: &str,
    ) -> Result<Self, FetchError> {
        Self::new(method, backend, path)
    }

    /// A request to an absolute `http://` or `https://` URL; its host must be in the tenant's
    /// `outbound.allowed_hosts` and resolve to public addresses only.
    ///
    /// # Errors
    /// `DENIED` for a host not allowed or not public, `INVALID_ARGUMENT` for a bad URL, `IO`
    /// if the host cannot be resolved.
    pub fn to_url(method: &http::Method, url: &str) -> Result<Self, FetchError> {
        Self::new(method, "", url)
    }

    /// Adds a header (framing headers, `Host` and `CDN-Loop` are the server's and ignored).
    ///
    /// # Errors
    /// `INVALID_ARGUMENT` for a bad name or value, `LIMIT_EXCEEDED` past 100 headers.
    pub fn header(&mut self, name: &str, value: &[u8]) -> Result<(), FetchError> {
        // SAFETY: both slices are valid for their lengths; the host only reads them.
        check(unsafe {
            sys::outbound_header_append(
                self.0.0,
                name.as_ptr(),
                name.len(),
                value.as_ptr(),
                value.len(),
            )
        })
        .map(drop)
    }

    /// For a backend with `cache = true`: neither look this request up in the tenant's cache
    /// nor store its answer (the backend is always asked). Sent as `Tern-Cache: pass`, which
    /// the server takes off before the backend sees it.
    ///
    /// # Errors
    /// `LIMIT_EXCEEDED` past 100 headers.
    pub fn cache_pass(&mut self) -> Result<(), FetchError> {
        self.header(CACHE_HEADER, b"pass")
    }

    /// For a backend with `cache = true`: keep the answer for `seconds` (1 to a year)
    /// whatever its own `Cache-Control` and `Expires` say (not one marked `private` or
    /// `no-store`, or one that sets a cookie or varies on `*`). `Tern-Cache: ttl=N`; the
    /// server refuses the request with `INVALID_ARGUMENT` when `seconds` is out of range.
    ///
    /// # Errors
    /// `LIMIT_EXCEEDED` past 100 headers.
    pub fn cache_ttl(&mut self, seconds: u32) -> Result<(), FetchError> {
        self.header(CACHE_HEADER, format!("ttl={seconds}").as_bytes())
    }

    /// For a backend with `cache = true`: tag the stored answer with `tag` (besides its own
    /// `Surrogate-Key` and `Cache-Tag`), to purge it by (`tern cache purge --tag`). At most 16
    /// per request, each 1-128 visible ASCII characters without commas or quotes.
    /// `Tern-Cache: tag=NAME`.
    ///
    /// # Errors
    /// `LIMIT_EXCEEDED` past 100 headers.
    pub fn cache_tag(&mut self, tag: &str) -> Result<(), FetchError> {
        self.header(CACHE_HEADER, format!("tag={tag}").as_bytes())
    }

    /// Gives this request the client's headers (all but `Host`, `Content-Length` and the
    /// hop-by-hop ones, after any set already) and, once sent, the client's body, which the
    /// server streams to the backend as it arrives (with its length when the client gave one)
    /// without passing it through the guest. Send it with [`Outgoing::send`].
    ///
    /// # Errors
    /// `INVALID_ARGUMENT` if the guest has read from the request body, the body was forwarded
    /// before, or this request has a body of its own; `LIMIT_EXCEEDED` past 100 headers.
    pub fn forward_request(&mut self) -> Result<(), FetchError> {
        // SAFETY: no pointers.
        check(unsafe { sys::outbound_forward_request(self.0.0) }).map(drop)
    }

    /// Appends to the body, which is sent whole (with a `Content-Length`) by [`Outgoing::send`].
    ///
    /// # Errors
    /// `LIMIT_EXCEEDED` past the tenant's `outbound.max_request_bytes`.
    pub fn write_body(&mut self, bytes: &[u8]) -> Result<(), FetchError> {
        write_all(self.0.0, bytes)
    }

    /// Sends the request; its response is read from the returned [`Pending`].
    ///
    /// # Errors
    /// Only for misuse (the request was already sent).
    pub fn send(self) -> Result<Pending, FetchError> {
        // SAFETY: no pointers.
        check(unsafe { sys::outbound_send(self.0.0, 0) })?;
        Ok(Pending(self.0))
    }

    /// Sends the head now; the body follows through the returned writer (chunked), which
    /// [`StreamingBody::finish`] ends. Body bytes written before this are not sent.
    ///
    /// # Errors
    /// Only for misuse (the request was already sent).
    pub fn send_streaming(self) -> Result<StreamingBody, FetchError> {
        // SAFETY: no pointers.
        check(unsafe { sys::outbound_send(self.0.0, abi::OUTBOUND_STREAM_BODY) })?;
        Ok(StreamingBody(self.0))
    }
}

fn write_all(handle: i32, mut bytes: &[u8]) -> Result<(), FetchError> {
    while !bytes.is_empty() {
        // SAFETY: `bytes` is valid for its length; the host only reads it.
        let n = check(unsafe { sys::outbound_body_write(handle, bytes.as_ptr(), bytes.len()) })?;
        bytes = &bytes[n.min(bytes.len())..];
    }
    Ok(())
}

/// The body of a sent request, streaming to the backend as it is written.
#[derive(Debug)]
pub struct StreamingBody(Handle);

impl StreamingBody {
    /// Ends the body; the response is read from the returned [`Pending`].
    ///
    /// # Errors
    /// Only for misuse.
    pub fn finish(self) -> Result<Pending, FetchError> {
        // SAFETY: no pointers.
        check(unsafe { sys::outbound_body_finish(self.0.0) })?;
        Ok(Pending(self.0))
    }
}

impl io::Write for StreamingBody {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // SAFETY: `buf` is valid for its length; the host only reads it.
        Ok(check(unsafe {
            sys::outbound_body_write(self.0.0, buf.as_ptr(), buf.len())
        })?)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A sent request whose response has not been read yet.
#[derive(Debug)]
pub struct Pending(Handle);

impl Pending {
    /// Makes the backend's response the guest's answer: its status, its headers (hop-by-hop
    /// ones removed) added to any the guest set, and its body, which the server streams to the
    /// client after the guest has ended, within the tenant's `max_response_bytes` and the
    /// backend's total timeout. Waits for the response head; returns its status. Afterwards
    /// the guest may still change the status and add headers ([`crate::raw`]), but write no
    /// body.
    ///
    /// # Errors
    /// As [`Pending::response`]; `INVALID_ARGUMENT` if the guest has written a body, or
    /// forwarded a response before; `LIMIT_EXCEEDED` if the backend's headers pass the
    /// tenant's limits.
    pub fn forward_response(self) -> Result<http::StatusCode, FetchError> {
        // SAFETY: no pointers.
        let status = check(unsafe { sys::outbound_response_status(self.0.0) })?;
        // SAFETY: no pointers.
        check(unsafe { sys::response_forward(self.0.0) })?;
        Ok(http::StatusCode::from_u16(status as u16).unwrap_or(http::StatusCode::BAD_GATEWAY))
    }

    /// The response headers as `name NUL value NUL` pairs, waiting for the head.
    fn headers_blob(&self) -> Result<Vec<u8>, FetchError> {
        let handle = self.0.0;
        // SAFETY: the host writes at most `len` bytes at `buf`.
        crate::copy_out_with(
            |buf, len| unsafe { sys::outbound_response_headers(handle, buf, len) },
            1024,
        )
        .map_err(|e| FetchError {
            code: e.0,
            message: last_error(),
        })
    }

    /// The value of the response header `name` (lower case), waiting for the head; `None` if
    /// the backend sent none. Reads the headers without building a header map, for a guest
    /// that forwards the response and needs one fact of it first.
    ///
    /// # Errors
    /// As [`Pending::response`].
    pub fn response_header(&self, name: &str) -> Result<Option<Vec<u8>>, FetchError> {
        let blob = self.headers_blob()?;
        let mut fields = blob.split(|b| *b == 0);
        while let (Some(n), Some(value)) = (fields.next(), fields.next()) {
            if n == name.as_bytes() {
                return Ok(Some(value.to_vec()));
            }
        }
        Ok(None)
    }

    /// Waits for the response head.
    ///
    /// # Errors
    /// `TIMEOUT` past the backend's first-byte or total timeout, `IO` if it could not be
    /// reached or broke off.
    pub fn response(self) -> Result<Incoming, FetchError> {
        // SAFETY: no pointers.
        let status = check(unsafe { sys::outbound_response_status(self.0.0) })?;
        let blob = self.headers_blob()?;
        let mut headers = http::HeaderMap::new();
        let mut fields = blob.split(|b| *b == 0);
        while let (Some(name), Some(value)) = (fields.next(), fields.next()) {
            if let (Ok(n), Ok(v)) = (
                http::HeaderName::from_bytes(name),
                http::HeaderValue::from_bytes(value),
            ) {
                headers.append(n, v);
            }
        }
        Ok(Incoming {
            status: http::StatusCode::from_u16(status as u16)
                .unwrap_or(http::StatusCode::BAD_GATEWAY),
            headers,
            body: ResponseBody {
                handle: self.0,
                done: false,
            },
        })
    }
}

/// A backend's response: status and headers read, body on demand.
#[derive(Debug)]
pub struct Incoming {
    /// Its status.
    pub status: http::StatusCode,
    /// Its headers (hop-by-hop ones removed).
    pub headers: http::HeaderMap,
    /// Its body.
    pub body: ResponseBody,
}

impl Incoming {
    /// Reads the whole body.
    ///
    /// # Errors
    /// `LIMIT_EXCEEDED` past the tenant's `outbound.max_response_bytes`, `TIMEOUT`, `IO`.
    pub fn into_bytes(self) -> Result<Vec<u8>, FetchError> {
        self.body.into_bytes()
    }

    /// As an `http::Response` with the whole body.
    ///
    /// # Errors
    /// As [`Incoming::into_bytes`].
    pub fn into_response(self) -> Result<http::Response<Vec<u8>>, FetchError> {
        let (status, headers) = (self.status, self.headers);
        let mut resp = http::Response::new(self.body.into_bytes()?);
        *resp.status_mut() = status;
        *resp.headers_mut() = headers;
        Ok(resp)
    }
}

/// A response body, read from the backend as the guest asks for it.
#[derive(Debug)]
pub struct ResponseBody {
    handle: Handle,
    done: bool,
}

impl ResponseBody {
    /// The next bytes into `buf`; `Ok(0)` at the end.
    ///
    /// # Errors
    /// As [`Incoming::into_bytes`].
    pub fn read_chunk(&mut self, buf: &mut [u8]) -> Result<usize, FetchError> {
        if self.done || buf.is_empty() {
            return Ok(0);
        }
        // SAFETY: the host writes at most `buf.len()` bytes into `buf`.
        let n = check(unsafe {
            sys::outbound_response_body_read(self.handle.0, buf.as_mut_ptr(), buf.len())
        })?;
        self.done = n == 0;
        Ok(n)
    }

    /// Reads the rest of the body.
    ///
    /// # Errors
    /// As [`Incoming::into_bytes`].
    pub fn into_bytes(mut self) -> Result<Vec<u8>, FetchError> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = self.read_chunk(&mut buf)?;
            if n == 0 {
                return Ok(out);
            }
            out.extend_from_slice(&buf[..n]);
        }
    }
}

impl io::Read for ResponseBody {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        Ok(self.read_chunk(buf)?)
    }
}

fn send_whole<B: AsRef<[u8]>>(
    mut out: Outgoing,
    req: &http::Request<B>,
) -> Result<http::Response<Vec<u8>>, FetchError> {
    for (name, value) in req.headers() {
        out.header(name.as_str(), value.as_bytes())?;
    }
    out.write_body(req.body().as_ref())?;
    out.send()?.response()?.into_response()
}

/// Sends `req` to the absolute `http(s)://` URL in its URI and returns the whole response.
///
/// # Errors
/// See [`Outgoing::to_url`] and [`Incoming::into_bytes`].
pub fn fetch<B: AsRef<[u8]>>(req: http::Request<B>) -> Result<http::Response<Vec<u8>>, FetchError> {
    let out = Outgoing::to_url(req.method(), &req.uri().to_string())?;
    send_whole(out, &req)
}

/// Sends `req` to the tenant's backend `backend` (its URI is the path and query) and returns
/// the whole response.
///
/// # Errors
/// See [`Outgoing::to_backend`] and [`Incoming::into_bytes`].
pub fn fetch_backend<B: AsRef<[u8]>>(
    backend: &str,
    req: http::Request<B>,
) -> Result<http::Response<Vec<u8>>, FetchError> {
    let path = req.uri().path_and_query().map_or("/", |pq| pq.as_str());
    let out = Outgoing::to_backend(req.method(), backend, path)?;
    send_whole(out, &req)
}
