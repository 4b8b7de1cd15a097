//! Compression at the edge: a tenant's answers compressed with the best encoding the client
//! accepts (zstd, Brotli, gzip), as they stream, so that guests written in any language send
//! plain bytes and the edge compresses them once, outside the guest's CPU budget.
//!
//! The front end asks [`Compression::choose`] what the client accepts when the request comes
//! (`Accept-Encoding`, RFC 9110 §12.5.3: q-values, `*`, `identity;q=0`), and hands the answer
//! to [`Compression::apply`]. An answer is compressed when its type is one of the tenant's
//! `types`, it has no `Content-Encoding`, no `Content-Range` (a `206` is about the plain
//! bytes), no `Cache-Control: no-transform`, a status with a body, and a body not declared
//! shorter than `min_bytes` or longer than `max_bytes`. Such an answer gets `Vary:
//! Accept-Encoding` whether or not this client takes it compressed (a cache downstream must
//! not give one client's encoding to another). A compressed answer gets `Content-Encoding`,
//! loses `Content-Length` (a body known whole and small gets its compressed length instead)
//! and `Accept-Ranges`, and a strong `ETag` becomes weak (the bytes differ from the plain
//! answer's).
//!
//! With the edge cache, a stored answer keeps a compressed copy per encoding ([`Copies`]),
//! made by the first hit that takes it, counted in the cache's bytes and purged with it.
//!
//! The codecs are `compression-codecs` (async-compression's), driven by [`body::Encoded`]:
//! input is compressed as it arrives, at most [`body::PIECE`] per poll, and what was
//! compressed is flushed to the client whenever the guest has nothing more for now, so a slow
//! or endless stream (server-sent events) reaches the client as it is written.

pub mod body;
pub mod config;
mod encoding;

use http::header::{
    ACCEPT_ENCODING, ACCEPT_RANGES, CACHE_CONTROL, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_RANGE,
    CONTENT_TYPE, ETAG, VARY,
};
use http::{HeaderMap, HeaderValue, Response, StatusCode};

use crate::body::ResponseBody;
pub use config::CompressionConfig;
use config::TypeRule;
pub use encoding::Encoding;

/// What a client accepts, as [`Compression::choose`] read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// This encoding.
    Encode(Encoding),
    /// None of the tenant's encodings (or no `Accept-Encoding`): the plain answer.
    Plain,
}

/// The compressed copies of one answer the edge cache stored, one per encoding, each made by
/// the first client that takes it and served as it is to the next (a purge drops them with
/// the answer).
///
/// It also keeps what the tenant's compression judged of the stored answer itself (whether it
/// qualifies, whether its `Vary` lists `Accept-Encoding`), so a hit does not judge it again:
/// tagged with the settings' id, so a reload's new settings judge it anew.
#[derive(Debug, Default)]
pub struct Copies {
    made: [std::sync::OnceLock<bytes::Bytes>; 3],
    /// `id << 2 | vary_listed << 1 | qualifies`; 0 before it was judged.
    verdict: std::sync::atomic::AtomicU64,
}

impl Copies {
    /// The bytes its copies hold.
    pub fn bytes(&self) -> usize {
        self.made
            .iter()
            .filter_map(|c| c.get())
            .map(bytes::Bytes::len)
            .sum()
    }

    /// The stored answer's verdict under the compression `id`: kept, or `judge`d now and kept.
    fn judged(&self, id: u64, judge: impl FnOnce() -> Verdict) -> Verdict {
        use std::sync::atomic::Ordering::Relaxed;
        let kept = self.verdict.load(Relaxed);
        if kept >> 2 == id {
            return Verdict {
                qualifies: kept & 1 != 0,
                vary_listed: kept & 2 != 0,
            };
        }
        let v = judge();
        let bits = id << 2 | u64::from(v.vary_listed) << 1 | u64::from(v.qualifies);
        self.verdict.store(bits, Relaxed);
        v
    }
}

/// A thread's own copies of a stored answer's compressed bodies (a thread's copy of the
/// answer holds them: served before the shared ones, whose reference counts every core's hits
/// would write). Each is copied from the shared one the first time the thread serves its
/// encoding, while they fit in the room they were given; the stored answer itself has none.
#[derive(Debug, Default)]
pub struct Owned(Option<Box<Own>>);

#[derive(Debug)]
struct Own {
    /// By encoding: the body, and its `Content-Length`.
    made: [std::sync::OnceLock<(bytes::Bytes, HeaderValue)>; 3],
    /// Bytes still free for copies (shared by the variants of one copied entry).
    room: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// The answer's `ETag` made weak (`None`: it has none, or a weak one), once made.
    weak_etag: std::sync::OnceLock<Option<HeaderValue>>,
}

