//! Who may do what through the admin API: the operator's token (everything) and tokens scoped
//! to some tenants and some actions, made by the operator (`tern token create`).
//!
//! A scoped token is `tern_<id>_<secret>`: its id names its record, its secret (32 random
//! bytes) is shown once and kept only as a SHA-256 digest of the whole token, compared in
//! constant time. Its record says which tenants it reaches (names, or patterns `team-a-*`) and
//! which [`Scope`]s it has; every scope includes reading its tenants.
//!
//! Every endpoint decides with one function, [`decide`], from who asks ([`Principal`]) and what
//! the request is ([`Action`]): a tenant the token does not reach answers as a tenant that does
//! not exist (`404`, the same words), so a token never learns which other tenants exist; a
//! scope it lacks is `403` naming the scope; an endpoint with no scope (certificates, reload,
//! the fleet, reseal, tokens) is the operator's alone.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Most scoped tokens a server (or fleet) keeps: each is checked by id, but every one is in
/// the manifest every replica reads.
pub const MAX_TOKENS: usize = 1000;

/// Most tenants or patterns one token names.
pub const MAX_TOKEN_TENANTS: usize = 100;

/// Failed admin attempts (a wrong, expired or revoked token) answered per client address per
/// second; past it, that address's failing requests are answered `429` until the next second.
/// A valid token is always answered: the operator is never locked out.
pub const FAILURES_PER_SECOND: u32 = 10;

/// Client addresses whose failures are tracked at most (the table never grows past it).
const TRACKED: usize = 4096;

/// The prefix of every scoped token.
const PREFIX: &str = "tern_";

/// What a token may do to its tenants (beside reading them, which every scope includes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// Read its tenants: spec, versions, counts.
    Read,
    /// Create (within its patterns), change, deploy, roll back and delete its tenants; upload
    /// assets.
    Deploy,
    /// Read and change its tenants' plain variables.
    Variables,
    /// Set and delete its tenants' secrets (never read them: nobody can).
    Secrets,
    /// Purge its tenants' caches.
    Purge,
    /// Read its tenants' live logs.
    Logs,
    /// Publish to its tenants' WebSocket channels.
    Publish,
}

impl Scope {
    /// What a variable needs: `secrets` for a secret, `variables` for a plain one.
    pub fn for_variable(secret: bool) -> Self {
        if secret {
            Self::Secrets
        } else {
            Self::Variables
        }
    }

    /// Every scope, in the order `--help` and errors list them.
    pub const ALL: [Self; 7] = [
        Self::Read,
        Self::Deploy,
        Self::Variables,
        Self::Secrets,
        Self::Purge,
        Self::Logs,
        Self::Publish,
    ];

    /// Its name, as tokens and the API spell it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Deploy => "deploy",
            Self::Variables => "variables",
            Self::Secrets => "secrets",
            Self::Purge => "purge",
            Self::Logs => "logs",
            Self::Publish => "publish",
        }
    }

    /// The scope named `s`.
    ///
    /// # Errors
    /// An unknown name, with the names there are.
    pub fn parse(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|scope| scope.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|s| s.name()).collect();
                format!("unknown scope {s:?}: the scopes are {}", names.join(", "))
            })
    }
}

/// A tenant a token reaches: a name, or a prefix and `*` (`team-a-*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantPattern(String);

impl TenantPattern {
    /// `s` as a pattern.
    ///
    /// # Errors
    /// Empty, a bare `*` (the operator's token reaches every tenant), a `*` anywhere but at the
    /// end, or a name a tenant could not have.
    pub fn parse(s: &str) -> Result<Self, String> {
        let name = s.strip_suffix('*').unwrap_or(s);
        if name.is_empty() {
            return Err(format!(
                "tenant pattern {s:?}: a token names its tenants, or a prefix and `*` \
                 (`team-a-*`); only the operator's token reaches every tenant"
            ));
        }
        if !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        {
            return Err(format!(
                "tenant pattern {s:?}: letters, digits, `-`, `_` and `.`, then at most one `*` \
                 at the end"
            ));
        }
        Ok(Self(s.to_string()))
    }

