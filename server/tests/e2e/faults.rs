//! Proxies that lose answers on purpose, put between a server and the stores it writes to:
//! [`S3Proxy`] in front of the suite's S3 server (a registry write reaches S3 and is applied;
//! its answer is dropped, held past the client's timeout, or held while the test stops S3),
//! and [`RedisProxy`] in front of Redis (a write reaches Redis; its reply is dropped with the
//! connection). What the server answers after such a fault must match what happened.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// What becomes of the write a fault is armed for: its answer lost (the write itself reaches
/// the store), or the write held back a while (it reaches the store late, and is answered).
#[derive(Debug, Clone, Copy)]
pub enum Fault {
    /// The connection is closed instead of the answer.
    Drop,
    /// The answer is held this long (past the client's timeout), then the connection closed.
    Delay(Duration),
    /// The answer is held until [`S3Proxy::release`] (the test stops S3 meanwhile), then the
    /// connection closed.
    Hold,
    /// The write is held before it reaches S3 until [`S3Proxy::release`] (the test has
    /// another replica write meanwhile: a race lost on purpose), then sent on and answered.
    HoldWrite,
}

struct S3State {
    upstream: SocketAddr,
    /// The fault for the next `PUT` whose path ends with the suffix.
    armed: Mutex<Option<(Fault, String)>>,
    /// How many faults were applied.
    applied: AtomicUsize,
    /// Told when a held answer arrived from S3.
    held: Notify,
    /// Tells a held answer to go (be dropped).
    release: Notify,
    /// Reads (`GET`) of objects whose path contains one of these are answered `503` (a
    /// store failing for a while), and how many were.
    failing_reads: Mutex<Vec<String>>,
    failed_reads: AtomicUsize,
}

/// An HTTP proxy in front of an S3 server (`endpoint` is what its clients are pointed at).
pub struct S3Proxy {
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
    state: Arc<S3State>,
    task: tokio::task::JoinHandle<()>,
}

impl S3Proxy {
    /// A proxy to the S3 server at `upstream` (`http://127.0.0.1:PORT`).
    pub async fn start(upstream: &str) -> Self {
        let upstream: SocketAddr = upstream
            .trim_start_matches("http://")
            .parse()
            .expect("an http://address:port endpoint");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(S3State {
            upstream,
            armed: Mutex::new(None),
            applied: AtomicUsize::new(0),
            held: Notify::new(),
            release: Notify::new(),
            failing_reads: Mutex::new(Vec::new()),
            failed_reads: AtomicUsize::new(0),
        });
        let s = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((conn, _)) = listener.accept().await else {
                    return;
                };
                let s = s.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| forward(s.clone(), req));
                    // A service error closes the connection without an answer: the fault.
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(conn), service)
                        .await;
                });
            }
        });
        Self {
            endpoint,
            state,
            task,
        }
    }

    /// Arms `fault` for the next `PUT` of an object whose path ends with `suffix`.
    pub fn arm(&self, fault: Fault, suffix: &str) {
        *self.state.armed.lock().unwrap() = Some((fault, suffix.to_string()));
    }

    /// How many faults were applied so far.
    pub fn applied(&self) -> usize {
        self.state.applied.load(Ordering::SeqCst)
    }

    /// Waits until S3 has answered the write a [`Fault::Hold`] was armed for (its answer is
    /// held), or the write a [`Fault::HoldWrite`] was armed for arrived (it is held); panics
    /// after `within`.
    pub async fn wait_held(&self, within: Duration) {
        tokio::time::timeout(within, self.state.held.notified())
            .await
            .expect("the armed write never reached S3");
    }

    /// Lets a held answer go (the connection is closed instead).
    pub fn release(&self) {
        self.state.release.notify_one();
    }

    /// Answers `503` to every read of an object whose path contains one of `parts`, until
    /// [`Self::heal`].
    pub fn fail_reads(&self, parts: &[&str]) {
        *self.state.failing_reads.lock().unwrap() = parts.iter().map(|p| p.to_string()).collect();
    }

    /// Reads pass again.
    pub fn heal(&self) {
        self.state.failing_reads.lock().unwrap().clear();
    }

    /// How many reads were answered `503`.
    pub fn failed_reads(&self) -> usize {
        self.state.failed_reads.load(Ordering::SeqCst)
    }
}

impl Drop for S3Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Answer = hyper::Response<Full<Bytes>>;

