//! The HTTP client: one per worker thread and kind of target, with its resolver (public
//! addresses only for URL requests), TLS roots and counted connections.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::dns::Name;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;

use super::body::OutBody;
use super::policy::Destination;
use super::policy::not_public;

/// Name resolution for outbound connections; for URL requests every address must be public
/// (checked at connect time too, so a DNS answer that changes after the policy check cannot
/// send the request inside).
#[derive(Clone)]
pub struct Resolver {
    public_only: bool,
}

type Resolving =
    Pin<Box<dyn Future<Output = std::io::Result<std::vec::IntoIter<SocketAddr>>> + Send>>;

impl tower_service::Service<Name> for Resolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = std::io::Error;
    type Future = Resolving;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let public_only = self.public_only;
        Box::pin(async move {
            let host = name.as_str().to_string();
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if public_only && let Some(denied) = not_public(&host, &addrs) {
                return Err(std::io::Error::other(denied));
            }
            Ok(addrs.into_iter())
        })
    }
}

/// Counts the connections a client opens (`tern_outbound_connections_total`); requests beyond
/// that count reused a pooled connection.
#[derive(Clone)]
pub struct Counted {
    inner: HttpConnector<Resolver>,
    opened: prometheus::IntCounter,
}

type Connecting = Pin<Box<dyn Future<Output = Result<TokioIo<TcpStream>, BoxError>> + Send>>;

/// A boxed error, as hyper-util's client takes from a connector.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower_service::Service<Uri> for Counted {
    type Response = TokioIo<TcpStream>;
    type Error = BoxError;
    type Future = Connecting;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        tower_service::Service::<Uri>::poll_ready(&mut self.inner, cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let opened = self.opened.clone();
        let connecting = tower_service::Service::<Uri>::call(&mut self.inner, uri);
        Box::pin(async move {
            let stream = connecting.await?;
            opened.inc();
            Ok(stream)
        })
    }
}

/// The HTTP client of one worker thread for one kind of target.
pub type HttpClient = Client<HttpsConnector<Counted>, OutBody>;

/// What tells clients apart: connect timeout, TLS roots (by identity) and the resolver.
type ClientKey = (Duration, usize, bool);

thread_local! {
    /// Clients by kind: each keeps its own pool of connections on this worker.
    static CLIENTS: std::cell::RefCell<HashMap<ClientKey, HttpClient>> =
        std::cell::RefCell::new(HashMap::new());
}

/// The client this worker uses for `target` (made on first use).
///
/// # Errors
/// If the TLS roots `target` needs cannot be loaded.
pub fn client(target: &Destination, opened: &prometheus::IntCounter) -> Result<HttpClient, String> {
    let tls = target.tls.config()?;
    let key = (
        target.timeouts.connect,
        Arc::as_ptr(&tls) as usize,
        target.public_only,
    );
    Ok(CLIENTS.with_borrow_mut(|clients| {
        clients
            .entry(key)
            .or_insert_with(|| {
                let mut http = HttpConnector::new_with_resolver(Resolver {
                    public_only: target.public_only,
                });
                http.set_connect_timeout(Some(target.timeouts.connect));
                http.set_nodelay(true);
                http.enforce_http(false);
                let https = HttpsConnectorBuilder::new()
                    .with_tls_config((*tls).clone())
                    .https_or_http()
                    .enable_http1()
                    .enable_http2()
                    .wrap_connector(Counted {
                        inner: http,
                        opened: opened.clone(),
                    });
                Client::builder(TokioExecutor::new())
                    .pool_idle_timeout(Duration::from_secs(60))
                    .pool_max_idle_per_host(64)
                    .build(https)
            })
            .clone()
    }))
}
