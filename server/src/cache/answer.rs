//! The answers the cache gives from a stored one: whole or `304` (the client's validators,
//! RFC 9110 §13.1), with `Age` and `Cache-Status`; and the tags taken off an answer.

use std::time::{Duration, Instant};

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Response, StatusCode};

use super::variant::Variant;
use crate::body::ResponseBody;

/// Tags of an answer, for purges: space-separated (Fastly's) and comma-separated
/// (Cloudflare's). Taken off every answer before the client sees it.
pub(super) static SURROGATE_KEY: HeaderName = HeaderName::from_static("surrogate-key");
pub(super) static CACHE_TAG: HeaderName = HeaderName::from_static("cache-tag");
/// Most tags kept of one answer.
const MAX_TAGS: usize = 64;
/// The answer of a variant `v` (fresh, or stale within its `stale-while-revalidate`) to a
/// request with `headers`: `304` when its validators
/// say the client has it, else the stored answer; with its `Age` and `Cache-Status`.
pub(super) fn hit(v: &Variant, asks: &Asks<'_>, now: Instant) -> Response<ResponseBody> {
    // How long it has been stored: its age, its freshness and its ttl from one subtraction.
    let held = now.saturating_duration_since(v.stored);
    let validated = not_modified(&v.headers, asks.if_none_match, asks.if_modified_since);
    let mut resp = respond(v, validated, v.age_at_store + held);
    if !validated {
        resp = ranged(resp, v, asks.range, asks.if_range);
    }
    // Negative once stale (RFC 9211 §2.5), served so by `stale-while-revalidate`.
    let (minus, ttl) = match v.fresh_for.checked_sub(held) {
        Some(left) if !left.is_zero() => (false, left.as_secs()),
        _ => (true, held.saturating_sub(v.fresh_for).as_secs().max(1)),
    };
    set_at(
        resp.headers_mut(),
        HEAD_CACHE_STATUS,
        &CACHE_STATUS,
        hit_status(minus, ttl),
    );
    resp
}

/// Where a thread's own copy of a stored answer keeps the headers every hit sets ([`hit_head`]).
const HEAD_AGE: usize = 0;
const HEAD_CACHE_STATUS: usize = 1;

/// The headers a hit on a thread's own copy of a stored answer starts from: `Age` and
/// `Cache-Status` first, each with one value (standing in until each hit sets its own), then
/// the stored ones but those two. A hit clones it, which copies its entries and hashes no name, then sets the two in
/// place ([`set_at`]).
pub(super) fn hit_head(stored: &HeaderMap) -> HeaderMap {
    // Room in its index for the headers a hit adds: a clone keeps it (its entries it does not).
    let mut head = HeaderMap::with_capacity(stored.len() + 2 + HIT_HEADERS);
    head.insert(header::AGE, HeaderValue::from_static("0"));
    head.insert(CACHE_STATUS.clone(), HeaderValue::from_static("tern; hit"));
    for (name, value) in stored {
        // (A stored `Age`, the origin's, is replaced by each hit's: not a second value.)
        if name != header::AGE && *name != CACHE_STATUS {
            head.append(name.clone(), value.clone());
        }
    }
    head
}

/// Sets `name` to `value` in `headers` (its only value): in place when it is the entry at `at`
/// with one value (as in a clone of [`hit_head`]), else by name.
fn set_at(headers: &mut HeaderMap, at: usize, name: &HeaderName, value: HeaderValue) {
    let mut values = headers.iter_mut().skip(at);
    if let Some((found, slot)) = values.next()
        && found == name
        && values.next().is_none_or(|(next, _)| next != name)
    {
        *slot = value;
        return;
    }
    headers.insert(name.clone(), value);
}

/// `Cache-Status: tern; hit; ttl=<ttl>` (`-ttl` when `minus`), written on the stack: no
/// `String` and no formatter per hit.
fn hit_status(minus: bool, ttl: u64) -> HeaderValue {
    const HIT: &[u8] = b"tern; hit; ttl=";
    let mut buf = [0u8; HIT.len() + 1 + 20];
    buf[..HIT.len()].copy_from_slice(HIT);
    let mut n = HIT.len();
    if minus {
        buf[n] = b'-';
        n += 1;
    }
    let mut scratch = [0; 20];
    let digits = crate::decimal::bytes(ttl, &mut scratch);
    buf[n..n + digits.len()].copy_from_slice(digits);
    HeaderValue::from_bytes(&buf[..n + digits.len()]).expect("ASCII is a header value")
}

