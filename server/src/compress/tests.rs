use super::*;
use bytes::Bytes;
use http::Request;
use http_body_util::BodyExt;

fn tenant() -> Compression {
    static METRICS: std::sync::OnceLock<crate::metrics::Metrics> = std::sync::OnceLock::new();
    let metrics = METRICS.get_or_init(|| crate::metrics::Metrics::new(10));
    Compression::prepare(&CompressionConfig::default(), metrics, "t").unwrap()
}

fn choose(accept: &str) -> Choice {
    let req = Request::get("/")
        .header(ACCEPT_ENCODING, accept)
        .body(())
        .unwrap();
    tenant().ask(&req).0
}

#[test]
fn the_best_accepted_encoding_wins_the_tenants_order_among_equals() {
    use Choice::{Encode, Plain};
    use Encoding::{Br, Gzip, Zstd};
    assert_eq!(choose("gzip, deflate, br, zstd"), Encode(Zstd));
    assert_eq!(choose("gzip, deflate, br"), Encode(Gzip));
    assert_eq!(choose("deflate, br"), Encode(Br));
    assert_eq!(choose("gzip"), Encode(Gzip));
    assert_eq!(choose("x-gzip"), Encode(Gzip));
    assert_eq!(choose("GZIP;Q=0.5"), Encode(Gzip));
    assert_eq!(choose("br;q=0.5, gzip;q=0.8"), Encode(Gzip));
    assert_eq!(choose("zstd;q=0, br;q=0.001"), Encode(Br));
    assert_eq!(choose("*"), Encode(Zstd));
    assert_eq!(choose("*;q=0.5, zstd;q=0, br;q=0"), Encode(Gzip));
    assert_eq!(choose("identity"), Plain);
    assert_eq!(choose("identity;q=0"), Plain);
    assert_eq!(choose("deflate"), Plain);
    assert_eq!(choose(""), Plain);
    assert_eq!(choose("gzip;q=0"), Plain);
    // A malformed q-value does not make an encoding acceptable.
    assert_eq!(choose("gzip;q=2, br;q=abc"), Plain);
    let req = Request::get("/").body(()).unwrap();
    assert_eq!(tenant().ask(&req).0, Plain, "no Accept-Encoding");
}

#[test]
fn qvalues_are_read_as_rfc_9110_writes_them() {
    assert_eq!(qvalue("1"), Some(1000));
    assert_eq!(qvalue("1.000"), Some(1000));
    assert_eq!(qvalue("0"), Some(0));
    assert_eq!(qvalue("0.5"), Some(500));
    assert_eq!(qvalue("0.123"), Some(123));
    assert_eq!(qvalue("0.1234"), None);
    assert_eq!(qvalue("1.5"), None);
    assert_eq!(qvalue("-1"), None);
}

#[test]
fn type_rules_match_types_subtypes_and_suffixes() {
    let rule = |r: &str| TypeRule::parse(r).unwrap();
    assert!(rule("text/*").matches("text", "html"));
    assert!(!rule("text/*").matches("image", "png"));
    assert!(rule("application/*+json").matches("application", "ld+json"));
    assert!(!rule("application/*+json").matches("application", "json"));
    assert!(rule("Application/JSON").matches("application", "json"));
    assert!(rule("application/json").matches("Application", "JSON"));
    assert!(rule("application/*+json").matches("application", "LD+JSON"));
    assert!(!rule("application/json").matches("application", "jsonx"));
    assert!(!rule("application/json").matches("applicatio", "njson"));
    for bad in [
        "text",
        "/html",
        "text/",
        "te xt/html",
        "*/*+",
        "text/html;q=1",
    ] {
        assert!(TypeRule::parse(bad).is_none(), "{bad}");
    }
}

