//! The secrets key: what seals a tenant's secret variables at rest (in the data directory's
//! manifest and in a fleet's registry) with AES-256-GCM, bound to the tenant and the name, and
//! what their digests are keyed with.
//!
//! The key is the operator's: `TERN_SECRETS_KEY` (64 hex digits), else the file
//! `server.secrets_key_file` names; with neither, a single server makes one in its data
//! directory (`secrets-key`, mode 0600) and keeps it; a fleet's replica has none (every
//! replica must open what any replica sealed, so a key of its own would not do): it serves,
//! and refuses to set or read secrets until it is given the fleet's key. It is not the admin token, which can rotate
//! without touching a secret. To rotate the key itself, the old one is given as the previous
//! key (`TERN_SECRETS_KEY_PREVIOUS`, `server.secrets_previous_key_file`): what it sealed is
//! opened with it until `tern secret reseal` seals everything again under the new one.

use std::path::{Path, PathBuf};

use aws_lc_rs::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use aws_lc_rs::hmac;

use super::value::Secret;

/// Why a fleet's replica without the fleet's secrets key neither sets nor reads secrets.
pub const NO_KEY: &str = "this replica has no secrets key: the replicas of a fleet share one, \
     given to each as TERN_SECRETS_KEY (64 hex digits, e.g. from `openssl rand -hex 32`) or \
     server.secrets_key_file; plain variables need none";

/// The start of every sealed value, before the sealing key's id.
const FORMAT: &str = "v1";

/// A secrets key and, during a rotation, the previous one.
pub struct SecretsKey {
    current: Derived,
    previous: Option<Derived>,
    /// Where it came from, for messages (never the key).
    pub source: String,
}

impl std::fmt::Debug for SecretsKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretsKey")
            .field("id", &self.current.id)
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

/// The keys one root key gives: sealing, digests and its public id.
struct Derived {
    seal: LessSafeKey,
    digest: hmac::Key,
    /// 8 hex digits naming the key in what it sealed (not secret: derived one-way).
    id: String,
}

impl Derived {
    fn of(root: &[u8; 32]) -> Self {
        let root = hmac::Key::new(hmac::HMAC_SHA256, root);
        let derive = |what: &str| hmac::sign(&root, what.as_bytes());
        let seal = derive("tern secrets: seal");
        let digest = derive("tern secrets: digest");
        let id = crate::hex::encode(&derive("tern secrets: id").as_ref()[..4]);
        Self {
            seal: LessSafeKey::new(
                UnboundKey::new(&AES_256_GCM, seal.as_ref()).expect("a 32-byte key"),
            ),
            digest: hmac::Key::new(hmac::HMAC_SHA256, digest.as_ref()),
            id,
        }
    }
}

/// What a sealed value is bound to: it opens only as the same tenant's same name.
fn aad(tenant: &str, name: &str) -> Vec<u8> {
    format!("tern variable\0{tenant}\0{name}").into_bytes()
}

impl SecretsKey {
    /// A key from its 32 bytes (and a previous one).
    pub fn new(current: &[u8; 32], previous: Option<&[u8; 32]>, source: String) -> Self {
        Self {
            current: Derived::of(current),
            previous: previous.map(Derived::of),
            source,
        }
    }

    /// The key the server is configured with (see the module docs); `fleet`: the server
    /// shares a registry, where a key of its own would open nothing the others sealed (then
    /// `None` without a configured key).
    ///
    /// # Errors
    /// A key that is not 64 hex digits, a file that cannot be read, or a key that cannot be
    /// made.
    pub fn load(
        key_file: &str,
        previous_file: &str,
        data_dir: &Path,
        fleet: bool,
    ) -> anyhow::Result<Option<Self>> {
        let (current, source) = match configured("TERN_SECRETS_KEY", key_file)? {
            Some(found) => found,
            None if fleet => return Ok(None),
            None => (
                own_key(data_dir)?,
                "the data directory's secrets-key".into(),
            ),
        };
        let previous = configured("TERN_SECRETS_KEY_PREVIOUS", previous_file)?.map(|(k, _)| k);
        Ok(Some(Self::new(&current, previous.as_ref(), source)))
    }

