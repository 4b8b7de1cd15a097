//! The native baseline: the same front end as Tern (tokio multi-threaded runtime, hyper 1,
//! HTTP/1.1 + h2c, Nagle off) answering "Hello from Tern!" with no WebAssembly at all.
//! Usage: `native-hello [ADDR]` (default 127.0.0.1:8081).

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:8081".into());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    eprintln!("native hello on http://{}", listener.local_addr()?);
    let builder = std::sync::Arc::new(auto::Builder::new(TokioExecutor::new()));
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let builder = builder.clone();
        tokio::spawn(async move {
            let service = service_fn(|_req: Request<hyper::body::Incoming>| async {
                let mut resp = Response::new(Full::new(Bytes::from_static(b"Hello from Tern!\n")));
                resp.headers_mut()
                    .insert("content-type", "text/plain".parse().expect("static"));
                Ok::<_, Infallible>(resp)
            });
            let _ = builder
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
