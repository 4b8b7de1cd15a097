//! Outbound HTTP: which backends and hosts a tenant's guests may call, and the client that
//! calls them.
//!
//! **Deny by default.** A tenant's guests may send requests only to its named backends
//! (`[tenant.outbound.backends.NAME]`, any address the operator wrote down, private ones
//! included) and, by URL, to hosts matching its `allowed_hosts`. A URL request's host is
//! resolved here and every address must be public (not loopback, private, link-local, shared,
//! multicast, documentation or otherwise special), and the connection's own lookup checks again,
//! so a DNS answer that changes between check and connect cannot redirect it inside (SSRF).
//!
//! **Loops.** Every outbound request carries `CDN-Loop: tern` (RFC 8586) appended to what the
//! incoming request carried; a request that already passed through Tern [`MAX_HOPS`] times
//! cannot go out again, so a tenant calling itself stops.
//!
//! **Connections** are pooled per worker thread and reused (HTTP/1.1 keep-alive, HTTP/2 when
//! a TLS backend offers it). TLS is rustls, verifying against the platform's roots or a
//! backend's `ca_file`. Redirects are never followed: the guest sees the `3xx`.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderValue, Request, Response, Uri};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::dns::Name;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde::{Deserialize, Serialize};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

use crate::router::HostPattern;

/// How many times a request may pass through Tern (counted in `CDN-Loop`) before its guest's
/// outbound requests are refused as a loop.
pub const MAX_HOPS: usize = 8;

/// Our entry in `CDN-Loop`.
pub const CDN_ID: &str = "tern";

/// The label of URL requests in metrics (backends are labelled by name).
pub const URL_LABEL: &str = "url";

/// Ceiling of every outbound timeout: 15 minutes (as `limits.timeout_ms`).
const MAX_TIMEOUT_MS: u64 = 15 * 60 * 1000;

/// Ceiling of outbound body limits: 4 GiB (as the tenant's body limits).
const MAX_BODY_BYTES: u64 = 4 << 30;

/// Ceiling of `outbound.max_requests`.
const MAX_REQUESTS: u32 = 1_000;

/// Ceiling of `outbound.max_concurrent`.
const MAX_CONCURRENT: u32 = 10_000;

/// `[tenant.outbound]`: the backends and hosts a tenant's guests may send requests to, and the
/// limits on those requests. Empty (the default) denies every outbound request.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct OutboundConfig {
    /// Named backends (`[tenant.outbound.backends.NAME]`): a guest sends to one by name and a
    /// path. A backend may name a private or loopback address; that is how a tenant reaches
    /// an internal service.
    pub backends: BTreeMap<String, BackendConfig>,
    /// Hosts a guest may send to by URL (`api.example.com`, `*.example.com`, or `*` for any).
    /// Their addresses must be public: loopback, private, link-local and other special ranges
    /// are refused (use a backend for those).
    pub allowed_hosts: Vec<String>,
    /// Most outbound requests one guest request may send.
    pub max_requests: u32,
    /// Most outbound requests of this tenant in flight at once, per backend (URL requests
    /// share one budget).
    pub max_concurrent: u32,
    /// Largest outbound request body a guest may send, in bytes.
    pub max_request_bytes: u64,
    /// Largest outbound response body a guest may read, in bytes.
    pub max_response_bytes: u64,
    /// Defaults for backends that set none, and the timeouts of URL requests.
    pub connect_timeout_ms: u64,
    /// Time from the request sent to the response head.
    pub first_byte_timeout_ms: u64,
    /// Time from the request started to the end of the response body.
    pub total_timeout_ms: u64,
}

impl Default for OutboundConfig {
    fn default() -> Self {
        Self {
            backends: BTreeMap::new(),
            allowed_hosts: Vec::new(),
            max_requests: 16,
            max_concurrent: 64,
            max_request_bytes: 16 * 1024 * 1024,
            max_response_bytes: 16 * 1024 * 1024,
            connect_timeout_ms: 2_000,
            first_byte_timeout_ms: 10_000,
            total_timeout_ms: 30_000,
        }
    }
}