    /// The current key's id.
    pub fn id(&self) -> &str {
        &self.current.id
    }

    /// `value` sealed for `tenant`'s variable `name`: `v1.<key id>.<hex of nonce and
    /// ciphertext>`.
    pub fn seal(&self, tenant: &str, name: &str, value: &str) -> String {
        let mut nonce = [0u8; NONCE_LEN];
        aws_lc_rs::rand::fill(&mut nonce).expect("the system's random source");
        let mut body = value.as_bytes().to_vec();
        self.current
            .seal
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad(tenant, name)),
                &mut body,
            )
            .expect("sealing cannot fail for this size");
        let mut bytes = nonce.to_vec();
        bytes.extend_from_slice(&body);
        format!(
            "{FORMAT}.{}.{}",
            self.current.id,
            crate::hex::encode(&bytes)
        )
    }

    /// Whether `sealed` was sealed under the current key.
    pub fn is_current(&self, sealed: &str) -> bool {
        sealed
            .strip_prefix(FORMAT)
            .and_then(|s| s.strip_prefix('.'))
            .and_then(|s| s.split_once('.'))
            .is_some_and(|(id, _)| id == self.current.id)
    }

    /// The secret `sealed` holds, sealed for `tenant`'s `name`.
    ///
    /// # Errors
    /// Why it cannot be opened: sealed under a key this server does not have (named by its
    /// id), or damaged, or sealed for another tenant or name.
    pub fn open(&self, tenant: &str, name: &str, sealed: &str) -> Result<Secret, String> {
        let damaged = || format!("the sealed value of {name:?} is damaged");
        let rest = sealed
            .strip_prefix(FORMAT)
            .and_then(|s| s.strip_prefix('.'))
            .ok_or_else(damaged)?;
        let (id, hex) = rest.split_once('.').ok_or_else(damaged)?;
        let key = [Some(&self.current), self.previous.as_ref()]
            .into_iter()
            .flatten()
            .find(|k| k.id == id)
            .ok_or_else(|| {
                format!(
                    "{name:?} was sealed under the secrets key {id}, and this server has \
                     {}{}: start it with that key (TERN_SECRETS_KEY, or as \
                     TERN_SECRETS_KEY_PREVIOUS during a rotation)",
                    self.current.id,
                    self.previous
                        .as_ref()
                        .map_or(String::new(), |p| format!(" (previous {})", p.id))
                )
            })?;
        let mut bytes = decode_hex(hex).ok_or_else(damaged)?;
        if bytes.len() < NONCE_LEN {
            return Err(damaged());
        }
        let body = bytes.split_off(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(&bytes).map_err(|_| damaged())?;
        let mut body = body;
        let plain = key
            .seal
            .open_in_place(nonce, Aad::from(aad(tenant, name)), &mut body)
            .map_err(|_| format!("the sealed value of {name:?} does not open (damaged, or sealed for another tenant or name)"))?;
        let text = String::from_utf8(plain.to_vec()).map_err(|_| damaged())?;
        Ok(Secret::new(text))
    }

    /// A digest of `tenant`'s secret `name` holding `value`, to tell whether two values are
    /// the same without showing either: 16 hex digits of an HMAC under a key derived from
    /// the secrets key (so a short secret cannot be guessed from it without that key).
    pub fn digest(&self, tenant: &str, name: &str, value: &str) -> String {
        let mut ctx = hmac::Context::with_key(&self.current.digest);
        ctx.update(&aad(tenant, name));
        ctx.update(b"\0");
        ctx.update(value.as_bytes());
        crate::hex::encode(&ctx.sign().as_ref()[..8])
    }
}

/// A key from the environment variable `var`, else from the file `file` names.
fn configured(var: &str, file: &str) -> anyhow::Result<Option<([u8; 32], String)>> {
    if let Some(text) = std::env::var(var).ok().filter(|t| !t.trim().is_empty()) {
        let key = parse(&text).ok_or_else(|| anyhow::anyhow!("{var} is not 64 hex digits"))?;
        return Ok(Some((key, var.to_string())));
    }
    if file.is_empty() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(file)
        .map_err(|e| anyhow::anyhow!("cannot read the secrets key file {file}: {e}"))?;
    let key = parse(&text).ok_or_else(|| {
        anyhow::anyhow!("the secrets key file {file} does not hold 64 hex digits")
    })?;
    Ok(Some((key, file.to_string())))
}

