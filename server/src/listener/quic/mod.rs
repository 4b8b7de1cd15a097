//! HTTP/3: QUIC (quinn) on the TLS listener's address over UDP, the HTTP/3 framing and QPACK of
//! `h3`. Each request goes to the same front end as TCP's (`http::handle`), its body an
//! [`H3Body`] ([`body`]) as a [`RequestBody`]; the answer's [`ResponseBody`] is written as DATA
//! frames. `h3` reads its streams through [`streams`], which bounds them. Per-core, every
//! worker runs an endpoint on a socket of its own, packets steered by connection ID
//! ([`steer`]).
//!
//! The limits are the TCP listeners': the connection cap (shared), handshakes in flight and
//! their timeout (shared with TLS over TCP), the request head's size, the idle limit
//! (`header_read_timeout_ms`, as HTTP/1's keep-alive and HTTP/2's ping), and request streams
//! per connection (`http3_max_streams`, as HTTP/2's concurrent streams). 0-RTT is off. Past
//! half the handshake cap, a client whose address is not yet validated is sent a Retry first,
//! so a flood from spoofed addresses costs a packet each, not a handshake. On shutdown every
//! connection is sent GOAWAY, its requests finish, and then it closes.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, DATE};
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;

mod body;
mod steer;
mod streams;

use self::body::H3Body;
use self::streams::Guarded;
use super::alt_svc::AltSvc;
use super::options::{LINGER, ListenOptions, caught};
use crate::body::{FRAMING_HEADERS, RequestBody, ResponseBody};
use crate::context::{Connection, TlsInfo};
use crate::metrics::GaugeGuard;
use crate::shutdown::Shutdown;

/// The HTTP/3 error code of a stream or connection that ends without error (RFC 9114 §8.1).
const H3_NO_ERROR: u32 = 0x100;

/// Unidirectional streams a client may open: HTTP/3 needs three (control, QPACK encoder and
/// decoder); a few more for reserved (GREASE) stream types some clients send.
const UNI_STREAMS: u32 = 16;

/// The most a client may have sent on one connection that the server has not read yet, over
/// all its streams (quinn's default is unbounded: 200 streams, each with its own 1.25 MB
/// window, could hold 250 MB). With the frames `h3` buffers held to `max_header_bytes`
/// ([`streams`]), this bounds what one connection holds in memory.
const CONNECTION_RECEIVE_WINDOW: u32 = 16 << 20;

/// One worker's UDP socket for HTTP/3 and its QUIC configuration, made at start (where a bad
/// address or configuration is an error to report) and served by the runtime that runs
/// [`serve`] (quinn drives an endpoint on the runtime it is made in).
pub struct Bound {
    socket: std::net::UdpSocket,
    /// This worker's endpoint: the connection IDs it issues steer packets to its socket.
    endpoint: quinn::EndpointConfig,
    /// Shared by every worker (a clone): one key for address validation tokens, so a Retry's
    /// token is good on whichever worker the client's next packet reaches.
    config: quinn::ServerConfig,
    /// Every worker's socket, duplicated, held by each worker until it has stopped: a socket
    /// leaves the group (and the kernel renumbers the rest, which would misdirect the packets
    /// of connections still draining elsewhere) only once every worker has stopped.
    group: Arc<[std::net::UdpSocket]>,
}