/// `[tenant.outbound.backends.NAME]`: one origin a guest may call by name.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BackendConfig {
    /// The origin: `http://host[:port]`, optionally with a base path the guest's path is
    /// appended to (`http://10.0.0.5:8080/v1`).
    pub url: String,
    /// `Host` header to send instead of the URL's host.
    #[serde(default)]
    pub host: Option<String>,
    /// Connect timeout (default: the tenant's `outbound.connect_timeout_ms`).
    #[serde(default)]
    pub connect_timeout_ms: Option<u64>,
    /// Time to the response head (default: `outbound.first_byte_timeout_ms`).
    #[serde(default)]
    pub first_byte_timeout_ms: Option<u64>,
    /// Time to the end of the response (default: `outbound.total_timeout_ms`).
    #[serde(default)]
    pub total_timeout_ms: Option<u64>,
    /// For an `https` backend: an absolute path to a PEM file of the CA certificates its
    /// certificate must chain to, instead of the platform's roots.
    #[serde(default)]
    pub ca_file: Option<String>,
}

/// The three timeouts of one outbound request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Timeouts {
    /// Establishing the TCP connection.
    pub connect: Duration,
    /// From the request sent to the response head.
    pub first_byte: Duration,
    /// From the request started to the end of the response body.
    pub total: Duration,
}

/// A named backend, checked and parsed.
#[derive(Debug)]
pub struct Backend {
    /// Its name (the metrics label).
    pub name: Arc<str>,
    scheme: Scheme,
    authority: Authority,
    /// Base path without a trailing slash (empty for none).
    base: String,
    /// `Host` header: the override, or the URL's authority.
    host: HeaderValue,
    timeouts: Timeouts,
    tls: Tls,
    /// This tenant's requests in flight to it.
    budget: Arc<Semaphore>,
}

/// Which certificates an `https` target must chain to.
#[derive(Debug, Clone)]
pub enum Tls {
    /// The platform's roots (loaded once, on first use).
    Platform,
    /// A backend's own CA file.
    Custom(Arc<rustls::ClientConfig>),
}

/// What a tenant's guests may call, and the limits on those calls.
#[derive(Debug)]
pub struct Policy {
    backends: HashMap<String, Arc<Backend>>,
    allowed: Vec<HostPattern>,
    url_timeouts: Timeouts,
    url_budget: Arc<Semaphore>,
    /// Most outbound requests per guest request.
    pub max_requests: u32,
    /// Largest outbound request body.
    pub max_request_bytes: u64,
    /// Largest outbound response body.
    pub max_response_bytes: u64,
}

/// Where one outbound request goes, resolved and permitted.
#[derive(Debug)]
pub struct Target {
    /// The URI to send.
    pub uri: Uri,
    /// The `Host` header to send.
    pub host: HeaderValue,
    /// Its timeouts.
    pub timeouts: Timeouts,
    /// The budget its in-flight slot is taken from.
    pub budget: Arc<Semaphore>,
    /// The metrics label: the backend's name, or [`URL_LABEL`].
    pub label: Arc<str>,
    /// The certificates an `https` target must chain to.
    pub tls: Tls,
    /// Whether every address the host resolves to must be public (URL requests).
    pub public_only: bool,
}

/// Why an outbound request may not go out. Its text is what the guest reads from
/// `outbound_last_error`, so it says what to change.
#[derive(Debug, thiserror::Error)]
pub enum Denied {
    /// No backend of that name.
    #[error("no backend named {0:?} (add it under [tenant.outbound.backends])")]
    UnknownBackend(String),
    /// The URL's host matches no `allowed_hosts` entry.
    #[error(
        "host {0:?} is not in this tenant's outbound.allowed_hosts (requests are denied unless allowed)"
    )]
    HostNotAllowed(String),
    /// The host resolved to an address that is not public.
    #[error(
        "{host:?} resolves to {addr}, which is not a public address (name it in a backend to reach it)"
    )]
    NotPublic {
        /// The host asked for.
        host: String,
        /// The address it resolved to.
        addr: IpAddr,
    },
    /// The host could not be resolved.
    #[error("cannot resolve {host:?}: {why}")]
    Unresolved {
        /// The host asked for.
        host: String,
        /// The resolver's error.
        why: String,
    },
    /// The target is not a usable URL or path.
    #[error("{0}")]
    BadTarget(String),
    /// The request has passed through Tern too often.
    #[error(
        "request loop: this request already passed through Tern {0} times (CDN-Loop); outbound requests are refused"
    )]
    Loop(usize),
}

