//! The `cgi` guest kind: an unmodified WASI preview1 program answers a request as a CGI script
//! (RFC 3875).
//!
//! The program gets the request's meta-variables in its environment ([`env()`]) and WAGI's
//! arguments (the path, then the query split at `&`: [`args`]), reads the body
//! on stdin and writes its answer to stdout: a header block (`Content-Type`, `Status`,
//! `Location` and any other header, one `Name: value` per line), a blank line, the body. Tenants
//! of this kind are linked with `fd_read` and `fd_write` replaced for stdin and stdout: stdin
//! reads the client's body as it streams in (within the tenant's body limit, never buffered
//! whole) and stdout feeds the header parser, then the same response the `tern` ABI writes,
//! which buffers up to 64 KiB and streams beyond. Stderr is captured for the log as for every
//! guest. Output that does not start with a well-formed header block ends the request with
//! `502` and says why.

use bytes::BytesMut;
use http::{HeaderName, HeaderValue, StatusCode};
use wasmtime::{Caller, Linker};
use wasmtime_wasi::p2::OutputStream;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;

use super::fs::{self, FilesView, errno, get_u32, put, scatter, slice};
use crate::context::{self, RequestContext};
use crate::guest::request::BodyError;
use crate::guest::{GuestRequest, GuestResponse, HeaderError, WriteError};

const MODULE: &str = "wasi_snapshot_preview1";

/// Largest header block a program may write before its blank line. A header block is a few
/// hundred bytes; this bounds what one request buffers before it knows its status.
pub const MAX_HEADER_BLOCK: usize = 64 * 1024;

/// Bytes one `fd_read` of stdin hands the program at most (the rest of a larger chunk of the
/// client's body waits for the next read).
const READ_CHUNK: usize = 64 * 1024;

/// WASI errnos used only here.
const EIO: i32 = 29;
const EFBIG: i32 = 22;
const EPIPE: i32 = 64;

/// One request's CGI output: the header block until its blank line, then the body.
#[derive(Debug, Default)]
pub struct Cgi {
    /// Header bytes seen so far, until the blank line ends them.
    head: BytesMut,
    /// Whether the header block has ended (what follows is the body).
    pub in_body: bool,
    /// Why the output is not a CGI response; the request then fails with `502`.
    pub malformed: Option<String>,
}

impl Cgi {
    /// How the run ends for output that is not a complete CGI response, if it is not: called
    /// when the program has ended. A header block cut off by the end of the output is taken
    /// as complete when it ends at a line's end (the body is then empty).
    pub fn finish(&mut self, response: &mut GuestResponse) -> Option<String> {
        if let Some(why) = &self.malformed {
            return Some(why.clone());
        }
        if self.in_body {
            return None;
        }
        if self.head.is_empty() {
            return Some(
                "the CGI program wrote nothing to stdout; a CGI response starts with headers \
                 (e.g. `Content-Type: text/plain`), then a blank line, then the body"
                    .into(),
            );
        }
        if !self.head.ends_with(b"\n") {
            return Some(format!(
                "the CGI program's output ended inside its header block: {:?}",
                preview(&self.head)
            ));
        }
        let head = self.head.split().freeze();
        self.in_body = true;
        apply_headers(&head, response).err()
    }
}

/// A program's arguments, as WAGI (and Spin's WAGI executor) gives them: the request's path,
/// then the query string split at each `&` (not decoded), e.g. `/cgi/run?a=1&b` gives
/// `["/cgi/run", "a=1", "b"]`; no query, no arguments after the path.
pub fn args(request: &GuestRequest) -> Vec<String> {
    let mut args = vec![request.uri.path().to_string()];
    if let Some(q) = request.uri.query().filter(|q| !q.is_empty()) {
        args.extend(q.split('&').map(str::to_string));
    }
    args
}

