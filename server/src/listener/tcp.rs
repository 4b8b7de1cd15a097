//! TCP: connections served by hyper (HTTP/1.1 with keep-alive, and HTTP/2 with prior
//! knowledge; over TLS, HTTP/2 or HTTP/1.1 as the client's ALPN chose), drained gracefully on
//! shutdown.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;
use http::header::CONNECTION;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

use crate::body::{BodyFailure, RequestBody, ResponseBody};
use crate::context::Connection;
use crate::metrics::GaugeGuard;
use crate::shutdown::Shutdown;

use super::options::{LINGER, ListenOptions};

/// A request body as hyper reads it (HTTP/1 and HTTP/2), as every listener hands one.
fn hyper_body(body: Incoming) -> RequestBody {
    use http_body_util::BodyExt;
    RequestBody::streaming(body.map_err(BodyFailure::new))
}

/// Accepts connections on `listener` and serves each request with `handler` until `shutdown`
/// fires; then stops accepting and waits up to the grace period for open connections to finish.
pub async fn serve<H, F>(listener: TcpListener, handler: H, shutdown: Shutdown, opts: ListenOptions)
where
    H: Fn(Request<RequestBody>, Connection) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<ResponseBody>> + Send + 'static,
{
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        // Timed on a timer of each connection's own (`with_head_timer`: every HTTP/1
        // connection is served through it; hyper panics at a configured timeout without one).
        .header_read_timeout(opts.header_read_timeout)
        // The read buffer must hold a whole request head: past it hyper answers `431`.
        .max_buf_size(opts.max_header_bytes.max(8192));
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(opts.max_header_bytes).unwrap_or(u32::MAX))
        // Idle HTTP/2 connections are pinged and closed if the client stops answering.
        .keep_alive_interval(opts.header_read_timeout)
        .keep_alive_timeout(opts.header_read_timeout)
        // WebSockets over HTTP/2 (RFC 8441: `CONNECT` with `:protocol`).
        .enable_connect_protocol();
    // Over TLS the client's ALPN has chosen the protocol: no guessing from the first bytes.
    let builders = Arc::new([
        builder.clone(),
        builder.clone().http1_only(),
        builder.http2_only(),
    ]);
    let graceful = GracefulShutdown::new();
    let addr = listener
        .local_addr()
        .map_or_else(|_| "?".to_string(), |a: SocketAddr| a.to_string());
    let serve_one = |stream: TcpStream,
                     peer: SocketAddr,
                     permit: Option<tokio::sync::OwnedSemaphorePermit>| {
        // Responses are written whole; waiting for more data (Nagle) only adds latency.
        let _ = stream.set_nodelay(true);
        let (handler, shutdown) = (handler.clone(), shutdown.clone());
        let (builders, watcher, tls) = (builders.clone(), graceful.watcher(), opts.tls.clone());
        let alt_svc = opts.alt_svc.clone();
        let first_bytes_timeout = opts.header_read_timeout;
        let send_timeout = opts.send_timeout;
        let open = opts.open.clone().map(GaugeGuard::new);
        let worker_open = opts.worker_open.clone().map(GaugeGuard::new);
        tokio::spawn(async move {
            let _open = (open, worker_open);
            let _permit = permit;
            let service = move |conn: Connection| {
                let alt_svc = alt_svc.clone();
                service_fn(move |req: Request<Incoming>| {
                    // Once shutdown has begun, every HTTP/1 request is answered with
                    // `Connection: close`: it is served, and its keep-alive connection ends
                    // after the answer instead of being cut while a request may be on its
                    // way. (A request already running when shutdown begins is answered as
                    // usual; the connection's next one gets the close.)
                    let close = req.version() < hyper::Version::HTTP_2 && shutdown.is_triggered();
                    // Boxed: hyper moves the service's future as it takes a request in
                    // (three copies of ~3 KB); a box is one allocation, and a pointer moved.
                    let fut = Box::pin(handler(req.map(hyper_body), conn.clone()));
                    let alt_svc = alt_svc.clone();
                    async move {
                        let mut resp = fut.await;
                        if let Some(alt_svc) = alt_svc {
                            alt_svc.advertise(resp.headers_mut());
                        }
                        // (A `101` switches the connection to a WebSocket, which closes
                        // with its own frame at shutdown.)
                        if close && resp.status() != http::StatusCode::SWITCHING_PROTOCOLS {
                            resp.headers_mut()
                                .insert(CONNECTION, HeaderValue::from_static("close"));
                        }
                        Ok::<_, Infallible>(resp)
                    }
                })
            };
            // hyper's header timeout starts only once it has told HTTP/1 from HTTP/2 (or,
            // over HTTP/2, never), which needs the client's first bytes: a client that sends
            // nothing must not hold a slot.
            let ended = match tls {
                None => {
                    let Some(stream) = first_bytes(stream, first_bytes_timeout, send_timeout).await
                    else {
                        return;
                    };
                    let conn = with_head_timer(&builders[0])
                        .serve_connection_with_upgrades(
                            TokioIo::new(stream),
                            service(Connection::plain(peer)),
                        )
                        .into_owned();
                    watcher.watch(conn).await
                }
                Some(tls) => {
                    let Some(accepted) = tls.accept(stream).await else {
                        return;
                    };
                    let Some(stream) =
                        first_bytes(accepted.stream, first_bytes_timeout, send_timeout).await
                    else {
                        return;
                    };
                    let conn = Connection {
                        peer,
                        tls: Some(accepted.info),
                    };
                    if accepted.h2 {
                        // (HTTP/2's extended CONNECT needs no upgradeable connection.)
                        let conn = builders[2]
                            .serve_connection(TokioIo::new(stream), service(conn))
                            .into_owned();
                        watcher.watch(conn).await
                    } else if stream.starts_with(H2_PREFACE) {
                        // The client chose HTTP/1.1 by ALPN (or named none) and speaks
                        // HTTP/2: the connection that reads the version from the first bytes
                        // (to switch HTTP/1.1 to WebSockets) must not serve it.
                        return;
                    } else {
                        let conn = with_head_timer(&builders[1])
                            .serve_connection_with_upgrades(TokioIo::new(stream), service(conn))
                            .into_owned();
                        watcher.watch(conn).await
                    }
                }
            };
            if let Err(e) = ended {
                // A request hyper could not parse was answered by hyper itself (`400`, `431`
                // or `414`, with no body): the reason is here, at debug level.
                tracing::debug!(%peer, "connection ended with an error: {}", crate::error_chain(&*e));
            }
        });
    };
    loop {
        // Accept first, then wait for a permit: a worker waiting in `accept` must not hold a
        // permit, or with one listener per worker (`SO_REUSEPORT`) it could hold the last one
        // while the connections queue at another worker's listener, which then serves none.
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    // Out of file descriptors or similar: back off instead of spinning.
                    tracing::warn!("accept on {addr} failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = shutdown.wait() => break,
        };
        let permit = tokio::select! {
            permit = opts.connections.clone().acquire_owned() => permit.expect("never closed"),
            () = shutdown.wait() => {
                serve_one(stream, peer, opts.connections.clone().try_acquire_owned().ok());
                break;
            }
        };
        serve_one(stream, peer, Some(permit));
    }
    // Connections the kernel completed but this loop had not accepted would be reset when the
    // listener closes, though their clients may have sent a request: take and answer them.
    while let Poll::Ready(Ok((stream, peer))) =
        std::future::poll_fn(|cx| Poll::Ready(listener.poll_accept(cx))).await
    {
        serve_one(
            stream,
            peer,
            opts.connections.clone().try_acquire_owned().ok(),
        );
    }
    drop(listener);
    // Idle keep-alive connections stay open a moment: a request already on its way is answered
    // (and closes its connection); hyper then closes the ones still idle.
    let linger = LINGER.min(opts.grace);
    let all_closed = opts
        .connections
        .acquire_many(u32::try_from(opts.max_connections).unwrap_or(u32::MAX));
    let _ = tokio::time::timeout(linger, all_closed).await;
    tokio::select! {
        () = graceful.shutdown() => tracing::debug!("{addr}: all connections drained"),
        () = tokio::time::sleep(opts.grace.saturating_sub(linger)) => tracing::warn!("{addr}: grace period over, closing open connections"),
    }
}

