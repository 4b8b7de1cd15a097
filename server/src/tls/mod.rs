//! TLS termination: the certificates the TLS listener serves, one per host name or wildcard
//! and a default, picked per handshake by the name the client asks for (SNI) from a table that
//! is swapped whole; and the handshake itself, under a deadline and a cap on handshakes in
//! flight, with failures counted by reason.
//!
//! The crypto provider is aws-lc-rs (rustls' default): its key exchange offers the hybrid
//! post-quantum X25519MLKEM768 that current browsers send first, which ring's does not; it
//! needs only a C compiler to build.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::ProtocolVersion;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

pub mod acme;
mod challenge;
pub mod stored;
pub mod uploads;

use crate::config::CertificateConfig;
use crate::context::TlsInfo;
use crate::metrics::Metrics;

/// Why a certificate could not be loaded; the certificates serving keep serving.
#[derive(Debug, thiserror::Error)]
#[error("certificate {file}: {why}")]
pub struct CertError {
    /// The file at fault.
    pub file: String,
    /// What is wrong with it.
    pub why: String,
}

/// One certificate, loaded and checked.
#[derive(Debug, Clone)]
pub struct Loaded {
    key: Arc<CertifiedKey>,
    /// The host patterns it serves (empty: the default).
    hosts: Vec<String>,
    /// When it expires (Unix seconds).
    pub not_after: i64,
}

impl Loaded {
    /// Reads a PEM certificate chain and its key, checks that they belong together and that
    /// the certificate covers every host in `hosts`; `names` names the two sources in errors.
    ///
    /// # Errors
    /// Unparsable PEM, no certificate or key, a key of another certificate, a host not covered.
    pub fn from_pem(
        cert: &[u8],
        key: &[u8],
        hosts: &[String],
        names: (&str, &str),
    ) -> Result<Self, CertError> {
        let hosts = hosts.iter().map(|h| h.to_ascii_lowercase()).collect();
        check_pem(cert, key, hosts, &|which, why| CertError {
            file: match which {
                Which::Cert => names.0.to_string(),
                Which::Key => names.1.to_string(),
            },
            why,
        })
    }

    /// The leaf certificate (DER).
    pub fn leaf(&self) -> &CertificateDer<'static> {
        &self.key.cert[0]
    }
}

/// The certificates of a TLS listener's config file, loaded and checked.
#[derive(Debug, Default, Clone)]
pub struct Table {
    certificates: Vec<Loaded>,
}

impl Table {
    /// Reads and checks the certificates `configs` name (paths relative to `base_dir`).
    ///
    /// # Errors
    /// The first file that cannot be read or parsed, a key that does not match its
    /// certificate, or a host the certificate does not cover.
    pub fn load(configs: &[CertificateConfig], base_dir: &Path) -> Result<Self, CertError> {
        let mut certificates = Vec::new();
        for c in configs {
            let hosts: Vec<String> = c.hosts.iter().map(|h| h.get_ref().clone()).collect();
            let (cert, key) = (
                base_dir.join(c.cert.get_ref()),
                base_dir.join(c.key.get_ref()),
            );
            let read = |p: &Path| {
                std::fs::read(p).map_err(|e| CertError {
                    file: p.display().to_string(),
                    why: format!("cannot read: {e}"),
                })
            };
            let names = (cert.display().to_string(), key.display().to_string());
            certificates.push(Loaded::from_pem(
                &read(&cert)?,
                &read(&key)?,
                &hosts,
                (&names.0, &names.1),
            )?);
        }
        Ok(Self { certificates })
    }

    /// A table of certificates loaded elsewhere (the data directory's).
    pub fn of(certificates: Vec<Loaded>) -> Self {
        Self { certificates }
    }

    /// Whether a certificate of this table names `pattern` (an exact host or a wildcard) in its
    /// `hosts`.
    pub fn names(&self, pattern: &str) -> bool {
        self.certificates
            .iter()
            .any(|c| c.hosts.iter().any(|h| h == pattern))
    }

    /// Whether the table has a default certificate (one without `hosts`).
    pub fn has_default(&self) -> bool {
        self.certificates.iter().any(|c| c.hosts.is_empty())
    }

    /// Whether the table holds no certificate.
    pub fn is_empty(&self) -> bool {
        self.certificates.is_empty()
    }

