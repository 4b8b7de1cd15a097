//! What the cache does with the guest's answer to a request it did not answer: stores it when
//! it may, refreshes a stale answer the guest confirmed (`304`), serves a stale answer instead
//! of a failure (`stale-if-error`), invalidates a key after an unsafe method, and says which
//! in `Cache-Status`.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_cache_semantics::CachePolicy;

use super::answer::CACHE_STATUS;
use super::answer::{CACHE_TAG, SURROGATE_KEY, not_modified, ranged, respond, take_tags};
use super::entries::Keyed;
use super::space::{Counted, Space};
use super::store::{
    Answered, Asked, CDN_CACHE_CONTROL, Cache, Fill, MAX_VARIANTS, Storing, Then, options,
};
use super::variant::{Variant, Windows};
use crate::body::ResponseBody;

/// Fields of a `304` that do not update the stored answer it confirms: its framing and
/// coding describe the `304` itself, and what the cache writes is its own.
const NOT_UPDATED_BY_304: [HeaderName; 5] = [
    header::CONTENT_LENGTH,
    header::CONTENT_ENCODING,
    header::TRANSFER_ENCODING,
    header::CONTENT_RANGE,
    header::CONTENT_TYPE,
];

impl Fill {
    /// Takes the client's validators (`If-None-Match`, `If-Modified-Since`) and range (`Range`,
    /// `If-Range`) off `req` when its answer may be stored: the guest answers in full, and
    /// [`Fill::answered`] answers them from what is stored.
    /// When a stale stored answer is being revalidated, its own validators go instead, so the
    /// guest can answer `304`.
    pub fn take_validators<B>(&mut self, req: &mut Request<B>) {
        if let Then::Store(s) = &mut self.then {
            let headers = req.headers_mut();
            s.if_none_match = headers.remove(header::IF_NONE_MATCH);
            s.if_modified_since = headers.remove(header::IF_MODIFIED_SINCE);
            s.headers.remove(header::IF_NONE_MATCH);
            s.headers.remove(header::IF_MODIFIED_SINCE);
            s.range = headers.remove(header::RANGE);
            s.if_range = headers.remove(header::IF_RANGE);
            s.headers.remove(header::RANGE);
            s.headers.remove(header::IF_RANGE);
            if let Some(stale) = &s.stale {
                if let Some(etag) = stale.headers.get(header::ETAG) {
                    headers.insert(header::IF_NONE_MATCH, etag.clone());
                }
                if let Some(modified) = stale.headers.get(header::LAST_MODIFIED) {
                    headers.insert(header::IF_MODIFIED_SINCE, modified.clone());
                }
            }
        }
    }

    /// Stores the answer for `ttl` seconds whatever its own `Cache-Control` and `Expires` say
    /// (not one marked `private` or `no-store`, or one that sets a cookie or varies on `*`),
    /// and with `tags` besides its own: what a guest asks of a backend's answer
    /// (`Tern-Cache`).
    pub fn overridden(&mut self, ttl: Option<u32>, tags: &[String]) {
        if let Then::Store(s) = &mut self.then {
            s.ttl = ttl.and_then(|t| HeaderValue::from_str(&format!("max-age={t}")).ok());
            s.tags = tags.iter().map(|t| t.as_str().into()).collect();
        }
    }

    /// The request a background refresh sends the guest (`GET`, the stale answer's validators
    /// in place of the client's), from the request `req` that was served stale.
    pub fn refresh<B>(&mut self, req: &Request<B>) -> Request<()> {
        let mut refresh = Request::new(());
        *refresh.method_mut() = Method::GET;
        *refresh.uri_mut() = req.uri().clone();
        *refresh.version_mut() = req.version();
        *refresh.headers_mut() = req.headers().clone();
        self.take_validators(&mut refresh);
        refresh
    }

    /// When the guest could not be asked at all (the tenant is overloaded): the stale answer
    /// being revalidated, if its `stale-if-error` still allows it.
    pub fn stale_instead(mut self) -> Option<Response<ResponseBody>> {
        let Then::Store(s) = &self.then else {
            return None;
        };
        let stale = s.stale.as_ref()?;
        let now = Instant::now();
        if !stale.serves_if_error(now) {
            return None;
        }
        let mut resp = s.serve(stale, now);
        self.counted = Counted::Stale;
        self.status(&mut resp, "; fwd-status=503; detail=stale-if-error");
        Some(resp)
    }

