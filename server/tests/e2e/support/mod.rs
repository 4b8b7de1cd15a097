//! Shared test helpers: start a Tern server from a config snippet, speak HTTP to it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tern::config::Config;
use tern::server::Running;

mod guests;
mod process;

pub use guests::*;
pub use process::*;

/// A Tern server running in this test process on ephemeral ports.
pub struct TestServer {
    pub running: Running,
    /// Temporary files: the config dir, module files, the artifact cache.
    pub dir: tempfile::TempDir,
}

/// The admin token of [`TestServer`]s.
pub const ADMIN_TOKEN: &str = "test-admin-token";

/// A small pool keeps many test servers within the address space.
const POOL: &str = "[pool]\ninstances = 16\nmax_memory_mib = 64\n";

impl TestServer {
    /// Starts a server whose config is `tenants` (TOML `[[tenant]]` tables) plus a small pool.
    pub async fn start(tenants: &str) -> Self {
        Self::try_start(tenants)
            .await
            .unwrap_or_else(|e| panic!("server failed to start: {e:#}"))
    }

    /// Like [`start`], but returns the start-up error.
    pub async fn try_start(tenants: &str) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        Self::try_start_in(dir, &format!("{POOL}{tenants}")).await
    }

    /// Starts with a complete config text, in `dir` (module paths are relative to it; the
    /// config is written to `dir/tern.toml`, the data directory is `dir/data`).
    pub async fn try_start_in(dir: tempfile::TempDir, config: &str) -> anyhow::Result<Self> {
        let cache = dir.path().join("cache");
        let path = dir.path().join("tern.toml");
        std::fs::write(&path, config)?;
        let mut config = Config::load(&path)?;
        // A listener the test chose on port 0 (`[::]:0`: dual-stack) is kept.
        if config.server.listen.is_some_and(|l| l.port() != 0) {
            config.server.listen = Some("127.0.0.1:0".parse()?);
        }
        config.server.admin_listen = "127.0.0.1:0".parse()?;
        config.server.cache_dir = cache.display().to_string();
        config.server.shutdown_grace_ms = 2000;
        config.server.admin_token = ADMIN_TOKEN.into();
        let opts = tern::server::StartOptions {
            config_path: Some(path),
            data_dir: Some(dir.path().join("data")),
        };
        let running = tern::server::start_with(config, opts).await?;
        Ok(Self { running, dir })
    }

    /// An admin API request with the right token; the answer's JSON (or `null`).
    pub async fn admin_call(
        &self,
        method: Method,
        path: &str,
        body: impl Into<Bytes>,
    ) -> (StatusCode, serde_json::Value) {
        admin_request(self.admin(), ADMIN_TOKEN, method, path, body.into()).await
    }

    /// The status of a bodiless admin API call.
    pub async fn admin_status(&self, method: Method, path: &str) -> StatusCode {
        self.admin_call(method, path, "").await.0
    }

    /// Creates API tenant `name` routed at `path` and deploys `wasm` to it; panics on failure.
    pub async fn deploy(&self, name: &str, path: &str, wasm: &[u8]) -> serde_json::Value {
        self.deploy_query(name, path, wasm, "").await
    }

    /// Creates API tenant `name` with `spec` (a new tenant: `201`) and deploys `wasm` to it
    /// (`200`); panics otherwise. The deploy's answer.
    pub async fn create_and_deploy(
        &self,
        name: &str,
        spec: serde_json::Value,
        wasm: &[u8],
    ) -> serde_json::Value {
        let at = format!("/admin/v1/tenants/{name}");
        let (status, v) = self.admin_call(Method::PUT, &at, spec.to_string()).await;
        assert_eq!(status, StatusCode::CREATED, "create {name}: {v}");
        let (status, v) = self
            .admin_call(Method::PUT, &format!("{at}/module"), wasm.to_vec())
            .await;
        assert_eq!(status, StatusCode::OK, "deploy {name}: {v}");
        v
    }

    /// [`Self::deploy`] as guest kind `kind`.
    pub async fn deploy_as(
        &self,
        name: &str,
        path: &str,
        wasm: &[u8],
        kind: &str,
    ) -> serde_json::Value {
        self.deploy_query(name, path, wasm, &format!("?kind={kind}"))
            .await
    }

    async fn deploy_query(
        &self,
        name: &str,
        path: &str,
        wasm: &[u8],
        query: &str,
    ) -> serde_json::Value {
        let spec = serde_json::json!({ "paths": [path] }).to_string();
        let (status, v) = self
            .admin_call(Method::PUT, &format!("/admin/v1/tenants/{name}"), spec)
            .await;
        assert!(status.is_success(), "create {name}: {status} {v}");
        let (status, v) = self
            .admin_call(
                Method::PUT,
                &format!("/admin/v1/tenants/{name}/module{query}"),
                wasm.to_vec(),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "deploy {name}: {v}");
        v
    }

    /// The demo tenants of the built-in config, on a small pool.
    pub async fn demo() -> Self {
        let demo = tern::config::DEMO_CONFIG;
        let tenants = &demo[demo.find("[[tenant]]").expect("demo has tenants")..];
        Self::start(tenants).await
    }

    pub fn addr(&self) -> SocketAddr {
        self.running.addr.expect("a cleartext listener")
    }

    /// The server's data directory.
    pub fn data_dir(&self) -> std::path::PathBuf {
        self.dir.path().join("data")
    }

    pub fn admin(&self) -> SocketAddr {
        self.running.admin_addr
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub async fn get(&self, path: &str) -> Reply {
        get_at(self.addr(), path).await
    }

    pub async fn metrics(&self) -> String {
        let r = get_at(self.admin(), "/metrics").await;
        assert_eq!(r.status, StatusCode::OK);
        r.text()
    }

    /// Waits until the series `series` of its metrics is exactly `value` (panics after 20 s,
    /// saying `what`).
    pub async fn wait_metric_is(&self, series: &str, value: f64, what: &str) {
        self.wait_for(what, |m| metric_is(m, series, value)).await;
    }

    /// Waits until the series `series` of its metrics is `at_least` (panics after 20 s): a
    /// condition to wait for, never a sleep.
    pub async fn wait_metric(&self, series: &str, at_least: f64) {
        let what = format!("{series} never reached {at_least}");
        self.wait_for(&what, |m| metric_value_or_zero(m, series) >= at_least)
            .await;
    }

    /// Reads its metrics until `ready` says yes of them (panics after 20 s, saying `what`).
    async fn wait_for(&self, what: &str, ready: impl Fn(&str) -> bool) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let m = self.metrics().await;
            if ready(&m) {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "{what}: {m}");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }
}