#[test]
fn settings_are_checked_naming_the_key() {
    let check = |f: fn(&mut CompressionConfig)| {
        let mut c = CompressionConfig::default();
        f(&mut c);
        c.check()
    };
    assert!(check(|_| {}).is_ok());
    assert!(
        check(|c| {
            c.encodings.clear();
            c.enabled = false;
        })
        .is_ok()
    );
    type Change = fn(&mut CompressionConfig);
    let refused: [(Change, &str); 8] = [
        (|c| c.encodings = vec!["deflate".into()], "deflate"),
        (|c| c.encodings = vec!["br".into(), "br".into()], "twice"),
        (|c| c.encodings.clear(), "enabled = false"),
        (|c| c.types = vec!["html".into()], "compression.types"),
        (|c| c.gzip_level = 10, "gzip_level"),
        (|c| c.brotli_level = 12, "brotli_level"),
        (|c| c.zstd_level = 0, "zstd_level"),
        (|c| c.max_bytes = 10, "max_bytes"),
    ];
    for (change, named) in refused {
        let why = check(change).unwrap_err();
        assert!(why.contains(named), "{why:?} should name {named}");
    }
}

fn answer(kind: &str, body: &[u8], extra: &[(&str, &str)]) -> Response<ResponseBody> {
    let mut resp = Response::new(ResponseBody::Full(Some(Bytes::copy_from_slice(body))));
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_str(kind).unwrap());
    resp.headers_mut()
        .insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
    for (k, v) in extra {
        resp.headers_mut().append(
            http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    resp
}

fn asked(accept: &str, method: http::Method) -> Asked {
    let req = Request::builder()
        .method(method)
        .header(ACCEPT_ENCODING, accept)
        .body(())
        .unwrap();
    tenant().ask(&req)
}

async fn collect(resp: Response<ResponseBody>) -> Bytes {
    resp.into_body().collect().await.unwrap().to_bytes()
}

/// Decodes `data` compressed with `encoding`.
fn decode(encoding: &str, data: &[u8]) -> Vec<u8> {
    use compression_codecs::core::util::PartialBuffer;
    use compression_codecs::{BrotliDecoder, Decode, GzipDecoder, ZstdDecoder};
    fn run(mut d: impl Decode, data: &[u8]) -> Vec<u8> {
        let mut input = PartialBuffer::new(data);
        let mut out = vec![0u8; 64 << 20];
        let mut output = PartialBuffer::new(&mut out[..]);
        assert!(d.decode(&mut input, &mut output).unwrap(), "stream ended");
        let n = output.written_len();
        out.truncate(n);
        out
    }
    match encoding {
        "gzip" => run(GzipDecoder::new(), data),
        "br" => run(BrotliDecoder::new(), data),
        "zstd" => run(ZstdDecoder::new(), data),
        other => panic!("{other}"),
    }
}

fn page(len: usize) -> Vec<u8> {
    let line = b"<li class=\"item\">An item of the list, number ";
    let mut body = Vec::with_capacity(len);
    let mut i = 0u32;
    while body.len() < len {
        body.extend_from_slice(line);
        body.extend_from_slice(i.to_string().as_bytes());
        body.extend_from_slice(b"</li>\n");
        i += 1;
    }
    body.truncate(len);
    body
}

#[tokio::test]
async fn a_text_answer_is_compressed_with_its_headers_made_right() {
    let body = page(20_000);
    for encoding in ["zstd", "br", "gzip"] {
        let resp = tenant().apply(
            asked(encoding, http::Method::GET),
            answer(
                "text/html; charset=utf-8",
                &body,
                &[
                    ("etag", "\"v1\""),
                    ("accept-ranges", "bytes"),
                    ("vary", "cookie"),
                ],
            ),
        );
        let h = resp.headers().clone();
        assert_eq!(h[CONTENT_ENCODING], encoding);
        assert_eq!(h[ETAG], "W/\"v1\"");
        assert!(!h.contains_key(ACCEPT_RANGES));
        let vary: Vec<_> = h.get_all(VARY).iter().collect();
        assert_eq!(vary, ["cookie", "accept-encoding"]);
        let sent = collect(resp).await;
        assert_eq!(h[CONTENT_LENGTH], sent.len().to_string().as_str());
        assert!(sent.len() < body.len() / 4, "{encoding}: {}", sent.len());
        assert_eq!(decode(encoding, &sent), body, "{encoding}");
    }
}

#[tokio::test]
async fn what_must_not_be_compressed_is_sent_as_it_is() {
    let body = page(4000);
    type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], StatusCode);
    let cases: [Case<'_>; 6] = [
        ("image/png", &[], StatusCode::OK),
        ("text/html", &[("content-encoding", "gzip")], StatusCode::OK),
        (
            "text/html",
            &[("cache-control", "public, No-Transform")],
            StatusCode::OK,
        ),
        (
            "text/html",
            &[("content-range", "bytes 0-3999/8000")],
            StatusCode::OK,
        ),
        ("text/html", &[], StatusCode::PARTIAL_CONTENT),
        ("text/html", &[], StatusCode::NOT_MODIFIED),
    ];
    for (kind, extra, status) in cases {
        let mut a = answer(kind, &body, extra);
        *a.status_mut() = status;
        let resp = tenant().apply(asked("gzip", http::Method::GET), a);
        assert!(
            resp.headers()
                .get(CONTENT_ENCODING)
                .is_none_or(|v| v == "gzip")
                && !resp.headers().contains_key(VARY),
            "{kind} {extra:?} {status}"
        );
        assert_eq!(collect(resp).await, body, "{kind} {extra:?} {status}");
    }
    // Too short, and no type at all.
    let resp = tenant().apply(
        asked("gzip", http::Method::GET),
        answer("text/plain", b"hi", &[]),
    );
    assert!(!resp.headers().contains_key(CONTENT_ENCODING));
    let mut untyped = answer("text/plain", &body, &[]);
    untyped.headers_mut().remove(CONTENT_TYPE);
    let resp = tenant().apply(asked("gzip", http::Method::GET), untyped);
    assert!(!resp.headers().contains_key(CONTENT_ENCODING));
}

