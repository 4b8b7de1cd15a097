//! The TLS listener, with real clients: certificates made here (rcgen) picked by SNI (exact,
//! wildcard, default), HTTP/2 and HTTP/1.1 chosen by ALPN, what guests see of the session,
//! handshakes that fail or stall closed and counted by reason, and certificate files refused
//! at start with a clear error.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode, Version};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::support::TestServer;

mod certificates;
mod handshakes;
mod https;

/// A CA made for the test.
pub(crate) struct Pki {
    pub(crate) ca: CertificateDer<'static>,
    pub(crate) ca_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Pki {
    pub(crate) fn new() -> Self {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        // Subject names of their own: OpenSSL takes a certificate whose issuer is its subject
        // for self-signed.
        params
            .distinguished_name
            .push(DnType::CommonName, "Tern test CA");
        let cert = params.self_signed(&key).unwrap();
        Self {
            ca: cert.der().clone(),
            ca_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A certificate for `names`, written to `dir/FILE.crt` and `dir/FILE.key`.
    pub(crate) fn issue(&self, dir: &Path, file: &str, names: &[&str]) -> CertificateDer<'static> {
        let key = KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names.clone()).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, names[0].as_str());
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        std::fs::write(dir.join(format!("{file}.crt")), cert.pem()).unwrap();
        std::fs::write(dir.join(format!("{file}.key")), key.serialize_pem()).unwrap();
        cert.der().clone()
    }
}

/// A TLS connection to `addr` asking for `sni`, offering `alpn`, trusting `ca` only.
async fn connect(
    addr: SocketAddr,
    sni: &str,
    alpn: &[&[u8]],
    ca: &CertificateDer<'static>,
) -> std::io::Result<TlsStream<TcpStream>> {
    connect_with(addr, sni, alpn, ca, rustls::DEFAULT_VERSIONS).await
}

/// [`connect`] offering only the TLS `versions`.
async fn connect_with(
    addr: SocketAddr,
    sni: &str,
    alpn: &[&[u8]],
    ca: &CertificateDer<'static>,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> std::io::Result<TlsStream<TcpStream>> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone()).unwrap();
    let mut config = rustls::ClientConfig::builder_with_protocol_versions(versions)
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from(sni.to_string()).unwrap();
    connector.connect(name, tcp).await
}

/// `GET path` over `tls` with HTTP/2 if ALPN chose it, else HTTP/1.1: status, version, body.
async fn get(tls: TlsStream<TcpStream>, host: &str, path: &str) -> (StatusCode, Version, String) {
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
    let io = TokioIo::new(tls);
    let request = |version| {
        Request::get(format!("https://{host}{path}"))
            .version(version)
            .header("host", host)
            .body(Empty::<Bytes>::new())
            .unwrap()
    };
    let response = if h2 {
        let (mut sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .unwrap();
        tokio::spawn(conn);
        sender.send_request(request(Version::HTTP_2)).await.unwrap()
    } else {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
        tokio::spawn(conn);
        sender
            .send_request(request(Version::HTTP_11))
            .await
            .unwrap()
    };
    let (status, version) = (response.status(), response.version());
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, version, String::from_utf8_lossy(&body).into_owned())
}

/// The value the `context` guest printed for `key` (`=value`, or `!errno`).
fn field<'a>(body: &'a str, key: &str) -> &'a str {
    body.lines()
        .find_map(|l| l.strip_prefix(key).filter(|v| v.starts_with(['=', '!'])))
        .unwrap_or_else(|| panic!("{key} missing from {body}"))
}

/// A server with a TLS listener serving `certificates` (TOML `[[certificate]]` tables) and the
/// `context` guest at `/`; the certificate files are in its directory.
async fn tls_server(dir: tempfile::TempDir, certificates: &str) -> anyhow::Result<TestServer> {
    tls_server_with(dir, "", certificates).await
}

/// [`tls_server`] with more `[server]` settings.
async fn tls_server_with(
    dir: tempfile::TempDir,
    server: &str,
    certificates: &str,
) -> anyhow::Result<TestServer> {
    crate::support::test_guest(dir.path(), "context");
    crate::support::test_guest(dir.path(), "cgi_probe");
    crate::support::test_component(dir.path(), "component");
    let config = format!(
        "[server]\ntls_listen = \"127.0.0.1:0\"\ntls_handshake_timeout_ms = 1000\n{server}\
         [pool]\ninstances = 16\nmax_memory_mib = 64\n\
         [[tenant]]\nname = \"ctx\"\nmodule = \"context.wasm\"\n\
         [[tenant]]\nname = \"cgi\"\nmodule = \"cgi_probe.wasm\"\npaths = [\"/cgi\"]\n\
         [[tenant]]\nname = \"comp\"\nmodule = \"component.wasm\"\npaths = [\"/component\"]\n\
         {certificates}"
    );
    TestServer::try_start_in(dir, &config).await
}

/// A server whose TLS listener serves one certificate, for `a.test` (no default): the server,
/// the listener's address, the certificate.
async fn a_test_server(pki: &Pki) -> (TestServer, SocketAddr, CertificateDer<'static>) {
    let dir = tempfile::tempdir().unwrap();
    let cert = pki.issue(dir.path(), "a", &["a.test"]);
    let s = tls_server(
        dir,
        "[[certificate]]\nhosts = [\"a.test\"]\ncert = \"a.crt\"\nkey = \"a.key\"\n",
    )
    .await
    .expect("start");
    let addr = s.running.tls_addr.expect("a TLS listener");
    (s, addr, cert)
}

/// The value of the series `line_start` names (with its trailing space); the test fails if
/// there is none.
fn metric(text: &str, line_start: &str) -> f64 {
    crate::support::metric_value(text, line_start.trim_end())
}

/// The value of `series`, 0 if it has not counted yet (its metric must exist).
fn metric_or_zero(text: &str, series: &str) -> f64 {
    crate::support::metric_value_or_zero(text, series)
}
