//! What the front end does for one tenant around its guests, prepared once when the tenant is
//! loaded: whether its cleartext requests are redirected to HTTPS, the
//! `Strict-Transport-Security` its HTTPS responses carry, what its clients see when a request
//! fails, its rate limits, its cache in front of its guests, and its answers' compression.
//!
//! A tenant's [`Front`] is made from its settings beside its guests' grants
//! ([`crate::capabilities::Grants`]), from the same [`Preparing`]. A new front-end feature (a
//! cache in front of the guests, compression) is a field here prepared from its setting, a
//! module of its own, and its step in the front end's sequence ([`crate::http::handle`]).

use std::sync::Arc;

use http::HeaderValue;

use crate::cache::Cache;
use crate::compress::Compression;

use crate::outcome::ErrorPages;
use crate::prepare::Preparing;

/// A tenant's front-end features.
#[derive(Debug, Default)]
pub struct Front {
    /// Cleartext requests are redirected to HTTPS (`https_redirect`).
    pub https_redirect: bool,
    /// The `Strict-Transport-Security` value its HTTPS responses carry (`hsts`), if any.
    pub hsts: Option<HeaderValue>,
    /// What its clients see when a request fails (`errors`, `error_pages`).
    pub errors: ErrorPages,
    /// Its cache (`cache`), when it has one: what purges reach.
    pub cache: Option<Arc<Cache>>,
    /// Whether the cache answers requests in front of its guests (`cache.front`).
    cache_in_front: bool,
    /// Its answers' compression (`compression`), unless it is off.
    pub compression: Option<Compression>,
    /// Its rate limits (`rate_limit`), if it has any.
    pub rate_limits: Option<crate::ratelimit::RateLimits>,
    /// The limits of its WebSocket connections (`websocket`).
    pub websocket: crate::websocket::WebsocketConfig,
}

impl Front {
    /// Its cache, when it answers requests in front of its guests.
    pub fn cache_in_front(&self) -> Option<&Arc<Cache>> {
        self.cache.as_ref().filter(|_| self.cache_in_front)
    }

    /// A tenant's front-end features, from its `settings` (already checked when they were
    /// read), its `cache` (when it has one; shared with its guests' grants) and the rate
    /// limits of the version it replaces (`carried`: the same limits keep their counts); shared
    /// limits count in their store of `stores`.
    ///
    /// # Errors
    /// A shared limit whose store is missing or not a Redis one.
    pub fn prepare(
        p: &Preparing<'_>,
        settings: &crate::config::TenantSettings<toml::Spanned<String>>,
        cache: Option<&Arc<Cache>>,
        carried: Option<&crate::ratelimit::RateLimits>,
        stores: &crate::kv::Stores,
    ) -> Result<Self, String> {
        let s = settings;
        Ok(Self {
            https_redirect: s.https_redirect,
            hsts: s
                .hsts
                .as_ref()
                .and_then(|h| HeaderValue::from_str(&h.value()).ok()),
            errors: ErrorPages::new(s.errors, &s.error_pages),
            cache: cache.cloned(),
            cache_in_front: s.cache.front,
            compression: Compression::prepare(&s.compression, p.metrics, p.label),
            rate_limits: crate::ratelimit::RateLimits::prepare(
                &s.rate_limit,
                carried,
                p.metrics,
                // A shared limit counts under the tenant's data key: a tenant created again
                // under a deleted one's name starts with counts of its own.
                (p.label, p.data),
                stores,
            )?,
            websocket: s.websocket.clone(),
        })
    }
}