    /// Whether a certificate of this table serves `host` by its exact name or a wildcard (the
    /// default does not count).
    pub fn serves(&self, host: &str) -> bool {
        self.certificates
            .iter()
            .any(|c| c.hosts.iter().any(|h| h == host || wildcard_match(h, host)))
    }
}

/// Whether the pattern `*.parent` matches `host` (one label under `parent`).
fn wildcard_match(pattern: &str, host: &str) -> bool {
    pattern.strip_prefix("*.").is_some_and(|parent| {
        host.split_once('.')
            .is_some_and(|(label, rest)| !label.is_empty() && rest == parent)
    })
}

/// What a handshake looks certificates up in: the config file's, then the data directory's
/// (uploaded, then obtained by ACME); a name taken by an earlier one is not taken again.
#[derive(Debug, Default)]
struct ByName {
    exact: HashMap<String, Arc<CertifiedKey>>,
    /// By the suffix after `*.`.
    wildcard: HashMap<String, Arc<CertifiedKey>>,
    default: Option<Arc<CertifiedKey>>,
    /// Each certificate's name (its first host, or `default`) and expiry (Unix seconds).
    expiries: Vec<(String, i64)>,
}

impl ByName {
    fn build<'a>(tables: impl IntoIterator<Item = &'a Table>) -> Self {
        let mut index = Self::default();
        for c in tables.into_iter().flat_map(|t| &t.certificates) {
            let name = c.hosts.first().cloned().unwrap_or_else(|| "default".into());
            if !index.expiries.iter().any(|(n, _)| *n == name) {
                index.expiries.push((name, c.not_after));
            }
            if c.hosts.is_empty() && index.default.is_none() {
                index.default = Some(c.key.clone());
            }
            for h in &c.hosts {
                let map = match h.strip_prefix("*.") {
                    Some(suffix) => index.wildcard.entry(suffix.to_string()),
                    None => index.exact.entry(h.clone()),
                };
                map.or_insert_with(|| c.key.clone());
            }
        }
        index
    }

    /// The certificate for a client asking for `name`: the exact name's, else the wildcard's
    /// of its parent domain, else the default.
    fn pick(&self, name: Option<&str>) -> Option<Arc<CertifiedKey>> {
        let found = name.and_then(|n| {
            // rustls hands the name over lowercased and without a trailing dot.
            self.exact.get(n).or_else(|| {
                let (_, parent) = n.split_once('.')?;
                self.wildcard.get(parent)
            })
        });
        found.or(self.default.as_ref()).cloned()
    }
}

enum Which {
    Cert,
    Key,
}

/// Parses and checks a PEM certificate chain and key (see [`Loaded::from_pem`]).
fn check_pem(
    cert: &[u8],
    key: &[u8],
    hosts: Vec<String>,
    fail: &dyn Fn(Which, String) -> CertError,
) -> Result<Loaded, CertError> {
    let chain = CertificateDer::pem_slice_iter(cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| fail(Which::Cert, pem_error(&e)))?;
    let Some(leaf) = chain.first() else {
        return Err(fail(
            Which::Cert,
            "holds no certificate (no `BEGIN CERTIFICATE` block)".into(),
        ));
    };
    let private =
        PrivateKeyDer::from_pem_slice(key).map_err(|e| fail(Which::Key, pem_error(&e)))?;
    let provider = rustls::crypto::aws_lc_rs::default_provider();
    let certified = CertifiedKey::from_der(chain.clone(), private, &provider).map_err(|e| {
        fail(
            Which::Key,
            match e {
                rustls::Error::InconsistentKeys(_) => {
                    "this key does not belong to the certificate".to_string()
                }
                e => format!("not a usable private key: {e}"),
            },
        )
    })?;
    let (_, parsed) = x509_parser::parse_x509_certificate(leaf)
        .map_err(|e| fail(Which::Cert, format!("not a valid X.509 certificate: {e}")))?;
    let names: Vec<String> = parsed
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    x509_parser::extensions::GeneralName::DNSName(d) => {
                        Some(d.to_ascii_lowercase())
                    }
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    for h in &hosts {
        if !covers(&names, h) {
            return Err(fail(
                Which::Cert,
                format!(
                    "does not cover host {h:?} (its names: {})",
                    if names.is_empty() {
                        "none".to_string()
                    } else {
                        names.join(", ")
                    }
                ),
            ));
        }
    }
    let not_after = parsed.validity().not_after.timestamp();
    if not_after < crate::datadir::now() as i64 {
        tracing::warn!(
            certificate = hosts.first().map_or("default", String::as_str),
            "the certificate has expired: clients will refuse it"
        );
    }
    Ok(Loaded {
        key: Arc::new(certified),
        hosts,
        not_after,
    })
}

