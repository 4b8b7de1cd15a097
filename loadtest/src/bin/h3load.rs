//! Load over HTTP/3 or HTTP/2 over TLS, the same way for both: `CONNS` connections, each with
//! `STREAMS` requests in flight (a new one as each ends), for `SECS` seconds; or handshakes:
//! `CONNS` loops that connect, send one request and close.
//!
//! ```text
//! h3load h3|h2 ADDR NAME CA_PEM PATH SECS CONNS STREAMS [keepalive|handshakes]
//! ```
//!
//! Prints `RATE COUNT ERRORS` (requests or handshakes per second, how many, how many failed).
//! With `H3LOAD_REQUESTS=N` in the environment, keep-alive load sends exactly `N` requests
//! (over all connections) and ends when they are answered, whatever `SECS` says: a count to
//! divide by, as `loadtest/instructions.sh` needs.
//! The client is rustls with aws-lc-rs for both; HTTP/3 is quinn + h3 (the crates Tern serves
//! with), HTTP/2 is hyper's client.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};

struct Args {
    h3: bool,
    addr: SocketAddr,
    name: String,
    ca: rustls::RootCertStore,
    path: String,
    secs: u64,
    conns: usize,
    streams: usize,
    handshakes: bool,
    /// `H3LOAD_REQUESTS`: this many requests in all, instead of for `secs`.
    requests: Option<u64>,
}

fn args() -> Args {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 9 {
        eprintln!(
            "usage: h3load h3|h2 ADDR NAME CA_PEM PATH SECS CONNS STREAMS [keepalive|handshakes]"
        );
        std::process::exit(2);
    }
    let pem = std::fs::read(&a[4]).expect("read CA_PEM");
    let mut ca = rustls::RootCertStore::empty();
    use rustls::pki_types::pem::PemObject;
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(&pem) {
        ca.add(cert.expect("a certificate")).expect("a CA");
    }
    Args {
        h3: a[1] == "h3",
        addr: a[2].parse().expect("ADDR"),
        name: a[3].clone(),
        ca,
        path: a[5].clone(),
        secs: a[6].parse().expect("SECS"),
        conns: a[7].parse().expect("CONNS"),
        streams: a[8].parse().expect("STREAMS"),
        handshakes: a.get(9).is_some_and(|m| m == "handshakes"),
        requests: std::env::var("H3LOAD_REQUESTS")
            .ok()
            .map(|n| n.parse().expect("H3LOAD_REQUESTS is a count")),
    }
}

/// The client's TLS configuration: TLS 1.3, `alpn`, trusting `ca`, with session resumption
/// off (each handshake in `handshakes` mode is a full one).
fn tls(ca: &rustls::RootCertStore, alpn: &[u8]) -> rustls::ClientConfig {
    let mut c = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .expect("versions")
    .with_root_certificates(ca.clone())
    .with_no_client_auth();
    c.alpn_protocols = vec![alpn.to_vec()];
    c.resumption = rustls::client::Resumption::disabled();
    c
}

/// What every request loop shares: when to stop, the requests still to send (with
/// `H3LOAD_REQUESTS`), and the counts.
#[derive(Clone)]
struct Counts {
    stop: Arc<AtomicBool>,
    left: Arc<AtomicU64>,
    done: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
}

impl Counts {
    fn new(requests: Option<u64>) -> Self {
        Self {
            stop: Arc::default(),
            left: Arc::new(AtomicU64::new(requests.unwrap_or(u64::MAX))),
            done: Arc::default(),
            failed: Arc::default(),
        }
    }

    /// Takes one request from what is left to send: false once none is.
    fn take(&self) -> bool {
        self.left
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
    }
}

/// Runs `loops` loops of `one` request at a time (one request in all if `once`) until stop.
async fn request_loops<F, Fut>(loops: usize, once: bool, counts: &Counts, one: F)
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    let mut running = Vec::new();
    for _ in 0..if once { 1 } else { loops } {
        let (one, counts) = (one.clone(), counts.clone());
        running.push(tokio::spawn(async move {
            loop {
                if !counts.take() {
                    return;
                }
                match one().await {
                    Ok(()) => counts.done.fetch_add(1, Ordering::Relaxed),
                    Err(_) => counts.failed.fetch_add(1, Ordering::Relaxed),
                };
                if once || counts.stop.load(Ordering::Relaxed) {
                    return;
                }
            }
        }));
    }
    for r in running {
        let _ = r.await;
    }
}

