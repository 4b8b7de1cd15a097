//! `[[certificate]]` and `[tls]`: the TLS listener's certificates, from files or ACME.

use serde::Deserialize;
use toml::Spanned;

use super::invalid::Invalid;
use super::server::ServerConfig;

/// `[[certificate]]`: a certificate chain and its private key, PEM files (relative to the
/// config file), served by the TLS listener to clients that ask for one of its `hosts`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CertificateConfig {
    /// Host names it is served for, exact (`api.example.com`) or wildcard (`*.example.com`);
    /// the certificate must cover each. Empty: the default certificate, served to clients that
    /// ask for a name no other certificate has, or for none (at most one default).
    #[serde(default)]
    pub hosts: Vec<Spanned<String>>,
    /// The certificate, then its chain (PEM).
    pub cert: Spanned<String>,
    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: Spanned<String>,
    /// Given by `tern serve --tls-cert/--tls-key`, not the file (a reload keeps it).
    #[serde(skip)]
    pub from_command_line: bool,
}

/// `[tls]`: TLS settings beyond the listener and the certificate files.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// `[tls.acme]`: certificates obtained and renewed from an ACME certificate authority.
    pub acme: Option<AcmeConfig>,
}

/// `[tls.acme]`: obtain a certificate per host name from an ACME CA (RFC 8555: Let's Encrypt,
/// ZeroSSL, a company CA) and renew it before it expires. Setting it agrees to the CA's terms
/// of service.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcmeConfig {
    /// The CA's directory URL, e.g. Let's Encrypt's
    /// `https://acme-v02.api.letsencrypt.org/directory` (its staging CA for trials:
    /// `https://acme-staging-v02.api.letsencrypt.org/directory`).
    pub directory: Spanned<String>,
    /// Contact URLs for the account (`mailto:ops@example.com`); the CA writes about problems.
    #[serde(default)]
    pub contact: Vec<String>,
    /// Host names to obtain certificates for. Empty: every exact name in the tenants' `hosts`
    /// (wildcards need DNS validation, which Tern does not do). Names a `[[certificate]]` or an
    /// uploaded certificate serves are left to it.
    #[serde(default)]
    pub hosts: Vec<Spanned<String>>,
    /// How the CA checks that a name points here: `tls-alpn-01` (on the TLS listener, which
    /// must be reachable on port 443) or `http-01` (on `listen`, reachable on port 80).
    #[serde(default)]
    pub challenge: AcmeChallenge,
    /// A PEM file with the CA certificate to trust for the ACME server's own HTTPS (a private
    /// or test CA); unset: the system's roots.
    #[serde(default)]
    pub ca_root: Option<Spanned<String>>,
    /// How often certificates are checked for renewal and the data directory for certificates
    /// other replicas obtained, in seconds.
    #[serde(default = "default_acme_check")]
    pub check_interval_seconds: u64,
    /// After a failed order, the wait before the next try, in seconds; it doubles with each
    /// failure up to 6 hours.
    #[serde(default = "default_acme_retry")]
    pub retry_seconds: u64,
}

fn default_acme_check() -> u64 {
    60
}

fn default_acme_retry() -> u64 {
    60
}

/// The ACME challenge Tern answers (`tls.acme.challenge`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum AcmeChallenge {
    /// RFC 8737: a special certificate on the TLS listener.
    #[default]
    #[serde(rename = "tls-alpn-01")]
    TlsAlpn01,
    /// RFC 8555 8.3: a token at `/.well-known/acme-challenge/` on the cleartext listener.
    #[serde(rename = "http-01")]
    Http01,
}

