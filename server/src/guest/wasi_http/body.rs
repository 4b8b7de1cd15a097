//! A component's request in and answer out: the client's body streamed to the guest within
//! the tenant's limit, with Spin's routing headers; the guest's head and body moved into the
//! shared response as it writes them.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::HOST;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response};
use http_body::Body;
use http_body_util::BodyExt;
use wasmtime_wasi_http::p2::bindings::http::types::ErrorCode;
use wasmtime_wasi_http::p2::body::HyperOutgoingBody;

use crate::body::{BodyFlags, ClientBody, ClientBodyError};
use crate::guest::{GuestRequest, GuestResponse, WriteError};

/// Why a component's answer could not be sent.
#[derive(Debug)]
pub enum Unanswered {
    /// The handler returned without setting its response-outparam.
    NoResponse,
    /// The guest set its response-outparam to an error.
    Error(ErrorCode),
    /// A WASI 0.3 guest answered with an error code (its text).
    ErrorP3(String),
    /// The response went past the tenant's body or header limits.
    Limit,
    /// The guest's body failed before its end (it was dropped unfinished, or its declared
    /// length was not met).
    BodyFailed(String),
    /// The client went away.
    ClientGone,
    /// The handler returned without finishing its body (`outgoing-body.finish`) or dropping
    /// it: by wasi:http's rules the body is not complete, and nothing more can come.
    Unfinished,
}

/// `wait` for something the guest produces (its response head, its next body frame). Once
/// the handler has `returned`, a `wasi:http` 0.2 guest can no longer act, so what is not
/// there now never comes: `None` then, at once, instead of a wait until the deadline.
async fn from_guest<F: Future>(wait: F, returned: &AtomicBool) -> Option<F::Output> {
    // Unconstrained: tokio's channels answer `Pending` when the task has used up its
    // cooperative budget, even with a value waiting, which must not pass for "never comes".
    let mut wait = std::pin::pin!(tokio::task::unconstrained(wait));
    std::future::poll_fn(|cx| match wait.as_mut().poll(cx) {
        Poll::Ready(v) => Poll::Ready(Some(v)),
        Poll::Pending if returned.load(Ordering::Acquire) => Poll::Ready(None),
        Poll::Pending => Poll::Pending,
    })
    .await
}

/// Moves a component's answer into `response`: the head from `head` (the response-outparam's
/// channel), then the body chunk by chunk as the guest writes it. Set `returned` when the
/// handler has returned and poll again: what the guest left unsent then ends the answer.
///
/// # Errors
/// [`Unanswered`], saying why the answer is not complete.
pub async fn pump(
    head: tokio::sync::oneshot::Receiver<Result<Response<HyperOutgoingBody>, ErrorCode>>,
    response: &mut GuestResponse,
    returned: &AtomicBool,
) -> Result<(), Unanswered> {
    let answer = match from_guest(head, returned).await {
        Some(Ok(Ok(r))) => r,
        Some(Ok(Err(code))) => return Err(Unanswered::Error(code)),
        // Dropped, or kept by a handler that returned without setting it.
        Some(Err(_)) | None => return Err(Unanswered::NoResponse),
    };
    let (parts, body) = answer.into_parts();
    pump_parts(parts, body, response, returned).await
}

/// Moves a response head `parts` and its `body` into `response`, the body chunk by chunk as
/// the guest writes it; `returned` as for [`pump`].
///
/// # Errors
/// [`Unanswered`], saying why the answer is not complete.
pub async fn pump_parts<B>(
    parts: http::response::Parts,
    mut body: B,
    response: &mut GuestResponse,
    returned: &AtomicBool,
) -> Result<(), Unanswered>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    response.status = parts.status;
    let mut name = None;
    for (n, value) in parts.headers {
        // `HeaderMap`'s iterator names only the first of a header's values.
        if let Some(n) = n {
            name = Some(n);
        }
        let Some(n) = name.clone() else { continue };
        // A framing header the server owns is dropped, as for every kind; any other refusal
        // (too many headers, a bad or too large `content-length`) fails the answer.
        if response.append_header(n, value).is_err() {
            return Err(Unanswered::Limit);
        }
    }
    loop {
        let frame = match from_guest(body.frame(), returned).await {
            Some(Some(frame)) => frame,
            Some(None) => break,
            None => return Err(Unanswered::Unfinished),
        };
        let frame = frame.map_err(|e| Unanswered::BodyFailed(e.to_string()))?;
        // Trailers are not sent (HTTP/1.1 clients rarely ask for them).
        let Ok(data) = frame.into_data() else {
            continue;
        };
        match response.write(&data).await {
            Ok(()) => {}
            // (A component has no way to forward a backend's body.)
            Err(WriteError::Limit | WriteError::Forwarded) => return Err(Unanswered::Limit),
            Err(WriteError::ClientGone) => return Err(Unanswered::ClientGone),
        }
    }
    Ok(())
}

