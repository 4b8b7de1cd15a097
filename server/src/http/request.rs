//! What the front end reads of a request before routing it, and the small answers it gives
//! itself: framing a proxy might read differently, the host, the asterisk target, request ids,
//! the redirect to HTTPS.

use std::sync::atomic::{AtomicU64, Ordering};

use http::header::{HOST, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri};

use crate::body::{ResponseBody, plain};

/// `x-request-id`: honoured when the client sends a sane one, generated otherwise.
pub static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Refuses a request whose body's framing Tern does not read the way every proxy would
/// (RFC 9112 §6.1): `chunked` more than once (`400`), or a transfer coding other than
/// `chunked` (`501`: Tern would hand the guest a body still in that coding). hyper itself
/// drops a `Content-Length` sent with `Transfer-Encoding` and refuses `chunked` that is not
/// the last coding.
pub(super) fn framing<B>(req: &Request<B>) -> Result<(), (StatusCode, &'static str)> {
    let mut chunked = 0;
    for coding in req
        .headers()
        .get_all(TRANSFER_ENCODING)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|c| !c.is_empty())
    {
        if coding.eq_ignore_ascii_case(b"chunked") {
            chunked += 1;
        } else {
            return Err((
                StatusCode::NOT_IMPLEMENTED,
                "a transfer coding other than chunked: Tern reads only chunked request bodies \
                 (send Content-Encoding for a compressed body)",
            ));
        }
    }
    if chunked > 1 {
        return Err((
            StatusCode::BAD_REQUEST,
            "ambiguous request: the chunked transfer coding applied more than once",
        ));
    }
    Ok(())
}

/// The answer to a request for the asterisk target `*`: `OPTIONS *` is the server's own
/// options (each tenant's guest decides which methods its paths take); any other method with
/// it is malformed.
pub(super) fn asterisk(method: &Method) -> Response<ResponseBody> {
    if method == Method::OPTIONS {
        let mut resp = plain(StatusCode::OK, "");
        resp.headers_mut().insert(
            http::header::ALLOW,
            HeaderValue::from_static("GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"),
        );
        resp
    } else {
        plain(
            StatusCode::BAD_REQUEST,
            &format!("the target `*` is only for OPTIONS, not {method}\n"),
        )
    }
}

/// `uri` with its path replaced by `path` (its query kept).
pub(super) fn with_path(uri: &Uri, path: &str) -> Option<Uri> {
    let mut parts = uri.clone().into_parts();
    let pq = match uri.query() {
        Some(q) => format!("{path}?{q}"),
        None => path.to_string(),
    };
    parts.path_and_query = Some(pq.parse().ok()?);
    Uri::from_parts(parts).ok()
}

/// The host a request is for, or why it is ambiguous (RFC 9112 3.2; RFC 9113 8.3.1): one
/// `Host` header at most, the same authority in the target and in `Host` when both are given,
/// and no userinfo in either (`http://user@host/`: RFC 9110 §4.2.4 forbids it in a request,
/// and the guest would see it in the URL). With it, the host as [`HostFrom::host`] gives it
/// (found here already: routing reads it without looking it up again).
pub(super) fn authority<B>(req: &Request<B>) -> Result<(HostFrom, Option<&str>), &'static str> {
    let headers = req.headers();
    let mut hosts = headers.get_all(HOST).iter();
    let host = hosts.next();
    if hosts.next().is_some() {
        return Err("more than one Host header");
    }
    let host = match host {
        Some(h) => Some(h.to_str().map_err(|_| "a Host header that is not text")?),
        None => None,
    };
    if req
        .uri()
        .authority()
        .is_some_and(|a| a.as_str().contains('@'))
        || host.is_some_and(|h| h.contains('@'))
    {
        return Err("userinfo (`user@`) in the request's authority");
    }
    match (req.uri().authority(), host) {
        (Some(target), Some(host)) => {
            let host: http::uri::Authority = host
                .parse()
                .map_err(|_| "a Host header that is not a host")?;
            let same_port = match (target.port_u16(), host.port_u16()) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            };
            if !same_port || !target.host().eq_ignore_ascii_case(host.host()) {
                return Err("the request target's authority and the Host header differ");
            }
            Ok((HostFrom::Target, Some(target.host())))
        }
        (Some(target), None) => Ok((HostFrom::Target, Some(target.host()))),
        (None, Some(host)) => Ok((HostFrom::Header, Some(host))),
        (None, None) => Ok((HostFrom::Absent, None)),
    }
}

/// Where a request's host is, once [`authority`] has checked it (kept with the routed
/// request: its later steps read the host without checking it again).
#[derive(Debug, Clone, Copy)]
pub(super) enum HostFrom {
    /// The request target's authority (HTTP/2's `:authority`, HTTP/1's absolute form).
    Target,
    /// The `Host` header.
    Header,
    /// Neither: the request names no host.
    Absent,
}

impl HostFrom {
    /// The host (with its port, as sent, when it comes from `Host`).
    pub(super) fn host<B>(self, req: &Request<B>) -> Option<&str> {
        match self {
            Self::Target => req.uri().authority().map(http::uri::Authority::host),
            Self::Header => req.headers().get(HOST).and_then(|h| h.to_str().ok()),
            Self::Absent => None,
        }
    }
}

