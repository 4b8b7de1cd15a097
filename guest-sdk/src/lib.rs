//! Write Tern request handlers in Rust.
//!
//! A Tern guest is a WASI preview1 command module: for every HTTP request the server
//! instantiates it afresh, runs its `main`, and throws it away. `main` hands a handler to
//! [`serve`], which reads the request from the host, calls the handler and writes its response.
//!
//! ```no_run
//! use tern_sdk::http::{Request, Response};
//! use tern_sdk::Body;
//!
//! fn hello(_req: Request<Body>) -> Response<Vec<u8>> {
//!     Response::builder()
//!         .header("content-type", "text/plain")
//!         .body(b"Hello from Tern!\n".to_vec())
//!         .unwrap()
//! }
//!
//! fn main() {
//!     tern_sdk::serve(hello);
//! }
//! ```
//!
//! Build it with `cargo build --target wasm32-wasip1 --release` and point a tenant's `module`
//! at the `.wasm` file. Nothing survives between requests: statics start at their initial value
//! every time.
//!
//! **Keep guests lean.** Tern instantiates and resets the guest for every request, so its cost
//! grows with the memory pages the guest touches. Rust gives wasm programs a 1 MiB stack placed
//! below their data; unless your handler recurses deeply, link with a 64 KiB one
//! (`RUSTFLAGS="-C link-arg=-zstack-size=65536"`, or `rustflags` under
//! `[target.wasm32-wasip1]` in `.cargo/config.toml`) — the SDK's examples do. Overflowing it
//! traps the guest (status 500); it never corrupts data. Likewise keep per-request buffers
//! small (16 KiB rather than 64 KiB) and reuse them: a guest that outgrows the memory it
//! starts with makes the server change page protections twice per request, which on a
//! multi-core server interrupts every core (the `proxy` example doubled its requests/s by
//! staying within its initial memory).
//!
//! Large bodies stream: [`Body`] implements [`std::io::Read`] and pulls the request body from
//! the host in chunks, and [`ResponseWriter`] implements [`std::io::Write`].

/// Defines the error of one interface of the ABI (its host's error code and the message its
/// `*_last_error` call gives, shown as "WHAT failed (CODE): message"), with the module's
/// `check` (a return value as a count, or that error) and `last_error`.
macro_rules! interface_error {
    ($(#[$doc:meta])* $name:ident, $what:literal, $last_error:ident, $codes:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct $name {
            #[doc = $codes]
            pub code: i32,
            /// The server's explanation.
            pub message: String,
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                let name = $crate::abi::errno::name(self.code);
                write!(f, concat!($what, " failed ({}): {}"), name, self.message)
            }
        }

        impl std::error::Error for $name {}

        impl From<$name> for std::io::Error {
            fn from(e: $name) -> Self {
                std::io::Error::other(e)
            }
        }

        /// `ret` as a count, or the failure with the host's message.
        fn check(ret: i32) -> Result<usize, $name> {
            usize::try_from(ret).map_err(|_| failure(ret))
        }

        /// The failure of a call that returned `code`, with the host's message.
        fn failure(code: i32) -> $name {
            $name {
                code,
                message: last_error(),
            }
        }

        /// The message of the last call of this interface that failed.
        fn last_error() -> String {
            // SAFETY: the host writes at most `len` bytes at `buf`.
            let bytes =
                $crate::copy_out_with(|buf, len| unsafe { $crate::sys::$last_error(buf, len) }, 256);
            bytes.map_or_else(
                |_| String::new(),
                |b| String::from_utf8_lossy(&b).into_owned(),
            )
        }
    };
}

pub mod abi;
pub mod cache;
pub mod config;
pub mod kv;
pub mod outbound;
pub mod rate_limit;
pub mod websocket;

pub use http;
pub use outbound::{FetchError, fetch, fetch_backend};

use std::io;

/// The raw host functions of ABI v1 (see `ABI.md`), declared once: imported from the host in
/// Wasm; outside it (where there is no Tern host) stand-ins that fail with `IO`, so the crate
/// and its examples build and their tests run anywhere.
macro_rules! host_functions {
    ($(fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> i32;)*) => {
        #[cfg(target_arch = "wasm32")]
        #[allow(unsafe_code, clippy::too_many_arguments)]
        mod sys {
            #[link(wasm_import_module = "tern")]
            unsafe extern "C" {
                $(pub fn $name($($arg: $ty),*) -> i32;)*
            }
        }

        #[cfg(not(target_arch = "wasm32"))]
        #[allow(unsafe_code, clippy::too_many_arguments, clippy::missing_safety_doc)]
        mod sys {
            $(
                pub unsafe extern "C" fn $name($(_: $ty),*) -> i32 {
                    super::abi::errno::IO
                }
            )*
        }
    };
}

