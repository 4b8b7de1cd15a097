//! A request's key in its tenant's cache: the normal path and query, with the query's
//! parameters left out or sorted and request headers added as the tenant's `[tenant.cache]`
//! asks (`ignore_query`, `sort_query`, `key_headers`). The scheme and host are keyed beside
//! it ([`super::Cache`]).

use std::borrow::Cow;

use http::HeaderMap;
use http::header::HeaderName;

/// How a tenant's cache keys its requests, prepared once from its settings.
#[derive(Debug, Default)]
pub struct Keying {
    /// Parameter names left out (a name ending in `*` is a prefix).
    ignore: Vec<Box<str>>,
    /// The whole query is left out (`ignore_query = ["*"]`).
    no_query: bool,
    sort: bool,
    headers: Vec<HeaderName>,
}

impl Keying {
    /// The keying `[tenant.cache]` sets (`ignore_query`, `sort_query`, `key_headers`, already
    /// checked by [`check`]).
    pub fn new(ignore_query: &[String], sort_query: bool, key_headers: &[String]) -> Self {
        Self {
            ignore: ignore_query
                .iter()
                .filter(|n| *n != "*")
                .map(|n| n.as_str().into())
                .collect(),
            no_query: ignore_query.iter().any(|n| n == "*"),
            sort: sort_query,
            headers: key_headers
                .iter()
                .filter_map(|h| HeaderName::try_from(h.as_str()).ok())
                .collect(),
        }
    }

    /// Whether the target is the key as it is (the common case: nothing to allocate).
    fn plain(&self) -> bool {
        self.ignore.is_empty() && !self.no_query && !self.sort && self.headers.is_empty()
    }

    /// The key of a request for `target` (its normal path and query) with `headers`.
    pub fn key<'a>(&self, target: &'a str, headers: &HeaderMap) -> Cow<'a, str> {
        if self.plain() {
            return Cow::Borrowed(target);
        }
        let (path, query) = match target.split_once('?') {
            Some((path, query)) => (path, Some(query)),
            None => (target, None),
        };
        let mut key = String::with_capacity(target.len() + 32);
        key.push_str(path);
        if let Some(query) = query.filter(|_| !self.no_query) {
            let mut params: Vec<&str> = query
                .split('&')
                .filter(|p| !p.is_empty() && !self.ignored(name(p)))
                .collect();
            if self.sort {
                // Stable: repeated names keep their order, which can matter to the guest.
                params.sort_by(|a, b| name(a).cmp(name(b)));
            }
            if !params.is_empty() {
                key.push('?');
                key.push_str(&params.join("&"));
            }
        }
        // Header lines after a newline, which no target holds; bytes that are not visible
        // ASCII are escaped, so no value can forge a line, and so is `,`, which joins a
        // header's lines: one line `a,b` is not keyed as the two lines `a` and `b`.
        for name in &self.headers {
            key.push('\n');
            key.push_str(name.as_str());
            key.push(':');
            for (i, value) in headers.get_all(name).iter().enumerate() {
                if i > 0 {
                    key.push(',');
                }
                for &b in value.as_bytes() {
                    if b.is_ascii_graphic() && b != b'%' && b != b',' || b == b' ' {
                        key.push(char::from(b));
                    } else {
                        key.push_str(&format!("%{b:02X}"));
                    }
                }
            }
        }
        Cow::Owned(key)
    }

    fn ignored(&self, name: &str) -> bool {
        self.ignore.iter().any(|n| match n.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => **n == *name,
        })
    }
}

/// A query parameter's name.
fn name(param: &str) -> &str {
    param.split_once('=').map_or(param, |(name, _)| name)
}