/// 64 hex digits (either case, surrounding space ignored) as 32 bytes.
fn parse(text: &str) -> Option<[u8; 32]> {
    let text = text.trim().to_ascii_lowercase();
    crate::hex::decode::<32>(text.as_bytes())
}

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    text.as_bytes()
        .chunks_exact(2)
        .map(|pair| crate::hex::decode::<1>(pair).map(|[b]| b))
        .collect()
}

/// The data directory's own key: read if it is there, else made (mode 0600).
fn own_key(data_dir: &Path) -> anyhow::Result<[u8; 32]> {
    let path: PathBuf = data_dir.join("secrets-key");
    match std::fs::read_to_string(&path) {
        Ok(text) => parse(&text).ok_or_else(|| {
            anyhow::anyhow!(
                "{} does not hold 64 hex digits: restore it from a backup (secrets sealed \
                 under it cannot be opened without it)",
                path.display()
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut key = [0u8; 32];
            aws_lc_rs::rand::fill(&mut key).expect("the system's random source");
            crate::artifact::write_atomic_mode(
                &path,
                format!("{}\n", crate::hex::encode(&key)).as_bytes(),
                0o600,
            )
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
            Ok(key)
        }
        Err(e) => Err(anyhow::anyhow!("cannot read {}: {e}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> SecretsKey {
        SecretsKey::new(&[b; 32], None, "test".into())
    }

    #[test]
    fn a_sealed_value_opens_only_as_its_tenant_and_name_under_its_key() {
        let k = key(1);
        let sealed = k.seal("t", "api_key", "sk-live-123");
        assert!(!sealed.contains("sk-live"));
        assert!(k.is_current(&sealed));
        assert_eq!(
            k.open("t", "api_key", &sealed).unwrap().expose(),
            "sk-live-123"
        );
        assert!(k.open("u", "api_key", &sealed).is_err());
        assert!(k.open("t", "other", &sealed).is_err());
        let e = key(2).open("t", "api_key", &sealed).unwrap_err();
        assert!(e.contains(k.id()) && e.contains("TERN_SECRETS_KEY"), "{e}");
        // Two seals of one value differ (a fresh nonce each time).
        assert_ne!(sealed, k.seal("t", "api_key", "sk-live-123"));
        let mut damaged = sealed.clone();
        damaged.pop();
        damaged.push(if sealed.ends_with('0') { '1' } else { '0' });
        assert!(k.open("t", "api_key", &damaged).is_err());
        assert!(k.open("t", "api_key", "v1.x").is_err());
    }

    #[test]
    fn the_previous_key_opens_what_it_sealed_during_a_rotation() {
        let old = key(1);
        let sealed = old.seal("t", "n", "v");
        let rotating = SecretsKey::new(&[2; 32], Some(&[1; 32]), "test".into());
        assert!(!rotating.is_current(&sealed));
        assert_eq!(rotating.open("t", "n", &sealed).unwrap().expose(), "v");
        assert!(rotating.is_current(&rotating.seal("t", "n", "v")));
    }

    #[test]
    fn digests_tell_values_apart_without_showing_them() {
        let k = key(1);
        let d = k.digest("t", "n", "secret");
        assert_eq!(d.len(), 16);
        assert_eq!(d, k.digest("t", "n", "secret"));
        assert_ne!(d, k.digest("t", "n", "secreT"));
        assert_ne!(d, key(2).digest("t", "n", "secret"));
    }

    #[test]
    fn the_data_directorys_key_is_made_once_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let a = own_key(dir.path()).unwrap();
        assert_eq!(own_key(dir.path()).unwrap(), a);
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(dir.path().join("secrets-key"))
                .unwrap()
                .permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
        assert!(parse(&"AB".repeat(32)).is_some());
        assert!(parse("abc").is_none());
    }
}
