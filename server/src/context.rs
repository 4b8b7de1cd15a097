//! What the server knows of a request beyond its message, computed once: the connection it
//! came on (from the listener: peer and TLS facts), its id, its route prefix and
//! HTTP version. Every guest kind renders it its own way (the `tern` ABI's `request_info`,
//! CGI's meta-variables, Spin's `spin-*` headers, `wasi:http`'s scheme); the values they share
//! (scheme, host, URL, server name and port) are derived here only.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use http::header::HOST;
use http::{HeaderMap, HeaderValue, Uri, Version};

/// What the listener knows of a connection, handed to every request on it.
#[derive(Debug, Clone)]
pub struct Connection {
    /// The client's address.
    pub peer: SocketAddr,
    /// The TLS session, when the listener terminates TLS (`None`: plain HTTP).
    pub tls: Option<Arc<TlsInfo>>,
}

impl Connection {
    /// A plain-HTTP connection from `peer`.
    pub fn plain(peer: SocketAddr) -> Self {
        Self { peer, tls: None }
    }

    /// `https` on a TLS connection, else `http`.
    pub fn scheme(&self) -> &'static str {
        if self.tls.is_some() { "https" } else { "http" }
    }
}

/// `addr` with an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`, how a dual-stack `[::]`
/// listener sees an IPv4 client) as the IPv4 address it maps: one client, one spelling.
pub fn canonical(addr: SocketAddr) -> SocketAddr {
    match addr {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), v6.port()),
            None => addr,
        },
        SocketAddr::V4(_) => addr,
    }
}

/// What a TLS listener learnt in the handshake.
#[derive(Debug, Clone)]
pub struct TlsInfo {
    /// The protocol version (`TLSv1.3`).
    pub protocol: &'static str,
    /// The server name the client asked for (SNI), if it sent one.
    pub sni: Option<String>,
}

/// What the server knows of a request beyond its message.
#[derive(Debug, Clone)]
pub struct RequestContext {
    /// The connection it came on.
    pub conn: Connection,
    /// The client: the connection's peer, or behind a trusted proxy the address it forwarded
    /// ([`TrustedProxies::client`]); port `0` when the proxy did not say. Always
    /// [`canonical`]: an IPv4 client is an IPv4 address however it came.
    pub client: SocketAddr,
    /// The id the server gave the request.
    pub request_id: HeaderValue,
    /// Bytes of the path that matched the tenant's route prefix (0 for a tenant at `/`).
    pub prefix_len: usize,
    /// The HTTP version the request came in.
    pub version: Version,
    /// Its trace, when tracing is on (`[tracing]`).
    pub trace: Option<Arc<crate::trace::Active>>,
    /// A time limit other than the tenant's `limits.timeout_ms` (a scheduled run's).
    pub timeout: Option<std::time::Duration>,
    /// What made it run: a client's request, or a schedule (a component's scheduled run calls
    /// its `handle-cron-event` when it exports one).
    pub trigger: crate::trigger::Trigger,
}

impl RequestContext {
    /// The client's address (port `0`: unknown, a proxy forwarded only its IP).
    pub fn client(&self) -> SocketAddr {
        self.client
    }

    /// `http` or `https`.
    pub fn scheme(&self) -> &'static str {
        self.conn.scheme()
    }

    /// The port a URL of this scheme names when it names none.
    pub fn default_port(&self) -> u16 {
        if self.conn.tls.is_some() { 443 } else { 80 }
    }
}

/// The networks of proxies trusted to say who their client is (`[server] trusted_proxies`):
/// a request whose connection comes from one may name its client in `Forwarded` (RFC 7239)
/// or, without it, `X-Forwarded-For`. From anyone else those headers are only headers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies(Vec<(IpAddr, u8)>);

