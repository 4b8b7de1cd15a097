//! Routing: `Host` and path prefix → tenant.
//!
//! Routes are ranked once, when the table is built: the most specific host pattern first
//! (exact, then the longest `*.suffix`, then any host), then the longest path prefix. A request
//! goes to the first route that matches, so lookup is a scan that stops at the first hit.
//! Identical (host, prefix) pairs on two tenants are refused by config validation.

use crate::config::normalise_prefix;

/// Which hosts a route accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    /// Any host (the tenant gave no `hosts`).
    Any,
    /// Exactly this host (lowercase, no port).
    Exact(String),
    /// Any host ending in this suffix, which starts with `.` (from `*.example.com`).
    Suffix(String),
}

impl HostPattern {
    /// Parses `example.com`, `*.example.com`, or `""` (any host).
    ///
    /// # Errors
    /// A message naming what is wrong with the pattern.
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.to_ascii_lowercase();
        if s.is_empty() || s == "*" {
            return Ok(Self::Any);
        }
        let (wild, name) = match s.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, s.as_str()),
        };
        let valid = !name.is_empty()
            && name.len() <= 253
            && name.split('.').all(|label| {
                !label.is_empty()
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            });
        if !valid {
            return Err(format!(
                "{s:?} is not a host name or a `*.suffix` wildcard (no ports, no inner `*`)"
            ));
        }
        Ok(if wild {
            Self::Suffix(format!(".{name}"))
        } else {
            Self::Exact(name.to_string())
        })
    }

    fn matches(&self, host: &str) -> bool {
        match self {
            Self::Any => true,
            Self::Exact(h) => h == host,
            Self::Suffix(sfx) => host.len() > sfx.len() && host.ends_with(sfx.as_str()),
        }
    }

    /// Higher is more specific.
    fn rank(&self) -> (u8, usize) {
        match self {
            Self::Any => (0, 0),
            Self::Suffix(s) => (1, s.len()),
            Self::Exact(_) => (2, 0),
        }
    }
}

/// Checks a configured path prefix.
///
/// # Errors
/// A message if it does not start with `/` or has a query, fragment or `*`.
pub fn check_prefix(p: &str) -> Result<(), String> {
    if !p.starts_with('/') {
        return Err(format!("{p:?} must start with '/'"));
    }
    if p.contains(['?', '#', '*', ' ']) {
        return Err(format!(
            "{p:?} must be a plain path (no '?', '#', '*' or spaces)"
        ));
    }
    Ok(())
}

#[derive(Debug)]
struct Route<T> {
    host: HostPattern,
    /// Normalised: no trailing `/` except for the root prefix itself.
    prefix: String,
    target: T,
}

/// The routing table for targets of type `T` (the server uses `Arc<Tenant>`).
#[derive(Debug)]
pub struct Router<T> {
    routes: Vec<Route<T>>,
}

impl<T: Clone> Router<T> {
    /// Builds a table from `(host patterns, path prefixes, target)` entries; empty host or path
    /// lists mean any host and `/`. Patterns must already be valid (config validation checks).
    pub fn new<'a>(entries: impl IntoIterator<Item = (Vec<&'a str>, Vec<&'a str>, T)>) -> Self {
        let mut routes = Vec::new();
        for (hosts, paths, target) in entries {
            let hosts = if hosts.is_empty() { vec![""] } else { hosts };
            let paths = if paths.is_empty() { vec!["/"] } else { paths };
            for h in &hosts {
                for p in &paths {
                    routes.push(Route {
                        host: HostPattern::parse(h).unwrap_or(HostPattern::Any),
                        prefix: normalise_prefix(p),
                        target: target.clone(),
                    });
                }
            }
        }
        routes.sort_by(|a, b| {
            b.host
                .rank()
                .cmp(&a.host.rank())
                .then(b.prefix.len().cmp(&a.prefix.len()))
        });
        Self { routes }
    }

    /// The target for a request to `host` (any case, with or without `:port`) and `path`.
    pub fn route(&self, host: Option<&str>, path: &str) -> Option<&T> {
        let host = host.map_or("", strip_port);
        // Host names are case-insensitive; avoid allocating for the usual lowercase case.
        let lowered;
        let host = if host.bytes().any(|b| b.is_ascii_uppercase()) {
            lowered = host.to_ascii_lowercase();
            lowered.as_str()
        } else {
            host
        };
        self.routes
            .iter()
            .find(|r| r.host.matches(host) && prefix_matches(&r.prefix, path))
            .map(|r| &r.target)
    }

    /// Number of (host, prefix) routes.
    pub fn len(&self) -> usize {
        self.routes.len()
    }

    /// Whether there are no routes.
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }
}

fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        // IPv6 literal: `[::1]:8080`.
        return host.find(']').map_or(host, |i| &host[..=i]);
    }
    host.rsplit_once(':').map_or(host, |(h, port)| {
        if port.bytes().all(|b| b.is_ascii_digit()) {
            h
        } else {
            host
        }
    })
}

/// `/api` matches `/api`, `/api/` and `/api/x`, but not `/apix`.
fn prefix_matches(prefix: &str, path: &str) -> bool {
    if prefix == "/" {
        return true;
    }
    match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Router<&'static str> {
        Router::new([
            (vec![], vec!["/"], "fallback"),
            (vec![], vec!["/api"], "api"),
            (vec![], vec!["/api/v2/"], "api-v2"),
            (vec!["shop.example.com"], vec![], "shop"),
            (vec!["*.example.com"], vec![], "wild"),
            (vec!["*.eu.example.com"], vec!["/static"], "eu-static"),
        ])
    }

    #[test]
    fn routes_by_host_then_longest_prefix() {
        let t = table();
        let cases = [
            (None, "/", Some("fallback")),
            (None, "/api", Some("api")),
            (None, "/api/", Some("api")),
            (None, "/apix", Some("fallback")),
            (None, "/api/v2", Some("api-v2")),
            (None, "/api/v2/users", Some("api-v2")),
            (Some("SHOP.example.com:8080"), "/api", Some("shop")),
            (Some("a.example.com"), "/", Some("wild")),
            (Some("example.com"), "/api", Some("api")),
            (Some("x.eu.example.com"), "/static/a.css", Some("eu-static")),
            (Some("x.eu.example.com"), "/other", Some("wild")),
            (Some("[::1]:80"), "/api", Some("api")),
        ];
        for (host, path, want) in cases {
            assert_eq!(
                t.route(host, path).copied(),
                want,
                "host={host:?} path={path}"
            );
        }
    }

    #[test]
    fn no_route_is_none() {
        let t = Router::new([(vec!["a.com"], vec!["/x"], 1)]);
        assert_eq!(t.route(Some("a.com"), "/y"), None);
        assert_eq!(t.route(Some("b.com"), "/x"), None);
        assert_eq!(t.route(None, "/x"), None);
    }

    #[test]
    fn host_patterns_are_checked() {
        assert_eq!(
            HostPattern::parse("*.A.com"),
            Ok(HostPattern::Suffix(".a.com".into()))
        );
        for bad in ["a.*.com", "a..com", "a.com:80", "*."] {
            assert!(HostPattern::parse(bad).is_err(), "{bad}");
        }
        assert!(check_prefix("x").is_err());
        assert!(check_prefix("/x?y").is_err());
    }
}