impl Clone for Owned {
    /// A clone is a stored answer's: with none of its own.
    fn clone(&self) -> Self {
        Self(None)
    }
}

impl Owned {
    /// None yet, and copies of at most `room` bytes in all (with those of the others given
    /// the same room).
    pub fn with_room(room: &std::sync::Arc<std::sync::atomic::AtomicUsize>) -> Self {
        Self(Some(Box::new(Own {
            made: Default::default(),
            room: room.clone(),
            weak_etag: std::sync::OnceLock::new(),
        })))
    }

    /// Its copy in `encoding` and that copy's `Content-Length`, if made.
    fn made(&self, encoding: Encoding) -> Option<&(bytes::Bytes, HeaderValue)> {
        self.0.as_ref()?.made[encoding as usize].get()
    }

    /// Its copy in `encoding` made now from `shared`, if there is room for it.
    fn copy(
        &self,
        encoding: Encoding,
        shared: &bytes::Bytes,
    ) -> Option<&(bytes::Bytes, HeaderValue)> {
        use std::sync::atomic::Ordering::Relaxed;
        let own = self.0.as_ref()?;
        own.room
            .fetch_update(Relaxed, Relaxed, |room| room.checked_sub(shared.len()))
            .ok()?;
        Some(own.made[encoding as usize].get_or_init(|| {
            let length = crate::decimal::header_value(shared.len() as u64);
            (bytes::Bytes::copy_from_slice(shared), length)
        }))
    }
}

/// What a compression judged of an answer.
#[derive(Debug, Clone, Copy)]
struct Verdict {
    /// It may be compressed (see the module's documentation).
    qualifies: bool,
    /// Its `Vary` already lists `Accept-Encoding` (or `*`).
    vary_listed: bool,
}

/// What a request asked of its answer's compression: the encoding its client takes best.
#[derive(Debug, Clone, Copy)]
pub struct Asked(Choice);

impl Asked {
    /// What a request without `Accept-Encoding` asks: the plain answer.
    pub const PLAIN: Self = Self(Choice::Plain);
}

/// A tenant's compression, prepared from its `[tenant.compression]`.
#[derive(Debug)]
pub struct Compression {
    /// The encodings offered, the tenant's preference first.
    encodings: Vec<Encoding>,
    types: Vec<TypeRule>,
    min_bytes: u64,
    max_bytes: u64,
    /// Levels: gzip, Brotli, zstd.
    levels: body::Levels,
    /// `tern_compressed_responses_total`, by encoding (in [`Encoding`]'s order).
    answers: [crate::counter::Counter; 3],
    /// `tern_compression_bytes_total`: plain and sent.
    bytes: body::Counted,
    /// Tells these settings from every other compression's in the process (never 0): the
    /// verdicts a stored answer keeps ([`Copies`]) are these settings'.
    id: u64,
}

impl Compression {
    /// The tenant's compression, or `None` when it is off (settings already checked); counted
    /// in `metrics` under its metrics `label`.
    pub fn prepare(
        c: &CompressionConfig,
        metrics: &crate::metrics::Metrics,
        label: &str,
    ) -> Option<Self> {
        if !c.enabled {
            return None;
        }
        static IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let bytes = |b| metrics.compression_bytes.with_label_values(&[label, b]);
        Some(Self {
            id: IDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            answers: [Encoding::Zstd, Encoding::Br, Encoding::Gzip]
                .map(|e| metrics.compressed.with_label_values(&[label, e.token()])),
            bytes: body::Counted {
                plain: bytes("plain"),
                sent: bytes("sent"),
            },
            encodings: c
                .encodings
                .iter()
                .filter_map(|e| Encoding::from_token(e))
                .collect(),
            types: c.types.iter().filter_map(|t| TypeRule::parse(t)).collect(),
            min_bytes: c.min_bytes,
            max_bytes: c.max_bytes,
            levels: body::Levels {
                gzip: c.gzip_level,
                brotli: c.brotli_level,
                zstd: c.zstd_level,
            },
        })
    }

    /// The encoding for a request with `headers`: of the tenant's encodings, the one the
    /// client gives the highest q-value (`*` stands for those it does not name), the tenant's
    /// preference among equals; `Plain` when it accepts none, or sends no `Accept-Encoding`.
    pub fn choose(&self, headers: &HeaderMap) -> Choice {
        let q = accepted(headers);
        let mut best: Option<(Encoding, u16)> = None;
        for &encoding in &self.encodings {
            let q = q[encoding as usize];
            if q > 0 && best.is_none_or(|(_, b)| q > b) {
                best = Some((encoding, q));
            }
        }
        best.map_or(Choice::Plain, |(e, _)| Choice::Encode(e))
    }