host_functions! {
    fn request_method(buf: *mut u8, len: usize) -> i32;
    fn request_uri(buf: *mut u8, len: usize) -> i32;
    fn request_headers(buf: *mut u8, len: usize) -> i32;
    fn request_body_read(buf: *mut u8, len: usize) -> i32;
    fn response_set_status(status: i32) -> i32;
    fn response_header_append(
        name: *const u8,
        name_len: usize,
        value: *const u8,
        value_len: usize,
    ) -> i32;
    fn response_body_write(buf: *const u8, len: usize) -> i32;
    fn request_info(key: i32, buf: *mut u8, len: usize) -> i32;
    fn outbound_request(
        method: *const u8,
        method_len: usize,
        backend: *const u8,
        backend_len: usize,
        url: *const u8,
        url_len: usize,
    ) -> i32;
    fn outbound_header_append(
        handle: i32,
        name: *const u8,
        name_len: usize,
        value: *const u8,
        value_len: usize,
    ) -> i32;
    fn outbound_body_write(handle: i32, buf: *const u8, len: usize) -> i32;
    fn outbound_send(handle: i32, flags: i32) -> i32;
    fn outbound_body_finish(handle: i32) -> i32;
    fn outbound_response_status(handle: i32) -> i32;
    fn outbound_response_headers(handle: i32, buf: *mut u8, len: usize) -> i32;
    fn outbound_response_body_read(handle: i32, buf: *mut u8, len: usize) -> i32;
    fn outbound_close(handle: i32) -> i32;
    fn outbound_last_error(buf: *mut u8, len: usize) -> i32;
    fn outbound_forward_request(handle: i32) -> i32;
    fn response_forward(handle: i32) -> i32;
    fn handoff_websocket(backend: *const u8, backend_len: usize) -> i32;
    fn kv_open(name: *const u8, name_len: usize) -> i32;
    fn kv_get(store: i32, key: *const u8, key_len: usize, buf: *mut u8, len: usize) -> i32;
    fn kv_set(
        store: i32,
        key: *const u8,
        key_len: usize,
        value: *const u8,
        value_len: usize,
    ) -> i32;
    fn kv_delete(store: i32, key: *const u8, key_len: usize) -> i32;
    fn kv_exists(store: i32, key: *const u8, key_len: usize) -> i32;
    fn kv_increment(store: i32, key: *const u8, key_len: usize, delta: *mut i64) -> i32;
    fn kv_compare_and_swap(
        store: i32,
        key: *const u8,
        key_len: usize,
        old: *const u8,
        old_len: usize,
        new: *const u8,
        new_len: usize,
        flags: i32,
    ) -> i32;
    fn kv_list(store: i32, cursor: *const u8, cursor_len: usize, buf: *mut u8, len: usize) -> i32;
    fn kv_last_error(buf: *mut u8, len: usize) -> i32;
    fn config_get(name: *const u8, name_len: usize, buf: *mut u8, len: usize) -> i32;
    fn cache_lookup(
        key: *const u8,
        key_len: usize,
        headers: *const u8,
        headers_len: usize,
        flags: i32,
    ) -> i32;
    fn cache_state(handle: i32) -> i32;
    fn cache_body(handle: i32, buf: *mut u8, len: usize) -> i32;
    fn cache_age(handle: i32) -> i32;
    fn cache_insert(
        handle: i32,
        body: *const u8,
        body_len: usize,
        max_age: i32,
        stale_while_revalidate: i32,
        tags: *const u8,
        tags_len: usize,
        vary: *const u8,
        vary_len: usize,
    ) -> i32;
    fn cache_close(handle: i32) -> i32;
    fn cache_purge_tag(tag: *const u8, tag_len: usize, flags: i32) -> i32;
    fn cache_last_error(buf: *mut u8, len: usize) -> i32;
    fn rate_check(
        counter: *const u8,
        counter_len: usize,
        entry: *const u8,
        entry_len: usize,
        delta: i32,
        window: i32,
        limit: i32,
        penalty_box: *const u8,
        penalty_box_len: usize,
        ttl: i32,
    ) -> i32;
    fn rate_increment(
        counter: *const u8,
        counter_len: usize,
        entry: *const u8,
        entry_len: usize,
        delta: i32,
    ) -> i32;
    fn rate_lookup(
        counter: *const u8,
        counter_len: usize,
        entry: *const u8,
        entry_len: usize,
        window: i32,
    ) -> i32;
    fn rate_count(
        counter: *const u8,
        counter_len: usize,
        entry: *const u8,
        entry_len: usize,
        duration: i32,
    ) -> i32;
    fn penalty_add(
        penalty_box: *const u8,
        penalty_box_len: usize,
        entry: *const u8,
        entry_len: usize,
        ttl: i32,
    ) -> i32;
    fn penalty_has(
        penalty_box: *const u8,
        penalty_box_len: usize,
        entry: *const u8,
        entry_len: usize,
    ) -> i32;
    fn rate_last_error(buf: *mut u8, len: usize) -> i32;
    fn websocket_publish(publish: *const u8, publish_len: usize) -> i32;
    fn websocket_last_error(buf: *mut u8, len: usize) -> i32;
}

