//! A WebSocket handed to a backend: the backend's WebSocket opened with the client's request
//! (and the headers the guest added), the client answered, and the relay started.

use std::net::IpAddr;
use std::sync::Arc;

use http::header::{
    CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, HOST, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_EXTENSIONS,
    SEC_WEBSOCKET_KEY, SEC_WEBSOCKET_PROTOCOL, SEC_WEBSOCKET_VERSION, UPGRADE,
};
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};

use super::config::WebsocketConfig;
use super::opening::{Opening, accept_for, new_key};
use super::relay::{Counts, Limits, relay};
use super::sockets::{Place, Sockets};
use crate::body::ResponseBody;
use crate::logwriter::AccessRecord;

/// A handoff a guest asked for: the backend it named and the headers its answer adds to the
/// client's request.
#[derive(Debug)]
pub struct Handoff {
    /// The backend's name (`[tenant.outbound.backends.NAME]`).
    pub backend: String,
    /// The guest's answer's other headers, set on the request to the backend.
    pub headers: HeaderMap,
}

/// Headers of a guest's answer that are not passed on to the backend: the body's, the
/// connection's, and the WebSocket handshake's own (the relay makes those).
fn kept_from_guest(name: &HeaderName) -> bool {
    !(crate::body::FRAMING_HEADERS.contains(&name.as_str())
        || *name == CONTENT_LENGTH
        || *name == CONTENT_TYPE
        || *name == HOST
        || name.as_str().starts_with("sec-websocket-"))
}

/// Headers of the client's request not passed on (the connection's, and the handshake's own,
/// which the relay makes anew for the backend).
fn kept_from_client(name: &HeaderName) -> bool {
    !(crate::body::FRAMING_HEADERS.contains(&name.as_str())
        || *name == CONTENT_LENGTH
        || *name == HOST
        || *name == SEC_WEBSOCKET_KEY
        || *name == SEC_WEBSOCKET_VERSION
        || *name == X_FORWARDED_FOR
        || *name == X_FORWARDED_PROTO)
}

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

impl Handoff {
    /// The handoff a guest's answer asks for, if any ([`super::HandoffTo`], taken off).
    pub fn asked<B>(resp: &mut Response<B>) -> Option<Self> {
        let backend = resp.extensions_mut().remove::<super::HandoffTo>()?.0;
        let backend = backend.to_str().unwrap_or("").trim().to_string();
        let headers = resp
            .headers()
            .iter()
            .filter(|(n, _)| kept_from_guest(n))
            .map(|(n, v)| (n.clone(), v.clone()))
            .collect();
        Some(Self { backend, headers })
    }
}

/// The client's side of a handoff: its opening, its place within the limits, and the
/// request as its guest saw it.
pub struct Client {
    /// Its opening (the connection to switch).
    pub opening: Opening,
    /// Its place within the connection limits.
    pub place: Place,
    /// The request's target.
    pub uri: Uri,
    /// The request's headers (as the guest saw them).
    pub headers: HeaderMap,
    /// The client's address (through `trusted_proxies`).
    pub address: IpAddr,
    /// Whether it came over TLS.
    pub tls: bool,
}

/// Why a handoff failed: the status the client gets and what it says.
#[derive(Debug)]
pub struct Failed {
    /// `500` for a guest's mistake (an unknown backend), `502` for a backend that could not
    /// be reached or refused, `504` past its timeouts.
    pub status: StatusCode,
    /// What went wrong, for the client's answer and the log.
    pub why: String,
}

/// What a tenant gives a handoff: its guests' outbound policy (the backends), its metrics
/// label and its WebSocket limits.
pub struct Tenant<'a> {
    /// Its guests' outbound policy.
    pub policy: &'a crate::outbound::Policy,
    /// Its metrics label.
    pub label: &'a str,
    /// `[tenant.websocket]`.
    pub limits: &'a WebsocketConfig,
    /// Its `max_request_bytes` (an events batch is a request).
    pub max_request_bytes: u64,
}