/// Request headers that proxies and web frameworks read as the request's host, scheme, URL or
/// method, which the key does not hold. The answer to a request carrying one from a peer that
/// is not a trusted proxy (`server.trusted_proxies`) is served and not stored: a guest that
/// reflects one (a link to `X-Forwarded-Host`, say) would otherwise give every client the
/// answer one client shaped.
pub(super) static UNKEYED: [HeaderName; 14] = [
    HeaderName::from_static("x-forwarded-host"),
    HeaderName::from_static("x-forwarded-proto"),
    HeaderName::from_static("x-forwarded-scheme"),
    HeaderName::from_static("x-forwarded-port"),
    HeaderName::from_static("x-forwarded-prefix"),
    HeaderName::from_static("x-forwarded-ssl"),
    HeaderName::from_static("x-forwarded-server"),
    HeaderName::from_static("x-host"),
    HeaderName::from_static("x-original-url"),
    HeaderName::from_static("x-rewrite-url"),
    HeaderName::from_static("x-http-method-override"),
    HeaderName::from_static("x-http-method"),
    HeaderName::from_static("x-method-override"),
    header::FORWARDED,
];

/// The request headers a look at the cache reads, found in one pass over the request's
/// headers (a request carries a few; a look-up by name hashes the name, and most of these are
/// absent from most requests): the first value of each, as `HeaderMap::get` gives it.
#[derive(Default)]
pub(super) struct Asks<'a> {
    pub(super) if_none_match: Option<&'a HeaderValue>,
    pub(super) if_modified_since: Option<&'a HeaderValue>,
    pub(super) range: Option<&'a HeaderValue>,
    pub(super) if_range: Option<&'a HeaderValue>,
    pub(super) content_length: Option<&'a HeaderValue>,
    /// `Transfer-Encoding` is there.
    pub(super) transfer_encoding: bool,
    /// `Cache-Control` or `Pragma` is there: directives of the request's own (RFC 9111's to
    /// weigh).
    pub(super) directives: bool,
    /// One of the [`UNKEYED`] headers is there: from a peer that is not
    /// a trusted proxy, its answer is served and not stored.
    pub(super) unkeyed: bool,
}

impl<'a> Asks<'a> {
    pub(super) fn of(headers: &'a HeaderMap) -> Self {
        let mut asks = Self::default();
        for (name, value) in headers {
            let slot = if name == header::IF_NONE_MATCH {
                &mut asks.if_none_match
            } else if name == header::IF_MODIFIED_SINCE {
                &mut asks.if_modified_since
            } else if name == header::RANGE {
                &mut asks.range
            } else if name == header::IF_RANGE {
                &mut asks.if_range
            } else if name == header::CONTENT_LENGTH {
                &mut asks.content_length
            } else {
                if name == header::TRANSFER_ENCODING {
                    asks.transfer_encoding = true;
                } else if name == header::CACHE_CONTROL || name == header::PRAGMA {
                    asks.directives = true;
                } else if (name == header::FORWARDED || name.as_str().starts_with("x-"))
                    && UNKEYED.contains(name)
                {
                    asks.unkeyed = true;
                }
                continue;
            };
            slot.get_or_insert(value);
        }
        asks
    }
}

/// Headers a hit's answer gets beyond the stored ones (room is made for them when it is built).
const HIT_HEADERS: usize = 8;

/// Headers a `304` repeats from the answer it stands for (RFC 9110 §15.4.5).
const NOT_MODIFIED_KEEPS: [HeaderName; 6] = [
    header::CACHE_CONTROL,
    header::CONTENT_LOCATION,
    header::DATE,
    header::ETAG,
    header::EXPIRES,
    header::VARY,
];

