//! One stored answer and its time: fresh, stale but still usable (`stale-while-revalidate`,
//! `stale-if-error`, RFC 5861), kept stale to be revalidated, gone; and the expiry that drops
//! an entry when none of its variants can be used any more.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::StatusCode;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http_cache_semantics::CachePolicy;

/// How long a stale answer with a validator (`ETag`, `Last-Modified`) is kept so the next
/// request can revalidate it (the guest answers `304` and the stored body is served again),
/// beyond its `stale-while-revalidate` and `stale-if-error` windows.
const KEEP_TO_REVALIDATE: Duration = Duration::from_secs(60);

/// The longest `stale-while-revalidate` or `stale-if-error` window honoured (a day).
const MAX_STALE_WINDOW: Duration = Duration::from_secs(86_400);

/// One stored answer.
#[derive(Clone)]
pub(super) struct Variant {
    pub(super) status: StatusCode,
    /// Its headers as the client gets them (without framing).
    pub(super) headers: HeaderMap,
    /// A thread's own copy only (empty in the store): the headers a hit starts from
    /// ([`super::answer::hit_head`]).
    pub(super) hit_head: HeaderMap,
    pub(super) body: Bytes,
    /// The request's field lines of the fields its `Vary` names, each field's lines in the
    /// order they came (none: the request did not have it).
    pub(super) vary: Vec<(HeaderName, Box<[HeaderValue]>)>,
    /// When it was stored, and its age then (`Age`, `Date`).
    pub(super) stored: Instant,
    pub(super) age_at_store: Duration,
    /// How long it was fresh for when stored (cut short by a soft purge).
    pub(super) fresh_for: Duration,
    /// Past its freshness: how long it may be served while one request refreshes it
    /// (`stale-while-revalidate`), and served instead of a guest's failure
    /// (`stale-if-error`).
    pub(super) windows: Windows,
    /// A soft purge made it stale: a request's own directives cannot make it fresh again.
    pub(super) purged: bool,
    /// The cache's purge generation when the request that made it was looked up. A purge
    /// logged later (at a greater generation) that names it finds it stored, or keeps it from
    /// being stored: what is stored under a key after a purge was begun after it.
    pub(super) begun: u64,
    /// For requests with their own `Cache-Control` (`no-cache`, `max-age`, `min-fresh`,
    /// `max-stale`): RFC 9111's answer, from the policy it was stored with.
    pub(super) policy: CachePolicy,
    /// The tags it was stored with (`Surrogate-Key`, `Cache-Tag`), for purges by tag.
    pub(super) tags: Vec<Box<str>>,
    /// Its body compressed, per encoding, as clients have taken it (`[tenant.compression]`).
    pub(super) copies: Arc<crate::compress::Copies>,
    /// A thread's copy of the stored answer (`entries`): its own copies of those of `copies`
    /// made when it was copied (none in the store).
    pub(super) own: crate::compress::Owned,
}

/// The stale windows of an answer (RFC 5861), from the directives that decided its
/// freshness (`CDN-Cache-Control`, else `Cache-Control`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Windows {
    pub(super) while_revalidate: Duration,
    pub(super) if_error: Duration,
}

impl Windows {
    /// The windows `cache_control` gives. `must-revalidate` and `proxy-revalidate` forbid
    /// serving it stale (RFC 9111 §5.2.2.2): none.
    pub(super) fn of(cache_control: Option<&HeaderValue>) -> Self {
        let Some(text) = cache_control.and_then(|v| v.to_str().ok()) else {
            return Self::default();
        };
        let mut out = Self::default();
        for directive in text.split(',') {
            let (name, value) = match directive.split_once('=') {
                Some((n, v)) => (n.trim(), Some(v.trim().trim_matches('"'))),
                None => (directive.trim(), None),
            };
            let secs = || {
                value
                    .and_then(|v| v.parse::<u64>().ok())
                    .map_or(Duration::ZERO, |s| {
                        Duration::from_secs(s).min(MAX_STALE_WINDOW)
                    })
            };
            if name.eq_ignore_ascii_case("must-revalidate")
                || name.eq_ignore_ascii_case("proxy-revalidate")
            {
                return Self::default();
            } else if name.eq_ignore_ascii_case("stale-while-revalidate") {
                out.while_revalidate = secs();
            } else if name.eq_ignore_ascii_case("stale-if-error") {
                out.if_error = secs();
            }
        }
        out
    }
}