/// Opens the WebSocket of backend `to.backend` for `client` and, once the backend has
/// accepted it, answers the client (`101`, or `200` over HTTP/2) and starts the relay in a
/// task of `sockets`. The access line is written when the connection closes, from the record
/// sent on the answer's [`WhenClosed`] (its span ends then too).
///
/// # Errors
/// [`Failed`] when the backend is not the tenant's, cannot be reached, or refuses.
pub async fn handoff(
    tenant: Tenant<'_>,
    sockets: &Arc<Sockets>,
    client: Client,
    to: Handoff,
) -> Result<Response<ResponseBody>, Failed> {
    let fail = |status, why: String| Failed { status, why };
    if to.backend.is_empty() {
        return Err(fail(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the guest's tern-handoff names no backend".into(),
        ));
    }
    let path = client
        .uri
        .path_and_query()
        .map_or("/", http::uri::PathAndQuery::as_str);
    let dest = tenant
        .policy
        .destination(&to.backend, path)
        .await
        .map_err(|e| {
            fail(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("the guest handed the WebSocket to a backend it may not use: {e}"),
            )
        })?;
    let key = new_key();
    let mut req = Request::builder()
        .uri(
            dest.uri
                .path_and_query()
                .map_or("/", http::uri::PathAndQuery::as_str),
        )
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .expect("a valid request");
    let headers = req.headers_mut();
    for (name, value) in &client.headers {
        if kept_from_client(name) {
            headers.append(name.clone(), value.clone());
        }
    }
    for name in to.headers.keys() {
        headers.remove(name);
    }
    for (name, value) in &to.headers {
        headers.append(name.clone(), value.clone());
    }
    headers.insert(HOST, dest.host.clone());
    headers.insert(UPGRADE, HeaderValue::from_static("websocket"));
    headers.insert(CONNECTION, HeaderValue::from_static("Upgrade"));
    headers.insert(SEC_WEBSOCKET_VERSION, HeaderValue::from_static("13"));
    headers.insert(SEC_WEBSOCKET_KEY, key.clone());
    headers.insert(
        X_FORWARDED_FOR.clone(),
        HeaderValue::from_str(&client.address.to_string()).expect("an address is a header value"),
    );
    headers.insert(
        X_FORWARDED_PROTO.clone(),
        HeaderValue::from_static(if client.tls { "https" } else { "http" }),
    );
    let backend = open(&dest, req).await?;
    let (answer, upgraded) = backend;
    // Only what the backend chose of the client's offer goes back.
    let mut headers = HeaderMap::new();
    for name in [SEC_WEBSOCKET_PROTOCOL, SEC_WEBSOCKET_EXTENSIONS] {
        if let Some(v) = answer.get(&name) {
            headers.insert(name, v.clone());
        }
    }
    let counts = Counts::of(&sockets.metrics, tenant.label);
    let limits = Limits::of(tenant.limits);
    let Client { opening, place, .. } = client;
    Ok(switch(
        sockets,
        opening,
        place,
        tenant.label,
        headers,
        move |client, shutdown| async move {
            let shutdown = async move { shutdown.wait().await };
            let ended = relay(client, TokioIo::new(upgraded), limits, &counts, shutdown).await;
            (ended.code, ended.bytes_out)
        },
    ))
}