/// `builder` for one connection: its HTTP/1 heads timed on one timer of the connection's own
/// (`HeadTimer`: a keep-alive connection's every request neither files a new timer in the
/// runtime's wheel nor takes one out).
fn with_head_timer(builder: &auto::Builder<TokioExecutor>) -> auto::Builder<TokioExecutor> {
    let mut builder = builder.clone();
    builder
        .http1()
        .timer(super::head_timer::HeadTimer::default());
    builder
}

/// The HTTP/2 connection preface; a client that sends a prefix of it may still be HTTP/2.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// How much the first read may take: a typical request head, so hyper needs no second read.
const FIRST_READ: usize = 2048;

/// Reads until the client has sent enough to tell HTTP/1 from HTTP/2, for at most `limit`.
/// Returns the connection with those bytes to be read again (and its writes held to
/// `send_timeout`), or `None` if the client sent nothing useful in time or closed the
/// connection.
///
/// The bytes are consumed, not peeked: with a partial HTTP/2 preface in the socket buffer the
/// socket stays readable, and waiting on it again would spin (3,000 stalled prefaces kept two
/// cores busy). A read waits for new bytes.
async fn first_bytes<S: AsyncRead + Unpin>(
    mut stream: S,
    limit: Duration,
    send_timeout: Duration,
) -> Option<Prefixed<S>> {
    use tokio::io::AsyncReadExt;
    let mut prefix = Vec::with_capacity(FIRST_READ);
    let wait = async {
        loop {
            let mut buf = [0u8; FIRST_READ];
            let room = FIRST_READ - prefix.len();
            match stream.read(&mut buf[..room]).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => prefix.extend_from_slice(&buf[..n]),
            }
            let n = prefix.len().min(H2_PREFACE.len());
            if prefix.len() >= H2_PREFACE.len() || prefix[..n] != H2_PREFACE[..n] {
                return Some(());
            }
        }
    };
    tokio::time::timeout(limit, wait).await.ok()??;
    Some(Prefixed {
        prefix,
        read: 0,
        stream,
        send_timeout,
        stalled: None,
    })
}