impl TrustedProxies {
    /// Parses addresses and networks: `10.0.0.0/8`, `192.0.2.7`, `fd00::/8`, `::1`.
    ///
    /// # Errors
    /// The entry that is not one, and why.
    pub fn parse(list: &[String]) -> Result<Self, String> {
        let mut nets = Vec::with_capacity(list.len());
        for entry in list {
            let (ip, len) = match entry.split_once('/') {
                Some((ip, len)) => (ip, Some(len)),
                None => (entry.as_str(), None),
            };
            let ip: IpAddr = ip.trim().parse().map_err(|_| {
                format!("{entry:?} is not an IP address or network (e.g. 10.0.0.0/8, ::1)")
            })?;
            let ip = ip.to_canonical();
            let max = if ip.is_ipv4() { 32 } else { 128 };
            let len = match len {
                None => max,
                Some(l) => match l.trim().parse::<u8>() {
                    Ok(n) if n <= max => n,
                    _ => return Err(format!("{entry:?}: the prefix length must be 0-{max}")),
                },
            };
            nets.push((ip, len));
        }
        Ok(Self(nets))
    }

    /// Whether none is trusted (the client is always the connection's peer).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `ip` is in a trusted network.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.0.iter().any(|&(net, len)| match (net, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => prefix_eq(&n.octets(), &a.octets(), len),
            (IpAddr::V6(n), IpAddr::V6(a)) => prefix_eq(&n.octets(), &a.octets(), len),
            _ => false,
        })
    }

    /// The client of a request whose connection came from `peer`: `peer` unless it is a
    /// trusted proxy; then, walking the forwarded addresses from the nearest hop back, the
    /// first that is not a trusted proxy itself (the nearest a malformed or hidden entry
    /// leaves, if any). `Forwarded: for=` is read when present, else `X-Forwarded-For`.
    pub fn client(&self, peer: SocketAddr, headers: &HeaderMap) -> SocketAddr {
        if !self.contains(peer.ip()) {
            return peer;
        }
        // The hops from the nearest back: the last value's last element first.
        let forwarded = headers.get_all(http::header::FORWARDED);
        if forwarded.iter().next().is_some() {
            let hops = forwarded
                .iter()
                .rev()
                .flat_map(|v| v.as_bytes().rsplit(|b| *b == b','))
                .map(forwarded_for);
            self.walk(peer, hops)
        } else {
            let hops = headers
                .get_all(&X_FORWARDED_FOR)
                .iter()
                .rev()
                .flat_map(|v| v.as_bytes().rsplit(|b| *b == b','))
                .map(|h| node(h.trim_ascii()));
            self.walk(peer, hops)
        }
    }

    /// From `peer`, a trusted proxy, back along `hops` (nearest first) while the address
    /// reached is a trusted proxy: the first that is not, or the last trusted one when a hop
    /// is malformed, hidden or missing.
    fn walk(&self, peer: SocketAddr, hops: impl Iterator<Item = Option<SocketAddr>>) -> SocketAddr {
        let mut client = peer;
        for hop in hops {
            if !self.contains(client.ip()) {
                break;
            }
            match hop {
                Some(addr) => client = addr,
                None => break,
            }
        }
        client
    }
}

/// `X-Forwarded-For`: the addresses a request passed through, its client first.
static X_FORWARDED_FOR: http::HeaderName = http::HeaderName::from_static("x-forwarded-for");

/// Whether the first `len` bits of `a` and `b` agree.
fn prefix_eq(a: &[u8], b: &[u8], len: u8) -> bool {
    let (whole, rest) = (usize::from(len / 8), len % 8);
    a[..whole] == b[..whole] && (rest == 0 || (a[whole] ^ b[whole]) & (0xffu8 << (8 - rest)) == 0)
}

/// The `for=` node of one `Forwarded` element (`for=192.0.2.60;proto=https`), if it names an
/// address.
fn forwarded_for(element: &[u8]) -> Option<SocketAddr> {
    element.split(|b| *b == b';').find_map(|pair| {
        let pair = pair.trim_ascii();
        let (name, value) = pair.split_at(pair.iter().position(|b| *b == b'=')?);
        name.eq_ignore_ascii_case(b"for")
            .then(|| node(value[1..].trim_ascii()))
            .flatten()
    })
}