/// An admin API request to the admin listener at `admin` with the bearer `token`; the
/// answer's status and JSON (or `null`).
pub async fn admin_request(
    admin: SocketAddr,
    token: &str,
    method: Method,
    path: &str,
    body: Bytes,
) -> (StatusCode, serde_json::Value) {
    let auth = format!("Bearer {token}");
    let r = send(admin, method, path, None, &[("authorization", &auth)], body).await;
    let json = serde_json::from_slice(&r.body).unwrap_or(serde_json::Value::Null);
    (r.status, json)
}

/// A GET of `path` at `addr`, on a fresh connection.
pub async fn get_at(addr: SocketAddr, path: &str) -> Reply {
    send(addr, Method::GET, path, None, &[], Bytes::new()).await
}

/// A built-in demo guest's module (`hello`, `echo`, `json`, `counter`).
pub fn demo(name: &str) -> &'static [u8] {
    tern::demo::module(name).expect("demo guest")
}

/// A response, fully read.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .map_or("", |v| v.to_str().unwrap_or(""))
    }
}

pub fn request(
    method: Method,
    path: &str,
    host: Option<&str>,
    headers: &[(&str, &str)],
    body: Bytes,
) -> Request<Full<Bytes>> {
    let mut b = Request::builder().method(method).uri(path);
    b = b.header("host", host.unwrap_or("localhost"));
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Full::new(body)).expect("valid test request")
}

