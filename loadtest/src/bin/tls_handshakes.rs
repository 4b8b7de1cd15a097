//! TLS handshake load: `CONNS` clients each make TLS connections in a loop for `SECS` seconds,
//! a handshake each, and close it (close_notify, then read to the server's close); prints
//! `handshakes/s handshakes resumed`.
//!
//! `full`: every handshake is a full one (no session kept). `resumed`: each client keeps its
//! session (a TLS 1.3 ticket) and resumes it, as a browser coming back does.
//!
//! Usage: `tls-handshakes ADDR SERVER_NAME CA_PEM full|resumed SECS CONNS`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rustls::client::Resumption;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, addr, name, ca, mode, secs, conns] = &args[..] else {
        eprintln!("usage: tls-handshakes ADDR SERVER_NAME CA_PEM full|resumed SECS CONNS");
        std::process::exit(2);
    };
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).expect("CA file") {
        roots
            .add(cert.expect("CA certificate"))
            .expect("CA accepted");
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = |resumption: Resumption| {
        let mut c = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_root_certificates(roots.clone())
            .with_no_client_auth();
        c.resumption = resumption;
        Arc::new(c)
    };
    let resumed = mode == "resumed";
    let until = Instant::now() + Duration::from_secs(secs.parse().expect("SECS"));
    let (done, resumptions) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let name = ServerName::try_from(name.clone()).expect("server name");
    let mut clients = Vec::new();
    for _ in 0..conns.parse::<usize>().expect("CONNS") {
        // Each client keeps its own session, as separate browsers would.
        let connector = tokio_rustls::TlsConnector::from(config(if resumed {
            Resumption::in_memory_sessions(4)
        } else {
            Resumption::disabled()
        }));
        let (addr, name) = (addr.clone(), name.clone());
        let (done, resumptions) = (done.clone(), resumptions.clone());
        clients.push(tokio::spawn(async move {
            while Instant::now() < until {
                let Ok(tcp) = tokio::net::TcpStream::connect(&addr).await else {
                    continue;
                };
                let _ = tcp.set_nodelay(true);
                if let Ok(mut tls) = connector.connect(name.clone(), tcp).await {
                    done.fetch_add(1, Ordering::Relaxed);
                    if tls.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed) {
                        resumptions.fetch_add(1, Ordering::Relaxed);
                    }
                    // Close as a client does (close_notify), and read to the server's close:
                    // the session tickets the server sent after the handshake are taken on the
                    // way, for the next connection to resume.
                    let _ = tls.shutdown().await;
                    let mut rest = Vec::new();
                    let _ =
                        tokio::time::timeout(Duration::from_secs(1), tls.read_to_end(&mut rest))
                            .await;
                }
            }
        }));
    }
    let started = Instant::now();
    for c in clients {
        let _ = c.await;
    }
    let n = done.load(Ordering::Relaxed);
    println!(
        "{:.0} {n} {}",
        n as f64 / started.elapsed().as_secs_f64(),
        resumptions.load(Ordering::Relaxed)
    );
}