/// The stored answer `v` with its `Age` (`age`): whole, or as a `304` when the client's
/// validators matched it (`validated`).
pub(super) fn respond(v: &Variant, validated: bool, age: Duration) -> Response<ResponseBody> {
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
    } else if !v.hit_head.is_empty() {
        // A thread's own copy: its hit headers cloned (no name hashed), set below.
        let mut resp = Response::new(ResponseBody::Full(Some(v.body.clone())));
        *resp.status_mut() = v.status;
        *resp.headers_mut() = v.hit_head.clone();
        resp
    } else {
        let mut resp = Response::new(ResponseBody::Full(Some(v.body.clone())));
        *resp.status_mut() = v.status;
        // With room for a hit's own headers: a clone's would be full, and grown twice.
        let headers = resp.headers_mut();
        headers.reserve(v.headers.len() + HIT_HEADERS);
        for (name, value) in &v.headers {
            headers.append(name.clone(), value.clone());
        }
        resp
    };
    set_at(
        resp.headers_mut(),
        HEAD_AGE,
        &header::AGE,
        crate::decimal::header_value(age.as_secs()),
    );
    resp
}

/// The client's `range` (RFC 9110 §14) and `if_range` on the stored `200` `v` served whole as
/// `resp`: one byte range is answered `206` with `Content-Range`, a range starting past the
/// end `416`; several ranges, a unit or syntax this does not read, or an `If-Range` that does
/// not match the stored answer get the whole answer (a server may ignore `Range`).
pub(super) fn ranged(
    resp: Response<ResponseBody>,
    v: &Variant,
    range: Option<&HeaderValue>,
    if_range: Option<&HeaderValue>,
) -> Response<ResponseBody> {
    if resp.status() != StatusCode::OK {
        return resp;
    }
    let Some(spec) = range.and_then(|r| r.to_str().ok()) else {
        return resp;
    };
    if let Some(condition) = if_range
        && !if_range_holds(&v.headers, condition)
    {
        return resp;
    }
    let len = v.body.len() as u64;
    let Some(range) = byte_range(spec, len) else {
        return resp;
    };
    let (parts, _) = resp.into_parts();
    let mut out = Response::from_parts(parts, ResponseBody::Full(None));
    match range {
        Some((first, last)) => {
            *out.status_mut() = StatusCode::PARTIAL_CONTENT;
            let slice = v.body.slice(
                usize::try_from(first).unwrap_or(usize::MAX)
                    ..=usize::try_from(last).unwrap_or(usize::MAX),
            );
            *out.body_mut() = ResponseBody::Full(Some(slice));
            if let Ok(value) = HeaderValue::from_str(&format!("bytes {first}-{last}/{len}")) {
                out.headers_mut().insert(header::CONTENT_RANGE, value);
            }
        }
        None => {
            *out.status_mut() = StatusCode::RANGE_NOT_SATISFIABLE;
            out.headers_mut().remove(header::CONTENT_TYPE);
            if let Ok(value) = HeaderValue::from_str(&format!("bytes */{len}")) {
                out.headers_mut().insert(header::CONTENT_RANGE, value);
            }
        }
    }
    out
}

/// The one byte range `spec` asks of a body of `len` bytes: `Some(Some((first, last)))`,
/// `Some(None)` when it cannot be satisfied, `None` when it is not one byte range this reads.
fn byte_range(spec: &str, len: u64) -> Option<Option<(u64, u64)>> {
    let (unit, set) = spec.trim().split_once('=')?;
    if !unit.trim().eq_ignore_ascii_case("bytes") || set.contains(',') {
        return None;
    }
    let (first, last) = set.trim().split_once('-')?;
    let number = |s: &str| {
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse::<u64>().ok())
            .flatten()
    };
    match (first.trim(), last.trim()) {
        ("", suffix) => {
            let n = number(suffix)?;
            if n == 0 || len == 0 {
                return Some(None);
            }
            Some(Some((len.saturating_sub(n), len - 1)))
        }
        (first, last) => {
            let first = number(first)?;
            let last = if last.is_empty() {
                u64::MAX
            } else {
                number(last)?
            };
            if last < first {
                return None;
            }
            if first >= len {
                return Some(None);
            }
            Some(Some((first, last.min(len - 1))))
        }
    }
}