/// Whether a certificate with DNS names `names` is valid for every name `host` stands for: an
/// exact host by its own name or a wildcard of its parent; a wildcard host by the same wildcard.
fn covers(names: &[String], host: &str) -> bool {
    names
        .iter()
        .any(|n| n == host || (!host.starts_with("*.") && wildcard_match(n, host)))
}

fn pem_error(e: &rustls::pki_types::pem::Error) -> String {
    match e {
        rustls::pki_types::pem::Error::Io(io) => format!("cannot read: {io}"),
        rustls::pki_types::pem::Error::NoItemsFound => "holds no PEM block of that kind".into(),
        e => format!("not valid PEM: {e:?}"),
    }
}

/// The certificates a TLS listener serves: the config file's table and the data directory's,
/// each replaced whole; the next handshake sees the new index (connections already open keep
/// theirs). Also the answers to ACME TLS-ALPN-01 and HTTP-01 challenges in progress.
#[derive(Debug)]
pub struct Certificates {
    index: ArcSwap<ByName>,
    /// The config file's table and the data directory's; the lock orders rebuilds.
    tables: std::sync::Mutex<(Arc<Table>, Arc<Table>)>,
    expiry: prometheus::IntGaugeVec,
    /// TLS-ALPN-01 answers by host name (RFC 8737).
    alpn_challenges: std::sync::Mutex<HashMap<String, Arc<CertifiedKey>>>,
    /// HTTP-01 key authorizations by token.
    http_challenges: std::sync::Mutex<HashMap<String, String>>,
    /// Where uploaded and ACME certificates are kept.
    store: stored::CertStore,
}

impl Certificates {
    /// Serves `table` (the config file's) and what `store` holds; the expiry dates go to
    /// `metrics`.
    pub fn new(table: Table, store: stored::CertStore, metrics: &Metrics) -> Arc<Self> {
        let this = Arc::new(Self {
            index: ArcSwap::from_pointee(ByName::default()),
            tables: std::sync::Mutex::new((Arc::new(Table::default()), Arc::default())),
            expiry: metrics.tls_certificate_expiry.clone(),
            alpn_challenges: std::sync::Mutex::default(),
            http_challenges: std::sync::Mutex::default(),
            store,
        });
        this.replace(table);
        this
    }

    /// Serves `table` in place of the config file's from the next handshake on.
    pub fn replace(&self, table: Table) {
        self.rebuild(|tables| tables.0 = Arc::new(table));
    }

    /// Serves `table` in place of the data directory's from the next handshake on.
    pub fn replace_stored(&self, table: Table) {
        self.rebuild(|tables| tables.1 = Arc::new(table));
    }

    /// The config file's table and the data directory's.
    pub fn tables(&self) -> (Arc<Table>, Arc<Table>) {
        self.tables
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn rebuild(&self, change: impl FnOnce(&mut (Arc<Table>, Arc<Table>))) {
        let mut tables = self.tables.lock().unwrap_or_else(|e| e.into_inner());
        change(&mut tables);
        let index = Arc::new(ByName::build([&*tables.0, &*tables.1]));
        let old = self.index.swap(index.clone());
        for (name, _) in &old.expiries {
            let _ = self.expiry.remove_label_values(&[name]);
        }
        for (name, at) in &index.expiries {
            self.expiry.with_label_values(&[name]).set(*at);
        }
    }

    /// Answers TLS-ALPN-01 challenges for `host` with `key` (`None`: stops answering).
    pub fn set_alpn_challenge(&self, host: &str, key: Option<Arc<CertifiedKey>>) {
        set_or_remove(&self.alpn_challenges, host, key);
    }

    /// Answers the HTTP-01 challenge `token` with `key_authorization` (`None`: stops).
    pub fn set_http_challenge(&self, token: &str, key_authorization: Option<String>) {
        set_or_remove(&self.http_challenges, token, key_authorization);
    }

    /// The key authorization of the HTTP-01 challenge `token`, if one is in progress.
    pub fn http_challenge(&self, token: &str) -> Option<String> {
        self.http_challenges
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(token)
            .cloned()
    }
}

/// Puts `value` under `key` in `map`, or removes the key for `None`.
fn set_or_remove<V>(map: &std::sync::Mutex<HashMap<String, V>>, key: &str, value: Option<V>) {
    let mut map = map.lock().unwrap_or_else(|e| e.into_inner());
    match value {
        Some(v) => map.insert(key.to_string(), v),
        None => map.remove(key),
    };
}

/// The ALPN protocol of TLS-ALPN-01 validation (RFC 8737).
pub const ACME_TLS_ALPN: &[u8] = b"acme-tls/1";

impl ResolvesServerCert for Certificates {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        if hello
            .alpn()
            .is_some_and(|mut offered| offered.any(|p| p == ACME_TLS_ALPN))
        {
            // A CA validating a name: only its challenge certificate answers (RFC 8737 §3).
            let name = hello.server_name()?;
            let map = self
                .alpn_challenges
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            return map.get(name).cloned();
        }
        self.index.load().pick(hello.server_name())
    }
}