/// Binds HTTP/3's UDP sockets on `addr`, one per worker of `workers` (steered by connection
/// ID: [`steer`]): `acceptor`'s certificates and handshake cap, the limits of `[server]`,
/// socket buffers raised to `http3_socket_buffer_kib` (the size the kernel grants is logged).
///
/// # Errors
/// If the UDP address cannot be bound (another server holds it), or the TLS configuration not
/// made.
pub fn bind(
    addr: SocketAddr,
    acceptor: &crate::tls::Acceptor,
    c: &crate::config::ServerConfig,
    workers: usize,
) -> anyhow::Result<Vec<Bound>> {
    use anyhow::Context as _;
    // The connection ID's first byte names the worker: past 256 workers, the first 256 serve
    // HTTP/3.
    let sockets = steer::bind_group(addr, workers.min(steer::MAX_WORKERS))?;
    let workers = sockets.len();
    let group: Arc<[std::net::UdpSocket]> = sockets
        .iter()
        .map(std::net::UdpSocket::try_clone)
        .collect::<std::io::Result<Vec<_>>>()?
        .into();
    let mut granted = (0, 0);
    for socket in &sockets {
        granted = crate::os::raise_socket_buffers(socket, c.http3_socket_buffer_kib * 1024);
    }
    tracing::info!(
        "HTTP/3 on udp {} ({}): socket buffers {} KiB receive, {} KiB send (asked {} KiB; the \
         kernel caps them at net.core.rmem_max / wmem_max)",
        sockets[0].local_addr()?,
        if workers > 1 {
            format!("{workers} workers, packets steered by connection ID")
        } else {
            "one worker".to_string()
        },
        granted.0 / 1024,
        granted.1 / 1024,
        c.http3_socket_buffer_kib
    );
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(acceptor.quic_config()?)
        .context("the TLS provider has no TLS 1.3 suite QUIC can start with")?;
    let mut transport = quinn::TransportConfig::default();
    transport
        .max_concurrent_bidi_streams(quinn::VarInt::from_u64(c.http3_max_streams)?)
        .max_concurrent_uni_streams(UNI_STREAMS.into())
        .receive_window(CONNECTION_RECEIVE_WINDOW.into())
        .max_idle_timeout(Some(
            Duration::from_millis(c.header_read_timeout_ms).try_into()?,
        ));
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    config.transport_config(Arc::new(transport));
    // Handshakes not yet accepted by the loop: a flood beyond them is dropped by quinn.
    config.max_incoming(c.max_tls_handshakes.max(64));
    Ok(sockets
        .into_iter()
        .enumerate()
        .map(|(worker, socket)| {
            let mut endpoint = quinn::EndpointConfig::default();
            let cids = steer::WorkerCids::new(worker, workers);
            endpoint.cid_generator(move || Box::new(cids));
            Bound {
                socket,
                endpoint,
                config: config.clone(),
                group: group.clone(),
            }
        })
        .collect())
}

/// Serves HTTP/3 on `bound` with `handler` until `shutdown` fires; then refuses new
/// connections, sends every open one GOAWAY, and waits up to the grace period for their
/// requests to finish. `alt_svc` advertises the listener while it serves.
pub async fn serve<H, F>(
    bound: Bound,
    handler: H,
    shutdown: Shutdown,
    opts: ListenOptions,
    alt_svc: Option<Arc<AltSvc>>,
) where
    H: Fn(Request<RequestBody>, Connection) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<ResponseBody>> + Send + 'static,
{
    let group = bound.group;
    let endpoint = match quinn::Endpoint::new(
        bound.endpoint,
        Some(bound.config),
        bound.socket,
        Arc::new(quinn::TokioRuntime),
    ) {
        Ok(endpoint) => endpoint,
        Err(e) => {
            tracing::error!("HTTP/3 cannot serve: {e}");
            return;
        }
    };
    let tls = opts.tls.clone().expect("a QUIC listener terminates TLS");
    let opts = Arc::new(opts);
    let addr = endpoint
        .local_addr()
        .map_or_else(|_| "?".to_string(), |a| a.to_string());
    let connections = tokio_util::task::TaskTracker::new();
    if let Some(a) = &alt_svc {
        a.set_up(true);
    }
    loop {
        let incoming = tokio::select! {
            incoming = endpoint.accept() => match incoming {
                Some(incoming) => incoming,
                None => break,
            },
            () = shutdown.wait() => break,
        };
        // The connection cap is the TCP listeners' too: past it, a client is refused at once
        // (it falls back to TCP, where it waits in the backlog).
        let Ok(permit) = opts.connections.clone().try_acquire_owned() else {
            incoming.refuse();
            continue;
        };
        // Under a flood, prove the address first: a Retry costs the server one packet.
        let incoming = if !incoming.remote_address_validated() && tls.busy() {
            match incoming.retry() {
                Ok(()) => {
                    tls.retried();
                    continue;
                }
                Err(e) => e.into_incoming(),
            }
        } else {
            incoming
        };
        let (handler, shutdown, opts) = (handler.clone(), shutdown.clone(), opts.clone());
        connections.spawn(async move {
            let _permit = permit;
            connection(incoming, handler, shutdown, opts).await;
        });
    }
    if let Some(a) = &alt_svc {
        a.set_up(false);
    }
    // New connections are refused from here; open ones drain (each sends GOAWAY).
    endpoint.set_server_config(None);
    connections.close();
    tokio::select! {
        () = connections.wait() => tracing::debug!("udp {addr}: all HTTP/3 connections drained"),
        () = tokio::time::sleep(opts.grace) => tracing::warn!("udp {addr}: grace period over, closing open HTTP/3 connections"),
    }
    endpoint.close(H3_NO_ERROR.into(), b"shutting down");
    let _ = tokio::time::timeout(Duration::from_secs(1), endpoint.wait_idle()).await;
    drop(group);
}