/// An address as a proxy writes it: `192.0.2.60`, `192.0.2.60:4711`, `2001:db8::1`,
/// `[2001:db8::1]:4711`, optionally quoted; `unknown` and hidden names are `None`.
fn node(text: &[u8]) -> Option<SocketAddr> {
    let text = std::str::from_utf8(text).ok()?;
    let text = text.strip_prefix('"').unwrap_or(text);
    let text = text.strip_suffix('"').unwrap_or(text);
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Some(SocketAddr::new(addr.ip().to_canonical(), addr.port()));
    }
    let bare = text
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .unwrap_or(text);
    bare.parse::<IpAddr>()
        .ok()
        .map(|ip| SocketAddr::new(ip.to_canonical(), 0))
}

/// Which of the request headers the front end looks up by name a request carries, found in
/// one pass over its head as it came. Most requests carry none of them, and a look-up of an
/// absent name still hashes it and probes the map (~90 instructions each), so each look-up
/// first asks here. A step that adds one of these headers to a request must not ask it after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Present(u8);

impl Present {
    /// `Transfer-Encoding`.
    pub const TRANSFER_ENCODING: Self = Self(1);
    /// `Upgrade`.
    pub const UPGRADE: Self = Self(1 << 1);
    /// `Accept-Encoding`.
    pub const ACCEPT_ENCODING: Self = Self(1 << 2);
    /// `x-request-id`.
    pub const REQUEST_ID: Self = Self(1 << 3);
    /// One the edge cache's look reads (its validators, `Range`, `If-Range`, the body's
    /// framing, the request's own directives) or a header it judges unkeyed (`Forwarded`, an
    /// `x-` header).
    pub const CACHE: Self = Self(1 << 4);
    /// Every one: what a request not summed up gets (each look-up is made).
    pub const ALL: Self = Self(u8::MAX);

    /// What `headers` carry.
    pub fn of(headers: &HeaderMap) -> Self {
        use http::header;
        let mut bits = 0;
        for name in headers.keys() {
            bits |= if name == header::ACCEPT_ENCODING {
                Self::ACCEPT_ENCODING.0
            } else if name == header::TRANSFER_ENCODING {
                Self::TRANSFER_ENCODING.0 | Self::CACHE.0
            } else if name == header::UPGRADE {
                Self::UPGRADE.0
            } else if name == header::IF_NONE_MATCH
                || name == header::IF_MODIFIED_SINCE
                || name == header::RANGE
                || name == header::IF_RANGE
                || name == header::CONTENT_LENGTH
                || name == header::CACHE_CONTROL
                || name == header::PRAGMA
                || name == header::FORWARDED
            {
                Self::CACHE.0
            } else if name.as_str().starts_with("x-") {
                if name.as_str() == "x-request-id" {
                    Self::REQUEST_ID.0 | Self::CACHE.0
                } else {
                    Self::CACHE.0
                }
            } else {
                0
            };
        }
        Self(bits)
    }

    /// Whether it carries (or may carry) `header`.
    pub fn has(self, header: Self) -> bool {
        self.0 & header.0 != 0
    }
}

/// The host the request names: its target's authority (HTTP/2's `:authority`, an
/// absolute-form target), else its `Host` header.
pub fn host<'a>(uri: &'a Uri, headers: &'a HeaderMap) -> Option<&'a [u8]> {
    match uri.authority() {
        Some(a) => Some(a.as_str().as_bytes()),
        None => headers.get(HOST).map(HeaderValue::as_bytes),
    }
}

/// The request's path and query (`/` for none).
pub fn path_and_query(uri: &Uri) -> &str {
    uri.path_and_query().map_or("/", |pq| pq.as_str())
}

/// The URL the client asked for: scheme, host and path with query.
pub fn url(context: &RequestContext, uri: &Uri, headers: &HeaderMap) -> Vec<u8> {
    let host = host(uri, headers).unwrap_or_default();
    let pq = path_and_query(uri);
    let scheme = context.scheme();
    let mut url = Vec::with_capacity(scheme.len() + 3 + host.len() + pq.len());
    url.extend_from_slice(scheme.as_bytes());
    url.extend_from_slice(b"://");
    url.extend_from_slice(host);
    url.extend_from_slice(pq.as_bytes());
    url
}