/// One HTTP/1.1 request on a fresh connection.
pub async fn send(
    addr: SocketAddr,
    method: Method,
    path: &str,
    host: Option<&str>,
    headers: &[(&str, &str)],
    body: Bytes,
) -> Reply {
    let mut conn = Conn::open(addr).await;
    conn.send(request(method, path, host, headers, body)).await
}

/// A POST of `body` to `path` with `headers`, on a new connection.
pub async fn post(s: &TestServer, path: &str, headers: &[(&str, &str)], body: Vec<u8>) -> Reply {
    send(
        s.addr(),
        Method::POST,
        path,
        None,
        headers,
        Bytes::from(body),
    )
    .await
}

/// A keep-alive HTTP/1.1 connection.
pub struct Conn {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
}

impl Conn {
    pub async fn open(addr: SocketAddr) -> Self {
        let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("handshake");
        tokio::spawn(conn);
        Self { sender }
    }

    pub async fn get(&mut self, path: &str) -> Reply {
        self.send(request(Method::GET, path, None, &[], Bytes::new()))
            .await
    }

    /// A GET, or `None` once the server has closed the connection (e.g. at shutdown).
    pub async fn try_get(&mut self, path: &str) -> Option<Reply> {
        self.sender.ready().await.ok()?;
        let req = request(Method::GET, path, None, &[], Bytes::new());
        match self.sender.send_request(req).await {
            Ok(resp) => Some(read(resp).await),
            // Closed before the request was sent: never accepted, so nothing was dropped.
            Err(e) if e.is_canceled() || e.is_closed() || e.is_incomplete_message() => None,
            Err(e) => panic!("request failed: {e}"),
        }
    }

    pub async fn send(&mut self, req: Request<Full<Bytes>>) -> Reply {
        self.sender.ready().await.expect("connection ready");
        let resp = self.sender.send_request(req).await.expect("response");
        read(resp).await
    }
}