#[tokio::test]
async fn a_client_taking_no_encoding_gets_the_plain_answer_with_vary() {
    let body = page(4000);
    let resp = tenant().apply(
        asked("identity", http::Method::GET),
        answer("text/css", &body, &[]),
    );
    assert!(!resp.headers().contains_key(CONTENT_ENCODING));
    assert_eq!(resp.headers()[VARY], "accept-encoding");
    assert_eq!(resp.headers()[CONTENT_LENGTH], "4000");
    assert_eq!(collect(resp).await, body);
}

#[tokio::test]
async fn a_head_answer_has_the_get_answers_headers() {
    let get = tenant().apply(
        asked("br", http::Method::GET),
        answer("application/json", &page(4000), &[]),
    );
    let head = tenant().apply(
        asked("br", http::Method::HEAD),
        answer("application/json", &page(4000), &[]),
    );
    assert_eq!(head.headers()[CONTENT_ENCODING], "br");
    assert_eq!(head.headers(), get.headers());
    // Too short to compress for a GET: so for a HEAD too.
    let head = tenant().apply(
        asked("br", http::Method::HEAD),
        answer("text/plain", b"hi", &[]),
    );
    assert!(!head.headers().contains_key(CONTENT_ENCODING));
}

#[tokio::test]
async fn a_large_body_streams_in_pieces_and_decodes_whole() {
    let body = page(1_000_000);
    for encoding in ["zstd", "br", "gzip"] {
        let resp = tenant().apply(
            asked(encoding, http::Method::GET),
            answer("text/plain", &body, &[]),
        );
        assert!(!resp.headers().contains_key(CONTENT_LENGTH), "{encoding}");
        let sent = collect(resp).await;
        assert_eq!(decode(encoding, &sent), body, "{encoding}");
    }
}

#[tokio::test]
async fn each_body_is_counted_once_whole_streamed_or_from_a_copy() {
    let metrics = crate::metrics::Metrics::new(10);
    let c = Compression::prepare(&CompressionConfig::default(), &metrics, "m").unwrap();
    let counted = |body: &str| {
        metrics
            .compression_bytes
            .with_label_values(&["m", body])
            .get()
    };
    // Known whole and small (at once), known whole and large (in pieces), and a cache copy
    // made, then served.
    let small = page(20_000);
    let large = page(300_000);
    let mut sent = 0;
    for body in [&small, &large] {
        let resp = c.apply(
            asked("gzip", http::Method::GET),
            answer("text/html", body, &[]),
        );
        sent += collect(resp).await.len() as u64;
    }
    let copies = Copies::default();
    for _ in 0..2 {
        let (resp, _) = c.apply_stored(
            asked("gzip", http::Method::GET),
            answer("text/html", &small, &[]),
            &copies,
            &Owned::default(),
        );
        sent += collect(resp).await.len() as u64;
    }
    assert_eq!(counted("plain"), 3 * 20_000 + 300_000);
    assert_eq!(counted("sent"), sent);
    let answers = metrics.compressed.with_label_values(&["m", "gzip"]).get();
    assert_eq!(answers, 4);
}

