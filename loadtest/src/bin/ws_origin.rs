//! A native WebSocket-over-HTTP echo origin (Pushpin's `application/websocket-events`, no
//! WebAssembly): what Pushpin is put in front of in the `websocket` benchmark, answering as
//! the events-mode echo guest answers Tern. `OPEN` is accepted with one text message (`hi`);
//! every `TEXT` and `BINARY` comes back as it came; a `CLOSE` is answered with its code.
//!
//! Usage: ws-origin 127.0.0.1:PORT

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};

/// The events of `body`, each its name and content (if any).
fn events(body: &[u8]) -> Vec<(&[u8], Option<&[u8]>)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < body.len() {
        let Some(end) = body[at..].windows(2).position(|w| w == b"\r\n") else {
            break;
        };
        let line = &body[at..at + end];
        at += end + 2;
        match line.iter().position(|&b| b == b' ') {
            None => out.push((line, None)),
            Some(sp) => {
                let len =
                    usize::from_str_radix(std::str::from_utf8(&line[sp + 1..]).unwrap_or("0"), 16)
                        .unwrap_or(0);
                let content = &body[at..(at + len).min(body.len())];
                at += len + 2;
                out.push((&line[..sp], Some(content)));
            }
        }
    }
    out
}

async fn answer(
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let body = req.into_body().collect().await?.to_bytes();
    let mut out = Vec::with_capacity(body.len() + 16);
    for (name, content) in events(&body) {
        match (name, content) {
            (b"OPEN", _) => out.extend_from_slice(b"OPEN\r\nTEXT 2\r\nhi\r\n"),
            (b"TEXT" | b"BINARY" | b"CLOSE", Some(c)) => {
                out.extend_from_slice(name);
                out.extend_from_slice(format!(" {:X}\r\n", c.len()).as_bytes());
                out.extend_from_slice(c);
                out.extend_from_slice(b"\r\n");
            }
            (b"CLOSE", None) => out.extend_from_slice(b"CLOSE\r\n"),
            _ => {}
        }
    }
    Ok(Response::builder()
        .header("content-type", "application/websocket-events")
        .body(Full::new(Bytes::from(out)))
        .expect("a valid answer"))
}

#[tokio::main]
async fn main() {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:18188".into());
    let listener = tokio::net::TcpListener::bind(&addr).await.expect("bind");
    loop {
        let (s, _) = listener.accept().await.expect("accept");
        let _ = s.set_nodelay(true);
        tokio::spawn(async move {
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(s), hyper::service::service_fn(answer))
                .await;
        });
    }
}