    /// The guest's answer `resp`, as the client gets it: stored when it may be (then a `304`
    /// if the client's validators match it), a stale answer refreshed by a `304` or served
    /// instead of a failure, its key invalidated after an unsafe method, and `Cache-Status`
    /// saying which.
    pub fn answered(mut self, mut resp: Response<ResponseBody>) -> Response<ResponseBody> {
        let cache = self.cache.clone();
        let mut status = String::new();
        let mut streamed = false;
        match &self.then {
            Then::Pass => {}
            Then::Invalidate(hashes) => {
                if resp.status().is_success() || resp.status().is_redirection() {
                    for hash in hashes {
                        cache.entries.invalidate(*hash);
                    }
                }
            }
            Then::Store(storing) => {
                let now = Instant::now();
                let guest = resp.status();
                let stored = match &storing.stale {
                    // The guest confirmed the stale answer: its body, with the `304`'s fields.
                    Some(stale) if guest == StatusCode::NOT_MODIFIED => {
                        let variant = cache.revalidated(storing, stale, resp.headers());
                        status.push_str("; fwd-status=304");
                        if self.counted == Counted::Miss {
                            self.counted = Counted::Revalidated;
                        }
                        let variant = variant.map(Arc::new);
                        resp = storing.serve(variant.as_ref().unwrap_or(stale), now);
                        variant
                    }
                    // The guest failed: the stale answer, within its `stale-if-error`.
                    Some(stale) if guest.is_server_error() && stale.serves_if_error(now) => {
                        status.push_str(&format!(
                            "; fwd-status={}; detail=stale-if-error",
                            guest.as_u16()
                        ));
                        if self.counted == Counted::Miss {
                            self.counted = Counted::Stale;
                        }
                        resp = storing.serve(stale, now);
                        None
                    }
                    _ => match resp.body() {
                        ResponseBody::Full(Some(body)) => cache
                            .storable(storing, guest, resp.headers(), body)
                            .map(Arc::new),
                        ResponseBody::Full(None) => None,
                        // Streamed (past the guest's buffer, or a backend's body): stored
                        // when it has reached the client whole.
                        _ => {
                            if let Some(variant) =
                                cache.storable(storing, guest, resp.headers(), &Bytes::new())
                            {
                                let (cache, storing) = (cache.clone(), storing.clone());
                                // A backend's answer is read by a guest, soon: the misses
                                // behind it wait until its body is stored (or proves too
                                // large, or is cut), then find it. (A client may read a
                                // guest's answer slowly: those behind it go to the guest.)
                                let lead = match self.space {
                                    Space::Front(_) => None,
                                    Space::Backend(_) | Space::Guest(_) => self.lead.take(),
                                };
                                resp = resp.map(|body| {
                                    body.kept(
                                        cache.max_object,
                                        Box::new(move |body| {
                                            let variant = Variant { body, ..variant };
                                            let _ = cache.insert(&storing, Arc::new(variant), None);
                                            drop(lead);
                                        }),
                                    )
                                });
                                streamed = true;
                                status.push_str("; detail=store-at-end");
                            }
                            None
                        }
                    },
                };
                match stored {
                    Some(variant) => {
                        let from =
                            (storing.stale.as_ref()).filter(|_| guest == StatusCode::NOT_MODIFIED);
                        status.push_str(match cache.insert(storing, variant.clone(), from) {
                            Stored::Yes => "; stored",
                            // A purge naming it came while it was being made.
                            Stored::Purged => "; detail=purged-during-fill",
                            // A `POST`, `PUT`, `PATCH` or `DELETE` of its URL was answered
                            // while it was being made: it may be what that changed.
                            Stored::Invalidated => "; detail=invalidated-during-fill",
                        });
                        // The client's own validators and range, answered from what was
                        // stored (a revalidation was served so already).
                        let asks = storing.if_none_match.is_some()
                            || storing.if_modified_since.is_some()
                            || storing.range.is_some();
                        if asks && guest != StatusCode::NOT_MODIFIED {
                            resp = storing.serve(&variant, variant.stored);
                        }
                    }
                    // A fill that proved not storable by its headers (not a failure of the
                    // moment): its key's misses stop waiting in line for a while.
                    None if !streamed
                        && !storing.passing
                        && !guest.is_server_error()
                        && guest != StatusCode::NOT_MODIFIED =>
                    {
                        cache.passes.insert(storing.hash, ());
                    }
                    None => {}
                }
            }
        }
        // Tags are for the edge's purges, not the client (stored ones were taken off already).
        resp.headers_mut().remove(&SURROGATE_KEY);
        resp.headers_mut().remove(&CACHE_TAG);
        self.status(&mut resp, &status);
        resp
    }