/// Checks a tenant's `[outbound]` section.
///
/// # Errors
/// What is wrong, naming the setting.
pub fn check_config(c: &OutboundConfig) -> Result<(), String> {
    Policy::from_config(c).map(drop)
}

fn ms(key: &str, v: u64) -> Result<Duration, String> {
    if v == 0 || v > MAX_TIMEOUT_MS {
        return Err(format!(
            "{key} must be between 1 and {MAX_TIMEOUT_MS}, not {v}"
        ));
    }
    Ok(Duration::from_millis(v))
}

impl Policy {
    /// The policy `c` describes.
    ///
    /// # Errors
    /// What is wrong with `c`, naming the setting.
    pub fn from_config(c: &OutboundConfig) -> Result<Self, String> {
        let ceilings: [(&str, u64, u64, u64); 4] = [
            (
                "max_requests",
                u64::from(c.max_requests),
                0,
                u64::from(MAX_REQUESTS),
            ),
            (
                "max_concurrent",
                u64::from(c.max_concurrent),
                1,
                u64::from(MAX_CONCURRENT),
            ),
            ("max_request_bytes", c.max_request_bytes, 0, MAX_BODY_BYTES),
            (
                "max_response_bytes",
                c.max_response_bytes,
                0,
                MAX_BODY_BYTES,
            ),
        ];
        for (key, value, min, max) in ceilings {
            if value < min || value > max {
                return Err(format!(
                    "{key} must be between {min} and {max}, not {value}"
                ));
            }
        }
        let defaults = Timeouts {
            connect: ms("connect_timeout_ms", c.connect_timeout_ms)?,
            first_byte: ms("first_byte_timeout_ms", c.first_byte_timeout_ms)?,
            total: ms("total_timeout_ms", c.total_timeout_ms)?,
        };
        let allowed = c
            .allowed_hosts
            .iter()
            .map(|h| HostPattern::parse(h).map_err(|e| format!("allowed_hosts: {e}")))
            .collect::<Result<_, _>>()?;
        let mut backends = HashMap::new();
        for (name, b) in &c.backends {
            let backend = Backend::from_config(name, b, defaults, c.max_concurrent)
                .map_err(|e| format!("backends.{name}: {e}"))?;
            backends.insert(name.clone(), Arc::new(backend));
        }
        Ok(Self {
            backends,
            allowed,
            url_timeouts: defaults,
            url_budget: Arc::new(Semaphore::new(c.max_concurrent as usize)),
            max_requests: c.max_requests,
            max_request_bytes: c.max_request_bytes,
            max_response_bytes: c.max_response_bytes,
        })
    }

    /// The metrics label of backend `name`, if the tenant has one of that name.
    pub fn backend_label(&self, name: &str) -> Option<Arc<str>> {
        self.backends.get(name).map(|b| b.name.clone())
    }

    /// Whether the tenant may call anything at all.
    pub fn denies_all(&self) -> bool {
        self.backends.is_empty() && self.allowed.is_empty()
    }

    /// Where a guest's request goes: to backend `backend` at `path` (a path and query), or,
    /// with `backend` empty, to the absolute `http(s)://` URL `path`.
    ///
    /// # Errors
    /// [`Denied`], saying why.
    pub async fn target(&self, backend: &str, path: &str) -> Result<Target, Denied> {
        if backend.is_empty() {
            return self.url_target(path).await;
        }
        let b = self
            .backends
            .get(backend)
            .ok_or_else(|| Denied::UnknownBackend(backend.to_string()))?;
        if !path.starts_with('/') {
            return Err(Denied::BadTarget(format!(
                "a backend request's path must start with '/', not {path:?}"
            )));
        }
        let pq = PathAndQuery::try_from(format!("{}{path}", b.base))
            .map_err(|e| Denied::BadTarget(format!("path {path:?}: {e}")))?;
        let uri = Uri::builder()
            .scheme(b.scheme.clone())
            .authority(b.authority.clone())
            .path_and_query(pq)
            .build()
            .map_err(|e| Denied::BadTarget(e.to_string()))?;
        Ok(Target {
            uri,
            host: b.host.clone(),
            timeouts: b.timeouts,
            budget: b.budget.clone(),
            label: b.name.clone(),
            tls: b.tls.clone(),
            public_only: false,
        })
    }