/// One QUIC connection: its handshake (within the TLS listener's timeout and cap), then its
/// requests, each in a task of its own, until the client ends it, it idles out, or shutdown
/// drains it.
async fn connection<H, F>(
    incoming: quinn::Incoming,
    handler: H,
    shutdown: Shutdown,
    opts: Arc<ListenOptions>,
) where
    H: Fn(Request<RequestBody>, Connection) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<ResponseBody>> + Send + 'static,
{
    let tls = opts.tls.as_ref().expect("a QUIC listener terminates TLS");
    let _open = opts.open.clone().map(GaugeGuard::new);
    let _worker_open = opts.worker_open.clone().map(GaugeGuard::new);
    let peer = incoming.remote_address();
    let quic = {
        let Some(_handshake) = tls.handshake() else {
            incoming.refuse();
            return;
        };
        let connecting = match incoming.accept() {
            Ok(connecting) => connecting,
            Err(e) => {
                tracing::debug!(%peer, "QUIC handshake failed: {e}");
                tls.failed("protocol");
                return;
            }
        };
        match tokio::time::timeout(tls.timeout(), connecting).await {
            Err(_) => {
                tls.failed("timeout");
                return;
            }
            Ok(Err(e)) => {
                tracing::debug!(%peer, "QUIC handshake failed: {e}");
                tls.failed(match e {
                    quinn::ConnectionError::TransportError(_) => "protocol",
                    quinn::ConnectionError::TimedOut => "timeout",
                    _ => "io",
                });
                return;
            }
            Ok(Ok(quic)) => quic,
        }
    };
    tls.completed();
    let sni = quic
        .handshake_data()
        .and_then(|d| d.downcast::<quinn::crypto::rustls::HandshakeData>().ok())
        .and_then(|d| d.server_name);
    let conn = Connection {
        peer,
        tls: Some(Arc::new(TlsInfo {
            protocol: "TLSv1.3",
            sni,
        })),
    };
    let built = h3::server::builder()
        .max_field_section_size(opts.max_header_bytes as u64)
        .build::<_, Bytes>(Guarded::new(quic.clone(), opts.max_header_bytes as u64))
        .await;
    let mut h3 = match built {
        Ok(h3) => h3,
        Err(e) => {
            tracing::debug!(%peer, "HTTP/3 connection failed to start: {e}");
            return;
        }
    };
    // The connection's requests, each in a task of its own.
    let requests = tokio_util::task::TaskTracker::new();
    let mut draining = false;
    // Made once: a wait made afresh for every request subscribed to the shutdown channel and
    // left it again (its counts shared by every worker) each time.
    let mut stop = std::pin::pin!(shutdown.wait());
    loop {
        let resolver = tokio::select! {
            accepted = h3.accept() => match accepted {
                Ok(Some(resolver)) => resolver,
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(%peer, "HTTP/3 connection ended: {e}");
                    break;
                }
            },
            // GOAWAY: the requests the client sent so far are served, later ones refused.
            () = stop.as_mut(), if !draining => {
                draining = true;
                requests.close();
                let _ = h3.shutdown(1).await;
                continue;
            }
            () = requests.wait(), if draining => break,
        };
        // The client's address as of this request: a client may migrate (a phone moving
        // from Wi-Fi to mobile) and keep its connection.
        let mut conn = conn.clone();
        conn.peer = quic.remote_address();
        let timeouts = (opts.header_read_timeout, opts.send_timeout);
        // Boxed: tokio moves a task's future whole when it spawns it (~9 KB here, with h3's
        // futures and the front end's) and writes over it when it ends; a box is one
        // allocation, and a pointer moved.
        let task = Box::pin(request(resolver, handler.clone(), conn, timeouts));
        requests.spawn(caught(task, opts.panics.clone()));
    }
    // Whatever ended the loop, the requests still running finish before the close.
    requests.close();
    let _ = tokio::time::timeout(opts.grace, requests.wait()).await;
    // An answer written whole may still be on its way (a stream's end is not its delivery),
    // and closing drops what the client has not acknowledged: the client, told to go away,
    // closes when it has all; else the connection closes after a moment.
    let _ = tokio::time::timeout(LINGER.min(opts.grace), quic.closed()).await;
    quic.close(H3_NO_ERROR.into(), b"");
}