    /// Puts `Cache-Status` on `resp`: the forward reason, then `more`. Written on the stack
    /// and copied once into the header's value (`format!` and a growing `String` showed in a
    /// miss's profile: 782 -> 568 instructions, callgrind).
    fn status(&self, resp: &mut Response<ResponseBody>, more: &str) {
        let (detail_is, detail) = self.detail.map_or(("", ""), |d| ("; detail=", d));
        let collapsed = if self.collapsed { "; collapsed" } else { "" };
        let parts = ["tern; fwd=", self.fwd, collapsed, detail_is, detail, more];
        let mut line = [0; STATUS_ON_STACK];
        let mut len = 0;
        let value = if parts.iter().map(|p| p.len()).sum::<usize>() <= line.len() {
            for part in parts {
                line[len..len + part.len()].copy_from_slice(part.as_bytes());
                len += part.len();
            }
            HeaderValue::from_bytes(&line[..len])
        } else {
            HeaderValue::from_str(&parts.concat())
        };
        if let Ok(value) = value {
            resp.headers_mut().insert(CACHE_STATUS.clone(), value);
        }
    }
}

/// Room on the stack for a miss's `Cache-Status` (its longest is ~80 bytes).
const STATUS_ON_STACK: usize = 160;

/// Whether an answer with `headers` (and `cdn`, its `CDN-Cache-Control`) can be stored at all,
/// read cheaply before the policy is built: not with `no-store`, and only with explicit
/// freshness (`max-age`, `s-maxage`, or `Expires` without `CDN-Cache-Control`), as heuristics
/// are off. Most answers a cache does not keep are told apart here.
fn may_be_fresh(cdn: Option<&HeaderValue>, headers: &http::HeaderMap) -> bool {
    let mut fresh = cdn.is_none() && headers.contains_key(header::EXPIRES);
    for name in directive_names(cdn_or_cache_control(cdn, headers)) {
        if name.eq_ignore_ascii_case("no-store") {
            return false;
        }
        fresh |= name.eq_ignore_ascii_case("max-age") || name.eq_ignore_ascii_case("s-maxage");
    }
    fresh
}

/// Whether `headers` (`Cache-Control` or `CDN-Cache-Control`) say `private` or `no-store`.
fn says_private(headers: &http::HeaderMap) -> bool {
    let values = [&header::CACHE_CONTROL, &CDN_CACHE_CONTROL]
        .into_iter()
        .flat_map(|name| headers.get_all(name));
    says_any(values, &["private", "no-store"])
}

/// Whether an answer says it may be shared though its request carried credentials:
/// `public`, `s-maxage` or `must-revalidate` in `cdn` (its `CDN-Cache-Control`, or the
/// requester's freshness) when given, else in `Cache-Control`.
fn says_shared(cdn: Option<&HeaderValue>, headers: &http::HeaderMap) -> bool {
    says_any(
        cdn_or_cache_control(cdn, headers),
        &["public", "s-maxage", "must-revalidate"],
    )
}

/// `cdn` when given, else the `Cache-Control` values of `headers` (read in place: a `Vec` of
/// them was allocated for every answer a miss judged).
fn cdn_or_cache_control<'a>(
    cdn: Option<&'a HeaderValue>,
    headers: &'a http::HeaderMap,
) -> impl Iterator<Item = &'a HeaderValue> {
    let all = cdn
        .is_none()
        .then(|| headers.get_all(header::CACHE_CONTROL).iter());
    cdn.into_iter().chain(all.into_iter().flatten())
}

/// Whether cache-control `values` hold one of the directives `names`.
fn says_any<'a>(values: impl Iterator<Item = &'a HeaderValue>, names: &[&str]) -> bool {
    directive_names(values).any(|d| names.iter().any(|n| d.eq_ignore_ascii_case(n)))
}

/// The names of the directives in cache-control `values` (`max-age=60, public`: `max-age`,
/// `public`).
fn directive_names<'a>(
    values: impl Iterator<Item = &'a HeaderValue>,
) -> impl Iterator<Item = &'a str> {
    values
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|d| d.split('=').next().unwrap_or("").trim())
}

