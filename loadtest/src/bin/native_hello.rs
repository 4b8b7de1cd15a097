//! The native baseline: the same front end as Tern (tokio multi-threaded runtime, hyper 1,
//! HTTP/1.1 + h2c, Nagle off) answering "Hello from Tern!" with no WebAssembly at all.
//! Usage: `native-hello [ADDR] [BYTES]` (default 127.0.0.1:8081). With `BYTES`, it answers like
//! a stored answer a cache gives: that many bytes, kept once and shared by every answer, with the
//! headers Tern's cache hit of the same object carries (`content-type`, `cache-control`, `age`,
//! `vary`) — the floor a cache hit of that size is measured against (`loadtest/ab-hit.sh`).
//! `SIGTERM` or `SIGINT` ends it cleanly (an instrumented build then writes its profile: the
//! profile-guided native baseline of `loadtest/results/pgo.md`).

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{AGE, CACHE_CONTROL, CONTENT_TYPE, HeaderValue, VARY};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::signal::unix::{SignalKind, signal};

#[tokio::main]
async fn main() -> std::io::Result<()> {
    // As Tern's own subscriber does for them, hyper's and h2's trace-level spans and events
    // are switched off at their call sites: without any subscriber, the workspace's `log`
    // feature of `tracing` hands every h2 stream's spans to `log` one by one (~11,000
    // instructions an h2 request, `PROTO=h2 bash loadtest/instructions.sh ... native`), a
    // cost no real server pays and which would flatter Tern's h2 ratios.
    let _ = tracing::subscriber::set_global_default(tracing::subscriber::NoSubscriber::default());
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:8081".into());
    let bytes = match std::env::args().nth(2) {
        None => None,
        Some(n) => Some(n.parse::<usize>().map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("BYTES {n:?}: {e}"),
            )
        })?),
    };
    // The stored answer: its body made once, every answer a shared handle to it.
    let stored = bytes.map(|n| Bytes::from(vec![b'x'; n]));
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    eprintln!("native hello on http://{}", listener.local_addr()?);
    let builder = std::sync::Arc::new(auto::Builder::new(TokioExecutor::new()));
    let (mut term, mut int) = (
        signal(SignalKind::terminate())?,
        signal(SignalKind::interrupt())?,
    );
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => accepted?,
            _ = term.recv() => return Ok(()),
            _ = int.recv() => return Ok(()),
        };
        let _ = stream.set_nodelay(true);
        let builder = builder.clone();
        let stored = stored.clone();
        tokio::spawn(async move {
            let service = service_fn(move |_req: Request<hyper::body::Incoming>| {
                let resp = match &stored {
                    None => {
                        let mut resp =
                            Response::new(Full::new(Bytes::from_static(b"Hello from Tern!\n")));
                        resp.headers_mut()
                            .insert("content-type", "text/plain".parse().expect("static"));
                        resp
                    }
                    Some(body) => {
                        let mut resp = Response::new(Full::new(body.clone()));
                        let h = resp.headers_mut();
                        h.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
                        h.insert(CACHE_CONTROL, HeaderValue::from_static("max-age=3600"));
                        h.insert(AGE, HeaderValue::from_static("10"));
                        h.insert(VARY, HeaderValue::from_static("accept-encoding"));
                        resp
                    }
                };
                async move { Ok::<_, Infallible>(resp) }
            });
            let _ = builder
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