async fn read(resp: http::Response<hyper::body::Incoming>) -> Reply {
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.expect("read body").to_bytes();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

/// One HTTP/2 (prior knowledge) request.
pub async fn send_h2(addr: SocketAddr, path: &str) -> Reply {
    H2Conn::open(addr).await.get(path).await
}

/// An HTTP/2 (prior knowledge) connection; clones share it, so requests can run concurrently
/// as streams of one connection.
#[derive(Clone)]
pub struct H2Conn {
    addr: SocketAddr,
    sender: hyper::client::conn::http2::SendRequest<Full<Bytes>>,
}

impl H2Conn {
    pub async fn open(addr: SocketAddr) -> Self {
        let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let (sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .expect("h2 handshake");
        tokio::spawn(conn);
        Self { addr, sender }
    }

    pub async fn get(&mut self, path: &str) -> Reply {
        self.get_with(path, &[]).await
    }

    /// A GET of `path` with `headers` (each pair a field line of its own).
    pub async fn get_with(&mut self, path: &str, headers: &[(&str, &str)]) -> Reply {
        let uri = format!("http://{}{path}", self.addr);
        self.get_uri_with(&uri, headers).await
    }

    /// A GET of the absolute `uri` (its authority is the request's `:authority`).
    pub async fn get_uri(&mut self, uri: &str) -> Reply {
        self.get_uri_with(uri, &[]).await
    }

    async fn get_uri_with(&mut self, uri: &str, headers: &[(&str, &str)]) -> Reply {
        let mut req = Request::builder().uri(uri);
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let req = req.body(Full::new(Bytes::new())).expect("valid request");
        self.sender.ready().await.expect("h2 connection ready");
        read(self.sender.send_request(req).await.expect("h2 response")).await
    }

    /// A POST of `chunks` on a new connection, as DATA frames of a body whose length is not
    /// declared (no `content-length`: its size is not known up front).
    pub async fn post_unsized(addr: SocketAddr, path: &str, chunks: Vec<Bytes>) -> Reply {
        Self::send_unsized(addr, Method::POST, path, chunks).await
    }

    /// `method path` with `chunks` on a new connection, as DATA frames of a body whose length
    /// is not declared.
    pub async fn send_unsized(
        addr: SocketAddr,
        method: Method,
        path: &str,
        chunks: Vec<Bytes>,
    ) -> Reply {
        let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let (mut sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .expect("h2 handshake");
        tokio::spawn(conn);
        let req = Request::builder()
            .method(method)
            .uri(format!("http://{addr}{path}"))
            .body(Unsized(chunks.into()))
            .expect("valid request");
        sender.ready().await.expect("h2 connection ready");
        read(sender.send_request(req).await.expect("h2 response")).await
    }
}

/// A body of chunks whose size it does not tell (so no `content-length` is sent).
struct Unsized(std::collections::VecDeque<Bytes>);

impl http_body::Body for Unsized {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        std::task::Poll::Ready(self.0.pop_front().map(|c| Ok(http_body::Frame::data(c))))
    }
}

/// The value of the series `series` (name and labels, as the text format writes them), if
/// the metrics have it.
pub fn series_value(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .map(|l| {
            l.rsplit(' ')
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{l:?} has no number"))
        })
}

/// The name of the metric of `series` (before its labels).
fn family(series: &str) -> &str {
    series.split('{').next().unwrap_or(series)
}

/// The value of the series `series` (name and labels). A series that is not there fails the
/// test: a renamed metric must not pass as "it did not happen".
pub fn metric_value(metrics: &str, series: &str) -> f64 {
    series_value(metrics, series).unwrap_or_else(|| {
        let same: Vec<&str> = metrics
            .lines()
            .filter(|l| l.starts_with(family(series)))
            .collect();
        panic!(
            "no series {series} in the metrics; of {}: {same:#?}",
            family(series)
        )
    })
}

/// The value of the series `series`, or 0 if it has none yet (a labelled series appears when
/// first counted) — but only where its metric exists: a metric with no series at all (one
/// renamed or never registered) fails the test.
pub fn metric_value_or_zero(metrics: &str, series: &str) -> f64 {
    let name = family(series);
    let base = ["_count", "_sum", "_bucket"]
        .iter()
        .find_map(|s| name.strip_suffix(s))
        .unwrap_or(name);
    let known = metrics.lines().any(|l| {
        l.strip_prefix("# TYPE ")
            .and_then(|t| t.split(' ').next())
            .is_some_and(|n| n == name || n == base)
    });
    assert!(known, "no metric {name} at all (renamed?)");
    series_value(metrics, series).unwrap_or(0.0)
}

/// Writes a WAT module as a `.wasm` file and returns its path.
pub fn wat_file(dir: &Path, name: &str, wat: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, wat::parse_str(wat).expect("valid WAT")).expect("write module");
    path
}

/// Writes a built-in demo guest as a `.wasm` file.
pub fn demo_file(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(format!("{name}.wasm"));
    std::fs::write(&path, tern::demo::module(name).expect("demo guest")).expect("write module");
    path
}

/// Runs `command` to its end and checks that it succeeded (its output is the failure message).
pub fn ran(command: &mut std::process::Command) -> std::process::Output {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?} cannot run: {e}"));
    assert!(
        out.status.success(),
        "{command:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A port free now (for a server that must be told its port before it starts).
/// A real Prometheus running from `prometheus.yml` in `dir` (its data beside it), with `args`
/// added; killed when dropped.
pub struct Prometheus {
    child: std::process::Child,
    /// Its HTTP API.
    pub addr: SocketAddr,
}

impl Prometheus {
    pub fn start(dir: &Path, args: &[&str]) -> Self {
        let port = free_port();
        let child = std::process::Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect(
                "prometheus is required (Debian package `prometheus`; scripts/test installs it)",
            );
        Self {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port nothing listens on, for a server that must be told its port before it starts.
///
/// It is taken below the kernel's ephemeral range (`ip_local_port_range`), from which both
/// `bind(0)` and outgoing connections draw their ports, so that no other test's socket can take
/// it before its server binds it (a port from `bind(0)`, closed again, once went to another
/// test's connection first); ports are handed out once per test process.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOWEST: u32 = 10_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(0);
    if ephemeral > LOWEST + 1_000 {
        let span = ephemeral - LOWEST;
        // Each test process starts elsewhere in the span, in case two run at once.
        let start = std::process::id().wrapping_mul(7_919) % span;
        for _ in 0..span {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let port = LOWEST + (start + n) % span;
            if std::net::TcpListener::bind(("127.0.0.1", port as u16)).is_ok() {
                return port as u16;
            }
        }
    }
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Stops `s` and returns a new directory holding a copy of its data directory (`data`), for a
/// server started from it as after a restart.
pub fn restart_dir(s: TestServer) -> tempfile::TempDir {
    s.running.shutdown.trigger();
    let dir = tempfile::tempdir().unwrap();
    ran(std::process::Command::new("cp")
        .arg("-a")
        .arg(s.dir.path().join("data"))
        .arg(dir.path().join("data")));
    dir
}

/// WAT for a minimal ABI v1 guest whose handler is `body` (and data at offset 16).
pub fn guest_wat(body: &str, data: &str) -> String {
    format!(
        r#"(module
  (import "tern" "response_set_status" (func $status (param i32) (result i32)))
  (import "tern" "response_body_write" (func $write (param i32 i32) (result i32)))
  (import "tern" "request_uri" (func $uri (param i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "{data}")
  (func (export "_start") {body}))"#
    )
}

/// [`raw_exchange`] off the async runtime, with a 20 s bound that only catches hangs; the reply
/// as text.
pub async fn raw(addr: SocketAddr, bytes: impl Into<Vec<u8>>) -> String {
    let bytes = bytes.into();
    let reply = tokio::task::spawn_blocking(move || {
        raw_exchange(addr, &bytes, std::time::Duration::from_secs(20))
    })
    .await
    .expect("raw exchange thread");
    String::from_utf8_lossy(&reply).into_owned()
}

/// Sends raw bytes on a new connection and reads until the server closes it (or resets it).
/// A server that neither closes nor answers within `limit` fails the test: a hang is never
/// taken for an empty answer.
pub fn raw_exchange(addr: SocketAddr, bytes: &[u8], limit: std::time::Duration) -> Vec<u8> {
    use std::io::{ErrorKind, Read, Write};
    let mut conn = std::net::TcpStream::connect(addr).expect("connect");
    conn.set_read_timeout(Some(limit)).expect("timeout");
    conn.write_all(bytes).expect("send");
    let mut out = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        match conn.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => panic!(
                "the server neither answered nor closed the connection within {limit:?}; \
                 it sent: {:?}",
                String::from_utf8_lossy(&out)
            ),
            Err(_) => break,
        }
    }
    out
}

/// Replaces the file at `path` with `bytes` as Tern writes files (a new file renamed over the
/// old), never truncating the old one: a server's mapping of a `.cwasm` must not be cut short.
pub fn replace_file(path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension("replacing");
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// The series of instance slots taken (by a running guest or one tearing down).
pub const SLOTS_IN_USE: &str = r#"tern_pool_slots{kind="instances",state="in_use"}"#;

/// Asserts `metrics` show every instance slot free.
#[track_caller]
pub fn assert_slots_free(metrics: &str) {
    assert!(
        metric_is(metrics, SLOTS_IN_USE, 0.0),
        "a slot is still in use: {metrics}"
    );
}

/// Whether the series `series` is in `metrics` with exactly `value` (a check by substring would
/// take `... 5` for `... 50`).
pub fn metric_is(metrics: &str, series: &str, value: f64) -> bool {
    series_value(metrics, series) == Some(value)
}