/// An error code returned by a host function (see [`abi::errno`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Error(pub i32);

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = abi::errno::name(self.0);
        write!(f, "tern host error {} ({name})", self.0)
    }
}

impl std::error::Error for Error {}

impl From<Error> for io::Error {
    fn from(e: Error) -> Self {
        io::Error::other(e)
    }
}

fn check(ret: i32) -> Result<usize, Error> {
    usize::try_from(ret).map_err(|_| Error(ret))
}

/// Calls a "copy into my buffer, tell me the full length" host function until the buffer fits.
#[allow(unsafe_code)]
fn copy_out(
    f: unsafe extern "C" fn(*mut u8, usize) -> i32,
    first_guess: usize,
) -> Result<Vec<u8>, Error> {
    // SAFETY: `f` is a copy-out host function: it writes at most `len` bytes at `buf`.
    copy_out_with(|buf, len| unsafe { f(buf, len) }, first_guess)
}

/// [`copy_out`] for a copy-out call that takes more than the buffer; `f(buf, len)` must write at
/// most `len` bytes at `buf` and return the value's full length or an error code.
#[allow(unsafe_code)]
fn copy_out_with(
    mut f: impl FnMut(*mut u8, usize) -> i32,
    first_guess: usize,
) -> Result<Vec<u8>, Error> {
    let mut buf = Vec::with_capacity(first_guess);
    loop {
        // The host writes at most `capacity` bytes into the spare capacity.
        let full = check(f(buf.as_mut_ptr(), buf.capacity()))?;
        if full <= buf.capacity() {
            // SAFETY: the host initialised the first `full` bytes.
            unsafe { buf.set_len(full) };
            return Ok(buf);
        }
        buf.reserve_exact(full);
    }
}

/// A copy-out call's value (see [`copy_out_with`]), `None` when it answers `NOT_FOUND`; any
/// other error code as `Err`.
fn copy_out_found(
    f: impl FnMut(*mut u8, usize) -> i32,
    first_guess: usize,
) -> Result<Option<Vec<u8>>, i32> {
    match copy_out_with(f, first_guess) {
        Ok(value) => Ok(Some(value)),
        Err(Error(abi::errno::NOT_FOUND)) => Ok(None),
        Err(Error(code)) => Err(code),
    }
}

/// Low-level, safe wrappers of each host function, for handlers that want full control.
pub mod raw {
    #![allow(unsafe_code)]
    use super::{Error, check, copy_out, copy_out_with, sys};

    /// The request method, e.g. `GET`.
    ///
    /// # Errors
    /// Only if called outside a Tern guest.
    pub fn method() -> Result<Vec<u8>, Error> {
        copy_out(sys::request_method, 16)
    }

    /// The request target: path and query, e.g. `/echo?x=1`.
    ///
    /// # Errors
    /// Only if called outside a Tern guest.
    pub fn uri() -> Result<Vec<u8>, Error> {
        copy_out(sys::request_uri, 256)
    }