/// What a completed handshake gives the listener.
pub struct Accepted {
    /// The encrypted stream.
    pub stream: TlsStream<TcpStream>,
    /// What the guests see of it.
    pub info: Arc<TlsInfo>,
    /// Whether the client chose HTTP/2 (ALPN `h2`).
    pub h2: bool,
}

/// Takes TLS handshakes for a listener.
pub struct Acceptor {
    inner: tokio_rustls::TlsAcceptor,
    /// Handshakes in flight.
    handshakes: Arc<tokio::sync::Semaphore>,
    /// The size of `handshakes`.
    max_handshakes: usize,
    timeout: Duration,
    done: prometheus::IntCounter,
    failures: prometheus::IntCounterVec,
    /// Handshakes holding a permit, for operators watching the cap.
    in_progress: prometheus::IntGauge,
    retries: prometheus::IntCounter,
    /// The certificates served.
    pub certificates: Arc<Certificates>,
}

debug_fields!(Acceptor: timeout);

impl Acceptor {
    /// An acceptor serving `certificates` over TLS 1.2 and 1.3, offering HTTP/2 and HTTP/1.1
    /// by ALPN, with session resumption (tickets and a session cache), at most `max_handshakes`
    /// at once, each within `timeout`.
    ///
    /// # Errors
    /// If the crypto provider cannot make a ticket key (the system's random source failed).
    pub fn new(
        certificates: Arc<Certificates>,
        max_handshakes: usize,
        timeout: Duration,
        metrics: &Metrics,
    ) -> Result<Self, rustls::Error> {
        let config = server_config(
            &certificates,
            rustls::DEFAULT_VERSIONS,
            // `acme-tls/1` last: only a CA validating a TLS-ALPN-01 challenge offers it.
            vec![b"h2".to_vec(), b"http/1.1".to_vec(), ACME_TLS_ALPN.to_vec()],
        )?;
        // Every reason from the start: a rate over a series that appears only with its first
        // failure is no rate at all.
        for reason in [
            "timeout",
            "busy",
            "no_certificate",
            "protocol",
            "alert",
            "io",
        ] {
            metrics.tls_handshake_failures.with_label_values(&[reason]);
        }
        Ok(Self {
            inner: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
            handshakes: Arc::new(tokio::sync::Semaphore::new(max_handshakes)),
            max_handshakes,
            timeout,
            done: metrics.tls_handshakes.clone(),
            failures: metrics.tls_handshake_failures.clone(),
            in_progress: metrics.tls_handshakes_in_progress.clone(),
            retries: metrics.quic_retries.clone(),
            certificates,
        })
    }

    /// The rustls configuration of the QUIC listener: the same certificates, provider, cipher
    /// order and session tickets as TCP, TLS 1.3 only (QUIC has no other), ALPN `h3`, and no
    /// early data (0-RTT off: a replayed request could not be told apart).
    ///
    /// # Errors
    /// If the crypto provider cannot make a ticket key.
    pub fn quic_config(&self) -> Result<rustls::ServerConfig, rustls::Error> {
        server_config(
            &self.certificates,
            &[&rustls::version::TLS13],
            vec![b"h3".to_vec()],
        )
    }