impl Storing {
    /// The stored `v` as this request gets it at `now`: a `304` for its validators, else whole
    /// or cut to its range.
    fn serve(&self, v: &Variant, now: Instant) -> Response<ResponseBody> {
        let validated = not_modified(
            &v.headers,
            self.if_none_match.as_ref(),
            self.if_modified_since.as_ref(),
        );
        self.cut(respond(v, validated, v.age(now)), v)
    }

    /// `resp`, served from the stored `v`, cut to the client's range.
    fn cut(&self, resp: Response<ResponseBody>, v: &Variant) -> Response<ResponseBody> {
        ranged(resp, v, self.range.as_ref(), self.if_range.as_ref())
    }
}

impl Cache {
    /// The stale answer `stale`, confirmed by a `304` with `headers` to the request `s`: its
    /// body with the `304`'s fields (RFC 9111 §4.3.4), if the `304` is for it (a strong
    /// validator that differs is not) and the result may be stored.
    fn revalidated(
        &self,
        s: &Storing,
        stale: &Variant,
        headers: &http::HeaderMap,
    ) -> Option<Variant> {
        let strong = |h: &http::HeaderMap| {
            h.get(header::ETAG)
                .and_then(|e| e.to_str().ok())
                .map(|e| e.trim().trim_start_matches("W/").to_string())
        };
        if let (Some(new), Some(old)) = (strong(headers), strong(&stale.headers))
            && new != old
        {
            return None;
        }
        let mut merged = stale.headers.clone();
        for name in headers.keys() {
            if NOT_UPDATED_BY_304.contains(name) || *name == CACHE_STATUS {
                continue;
            }
            merged.remove(name);
            for value in headers.get_all(name) {
                merged.append(name.clone(), value.clone());
            }
        }
        let mut variant = self.storable(s, stale.status, &merged, &stale.body)?;
        if variant.tags.is_empty() {
            variant.tags.clone_from(&stale.tags);
        }
        Some(variant)
    }