    /// Every request header as `name NUL value NUL` pairs.
    ///
    /// # Errors
    /// Only if called outside a Tern guest.
    pub fn headers() -> Result<Vec<u8>, Error> {
        copy_out(sys::request_headers, 1024)
    }

    /// One value of the request's context: `key` is an [`abi::info`](crate::abi::info) key.
    ///
    /// # Errors
    /// `UNAVAILABLE` if this request has no such value (e.g. TLS details over plain HTTP),
    /// `INVALID_ARGUMENT` if the server does not know the key.
    pub fn info(key: i32) -> Result<Vec<u8>, Error> {
        // SAFETY: the host writes at most `len` bytes at `buf`.
        copy_out_with(|buf, len| unsafe { sys::request_info(key, buf, len) }, 64)
    }

    /// Reads the next bytes of the request body into `buf`; `Ok(0)` at its end.
    ///
    /// # Errors
    /// [`abi::errno::IO`](crate::abi::errno::IO) if the client's body failed mid-stream.
    pub fn body_read(buf: &mut [u8]) -> Result<usize, Error> {
        // SAFETY: the host writes at most `buf.len()` bytes into `buf`.
        check(unsafe { sys::request_body_read(buf.as_mut_ptr(), buf.len()) })
    }

    /// Sets the response status.
    ///
    /// # Errors
    /// `INVALID_ARGUMENT` outside 100-999, `HEADERS_SENT` once the body has started streaming.
    pub fn set_status(status: u16) -> Result<(), Error> {
        // SAFETY: no pointers are passed.
        check(unsafe { sys::response_set_status(i32::from(status)) }).map(drop)
    }

    /// Appends a response header.
    ///
    /// # Errors
    /// `INVALID_ARGUMENT` for an invalid name or value, `HEADERS_SENT` once the body has
    /// started streaming, `LIMIT_EXCEEDED` past the tenant's header limit.
    pub fn header_append(name: &[u8], value: &[u8]) -> Result<(), Error> {
        // SAFETY: both slices are valid for their lengths; the host only reads them.
        check(unsafe {
            sys::response_header_append(name.as_ptr(), name.len(), value.as_ptr(), value.len())
        })
        .map(drop)
    }

    /// Appends bytes to the response body.
    ///
    /// # Errors
    /// `LIMIT_EXCEEDED` past the tenant's body limit, `IO` if the client went away.
    pub fn body_write(buf: &[u8]) -> Result<usize, Error> {
        // SAFETY: `buf` is valid for its length; the host only reads it.
        check(unsafe { sys::response_body_write(buf.as_ptr(), buf.len()) })
    }
}

/// The request's context beyond its message: who is asking, where the tenant is mounted, the
/// full URL (ABI `request_info`, see `ABI.md`). Each function asks the host once; `None` means
/// the request has no such value (or the guest runs outside Tern).
///
/// ```no_run
/// use tern_sdk::context;
/// // A tenant mounted at `/api`, asked for `/api/users/7?full=1`:
/// assert_eq!(context::route_prefix().as_deref(), Some("/api"));
/// assert_eq!(context::path_info().as_deref(), Some("/users/7"));
/// ```
pub mod context {
    use crate::abi::info;

    fn text(key: i32) -> Option<String> {
        String::from_utf8(super::raw::info(key).ok()?).ok()
    }

    /// The client's address (IP and port; port 0 when a trusted proxy in front forwarded
    /// only its IP).
    pub fn client_addr() -> Option<std::net::SocketAddr> {
        let ip = text(info::CLIENT_IP)?.parse().ok()?;
        let port = text(info::CLIENT_PORT)
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        Some(std::net::SocketAddr::new(ip, port))
    }

    /// The id Tern gave this request (its `x-request-id` response header too).
    pub fn request_id() -> Option<String> {
        text(info::REQUEST_ID)
    }

    /// The path prefix the tenant is mounted at, without a trailing slash (`/api`); empty for
    /// a tenant at `/`.
    pub fn route_prefix() -> Option<String> {
        text(info::ROUTE_PREFIX)
    }

    /// The path below [`route_prefix`]: empty or starting with `/`, without the query.
    pub fn path_info() -> Option<String> {
        text(info::PATH_INFO)
    }

    /// `http` or `https`.
    pub fn scheme() -> Option<String> {
        text(info::SCHEME)
    }

    /// The host the client asked for, with its port if it gave one.
    pub fn host() -> Option<String> {
        text(info::HOST)
    }

