//! What the server knows of a request beyond its message, computed once: the connection it
//! came on (from the listener: peer and TLS facts), its id, its route prefix and
//! HTTP version. Every guest kind renders it its own way (the `tern` ABI's `request_info`,
//! CGI's meta-variables, Spin's `spin-*` headers, `wasi:http`'s scheme); the values they share
//! (scheme, host, URL, server name and port) are derived here only.

use std::net::SocketAddr;
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
    /// The id the server gave the request.
    pub request_id: HeaderValue,
    /// Bytes of the path that matched the tenant's route prefix (0 for a tenant at `/`).
    pub prefix_len: usize,
    /// The HTTP version the request came in.
    pub version: Version,
    /// Its trace, when tracing is on (`[tracing]`).
    pub trace: Option<Arc<crate::trace::Active>>,
}

impl RequestContext {
    /// The client's address.
    pub fn client(&self) -> SocketAddr {
        self.conn.peer
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
            request_id: HeaderValue::from_static("r"),
            prefix_len: 0,
            version: Version::HTTP_11,
            trace: None,
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