/// Whether `If-Range` holds for a stored answer with `stored` headers: an entity tag must
/// match its `ETag` strongly, a date must be its `Last-Modified` exactly (RFC 9110 §13.1.5).
fn if_range_holds(stored: &HeaderMap, condition: &HeaderValue) -> bool {
    let Ok(condition) = condition.to_str() else {
        return false;
    };
    let condition = condition.trim();
    if condition.starts_with('"') || condition.starts_with("W/") {
        return !condition.starts_with("W/")
            && stored
                .get(header::ETAG)
                .and_then(|e| e.to_str().ok())
                .is_some_and(|etag| etag.trim() == condition);
    }
    stored
        .get(header::LAST_MODIFIED)
        .and_then(|m| m.to_str().ok())
        .is_some_and(|modified| modified.trim() == condition)
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
    // (Asked first: most requests carry no validator, and a look-up by name costs.)
    let Some(since) = if_modified_since else {
        return false;
    };
    let Some(modified) = stored.get(header::LAST_MODIFIED) else {
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

/// `Cache-Status` (RFC 9211).
pub static CACHE_STATUS: HeaderName = HeaderName::from_static("cache-status");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_at_leaves_the_one_value_it_is_given() {
        let age = |h: &HeaderMap| {
            h.get_all(header::AGE)
                .iter()
                .map(|v| v.to_str().unwrap().to_string())
                .collect::<Vec<_>>()
        };
        let set_age = |h: &mut HeaderMap| {
            set_at(h, HEAD_AGE, &header::AGE, HeaderValue::from_static("7"));
        };
        // A thread copy's head: set in place, the other headers as they were.
        let mut head = hit_head(&headers(&[("content-type", "text/plain"), ("age", "100")]));
        set_age(&mut head);
        assert_eq!(age(&head), ["7"]);
        assert_eq!(head["content-type"], "text/plain");
        // A stored answer's own headers, an origin's `Age` first with two lines: both go.
        let mut stored = headers(&[("age", "100"), ("age", "200"), ("etag", "\"x\"")]);
        set_age(&mut stored);
        assert_eq!(age(&stored), ["7"]);
        // Another name at that place: set by name.
        let mut other = headers(&[("etag", "\"x\""), ("age", "100")]);
        set_age(&mut other);
        assert_eq!(age(&other), ["7"]);
        assert_eq!(other["etag"], "\"x\"");
    }

    #[test]
    fn asks_finds_what_get_finds_in_one_pass() {
        let empty = HeaderMap::new();
        let none = Asks::of(&empty);
        assert!(none.if_none_match.is_none() && none.range.is_none());
        assert!(!none.directives && !none.transfer_encoding && none.content_length.is_none());
        let mut h = headers(&[
            ("host", "a"),
            ("if-none-match", "\"x\""),
            ("range", "bytes=0-1"),
            ("x-other", "1"),
            ("if-modified-since", "Sun, 06 Nov 1994 08:49:37 GMT"),
            ("if-range", "\"z\""),
            ("content-length", "5"),
        ]);
        // A second value: `get` gives the first, and so does `Asks`.
        h.append(header::IF_NONE_MATCH, HeaderValue::from_static("\"y\""));
        h.append(header::CONTENT_LENGTH, HeaderValue::from_static("7"));
        let asks = Asks::of(&h);
        for (found, name) in [
            (asks.if_none_match, header::IF_NONE_MATCH),
            (asks.if_modified_since, header::IF_MODIFIED_SINCE),
            (asks.range, header::RANGE),
            (asks.if_range, header::IF_RANGE),
            (asks.content_length, header::CONTENT_LENGTH),
        ] {
            assert_eq!(found, h.get(&name), "{name}");
            assert!(found.is_some(), "{name}");
        }
        assert!(!asks.directives && !asks.transfer_encoding);
        for (name, directives, te) in [
            ("cache-control", true, false),
            ("pragma", true, false),
            ("transfer-encoding", false, true),
        ] {
            let h = headers(&[("accept", "*/*"), (name, "x")]);
            let asks = Asks::of(&h);
            assert_eq!(
                (asks.directives, asks.transfer_encoding),
                (directives, te),
                "{name}"
            );
        }
    }

    #[test]
    fn a_hits_cache_status_gives_its_ttl_fresh_and_stale() {
        for (minus, ttl, want) in [
            (false, 0, "tern; hit; ttl=0"),
            (false, 3579, "tern; hit; ttl=3579"),
            (true, 1, "tern; hit; ttl=-1"),
            (true, 86_400, "tern; hit; ttl=-86400"),
            (false, u64::MAX, "tern; hit; ttl=18446744073709551615"),
            (true, u64::MAX, "tern; hit; ttl=-18446744073709551615"),
        ] {
            assert_eq!(hit_status(minus, ttl), want);
        }
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| (HeaderName::from_static(k), HeaderValue::from_static(v)))
            .collect()
    }

    /// A stored answer with a strong validator and a date.
    fn stored_v1() -> HeaderMap {
        headers(&[
            ("etag", "\"v1\""),
            ("last-modified", "Wed, 21 Oct 2015 07:28:00 GMT"),
        ])
    }

    fn v(s: &'static str) -> HeaderValue {
        HeaderValue::from_static(s)
    }

    #[test]
    fn byte_ranges_follow_rfc_9110() {
        assert_eq!(byte_range("bytes=0-99", 1000), Some(Some((0, 99))));
        assert_eq!(byte_range("bytes=990-", 1000), Some(Some((990, 999))));
        assert_eq!(byte_range("bytes=900-2000", 1000), Some(Some((900, 999))));
        assert_eq!(byte_range("bytes=-10", 1000), Some(Some((990, 999))));
        assert_eq!(byte_range("bytes=-2000", 1000), Some(Some((0, 999))));
        assert_eq!(byte_range("BYTES = 5-5", 10), Some(Some((5, 5))));
        // Past the end, or nothing asked: not satisfiable.
        assert_eq!(byte_range("bytes=1000-", 1000), Some(None));
        assert_eq!(byte_range("bytes=-0", 1000), Some(None));
        assert_eq!(byte_range("bytes=0-0", 0), Some(None));
        // Not one byte range: the whole answer.
        for ignored in [
            "bytes=0-1,5-6",
            "items=0-1",
            "bytes=5-1",
            "bytes=a-b",
            "bytes=-",
            "bytes=+1-2",
            "bytes",
        ] {
            assert_eq!(byte_range(ignored, 1000), None, "{ignored}");
        }
    }

    #[test]
    fn if_range_matches_strongly_or_by_exact_date() {
        let stored = stored_v1();
        assert!(if_range_holds(&stored, &v("\"v1\"")));
        assert!(!if_range_holds(&stored, &v("W/\"v1\"")), "weak never");
        assert!(!if_range_holds(&stored, &v("\"v2\"")));
        assert!(if_range_holds(&stored, &v("Wed, 21 Oct 2015 07:28:00 GMT")));
        assert!(!if_range_holds(
            &stored,
            &v("Thu, 22 Oct 2015 07:28:00 GMT")
        ));
    }

    #[test]
    fn validators_follow_rfc_9110() {
        let stored = stored_v1();
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

    /// Headers of the given names (spelled as given), each with the value `v`.
    fn with(names: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for n in names {
            h.append(
                HeaderName::from_bytes(n.as_bytes()).expect("a name"),
                HeaderValue::from_static("v"),
            );
        }
        h
    }

    #[test]
    fn every_unkeyed_header_is_found_among_others_and_no_other_is() {
        let carries_unkeyed = |h: &HeaderMap| Asks::of(h).unkeyed;
        assert!(!carries_unkeyed(&HeaderMap::new()));
        let others = [
            "host",
            "accept",
            "x-forwarded-for",
            "x-request-id",
            "x-hostile",
            "forwarded-for",
        ];
        assert!(!carries_unkeyed(&with(&others)));
        for name in &UNKEYED {
            // First, last and alone; as clients spell it (names are case-insensitive).
            let upper = name.as_str().to_ascii_uppercase();
            for names in [
                vec![name.as_str(), "host", "accept"],
                vec!["host", "x-forwarded-for", name.as_str()],
                vec![upper.as_str()],
            ] {
                assert!(carries_unkeyed(&with(&names)), "{names:?}");
            }
        }
    }
}