/// The server's name and port as the request names them (CGI's `SERVER_NAME` and
/// `SERVER_PORT`): its host, and the host's port or the scheme's default.
pub fn server_name_port(context: &RequestContext, uri: &Uri, headers: &HeaderMap) -> (String, u16) {
    let host = String::from_utf8_lossy(host(uri, headers).unwrap_or_default()).into_owned();
    match host.parse::<http::uri::Authority>() {
        Ok(a) => (
            a.host().to_string(),
            a.port_u16().unwrap_or(context.default_port()),
        ),
        Err(_) => (host, context.default_port()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context(tls: bool) -> RequestContext {
        let addr = "127.0.0.1:1".parse().unwrap();
        RequestContext {
            conn: Connection {
                tls: tls.then(|| {
                    Arc::new(TlsInfo {
                        protocol: "TLSv1.3",
                        sni: None,
                    })
                }),
                ..Connection::plain(addr)
            },
            client: addr,
            request_id: HeaderValue::from_static("r"),
            prefix_len: 0,
            version: Version::HTTP_11,
            trace: None,
            timeout: None,
            trigger: crate::trigger::Trigger::Request,
        }
    }

    #[test]
    fn urls_and_ports_follow_the_scheme() {
        let mut headers = HeaderMap::new();
        headers.insert(HOST, HeaderValue::from_static("example.com"));
        let uri: Uri = "/a?b".parse().unwrap();
        assert_eq!(
            url(&context(false), &uri, &headers),
            b"http://example.com/a?b"
        );
        assert_eq!(
            url(&context(true), &uri, &headers),
            b"https://example.com/a?b"
        );
        assert_eq!(
            server_name_port(&context(true), &uri, &headers),
            ("example.com".into(), 443)
        );
        // The target's authority wins over `Host`; its port over the default.
        let uri: Uri = "http://other.example:8080/".parse().unwrap();
        assert_eq!(
            server_name_port(&context(false), &uri, &headers),
            ("other.example".into(), 8080)
        );
    }
}

#[cfg(test)]
mod forwarded_tests {
    use super::*;

    fn trusted(list: &[&str]) -> TrustedProxies {
        TrustedProxies::parse(&list.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn an_ipv4_mapped_address_is_its_ipv4_address() {
        for (addr, want) in [
            ("[::ffff:192.0.2.7]:4711", "192.0.2.7:4711"),
            ("192.0.2.7:4711", "192.0.2.7:4711"),
            ("[::1]:80", "[::1]:80"),
            (
                "[2001:db8::ffff:c000:207]:80",
                "[2001:db8::ffff:c000:207]:80",
            ),
            // IPv4-compatible (deprecated, `::a.b.c.d`) is not a mapped address.
            ("[::192.0.2.7]:80", "[::c000:207]:80"),
        ] {
            let addr: SocketAddr = addr.parse().unwrap();
            assert_eq!(canonical(addr).to_string(), want, "{addr}");
        }
    }

    #[test]
    fn networks_contain_their_addresses_at_the_edges() {
        let t = trusted(&["10.0.0.0/8", "192.0.2.7", "fd00::/8", "172.16.0.0/12"]);
        for (ip, want) in [
            ("10.0.0.0", true),
            ("10.255.255.255", true),
            ("11.0.0.0", false),
            ("9.255.255.255", false),
            ("192.0.2.7", true),
            ("192.0.2.8", false),
            ("172.31.255.255", true),
            ("172.32.0.0", false),
            ("fd12::1", true),
            ("fe00::1", false),
            ("::ffff:10.1.2.3", true),
        ] {
            assert_eq!(t.contains(ip.parse().unwrap()), want, "{ip}");
        }
        for bad in ["10.0.0.0/33", "x", "::/129", "10.0.0.0/-1"] {
            assert!(TrustedProxies::parse(&[bad.to_string()]).is_err(), "{bad}");
        }
        assert!(trusted(&["0.0.0.0/0"]).contains("8.8.8.8".parse().unwrap()));
    }

    #[test]
    fn only_a_trusted_peer_may_name_the_client() {
        let t = trusted(&["10.0.0.0/8"]);
        let proxy: SocketAddr = "10.0.0.5:40000".parse().unwrap();
        let stranger: SocketAddr = "203.0.113.9:5555".parse().unwrap();
        let xff = headers(&[("x-forwarded-for", "198.51.100.1")]);
        assert_eq!(
            t.client(stranger, &xff),
            stranger,
            "an untrusted peer's header is ignored"
        );
        assert_eq!(t.client(proxy, &xff), "198.51.100.1:0".parse().unwrap());
        assert_eq!(TrustedProxies::default().client(proxy, &xff), proxy);
        // A spoofed entry before the real client stays unread: the walk stops at the first
        // address that is not a trusted proxy.
        let chain = headers(&[
            ("x-forwarded-for", "6.6.6.6, 198.51.100.1"),
            ("x-forwarded-for", "10.1.1.1"),
        ]);
        assert_eq!(t.client(proxy, &chain), "198.51.100.1:0".parse().unwrap());
        // Forwarded wins over X-Forwarded-For; ports and IPv6 as proxies write them.
        let both = headers(&[
            ("x-forwarded-for", "6.6.6.6"),
            (
                "forwarded",
                "for=192.0.2.60;proto=http, For=\"[2001:db8:cafe::17]:4711\"",
            ),
        ]);
        assert_eq!(
            t.client(proxy, &both),
            "[2001:db8:cafe::17]:4711".parse().unwrap()
        );
        // `unknown` or garbage ends the walk at the nearest trusted hop.
        let hidden = headers(&[("forwarded", "for=198.51.100.1, for=unknown")]);
        assert_eq!(t.client(proxy, &hidden), proxy);
        let garbage = headers(&[("x-forwarded-for", "198.51.100.1, not-an-ip")]);
        assert_eq!(t.client(proxy, &garbage), proxy);
        assert_eq!(t.client(proxy, &HeaderMap::new()), proxy);
    }
}

#[cfg(test)]
mod present_tests {
    use super::Present;
    use http::HeaderMap;

    #[test]
    fn a_request_head_is_summed_up_in_one_pass() {
        let of = |lines: &[(&str, &str)]| {
            let mut h = HeaderMap::new();
            for (n, v) in lines {
                h.append(
                    http::HeaderName::from_bytes(n.as_bytes()).unwrap(),
                    v.parse().unwrap(),
                );
            }
            Present::of(&h)
        };
        let every = [
            Present::TRANSFER_ENCODING,
            Present::UPGRADE,
            Present::ACCEPT_ENCODING,
            Present::REQUEST_ID,
            Present::CACHE,
        ];
        let none = of(&[("host", "a"), ("user-agent", "k6"), ("accept", "*/*")]);
        for bit in every {
            assert!(!none.has(bit));
            assert!(Present::ALL.has(bit));
        }
        assert!(of(&[("accept-encoding", "gzip")]).has(Present::ACCEPT_ENCODING));
        // Several at once: each is seen.
        let many = of(&[
            ("host", "a"),
            ("accept-encoding", "br"),
            ("upgrade", "websocket"),
            ("x-request-id", "abc"),
            ("transfer-encoding", "chunked"),
        ]);
        for bit in every {
            assert!(many.has(bit));
        }
        assert!(of(&[("upgrade", "websocket")]).has(Present::UPGRADE));
        let te = of(&[("transfer-encoding", "chunked")]);
        assert!(te.has(Present::TRANSFER_ENCODING) && te.has(Present::CACHE));
        let id = of(&[("x-request-id", "abc")]);
        assert!(id.has(Present::REQUEST_ID) && id.has(Present::CACHE));
        for name in [
            "if-none-match",
            "if-modified-since",
            "range",
            "if-range",
            "content-length",
            "cache-control",
            "pragma",
            "forwarded",
            "x-forwarded-host",
        ] {
            let p = of(&[(name, "1")]);
            assert!(p.has(Present::CACHE), "{name}");
            assert!(!p.has(Present::ACCEPT_ENCODING), "{name}");
        }
    }
}
