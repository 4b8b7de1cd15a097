//! The policy: which backends and hosts a tenant's guests may call, checked and resolved
//! into a [`Destination`]; the `[tenant.outbound]` schema it is built from.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderValue, Uri};
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;

use super::tls::{Tls, ca_config};
use crate::ceilings;
use crate::router::HostPattern;

/// How many times a request may pass through Tern (counted in `CDN-Loop`) before its guest's
/// outbound requests are refused as a loop.
pub const MAX_HOPS: usize = 8;

/// Most headers a guest may set on one outbound request (the `tern` ABI's `outbound_header`
/// answers `LIMIT_EXCEEDED` past it; a forwarded request counts the client's headers too).
pub const MAX_HEADERS: usize = 100;

/// Our entry in `CDN-Loop`.
pub const CDN_ID: &str = "tern";

/// The label of URL requests in metrics (backends are labelled by name).
pub const URL_LABEL: &str = "url";

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
    /// Its answers to `GET` and `HEAD` are kept in the tenant's cache (`[tenant.cache]`, which
    /// must be enabled) by their own headers, as the cache in front of the guests keeps the
    /// guests' answers: readthrough. A guest's request may change that with `Tern-Cache`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cache: bool,
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
    /// Its answers are kept in the tenant's cache (`cache`).
    cached: bool,
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
#[derive(Debug, Clone)]
pub struct Destination {
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
    /// Its answers are kept in the tenant's cache (a backend with `cache = true`).
    pub cached: bool,
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
}

/// Checks a tenant's `[outbound]` section.
///
/// # Errors
/// What is wrong, naming the setting.
pub fn check_config(c: &OutboundConfig) -> Result<(), String> {
    Policy::from_config(c).map(drop)
}

fn ms(key: &str, v: u64) -> Result<Duration, String> {
    ceilings::check(&[(key, v, 1, ceilings::MAX_TIMEOUT_MS)])?;
    Ok(Duration::from_millis(v))
}

impl Policy {
    /// The policy `c` describes.
    ///
    /// # Errors
    /// What is wrong with `c`, naming the setting.
    pub fn from_config(c: &OutboundConfig) -> Result<Self, String> {
        ceilings::check(&[
            (
                "max_requests",
                u64::from(c.max_requests),
                0,
                ceilings::MAX_OUTBOUND_REQUESTS,
            ),
            (
                "max_concurrent",
                u64::from(c.max_concurrent),
                1,
                ceilings::MAX_OUTBOUND_CONCURRENT,
            ),
            (
                "max_request_bytes",
                c.max_request_bytes,
                0,
                ceilings::MAX_BODY_BYTES,
            ),
            (
                "max_response_bytes",
                c.max_response_bytes,
                0,
                ceilings::MAX_BODY_BYTES,
            ),
        ])?;
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

    /// The names of the backends whose answers are cached (`cache = true`).
    pub fn cached_backends(&self) -> impl Iterator<Item = &Arc<str>> {
        self.backends.values().filter(|b| b.cached).map(|b| &b.name)
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
    pub async fn destination(&self, backend: &str, path: &str) -> Result<Destination, Denied> {
        if backend.is_empty() {
            return self.url_destination(path).await;
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
        Ok(Destination {
            uri,
            host: b.host.clone(),
            timeouts: b.timeouts,
            budget: b.budget.clone(),
            label: b.name.clone(),
            tls: b.tls.clone(),
            public_only: false,
            cached: b.cached,
        })
    }

    async fn url_destination(&self, url: &str) -> Result<Destination, Denied> {
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
        Ok(Destination {
            uri,
            host,
            timeouts: self.url_timeouts,
            budget: self.url_budget.clone(),
            label: Arc::from(URL_LABEL),
            tls: Tls::Platform,
            public_only: true,
            cached: false,
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
            cached: c.cache,
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
pub(super) fn not_public(host: &str, addrs: &[SocketAddr]) -> Option<Denied> {
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
                cache: false,
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
