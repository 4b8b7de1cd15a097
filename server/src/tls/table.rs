//! What a certificate is to the listener: a [`Loaded`] chain and key with its names, a
//! [`Table`] of them (the config file's, or the data directory's), and the index by name
//! a handshake picks from (exact names, then wildcards, then the default).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;

use crate::config::CertificateConfig;

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
    pub(super) key: Arc<CertifiedKey>,
    /// The host patterns it serves (empty: the default).
    pub(super) hosts: Vec<String>,
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
    pub(super) certificates: Vec<Loaded>,
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
pub(super) fn wildcard_match(pattern: &str, host: &str) -> bool {
    pattern.strip_prefix("*.").is_some_and(|parent| {
        host.split_once('.')
            .is_some_and(|(label, rest)| !label.is_empty() && rest == parent)
    })
}

/// What a handshake looks certificates up in: the config file's, then the data directory's
/// (uploaded, then obtained by ACME); a name taken by an earlier one is not taken again.
#[derive(Debug, Default)]
pub(super) struct ByName {
    pub(super) exact: HashMap<String, Arc<CertifiedKey>>,
    /// By the suffix after `*.`.
    pub(super) wildcard: HashMap<String, Arc<CertifiedKey>>,
    pub(super) default: Option<Arc<CertifiedKey>>,
    /// Each certificate's name (its first host, or `default`) and expiry (Unix seconds).
    pub(super) expiries: Vec<(String, i64)>,
}

impl ByName {
    pub(super) fn build<'a>(tables: impl IntoIterator<Item = &'a Table>) -> Self {
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
    pub(super) fn pick(&self, name: Option<&str>) -> Option<Arc<CertifiedKey>> {
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

pub(super) enum Which {
    Cert,
    Key,
}

/// Parses and checks a PEM certificate chain and key (see [`Loaded::from_pem`]).
pub(super) fn check_pem(
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
pub(super) fn covers(names: &[String], host: &str) -> bool {
    names
        .iter()
        .any(|n| n == host || (!host.starts_with("*.") && wildcard_match(n, host)))
}

pub(super) fn pem_error(e: &rustls::pki_types::pem::Error) -> String {
    match e {
        rustls::pki_types::pem::Error::Io(io) => format!("cannot read: {io}"),
        rustls::pki_types::pem::Error::NoItemsFound => "holds no PEM block of that kind".into(),
        e => format!("not valid PEM: {e:?}"),
    }
}