impl Variant {
    pub(super) fn age(&self, now: Instant) -> Duration {
        self.age_at_store + now.saturating_duration_since(self.stored)
    }

    pub(super) fn fresh_at(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.stored) < self.fresh_for
    }

    /// How long it has been stale at `now` (zero while fresh).
    pub(super) fn stale_for(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.stored)
            .saturating_sub(self.fresh_for)
    }

    /// Whether it may be served at `now` while one request refreshes it.
    pub(super) fn serves_while_revalidating(&self, now: Instant) -> bool {
        !self.fresh_at(now) && self.stale_for(now) < self.windows.while_revalidate
    }

    /// Whether it may be served at `now` instead of a guest's failure.
    pub(super) fn serves_if_error(&self, now: Instant) -> bool {
        self.stale_for(now) < self.windows.if_error
    }

    /// Whether it has a validator a guest can answer `304` to.
    fn has_validator(&self) -> bool {
        self.headers.contains_key(header::ETAG) || self.headers.contains_key(header::LAST_MODIFIED)
    }

    /// How long it is kept past its freshness.
    fn kept_stale(&self) -> Duration {
        let revalidate = if self.has_validator() {
            KEEP_TO_REVALIDATE
        } else {
            Duration::ZERO
        };
        revalidate
            .max(self.windows.while_revalidate)
            .max(self.windows.if_error)
    }

    /// How long from `now` it can still be used, fresh or stale.
    pub(super) fn usable_for(&self, now: Instant) -> Duration {
        (self.fresh_for + self.kept_stale())
            .saturating_sub(now.saturating_duration_since(self.stored))
    }

    /// This answer made stale at `now` (a soft purge).
    pub(super) fn made_stale(&self, now: Instant) -> Self {
        Self {
            fresh_for: self
                .fresh_for
                .min(now.saturating_duration_since(self.stored)),
            purged: true,
            ..self.clone()
        }
    }

    /// Whether a request with `headers` has the field lines this answer was stored with, for
    /// every field its `Vary` names: all of a field's lines, in their order (RFC 9111 §4.1
    /// matches fields combined from every line). HTTP/2 and HTTP/3 clients send each cookie
    /// as a line of its own (RFC 9113 §8.2.3), so a first line alone (`theme=dark`) would
    /// give one user's answer to another whose first cookie is the same.
    pub(super) fn vary_matches(&self, headers: &HeaderMap) -> bool {
        self.vary
            .iter()
            .all(|(name, lines)| headers.get_all(name).iter().eq(lines.iter()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_windows_follow_rfc_5861() {
        let w = |s: &'static str| Windows::of(Some(&HeaderValue::from_static(s)));
        assert_eq!(
            w("max-age=60, stale-while-revalidate=30, stale-if-error=600"),
            Windows {
                while_revalidate: Duration::from_secs(30),
                if_error: Duration::from_secs(600)
            }
        );
        assert_eq!(
            w("s-maxage=1, Stale-While-Revalidate=\"5\"").while_revalidate,
            Duration::from_secs(5)
        );
        assert_eq!(
            w("max-age=60, stale-while-revalidate=30, must-revalidate"),
            Windows::default(),
            "must-revalidate forbids serving stale"
        );
        assert_eq!(
            w("max-age=60, proxy-revalidate, stale-if-error=9"),
            Windows::default()
        );
        assert_eq!(w("stale-while-revalidate=x"), Windows::default());
        assert_eq!(
            w("stale-if-error=99999999999").if_error,
            MAX_STALE_WINDOW,
            "capped"
        );
        let max = MAX_STALE_WINDOW.as_secs();
        for (secs, window) in [(max - 1, max - 1), (max, max), (max + 1, max)] {
            let directives =
                format!("max-age=1, stale-if-error={secs}, stale-while-revalidate={secs}");
            let windows = Windows::of(Some(&HeaderValue::from_str(&directives).unwrap()));
            assert_eq!(windows.if_error, Duration::from_secs(window), "{secs}");
            assert_eq!(
                windows.while_revalidate,
                Duration::from_secs(window),
                "{secs}"
            );
        }
        assert_eq!(Windows::of(None), Windows::default());
    }
}