/// The TLS listener has certificates and they have it; a host is served by one certificate;
/// at most one default. (The files are read when the listener starts: [`crate::tls`].)
pub(super) fn validate(
    server: &ServerConfig,
    certificates: &[CertificateConfig],
    tls: &TlsConfig,
) -> Result<(), Invalid> {
    let at = |span: Option<std::ops::Range<usize>>, message: String| Err(Invalid { span, message });
    // A TLS listener without [[certificate]]s serves the data directory's (uploaded with
    // `tern cert put`, or obtained by [tls.acme]).
    if server.tls_listen.is_none()
        && let Some(c) = certificates.first()
    {
        return at(
            Some(c.cert.span()),
            "[[certificate]] is served by the TLS listener: set server.tls_listen \
             (e.g. \"0.0.0.0:8443\")"
                .into(),
        );
    }
    let acme = tls.acme.as_ref();
    if server.listen.is_none() && server.tls_listen.is_none() {
        return at(
            None,
            "server.listen is \"off\" and there is no server.tls_listen: nothing would \
             serve the tenants"
                .into(),
        );
    }
    if let Some(acme) = acme {
        if server.tls_listen.is_none() {
            return at(
                Some(acme.directory.span()),
                "[tls.acme] certificates are served by the TLS listener: set \
                 server.tls_listen (e.g. \"0.0.0.0:443\")"
                    .into(),
            );
        }
        let url = acme.directory.get_ref();
        if !(url.starts_with("https://") || url.starts_with("http://")) {
            return at(
                Some(acme.directory.span()),
                format!("tls.acme.directory: {url:?} is not an http(s) URL"),
            );
        }
        if acme.challenge == AcmeChallenge::Http01 && server.listen.is_none() {
            return at(
                Some(acme.directory.span()),
                "tls.acme.challenge = \"http-01\" is answered on the cleartext listener, \
                 and server.listen is \"off\": use \"tls-alpn-01\""
                    .into(),
            );
        }
        if acme.check_interval_seconds == 0 || acme.retry_seconds == 0 {
            return at(
                Some(acme.directory.span()),
                "tls.acme.check_interval_seconds and tls.acme.retry_seconds must be > 0".into(),
            );
        }
        for h in &acme.hosts {
            if let Err(m) = acme_name(h.get_ref()) {
                return at(Some(h.span()), format!("tls.acme.hosts: {m}"));
            }
        }
    }
    if server.http3 && server.tls_listen.is_none() {
        return at(
            None,
            "server.http3 serves QUIC on the TLS listener's port: set server.tls_listen \
             (e.g. \"0.0.0.0:443\")"
                .into(),
        );
    }
    if let Err(message) = crate::ceilings::check(&[
        (
            "server.http3_max_streams",
            server.http3_max_streams,
            1,
            crate::ceilings::MAX_HTTP3_STREAMS,
        ),
        (
            "server.http3_socket_buffer_kib",
            server.http3_socket_buffer_kib as u64,
            64,
            crate::ceilings::MAX_SOCKET_BUFFER_KIB,
        ),
        (
            "server.http3_alt_svc_max_age_secs",
            server.http3_alt_svc_max_age_secs,
            0,
            crate::ceilings::MAX_ALT_SVC_MAX_AGE_SECS,
        ),
    ]) {
        return at(None, message);
    }
    if server.tls_handshake_timeout_ms == 0 || server.max_tls_handshakes == 0 {
        return at(
            None,
            "server.tls_handshake_timeout_ms and server.max_tls_handshakes must be > 0".into(),
        );
    }
    let mut seen = std::collections::HashSet::new();
    let mut default = None;
    for c in certificates {
        if c.hosts.is_empty()
            && let Some(first) = default.replace(&c.cert)
        {
            return at(
                Some(c.cert.span()),
                format!(
                    "a second default certificate (no `hosts`): {:?} is the default \
                         already; give this one `hosts`",
                    first.get_ref()
                ),
            );
        }
        for h in &c.hosts {
            if h.get_ref() == "*" {
                return at(
                    Some(h.span()),
                    "certificate hosts: \"*\" is not a name; leave `hosts` out for the \
                     default certificate"
                        .into(),
                );
            }
            if let Err(m) = crate::router::HostPattern::parse(h.get_ref()) {
                return at(Some(h.span()), format!("certificate hosts: {m}"));
            }
            if !seen.insert(h.get_ref().to_ascii_lowercase()) {
                return at(
                    Some(h.span()),
                    format!(
                        "certificate hosts: {:?} is served by two certificates",
                        h.get_ref()
                    ),
                );
            }
        }
    }
    Ok(())
}

/// Whether `name` is a host name a CA can issue a certificate for by HTTP-01 or TLS-ALPN-01:
/// a DNS name with a dot, no wildcard, no IP address, no port.
///
/// # Errors
/// Why it is not.
pub fn acme_name(name: &str) -> Result<(), String> {
    if name.contains('*') {
        return Err(format!(
            "{name:?}: a wildcard needs DNS validation, which Tern does not do; give it a \
             [[certificate]]"
        ));
    }
    if name.parse::<std::net::IpAddr>().is_ok() || name.contains(':') {
        return Err(format!("{name:?}: not a DNS name (an address or a port)"));
    }
    let labels_ok = name.split('.').all(|l| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    });
    if !name.contains('.') || !labels_ok || name.len() > 253 {
        return Err(format!(
            "{name:?}: not a public DNS name a CA can issue for (letters, digits, `-`, at least \
             one dot)"
        ));
    }
    Ok(())
}
