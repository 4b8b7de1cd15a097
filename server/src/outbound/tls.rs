//! The TLS of outbound connections: rustls on the same provider as the TLS listener, trusting
//! the platform's roots, or a backend's own CA (`ca_file`).

use std::sync::Arc;

/// Which certificates an `https` target must chain to.
#[derive(Debug, Clone)]
pub enum Tls {
    /// The platform's roots (loaded once, on first use).
    Platform,
    /// A backend's own CA file.
    Custom(Arc<rustls::ClientConfig>),
}

/// rustls with the aws-lc-rs provider (the TLS listener's too) and safe protocol versions.
fn tls_builder() -> rustls::ConfigBuilder<rustls::ClientConfig, rustls::WantsVerifier> {
    rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("aws-lc-rs supports the default protocol versions")
}

/// A client config trusting only the CA certificates in the PEM file at `path`.
pub(super) fn ca_config(path: &str) -> Result<Arc<rustls::ClientConfig>, String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    if !std::path::Path::new(path).is_absolute() {
        return Err(format!("ca_file {path:?} must be an absolute path"));
    }
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(path).map_err(|e| format!("ca_file {path:?}: {e}"))? {
        let cert = cert.map_err(|e| format!("ca_file {path:?}: {e}"))?;
        roots
            .add(cert)
            .map_err(|e| format!("ca_file {path:?}: {e}"))?;
    }
    if roots.is_empty() {
        return Err(format!("ca_file {path:?} holds no certificates"));
    }
    Ok(Arc::new(
        tls_builder()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    ))
}

/// The platform's roots (`/etc/ssl/certs` and the like), loaded once.
fn platform_config() -> Result<Arc<rustls::ClientConfig>, String> {
    use hyper_rustls::ConfigBuilderExt;
    static CONFIG: std::sync::OnceLock<Result<Arc<rustls::ClientConfig>, String>> =
        std::sync::OnceLock::new();
    CONFIG
        .get_or_init(|| {
            tls_builder()
                .with_native_roots()
                .map(|b| Arc::new(b.with_no_client_auth()))
                .map_err(|e| {
                    format!(
                        "the platform's CA certificates could not be loaded ({e}); install \
                         them (e.g. Debian's ca-certificates) or give the backend a ca_file"
                    )
                })
        })
        .clone()
}

impl Tls {
    /// The rustls config.
    ///
    /// # Errors
    /// If the platform's roots cannot be loaded.
    pub fn config(&self) -> Result<Arc<rustls::ClientConfig>, String> {
        match self {
            Tls::Platform => platform_config(),
            Tls::Custom(c) => Ok(c.clone()),
        }
    }
}
