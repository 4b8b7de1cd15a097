//! `[tenant.compression]`: what operators write.

use serde::{Deserialize, Serialize};

/// Ceiling of `compression.max_bytes` (the largest response body a guest may send).
pub const MAX_BYTES: u64 = 4 * 1024 * 1024 * 1024;

/// The types compressed unless `types` says otherwise: text, and the structured and script
/// formats sent as `application/*`, SVG, WebAssembly and uncompressed fonts.
pub const DEFAULT_TYPES: [&str; 15] = [
    "text/*",
    "application/json",
    "application/*+json",
    "application/javascript",
    "application/x-javascript",
    "application/ecmascript",
    "application/xml",
    "application/*+xml",
    "application/x-ndjson",
    "application/wasm",
    "image/svg+xml",
    "image/x-icon",
    "font/ttf",
    "font/otf",
    "application/vnd.ms-fontobject",
];

/// `[tenant.compression]`: the tenant's answers compressed for clients that accept it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CompressionConfig {
    /// Whether answers are compressed (on by default).
    pub enabled: bool,
    /// The encodings offered, the tenant's preference first where the client accepts several
    /// equally (`zstd`, `gzip`, `br`: measured, zstd 3 and gzip 3 compress these bodies as well
    /// as Brotli 4 or better, with less CPU; `cargo bench -p tern --bench compress`).
    pub encodings: Vec<String>,
    /// The media types compressed: `text/html`, `text/*` (a whole type), `application/*+json`
    /// (a structured suffix). Replaces the default list.
    pub types: Vec<String>,
    /// Bodies declared (or known) shorter than this are sent as they are: the framing would
    /// cost more than it saves.
    pub min_bytes: u64,
    /// Bodies declared longer than this are sent as they are (a body of unknown length is
    /// compressed as it streams, whatever its length).
    pub max_bytes: u64,
    /// gzip level (1-9).
    pub gzip_level: u32,
    /// Brotli quality (0-11).
    pub brotli_level: u32,
    /// zstd level (1-19).
    pub zstd_level: u32,
}

impl Default for CompressionConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            encodings: ["zstd", "gzip", "br"].map(String::from).to_vec(),
            types: DEFAULT_TYPES.map(String::from).to_vec(),
            min_bytes: 512,
            max_bytes: 16 * 1024 * 1024,
            gzip_level: 3,
            brotli_level: 4,
            zstd_level: 3,
        }
    }
}

impl CompressionConfig {
    /// Whether it is the default (left out when a tenant's settings are written).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// Checks the encodings, types, sizes and levels.
    ///
    /// # Errors
    /// What is wrong, naming the key.
    pub fn check(&self) -> Result<(), String> {
        if self.encodings.is_empty() && self.enabled {
            return Err(
                "compression.encodings is empty: list zstd, br or gzip, or set enabled = false"
                    .into(),
            );
        }
        for (i, e) in self.encodings.iter().enumerate() {
            if super::encoding::Encoding::from_token(e).is_none() {
                return Err(format!(
                    "compression.encodings: unknown encoding {e:?} (known: zstd, br, gzip)"
                ));
            }
            if self.encodings[..i].contains(e) {
                return Err(format!("compression.encodings lists {e:?} twice"));
            }
        }
        for t in &self.types {
            if TypeRule::parse(t).is_none() {
                return Err(format!(
                    "compression.types: {t:?} is not a media type (`text/html`), a whole type \
                     (`text/*`) or a structured suffix (`application/*+json`)"
                ));
            }
        }
        if self.max_bytes < self.min_bytes || self.max_bytes > MAX_BYTES {
            return Err(format!(
                "compression.max_bytes must be between compression.min_bytes ({}) and {MAX_BYTES}, \
                 not {}",
                self.min_bytes, self.max_bytes
            ));
        }
        for (key, level, range) in [
            ("gzip_level", self.gzip_level, 1..=9),
            ("brotli_level", self.brotli_level, 0..=11),
            ("zstd_level", self.zstd_level, 1..=19),
        ] {
            if !range.contains(&level) {
                return Err(format!(
                    "compression.{key} must be between {} and {}, not {level}",
                    range.start(),
                    range.end()
                ));
            }
        }
        Ok(())
    }
}

/// One entry of `types`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum TypeRule {
    /// `text/html`: the type and the subtype.
    Exact(String, String),
    /// `text/*`: the type, any subtype.
    Type(String),
    /// `application/*+json`: the type, a subtype with this suffix (`+json`).
    Suffix(String, String),
}

impl TypeRule {
    /// Reads a rule (lower-cased).
    pub(super) fn parse(rule: &str) -> Option<Self> {
        let rule = rule.trim().to_ascii_lowercase();
        let (ty, sub) = rule.split_once('/')?;
        let token = |s: &str| {
            !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$&-^_.+".contains(&b))
        };
        if !token(ty) {
            return None;
        }
        if sub == "*" {
            return Some(Self::Type(ty.to_owned()));
        }
        if let Some(suffix) = sub.strip_prefix("*+") {
            return token(suffix).then(|| Self::Suffix(ty.to_owned(), format!("+{suffix}")));
        }
        token(sub).then(|| Self::Exact(ty.to_owned(), sub.to_owned()))
    }

    /// Whether the media type `ty`/`sub` matches (in any case).
    pub(super) fn matches(&self, ty: &str, sub: &str) -> bool {
        match self {
            Self::Exact(t, s) => t.eq_ignore_ascii_case(ty) && s.eq_ignore_ascii_case(sub),
            Self::Type(t) => t.eq_ignore_ascii_case(ty),
            Self::Suffix(t, suffix) => {
                t.eq_ignore_ascii_case(ty)
                    && sub.len() >= suffix.len()
                    && sub.as_bytes()[sub.len() - suffix.len()..]
                        .eq_ignore_ascii_case(suffix.as_bytes())
            }
        }
    }
}
