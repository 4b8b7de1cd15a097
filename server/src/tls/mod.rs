//! TLS termination: the certificates the TLS listener serves, one per host name or wildcard
//! and a default, picked per handshake by the name the client asks for (SNI) from a table that
//! is swapped whole; and the handshake itself, under a deadline and a cap on handshakes in
//! flight, with failures counted by reason.
//!
//! The crypto provider is aws-lc-rs (rustls' default): its key exchange offers the hybrid
//! post-quantum X25519MLKEM768 that current browsers send first, which ring's does not; it
//! needs only a C compiler to build.

use std::sync::Arc;
use std::time::Duration;

use rustls::ProtocolVersion;
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

pub mod acme;
mod certificates;
mod challenge;
pub mod stored;
mod table;
pub mod uploads;

pub use certificates::{ACME_TLS_ALPN, Certificates};
pub use table::{CertError, Loaded, Table};

use crate::context::TlsInfo;
use crate::metrics::Metrics;

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
    use super::table::covers;

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
