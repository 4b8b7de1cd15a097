//! Routing: `Host` and path prefix → tenant.
//!
//! The most specific host wins (exact, then the longest `*.suffix`, then any host); within it,
//! the longest matching path prefix. Lookups are indexed so they cost the same with 10 tenants
//! or 10,000: exact hosts and wildcard suffixes are hash-map keys (a request's host is looked
//! up once per dot), and each host's prefixes are grouped by their first path segment, so a
//! request only compares the few prefixes that share its first segment. Identical
//! (host, prefix) pairs on two targets are a [`Clash`].

use std::collections::HashMap;

/// Which hosts a route accepts.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
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
        if s == "*" {
            return Ok(Self::Any);
        }
        if s.is_empty() {
            return Err("an empty host name (for any host, leave `hosts` out or use \"*\")".into());
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

    /// The least specific host a request can name that both `self` and `other` accept: any
    /// other pattern that accepts it accepts every host the two share, so it is routed as the
    /// least specific request to both is. `Some(None)`: no host (both accept any); `None`: no
    /// host is accepted by both. (A wildcard's is its suffix under a label no pattern can
    /// name, `~`.)
    pub fn meet(&self, other: &Self) -> Option<Option<String>> {
        match (self, other) {
            (Self::Any, Self::Any) => Some(None),
            (Self::Any, Self::Exact(e)) | (Self::Exact(e), Self::Any) => Some(Some(e.clone())),
            (Self::Any, Self::Suffix(s)) | (Self::Suffix(s), Self::Any) => {
                Some(Some(format!("~{s}")))
            }
            (Self::Exact(a), Self::Exact(b)) => (a == b).then(|| Some(a.clone())),
            (Self::Exact(e), s @ Self::Suffix(_)) | (s @ Self::Suffix(_), Self::Exact(e)) => {
                s.matches(e).then(|| Some(e.clone()))
            }
            (Self::Suffix(a), Self::Suffix(b)) => {
                let (longer, shorter) = if a.len() >= b.len() { (a, b) } else { (b, a) };
                longer
                    .ends_with(shorter.as_str())
                    .then(|| Some(format!("~{longer}")))
            }
        }
    }

    /// Whether `host` (lowercase, no port) matches.
    pub fn matches(&self, host: &str) -> bool {
        match self {
            Self::Any => true,
            Self::Exact(e) => e == host,
            Self::Suffix(s) => host.len() > s.len() && host.ends_with(s.as_str()),
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
    if p.contains(['?', '#', '*', ' ', '%', '\\']) || p.chars().any(|c| c.is_control()) {
        return Err(format!(
            "{p:?} must be a plain path (no '?', '#', '*', '%', '\\', spaces or control \
             characters)"
        ));
    }
    // A prefix is matched against the path as sent: a dot segment or an empty one would
    // match a path that a client, a proxy or the guest reads as another.
    let inner = p.trim_end_matches('/');
    if inner
        .split('/')
        .skip(1)
        .any(|seg| seg.is_empty() || seg == "." || seg == "..")
    {
        return Err(format!("{p:?} must not have empty, `.` or `..` segments"));
    }
    Ok(())
}

/// Two targets claim the same host and path prefix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("route host={host:?} path={prefix:?} is already routed to tenant {existing:?}")]
pub struct Clash {
    /// The host pattern (`*` for any host).
    pub host: String,
    /// The normalised path prefix.
    pub prefix: String,
    /// The target that had the route first.
    pub existing: String,
    /// The target that asked for it too.
    pub other: String,
}

/// The path prefixes of one host pattern.
#[derive(Debug)]
struct Group<T> {
    /// The target of the prefix `/`, if any.
    root: Option<T>,
    /// The other prefixes keyed by their first path segment, longest prefix first.
    by_segment: HashMap<String, Vec<(String, T)>>,
}

impl<T> Default for Group<T> {
    fn default() -> Self {
        Self {
            root: None,
            by_segment: HashMap::new(),
        }
    }
}

impl<T> Group<T> {
    fn insert(&mut self, prefix: String, target: T) {
        if prefix == "/" {
            self.root = Some(target);
            return;
        }
        let list = self
            .by_segment
            .entry(first_segment(&prefix).to_string())
            .or_default();
        let at = list.partition_point(|(p, _)| p.len() >= prefix.len());
        list.insert(at, (prefix, target));
    }

    /// The target for `path` and the length of the prefix it matched (0 for `/`).
    fn lookup(&self, path: &str) -> Option<(&T, usize)> {
        self.by_segment
            .get(first_segment(path))
            .and_then(|list| list.iter().find(|(p, _)| prefix_matches(p, path)))
            .map(|(p, t)| (t, p.len()))
            .or(self.root.as_ref().map(|t| (t, 0)))
    }
}

/// One target's routes.
#[derive(Debug, Clone)]
pub struct Route<'a, T> {
    /// The target's name (for clash errors).
    pub name: &'a str,
    /// Host patterns; empty means any host.
    pub hosts: Vec<&'a str>,
    /// Path prefixes; empty means `/`.
    pub paths: Vec<&'a str>,
    /// What requests matching them go to.
    pub target: T,
}

impl<'a, T> Route<'a, T> {
    /// The routes of `name`: `hosts` and `paths` (empty: any host, `/`) to `target`.
    pub fn new(
        name: &'a str,
        hosts: impl IntoIterator<Item = &'a str>,
        paths: impl IntoIterator<Item = &'a str>,
        target: T,
    ) -> Self {
        Self {
            name,
            hosts: hosts.into_iter().collect(),
            paths: paths.into_iter().collect(),
            target,
        }
    }

    /// Its (host, path prefix) pairs, each a key of the table: the host as written (`*` for
    /// any), as parsed, and the prefix as the router keys it ([`normalise_prefix`]).
    pub fn pairs(&self) -> Vec<(&'a str, HostPattern, String)> {
        let hosts: &[&'a str] = if self.hosts.is_empty() {
            &["*"]
        } else {
            &self.hosts
        };
        let paths: &[&'a str] = if self.paths.is_empty() {
            &["/"]
        } else {
            &self.paths
        };
        let mut pairs = Vec::with_capacity(hosts.len() * paths.len());
        for h in hosts {
            let pattern = HostPattern::parse(h).unwrap_or(HostPattern::Any);
            for p in paths {
                pairs.push((*h, pattern.clone(), normalise_prefix(p)));
            }
        }
        pairs
    }
}

/// A configured path prefix as the router keys it: without trailing slashes (`/` stays `/`),
/// so `/api/` and `/api` route the same requests.
pub fn normalise_prefix(p: &str) -> String {
    let trimmed = p.trim_end_matches('/');
    if trimmed.is_empty() {
        "/".to_string()
    } else {
        trimmed.to_string()
    }
}

/// The routing table for targets of type `T` (the server uses `Arc<Tenant>`).
#[derive(Debug)]
pub struct Router<T> {
    exact: HashMap<String, Group<T>>,
    /// Keyed by the suffix with its leading dot (`.example.com`).
    suffix: HashMap<String, Group<T>>,
    any: Group<T>,
    routes: usize,
}

impl<T> Default for Router<T> {
    fn default() -> Self {
        Self {
            exact: HashMap::new(),
            suffix: HashMap::new(),
            any: Group::default(),
            routes: 0,
        }
    }
}

impl<T: Clone> Router<T> {
    /// Builds a table. Patterns must already be valid (config and API validation check them).
    ///
    /// # Errors
    /// [`Clash`] if two different targets claim the same (host, prefix) pair.
    pub fn build<'a>(routes: impl IntoIterator<Item = Route<'a, T>>) -> Result<Self, Clash> {
        let mut router = Self::default();
        let mut owners: HashMap<(HostPattern, String), &'a str> = HashMap::new();
        for route in routes {
            let name = route.name;
            for (h, host, prefix) in route.pairs() {
                match owners.entry((host.clone(), prefix.clone())) {
                    std::collections::hash_map::Entry::Occupied(o) if *o.get() == name => {
                        continue; // the same tenant listing `/x` and `/x/`
                    }
                    std::collections::hash_map::Entry::Occupied(o) => {
                        return Err(Clash {
                            host: h.to_string(),
                            prefix,
                            existing: o.get().to_string(),
                            other: name.to_string(),
                        });
                    }
                    std::collections::hash_map::Entry::Vacant(v) => {
                        v.insert(name);
                    }
                }
                let group = match &host {
                    HostPattern::Any => &mut router.any,
                    HostPattern::Exact(e) => router.exact.entry(e.clone()).or_default(),
                    HostPattern::Suffix(s) => router.suffix.entry(s.clone()).or_default(),
                };
                group.insert(prefix, route.target.clone());
                router.routes += 1;
            }
        }
        Ok(router)
    }

    /// The target for a request to `host` (any case, with or without `:port`) and `path`.
    pub fn route(&self, host: Option<&str>, path: &str) -> Option<&T> {
        self.find(host, path).map(|(t, _)| t)
    }

    /// Like [`Router::route`], with the length of the path prefix that matched: `path[..len]`
    /// is where the target is mounted (empty when at `/`), `path[len..]` the path below it.
    pub fn find(&self, host: Option<&str>, path: &str) -> Option<(&T, usize)> {
        self.find_by(host, path).map(|(t, len, _)| (t, len))
    }

    /// Like [`Router::find`], with whether a route naming the request's host (exactly or by
    /// a `*.suffix`) matched it, rather than one for any host.
    pub fn find_by(&self, host: Option<&str>, path: &str) -> Option<(&T, usize, bool)> {
        let host = host.map_or("", strip_port);
        // Host names are case-insensitive; avoid allocating for the usual lowercase case.
        let lowered;
        let host = if host.bytes().any(|b| b.is_ascii_uppercase()) {
            lowered = host.to_ascii_lowercase();
            lowered.as_str()
        } else {
            host
        };
        if !host.is_empty() {
            if let Some((t, len)) = self.exact.get(host).and_then(|g| g.lookup(path)) {
                return Some((t, len, true));
            }
            if !self.suffix.is_empty() {
                // `a.b.example.com` tries `.b.example.com`, then `.example.com`, then `.com`.
                for (i, _) in host.match_indices('.').filter(|(i, _)| *i > 0) {
                    if let Some((t, len)) = self.suffix.get(&host[i..]).and_then(|g| g.lookup(path))
                    {
                        return Some((t, len, true));
                    }
                }
            }
        }
        self.any.lookup(path).map(|(t, len)| (t, len, false))
    }

    /// Number of (host, prefix) routes.
    pub fn len(&self) -> usize {
        self.routes
    }

    /// Whether there are no routes.
    pub fn is_empty(&self) -> bool {
        self.routes == 0
    }
}