/// Answers an accepted `opening` with `headers` (`101` with its `Sec-WebSocket-Accept`, or
/// `200` over HTTP/2, RFC 8441 §5), and once the client's side has switched runs `run` on it
/// (with the server's shutdown) in a task of `sockets`: when it ends (its close code and bytes
/// sent to the client), its place is given back, its close counted for the tenant labelled
/// `label`, its access line written and its span ended (the records the answer's
/// [`WhenClosed`] is sent).
pub(super) fn switch<R, F>(
    sockets: &Arc<Sockets>,
    opening: Opening,
    place: Place,
    label: &str,
    headers: HeaderMap,
    run: R,
) -> Response<ResponseBody>
where
    R: FnOnce(TokioIo<Upgraded>, crate::shutdown::Shutdown) -> F + Send + 'static,
    F: std::future::Future<Output = (u16, u64)> + Send,
{
    let mut resp = Response::new(ResponseBody::Full(None));
    *resp.headers_mut() = headers;
    match &opening.key {
        Some(client_key) => {
            *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
            let h = resp.headers_mut();
            h.insert(UPGRADE, HeaderValue::from_static("websocket"));
            h.insert(CONNECTION, HeaderValue::from_static("Upgrade"));
            h.insert(SEC_WEBSOCKET_ACCEPT, accept_for(client_key.as_bytes()));
        }
        None => *resp.status_mut() = StatusCode::OK,
    }
    let (log_tx, log_rx) = tokio::sync::oneshot::channel();
    resp.extensions_mut().insert(WhenClosed::new(log_tx));
    let (closes, label) = (sockets.metrics.websocket_closes.clone(), label.to_string());
    let shutdown = sockets.shutdown.clone();
    let version = opening.version;
    sockets.tasks.spawn(async move {
        let client = match opening.upgrade.await {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(?version, "the client's WebSocket did not open: {e}");
                return;
            }
        };
        let (code, bytes_out) = run(TokioIo::new(client), shutdown).await;
        // Its place is free before it is counted as closed.
        drop(place);
        closes.with_label_values(&[&label, close_label(code)]).inc();
        if let Ok(Closed { access, trace }) = log_rx.await {
            if let Some(record) = access {
                record.write(bytes_out, code != super::frame::code::ABNORMAL);
            }
            // The opening's span lasts until the connection closed.
            if let Some((tracer, mut record)) = trace {
                record.end = (record.arrived.elapsed(), std::time::SystemTime::now());
                record.websocket = Some((code, bytes_out));
                tracer.submit(&record);
            }
        }
    });
    resp
}

/// A close code as a metrics label: the codes RFC 6455 defines, else `other`.
pub(super) fn close_label(code: u16) -> &'static str {
    match code {
        1000 => "1000",
        1001 => "1001",
        1002 => "1002",
        1003 => "1003",
        1005 => "1005",
        1006 => "1006",
        1007 => "1007",
        1008 => "1008",
        1009 => "1009",
        1010 => "1010",
        1011 => "1011",
        _ => "other",
    }
}

/// A response's access record and trace record are to be sent here instead of written when its
/// (empty) body ends: a switched WebSocket's access line is written when it closes, with its
/// duration and bytes, and its span lasts until then.
#[derive(Clone)]
pub struct WhenClosed(Arc<std::sync::Mutex<Option<tokio::sync::oneshot::Sender<Closed>>>>);

/// What is written when a WebSocket closes.
pub struct Closed {
    access: Option<AccessRecord>,
    trace: Option<(Arc<crate::trace::Tracer>, crate::trace::Record)>,
}

impl WhenClosed {
    /// The records are to be sent on `tx`.
    pub(super) fn new(tx: tokio::sync::oneshot::Sender<Closed>) -> Self {
        Self(Arc::new(std::sync::Mutex::new(Some(tx))))
    }

    /// Hands the opening's `access` record and kept `trace` record (with its tracer) to the
    /// connection.
    pub fn send(
        &self,
        access: Option<AccessRecord>,
        trace: Option<(Arc<crate::trace::Tracer>, crate::trace::Record)>,
    ) {
        if let Some(tx) = self.0.lock().expect("never poisoned").take() {
            let _ = tx.send(Closed { access, trace });
        }
    }
}

/// The backend's connection, switched.
type Upgraded = hyper::upgrade::Upgraded;