    async fn url_target(&self, url: &str) -> Result<Target, Denied> {
        let uri: Uri = url
            .parse()
            .map_err(|e| Denied::BadTarget(format!("{url:?} is not a URL: {e}")))?;
        let default_port = match uri.scheme_str() {
            Some("http") => 80,
            Some("https") => 443,
            _ => {
                return Err(Denied::BadTarget(format!(
                    "{url:?} is not an absolute http:// or https:// URL (or name a backend)"
                )));
            }
        };
        let authority = uri
            .authority()
            .ok_or_else(|| Denied::BadTarget(format!("{url:?} has no host")))?;
        if authority.as_str().contains('@') {
            return Err(Denied::BadTarget(format!(
                "{url:?}: credentials in URLs are not sent; use an Authorization header"
            )));
        }
        let host = authority
            .host()
            .trim_matches(['[', ']'])
            .to_ascii_lowercase();
        let port = authority.port_u16().unwrap_or(default_port);
        if !self.allowed.iter().any(|p| p.matches(&host)) {
            return Err(Denied::HostNotAllowed(host));
        }
        // Checked here for a clear `DENIED`; the connection's own lookup checks again (a
        // name whose answer changes in between fails to connect instead).
        check_public(&host, port).await?;
        let host = HeaderValue::from_str(authority.as_str())
            .map_err(|e| Denied::BadTarget(e.to_string()))?;
        Ok(Target {
            uri,
            host,
            timeouts: self.url_timeouts,
            budget: self.url_budget.clone(),
            label: Arc::from(URL_LABEL),
            tls: Tls::Platform,
            public_only: true,
        })
    }
}

impl Backend {
    fn from_config(
        name: &str,
        c: &BackendConfig,
        defaults: Timeouts,
        concurrent: u32,
    ) -> Result<Self, String> {
        if name.is_empty()
            || name.len() > 64
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err("a backend name is 1-64 letters, digits, '-' or '_'".into());
        }
        let uri: Uri = c
            .url
            .parse()
            .map_err(|e| format!("url {:?} is not a URL: {e}", c.url))?;
        let scheme = match uri.scheme_str() {
            Some("http") => Scheme::HTTP,
            Some("https") => Scheme::HTTPS,
            _ => {
                return Err(format!(
                    "url {:?} must start with http:// or https://",
                    c.url
                ));
            }
        };
        let tls = match (&c.ca_file, scheme == Scheme::HTTPS) {
            (None, _) => Tls::Platform,
            (Some(_), false) => return Err("ca_file is for https backends".into()),
            (Some(path), true) => Tls::Custom(ca_config(path)?),
        };
        let authority = uri
            .authority()
            .cloned()
            .ok_or_else(|| format!("url {:?} has no host", c.url))?;
        if authority.as_str().contains('@') {
            return Err(format!("url {:?}: no credentials in the URL", c.url));
        }
        if uri.query().is_some() {
            return Err(format!("url {:?}: no query in a backend's URL", c.url));
        }
        let base = uri.path().trim_end_matches('/').to_string();
        let host = c.host.as_deref().unwrap_or(authority.as_str());
        let host =
            HeaderValue::from_str(host).map_err(|_| format!("host {host:?} is not valid"))?;
        let pick = |key: &str, v: Option<u64>, d: Duration| match v {
            Some(v) => ms(key, v),
            None => Ok(d),
        };
        Ok(Self {
            name: Arc::from(name),
            scheme,
            authority,
            base,
            host,
            timeouts: Timeouts {
                connect: pick("connect_timeout_ms", c.connect_timeout_ms, defaults.connect)?,
                first_byte: pick(
                    "first_byte_timeout_ms",
                    c.first_byte_timeout_ms,
                    defaults.first_byte,
                )?,
                total: pick("total_timeout_ms", c.total_timeout_ms, defaults.total)?,
            },
            tls,
            budget: Arc::new(Semaphore::new(concurrent as usize)),
        })
    }
}

