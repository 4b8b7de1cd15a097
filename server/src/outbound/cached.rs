//! What a tenant's backends with `cache = true` share ([`Readthrough`]: its cache, the
//! counts of each backend's answers) and what a guest's request may ask of it
//! ([`CacheOverride`], from `Tern-Cache`); the exchange itself is [`super::readthrough`]'s.

use std::collections::HashMap;
use std::sync::Arc;

use http::HeaderMap;
use http::header::HeaderName;

use crate::cache::guest::{MAX_TAGS, MAX_TTL, check_tag};
use crate::cache::{Cache, Counts};

/// `Tern-Cache`: what a guest asks of the cache for one request to a backend.
pub static CACHE_OVERRIDE: HeaderName = HeaderName::from_static("tern-cache");

/// A tenant's cache as its backends use it.
#[derive(Debug)]
pub struct Readthrough {
    pub(super) cache: Arc<Cache>,
    /// The counts of each backend with `cache = true`, by name.
    pub(super) counts: HashMap<Arc<str>, Arc<Counts>>,
}

impl Readthrough {
    /// The tenant's `cache` for its backends named `cached`, counted under `label`; `None` when
    /// it has none.
    pub fn new<'a>(
        cache: Arc<Cache>,
        cached: impl Iterator<Item = &'a Arc<str>>,
        metrics: &crate::metrics::Metrics,
        label: &str,
    ) -> Option<Self> {
        let counts: HashMap<_, _> = cached
            .map(|name| {
                let result = |r: &str| {
                    metrics
                        .outbound_cache_requests
                        .with_label_values(&[label, name, r])
                };
                (name.clone(), Arc::new(Counts::new(result)))
            })
            .collect();
        (!counts.is_empty()).then_some(Self { cache, counts })
    }
}

/// What a guest asked of the cache for one request (`Tern-Cache`).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CacheOverride {
    /// Neither looked up nor stored.
    pub pass: bool,
    /// Stored for this many seconds, whatever the answer's own freshness.
    pub ttl: Option<u32>,
    /// Tags added to the answer's own.
    pub tags: Vec<String>,
}

impl CacheOverride {
    /// Takes `Tern-Cache` off `headers` (the backend never sees it) and reads it.
    ///
    /// # Errors
    /// What is wrong with it, in words for the guest's developer.
    pub fn take(headers: &mut HeaderMap) -> Result<Self, String> {
        let http::header::Entry::Occupied(e) = headers.entry(&CACHE_OVERRIDE) else {
            return Ok(Self::default());
        };
        let mut text = String::new();
        for value in e.remove_entry_mult().1 {
            let v = value
                .to_str()
                .map_err(|_| "the header is not ASCII".to_string())?;
            if !text.is_empty() {
                text.push(',');
            }
            text.push_str(v);
        }
        Self::parse(&text)
    }

    /// Reads `pass`, `ttl=SECONDS` and `tag=NAME`, comma-separated.
    ///
    /// # Errors
    /// What is wrong with `text`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut out = Self::default();
        for directive in text.split(',').map(str::trim).filter(|d| !d.is_empty()) {
            let (name, value) = match directive.split_once('=') {
                Some((n, v)) => (n.trim(), Some(v.trim())),
                None => (directive, None),
            };
            match (name.to_ascii_lowercase().as_str(), value) {
                ("pass", None) => out.pass = true,
                ("ttl", Some(v)) => {
                    let ttl = v
                        .parse::<u32>()
                        .ok()
                        .filter(|t| (1..=MAX_TTL).contains(t))
                        .ok_or_else(|| {
                            format!("ttl is a number of seconds from 1 to {MAX_TTL}, not {v:?}")
                        })?;
                    out.ttl = Some(ttl);
                }
                ("tag", Some(v)) => {
                    let v = v.trim_matches('"');
                    check_tag(v)?;
                    if out.tags.len() == MAX_TAGS {
                        return Err(format!("at most {MAX_TAGS} tags"));
                    }
                    if !out.tags.iter().any(|t| t == v) {
                        out.tags.push(v.to_string());
                    }
                }
                _ => {
                    return Err(format!(
                        "{directive:?} is not one of pass, ttl=SECONDS, tag=NAME"
                    ));
                }
            }
        }
        if out.pass && (out.ttl.is_some() || !out.tags.is_empty()) {
            return Err("pass stores nothing: it takes no ttl or tag".into());
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_are_read_and_bad_ones_named() {
        assert_eq!(CacheOverride::parse("").unwrap(), CacheOverride::default());
        assert!(CacheOverride::parse("pass").unwrap().pass);
        let o = CacheOverride::parse("ttl=60, tag=prices, TAG=\"eu\",tag=prices").unwrap();
        assert_eq!(o.ttl, Some(60));
        assert_eq!(o.tags, ["prices", "eu"]);
        for (bad, named) in [
            ("ttl=0", "ttl"),
            ("ttl=31536001", "ttl"),
            ("ttl=soon", "ttl"),
            ("tag=", "tag"),
            ("tag=a b", "tag"),
            ("pass, ttl=5", "pass"),
            ("store", "\"store\""),
            ("pass=1", "\"pass=1\""),
        ] {
            let why = CacheOverride::parse(bad).unwrap_err();
            assert!(why.contains(named), "{bad}: {why}");
        }
        let many = (0..=MAX_TAGS)
            .map(|i| format!("tag=t{i}"))
            .collect::<Vec<_>>();
        assert!(CacheOverride::parse(&many.join(",")).is_err());
    }

    #[test]
    fn the_header_is_taken_off_whatever_it_says() {
        let mut headers = HeaderMap::new();
        headers.append(&CACHE_OVERRIDE, "ttl=5".parse().unwrap());
        headers.append(&CACHE_OVERRIDE, "tag=a".parse().unwrap());
        let o = CacheOverride::take(&mut headers).unwrap();
        assert_eq!((o.ttl, o.tags.len()), (Some(5), 1));
        assert!(headers.is_empty());
        headers.insert(&CACHE_OVERRIDE, "nonsense".parse().unwrap());
        assert!(CacheOverride::take(&mut headers).is_err());
        assert!(headers.is_empty());
    }
}