/// The client's body as a component reads it (see [`ClientBody`]), with the errors
/// `wasi:http` knows.
struct ComponentBody(ClientBody);

impl Body for ComponentBody {
    type Data = Bytes;
    type Error = wasmtime_wasi_http::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> crate::body::Framed<Self::Error> {
        Pin::new(&mut self.get_mut().0)
            .poll_frame(cx)
            .map_err(|e| match e {
                ClientBodyError::TooLarge(seen) => {
                    wasmtime_wasi_http::Error::HttpRequestBodySize(Some(seen))
                }
                // (What `wasi:http` makes of a transport's error, hyper's included.)
                ClientBodyError::Failed(_) => wasmtime_wasi_http::Error::HttpProtocolError,
            })
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_end_stream()
    }
}

/// The request as a component receives it: the body limited to `request.max_bytes`, a `Host`
/// header if the client sent no authority (`wasi:http` requires one), and the routing headers
/// Spin gives its components (`spin-path-info`, `spin-full-url`, ...), set by the server only.
pub fn incoming(
    request: GuestRequest,
    flags: Arc<BodyFlags>,
) -> Request<impl Body<Data = Bytes, Error = wasmtime_wasi_http::Error> + Send + 'static> {
    let GuestRequest {
        method,
        uri,
        mut headers,
        body,
        max_bytes,
        context,
        ..
    } = request;
    if uri.authority().is_none() && !headers.contains_key(HOST) {
        headers.insert(HOST, HeaderValue::from_static("localhost"));
    }
    spin_headers(&mut headers, &uri, &context);
    let mut req = Request::new(ComponentBody(ClientBody::new(body, max_bytes, flags)));
    *req.method_mut() = method;
    *req.uri_mut() = uri;
    *req.headers_mut() = headers;
    req
}

/// Spin's routing headers, so components written for Spin find what they read there. A
/// client's own `spin-*` headers are dropped: only the server's values are seen.
fn spin_headers(
    headers: &mut HeaderMap,
    uri: &http::Uri,
    context: &crate::context::RequestContext,
) {
    static FULL_URL: HeaderName = HeaderName::from_static("spin-full-url");
    static PATH_INFO: HeaderName = HeaderName::from_static("spin-path-info");
    static MATCHED_ROUTE: HeaderName = HeaderName::from_static("spin-matched-route");
    static RAW_COMPONENT_ROUTE: HeaderName = HeaderName::from_static("spin-raw-component-route");
    static COMPONENT_ROUTE: HeaderName = HeaderName::from_static("spin-component-route");
    static BASE_PATH: HeaderName = HeaderName::from_static("spin-base-path");
    static CLIENT_ADDR: HeaderName = HeaderName::from_static("spin-client-addr");
    if headers.keys().any(|k| k.as_str().starts_with("spin-")) {
        let spoofed: Vec<_> = headers
            .keys()
            .filter(|k| k.as_str().starts_with("spin-"))
            .cloned()
            .collect();
        for k in spoofed {
            headers.remove(&k);
        }
    }
    headers.reserve(7);
    let path = uri.path();
    let (prefix, info) = path.split_at(context.prefix_len.min(path.len()));
    let prefix = prefix.trim_end_matches('/');
    let full = crate::context::url(context, uri, headers);
    let route = HeaderValue::from_maybe_shared(Bytes::from(format!("{prefix}/..."))).ok();
    let values = [
        (
            &FULL_URL,
            HeaderValue::from_maybe_shared(Bytes::from(full)).map_err(drop),
        ),
        (&PATH_INFO, HeaderValue::from_str(info).map_err(drop)),
        (&MATCHED_ROUTE, route.clone().ok_or(())),
        (&RAW_COMPONENT_ROUTE, route.ok_or(())),
        (
            &COMPONENT_ROUTE,
            HeaderValue::from_str(prefix).map_err(drop),
        ),
        (&BASE_PATH, Ok(HeaderValue::from_static("/"))),
        (
            &CLIENT_ADDR,
            HeaderValue::from_str(&context.client().to_string()).map_err(drop),
        ),
    ];
    for (name, value) in values {
        if let Ok(v) = value {
            headers.insert(name.clone(), v);
        }
    }
}
