//! The request target as Tern reads it: one normal form of the path, which routing, the
//! guests and everything later keyed on a URL use, so that Tern reads a URL as the proxies and
//! caches in front of it do (RFC 3986 §6.2.2, RFC 9110 §4.2.3).
//!
//! - Percent-encoded unreserved characters (`A-Z a-z 0-9 - . _ ~`) are decoded: `/h%65llo` is
//!   `/hello`. Other percent-encodings stay encoded, their hex digits in upper case (`%2f` ->
//!   `%2F` is refused below; `%c3%a9` -> `%C3%A9`); an encoded `%` (`%25`) stays `%25`, so
//!   nothing is ever decoded twice.
//! - Dot segments are removed after that decoding (`/./a`, `/x/../a` and `/%2e%2e/a` are
//!   `/a`); `..` above the root stays at the root.
//! - Empty segments are merged (`//a///b` is `/a/b`), as nginx does by default.
//! - Refused with `400`, because proxies disagree on them: an encoded slash (`%2F`), which
//!   some decode into a separator and some do not, and a backslash, raw (not allowed in a URI
//!   at all) or encoded (`%5C`), which some servers and browsers read as `/`; a `%` not
//!   followed by two hex digits.
//!
//! The query is left as sent.

use std::borrow::Cow;

/// Why a request's path cannot be given one meaning (answered with `400`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// `%` not followed by two hex digits.
    #[error("a `%` in the path is not followed by two hex digits")]
    MalformedEscape,
    /// `%2F`: a slash or not, depending on who reads it.
    #[error(
        "an encoded slash (%2F) in the path is ambiguous: proxies differ on whether it separates \
         segments; send `/` or encode the segment differently"
    )]
    EncodedSlash,
    /// `\` or `%5C`: some servers and browsers read a backslash as a separator.
    #[error(
        "a backslash (`\\` or %5C) in the path is ambiguous: some servers and browsers read it \
         as `/`"
    )]
    Backslash,
}

/// Whether `b` is an unreserved character (RFC 3986 §2.3).
fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// The normal form of `path` (an origin-form path: it starts with `/`; anything else is
/// returned unchanged). Borrowed when it is normal already, which is the common case and
/// costs one scan.
///
/// # Errors
/// [`PathError`] for a path with no single meaning.
pub fn normalize(path: &str) -> Result<Cow<'_, str>, PathError> {
    let b = path.as_bytes();
    if b.first() != Some(&b'/') {
        return Ok(Cow::Borrowed(path));
    }
    // Only a `%` or `\`, or a `/` followed by `/` or `.`, can make a path not normal.
    let plain = b.iter().enumerate().all(|(i, &c)| {
        c != b'%' && c != b'\\' && !(c == b'/' && matches!(b.get(i + 1), Some(b'/' | b'.')))
    });
    if plain {
        return Ok(Cow::Borrowed(path));
    }
    // 1. Percent-encodings: unreserved decoded, the others upper-cased.
    let mut decoded = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' {
            return Err(PathError::Backslash);
        }
        if b[i] != b'%' {
            decoded.push(b[i]);
            i += 1;
            continue;
        }
        let (Some(hi), Some(lo)) = (
            b.get(i + 1).copied().and_then(hex),
            b.get(i + 2).copied().and_then(hex),
        ) else {
            return Err(PathError::MalformedEscape);
        };
        match hi << 4 | lo {
            b'/' => return Err(PathError::EncodedSlash),
            b'\\' => return Err(PathError::Backslash),
            c if unreserved(c) => decoded.push(c),
            _ => {
                decoded.push(b'%');
                decoded.extend_from_slice(&b[i + 1..i + 3]);
                let n = decoded.len();
                decoded[n - 2..].make_ascii_uppercase();
            }
        }
        i += 3;
    }
    // Only ASCII was changed or inserted: still UTF-8 (as `path` was).
    let decoded = String::from_utf8(decoded).expect("ASCII edits keep UTF-8");
    // 2. Dot segments and empty segments.
    let mut segments: Vec<&str> = Vec::new();
    let mut trailing = false;
    for seg in decoded[1..].split('/') {
        trailing = matches!(seg, "" | "." | "..");
        match seg {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    let mut out = String::with_capacity(decoded.len());
    for s in &segments {
        out.push('/');
        out.push_str(s);
    }
    if trailing || segments.is_empty() {
        out.push('/');
    }
    Ok(if out == path {
        Cow::Borrowed(path)
    } else {
        Cow::Owned(out)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(p: &str) -> Result<String, PathError> {
        normalize(p).map(Cow::into_owned)
    }

    #[test]
    fn normal_paths_are_borrowed_as_they_are() {
        for p in [
            "/",
            "/hello",
            "/a/b/",
            "/a.b/c..d/.e",
            "/%C3%A9",
            "/x?",
            "*",
            "",
        ] {
            assert!(
                matches!(normalize(p), Ok(Cow::Borrowed(q)) if q == p),
                "{p}"
            );
        }
    }

    #[test]
    fn unreserved_escapes_are_decoded_others_kept_in_upper_case() {
        assert_eq!(n("/h%65llo").unwrap(), "/hello");
        assert_eq!(n("/%7Euser/%2d%2E%5f").unwrap(), "/~user/-._");
        assert_eq!(n("/caf%c3%a9").unwrap(), "/caf%C3%A9");
        assert_eq!(
            n("/100%25").unwrap(),
            "/100%25",
            "an encoded % stays encoded"
        );
        assert_eq!(n("/a%20b").unwrap(), "/a%20b");
        assert_eq!(n("/%00").unwrap(), "/%00");
    }

    #[test]
    fn dot_and_empty_segments_are_removed() {
        for (from, to) in [
            ("/./hello", "/hello"),
            ("/x/../hello", "/hello"),
            ("/cgi/../hello", "/hello"),
            ("/hello/../cgi/env", "/cgi/env"),
            ("/../hello", "/hello"),
            ("/a/b/../../../c", "/c"),
            ("/%2e%2e/hello", "/hello"),
            ("/a/%2E/b", "/a/b"),
            ("/a/.", "/a/"),
            ("/a/..", "/"),
            ("/a/b/..", "/a/"),
            ("/.", "/"),
            ("/..", "/"),
            ("//hello", "/hello"),
            ("/a///b//", "/a/b/"),
            ("//", "/"),
            ("/a/.b/..c", "/a/.b/..c"),
        ] {
            assert_eq!(n(from).unwrap(), to, "{from}");
        }
    }

    #[test]
    fn ambiguous_paths_are_refused() {
        assert_eq!(n("/a%2Fb"), Err(PathError::EncodedSlash));
        assert_eq!(n("/a%2fb"), Err(PathError::EncodedSlash));
        assert_eq!(n("/a%5cb"), Err(PathError::Backslash));
        assert_eq!(n("/a\\b"), Err(PathError::Backslash));
        assert_eq!(n("/hello\\..\\cgi"), Err(PathError::Backslash));
        for bad in ["/%", "/%4", "/%zz", "/a%g0", "/%%41"] {
            assert_eq!(n(bad), Err(PathError::MalformedEscape), "{bad}");
        }
    }
}