/// One request: its head (within the first of `timeouts`), the front end's answer, written
/// back (the client taking some of it within the second, else its stream is reset).
async fn request<H, F>(
    resolver: h3::server::RequestResolver<Guarded, Bytes>,
    handler: H,
    conn: Connection,
    timeouts: (Duration, Duration),
) where
    H: Fn(Request<RequestBody>, Connection) -> F,
    F: Future<Output = Response<ResponseBody>>,
{
    let peer = conn.peer;
    let (header_timeout, send_timeout) = timeouts;
    let (req, stream) = match tokio::time::timeout(header_timeout, resolver.resolve_request()).await
    {
        Err(_) => {
            tracing::debug!(%peer, "HTTP/3 request head not sent in time");
            return;
        }
        Ok(Err(e)) => {
            tracing::debug!(%peer, "HTTP/3 request refused: {e}");
            return;
        }
        Ok(Ok(resolved)) => resolved,
    };
    let (mut send, receive) = stream.split();
    let head_only = req.method() == Method::HEAD;
    let declared = crate::body::declared_length(req.headers());
    let (mut body, returned) = H3Body::new(receive, declared);
    body.look_ahead();
    let resp = handler(req.map(|()| RequestBody::streaming(body)), conn).await;
    if let Err(e) = respond(&mut send, resp, head_only, send_timeout).await {
        tracing::debug!(%peer, "HTTP/3 answer not delivered: {e}");
    }
    // The answer is complete: a request body not read to its end is no longer wanted.
    if let Ok(mut receive) = returned.await {
        receive.stop_sending(h3::error::Code::H3_NO_ERROR);
    }
}

/// Writes `resp` on the stream: its head (without HTTP/1's connection headers, with a `Date`
/// and, when the body's length is known, a `Content-Length`), then its body as DATA frames
/// and any trailers. A write the client's flow control holds for `send_timeout` resets the
/// stream (`H3_REQUEST_CANCELLED`): a client that grants no credit holds no answer without
/// end.
async fn respond(
    send: &mut h3::server::RequestStream<h3_quinn::SendStream<Bytes>, Bytes>,
    resp: Response<ResponseBody>,
    head_only: bool,
    send_timeout: Duration,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let written = write_answer(send, resp, head_only, send_timeout).await;
    if let Err(e) = &written
        && e.is::<Stalled>()
    {
        send.stop_stream(h3::error::Code::H3_REQUEST_CANCELLED);
    }
    written
}

/// A client took none of its answer within `server.send_timeout_ms`.
#[derive(Debug, thiserror::Error)]
#[error("the client took none of its answer within server.send_timeout_ms")]
struct Stalled;

/// `write`, unless the client's flow control holds it for `limit`. The timer (a clock read,
/// a timer entry) is made only for a write that waits, not for the many that do not.
async fn within<T, E>(
    limit: Duration,
    write: impl Future<Output = Result<T, E>>,
) -> Result<T, Box<dyn std::error::Error + Send + Sync>>
where
    E: std::error::Error + Send + Sync + 'static,
{
    let mut write = std::pin::pin!(write);
    if let Poll::Ready(written) =
        std::future::poll_fn(|cx| Poll::Ready(write.as_mut().poll(cx))).await
    {
        return Ok(written?);
    }
    match tokio::time::timeout(limit, write).await {
        Ok(written) => Ok(written?),
        Err(_) => Err(Box::new(Stalled)),
    }
}

/// [`respond`]'s writes, each within `send_timeout`.
async fn write_answer(
    send: &mut h3::server::RequestStream<h3_quinn::SendStream<Bytes>, Bytes>,
    resp: Response<ResponseBody>,
    head_only: bool,
    send_timeout: Duration,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let (mut parts, mut body) = resp.into_parts();
    let bodiless = head_only || bodiless_status(parts.status);
    let length = http_body::Body::size_hint(&body).exact();
    h3_head(&mut parts, length, head_only, SystemTime::now);
    within(
        send_timeout,
        send.send_response(Response::from_parts(parts, ())),
    )
    .await?;
    if !bodiless {
        while let Some(frame) = body.frame().await {
            let frame = match frame {
                Ok(frame) => frame,
                Err(e) => {
                    // The guest's body was cut: the client must not take it for whole.
                    send.stop_stream(h3::error::Code::H3_INTERNAL_ERROR);
                    return Err(e.into());
                }
            };
            match frame.into_data() {
                Ok(data) if data.is_empty() => {}
                Ok(data) => within(send_timeout, send.send_data(data)).await?,
                Err(frame) => {
                    if let Ok(trailers) = frame.into_trailers() {
                        within(send_timeout, send.send_trailers(trailers)).await?;
                        return Ok(());
                    }
                }
            }
        }
    }
    within(send_timeout, send.finish()).await?;
    Ok(())
}