    /// Whether tenant `name` matches.
    pub fn matches(&self, name: &str) -> bool {
        match self.0.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => self.0 == name,
        }
    }

    /// As written.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Serialize for TenantPattern {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for TenantPattern {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// A scoped token as it is stored (in the manifest: the data directory's, or a fleet's
/// registry): never its secret, only the digest of the whole token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoredToken {
    /// A name for people (`ci-deploy`).
    pub name: String,
    /// SHA-256 of the whole token, hex.
    pub digest: String,
    /// The tenants it reaches.
    pub tenants: Vec<TenantPattern>,
    /// What it may do to them.
    pub scopes: Vec<Scope>,
    /// When it was made (Unix seconds).
    pub created: u64,
    /// When it stops working (Unix seconds), if it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<u64>,
}

impl StoredToken {
    /// Whether it reaches tenant `name`.
    pub fn reaches(&self, name: &str) -> bool {
        self.tenants.iter().any(|p| p.matches(name))
    }

    /// Whether it has `scope` (every scope includes [`Scope::Read`]).
    pub fn has(&self, scope: Scope) -> bool {
        scope == Scope::Read || self.scopes.contains(&scope)
    }

    /// Whether it has expired at `now`.
    pub fn expired(&self, now: u64) -> bool {
        self.expires.is_some_and(|at| at <= now)
    }
}

/// The scoped tokens, by id.
pub type Tokens = BTreeMap<String, StoredToken>;

/// Whether one more token fits beside `tokens`.
///
/// # Errors
/// `409` past [`MAX_TOKENS`].
pub fn check_room(tokens: &Tokens) -> Result<(), crate::change::ChangeError> {
    if tokens.len() >= MAX_TOKENS {
        return Err(crate::change::ChangeError::Conflict(format!(
            "{MAX_TOKENS} tokens already: revoke some first (tern token list, tern token revoke \
             ID)"
        )));
    }
    Ok(())
}

/// Who asks.
#[derive(Debug, Clone, Copy)]
pub enum Principal<'a> {
    /// The operator's token: everything.
    Operator,
    /// A scoped token: its id and record.
    Token(&'a str, &'a StoredToken),
}

/// What a request does, as far as who may do it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action<'a> {
    /// Something of tenant `tenant` that needs `scope`.
    Tenant(&'a str, Scope),
    /// Something of no tenant that needs `scope` on at least one (listing tenants, uploading
    /// assets).
    Any(Scope),
    /// The operator's alone (certificates, reload, the fleet, reseal, tokens).
    Operator,
}

/// Why a request is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// `404`, in the words of a tenant that does not exist.
    NoTenant(String),
    /// `403`: the scope the token lacks.
    Scope(Scope),
    /// `403`: the operator's token is needed.
    OperatorOnly,
}

/// The one decision: may `who` do `action`?
///
/// # Errors
/// The [`Refusal`].
pub fn decide(who: Principal<'_>, action: Action<'_>) -> Result<(), Refusal> {
    let Principal::Token(_, token) = who else {
        return Ok(());
    };
    match action {
        Action::Operator => Err(Refusal::OperatorOnly),
        Action::Tenant(name, _) if !token.reaches(name) => {
            Err(Refusal::NoTenant(format!("no tenant {name:?}")))
        }
        Action::Tenant(_, scope) | Action::Any(scope) if !token.has(scope) => {
            Err(Refusal::Scope(scope))
        }
        Action::Tenant(..) | Action::Any(_) => Ok(()),
    }
}

/// Failed attempts by client address, this second.
#[derive(Debug, Default)]
pub struct Failures {
    by_client: std::sync::Mutex<HashMap<IpAddr, (u64, u32)>>,
}

