//! Automatic certificates against Pebble, Let's Encrypt's ACME test server (with its DNS
//! companion answering 127.0.0.1 for every name): a certificate obtained by TLS-ALPN-01 and by
//! HTTP-01, served to a client that trusts only Pebble's root, renewed in the window Pebble
//! suggests, kept serving while Pebble is down and after a restart, renewed by a plain order
//! when the CA refuses the renewal's `replaces` (the certificate already replaced, or another
//! account's); a name another process holds the lease of is left to it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{TestServer, free_port, metric_value, ran, restart_dir, tools_dir};

/// The Pebble release the suite runs (installed by scripts/test under [`tools_dir`]).
const PEBBLE: &str = "pebble-2.10.1";

/// Pebble and its DNS server, stopped when dropped.
pub struct Pebble {
    pebble: Option<Child>,
    dns: Child,
    dir: tempfile::TempDir,
    /// The ACME directory URL.
    pub directory: String,
    management: SocketAddr,
}

impl Pebble {
    /// Starts Pebble issuing certificates valid `validity` seconds, validating HTTP-01 on
    /// 127.0.0.1:`http_port` and TLS-ALPN-01 on 127.0.0.1:`tls_port`.
    pub fn start(http_port: u16, tls_port: u16, validity: u64) -> Self {
        let bin = tools_dir().join(PEBBLE);
        assert!(
            bin.join("pebble").is_file(),
            "Pebble is not installed in {} (bash scripts/test installs it)",
            bin.display()
        );
        let dir = tempfile::tempdir().unwrap();
        // Pebble's own HTTPS certificate, from a CA Tern is told to trust (`ca_root`).
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "Pebble API CA");
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate().unwrap();
        let params = CertificateParams::new(vec!["127.0.0.1".into(), "localhost".into()]).unwrap();
        let cert = params.signed_by(&key, &issuer).unwrap();
        std::fs::write(dir.path().join("api-ca.pem"), ca_cert.pem()).unwrap();
        std::fs::write(dir.path().join("api.pem"), cert.pem()).unwrap();
        std::fs::write(dir.path().join("api.key"), key.serialize_pem()).unwrap();