/// Whether an answer with `status` has no body to send (RFC 9110 §6.4.1).
fn bodiless_status(status: StatusCode) -> bool {
    status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
}

/// An answer's head as HTTP/3 sends it (RFC 9114 §4.2): without HTTP/1's connection headers
/// ([`FRAMING_HEADERS`]), with a `Content-Length` when the body's `length` is known and the
/// status has a body (so not a `304`'s: its length would be the full answer's, which this
/// body does not say, RFC 9110 §8.6), and a `Date` (of `now()`, read only then) when the guest
/// gave none. One pass over the head's names says which of these it holds: a look-up by name
/// hashes and probes, and nine of them cost more than a pass over the few headers an answer
/// has.
fn h3_head(
    parts: &mut http::response::Parts,
    length: Option<u64>,
    head_only: bool,
    now: impl FnOnce() -> SystemTime,
) {
    let (mut framing, mut has_length, mut has_date) = (false, false, false);
    for name in parts.headers.keys() {
        if name == CONTENT_LENGTH {
            has_length = true;
        } else if name == DATE {
            has_date = true;
        } else {
            framing |= FRAMING_HEADERS.contains(&name.as_str());
        }
    }
    if framing {
        for name in FRAMING_HEADERS {
            parts.headers.remove(name);
        }
    }
    if !has_length
        && !bodiless_status(parts.status)
        && let Some(n) = length
        && !(head_only && n == 0)
    {
        parts.headers.insert(CONTENT_LENGTH, HeaderValue::from(n));
    }
    if !has_date && let Some(date) = date_at(now()) {
        parts.headers.insert(DATE, date);
    }
}

/// The `Date` of an answer made at `now`: written once a second per thread (as hyper does for
/// HTTP/1 and HTTP/2) instead of formatted for every answer; rewritten whenever the second
/// differs, a clock set back too. None for a clock before 1970, which cannot be right: an
/// answer then goes without one (RFC 9110 §6.6.1).
fn date_at(now: SystemTime) -> Option<HeaderValue> {
    use std::cell::RefCell;
    thread_local! {
        static DATE: RefCell<(u64, HeaderValue)> =
            const { RefCell::new((u64::MAX, HeaderValue::from_static(""))) };
    }
    let second = now.duration_since(UNIX_EPOCH).ok()?.as_secs();
    Some(DATE.with_borrow_mut(|(at, value)| {
        if *at != second {
            let text = httpdate::fmt_http_date(now);
            *value = HeaderValue::from_maybe_shared(Bytes::from(text)).expect("ASCII");
            *at = second;
        }
        value.clone()
    }))
}