/// A stored answer is judged once per compression settings: the verdict kept for one tenant's
/// settings is not another's (a reload's), and an answer made from the stored one (a `304`, a
/// range) is judged as itself.
#[tokio::test]
async fn a_stored_answers_verdict_is_kept_for_its_settings_only() {
    static METRICS: std::sync::OnceLock<crate::metrics::Metrics> = std::sync::OnceLock::new();
    let metrics = METRICS.get_or_init(|| crate::metrics::Metrics::new(10));
    let html = Compression::prepare(&CompressionConfig::default(), metrics, "v").unwrap();
    let json_only = CompressionConfig {
        types: vec!["application/json".into()],
        ..CompressionConfig::default()
    };
    let json_only = Compression::prepare(&json_only, metrics, "v").unwrap();
    let small = CompressionConfig {
        max_bytes: 1_000,
        ..CompressionConfig::default()
    };
    let small = Compression::prepare(&small, metrics, "v").unwrap();
    let body = page(20_000);
    let copies = Copies::default();
    let stored = |extra: &[(&str, &str)]| answer("text/html", &body, extra);
    let gzip = || asked("gzip", http::Method::GET);
    let encoding = |resp: &Response<ResponseBody>| resp.headers().get(CONTENT_ENCODING).cloned();
    let varies = |resp: &Response<ResponseBody>| resp.headers().get_all(VARY).iter().count();
    for _ in 0..2 {
        let (resp, _) = html.apply_stored(gzip(), stored(&[]), &copies, &Owned::default());
        assert_eq!(encoding(&resp).unwrap(), "gzip");
        assert_eq!(varies(&resp), 1);
    }
    // Other settings over the same stored answer: judged by their own rules, then by the
    // first's again.
    for _ in 0..2 {
        let (resp, _) = json_only.apply_stored(gzip(), stored(&[]), &copies, &Owned::default());
        assert_eq!(encoding(&resp), None, "text/html is not json_only's");
        assert_eq!(varies(&resp), 0);
        let (resp, _) = small.apply_stored(gzip(), stored(&[]), &copies, &Owned::default());
        assert_eq!(encoding(&resp), None, "longer than small's max_bytes");
        let (resp, _) = html.apply_stored(gzip(), stored(&[]), &copies, &Owned::default());
        assert_eq!(encoding(&resp).unwrap(), "gzip");
    }
    // Answers made from the stored one, after its verdict was kept: a `304`, a range's `206`
    // (as the test's answer, without `Content-Range`: its status alone refuses it), and a `416`
    // (refused by its `Content-Range`).
    let made_from_stored = [
        (StatusCode::NOT_MODIFIED, None),
        (StatusCode::PARTIAL_CONTENT, None),
        (StatusCode::RANGE_NOT_SATISFIABLE, Some("bytes */20000")),
    ];
    for (status, range) in made_from_stored {
        let mut made = stored(&[]);
        *made.status_mut() = status;
        if let Some(range) = range {
            made.headers_mut()
                .insert(CONTENT_RANGE, HeaderValue::from_static(range));
        }
        let (resp, _) = html.apply_stored(gzip(), made, &copies, &Owned::default());
        assert_eq!(encoding(&resp), None, "{status}");
    }
    // The verdict is kept, not judged again: the cache never changes a stored answer under its
    // copies, so an answer that would be judged otherwise shows which was used.
    let kept = Copies::default();
    let (resp, _) = html.apply_stored(gzip(), stored(&[]), &kept, &Owned::default());
    assert_eq!(encoding(&resp).unwrap(), "gzip");
    let image = answer("image/png", &body, &[]);
    let (resp, _) = html.apply_stored(gzip(), image, &kept, &Owned::default());
    assert_eq!(encoding(&resp).unwrap(), "gzip", "the kept verdict");
    // A stored answer whose `Vary` lists `Accept-Encoding` keeps it once.
    let listed = Copies::default();
    for _ in 0..2 {
        let (resp, _) = html.apply_stored(
            gzip(),
            stored(&[("vary", "Accept-Encoding")]),
            &listed,
            &Owned::default(),
        );
        assert_eq!(encoding(&resp).unwrap(), "gzip");
        assert_eq!(varies(&resp), 1);
    }
}