    /// The full URL of the request: scheme, host, path and query.
    pub fn url() -> Option<String> {
        text(info::URL)
    }

    /// `HTTP/1.0`, `HTTP/1.1` or `HTTP/2`.
    pub fn http_version() -> Option<String> {
        text(info::HTTP_VERSION)
    }

    /// The TLS version of the client's connection (`None` over plain HTTP).
    pub fn tls_protocol() -> Option<String> {
        text(info::TLS_PROTOCOL)
    }

    /// The server name the client sent in its TLS handshake (`None` over plain HTTP).
    pub fn tls_sni() -> Option<String> {
        text(info::TLS_SNI)
    }

    /// The tenant's name.
    pub fn tenant() -> Option<String> {
        text(info::TENANT)
    }

    /// The W3C `traceparent` of this guest's span when the server exports traces (`None`
    /// when it does not): put it in your own log lines, or send it on, to join them to the
    /// trace.
    pub fn traceparent() -> Option<String> {
        text(info::TRACEPARENT)
    }
}

/// The request body, read from the host in chunks as the handler asks for it.
#[derive(Debug, Default)]
pub struct Body {
    done: bool,
}

impl Body {
    /// Reads the rest of the body into memory.
    ///
    /// # Errors
    /// If the client's body fails mid-stream.
    pub fn into_bytes(mut self) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        io::Read::read_to_end(&mut self, &mut out)?;
        Ok(out)
    }
}

impl io::Read for Body {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.done || buf.is_empty() {
            return Ok(0);
        }
        let n = raw::body_read(buf)?;
        self.done = n == 0;
        Ok(n)
    }
}

/// A response body that streams to the client as it is written.
///
/// Obtain one with [`ResponseWriter::start`]; the status and headers are fixed by then.
#[derive(Debug)]
pub struct ResponseWriter(());

impl ResponseWriter {
    /// Sends the status and headers of `head`; the body follows through [`io::Write`].
    ///
    /// # Errors
    /// If the host refuses the status or a header (see [`raw::header_append`]).
    pub fn start(head: &http::response::Parts) -> Result<Self, Error> {
        raw::set_status(head.status.as_u16())?;
        for (name, value) in &head.headers {
            raw::header_append(name.as_str().as_bytes(), value.as_bytes())?;
        }
        Ok(Self(()))
    }
}

impl io::Write for ResponseWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        Ok(raw::body_write(buf)?)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Builds the incoming request from the host.
///
/// # Errors
/// Only if called outside a Tern guest or the host sent something that is not HTTP.
pub fn request() -> Result<http::Request<Body>, Error> {
    let invalid = |_| Error(abi::errno::INVALID_ARGUMENT);
    let method = http::Method::from_bytes(&raw::method()?).map_err(invalid)?;
    let uri = http::Uri::try_from(raw::uri()?).map_err(|_| Error(abi::errno::INVALID_ARGUMENT))?;
    let mut builder = http::Request::builder().method(method).uri(uri);
    let headers = raw::headers()?;
    let mut fields = headers.split(|b| *b == 0);
    while let (Some(name), Some(value)) = (fields.next(), fields.next()) {
        builder = builder.header(name, value);
    }
    builder
        .body(Body::default())
        .map_err(|_| Error(abi::errno::INVALID_ARGUMENT))
}

/// Sends a complete response to the host.
///
/// # Errors
/// If the host refuses the status, a header, or the body (see [`raw`]).
pub fn respond<B: AsRef<[u8]>>(response: http::Response<B>) -> Result<(), Error> {
    let (head, body) = response.into_parts();
    ResponseWriter::start(&head)?;
    let mut rest = body.as_ref();
    while !rest.is_empty() {
        let n = raw::body_write(rest)?;
        rest = &rest[n..];
    }
    Ok(())
}

/// Runs `handler` on the current request and sends its response: the whole of a guest's `main`.
///
/// If the handler's response cannot be sent (for example it exceeds the tenant's limits),
/// the guest exits with status 1 and the client gets `500`.
pub fn serve<B, F>(handler: F)
where
    B: AsRef<[u8]>,
    F: FnOnce(http::Request<Body>) -> http::Response<B>,
{
    let result = request().and_then(|req| respond(handler(req)));
    if let Err(e) = result {
        eprintln!("tern-sdk: {e}");
        std::process::exit(1);
    }
}