/// A connection whose first bytes were read by `first_bytes`: they are read again first. Its
/// writes fail with `TimedOut` once the client has taken nothing for `send_timeout` (hyper
/// then closes the connection): a client that stops reading its answer holds no connection
/// without end.
#[derive(Debug)]
pub struct Prefixed<S> {
    prefix: Vec<u8>,
    /// How much of `prefix` has been read again.
    read: usize,
    stream: S,
    send_timeout: Duration,
    /// While writes wait for the client: when they give up (made at the first wait, then
    /// reset, so a connection that never waits allocates nothing).
    stalled: Option<(bool, Pin<Box<tokio::time::Sleep>>)>,
}

impl<S> Prefixed<S> {
    /// Whether the client's first bytes start with `bytes`.
    fn starts_with(&self, bytes: &[u8]) -> bool {
        self.prefix.starts_with(bytes)
    }

    /// What a write that returned `polled` means: `Pending` arms the stall timer (and fails
    /// once it rings), anything else disarms it.
    fn stall<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<std::io::Result<T>>,
    ) -> Poll<std::io::Result<T>> {
        if polled.is_ready() {
            if let Some((armed, _)) = &mut self.stalled {
                *armed = false;
            }
            return polled;
        }
        let timeout = self.send_timeout;
        let (armed, sleep) = self
            .stalled
            .get_or_insert_with(|| (false, Box::pin(tokio::time::sleep(timeout))));
        if !*armed {
            *armed = true;
            sleep.as_mut().reset(tokio::time::Instant::now() + timeout);
        }
        if sleep.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the client took none of its answer within server.send_timeout_ms",
            )));
        }
        Poll::Pending
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.read < this.prefix.len() {
            let n = buf.remaining().min(this.prefix.len() - this.read);
            buf.put_slice(&this.prefix[this.read..this.read + n]);
            this.read += n;
            if this.read == this.prefix.len() {
                this.prefix = Vec::new();
                this.read = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.stream).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_write(cx, data);
        this.stall(cx, polled)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        this.stall(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_flush(cx);
        this.stall(cx, polled)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}