    /// What the answer to `req` may be compressed with.
    pub fn ask<B>(&self, req: &http::Request<B>) -> Asked {
        Asked(self.choose(req.headers()))
    }

    /// `resp` as the client gets it: compressed as `asked` when it qualifies (see the
    /// module's documentation), with `Vary: Accept-Encoding` when it could have been. The
    /// answer to a `HEAD` is made as a `GET`'s (its length too), and its body not sent.
    pub fn apply(&self, asked: Asked, resp: Response<ResponseBody>) -> Response<ResponseBody> {
        self.apply_with(asked, resp, None).0
    }

    /// [`Compression::apply`] to an answer the edge cache stored, whose compressed `copies`
    /// are kept with it: the copy in the client's encoding is served, made (whole, at once)
    /// by the first client that takes it. Also says whether this call made the copy (the
    /// bytes it holds): its maker, only, has it counted with the stored answer.
    /// `resp` is the stored answer (with its `Age`, `Cache-Status`) or one made from it (a
    /// `304`, a range's `206` or `416`); the stored answer is judged once per settings. A
    /// copy in `own` (a thread's own of `copies`' bytes, made now when there is room for it)
    /// is served before the shared one.
    pub fn apply_stored(
        &self,
        asked: Asked,
        resp: Response<ResponseBody>,
        copies: &Copies,
        own: &Owned,
    ) -> (Response<ResponseBody>, Option<usize>) {
        self.apply_with(asked, resp, Some((copies, own)))
    }

    fn apply_with(
        &self,
        asked: Asked,
        mut resp: Response<ResponseBody>,
        stored: Option<(&Copies, &Owned)>,
    ) -> (Response<ResponseBody>, Option<usize>) {
        let Asked(choice) = asked;
        let known = match resp.body() {
            ResponseBody::Full(Some(b)) => Some(b.len() as u64),
            _ => None,
        };
        let judge = || Verdict {
            qualifies: self.qualifies(resp.status(), resp.headers(), known),
            vary_listed: vary_listed(resp.headers()),
        };
        // An answer made from the stored one has a status of its own: judged each time.
        let made_from_stored = matches!(
            resp.status(),
            StatusCode::NOT_MODIFIED
                | StatusCode::PARTIAL_CONTENT
                | StatusCode::RANGE_NOT_SATISFIABLE
        );
        let verdict = match stored {
            Some((copies, _)) if !made_from_stored => copies.judged(self.id, judge),
            _ => judge(),
        };
        if !verdict.qualifies {
            return (resp, None);
        }
        if !verdict.vary_listed {
            resp.headers_mut()
                .append(VARY, HeaderValue::from_static("accept-encoding"));
        }
        let Choice::Encode(encoding) = choice else {
            return (resp, None);
        };
        let (mut parts, plain) = resp.into_parts();
        // A thread's own copy's `Content-Length`, made with it.
        let mut length = None;
        let (body, made) = match (stored, plain) {
            (Some((copies, own)), ResponseBody::Full(Some(plain))) => {
                let slot = &copies.made[encoding as usize];
                let owned = own.made(encoding).or_else(|| {
                    let shared = slot.get()?;
                    own.copy(encoding, shared)
                });
                let (copy, made) = match owned.map(|(copy, _)| copy).or_else(|| slot.get()) {
                    Some(copy) => (copy.clone(), None),
                    None => match body::whole(&plain, encoding, self.levels) {
                        Ok(copy) => {
                            let made = slot.set(copy.clone()).is_ok().then_some(copy.len());
                            (copy, made)
                        }
                        Err(_) => {
                            let plain = ResponseBody::Full(Some(plain));
                            return (Response::from_parts(parts, plain), None);
                        }
                    },
                };
                self.bytes.plain.inc_by(plain.len() as u64);
                self.bytes.sent.inc_by(copy.len() as u64);
                length = owned.map(|(_, length)| length.clone());
                (ResponseBody::Full(Some(copy)), made)
            }
            (_, plain) => match body::encode(plain, encoding, self.levels, &self.bytes) {
                Ok(encoded) => (encoded, None),
                // The codec failed on a body known whole: sent plain.
                Err(plain) => return (Response::from_parts(parts, plain), None),
            },
        };
        self.answers[encoding as usize].inc();
        let headers = &mut parts.headers;
        headers.insert(CONTENT_ENCODING, HeaderValue::from_static(encoding.token()));
        headers.remove(ACCEPT_RANGES);
        weaken_etag(headers, stored.map(|(_, own)| own));
        match &body {
            ResponseBody::Full(Some(b)) => {
                let length = length.unwrap_or_else(|| crate::decimal::header_value(b.len() as u64));
                headers.insert(CONTENT_LENGTH, length);
            }
            _ => {
                headers.remove(CONTENT_LENGTH);
            }
        }
        (Response::from_parts(parts, body), made)
    }