/// Sends `req` on to S3 and answers with S3's answer, unless a fault takes it.
async fn forward(state: Arc<S3State>, req: hyper::Request<Incoming>) -> Result<Answer, String> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
    let failing = parts.method == http::Method::GET
        && (state.failing_reads.lock().unwrap())
            .iter()
            .any(|p| parts.uri.path().contains(p.as_str()));
    if failing {
        state.failed_reads.fetch_add(1, Ordering::SeqCst);
        let mut answer = hyper::Response::new(Full::new(Bytes::from_static(
            b"<Error><Code>ServiceUnavailable</Code></Error>",
        )));
        *answer.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
        return Ok(answer);
    }
    let fault = {
        let mut armed = state.armed.lock().unwrap();
        match &*armed {
            Some((_, suffix))
                if parts.method == http::Method::PUT && parts.uri.path().ends_with(suffix) =>
            {
                armed.take().map(|(f, _)| f)
            }
            _ => None,
        }
    };
    if let Some(Fault::HoldWrite) = fault {
        state.applied.fetch_add(1, Ordering::SeqCst);
        state.held.notify_one();
        state.release.notified().await;
    }
    let stream = TcpStream::connect(state.upstream)
        .await
        .map_err(|e| format!("S3 is not there: {e}"))?;
    let (mut send, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let mut out = hyper::Request::from_parts(parts, Full::new(body));
    *out.uri_mut() = out
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .parse()
        .unwrap();
    let resp = send.send_request(out).await.map_err(|e| e.to_string())?;
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
    let Some(fault) = fault.filter(|f| !matches!(f, Fault::HoldWrite)) else {
        return Ok(hyper::Response::from_parts(parts, Full::new(body)));
    };
    state.applied.fetch_add(1, Ordering::SeqCst);
    match fault {
        Fault::Drop => {}
        Fault::Delay(d) => tokio::time::sleep(d).await,
        Fault::Hold => {
            state.held.notify_one();
            state.release.notified().await;
        }
        Fault::HoldWrite => unreachable!("answered above"),
    }
    Err(format!(
        "fault: S3 answered {}; the answer is lost",
        parts.status
    ))
}

/// A TCP proxy in front of a Redis server (`port` is what its clients are pointed at).
pub struct RedisProxy {
    /// The port it listens on (127.0.0.1).
    pub port: u16,
    /// Whether the next write (`EVALSHA`/`EVAL`: Tern's writes are one script) loses its reply.
    armed: Arc<Mutex<bool>>,
    applied: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl RedisProxy {
    /// A proxy to the Redis server on 127.0.0.1:`upstream`.
    pub async fn start(upstream: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let armed = Arc::new(Mutex::new(false));
        let applied = Arc::new(AtomicUsize::new(0));
        let (a, n) = (armed.clone(), applied.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                let (a, n) = (a.clone(), n.clone());
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                        return;
                    };
                    relay(client, server, a, n).await;
                });
            }
        });
        Self {
            port,
            armed,
            applied,
            task,
        }
    }

    /// Arms the loss of the reply to the next write.
    pub fn arm(&self) {
        *self.armed.lock().unwrap() = true;
    }

    /// How many replies were lost so far.
    pub fn applied(&self) -> usize {
        self.applied.load(Ordering::SeqCst)
    }
}

impl Drop for RedisProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Moves bytes both ways between `client` and `server`; once a write passes while armed, the
/// server's next reply is read and both connections are closed instead of passing it on.
async fn relay(
    client: TcpStream,
    server: TcpStream,
    armed: Arc<Mutex<bool>>,
    applied: Arc<AtomicUsize>,
) {
    let (mut client_rx, mut client_tx) = client.into_split();
    let (mut server_rx, mut server_tx) = server.into_split();
    let doomed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let d = doomed.clone();
    let up = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match client_rx.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let chunk = &buf[..n];
            let is_write = chunk.windows(4).any(|w| w.eq_ignore_ascii_case(b"EVAL"));
            if is_write && std::mem::take(&mut *armed.lock().unwrap()) {
                d.store(true, Ordering::SeqCst);
            }
            if server_tx.write_all(chunk).await.is_err() {
                return;
            }
        }
    };
    let down = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match server_rx.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if doomed.load(Ordering::SeqCst) {
                // The write was applied; its reply never arrives.
                applied.fetch_add(1, Ordering::SeqCst);
                return;
            }
            if client_tx.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    // Whichever side ends first ends both (dropping the halves closes the sockets).
    tokio::select! {
        () = up => {}
        () = down => {}
    }
}