/// The RFC 3875 meta-variables of a request (and WAGI's `X_*` additions), followed by the
/// tenant's variables (`api_key` as `API_KEY`: a CGI program's environment is how it is
/// configured) and its own environment (`own`, with the entries taken from variables), neither
/// of which can override what comes before.
pub fn env(
    request: &GuestRequest,
    variables: &[(String, String)],
    own: &[(String, String)],
) -> Vec<(String, String)> {
    let ctx: &RequestContext = &request.context;
    let path = request.uri.path();
    // SCRIPT_NAME is the route prefix without a trailing `/`, and PATH_INFO the rest, which
    // is empty or starts with `/` (RFC 3875 4.1.5, 4.1.13).
    let prefix = &path[..ctx.prefix_len.min(path.len())];
    let (script, info) = path.split_at(prefix.trim_end_matches('/').len());
    let mut vars: Vec<(String, String)> = Vec::with_capacity(24 + request.headers.len());
    let mut set = |k: &str, v: String| vars.push((k.to_string(), v));
    set("GATEWAY_INTERFACE", "CGI/1.1".into());
    set(
        "SERVER_SOFTWARE",
        concat!("tern/", env!("CARGO_PKG_VERSION")).into(),
    );
    set(
        "SERVER_PROTOCOL",
        // RFC 3875 4.1.16: `HTTP/major.minor`, so HTTP/2 is `HTTP/2.0` (as Apache gives it;
        // Go's net/http/cgi refuses `HTTP/2`).
        match ctx.version {
            http::Version::HTTP_09 => "HTTP/0.9",
            http::Version::HTTP_10 => "HTTP/1.0",
            http::Version::HTTP_2 => "HTTP/2.0",
            http::Version::HTTP_3 => "HTTP/3.0",
            _ => "HTTP/1.1",
        }
        .into(),
    );
    set("REQUEST_METHOD", request.method.as_str().into());
    set("SCRIPT_NAME", script.into());
    set("PATH_INFO", percent_decode(info));
    // What WAGI (Spin's CGI executor) adds, so its programs move unchanged.
    set("PATH_TRANSLATED", percent_decode(info));
    set("X_RAW_PATH_INFO", info.into());
    set("X_MATCHED_ROUTE", format!("{script}/..."));
    set("QUERY_STRING", request.uri.query().unwrap_or("").into());
    set(
        "REQUEST_URI",
        request
            .uri
            .path_and_query()
            .map_or("/", |pq| pq.as_str())
            .into(),
    );
    let client = ctx.client().ip();
    set("REMOTE_ADDR", client.to_string());
    set("REMOTE_HOST", client.to_string());
    // Unknown behind a proxy that forwarded only the client's IP: left out.
    if ctx.client().port() != 0 {
        set("REMOTE_PORT", ctx.client().port().to_string());
    }
    let host =
        String::from_utf8_lossy(context::host(&request.uri, &request.headers).unwrap_or_default())
            .into_owned();
    let (name, port) = context::server_name_port(ctx, &request.uri, &request.headers);
    set(
        "X_FULL_URL",
        String::from_utf8_lossy(&context::url(ctx, &request.uri, &request.headers)).into_owned(),
    );
    set("SERVER_NAME", name);
    set("SERVER_PORT", port.to_string());
    set("REQUEST_SCHEME", ctx.scheme().into());
    if ctx.conn.tls.is_some() {
        // What Apache and nginx set for CGI programs served over TLS.
        set("HTTPS", "on".into());
    }
    set(
        "TERN_REQUEST_ID",
        ctx.request_id.to_str().unwrap_or("").into(),
    );
    if let Some(t) = request.headers.get(http::header::CONTENT_TYPE) {
        set("CONTENT_TYPE", String::from_utf8_lossy(t.as_bytes()).into());
    }
    if let Some(n) = crate::body::declared_length(&request.headers) {
        set("CONTENT_LENGTH", n.to_string());
    }
    // An HTTP/2 request names its host in `:authority`, not `Host`: programs read HTTP_HOST.
    if !request.headers.contains_key(http::header::HOST) && !host.is_empty() {
        set("HTTP_HOST", host.clone());
    }
    // HTTP_*: every header but the two above and `Proxy` (a client's `Proxy` header must not
    // become the program's HTTP_PROXY, CVE-2016-5385 "httpoxy"). Repeated headers are joined.
    // Only names of letters, digits and `-` (RFC 3875 4.1.18 maps `-` to `_`): `X_User` would
    // otherwise pass as `X-User`'s HTTP_X_USER, so such headers are left out (as Apache and
    // nginx do).
    for name in request.headers.keys() {
        if matches!(
            name.as_str(),
            "content-type" | "content-length" | "proxy" | "connection"
        ) || !name
            .as_str()
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-')
        {
            continue;
        }
        let value = request
            .headers
            .get_all(name)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect::<Vec<_>>()
            .join(if name == http::header::COOKIE {
                "; "
            } else {
                ", "
            });
        let key = format!(
            "HTTP_{}",
            name.as_str().to_ascii_uppercase().replace('-', "_")
        );
        set(&key, value);
    }
    for (k, v) in variables {
        let k = k.to_ascii_uppercase();
        if !vars.iter().any(|(known, _)| *known == k) {
            vars.push((k, v.clone()));
        }
    }
    for (k, v) in own {
        if !vars.iter().any(|(known, _)| known == k) {
            vars.push((k.clone(), v.clone()));
        }
    }
    vars
}