    /// Whether an answer with `status` and `headers` (its body `known` long, if known whole)
    /// is one to compress.
    fn qualifies(&self, status: StatusCode, headers: &HeaderMap, known: Option<u64>) -> bool {
        if status.is_informational()
            || status == StatusCode::NO_CONTENT
            || status == StatusCode::NOT_MODIFIED
            || status == StatusCode::PARTIAL_CONTENT
            || headers.contains_key(CONTENT_ENCODING)
            || headers.contains_key(CONTENT_RANGE)
        {
            return false;
        }
        let length = known.or_else(|| {
            headers
                .get(CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok()?.parse().ok())
        });
        if length.is_some_and(|n| n < self.min_bytes || n > self.max_bytes) {
            return false;
        }
        if headers
            .get_all(CACHE_CONTROL)
            .iter()
            .any(|v| list_has(v, "no-transform"))
        {
            return false;
        }
        let Some(kind) = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
            return false;
        };
        let media = kind.split(';').next().unwrap_or("").trim();
        let Some((ty, sub)) = media.split_once('/') else {
            return false;
        };
        self.types.iter().any(|r| r.matches(ty.trim(), sub.trim()))
    }
}

/// The q-values (thousandths, in [`Encoding`]'s order) the client's `Accept-Encoding` gives
/// each encoding, read in one pass: its own entry, else `*`'s, else 0 (no header: all 0, the
/// plain answer).
fn accepted(headers: &HeaderMap) -> [u16; 3] {
    let mut named = [None; 3];
    let mut star = None;
    for value in headers.get_all(ACCEPT_ENCODING) {
        let Ok(value) = value.to_str() else { continue };
        for entry in value.split(',') {
            let mut parts = entry.split(';');
            let coding = parts.next().unwrap_or("").trim();
            let q = parts
                .find_map(|p| {
                    let (k, v) = p.split_once('=')?;
                    k.trim().eq_ignore_ascii_case("q").then(|| qvalue(v.trim()))
                })
                .unwrap_or(Some(1000));
            let Some(q) = q else { continue };
            if coding == "*" {
                star = Some(q);
            } else if let Some(e) = Encoding::from_token(coding) {
                // The first entry naming a coding is the one read.
                named[e as usize].get_or_insert(q);
            }
        }
    }
    named.map(|q| q.or(star).unwrap_or(0))
}

/// A q-value (`0`, `0.5`, `1.000`) in thousandths; `None` if malformed.
fn qvalue(v: &str) -> Option<u16> {
    let (whole, frac) = v.split_once('.').unwrap_or((v, ""));
    if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut thousandths = 0u16;
    for (i, b) in frac.bytes().enumerate() {
        thousandths += u16::from(b - b'0') * [100, 10, 1][i];
    }
    match whole {
        "0" => Some(thousandths),
        "1" if thousandths == 0 => Some(1000),
        _ => None,
    }
}

/// Whether the comma-separated header value `v` lists `token` (case-insensitive).
fn list_has(v: &HeaderValue, token: &str) -> bool {
    v.to_str().is_ok_and(|s| {
        s.split(',')
            .filter_map(|t| t.split('=').next())
            .any(|t| t.trim().eq_ignore_ascii_case(token))
    })
}

/// Whether `headers`' `Vary` lists `Accept-Encoding` (or `*`).
fn vary_listed(headers: &HeaderMap) -> bool {
    headers
        .get_all(VARY)
        .iter()
        .any(|v| list_has(v, "accept-encoding") || list_has(v, "*"))
}

/// Makes a strong `ETag` weak (`"x"` → `W/"x"`): made once for a thread's copy of a stored
/// answer (`own`), kept with it.
fn weaken_etag(headers: &mut HeaderMap, own: Option<&Owned>) {
    let Some(tag) = headers.get(ETAG) else {
        return;
    };
    let weak = match own.and_then(|own| own.0.as_deref()) {
        Some(own) => own.weak_etag.get_or_init(|| weak_of(tag)).clone(),
        None => weak_of(tag),
    };
    if let Some(weak) = weak {
        headers.insert(ETAG, weak);
    }
}

/// The weak form of the strong `ETag` `tag` (`None`: it is not strong).
fn weak_of(tag: &HeaderValue) -> Option<HeaderValue> {
    if tag.as_bytes().first() != Some(&b'"') {
        return None;
    }
    let mut weak = Vec::with_capacity(tag.len() + 2);
    weak.extend_from_slice(b"W/");
    weak.extend_from_slice(tag.as_bytes());
    HeaderValue::from_maybe_shared(bytes::Bytes::from(weak)).ok()
}

#[cfg(test)]
mod tests;
