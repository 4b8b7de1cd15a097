//! The accept loop: TCP connections served by hyper (HTTP/1.1 with keep-alive, and HTTP/2 with
//! prior knowledge), drained gracefully on shutdown.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;

use crate::body::ResponseBody;
use crate::shutdown::Shutdown;

/// How long a client may take to send a request's headers (slowloris protection).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Accepts connections on `listener` and serves each request with `handler` until `shutdown`
/// fires; then stops accepting and waits up to `grace` for open connections to finish.
pub async fn serve<H, F>(listener: TcpListener, handler: H, shutdown: Shutdown, grace: Duration)
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<ResponseBody>> + Send + 'static,
{
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    let builder = Arc::new(builder);
    let graceful = GracefulShutdown::new();
    let addr = listener
        .local_addr()
        .map_or_else(|_| "?".to_string(), |a: SocketAddr| a.to_string());
    loop {
        let (stream, _peer) = tokio::select! {
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
        // Responses are written whole; waiting for more data (Nagle) only adds latency.
        let _ = stream.set_nodelay(true);
        let handler = handler.clone();
        let service = service_fn(move |req| {
            let fut = handler(req);
            async move { Ok::<_, Infallible>(fut.await) }
        });
        let conn = builder
            .serve_connection(TokioIo::new(stream), service)
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!("connection ended with an error: {e}");
            }
        });
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => tracing::debug!("{addr}: all connections drained"),
        () = tokio::time::sleep(grace) => tracing::warn!("{addr}: grace period over, closing open connections"),
    }
}