    /// The time a handshake may take.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A place among the handshakes in flight (shared by TCP and QUIC), counted in the
    /// in-progress gauge while held; `None`, counted as a `busy` failure, at the cap.
    pub fn handshake(&self) -> Option<Handshake<'_>> {
        let Ok(permit) = self.handshakes.try_acquire() else {
            self.failed("busy");
            return None;
        };
        Some(Handshake {
            _permit: permit,
            _counted: crate::metrics::GaugeGuard::new(&self.in_progress),
        })
    }

    /// Whether more than half the handshake cap is in flight (a QUIC client is then asked to
    /// prove its address first).
    pub fn busy(&self) -> bool {
        self.handshakes.available_permits() < self.max_handshakes / 2
    }

    /// Counts a QUIC Retry sent (a client asked to prove its address, see [`Self::busy`]).
    pub fn retried(&self) {
        self.retries.inc();
    }

    /// Counts a completed handshake.
    pub fn completed(&self) {
        self.done.inc();
    }

    /// Counts a failed handshake by `reason`.
    pub fn failed(&self, reason: &str) {
        self.failures.with_label_values(&[reason]).inc();
    }

    /// Takes the handshake of `stream`; `None` (counted by reason) if it fails, takes too long,
    /// or too many are in flight.
    pub async fn accept(&self, stream: TcpStream) -> Option<Accepted> {
        let failed = |reason: &str| {
            self.failed(reason);
            None
        };
        let _handshake = self.handshake()?;
        let stream = match tokio::time::timeout(self.timeout, self.inner.accept(stream)).await {
            Err(_) => return failed("timeout"),
            Ok(Err(e)) => {
                tracing::debug!("TLS handshake failed: {e}");
                return failed(reason(&e));
            }
            Ok(Ok(stream)) => stream,
        };
        self.completed();
        let (_, conn) = stream.get_ref();
        if conn.alpn_protocol() == Some(ACME_TLS_ALPN) {
            // The CA has seen the challenge certificate; the connection carries nothing else.
            return None;
        }
        let info = TlsInfo {
            protocol: match conn.protocol_version() {
                Some(ProtocolVersion::TLSv1_3) => "TLSv1.3",
                Some(ProtocolVersion::TLSv1_2) => "TLSv1.2",
                _ => "TLS",
            },
            sni: conn.server_name().map(str::to_owned),
        };
        let h2 = conn.alpn_protocol() == Some(b"h2");
        Some(Accepted {
            stream,
            info: Arc::new(info),
            h2,
        })
    }
}

/// A handshake's place among those in flight ([`Acceptor::handshake`]).
pub struct Handshake<'a> {
    _permit: tokio::sync::SemaphorePermit<'a>,
    _counted: crate::metrics::GaugeGuard<&'a prometheus::IntGauge>,
}

/// A rustls server configuration serving `certificates` over `versions`, offering `alpn`.
fn server_config(
    certificates: &Arc<Certificates>,
    versions: &[&'static rustls::SupportedProtocolVersion],
    alpn: Vec<Vec<u8>>,
) -> Result<rustls::ServerConfig, rustls::Error> {
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_protocol_versions(versions)?
    .with_no_client_auth()
    .with_cert_resolver(certificates.clone());
    // The server's order of cipher suites, not the client's (every suite offered is
    // strong; a client listing a weaker one first does not get it): what testssl.sh and
    // other graders check for.
    config.ignore_client_order = true;
    config.alpn_protocols = alpn;
    config.ticketer = rustls::crypto::aws_lc_rs::Ticketer::new()?;
    config.session_storage = rustls::server::ServerSessionMemoryCache::new(16 * 1024);
    Ok(config)
}

/// The reason a handshake failed, for the failure counter.
fn reason(e: &std::io::Error) -> &'static str {
    let Some(tls) = e.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>()) else {
        return "io";
    };
    match tls {
        rustls::Error::AlertReceived(_) => "alert",
        rustls::Error::General(m) if m.contains("no server certificate") => "no_certificate",
        _ => "protocol",
    }
}

#[cfg(test)]
mod tests {
    use super::covers;

    #[test]
    fn a_certificate_covers_its_names_and_one_label_under_its_wildcards() {
        let names = ["a.test".to_string(), "*.w.test".to_string()];
        assert!(covers(&names, "a.test"));
        assert!(covers(&names, "x.w.test"));
        assert!(covers(&names, "*.w.test"));
        assert!(!covers(&names, "w.test"));
        assert!(!covers(&names, "y.x.w.test"));
        assert!(!covers(&names, "*.test"));
        assert!(!covers(&names, "b.test"));
    }
}