/// `%XX` decoded (RFC 3875 4.1.5: PATH_INFO is not URL-encoded); the raw path if the result
/// would not be UTF-8 or would hold a NUL.
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%'
            && i + 2 < b.len()
            && let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2]))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    // A NUL would cut the variable short for the program (environment strings end at one):
    // `/file.txt%00.sh` must not reach it as `/file.txt`.
    match String::from_utf8(out) {
        Ok(decoded) if !decoded.contains('\0') => decoded,
        _ => s.to_string(),
    }
}

/// The start of `bytes` for a message.
fn preview(bytes: &[u8]) -> String {
    let end = bytes.len().min(80);
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// Where the header block ends in `head`: the index after its blank line.
fn header_end(head: &[u8]) -> Option<usize> {
    let mut line_start = 0;
    for (i, &c) in head.iter().enumerate() {
        if c == b'\n' {
            let line = &head[line_start..i];
            if line.is_empty() || line == b"\r" {
                return Some(i + 1);
            }
            line_start = i + 1;
        }
    }
    None
}

/// Applies a complete header block (its lines, LF or CRLF, with or without the blank line) to
/// `response`: `Status: NNN reason` sets the status, `Location` without a `Status` makes it
/// `302`, every other line is a response header.
///
/// # Errors
/// Why the block is not a CGI header block.
fn apply_headers(head: &[u8], response: &mut GuestResponse) -> Result<(), String> {
    let mut status = None;
    let mut location = false;
    for (n, line) in head.split(|&c| c == b'\n').enumerate() {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            continue;
        }
        let bad = || {
            if n == 0 {
                format!(
                    "the CGI program's output must start with headers (e.g. `Content-Type: \
                     text/plain`) and a blank line before the body; its first line was {:?}",
                    preview(line)
                )
            } else {
                format!(
                    "line {} of the CGI program's header block is not `Name: value`: {:?}",
                    n + 1,
                    preview(line)
                )
            }
        };
        let colon = line.iter().position(|&c| c == b':').ok_or_else(bad)?;
        let name = HeaderName::from_bytes(&line[..colon]).map_err(|_| bad())?;
        let value = line[colon + 1..].trim_ascii();
        let value = HeaderValue::from_bytes(value).map_err(|_| bad())?;
        if name.as_str() == "status" {
            let code = value
                .as_bytes()
                .get(..3)
                .and_then(|c| std::str::from_utf8(c).ok())
                .and_then(|c| c.parse::<u16>().ok())
                .and_then(|c| StatusCode::from_u16(c).ok())
                .filter(|_| value.len() == 3 || value.as_bytes()[3] == b' ');
            status = Some(code.ok_or_else(|| {
                format!(
                    "the CGI program's `Status` header is not a three-digit status: {:?}",
                    preview(value.as_bytes())
                )
            })?);
            continue;
        }
        location |= name == http::header::LOCATION;
        match response.append_header(name, value) {
            Ok(()) => {}
            Err(HeaderError::Limit) => {
                return Err(format!(
                    "the CGI program's headers exceed this tenant's limits ({} headers, a \
                     content-length of at most {} bytes)",
                    response.max_headers, response.max_bytes
                ));
            }
            _ => return Err(bad()),
        }
    }
    response.status = status.unwrap_or(if location {
        StatusCode::FOUND
    } else {
        StatusCode::OK
    });
    Ok(())
}