impl Failures {
    /// Counts a failed attempt from `client` at second `now`: whether the address is past
    /// [`FAILURES_PER_SECOND`] (answer `429`). With the table full of this second's addresses,
    /// a new address is past it too.
    pub fn over(&self, client: IpAddr, now: u64) -> bool {
        let mut by_client = self.by_client.lock().unwrap_or_else(|p| p.into_inner());
        if by_client.len() >= TRACKED && !by_client.contains_key(&client) {
            by_client.retain(|_, (second, _)| *second == now);
            if by_client.len() >= TRACKED {
                return true;
            }
        }
        let seen = by_client.entry(client).or_insert((now, 0));
        if seen.0 != now {
            *seen = (now, 0);
        }
        seen.1 += 1;
        seen.1 > FAILURES_PER_SECOND
    }
}

/// A new token: `(id, the whole token, its digest)`, from the kernel's random bytes (8 for
/// the id unless it keeps `id`, as a rotated token does; 32 for the secret).
///
/// # Errors
/// If `/dev/urandom` cannot be read.
pub fn mint(id: Option<&str>) -> std::io::Result<(String, String, String)> {
    let mut bytes = [0u8; 40];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))?;
    let id = id.map_or_else(|| crate::hex::encode(&bytes[..8]), str::to_string);
    let token = format!("{PREFIX}{id}_{}", crate::hex::encode(&bytes[8..]));
    let digest = digest(&token);
    Ok((id, token, digest))
}

/// The stored digest of `token`.
pub fn digest(token: &str) -> String {
    crate::hex::encode(&Sha256::digest(token.as_bytes()))
}

/// The id a scoped token names, if `token` has a scoped token's shape.
pub fn id_of(token: &str) -> Option<&str> {
    let rest = token.strip_prefix(PREFIX)?;
    let (id, secret) = rest.split_once('_')?;
    (id.len() == 16 && secret.len() == 64).then_some(id)
}

/// Whether `token` is the one `stored` was made for (constant time over the digests).
pub fn matches(token: &str, stored: &StoredToken) -> bool {
    same_bytes(digest(token).as_bytes(), stored.digest.as_bytes())
}

/// Whether `given` is the operator's token `operator`, exactly as issued (no whitespace
/// around it forgiven), compared in constant time over their digests.
pub fn is_operator(operator: &str, given: &str) -> bool {
    same_bytes(&Sha256::digest(given), &Sha256::digest(operator))
}

/// Whether `a` and `b` are equal, in time that depends only on their lengths.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A lifetime as written (`90s`, `30m`, `12h`, `30d`), in seconds.
///
/// # Errors
/// Not a positive whole number followed by `s`, `m`, `h` or `d`.
pub fn parse_lifetime(s: &str) -> Result<u64, String> {
    let bad = || format!("expiry {s:?}: a positive number and s, m, h or d (`30d`, `12h`)");
    let unit = match s.chars().last() {
        Some('s') => 1,
        Some('m') => 60,
        Some('h') => 3600,
        Some('d') => 86_400,
        _ => return Err(bad()),
    };
    let n: u64 = s[..s.len() - 1].parse().map_err(|_| bad())?;
    if n == 0 {
        return Err(bad());
    }
    n.checked_mul(unit).ok_or_else(bad)
}

