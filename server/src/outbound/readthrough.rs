//! Readthrough: the answers of a tenant's backends with `cache = true` are kept in the
//! tenant's cache by their own headers, with the same rules, storage, collapsing, budget and
//! purges as the answers of its guests ([`crate::cache`]); a guest's request finds them there
//! before anything is sent. Each backend's answers are a space of their own in the cache, keyed
//! by the backend's name and the path and query sent to it.
//!
//! A guest's request may say what the cache does with it in `Tern-Cache` (taken off before the
//! backend sees it; ignored for a backend without `cache = true`): `pass` (neither looked up
//! nor stored), `ttl=SECONDS` (stored for that long whatever the answer's own `Cache-Control`
//! and `Expires` say, though never one marked `private` or `no-store`), `tag=NAME` (a tag to
//! purge it by, besides the answer's own `Surrogate-Key` and `Cache-Tag`), several
//! comma-separated.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::HeaderName;
use http::{HeaderMap, Request, Response};
use http_body_util::BodyExt;

use super::{Calls, NoHead, OutBody, Passing, Target};
use crate::body::Fetched;
use crate::cache::guest::{MAX_TAGS, MAX_TTL, check_tag};
use crate::cache::{Asking, Cache, Counts, Fill, Lookup, Space};

/// `Tern-Cache`: what a guest asks of the cache for one request to a backend.
pub static CACHE_OVERRIDE: HeaderName = HeaderName::from_static("tern-cache");

/// A tenant's cache as its backends use it.
#[derive(Debug)]
pub struct Readthrough {
    cache: Arc<Cache>,
    /// The counts of each backend with `cache = true`, by name.
    counts: HashMap<Arc<str>, Arc<Counts>>,
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

impl Calls {
    /// Sends the guest's `req` to `target` ([`Calls::fetch`]), or answers it from the tenant's
    /// cache when the target is a backend with `cache = true` (see the module docs): a fresh
    /// stored answer at once; a stale one within its `stale-while-revalidate`, asking the
    /// backend again in the background; else the backend's answer, stored when it may be
    /// (a miss of a key another request is asking for waits for that answer). The guest reads
    /// what the cache did in `Cache-Status`.
    ///
    /// # Errors
    /// [`NoHead`]; a bad `Tern-Cache` is refused before anything is sent.
    pub async fn exchange(
        self: &Arc<Self>,
        target: &Target,
        mut req: Request<OutBody>,
        first_byte: Duration,
        passing: &Passing,
    ) -> Result<Response<Fetched>, NoHead> {
        let cached = match &self.readthrough {
            Some(r) if target.cached => r.counts.get(&target.label).map(|c| (&r.cache, c)),
            _ => None,
        };
        let Some((cache, counts)) = cached else {
            // Taken off and not read: it is for a backend's cache.
            req.headers_mut().remove(&CACHE_OVERRIDE);
            return self.fetch(target, req, first_byte, passing).await;
        };
        let asked = match CacheOverride::take(req.headers_mut()) {
            Ok(asked) => asked,
            Err(why) => {
                self.count(&target.label, "denied");
                return Err(NoHead::BadOverride(why));
            }
        };
        if asked.pass {
            counts.bypassed();
            return self.fetch(target, req, first_byte, passing).await;
        }
        // Keyed by what is sent to the backend. (Its head is looked up alone: its body stays
        // out of the wait for another request's answer.)
        *req.uri_mut() = target.uri.clone();
        let (head, body) = req.into_parts();
        let mut req = Request::from_parts(head, ());
        let asking = Asking {
            https: target.uri.scheme() == Some(&http::uri::Scheme::HTTPS),
            host: &target.label,
            trusted: true,
            space: Space::Backend(counts.clone()),
            compress: None,
            body: body.may_have_bytes(),
        };
        let stored =
            |resp: Response<crate::body::ResponseBody>| resp.map(|body| Fetched::cache(body, None));
        match cache.lookup(&req, asking).await {
            Lookup::Hit(resp) => Ok(stored(resp)),
            Lookup::Refresh(resp, mut fill) => {
                let refresh = fill.refresh(&req).map(|()| OutBody::full(Bytes::new()));
                let (calls, target, passing) = (self.clone(), target.clone(), passing.clone());
                tokio::spawn(async move {
                    calls
                        .refresh(fill, &target, refresh, first_byte, &passing)
                        .await;
                });
                Ok(stored(resp))
            }
            Lookup::Miss(mut fill) => {
                fill.overridden(asked.ttl, &asked.tags);
                fill.take_validators(&mut req);
                let req = Request::from_parts(req.into_parts().0, body);
                match self.fetch(target, req, first_byte, passing).await {
                    Ok(resp) => Ok(answered(fill, resp)),
                    // The backend could not be reached: a stale answer within its
                    // `stale-if-error`, if there is one.
                    Err(no_head) => fill.stale_instead().map(stored).ok_or(no_head),
                }
            }
        }
    }

    /// Asks the backend for a new answer to a stale one served (`stale-while-revalidate`),
    /// for the cache only, within the backend's total timeout.
    async fn refresh(
        &self,
        fill: Fill,
        target: &Target,
        req: Request<OutBody>,
        first_byte: Duration,
        passing: &Passing,
    ) {
        let total = target.timeouts.total;
        let _ = tokio::time::timeout(total, async {
            if let Ok(resp) = self.fetch(target, req, first_byte, passing).await {
                // A streamed answer is stored when its body has been read to its end.
                let mut body = answered(fill, resp).into_body();
                while let Some(Ok(_)) = body.frame().await {}
            }
        })
        .await;
    }
}

/// The backend's answer `resp` as the cache gives it on (`Fill::answered`).
fn answered(fill: Fill, resp: Response<Fetched>) -> Response<Fetched> {
    let (parts, body) = resp.into_parts();
    let (body, permit) = body.into_response_body();
    fill.answered(Response::from_parts(parts, body))
        .map(|body| Fetched::cache(body, permit))
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
