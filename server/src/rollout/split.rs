//! Which of a tenant's two versions a request goes to.

use std::net::IpAddr;

use http::{HeaderMap, HeaderName};

use super::plan::{BUCKETS, Key, Plan};

/// `Tern-Version: <version>` (`current`, `candidate`, or a version id of at least 8 digits):
/// a request for one version of a tenant that has a candidate (a smoke test of a candidate at
/// 0 %), from the rollout's `override_from` networks or with [`TERN_VERSION_TOKEN`].
pub static TERN_VERSION: HeaderName = HeaderName::from_static("tern-version");

/// `Tern-Version-Token: <token>`: the operator's token, or a scoped token with the `deploy`
/// scope for the tenant, for [`TERN_VERSION`]. Never reaches a guest.
pub static TERN_VERSION_TOKEN: HeaderName = HeaderName::from_static("tern-version-token");

/// Which version serves a request: the tenant's current one, or its candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Role {
    /// The version that serves everything a candidate does not.
    #[default]
    Current = 0,
    /// The version in rollout.
    Candidate = 1,
}

impl Role {
    /// Its name: the `deployment` label of `tern_requests_total` and the phase histograms.
    pub fn name(self) -> &'static str {
        match self {
            Self::Current => "current",
            Self::Candidate => "candidate",
        }
    }
}

/// How one candidate splits its tenant's clients, made from its [`Plan`] when the table that
/// serves it is built (a share change builds a new one).
#[derive(Debug)]
pub struct Split {
    /// Makes each rollout's buckets its own: the same clients are not every rollout's first.
    salt: u64,
    share: u16,
    key: Key,
    override_from: crate::context::TrustedProxies,
}

impl Split {
    /// The split of `tenant`'s candidate `version` by `plan`.
    ///
    /// # Errors
    /// An `override_from` entry that is not an address or a network.
    pub fn new(tenant: &str, version: &str, plan: &Plan) -> Result<Self, String> {
        let salt = fnv(
            fnv(FNV_OFFSET, tenant.as_bytes()) ^ 0xff,
            version.as_bytes(),
        );
        Ok(Self {
            salt,
            share: if plan.aborted.is_some() {
                0
            } else {
                plan.share
            },
            key: plan.key.clone(),
            override_from: crate::context::TrustedProxies::parse(&plan.override_from)?,
        })
    }

    /// The share in effect (0 once aborted), in hundredths of a percent.
    pub fn share(&self) -> u16 {
        self.share
    }

    /// The bucket (0-9,999) of a key's bytes.
    pub fn bucket(&self, key: &[u8]) -> u16 {
        let h = mix(fnv(self.salt, key));
        // The high bits of h × 10,000: uniform, unlike `h % 10_000`'s slight bias.
        ((u128::from(h) * u128::from(BUCKETS)) >> 64) as u16
    }

    /// The version a request with `headers` from `client` gets.
    pub fn role(&self, headers: &HeaderMap, client: IpAddr) -> Role {
        match self.share {
            0 => return Role::Current,
            BUCKETS.. => return Role::Candidate,
            _ => {}
        }
        let bucket = match &self.key {
            Key::Client => self.client_bucket(client),
            Key::Header(name) => match headers.get(name) {
                Some(v) => self.bucket(v.as_bytes()),
                None => self.client_bucket(client),
            },
            Key::Cookie(name) => match cookie(headers, name) {
                Some(v) => self.bucket(v),
                None => self.client_bucket(client),
            },
        };
        if bucket < self.share {
            Role::Candidate
        } else {
            Role::Current
        }
    }

    fn client_bucket(&self, client: IpAddr) -> u16 {
        match client {
            IpAddr::V4(a) => self.bucket(&a.octets()),
            IpAddr::V6(a) => self.bucket(&a.octets()),
        }
    }

    /// Whether `client` may ask for a version without a token.
    pub fn may_override(&self, client: IpAddr) -> bool {
        self.override_from.contains(client)
    }
}

/// The value of cookie `name` in the request's `Cookie` headers.
fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a [u8]> {
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b';'))
        .find_map(|pair| {
            let pair = pair.trim_ascii();
            let eq = pair.iter().position(|&b| b == b'=')?;
            (pair[..eq].trim_ascii() == name.as_bytes()).then(|| pair[eq + 1..].trim_ascii())
        })
        .filter(|v| !v.is_empty())
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a over `bytes` from `h`: the same on every replica and every build (a process's
/// random hasher would split one client differently on two replicas).
fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// A finaliser that spreads FNV's weak low bits over the whole word.
fn mix(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}