        let (listen, management, dns) = (free_port(), free_port(), free_port());
        let config = serde_json::json!({ "pebble": {
            "listenAddress": format!("127.0.0.1:{listen}"),
            "managementListenAddress": format!("127.0.0.1:{management}"),
            "certificate": dir.path().join("api.pem"),
            "privateKey": dir.path().join("api.key"),
            "httpPort": http_port,
            "tlsPort": tls_port,
            "ocspResponderURL": "",
            "externalAccountBindingRequired": false,
            "retryAfter": { "authz": 1, "order": 1 },
            "keyAlgorithm": "ecdsa",
            "profiles": { "default": { "description": "test", "validityPeriod": validity } },
        }});
        std::fs::write(dir.path().join("pebble.json"), config.to_string()).unwrap();
        let quiet = |c: &mut Command| {
            c.stdout(Stdio::null()).stderr(Stdio::null());
        };
        let mut d = Command::new(bin.join("pebble-challtestsrv"));
        d.args(["-dnsserver", &format!("127.0.0.1:{dns}")])
            .args(["-management", &format!("127.0.0.1:{}", free_port())])
            .args(["-http01", "", "-https01", "", "-tlsalpn01", "", "-doh", ""])
            .args(["-defaultIPv4", "127.0.0.1", "-defaultIPv6", ""]);
        quiet(&mut d);
        let dns_child = d.spawn().expect("start pebble-challtestsrv");
        let mut p = Self {
            pebble: None,
            dns: dns_child,
            directory: format!("https://127.0.0.1:{listen}/dir"),
            management: format!("127.0.0.1:{management}").parse().unwrap(),
            dir,
        };
        p.start_pebble(dns);
        p
    }

    fn start_pebble(&mut self, dns: u16) {
        let bin = tools_dir().join(PEBBLE);
        let mut c = Command::new(bin.join("pebble"));
        c.arg("-config")
            .arg(self.dir.path().join("pebble.json"))
            .args(["-dnsserver", &format!("127.0.0.1:{dns}")])
            // No random sleep before validating, no refused nonces, a fresh validation per
            // order (so a renewal answers a challenge again).
            .env("PEBBLE_VA_NOSLEEP", "1")
            .env("PEBBLE_WFE_NONCEREJECT", "0")
            .env("PEBBLE_AUTHZREUSE", "0")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        self.pebble = Some(c.spawn().expect("start pebble"));
        let addr: SocketAddr = self
            .directory
            .trim_start_matches("https://")
            .trim_end_matches("/dir")
            .parse()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(addr).is_err()
            || std::net::TcpStream::connect(self.management).is_err()
        {
            assert!(Instant::now() < deadline, "Pebble did not start listening");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The root CA Pebble issues under (made when it started).
    pub fn root(&self) -> CertificateDer<'static> {
        let out = ran(Command::new("curl")
            .args(["-sSf", "--cacert"])
            .arg(self.dir.path().join("api-ca.pem"))
            .arg(format!("https://{}/roots/0", self.management)));
        CertificateDer::from_pem_slice(&out.stdout).expect("Pebble's root")
    }

    /// The CA file Tern trusts for Pebble's API.
    pub fn api_ca(&self) -> PathBuf {
        self.dir.path().join("api-ca.pem")
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.pebble.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Pebble {
    fn drop(&mut self) {
        self.stop();
        let _ = self.dns.kill();
        let _ = self.dns.wait();
    }
}

/// Takes any certificate, so a test can look at what the server presents (even expired).
#[derive(Debug)]
struct Anything(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for Anything {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The leaf certificate the TLS listener at `addr` presents for `sni` (`None`: no handshake).
pub async fn presented(addr: SocketAddr, sni: &str) -> Option<CertificateDer<'static>> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Anything(provider)))
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr).await.ok()?;
    let tls = connector
        .connect(ServerName::try_from(sni.to_string()).unwrap(), tcp)
        .await
        .ok()?;
    tls.get_ref()
        .1
        .peer_certificates()
        .map(|c| c[0].clone().into_owned())
}

/// A TLS handshake with `addr` for `host` by a client trusting only `root`.
async fn connect_trusting(
    addr: SocketAddr,
    host: &str,
    root: &CertificateDer<'static>,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(root.clone()).unwrap();
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr).await?;
    connector
        .connect(ServerName::try_from(host.to_string()).unwrap(), tcp)
        .await
}

/// Whether a handshake with `addr` for `host` succeeds for a client trusting only `root`.
pub async fn trusted(addr: SocketAddr, host: &str, root: &CertificateDer<'static>) -> bool {
    connect_trusting(addr, host, root).await.is_ok()
}

/// `GET /` over HTTPS to `addr` for `host`, trusting only `root`: the status line and body.
pub async fn get_verified(addr: SocketAddr, host: &str, root: &CertificateDer<'static>) -> String {
    let mut tls = connect_trusting(addr, host, root)
        .await
        .unwrap_or_else(|e| panic!("a client trusting Pebble's root refuses {host}: {e}"));
    let req = format!("GET / HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n");
    tls.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = tls.read_to_end(&mut out).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// Polls the server's metrics until `series` reaches `at_least` (panics after `within`).
async fn wait_metric(s: &TestServer, series: &str, at_least: f64, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        let m = s.metrics().await;
        if metric_value(&m, series) >= at_least {
            return m;
        }
        assert!(
            Instant::now() < deadline,
            "{series} did not reach {at_least} within {within:?}:\n{}",
            m.lines()
                .filter(|l| l.contains("acme") || l.contains("tls_"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits (up to 60 s) until `s` has had `at_least` certificates issued; its metrics then.
async fn issued(s: &TestServer, at_least: f64) -> String {
    wait_metric(
        s,
        "tern_acme_orders_total{outcome=\"issued\"}",
        at_least,
        Duration::from_secs(60),
    )
    .await
}

/// A server in `dir` (data in `dir/data`) listening on the given ports, routing `hosts` to the
/// `context` guest, with `[tls.acme]` settings `acme` pointed at `pebble`.
async fn acme_server(
    dir: tempfile::TempDir,
    ports: (u16, u16),
    hosts: &str,
    acme: &str,
    pebble: &Pebble,
) -> TestServer {
    crate::support::test_guest(dir.path(), "context");
    let config = format!(
        "[server]\ntls_listen = \"127.0.0.1:{tls}\"\n\
         [pool]\ninstances = 8\nmax_memory_mib = 64\n\
         [[tenant]]\nname = \"ctx\"\nmodule = \"context.wasm\"\nhosts = [{hosts}]\n\
         [tls.acme]\ndirectory = \"{directory}\"\nca_root = {ca:?}\ncontact = [\"mailto:ops@a.test\"]\n\
         check_interval_seconds = 1\nretry_seconds = 1\n{acme}",
        tls = ports.1,
        directory = pebble.directory,
        ca = pebble.api_ca().display().to_string(),
    );
    let path = dir.path().join("tern.toml");
    std::fs::write(&path, config).unwrap();
    let mut config = tern::config::Config::load(&path).unwrap();
    config.server.listen = Some(format!("127.0.0.1:{}", ports.0).parse().unwrap());
    config.server.admin_listen = "127.0.0.1:0".parse().unwrap();
    config.server.cache_dir = dir.path().join("cache").display().to_string();
    config.server.admin_token = crate::support::ADMIN_TOKEN.into();
    let running = tern::server::start_with(
        config,
        tern::server::StartOptions {
            config_path: Some(path),
            data_dir: Some(dir.path().join("data")),
        },
    )
    .await
    .expect("start");
    TestServer { running, dir }
}

fn index(data: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(data.join("certificates/index.json")).unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_alpn_01_obtains_renews_and_keeps_serving_when_the_ca_is_down() {
    let ports = (free_port(), free_port());
    // Fifteen-second certificates: Pebble suggests renewing them at once, so the test sees
    // renewals within seconds.
    let mut pebble = Pebble::start(ports.0, ports.1, 15);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // `*.w.test` needs DNS validation: it is skipped, `a.test` is ordered.
    let s = acme_server(dir, ports, "\"a.test\", \"*.w.test\"", "", &pebble).await;
    let tls = s.running.tls_addr.unwrap();

    // Obtained, then served to a client that trusts only Pebble's root.
    let m = issued(&s, 1.0).await;
    assert!(
        metric_value(
            &m,
            "tern_tls_certificate_expiry_timestamp_seconds{certificate=\"a.test\"}"
        ) > 0.0,
        "{m}"
    );
    let root = pebble.root();
    let first = presented(tls, "a.test")
        .await
        .expect("a certificate for a.test");
    let reply = get_verified(tls, "a.test", &root).await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.contains("SCHEME=https"), "{reply}");
    let stored = index(&data);
    assert_eq!(
        stored["certificates"]["a.test"]["source"], "acme",
        "{stored}"
    );
    assert_eq!(
        stored["certificates"]["a.test"]["hosts"],
        serde_json::json!(["a.test"])
    );
    assert!(stored["certificates"].get("*.w.test").is_none(), "{stored}");

    // Renewed inside Pebble's suggested window: a new certificate serves.
    issued(&s, 2.0).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let renewed = loop {
        let now = presented(tls, "a.test").await.expect("a certificate");
        if now != first {
            break now;
        }
        assert!(
            Instant::now() < deadline,
            "the renewed certificate is not served"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_ne!(renewed, first);

    // The CA goes away: the renewal fails, is retried, and the certificate serving keeps
    // serving (expired or not, it is the one there is).
    pebble.stop();
    let failed_before = metric_value(
        &s.metrics().await,
        "tern_acme_orders_total{outcome=\"failed\"}",
    );
    let m = wait_metric(
        &s,
        "tern_acme_orders_total{outcome=\"failed\"}",
        failed_before + 2.0,
        Duration::from_secs(60),
    )
    .await;
    let issued = metric_value(&m, "tern_acme_orders_total{outcome=\"issued\"}");
    let serving = presented(tls, "a.test")
        .await
        .expect("still a certificate for a.test");
    let stored = index(&data);
    let bundle = stored["certificates"]["a.test"]["bundle"].as_str().unwrap();
    let pem = std::fs::read(data.join(format!("certificates/{bundle}.pem"))).unwrap();
    assert_eq!(
        serving,
        CertificateDer::from_pem_slice(&pem).unwrap(),
        "the stored certificate is the one served"
    );
    assert_eq!(
        metric_value(
            &s.metrics().await,
            "tern_acme_orders_total{outcome=\"issued\"}"
        ),
        issued,
        "nothing was issued while the CA was down"
    );
    // A restart with the CA still down serves the stored certificate at once.
    let dir2 = restart_dir(s);
    let s2 = acme_server(dir2, (free_port(), free_port()), "\"a.test\"", "", &pebble).await;
    let again = presented(s2.running.tls_addr.unwrap(), "a.test").await;
    assert_eq!(
        again.as_ref(),
        Some(&serving),
        "served from the data directory after a restart"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_01_on_the_cleartext_listener_after_another_process_gives_the_lease_back() {
    let ports = (free_port(), free_port());
    let pebble = Pebble::start(ports.0, ports.1, 3600);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // Another process sharing the data directory holds the lease on b.test.
    std::fs::create_dir_all(data.join("certificates")).unwrap();
    let until = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 600;
    let leased = serde_json::json!({
        "format": 1,
        "certificates": {},
        "leases": { "b.test": { "holder": "another-process", "until": until } },
    });
    std::fs::write(data.join("certificates/index.json"), leased.to_string()).unwrap();
    let s = acme_server(
        dir,
        ports,
        "\"b.test\"",
        "challenge = \"http-01\"\nhosts = [\"b.test\"]\n",
        &pebble,
    )
    .await;
    let tls = s.running.tls_addr.unwrap();

    // It leaves the name to the lease holder: no order, nothing served for b.test.
    let m = wait_metric(
        &s,
        "tern_acme_orders_total{outcome=\"busy\"}",
        2.0,
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(
        metric_value(&m, "tern_acme_orders_total{outcome=\"issued\"}"),
        0.0
    );
    assert_eq!(
        metric_value(&m, "tern_acme_orders_total{outcome=\"failed\"}"),
        0.0
    );
    assert!(
        presented(tls, "b.test").await.is_none(),
        "no certificate yet"
    );

    // An unknown challenge token is not answered by the server: the tenant gets the path.
    let r = crate::support::send(
        s.addr(),
        http::Method::GET,
        "/.well-known/acme-challenge/unknown",
        Some("b.test"),
        &[],
        bytes::Bytes::new(),
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(
        String::from_utf8_lossy(&r.body).contains("PATH_INFO=/.well-known/acme-challenge/unknown")
    );

    // The holder gives the lease back (its process ended): this one orders, answering HTTP-01.
    let mut freed = leased;
    freed["leases"] = serde_json::json!({});
    std::fs::write(data.join("certificates/index.json"), freed.to_string()).unwrap();
    issued(&s, 1.0).await;
    let reply = get_verified(tls, "b.test", &pebble.root()).await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    // The order gave its lease back (an hour-long certificate: no renewal is under way).
    let stored = index(&data);
    assert_eq!(
        stored["certificates"]["b.test"]["source"], "acme",
        "{stored}"
    );
    assert!(
        stored["leases"].as_object().is_some_and(|l| l.is_empty()),
        "lease given back: {stored}"
    );

    // The admin API lists it.
    let (status, list) = s
        .admin_call(http::Method::GET, "/admin/v1/certificates", "")
        .await;
    assert_eq!(status, 200);
    let listed = list["certificates"].as_array().unwrap();
    assert!(
        listed
            .iter()
            .any(|c| c["name"] == "b.test" && c["source"] == "acme"),
        "{list}"
    );
}

/// Answers Pebble's HTTP-01 validation of `token` on `port` with `answer` (as a client of the
/// same account would while Tern is stopped), until the task is aborted.
async fn answer_http_01(port: u16, token: String, answer: String) -> tokio::task::JoinHandle<()> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("the HTTP-01 port is free while Tern is stopped");
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let (token, answer) = (token.clone(), answer.clone());
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tcp.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let path = format!("/.well-known/acme-challenge/{token} ");
                let reply = if String::from_utf8_lossy(&head).contains(&path) {
                    format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{answer}",
                        answer.len()
                    )
                } else {
                    "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                        .into()
                };
                let _ = tcp.write_all(reply.as_bytes()).await;
            });
        }
    })
}

/// The ACME account a stopped server stored in `data`: its file, and the account as a client
/// of `pebble`.
async fn stored_account(data: &Path, pebble: &Pebble) -> (PathBuf, instant_acme::Account) {
    let stored = std::fs::read_dir(data.join("acme"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("account-")
        })
        .expect("the stored ACME account");
    let credentials: instant_acme::AccountCredentials =
        serde_json::from_slice(&std::fs::read(&stored).unwrap()).unwrap();
    let account = instant_acme::Account::builder_with_root(pebble.api_ca())
        .unwrap()
        .from_credentials(credentials)
        .await
        .unwrap();
    (stored, account)
}

/// Waits (10 s at most) until `addr` presents another certificate than `first` for `host`.
async fn replaced(addr: SocketAddr, host: &str, first: &CertificateDer<'static>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while presented(addr, host).await.as_ref() == Some(first) {
        assert!(
            Instant::now() < deadline,
            "the renewed certificate is not served"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A server for `host` (HTTP-01) that obtained its certificate from `pebble`, stopped: its
/// directory and the certificate it served.
async fn obtained_and_stopped(
    ports: (u16, u16),
    host: &str,
    pebble: &Pebble,
) -> (tempfile::TempDir, CertificateDer<'static>) {
    let dir = tempfile::tempdir().unwrap();
    let http_01 = format!("challenge = \"http-01\"\nhosts = [\"{host}\"]\n");
    let s = acme_server(dir, ports, &format!("\"{host}\""), &http_01, pebble).await;
    issued(&s, 1.0).await;
    let first = presented(s.running.tls_addr.unwrap(), host)
        .await
        .expect("a certificate");
    let TestServer { running, dir } = s;
    running.shutdown.trigger();
    running.wait().await;
    (dir, first)
}

/// The server of [`obtained_and_stopped`] started again in `dir`: it renews `host`'s
/// certificate `first` without a failed order, and serves the new one, trusted by Pebble's root.
/// The server is returned running (its directory lives as long as it).
async fn renewed_plainly(
    dir: tempfile::TempDir,
    ports: (u16, u16),
    host: &str,
    pebble: &Pebble,
    first: &CertificateDer<'static>,
) -> TestServer {
    let http_01 = format!("challenge = \"http-01\"\nhosts = [\"{host}\"]\n");
    let s = acme_server(dir, ports, &format!("\"{host}\""), &http_01, pebble).await;
    let m = issued(&s, 1.0).await;
    assert_eq!(
        metric_value(&m, "tern_acme_orders_total{outcome=\"failed\"}"),
        0.0,
        "{m}"
    );
    replaced(s.running.tls_addr.unwrap(), host, first).await;
    let reply = get_verified(s.running.tls_addr.unwrap(), host, &pebble.root()).await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    s
}

/// The ARI CertID of `cert` as Pebble 2.10.1 finds it. Pebble keys the orders it finalized by
/// the serial's magnitude, without the sign byte DER puts before a serial whose first byte is
/// 0x80 or more, so for one serial in 256 it finds no order for the CertID RFC 9773 defines
/// (letsencrypt/pebble#550): a replacement naming it is refused as `serverInternal`. For
/// every other serial the two forms are the same.
fn pebble_certificate_id(
    cert: &CertificateDer<'_>,
) -> instant_acme::CertificateIdentifier<'static> {
    use base64::Engine;
    let url = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let mut id = instant_acme::CertificateIdentifier::try_from(cert)
        .unwrap()
        .into_owned();
    let serial = url.decode(id.serial.as_bytes()).unwrap();
    if let [0, magnitude @ ..] = serial.as_slice()
        && !magnitude.is_empty()
    {
        id.serial = url.encode(magnitude).into();
    }
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_already_replaced_at_the_ca_is_renewed_by_a_plain_order() {
    use instant_acme::{
        ChallengeType, Identifier, NewOrder, OrderStatus, RetryPolicy, RevocationRequest,
    };
    let ports = (free_port(), free_port());
    let pebble = Pebble::start(ports.0, ports.1, 3600);
    let (dir, first) = obtained_and_stopped(ports, "c.test", &pebble).await;
    let data = dir.path().join("data");

    // While it is stopped, an order of the same account replaces its certificate at the CA (as
    // a renewal finalized whose answer was lost would), and the certificate is revoked, so the
    // CA's renewal information says to renew at once.
    let account = stored_account(&data, &pebble).await.1;
    let id = pebble_certificate_id(&first);
    let ids = [Identifier::Dns("c.test".into())];
    let mut order = account
        .new_order(&NewOrder::new(&ids).replaces(id))
        .await
        .unwrap();
    let mut responders = Vec::new();
    let mut authorizations = order.authorizations();
    while let Some(a) = authorizations.next().await {
        let mut a = a.unwrap();
        // An authorization already valid for this account (Pebble handed one back in a CI run
        // despite PEBBLE_AUTHZREUSE=0) has no challenge left to answer.
        if a.status == instant_acme::AuthorizationStatus::Valid {
            continue;
        }
        let mut challenge = a.challenge(ChallengeType::Http01).expect("HTTP-01");
        let answer = challenge.key_authorization().as_str().to_string();
        responders.push(answer_http_01(ports.0, challenge.token.clone(), answer).await);
        challenge.set_ready().await.unwrap();
    }
    let retries = RetryPolicy::new().timeout(Duration::from_secs(60));
    assert_eq!(
        order.poll_ready(&retries).await.unwrap(),
        OrderStatus::Ready
    );
    order.finalize().await.unwrap();
    order.poll_certificate(&retries).await.unwrap();
    for r in responders {
        r.abort();
        let _ = r.await;
    }
    account
        .revoke(&RevocationRequest {
            certificate: &first,
            reason: None,
        })
        .await
        .unwrap();

    // Started again: the renewal its `replaces` would make is refused as already replaced (for
    // a serial Pebble mis-keys, as not found: see `pebble_certificate_id`), and the name is
    // renewed by a plain order, not left failing.
    renewed_plainly(dir, ports, "c.test", &pebble, &first).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_the_ca_will_not_link_to_the_certificate_it_replaces_is_a_plain_order() {
    let ports = (free_port(), free_port());
    let pebble = Pebble::start(ports.0, ports.1, 3600);
    let (dir, first) = obtained_and_stopped(ports, "d.test", &pebble).await;
    let data = dir.path().join("data");

    // While it is stopped, the account that ordered the certificate revokes it (so the CA's
    // renewal information says to renew at once), and the account's file is lost.
    let (stored, account) = stored_account(&data, &pebble).await;
    account
        .revoke(&instant_acme::RevocationRequest {
            certificate: &first,
            reason: None,
        })
        .await
        .unwrap();
    std::fs::remove_file(&stored).unwrap();

    // Started again with a new account: the CA refuses its renewal naming a certificate
    // another account ordered (`unauthorized`), and the name is renewed by a plain order.
    let _s = renewed_plainly(dir, ports, "d.test", &pebble, &first).await;
    assert!(stored.exists(), "a new account is stored");
}