/// The client's `x-request-id` if it is 1-128 characters of `[A-Za-z0-9._:-]`.
pub fn client_request_id(headers: &HeaderMap) -> Option<HeaderValue> {
    let v = headers.get(&X_REQUEST_ID)?;
    let b = v.as_bytes();
    (!b.is_empty()
        && b.len() <= 128
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || b"._:-".contains(c)))
    .then(|| v.clone())
}

/// A new request id: this process's prefix and a counter.
///
/// Each thread counts through a block of [`ID_BLOCK`] numbers of its own, taken from the
/// process's counter when it begins one: ids stay unique in the process, and the workers do
/// not all write one counter's cache line on every request (one shared write per block).
pub fn new_request_id() -> HeaderValue {
    static NEXT_BLOCK: AtomicU64 = AtomicU64::new(0);
    static PREFIX: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    thread_local! {
        /// The thread's next number and the end of its block.
        static BLOCK: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
    }
    let prefix = *PREFIX.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos() ^ (d.as_secs() as u32));
        nanos.rotate_left(13) ^ std::process::id()
    });
    let n = BLOCK.with(|block| {
        let (mut n, mut end) = block.get();
        if n == end {
            n = NEXT_BLOCK.fetch_add(ID_BLOCK, Ordering::Relaxed);
            end = n + ID_BLOCK;
        }
        block.set((n + 1, end));
        n
    });
    // `{prefix:08x}-{n:012x}` (the low 48 bits of the counter), written digit by digit:
    // `format!` cost three allocations and the formatting machinery on every request (perf:
    // 0.73 % -> 0.15 % of a `hello` worker).
    let mut id = [b'-'; 21];
    crate::hex::encode_into(&prefix.to_be_bytes(), &mut id[..8]);
    crate::hex::encode_into(&n.to_be_bytes()[2..], &mut id[9..]);
    HeaderValue::from_bytes(&id).expect("hex is a valid header value")
}

/// How many request ids a thread numbers before it takes another block.
const ID_BLOCK: u64 = 1024;

/// The same URL as `uri` asked of `host`, over HTTPS on `port`.
pub(super) fn https_location(host: &str, port: u16, uri: &http::Uri) -> Option<HeaderValue> {
    let authority: http::uri::Authority = host.parse().ok()?;
    let name = authority.host();
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let location = if port == 443 {
        format!("https://{name}{path}")
    } else {
        format!("https://{name}:{port}{path}")
    };
    HeaderValue::from_str(&location).ok()
}

/// `308 Permanent Redirect` to `location` (a 308 keeps the method and body, unlike a 301).
pub(super) fn redirect(location: &HeaderValue) -> Response<ResponseBody> {
    let text = format!(
        "this site is served over HTTPS: {}\n",
        location.to_str().unwrap_or_default()
    );
    let mut resp = plain(StatusCode::PERMANENT_REDIRECT, &text);
    resp.headers_mut()
        .insert(http::header::LOCATION, location.clone());
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_authority_finds_is_the_one_host_from_gives() {
        let req = |uri: &str, host: Option<&str>| {
            let mut b = Request::builder().uri(uri);
            if let Some(h) = host {
                b = b.header(HOST, h);
            }
            b.body(()).expect("a request")
        };
        for (uri, host, want) in [
            ("http://a.example:8080/x", None, Some("a.example")),
            (
                "http://a.example:8080/x",
                Some("A.example:8080"),
                Some("a.example"),
            ),
            ("/x", Some("b.example:81"), Some("b.example:81")),
            ("/x", None, None),
        ] {
            let r = req(uri, host);
            let (from, found) = authority(&r).expect("a host");
            assert_eq!(found, want, "{uri} {host:?}");
            assert_eq!(found, from.host(&r), "{uri} {host:?}");
        }
        assert!(authority(&req("http://a.example/x", Some("b.example"))).is_err());
    }

    #[test]
    fn request_ids_are_honoured_only_when_sane() {
        let mut h = HeaderMap::new();
        h.insert(&X_REQUEST_ID, HeaderValue::from_static("abc-123.x:y_z"));
        assert_eq!(client_request_id(&h).unwrap(), "abc-123.x:y_z");
        h.insert(&X_REQUEST_ID, HeaderValue::from_static("has space"));
        assert_eq!(client_request_id(&h), None);
        assert_eq!(client_request_id(&HeaderMap::new()), None);
        let a = new_request_id();
        let b = new_request_id();
        assert_ne!(a, b);
        assert_eq!(a.len(), 21);
        // The prefix, a dash, and the counter in 12 lower-case hex digits.
        let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
        assert_eq!(a.as_bytes()[8], b'-');
        assert_eq!(a[..8], b[..8]);
        let n = |id: &str| u64::from_str_radix(&id[9..], 16).unwrap();
        assert!(n(b) > n(a));
        assert!(
            a.bytes()
                .all(|c| c == b'-' || (c.is_ascii_hexdigit() && !c.is_ascii_uppercase()))
        );
    }

    /// Threads number from blocks of their own: ids from many threads, past a block each,
    /// are all different.
    #[test]
    fn request_ids_from_many_threads_never_repeat() {
        let per_thread = 3 * ID_BLOCK as usize + 7;
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(move || {
                    (0..per_thread)
                        .map(|_| new_request_id())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut seen = std::collections::HashSet::new();
        for t in threads {
            for id in t.join().expect("thread") {
                assert!(seen.insert(id.clone()), "{id:?} given twice");
            }
        }
        assert_eq!(seen.len(), 4 * per_thread);
    }
}