#[cfg(test)]
mod tests {
    use super::{FRAMING_HEADERS, date_at, h3_head};
    use http::{Response, StatusCode};
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    #[test]
    fn an_http3_head_drops_connection_headers_and_gains_a_length_and_a_date_only_where_missing() {
        let now = UNIX_EPOCH + Duration::from_secs(1_796_000_000);
        let head = |status: StatusCode, headers: &[(&str, &str)]| {
            let mut b = Response::builder().status(status);
            for (n, v) in headers {
                b = b.header(*n, *v);
            }
            b.body(()).unwrap().into_parts().0
        };
        let names = |p: &http::response::Parts| {
            let mut n: Vec<String> = p.headers.keys().map(|k| k.to_string()).collect();
            n.sort();
            n
        };
        // Every connection header goes, whichever it is, and only they do.
        for framing in FRAMING_HEADERS {
            let mut p = head(
                StatusCode::OK,
                &[
                    ("content-type", "text/plain"),
                    (framing, "x"),
                    ("x-own", "1"),
                ],
            );
            h3_head(&mut p, Some(5), false, || now);
            assert_eq!(
                names(&p),
                ["content-length", "content-type", "date", "x-own"],
                "{framing}"
            );
            assert_eq!(p.headers["content-length"], "5");
            assert_eq!(p.headers["date"], httpdate::fmt_http_date(now));
        }
        // All of them at once.
        let all: Vec<(&str, &str)> = FRAMING_HEADERS.iter().map(|n| (*n, "x")).collect();
        let mut p = head(StatusCode::OK, &all);
        h3_head(&mut p, None, false, || now);
        assert_eq!(names(&p), ["date"]);
        // A guest's own length and date stand, and the clock is not read for them.
        let mut p = head(
            StatusCode::OK,
            &[
                ("content-length", "7"),
                ("date", "Sun, 06 Nov 1994 08:49:37 GMT"),
            ],
        );
        h3_head(&mut p, Some(5), false, || panic!("the clock read"));
        assert_eq!(p.headers["content-length"], "7");
        assert_eq!(p.headers["date"], "Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(p.headers.len(), 2);
        // Each of the two alone: the other is added, and a connection header beside them goes.
        let mut p = head(StatusCode::OK, &[("content-length", "7"), ("upgrade", "x")]);
        h3_head(&mut p, Some(5), false, || now);
        assert_eq!(names(&p), ["content-length", "date"]);
        assert_eq!(p.headers["content-length"], "7");
        let mut p = head(
            StatusCode::OK,
            &[("date", "Sun, 06 Nov 1994 08:49:37 GMT"), ("te", "x")],
        );
        h3_head(&mut p, Some(5), false, || panic!("the clock read"));
        assert_eq!(names(&p), ["content-length", "date"]);
        assert_eq!(p.headers["content-length"], "5");
        // An empty answer to a GET says its length, 0.
        let mut p = head(StatusCode::OK, &[]);
        h3_head(&mut p, Some(0), false, || now);
        assert_eq!(p.headers["content-length"], "0");
        // No length for a status without a body (or a 304's), an unknown length, or an
        // empty HEAD.
        for (status, length, head_only) in [
            (StatusCode::NO_CONTENT, Some(5), false),
            (StatusCode::CONTINUE, Some(5), false),
            (StatusCode::NOT_MODIFIED, Some(0), false),
            (StatusCode::NOT_MODIFIED, Some(5), true),
            (StatusCode::OK, None, false),
            (StatusCode::OK, Some(0), true),
        ] {
            let mut p = head(status, &[]);
            h3_head(&mut p, length, head_only, || now);
            assert_eq!(names(&p), ["date"], "{status} {length:?} {head_only}");
        }
        // A HEAD whose body would have a known length says it.
        let mut p = head(StatusCode::OK, &[]);
        h3_head(&mut p, Some(17), true, || now);
        assert_eq!(p.headers["content-length"], "17");
    }

    #[test]
    fn an_answers_date_is_its_seconds_written_once_and_follows_the_clock_both_ways() {
        let at = |secs: u64, millis: u64| {
            UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_millis(millis)
        };
        let date = |t: SystemTime| date_at(t).expect("after 1970");
        let t = 1_796_000_000;
        let first = date(at(t, 100));
        assert_eq!(first, httpdate::fmt_http_date(at(t, 0)));
        // Within the second: the same bytes, not written again.
        let again = date(at(t, 900));
        assert_eq!(again, first);
        assert_eq!(again.as_bytes().as_ptr(), first.as_bytes().as_ptr());
        // The next second, and a clock set back: each its own.
        assert_eq!(date(at(t + 1, 0)), httpdate::fmt_http_date(at(t + 1, 0)));
        assert_eq!(
            date(at(t - 3600, 0)),
            httpdate::fmt_http_date(at(t - 3600, 0))
        );
        assert_eq!(date(at(t, 500)), first);
        // A clock before 1970 gives none.
        assert_eq!(date_at(UNIX_EPOCH - Duration::from_secs(1)), None);
        // Now: the clock's second, read around the call.
        let before = SystemTime::now();
        let now = date(SystemTime::now());
        let after = SystemTime::now();
        let read = httpdate::parse_http_date(now.to_str().unwrap()).unwrap();
        let whole = |t: SystemTime| {
            UNIX_EPOCH + Duration::from_secs(t.duration_since(UNIX_EPOCH).unwrap().as_secs())
        };
        assert!(whole(before) <= read && read <= after, "{now:?}");
    }
}