/// Checks that every address `host` (a name or an IP literal) has is public.
async fn check_public(host: &str, port: u16) -> Result<(), Denied> {
    let addrs: Vec<SocketAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => tokio::net::lookup_host((host, port))
            .await
            .map_err(|e| Denied::Unresolved {
                host: host.to_string(),
                why: e.to_string(),
            })?
            .collect(),
    };
    if addrs.is_empty() {
        return Err(Denied::Unresolved {
            host: host.to_string(),
            why: "no addresses".into(),
        });
    }
    not_public(host, &addrs).map_or(Ok(()), Err)
}

/// The refusal for `host` if any of its addresses is not public: a name that also points
/// inside must not be used to reach outside either.
fn not_public(host: &str, addrs: &[SocketAddr]) -> Option<Denied> {
    addrs
        .iter()
        .find(|a| !is_public(a.ip()))
        .map(|bad| Denied::NotPublic {
            host: host.to_string(),
            addr: bad.ip(),
        })
}

/// Whether `ip` is a public unicast address (RFC 6890's special-purpose ranges are not).
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_public_v4(v4);
            }
            let s = v6.segments();
            !(v6.is_unspecified()
                || v6.is_loopback()
                || v6.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00 // unique local fc00::/7
                || (s[0] & 0xffc0) == 0xfe80 // link-local fe80::/10
                || (s[0] & 0xffc0) == 0xfec0 // site-local (deprecated) fec0::/10
                || (s[0] == 0x2001 && s[1] == 0x0db8) // documentation 2001:db8::/32
                || (s[0] == 0x0064 && s[1] == 0xff9b) // NAT64 64:ff9b::/96 and /48
                || (s[0] == 0x0100 && s[1] == 0 && s[2] == 0 && s[3] == 0) // discard 100::/64
                || s[0] == 0x2002 // 6to4 (embeds any IPv4 address)
                || (s[0] == 0x2001 && s[1] == 0)) // Teredo 2001::/32
        }
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(ip.is_unspecified()
        || a == 0 // "this network" 0.0.0.0/8
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_multicast()
        || ip.is_broadcast()
        || ip.is_documentation()
        || a >= 240 // reserved 240.0.0.0/4
        || (a == 100 && (b & 0xc0) == 64) // shared address space 100.64.0.0/10
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments 192.0.0.0/24
        || (a == 198 && (b & 0xfe) == 18) // benchmarking 198.18.0.0/15
        || (a == 192 && b == 88 && c == 99)) // 6to4 relay anycast
}

/// The number of times `CDN-Loop` values already name Tern.
pub fn hops<'a>(values: impl Iterator<Item = &'a HeaderValue>) -> usize {
    values
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter(|entry| {
            let id = entry.split(';').next().unwrap_or("").trim();
            id.eq_ignore_ascii_case(CDN_ID)
        })
        .count()
}

/// rustls with the `ring` provider and safe protocol versions.
fn tls_builder() -> rustls::ConfigBuilder<rustls::ClientConfig, rustls::WantsVerifier> {
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
}

