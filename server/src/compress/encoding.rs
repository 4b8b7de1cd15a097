//! The content codings Tern compresses with.

/// A content coding Tern compresses with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// Zstandard (RFC 8878).
    Zstd = 0,
    /// Brotli (RFC 7932).
    Br = 1,
    /// gzip (RFC 1952).
    Gzip = 2,
}

impl Encoding {
    /// The coding named by `token` (as `Accept-Encoding` and the config write it).
    pub fn from_token(token: &str) -> Option<Self> {
        let t = token.trim();
        if t.eq_ignore_ascii_case("zstd") {
            Some(Self::Zstd)
        } else if t.eq_ignore_ascii_case("br") {
            Some(Self::Br)
        } else if t.eq_ignore_ascii_case("gzip") || t.eq_ignore_ascii_case("x-gzip") {
            Some(Self::Gzip)
        } else {
            None
        }
    }

    /// Its `Content-Encoding` token.
    pub fn token(self) -> &'static str {
        match self {
            Self::Zstd => "zstd",
            Self::Br => "br",
            Self::Gzip => "gzip",
        }
    }
}