    /// The variant an answer with `status`, `headers` and whole body `body` makes for the
    /// request `s`, when it may be stored.
    pub(super) fn storable(
        &self,
        s: &Storing,
        status: StatusCode,
        headers: &http::HeaderMap,
        body: &Bytes,
    ) -> Option<Variant> {
        if body.len() > self.max_object {
            return None;
        }
        if !self.store_set_cookie && headers.contains_key(header::SET_COOKIE) {
            return None;
        }
        // The requester's own freshness sets how long, never whether: an answer its source
        // marked `private` or `no-store` is one user's, whatever the requester asked.
        if s.ttl.is_some() && says_private(headers) {
            return None;
        }
        // `CDN-Cache-Control` stands for `Cache-Control` and `Expires` when it is there, and
        // the requester's own freshness for both.
        let cdn = s.ttl.as_ref().or_else(|| headers.get(&CDN_CACHE_CONTROL));
        if !may_be_fresh(cdn, headers) {
            return None;
        }
        // (Told apart before `Vary` is read: most answers a cache does not keep stop here.)
        // The fields the answer varies on, and always `Authorization`: an answer to one
        // client's credentials (stored only when it says it may be) is served to the same
        // credentials only, and an anonymous one never to a request that has them.
        // `Vary: *` (no request matches it) and names that are not header names: not stored.
        let mut vary_names = vec![header::AUTHORIZATION];
        for name in headers
            .get_all(header::VARY)
            .iter()
            .map(|v| v.to_str().ok())
            .collect::<Option<Vec<_>>>()?
            .into_iter()
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|n| !n.is_empty())
        {
            if name == "*" {
                return None;
            }
            let name = HeaderName::from_bytes(name.as_bytes()).ok()?;
            if !vary_names.contains(&name) {
                vary_names.push(name);
            }
        }
        // A request with a cookie may be a signed-in user's: its answer is shared only when it
        // says so (as RFC 9111 §3.5 has it for `Authorization`), or kept per cookie (`Vary`).
        if !self.store_cookie_requests
            && s.headers.contains_key(header::COOKIE)
            && !vary_names.contains(&header::COOKIE)
            && !says_shared(cdn, headers)
        {
            return None;
        }
        let answered = Answered {
            status,
            headers: match cdn {
                Some(cdn) => {
                    let mut h = headers.clone();
                    h.insert(header::CACHE_CONTROL, cdn.clone());
                    h.remove(header::EXPIRES);
                    std::borrow::Cow::Owned(h)
                }
                None => std::borrow::Cow::Borrowed(headers),
            },
        };
        let asked = Asked {
            method: &Method::GET,
            uri: &s.uri,
            headers: &s.headers,
        };
        let now = SystemTime::now();
        let policy = CachePolicy::new_options(&asked, &answered, now, options());
        let fresh_for = policy.time_to_live(now);
        if !policy.is_storable() || fresh_for.is_zero() {
            return None;
        }
        let windows = Windows::of(cdn.or_else(|| headers.get(header::CACHE_CONTROL)));
        let mut stored_headers = headers.clone();
        stored_headers.remove(header::CONTENT_LENGTH);
        stored_headers.remove(CACHE_STATUS.clone());
        let mut tags = take_tags(&mut stored_headers);
        for tag in &s.tags {
            if !tags.contains(tag) {
                tags.push(tag.clone());
            }
        }
        Some(Variant {
            status,
            headers: stored_headers,
            hit_head: http::HeaderMap::new(),
            body: body.clone(),
            vary: vary_names
                .into_iter()
                .map(|n| {
                    let lines = s.headers.get_all(&n).iter().cloned().collect();
                    (n, lines)
                })
                .collect(),
            stored: Instant::now(),
            age_at_store: policy.age(now),
            fresh_for,
            windows,
            purged: false,
            begun: s.generation,
            policy,
            tags,
            copies: Arc::default(),
            own: crate::compress::Owned::default(),
        })
    }

    /// Stores `variant` under `s`'s key, beside the key's other variants, unless a purge
    /// since `s` was looked up names it, or its key was invalidated since (`from`: the stale
    /// answer it was made from, which must still be stored).
    pub(super) fn insert(
        &self,
        s: &Storing,
        variant: Arc<Variant>,
        from: Option<&Arc<Variant>>,
    ) -> Stored {
        let tags = || variant.tags.iter().map(|t| &**t);
        let mut put = false;
        let unpurged = self.purges.store(
            s.generation,
            |named| named.names(s.space, &s.target, tags()),
            || put = self.put_variant(s, variant.clone(), from),
        );
        match (unpurged, put) {
            (false, _) => Stored::Purged,
            (true, false) => Stored::Invalidated,
            (true, true) => Stored::Yes,
        }
    }

    /// Stores `variant` under `s`'s key, beside the key's other variants as they are stored
    /// now (an invalidation of the key meanwhile drops them all, never brought back); not if
    /// the key was invalidated since `s` was looked up, nor when `from` (the stale answer a
    /// `304` confirmed) is no longer stored; whether it was stored.
    fn put_variant(&self, s: &Storing, variant: Arc<Variant>, from: Option<&Arc<Variant>>) -> bool {
        self.update(s.hash, |stored| {
            // (Under the key's writer lock: an invalidation is before it or after the store.)
            if self.entries.invalidated_since(s.hash, s.invalidations) {
                return None;
            }
            // What was read at the look, before the fill noted the key's invalidations, may
            // have been dropped in between. (`from` may be a thread's copy of the stored
            // variant: the two share their copies.)
            if let Some(from) = from
                && !stored.as_ref().is_some_and(|e| {
                    e.variants
                        .iter()
                        .any(|w| Arc::ptr_eq(&w.copies, &from.copies))
                })
            {
                return None;
            }
            let mut variants: Vec<Arc<Variant>> = match stored {
                Some(e) if e.is_for((s.space, s.version), s.https, &s.host, &s.target) => e
                    .variants
                    .iter()
                    .filter(|v| v.vary != variant.vary)
                    .cloned()
                    .collect(),
                _ => Vec::new(),
            };
            if variants.len() >= MAX_VARIANTS {
                variants.remove(0);
            }
            variants.push(variant);
            Some(Arc::new(Keyed {
                space: s.space,
                version: s.version,
                https: s.https,
                host: s.host.clone(),
                target: s.target.clone(),
                copied: Keyed::copies_of(&variants),
                variants,
            }))
        })
    }
}

/// What became of an answer a fill meant to store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stored {
    Yes,
    /// A purge since its lookup names it.
    Purged,
    /// Its key was invalidated since its lookup (or the stale answer it confirms left).
    Invalidated,
}