/// A client config trusting only the CA certificates in the PEM file at `path`.
fn ca_config(path: &str) -> Result<Arc<rustls::ClientConfig>, String> {
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

/// The body of an outbound request: whole, or streamed from the guest through a channel.
///
/// A streamed body ends only at its end marker (an empty chunk, sent by
/// `outbound_body_finish`). If the guest goes away first (a trap, its deadline) the channel
/// closes without it and the body fails, so the backend sees an aborted request, never a
/// complete-looking truncated one.
///
/// The body also says when the whole request has been handed to a connection (its end was
/// reached): the wait for the response head ([`send`]'s `first_byte_timeout_ms`) starts then.
pub struct OutBody {
    kind: OutKind,
    sent: Arc<RequestSent>,
}

enum OutKind {
    /// Written before the request was sent (sent with a `Content-Length`).
    Full(Option<Bytes>),
    /// Written after: each write is a chunk; an empty chunk ends the body.
    Stream(tokio::sync::mpsc::Receiver<Bytes>, bool),
    /// A `wasi:http` component's outgoing body. wasmtime ends it cleanly both when the guest
    /// finishes it and when its store is dropped, so [`ComponentCalls::failed`] (set when the
    /// guest's run failed, before the store is dropped) tells the two apart: an end after a
    /// failed run is an abort.
    Boxed(
        http_body_util::combinators::UnsyncBoxBody<Bytes, BodyAborted>,
        Arc<ComponentCalls>,
    ),
}

impl OutBody {
    fn new(kind: OutKind) -> Self {
        Self {
            kind,
            sent: Arc::default(),
        }
    }

    /// A body written whole before the request is sent.
    pub fn full(bytes: Bytes) -> Self {
        Self::new(OutKind::Full((!bytes.is_empty()).then_some(bytes)))
    }

    /// A body the guest streams through `chunks` after the request is sent; an empty chunk
    /// ends it, a closed channel aborts it.
    pub fn stream(chunks: tokio::sync::mpsc::Receiver<Bytes>) -> Self {
        Self::new(OutKind::Stream(chunks, false))
    }

    /// A component's outgoing body, aborted at its end if `calls` says the run failed.
    pub fn component(
        body: http_body_util::combinators::UnsyncBoxBody<Bytes, BodyAborted>,
        calls: Arc<ComponentCalls>,
    ) -> Self {
        Self::new(OutKind::Boxed(body, calls))
    }
}

impl Drop for OutBody {
    /// hyper drops the body once it is done with it: when it has sent all of it (it may stop
    /// polling a body whose declared length it has written), or when the request failed.
    fn drop(&mut self) {
        self.sent.mark();
    }
}

/// Set once an outbound request's body has reached its end on a connection: the request is
/// sent and the backend's turn begins.
#[derive(Debug, Default)]
struct RequestSent {
    done: std::sync::atomic::AtomicBool,
    notify: tokio::sync::Notify,
}

impl RequestSent {
    fn mark(&self) {
        if !self.done.swap(true, std::sync::atomic::Ordering::AcqRel) {
            // A permit is stored if nobody waits yet, so the signal is never lost.
            self.notify.notify_one();
        }
    }
}

/// Why [`send`] got no response head.
#[derive(Debug)]
pub enum HeadError {
    /// Connecting or sending failed (the connector's connect timeout included).
    Failed(hyper_util::client::legacy::Error),
    /// The request was sent but no head came within `first_byte_timeout_ms`.
    FirstByte,
}

/// Sends `req` with `client` and waits for the response head. The connect is bounded by the
/// connector (`connect_timeout_ms`); the head must come within `first_byte` of the request's
/// end reaching the connection, so a pooled connection gives up after `first_byte`, not
/// `connect + first_byte`, and a long streamed upload is not cut by it. (The guest's own
/// deadline and the backend's `total_timeout_ms` bound the whole exchange.)
///
/// # Errors
/// [`HeadError`].
pub async fn send(
    client: &HttpClient,
    req: Request<OutBody>,
    first_byte: Duration,
) -> Result<Response<hyper::body::Incoming>, HeadError> {
    let sent = req.body().sent.clone();
    let mut response = std::pin::pin!(client.request(req));
    tokio::select! {
        biased;
        r = &mut response => return r.map_err(HeadError::Failed),
        () = sent.notify.notified() => {}
    }
    match tokio::time::timeout(first_byte, response).await {
        Ok(r) => r.map_err(HeadError::Failed),
        Err(_) => Err(HeadError::FirstByte),
    }
}

/// What a `wasi:http` component's outgoing requests share with its run (made by its first
/// request).
#[derive(Debug, Default)]
pub struct ComponentCalls {
    /// Nanoseconds spent waiting for response heads.
    pub waited_ns: std::sync::atomic::AtomicU64,
    /// Set when the guest's run failed, before its store is dropped: a body it did not finish
    /// then fails toward the backend instead of ending cleanly.
    pub failed: std::sync::atomic::AtomicBool,
}

/// A streamed outbound body whose guest ended before finishing it.
#[derive(Debug, thiserror::Error)]
#[error("the guest ended before finishing the request body")]
pub struct BodyAborted;

impl http_body::Body for OutBody {
    type Data = Bytes;
    type Error = BodyAborted;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        let frame = match &mut this.kind {
            OutKind::Full(b) => Poll::Ready(b.take().map(|b| Ok(http_body::Frame::data(b)))),
            OutKind::Stream(_, true) => Poll::Ready(None),
            OutKind::Stream(rx, ended) => match rx.poll_recv(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(Some(chunk)) if chunk.is_empty() => {
                    *ended = true;
                    Poll::Ready(None)
                }
                Poll::Ready(Some(chunk)) => Poll::Ready(Some(Ok(http_body::Frame::data(chunk)))),
                Poll::Ready(None) => Poll::Ready(Some(Err(BodyAborted))),
            },
            OutKind::Boxed(b, calls) => match Pin::new(b).poll_frame(cx) {
                Poll::Ready(None) if calls.failed.load(std::sync::atomic::Ordering::Acquire) => {
                    Poll::Ready(Some(Err(BodyAborted)))
                }
                other => other,
            },
        };
        if let Poll::Ready(None) = frame {
            this.sent.mark();
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        let end = match &self.kind {
            OutKind::Boxed(b, _) => b.is_end_stream(),
            kind => matches!(kind, OutKind::Full(None) | OutKind::Stream(_, true)),
        };
        // hyper asks this as it writes the head and after each frame: an ended body is sent.
        if end {
            self.sent.mark();
        }
        end
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match &self.kind {
            OutKind::Full(Some(b)) => http_body::SizeHint::with_exact(b.len() as u64),
            OutKind::Full(None) | OutKind::Stream(_, true) => http_body::SizeHint::with_exact(0),
            OutKind::Stream(..) => http_body::SizeHint::default(),
            OutKind::Boxed(b, _) => b.size_hint(),
        }
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
pub fn client(target: &Target, opened: &prometheus::IntCounter) -> Result<HttpClient, String> {
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
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_public_addresses_are_public() {
        for private in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "224.0.0.1",
            "255.255.255.255",
            "192.0.2.1",
            "198.18.0.1",
            "::1",
            "::",
            "fc00::1",
            "fd12::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "64:ff9b::a00:1",
            "2002:a00:1::",
            "2001:db8::1",
        ] {
            assert!(!is_public(private.parse().unwrap()), "{private}");
        }
        for public in ["1.1.1.1", "8.8.8.8", "93.184.216.34", "2606:4700::1111"] {
            assert!(is_public(public.parse().unwrap()), "{public}");
        }
    }

    #[test]
    fn hops_count_tern_entries() {
        let v = [
            HeaderValue::from_static("foo, tern"),
            HeaderValue::from_static("TERN; v=1,bar"),
        ];
        assert_eq!(hops(v.iter()), 2);
        assert_eq!(hops([].iter()), 0);
    }

    #[test]
    fn configs_are_checked() {
        let mut c = OutboundConfig::default();
        assert!(check_config(&c).is_ok());
        c.backends.insert(
            "origin".into(),
            BackendConfig {
                url: "https://x".into(),
                host: None,
                connect_timeout_ms: None,
                first_byte_timeout_ms: None,
                total_timeout_ms: None,
                ca_file: None,
            },
        );
        assert!(check_config(&c).is_ok());
        c.backends.get_mut("origin").unwrap().ca_file = Some("relative.pem".into());
        assert!(check_config(&c).unwrap_err().contains("absolute"));
        c.backends.get_mut("origin").unwrap().ca_file = None;
        c.backends.get_mut("origin").unwrap().url = "ftp://x".into();
        assert!(check_config(&c).unwrap_err().contains("http://"));
        c.backends.get_mut("origin").unwrap().url = "http://10.0.0.5:8080/v1/".into();
        assert!(check_config(&c).is_ok());
        c.allowed_hosts = vec!["exa mple.com".into()];
        assert!(check_config(&c).unwrap_err().contains("allowed_hosts"));
        c.allowed_hosts.clear();
        c.total_timeout_ms = 0;
        assert!(check_config(&c).unwrap_err().contains("total_timeout_ms"));
    }
}