/// Checks `ignore_query` and `key_headers`.
///
/// # Errors
/// The first name that cannot be one, in words for the operator.
pub fn check(ignore_query: &[String], key_headers: &[String]) -> Result<(), String> {
    if let Some(n) = ignore_query.iter().find(|n| {
        n.is_empty()
            || n.bytes()
                .any(|b| matches!(b, b'&' | b'=' | b'?' | b'#') || !b.is_ascii_graphic())
            || (n.len() > 1 && n[..n.len() - 1].contains('*'))
    }) {
        return Err(format!(
            "cache.ignore_query: {n:?} is not a query parameter name (a name, a prefix ending \
             in '*', or \"*\" for the whole query)"
        ));
    }
    if key_headers.len() > MAX_KEY_HEADERS {
        return Err(format!(
            "cache.key_headers names at most {MAX_KEY_HEADERS} headers, not {}",
            key_headers.len()
        ));
    }
    for h in key_headers {
        let Ok(name) = HeaderName::try_from(h.as_str()) else {
            return Err(format!("cache.key_headers: {h:?} is not a header name"));
        };
        if name.as_str() != h {
            return Err(format!(
                "cache.key_headers: write header names in lower case ({:?}, not {h:?})",
                name.as_str()
            ));
        }
        if name == http::header::HOST || name == http::header::COOKIE {
            return Err(format!(
                "cache.key_headers: {h:?} cannot be keyed (the host is keyed already; a \
                 cookie is one client's, and answers that depend on it are not shared)"
            ));
        }
    }
    Ok(())
}

/// Most request headers a tenant's cache keys.
pub const MAX_KEY_HEADERS: usize = 8;

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| (*s).to_string()).collect()
    }

    fn keying(ignore: &[&str], sort: bool, headers: &[&str]) -> Keying {
        Keying::new(&strings(ignore), sort, &strings(headers))
    }

    #[test]
    fn the_target_is_the_key_by_default() {
        let k = keying(&[], false, &[]);
        assert!(matches!(
            k.key("/a?b=1&a=2", &HeaderMap::new()),
            Cow::Borrowed("/a?b=1&a=2")
        ));
    }

    #[test]
    fn query_parameters_are_left_out_and_sorted() {
        let h = HeaderMap::new();
        let k = keying(&["utm_*", "fbclid"], false, &[]);
        assert_eq!(k.key("/a?utm_source=x&b=1&fbclid=9&a=2", &h), "/a?b=1&a=2");
        assert_eq!(k.key("/a?utm_source=x", &h), "/a");
        assert_eq!(k.key("/a?fbclidx=1", &h), "/a?fbclidx=1");
        let k = keying(&[], true, &[]);
        assert_eq!(k.key("/a?b=1&a=2&a=1&c", &h), "/a?a=2&a=1&b=1&c");
        assert_eq!(k.key("/a?b=1&a=2", &h), k.key("/a?a=2&b=1", &h));
        assert_eq!(k.key("/a", &h), "/a");
        let k = keying(&["*"], true, &[]);
        assert_eq!(k.key("/a?b=1", &h), "/a");
    }

    #[test]
    fn headers_are_keyed_and_cannot_forge_a_line() {
        let k = keying(&[], false, &["accept-language", "x-tier"]);
        let mut h = HeaderMap::new();
        h.insert("accept-language", "fr".parse().unwrap());
        assert_eq!(k.key("/a?q", &h), "/a?q\naccept-language:fr\nx-tier:");
        h.insert("x-tier", http::HeaderValue::from_bytes(b"a\xffb%").unwrap());
        assert_eq!(
            k.key("/a?q", &h),
            "/a?q\naccept-language:fr\nx-tier:a%FFb%25"
        );
        let mut other = HeaderMap::new();
        other.insert("accept-language", "en".parse().unwrap());
        assert_ne!(k.key("/a", &h), k.key("/a", &other));
        // Two lines are not the one line their values joined with a comma make.
        let mut one = HeaderMap::new();
        one.insert("accept-language", "fr,en".parse().unwrap());
        let mut two = HeaderMap::new();
        two.append("accept-language", "fr".parse().unwrap());
        two.append("accept-language", "en".parse().unwrap());
        assert_eq!(k.key("/a", &one), "/a\naccept-language:fr%2Cen\nx-tier:");
        assert_eq!(k.key("/a", &two), "/a\naccept-language:fr,en\nx-tier:");
    }

    #[test]
    fn names_are_checked() {
        let ok = |ignore: &[&str], headers: &[&str]| check(&strings(ignore), &strings(headers));
        assert!(ok(&["utm_*", "*", "a.b"], &["accept-language"]).is_ok());
        for bad in ["", "a=b", "a&b", "*a", "a b"] {
            assert!(ok(&[bad], &[]).is_err(), "{bad:?}");
        }
        for bad in ["Accept", "host", "cookie", "a b"] {
            assert!(ok(&[], &[bad]).is_err(), "{bad:?}");
        }
        assert!(ok(&[], &["a", "b", "c", "d", "e", "f", "g", "h", "i"]).is_err());
    }
}
