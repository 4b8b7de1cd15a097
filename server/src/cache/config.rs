//! `[tenant.cache]` and the admin API's purge: what operators write.

use serde::{Deserialize, Serialize};

/// Ceiling of `cache.max_mib`.
pub const MAX_CACHE_MIB: u64 = 64 * 1024;

/// `[tenant.cache]`: the tenant's cache in front of its guests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    /// Whether it has a cache (off by default).
    pub enabled: bool,
    /// Whether the cache answers requests in front of its guests (on by default); off, it
    /// holds only its backends' answers (`outbound.backends.NAME.cache`).
    pub front: bool,
    /// The memory its cache may hold, in MiB (bodies, headers and keys).
    pub max_mib: u64,
    /// The largest body stored, in KiB; larger answers are served and not stored.
    pub max_object_kib: u64,
    /// Store answers that set cookies (off: a `Set-Cookie` is usually meant for one client).
    pub store_set_cookie: bool,
    /// Store the answer to a request with a `Cookie` whatever it says of sharing. Off (the
    /// default), such an answer is stored only when it says it may be shared — `public`,
    /// `s-maxage` or `must-revalidate`, RFC 9111's rule for `Authorization` — or varies on
    /// `Cookie`: an answer marked only `max-age` may be one signed-in user's page.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub store_cookie_requests: bool,
    /// Query parameters left out of the key (`utm_source`; `utm_*` for every name starting
    /// so; `*` for the whole query): requests that differ only in them share one answer.
    /// The guest still gets the query as it was sent.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ignore_query: Vec<String>,
    /// The query's parameters are sorted by name in the key, so `?a=1&b=2` and `?b=2&a=1`
    /// share one answer.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub sort_query: bool,
    /// Request headers whose values are part of the key (lower case; at most 8): requests
    /// that differ in them get answers of their own even when the guest sends no `Vary`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub key_headers: Vec<String>,
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            front: true,
            max_mib: 64,
            max_object_kib: 1024,
            store_set_cookie: false,
            store_cookie_requests: false,
            ignore_query: Vec::new(),
            sort_query: false,
            key_headers: Vec::new(),
        }
    }
}

impl CacheConfig {
    /// Whether it is the default (left out when a tenant's settings are written).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// Checks the sizes.
    ///
    /// # Errors
    /// Which size is out of bounds.
    pub fn check(&self) -> Result<(), String> {
        if !(1..=MAX_CACHE_MIB).contains(&self.max_mib) {
            return Err(format!(
                "cache.max_mib must be between 1 and {MAX_CACHE_MIB}, not {}",
                self.max_mib
            ));
        }
        if self.max_object_kib == 0 || self.max_object_kib > self.max_mib * 1024 {
            return Err(format!(
                "cache.max_object_kib must be between 1 and cache.max_mib × 1024 ({}), not {}",
                self.max_mib * 1024,
                self.max_object_kib
            ));
        }
        super::key::check(&self.ignore_query, &self.key_headers)
    }
}

/// A purge of a tenant's cache (`POST /admin/v1/tenants/{name}/cache/purge`): one of every
/// stored answer, those under path prefixes, or those tagged; dropped, or with `soft` only
/// made stale (the next request revalidates them with the guest).
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Purge {
    /// Every stored answer.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub all: bool,
    /// Answers whose path (normal form, query included) starts with one of these.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prefixes: Vec<String>,
    /// Answers stored with one of these tags (`Surrogate-Key`, `Cache-Tag`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// Mark them stale instead of dropping them: the next request asks the guest with the
    /// stored validators, and a `304` keeps the stored body.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub soft: bool,
}

impl Purge {
    /// Every stored answer of the cache, dropped.
    pub fn everything() -> Self {
        Self {
            all: true,
            ..Self::default()
        }
    }

    /// Checks that it names one way, and prefixes that are paths.
    ///
    /// # Errors
    /// What is wrong, in words for the API.
    pub fn check(&self) -> Result<(), String> {
        let ways = usize::from(self.all)
            + usize::from(!self.prefixes.is_empty())
            + usize::from(!self.tags.is_empty());
        if ways != 1 {
            return Err(
                "a purge names one of: {\"all\": true}, {\"prefixes\": [\"/path\", ...]}, \
                 {\"tags\": [\"tag\", ...]} (and \"soft\": true to mark them stale instead)"
                    .into(),
            );
        }
        if let Some(p) = self.prefixes.iter().find(|p| !p.starts_with('/')) {
            return Err(format!(
                "a purge prefix is a path starting with '/', not {p:?}"
            ));
        }
        if let Some(p) = self
            .prefixes
            .iter()
            .find(|p| crate::target::normalize(p).is_err())
        {
            return Err(format!("a purge prefix is not a usable path: {p:?}"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_checked() {
        assert!(CacheConfig::default().check().is_ok());
        for max_mib in [1, MAX_CACHE_MIB - 1, MAX_CACHE_MIB] {
            let at = CacheConfig {
                max_mib,
                ..CacheConfig::default()
            };
            assert!(at.check().is_ok(), "{at:?}");
        }
        for bad in [
            CacheConfig {
                max_mib: 0,
                ..CacheConfig::default()
            },
            CacheConfig {
                max_mib: MAX_CACHE_MIB + 1,
                ..CacheConfig::default()
            },
            CacheConfig {
                max_mib: 1,
                max_object_kib: 1025,
                ..CacheConfig::default()
            },
            CacheConfig {
                max_object_kib: 0,
                ..CacheConfig::default()
            },
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
        assert!(
            CacheConfig {
                max_mib: 1,
                max_object_kib: 1024,
                ..CacheConfig::default()
            }
            .check()
            .is_ok()
        );
    }
}