/// Connects to `dest`, sends the opening `req`, and waits for the backend's `101` with the
/// right `Sec-WebSocket-Accept`: its headers and the switched connection.
async fn open(
    dest: &crate::outbound::Destination,
    req: Request<http_body_util::Empty<bytes::Bytes>>,
) -> Result<(HeaderMap, Upgraded), Failed> {
    let fail = |status, why: String| Failed { status, why };
    let authority = dest.uri.authority().expect("a backend has an authority");
    let https = dest.uri.scheme() == Some(&http::uri::Scheme::HTTPS);
    let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
    let host = authority.host().trim_matches(['[', ']']);
    let tcp = tokio::time::timeout(
        dest.timeouts.connect,
        tokio::net::TcpStream::connect((host, port)),
    )
    .await
    .map_err(|_| {
        fail(
            StatusCode::GATEWAY_TIMEOUT,
            format!(
                "the WebSocket backend did not accept a connection within {:?}",
                dest.timeouts.connect
            ),
        )
    })?
    .map_err(|e| {
        fail(
            StatusCode::BAD_GATEWAY,
            format!("cannot connect to the WebSocket backend: {e}"),
        )
    })?;
    let _ = tcp.set_nodelay(true);
    let expected = accept_for(
        req.headers()
            .get(SEC_WEBSOCKET_KEY)
            .expect("set above")
            .as_bytes(),
    );
    let answered = if https {
        let config = dest
            .tls
            .config()
            .map_err(|e| fail(StatusCode::BAD_GATEWAY, e))?;
        let name = rustls::pki_types::ServerName::try_from(host.to_string()).map_err(|e| {
            fail(
                StatusCode::BAD_GATEWAY,
                format!("backend host {host:?}: {e}"),
            )
        })?;
        let tls = tokio::time::timeout(
            dest.timeouts.connect,
            tokio_rustls::TlsConnector::from(config).connect(name, tcp),
        )
        .await
        .map_err(|_| {
            fail(
                StatusCode::GATEWAY_TIMEOUT,
                "the backend's TLS handshake timed out".into(),
            )
        })?
        .map_err(|e| {
            fail(
                StatusCode::BAD_GATEWAY,
                format!("TLS to the WebSocket backend: {e}"),
            )
        })?;
        ask(tls, req, dest.timeouts.first_byte).await?
    } else {
        ask(tcp, req, dest.timeouts.first_byte).await?
    };
    let (status, headers, upgraded) = answered;
    if status != StatusCode::SWITCHING_PROTOCOLS {
        return Err(fail(
            StatusCode::BAD_GATEWAY,
            format!("the backend refused the WebSocket (status {status})"),
        ));
    }
    if headers.get(SEC_WEBSOCKET_ACCEPT) != Some(&expected) {
        return Err(fail(
            StatusCode::BAD_GATEWAY,
            "the backend's Sec-WebSocket-Accept does not answer the key sent".into(),
        ));
    }
    let upgraded = upgraded.await.map_err(|e| {
        fail(
            StatusCode::BAD_GATEWAY,
            format!("the backend's connection did not switch: {e}"),
        )
    })?;
    Ok((headers, upgraded))
}

/// Sends the opening over `io` (HTTP/1.1) and waits up to `first_byte` for the answer's head.
async fn ask<I>(
    io: I,
    req: Request<http_body_util::Empty<bytes::Bytes>>,
    first_byte: std::time::Duration,
) -> Result<(StatusCode, HeaderMap, hyper::upgrade::OnUpgrade), Failed>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let fail = |why: String| Failed {
        status: StatusCode::BAD_GATEWAY,
        why,
    };
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| fail(format!("the WebSocket backend: {e}")))?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    let mut resp = tokio::time::timeout(first_byte, sender.send_request(req))
        .await
        .map_err(|_| Failed {
            status: StatusCode::GATEWAY_TIMEOUT,
            why: format!("the WebSocket backend did not answer within {first_byte:?}"),
        })?
        .map_err(|e| fail(format!("the WebSocket backend: {e}")))?;
    let upgrade = hyper::upgrade::on(&mut resp);
    let (parts, _) = resp.into_parts();
    Ok((parts.status, parts.headers, upgrade))
}
