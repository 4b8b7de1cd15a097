//! The native proxy baseline: the same stack as Tern's proxy path without WebAssembly — a
//! tokio multi-threaded runtime, hyper 1's server in front and hyper-util's pooled client
//! (keep-alive, Nagle off) behind, forwarding method, path, headers and body to one backend
//! and streaming the answer back, with `x-forwarded-for` added.
//! Usage: `native-proxy LISTEN_ADDR BACKEND_ADDR` (e.g. 127.0.0.1:8082 127.0.0.1:8081).

use std::net::SocketAddr;

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;

type Body = BoxBody<Bytes, hyper::Error>;

async fn forward(
    client: &Client<HttpConnector, Incoming>,
    backend: &str,
    peer: SocketAddr,
    req: Request<Incoming>,
) -> Response<Body> {
    let (mut parts, body) = req.into_parts();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    parts.uri = match format!("http://{backend}{path}").parse::<Uri>() {
        Ok(uri) => uri,
        Err(_) => return status(StatusCode::BAD_REQUEST),
    };
    parts.headers.remove(hyper::header::HOST);
    if let Ok(v) = peer.ip().to_string().parse() {
        parts.headers.insert("x-forwarded-for", v);
    }
    match client.request(Request::from_parts(parts, body)).await {
        Ok(resp) => resp.map(BodyExt::boxed),
        Err(_) => status(StatusCode::BAD_GATEWAY),
    }
}

fn status(code: StatusCode) -> Response<Body> {
    let mut resp = Response::new(Full::new(Bytes::new()).map_err(|e| match e {}).boxed());
    *resp.status_mut() = code;
    resp
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(backend)) = (args.next(), args.next()) else {
        eprintln!("usage: native-proxy LISTEN_ADDR BACKEND_ADDR");
        std::process::exit(2);
    };
    let backend: &'static str = Box::leak(backend.into_boxed_str());
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    eprintln!(
        "native proxy on http://{} → {backend}",
        listener.local_addr()?
    );
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client<HttpConnector, Incoming> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(64)
        .build(connector);
    let builder = std::sync::Arc::new(auto::Builder::new(TokioExecutor::new()));
    loop {
        let (stream, peer) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let builder = builder.clone();
        let client = client.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let client = client.clone();
                async move {
                    Ok::<_, std::convert::Infallible>(forward(&client, backend, peer, req).await)
                }
            });
            let _ = builder
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