/// What these functions reach of a request's store, beside its files.
pub trait CgiView: FilesView {
    /// The CGI output parser (none: the guest is not a CGI program) and the response it
    /// writes.
    fn cgi(&mut self) -> (Option<&mut Cgi>, &mut GuestResponse);
    /// The request whose body is the program's stdin.
    fn stdin(&mut self) -> &mut GuestRequest;
    /// Where the program's stderr is captured.
    fn stderr(&mut self) -> &MemoryOutputPipe;
}

/// Takes `bytes` the program wrote to stdout: header bytes until the blank line, then body.
/// Returns the WASI errno of the write, or `Ok` when all was taken.
async fn stdout(state: &mut impl CgiView, bytes: &[u8]) -> Result<(), i32> {
    let (Some(cgi), response) = state.cgi() else {
        return Err(errno::BADF);
    };
    let body = if cgi.in_body {
        bytes
    } else {
        if cgi.malformed.is_some() {
            return Err(EIO);
        }
        let seen = cgi.head.len();
        cgi.head.extend_from_slice(bytes);
        let Some(end) = header_end(&cgi.head) else {
            if cgi.head.len() > MAX_HEADER_BLOCK {
                cgi.malformed = Some(format!(
                    "the CGI program's header block passed {MAX_HEADER_BLOCK} bytes without \
                     the blank line that ends it"
                ));
                return Err(EIO);
            }
            // A first line that cannot be a header fails now, not at the end of the output.
            if let Some(nl) = cgi.head.iter().position(|&c| c == b'\n')
                && let Err(why) = apply_headers(&cgi.head[..nl], &mut dry_run(response))
            {
                cgi.malformed = Some(why);
                return Err(EIO);
            }
            return Ok(());
        };
        let head = cgi.head.split().freeze();
        cgi.in_body = true;
        if let Err(why) = apply_headers(&head[..end], response) {
            cgi.malformed = Some(why);
            return Err(EIO);
        }
        &bytes[end - seen..]
    };
    if body.is_empty() {
        return Ok(());
    }
    response.write(body).await.map_err(|e| match e {
        // (A CGI program has no way to forward a backend's body.)
        WriteError::Limit | WriteError::Forwarded => EFBIG,
        WriteError::ClientGone => EPIPE,
    })
}

/// A throwaway response with `real`'s limits, to check a header line without applying it.
fn dry_run(real: &GuestResponse) -> GuestResponse {
    let (commit, _) = tokio::sync::oneshot::channel();
    GuestResponse::new(real.max_bytes, real.max_headers, commit)
}

/// The bytes of the guest's iovec list `iovs`/`iovs_len`, copied out.
fn gather(data: &mut [u8], iovs: i32, iovs_len: i32) -> Result<Vec<u8>, i32> {
    let mut out = Vec::new();
    for i in 0..iovs_len as u32 {
        let at = (iovs as u32).checked_add(i * 8).ok_or(errno::FAULT)? as i32;
        let (ptr, len) = (get_u32(data, at)?, get_u32(data, at + 4)? as usize);
        out.extend_from_slice(slice(data, ptr as i32, len)?);
    }
    Ok(out)
}