/// `/api/v2` → `api`; `/` → ``.
fn first_segment(path: &str) -> &str {
    let rest = path.strip_prefix('/').unwrap_or(path);
    rest.split('/').next().unwrap_or("")
}

/// `host` without its port (`[::1]:8080` → `[::1]`, `a.test:80` → `a.test`).
pub fn strip_port(host: &str) -> &str {
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
pub fn prefix_matches(prefix: &str, path: &str) -> bool {
    if prefix == "/" {
        return true;
    }
    match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

/// The deeper of two normalised path prefixes when one is under the other (a path under it
/// is under both); `None` when no path is under both.
pub fn deeper<'a>(a: &'a str, b: &'a str) -> Option<&'a str> {
    if prefix_matches(a, b) {
        Some(b)
    } else if prefix_matches(b, a) {
        Some(a)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_routes_meet_at_the_least_specific_request_to_both() {
        let p = |s: &str| HostPattern::parse(s).unwrap();
        let host = |h: &str| Some(Some(h.to_string()));
        assert_eq!(p("*").meet(&p("*")), Some(None));
        assert_eq!(p("*").meet(&p("a.test")), host("a.test"));
        assert_eq!(p("a.test").meet(&p("a.test")), host("a.test"));
        assert_eq!(p("a.test").meet(&p("b.test")), None);
        assert_eq!(p("*.test").meet(&p("a.test")), host("a.test"));
        assert_eq!(p("a.test").meet(&p("*.test")), host("a.test"));
        assert_eq!(p("*.test").meet(&p("test")), None);
        assert_eq!(p("*.test").meet(&p("*")), host("~.test"));
        assert_eq!(p("*.b.test").meet(&p("*.test")), host("~.b.test"));
        assert_eq!(p("*.test").meet(&p("*.b.test")), host("~.b.test"));
        assert_eq!(p("*.b.test").meet(&p("*.c.test")), None);
        assert_eq!(deeper("/api", "/api/v2"), Some("/api/v2"));
        assert_eq!(deeper("/api/v2", "/api"), Some("/api/v2"));
        assert_eq!(deeper("/api", "/apix"), None);
        assert_eq!(deeper("/", "/x"), Some("/x"));
        // The witness host of a wildcard is routed by it, never by an exact host.
        let router = Router::build([
            Route::new("exact", ["b.b.test"], ["/"], "exact"),
            Route::new("wild", ["*.b.test"], ["/"], "wild"),
            Route::new("any", [], ["/"], "any"),
        ])
        .unwrap();
        assert_eq!(
            router.find_by(Some("~.b.test"), "/"),
            Some((&"wild", 0, true))
        );
        assert_eq!(
            router.find_by(Some("b.b.test"), "/x"),
            Some((&"exact", 0, true))
        );
        assert_eq!(router.find_by(None, "/x"), Some((&"any", 0, false)));
    }

    fn table() -> Router<&'static str> {
        Router::build(
            [
                (vec![], vec!["/"]),
                (vec![], vec!["/api"]),
                (vec![], vec!["/api/v2/"]),
                (vec!["shop.example.com"], vec![]),
                (vec!["*.example.com"], vec![]),
                (vec!["*.eu.example.com"], vec!["/static"]),
            ]
            .into_iter()
            .zip(["fallback", "api", "api-v2", "shop", "wild", "eu-static"])
            .map(|((h, p), name)| Route::new(name, h, p, name)),
        )
        .unwrap()
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
        // The matched prefix splits the path into mount point and the path below it.
        for (path, mount) in [
            ("/", ""),
            ("/apix", ""),
            ("/api", "/api"),
            ("/api/", "/api"),
            ("/api/v2/users", "/api/v2"),
        ] {
            let (_, len) = t.find(None, path).expect("routed");
            assert_eq!(&path[..len], mount, "path={path}");
        }
    }

    #[test]
    fn no_route_is_none() {
        let t = Router::build([Route::new("a", vec!["a.com"], vec!["/x"], 1)]).unwrap();
        assert_eq!(t.route(Some("a.com"), "/y"), None);
        assert_eq!(t.route(Some("b.com"), "/x"), None);
        assert_eq!(t.route(None, "/x"), None);
    }

    #[test]
    fn identical_routes_of_two_targets_clash() {
        let clash = Router::build([
            Route::new("a", vec!["A.com"], vec!["/x/"], 1),
            Route::new("a", vec!["a.com"], vec!["/x"], 1),
            Route::new("b", vec!["a.com"], vec!["/x"], 2),
        ])
        .unwrap_err();
        assert_eq!((clash.existing.as_str(), clash.other.as_str()), ("a", "b"));
        assert_eq!(clash.prefix, "/x");
        assert!(
            Router::build([
                Route::new("a", vec![], vec!["/"], 1),
                Route::new("b", vec![], vec![], 2)
            ])
            .is_err()
        );
    }

    #[test]
    fn many_tenants_route_by_index() {
        let names: Vec<String> = (0..10_000).map(|i| format!("t{i}")).collect();
        let paths: Vec<String> = names.iter().map(|n| format!("/{n}")).collect();
        let hosts: Vec<String> = names.iter().map(|n| format!("{n}.example.com")).collect();
        let r = Router::build(
            names
                .iter()
                .enumerate()
                .map(|(i, n)| Route::new(n.as_str(), [hosts[i].as_str()], [paths[i].as_str()], i)),
        )
        .unwrap();
        assert_eq!(r.len(), 10_000);
        assert_eq!(r.route(Some("t9999.example.com"), "/t9999/a"), Some(&9999));
        assert_eq!(r.route(Some("t9999.example.com"), "/t1"), None);
        let r = Router::build(
            names
                .iter()
                .enumerate()
                .map(|(i, n)| Route::new(n.as_str(), [], [paths[i].as_str()], i)),
        )
        .unwrap();
        assert_eq!(r.route(None, "/t4242"), Some(&4242));
        assert_eq!(r.route(Some("x"), "/t42x"), None);
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
