//! The answers the cache gives from a stored one: whole or `304` (the client's validators,
//! RFC 9110 §13.1), with `Age` and `Cache-Status`; and the tags taken off an answer.

use std::time::Instant;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Response, StatusCode};

use super::{CACHE_STATUS, Variant};
use crate::body::ResponseBody;

/// Tags of an answer, for purges: space-separated (Fastly's) and comma-separated
/// (Cloudflare's). Taken off every answer before the client sees it.
pub(super) static SURROGATE_KEY: HeaderName = HeaderName::from_static("surrogate-key");
pub(super) static CACHE_TAG: HeaderName = HeaderName::from_static("cache-tag");
/// Most tags kept of one answer.
const MAX_TAGS: usize = 64;
/// The answer of a fresh variant `v` to a request with `headers`: `304` when its validators
/// say the client has it, else the stored answer; with its `Age` and `Cache-Status`.
pub(super) fn hit(v: &Variant, headers: &HeaderMap, now: Instant) -> Response<ResponseBody> {
    let validated = not_modified(
        &v.headers,
        headers.get(header::IF_NONE_MATCH),
        headers.get(header::IF_MODIFIED_SINCE),
    );
    let mut resp = respond(v, validated, now);
    let ttl = v
        .fresh_for
        .saturating_sub(now.saturating_duration_since(v.stored))
        .as_secs();
    if let Ok(value) = HeaderValue::from_str(&format!("tern; hit; ttl={ttl}")) {
        resp.headers_mut().insert(CACHE_STATUS.clone(), value);
    }
    resp
}

/// Headers a `304` repeats from the answer it stands for (RFC 9110 §15.4.5).
const NOT_MODIFIED_KEEPS: [HeaderName; 6] = [
    header::CACHE_CONTROL,
    header::CONTENT_LOCATION,
    header::DATE,
    header::ETAG,
    header::EXPIRES,
    header::VARY,
];

/// The stored answer `v` at `now` with its `Age`: whole, or as a `304` when the client's
/// validators matched it (`validated`).
pub(super) fn respond(v: &Variant, validated: bool, now: Instant) -> Response<ResponseBody> {
    let mut resp = if validated {
        let mut resp = Response::new(ResponseBody::Full(None));
        *resp.status_mut() = StatusCode::NOT_MODIFIED;
        let out = resp.headers_mut();
        for name in NOT_MODIFIED_KEEPS {
            for value in v.headers.get_all(&name) {
                out.append(name.clone(), value.clone());
            }
        }
        resp
    } else {
        let mut resp = Response::new(ResponseBody::Full(Some(v.body.clone())));
        *resp.status_mut() = v.status;
        *resp.headers_mut() = v.headers.clone();
        resp
    };
    resp.headers_mut()
        .insert(header::AGE, HeaderValue::from(v.age(now).as_secs()));
    resp
}

/// Whether a stored answer with `stored` headers satisfies the client's validators: its
/// `If-None-Match` (weak comparison, RFC 9110 §13.1.2), or without one its
/// `If-Modified-Since` against `Last-Modified`.
pub(super) fn not_modified(
    stored: &HeaderMap,
    if_none_match: Option<&HeaderValue>,
    if_modified_since: Option<&HeaderValue>,
) -> bool {
    if let Some(inm) = if_none_match {
        let Some(etag) = stored.get(header::ETAG).and_then(|e| e.to_str().ok()) else {
            return false;
        };
        let weak = |t: &str| t.trim().trim_start_matches("W/").to_string();
        let etag = weak(etag);
        return inm
            .to_str()
            .is_ok_and(|list| list.split(',').any(|t| t.trim() == "*" || weak(t) == etag));
    }
    let (Some(since), Some(modified)) = (if_modified_since, stored.get(header::LAST_MODIFIED))
    else {
        return false;
    };
    let date = |v: &HeaderValue| {
        v.to_str()
            .ok()
            .and_then(|s| httpdate::parse_http_date(s).ok())
    };
    matches!((date(since), date(modified)), (Some(s), Some(m)) if m <= s)
}

/// Takes the tags off `headers`: `Surrogate-Key` (space-separated) and `Cache-Tag`
/// (comma-separated), at most [`MAX_TAGS`].
pub(super) fn take_tags(headers: &mut HeaderMap) -> Vec<Box<str>> {
    let mut tags: Vec<Box<str>> = Vec::new();
    for (name, split) in [(&SURROGATE_KEY, ' '), (&CACHE_TAG, ',')] {
        if let http::header::Entry::Occupied(e) = headers.entry(name) {
            for value in e.remove_entry_mult().1 {
                let Ok(text) = value.to_str() else { continue };
                for tag in text.split(split).map(str::trim).filter(|t| !t.is_empty()) {
                    if tags.len() < MAX_TAGS && !tags.iter().any(|t| **t == *tag) {
                        tags.push(tag.into());
                    }
                }
            }
        }
    }
    tags
}

/// `; param` appended to an answer's `Cache-Status`.
pub(super) fn append_param(resp: &mut Response<ResponseBody>, param: &str) {
    let Some(value) = resp
        .headers()
        .get(&CACHE_STATUS)
        .and_then(|v| v.to_str().ok())
    else {
        return;
    };
    if let Ok(value) = HeaderValue::from_str(&format!("{value}; {param}")) {
        resp.headers_mut().insert(CACHE_STATUS.clone(), value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| (HeaderName::from_static(k), HeaderValue::from_static(v)))
            .collect()
    }

    #[test]
    fn validators_follow_rfc_9110() {
        let stored = headers(&[
            ("etag", "\"v1\""),
            ("last-modified", "Wed, 21 Oct 2015 07:28:00 GMT"),
        ]);
        let v = |s: &'static str| HeaderValue::from_static(s);
        assert!(not_modified(&stored, Some(&v("\"v1\"")), None));
        assert!(not_modified(&stored, Some(&v("W/\"v1\"")), None));
        assert!(not_modified(&stored, Some(&v("\"x\", \"v1\"")), None));
        assert!(not_modified(&stored, Some(&v("*")), None));
        assert!(!not_modified(&stored, Some(&v("\"v2\"")), None));
        // If-None-Match decides alone when it is there.
        assert!(!not_modified(
            &stored,
            Some(&v("\"v2\"")),
            Some(&v("Wed, 21 Oct 2015 07:28:00 GMT"))
        ));
        assert!(not_modified(
            &stored,
            None,
            Some(&v("Wed, 21 Oct 2015 07:28:00 GMT"))
        ));
        assert!(!not_modified(
            &stored,
            None,
            Some(&v("Tue, 20 Oct 2015 07:28:00 GMT"))
        ));
        assert!(!not_modified(&stored, None, Some(&v("not a date"))));
        assert!(!not_modified(&HeaderMap::new(), Some(&v("\"v1\"")), None));
    }
}