/// Replaces `fd_read` and `fd_write` in `linker` for CGI programs: stdin is the request body,
/// stdout the CGI response, stderr the captured log stream; other descriptors are the tenant's
/// read-only `/assets` files when `assets`, else there are none.
///
/// # Errors
/// Only if wasmtime rejects a definition (a bug).
pub fn add_to_linker<T: CgiView>(linker: &mut Linker<T>, assets: bool) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    linker.func_wrap_async(
        MODULE,
        "fd_write",
        |mut caller: Caller<'_, T>, (fd, iovs, iovs_len, nwritten): (i32, i32, i32, i32)| {
            Box::new(async move {
                let Some(memory) = caller.data().memory() else {
                    return Ok(errno::FAULT);
                };
                let (data, state) = memory.data_and_store_mut(&mut caller);
                let bytes = match gather(data, iovs, iovs_len) {
                    Ok(b) => b,
                    Err(e) => return Ok(e),
                };
                let result = match fd {
                    1 => stdout(state, &bytes).await,
                    2 => {
                        // Captured up to the tenant's `stdio_bytes`; the rest is dropped (the
                        // log line says it was truncated), never an error for the program.
                        let mut pipe = state.stderr().clone();
                        let _ = pipe.write(bytes::Bytes::copy_from_slice(&bytes));
                        Ok(())
                    }
                    _ => Err(errno::BADF),
                };
                if let Err(e) = result {
                    return Ok(e);
                }
                let data = memory.data_mut(&mut caller);
                Ok(
                    match put(data, nwritten, &(bytes.len() as u32).to_le_bytes()) {
                        Ok(()) => errno::SUCCESS,
                        Err(e) => e,
                    },
                )
            })
        },
    )?;
    linker.func_wrap_async(
        MODULE,
        "fd_read",
        move |mut caller: Caller<'_, T>, (fd, iovs, iovs_len, nread): (i32, i32, i32, i32)| {
            Box::new(async move {
                let Some(memory) = caller.data().memory() else {
                    return Ok(errno::FAULT);
                };
                if fd != 0 {
                    let (data, state) = memory.data_and_store_mut(&mut caller);
                    return Ok(if assets {
                        match fs::read(data, state.files(), fd, iovs, iovs_len, nread) {
                            Ok(()) => errno::SUCCESS,
                            Err(e) => e,
                        }
                    } else {
                        errno::BADF
                    });
                }
                // How much the program's buffers take, so no byte read is lost.
                let room = {
                    let data = memory.data_mut(&mut caller);
                    let mut room = 0usize;
                    for i in 0..iovs_len as u32 {
                        let Some(at) = (iovs as u32).checked_add(i * 8) else {
                            return Ok(errno::FAULT);
                        };
                        match get_u32(data, at as i32 + 4) {
                            Ok(len) => room = room.saturating_add(len as usize),
                            Err(e) => return Ok(e),
                        }
                    }
                    room.min(READ_CHUNK)
                };
                let chunk = if room == 0 {
                    bytes::Bytes::new()
                } else {
                    match caller.data_mut().stdin().read_up_to(room).await {
                        Ok(c) => c,
                        // Past the body limit (the client gets 413) or a broken body (400).
                        Err(BodyError::TooLarge | BodyError::Failed) => return Ok(EIO),
                    }
                };
                let data = memory.data_mut(&mut caller);
                let n = match scatter(data, iovs, iovs_len, &chunk) {
                    Ok(n) => n,
                    Err(e) => return Ok(e),
                };
                Ok(match put(data, nread, &(n as u32).to_le_bytes()) {
                    Ok(()) => errno::SUCCESS,
                    Err(e) => e,
                })
            })
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response() -> super::GuestResponse {
        let (commit, _) = tokio::sync::oneshot::channel();
        super::GuestResponse::new(1 << 20, 100, commit)
    }

    #[test]
    fn header_blocks_end_at_the_first_blank_line() {
        assert_eq!(header_end(b"A: b\n\nbody"), Some(6));
        assert_eq!(header_end(b"A: b\r\n\r\nbody"), Some(8));
        assert_eq!(header_end(b"A: b\r\nC: d\n\n"), Some(12));
        assert_eq!(header_end(b"A: b\r\n"), None);
        assert_eq!(header_end(b"\nbody"), Some(1));
    }

    #[test]
    fn status_location_and_headers_are_applied() {
        let mut r = response();
        apply_headers(b"Status: 404 Not Found\nContent-Type: text/plain\n", &mut r).unwrap();
        assert_eq!(r.status, StatusCode::NOT_FOUND);
        assert_eq!(r.headers["content-type"], "text/plain");

        let mut r = response();
        apply_headers(b"Location: /elsewhere\r\n", &mut r).unwrap();
        assert_eq!(r.status, StatusCode::FOUND);
        assert_eq!(r.headers["location"], "/elsewhere");

        let mut r = response();
        apply_headers(b"Status: 201\nLocation: /new\n", &mut r).unwrap();
        assert_eq!(r.status, StatusCode::CREATED);
    }

    #[test]
    fn malformed_header_blocks_say_why() {
        let e = apply_headers(b"Hello, world\n", &mut response()).unwrap_err();
        assert!(e.contains("must start with headers"), "{e}");
        let e =
            apply_headers(b"Content-Type: text/plain\nno colon\n", &mut response()).unwrap_err();
        assert!(e.contains("line 2"), "{e}");
        let e = apply_headers(b"Status: abc\n", &mut response()).unwrap_err();
        assert!(e.contains("three-digit"), "{e}");
        let e = apply_headers(b"Status: 2000\n", &mut response()).unwrap_err();
        assert!(e.contains("three-digit"), "{e}");
    }

    fn env_of(
        uri: &str,
        prefix_len: usize,
        version: http::Version,
        headers: &[(&str, &str)],
    ) -> Vec<(String, String)> {
        let mut map = http::HeaderMap::new();
        for (k, v) in headers {
            map.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        let addr = "127.0.0.1:4000".parse().unwrap();
        let context = RequestContext {
            conn: crate::context::Connection::plain(addr),
            client: addr,
            request_id: HeaderValue::from_static("r1"),
            prefix_len,
            version,
            trace: None,
            timeout: None,
            trigger: crate::trigger::Trigger::Request,
        };
        let request = super::GuestRequest::new(
            http::Method::GET,
            uri.parse().unwrap(),
            map,
            crate::guest::RequestBody::Empty,
            1000,
            context,
        );
        env(
            &request,
            &[("request_method".into(), "not this".into())],
            &[],
        )
    }

    fn var<'a>(vars: &'a [(String, String)], key: &str) -> Option<&'a str> {
        vars.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    #[test]
    fn meta_variables_follow_rfc_3875_grammar() {
        // HTTP/2 is `HTTP/2.0` (`HTTP/x.y`); its host comes from `:authority` as HTTP_HOST.
        let v = env_of(
            "http://example.com:8080/cgi/run?a=1",
            4,
            http::Version::HTTP_2,
            &[],
        );
        assert_eq!(var(&v, "SERVER_PROTOCOL"), Some("HTTP/2.0"));
        assert_eq!(var(&v, "HTTP_HOST"), Some("example.com:8080"));
        assert_eq!(var(&v, "SERVER_NAME"), Some("example.com"));
        assert_eq!(var(&v, "SERVER_PORT"), Some("8080"));
        assert_eq!(var(&v, "SCRIPT_NAME"), Some("/cgi"));
        assert_eq!(var(&v, "PATH_INFO"), Some("/run"));
        for (version, text) in [
            (http::Version::HTTP_10, "HTTP/1.0"),
            (http::Version::HTTP_11, "HTTP/1.1"),
            (http::Version::HTTP_3, "HTTP/3.0"),
        ] {
            let v = env_of("/x", 0, version, &[("host", "h")]);
            assert_eq!(var(&v, "SERVER_PROTOCOL"), Some(text));
            assert_eq!(var(&v, "HTTP_HOST"), Some("h"));
        }
        // A prefix that ends in `/` still leaves PATH_INFO empty or starting with `/`.
        let v = env_of("/cgi/run", 5, http::Version::HTTP_11, &[("host", "h")]);
        assert_eq!(var(&v, "SCRIPT_NAME"), Some("/cgi"));
        assert_eq!(var(&v, "PATH_INFO"), Some("/run"));
        let v = env_of("/cgi", 4, http::Version::HTTP_11, &[("host", "h")]);
        assert_eq!(var(&v, "PATH_INFO"), Some(""));
        let v = env_of("/run", 0, http::Version::HTTP_11, &[("host", "h")]);
        assert_eq!(var(&v, "SCRIPT_NAME"), Some(""));
        assert_eq!(var(&v, "PATH_INFO"), Some("/run"));
        // Header names outside letters, digits and `-` are left out: `X_User` must not pass
        // as `X-User`.
        let v = env_of(
            "/run",
            0,
            http::Version::HTTP_11,
            &[
                ("host", "h"),
                ("x-user", "alice"),
                ("x_user", "mallory"),
                ("proxy", "p"),
            ],
        );
        assert_eq!(var(&v, "HTTP_X_USER"), Some("alice"));
        assert_eq!(v.iter().filter(|(k, _)| k == "HTTP_X_USER").count(), 1);
        assert_eq!(var(&v, "HTTP_PROXY"), None);
        for (k, _) in &v {
            assert!(
                k.bytes()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == b'_'),
                "{k}"
            );
        }
    }

    #[test]
    fn path_info_is_decoded() {
        assert_eq!(percent_decode("/a%20b/%2F"), "/a b//");
        assert_eq!(percent_decode("/100%"), "/100%");
        assert_eq!(percent_decode("/%ff"), "/%ff");
        assert_eq!(percent_decode("/a.txt%00.sh"), "/a.txt%00.sh");
    }
}
