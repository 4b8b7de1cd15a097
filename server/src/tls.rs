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
struct Loaded {
    key: Arc<CertifiedKey>,
    /// The host patterns it serves (empty: the default).
    hosts: Vec<String>,
    /// When it expires (Unix seconds).
    not_after: i64,
}

/// The certificates of a TLS listener, by the name they serve.
#[derive(Debug, Default)]
pub struct Table {
    exact: HashMap<String, Arc<CertifiedKey>>,
    /// By the suffix after `*.`.
    wildcard: HashMap<String, Arc<CertifiedKey>>,
    default: Option<Arc<CertifiedKey>>,
    /// Each certificate's name (its first host, or `default`) and expiry (Unix seconds).
    expiries: Vec<(String, i64)>,
}

impl Table {
    /// Reads and checks the certificates `configs` name (paths relative to `base_dir`).
    ///
    /// # Errors
    /// The first file that cannot be read or parsed, a key that does not match its
    /// certificate, or a host the certificate does not cover.
    pub fn load(configs: &[CertificateConfig], base_dir: &Path) -> Result<Self, CertError> {
        let mut table = Self::default();
        for c in configs {
            let hosts: Vec<String> = c
                .hosts
                .iter()
                .map(|h| h.get_ref().to_ascii_lowercase())
                .collect();
            let loaded = load_one(
                &base_dir.join(c.cert.get_ref()),
                &base_dir.join(c.key.get_ref()),
                hosts,
            )?;
            table.add(loaded);
        }
        Ok(table)
    }

    fn add(&mut self, c: Loaded) {
        let name = c.hosts.first().cloned().unwrap_or_else(|| "default".into());
        self.expiries.push((name, c.not_after));
        if c.hosts.is_empty() {
            self.default = Some(c.key.clone());
        }
        for h in c.hosts {
            match h.strip_prefix("*.") {
                Some(suffix) => self.wildcard.insert(suffix.to_string(), c.key.clone()),
                None => self.exact.insert(h, c.key.clone()),
            };
        }
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

/// Reads a PEM certificate chain and its key, checks that they belong together and that the
/// certificate covers every host in `hosts`.
fn load_one(cert: &Path, key: &Path, hosts: Vec<String>) -> Result<Loaded, CertError> {
    let fail = |path: &Path, why: String| CertError {
        file: path.display().to_string(),
        why,
    };
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| fail(cert, pem_error(&e)))?;
    let Some(leaf) = chain.first() else {
        return Err(fail(
            cert,
            "holds no certificate (no `BEGIN CERTIFICATE` block)".into(),
        ));
    };
    let private = PrivateKeyDer::from_pem_file(key).map_err(|e| fail(key, pem_error(&e)))?;
    let provider = rustls::crypto::aws_lc_rs::default_provider();
    let certified = CertifiedKey::from_der(chain.clone(), private, &provider).map_err(|e| {
        fail(
            key,
            match e {
                rustls::Error::InconsistentKeys(_) => format!(
                    "this key does not belong to the certificate in {}",
                    cert.display()
                ),
                e => format!("not a usable private key: {e}"),
            },
        )
    })?;
    let (_, parsed) = x509_parser::parse_x509_certificate(leaf)
        .map_err(|e| fail(cert, format!("not a valid X.509 certificate: {e}")))?;
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
                cert,
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
    if not_after < crate::store::now() as i64 {
        tracing::warn!(
            certificate = %cert.display(),
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
    names.iter().any(|n| n == host)
        || (!host.starts_with("*.")
            && host.split_once('.').is_some_and(|(_, parent)| {
                names.iter().any(|n| n.strip_prefix("*.") == Some(parent))
            }))
}

fn pem_error(e: &rustls::pki_types::pem::Error) -> String {
    match e {
        rustls::pki_types::pem::Error::Io(io) => format!("cannot read: {io}"),
        rustls::pki_types::pem::Error::NoItemsFound => "holds no PEM block of that kind".into(),
        e => format!("not valid PEM: {e:?}"),
    }
}

/// The certificates a TLS listener serves: the table is replaced whole, and the next handshake
/// sees the new one (connections already open keep theirs).
#[derive(Debug)]
pub struct Certificates {
    table: ArcSwap<Table>,
    expiry: prometheus::IntGaugeVec,
}

impl Certificates {
    /// Serves `table`; its expiry dates go to `metrics`.
    pub fn new(table: Table, metrics: &Metrics) -> Arc<Self> {
        let this = Arc::new(Self {
            table: ArcSwap::from_pointee(Table::default()),
            expiry: metrics.tls_certificate_expiry.clone(),
        });
        this.replace(table);
        this
    }

    /// Serves `table` from the next handshake on.
    pub fn replace(&self, table: Table) {
        let table = Arc::new(table);
        let old = self.table.swap(table.clone());
        for (name, _) in &old.expiries {
            let _ = self.expiry.remove_label_values(&[name]);
        }
        for (name, at) in &table.expiries {
            self.expiry.with_label_values(&[name]).set(*at);
        }
    }
}

impl ResolvesServerCert for Certificates {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.table.load().pick(hello.server_name())
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
    timeout: Duration,
    done: prometheus::IntCounter,
    failures: prometheus::IntCounterVec,
    /// The certificates served.
    pub certificates: Arc<Certificates>,
}

impl std::fmt::Debug for Acceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acceptor")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

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
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(certificates.clone());
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        config.ticketer = rustls::crypto::aws_lc_rs::Ticketer::new()?;
        config.session_storage = rustls::server::ServerSessionMemoryCache::new(16 * 1024);
        Ok(Self {
            inner: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
            handshakes: Arc::new(tokio::sync::Semaphore::new(max_handshakes)),
            timeout,
            done: metrics.tls_handshakes.clone(),
            failures: metrics.tls_handshake_failures.clone(),
            certificates,
        })
    }

    /// Takes the handshake of `stream`; `None` (counted by reason) if it fails, takes too long,
    /// or too many are in flight.
    pub async fn accept(&self, stream: TcpStream) -> Option<Accepted> {
        let failed = |reason: &str| {
            self.failures.with_label_values(&[reason]).inc();
            None
        };
        let Ok(_permit) = self.handshakes.try_acquire() else {
            return failed("busy");
        };
        let stream = match tokio::time::timeout(self.timeout, self.inner.accept(stream)).await {
            Err(_) => return failed("timeout"),
            Ok(Err(e)) => {
                tracing::debug!("TLS handshake failed: {e}");
                return failed(reason(&e));
            }
            Ok(Ok(stream)) => stream,
        };
        self.done.inc();
        let (_, conn) = stream.get_ref();
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