/// A token's name: 1-64 of letters, digits, `-`, `_`, `.`.
///
/// # Errors
/// Otherwise.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty()
        || name.len() > 64
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
    {
        return Err(format!(
            "token name {name:?}: 1-64 letters, digits, `-`, `_` or `.`"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(tenants: &[&str], scopes: &[Scope]) -> StoredToken {
        StoredToken {
            name: "t".into(),
            digest: String::new(),
            tenants: tenants
                .iter()
                .map(|t| TenantPattern::parse(t).unwrap())
                .collect(),
            scopes: scopes.to_vec(),
            created: 0,
            expires: None,
        }
    }

    #[test]
    fn one_decision_for_every_action() {
        let t = token(&["a", "team-*"], &[Scope::Deploy]);
        let who = Principal::Token("id", &t);
        assert_eq!(decide(who, Action::Tenant("a", Scope::Deploy)), Ok(()));
        assert_eq!(decide(who, Action::Tenant("team-x", Scope::Read)), Ok(()));
        assert_eq!(
            decide(who, Action::Tenant("a", Scope::Purge)),
            Err(Refusal::Scope(Scope::Purge))
        );
        // Another tenant reads as one that does not exist, whatever the scope.
        for scope in Scope::ALL {
            assert_eq!(
                decide(who, Action::Tenant("b", scope)),
                Err(Refusal::NoTenant("no tenant \"b\"".into()))
            );
        }
        assert_eq!(decide(who, Action::Operator), Err(Refusal::OperatorOnly));
        assert_eq!(decide(who, Action::Any(Scope::Deploy)), Ok(()));
        assert_eq!(
            decide(who, Action::Any(Scope::Secrets)),
            Err(Refusal::Scope(Scope::Secrets))
        );
        for action in [
            Action::Operator,
            Action::Any(Scope::Secrets),
            Action::Tenant("b", Scope::Deploy),
        ] {
            assert_eq!(decide(Principal::Operator, action), Ok(()));
        }
    }

    #[test]
    fn patterns_and_inputs() {
        let p = TenantPattern::parse("team-a-*").unwrap();
        assert!(p.matches("team-a-") && p.matches("team-a-web"));
        assert!(!p.matches("team-b-web") && !p.matches("team-a"));
        assert!(TenantPattern::parse("exact").unwrap().matches("exact"));
        assert!(!TenantPattern::parse("exact").unwrap().matches("exact2"));
        for bad in ["", "*", "a*b*", "a b", "a/b*"] {
            assert!(TenantPattern::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_lifetime("30d"), Ok(30 * 86_400));
        assert_eq!(parse_lifetime("90s"), Ok(90));
        for bad in ["", "0d", "-1d", "30", "d", "1w", "99999999999999999999d"] {
            assert!(parse_lifetime(bad).is_err(), "{bad:?}");
        }
        assert!(Scope::parse("deploy").is_ok());
        assert!(
            Scope::parse("admin")
                .unwrap_err()
                .contains("deploy, variables")
        );
        assert!(check_name("ci-deploy").is_ok());
        assert!(check_name("").is_err() && check_name(&"x".repeat(65)).is_err());
    }

    #[test]
    fn failures_are_counted_per_address_and_second() {
        let f = Failures::default();
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        for _ in 0..FAILURES_PER_SECOND {
            assert!(!f.over(a, 100));
        }
        assert!(f.over(a, 100), "limit + 1");
        assert!(!f.over(b, 100), "another address");
        assert!(!f.over(a, 101), "the next second");
        for i in 0..TRACKED as u32 {
            f.over(IpAddr::from(i.to_be_bytes()), 200);
        }
        assert!(f.over("10.9.9.9".parse().unwrap(), 200), "a full table");
        assert!(
            !f.over("10.9.9.9".parse().unwrap(), 201),
            "emptied of past seconds"
        );
    }

    #[test]
    fn tokens_are_checked_by_digest() {
        let (id, whole, digest) = mint(None).unwrap();
        assert_eq!(id_of(&whole), Some(id.as_str()));
        let mut t = token(&["a"], &[]);
        t.digest = digest;
        assert!(matches(&whole, &t));
        let mut other = whole.clone();
        other.pop();
        other.push('x');
        assert!(!matches(&other, &t));
        assert_eq!(id_of("tern_short_x"), None);
        assert!(!whole.contains(&t.digest), "the digest is not the token");
        // Rotated: the same id, a new secret; the old token no longer matches.
        let (same, rotated, new_digest) = mint(Some(&id)).unwrap();
        assert_eq!(
            (same.as_str(), id_of(&rotated)),
            (id.as_str(), Some(id.as_str()))
        );
        assert_ne!(rotated, whole);
        t.digest = new_digest;
        assert!(matches(&rotated, &t) && !matches(&whole, &t));
    }
}