/// One connection over HTTP/3, `a.streams` requests in flight.
async fn h3_connection(
    a: Arc<Args>,
    endpoint: quinn::Endpoint,
    config: quinn::ClientConfig,
    counts: Counts,
) -> anyhow::Result<()> {
    let quic = endpoint.connect_with(config, a.addr, &a.name)?.await?;
    let (mut driver, send) = h3::client::new(h3_quinn::Connection::new(quic.clone())).await?;
    let driving =
        tokio::spawn(async move { std::future::poll_fn(|cx| driver.poll_close(cx)).await });
    let uri: http::Uri = format!("https://{}{}", a.name, a.path).parse()?;
    request_loops(a.streams, a.handshakes, &counts, move || {
        let (mut send, uri) = (send.clone(), uri.clone());
        async move {
            let mut s = send.send_request(http::Request::get(uri).body(())?).await?;
            // Stopped by an answer already complete: the answer stands (RFC 9114 §4.1.2).
            let _ = s.finish().await;
            let head = s.recv_response().await?;
            while let Some(mut chunk) = s.recv_data().await? {
                chunk.advance(chunk.remaining());
            }
            anyhow::ensure!(head.status() == 200, "status {}", head.status());
            Ok(())
        }
    })
    .await;
    quic.close(0u32.into(), b"");
    driving.abort();
    Ok(())
}

/// One connection over HTTP/2 over TLS, the same.
async fn h2_connection(
    a: Arc<Args>,
    connector: tokio_rustls::TlsConnector,
    counts: Counts,
) -> anyhow::Result<()> {
    let tcp = tokio::net::TcpStream::connect(a.addr).await?;
    tcp.set_nodelay(true)?;
    let name = rustls::pki_types::ServerName::try_from(a.name.clone())?;
    let tls = connector.connect(name, tcp).await?;
    let (send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls)).await?;
    let driving = tokio::spawn(conn);
    let uri: http::Uri = format!("https://{}{}", a.name, a.path).parse()?;
    request_loops(a.streams, a.handshakes, &counts, move || {
        let (mut send, uri) = (send.clone(), uri.clone());
        async move {
            let req = http::Request::get(uri).body(Empty::<Bytes>::new())?;
            let resp = send.send_request(req).await?;
            let status = resp.status();
            resp.into_body().collect().await?;
            anyhow::ensure!(status == 200, "status {status}");
            Ok(())
        }
    })
    .await;
    driving.abort();
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let a = Arc::new(args());
    let counts = Counts::new(a.requests.filter(|_| !a.handshakes));
    let h3_config = quinn::ClientConfig::new(Arc::new(
        quinn::crypto::rustls::QuicClientConfig::try_from(tls(&a.ca, b"h3")).expect("QUIC TLS"),
    ));
    let connector = tokio_rustls::TlsConnector::from(Arc::new(tls(&a.ca, b"h2")));
    // One UDP socket for every connection, as a client host has.
    let endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).expect("UDP");
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..a.conns {
        let (a, counts) = (a.clone(), counts.clone());
        let (endpoint, h3_config, connector) =
            (endpoint.clone(), h3_config.clone(), connector.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let ran = if a.h3 {
                    h3_connection(
                        a.clone(),
                        endpoint.clone(),
                        h3_config.clone(),
                        counts.clone(),
                    )
                    .await
                } else {
                    h2_connection(a.clone(), connector.clone(), counts.clone()).await
                };
                if ran.is_err() {
                    counts.failed.fetch_add(1, Ordering::Relaxed);
                }
                // Handshakes: connect again until stopped.
                if !a.handshakes || counts.stop.load(Ordering::Relaxed) {
                    return;
                }
            }
        }));
    }
    let (elapsed, counted) = if a.requests.is_some() && !a.handshakes {
        // A count: every loop ends when none is left to send; a server that never answers
        // one ends the wait after SECS (the count printed then falls short).
        let _ = tokio::time::timeout(Duration::from_secs(a.secs), async {
            for t in tasks {
                let _ = t.await;
            }
        })
        .await;
        (
            started.elapsed().as_secs_f64(),
            counts.done.load(Ordering::Relaxed),
        )
    } else {
        tokio::time::sleep(Duration::from_secs(a.secs)).await;
        counts.stop.store(true, Ordering::Relaxed);
        let elapsed = started.elapsed().as_secs_f64();
        let counted = counts.done.load(Ordering::Relaxed);
        for t in tasks {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
        (elapsed, counted)
    };
    // The connections' closes sent before exiting (else the server keeps them until they idle
    // out, work that would fall into whatever it is measured on next).
    endpoint.close(0u32.into(), b"");
    let _ = tokio::time::timeout(Duration::from_secs(1), endpoint.wait_idle()).await;
    println!(
        "{:.0} {} {}",
        counted as f64 / elapsed,
        counted,
        counts.failed.load(Ordering::Relaxed)
    );
}
