//! A fleet's shared registry: the objects every replica reads and writes (see
//! [`super::objects::Remote`]), and how a replica brings what a version needs onto its own disk.
//!
//! A replica serves from its data directory exactly as a single server does; the shared
//! registry is the source of truth it is kept in step with. Before a version is loaded, its
//! compiled artifact is downloaded if another replica published one for this engine (verified,
//! so no replica compiles what another already compiled), else its module, which is compiled
//! here and then published. A deploy publishes its module and artifact before the manifest
//! that names them, so the registry never names an object that is not there.
//!
//! Compiled artifacts are native code, which wasmtime trusts: a replica loads only artifacts
//! signed with a key derived from the fleet's admin token (HMAC-SHA256 over the object's name
//! and bytes), so write access to the bucket alone cannot make a replica run code it did not
//! compile from a module. An artifact that fails the check is counted and compiled here.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use sha2::{Digest, Sha256};
use wasmtime::Engine;

use super::objects::{Remote, RemoteError};
use crate::artifact;
use crate::metrics::Metrics;
use crate::store::{DataDir, Version};

/// How many objects a replica downloads at once.
const PARALLEL_FETCHES: usize = 32;

/// Marks a signed artifact in the registry (format 1): this, the 32-byte tag, the sealed
/// artifact.
const SIGNED_MAGIC: &[u8; 8] = b"TERNSIG1";

/// The shared registry of a fleet, as one replica uses it.
pub struct Fleet {
    /// The registry's objects.
    pub remote: Remote,
    /// The registry's URL (for messages).
    pub url: String,
    /// This replica's name.
    pub replica: String,
    /// How often the registry is checked for changes.
    pub poll: std::time::Duration,
    /// The key artifacts are signed with.
    key: [u8; 32],
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet")
            .field("url", &self.url)
            .field("replica", &self.replica)
            .finish_non_exhaustive()
    }
}

/// What [`Fleet::fetch`] found for the versions it was given.
#[derive(Debug, Default)]
pub struct Fetched {
    /// Modules with no usable artifact in the registry: compiled here, then published.
    pub compile_here: HashSet<String>,
    /// Versions (by id) that cannot be loaded, and why: an object missing, damaged, or the
    /// registry unreachable.
    pub failed: Vec<(String, RemoteError)>,
}

impl Fleet {
    /// The fleet's registry at `url`, as replica `replica`; `admin_token` is the token every
    /// replica shares.
    ///
    /// # Errors
    /// An unusable URL or S3 settings.
    pub fn open(
        url: &str,
        replica: String,
        poll: std::time::Duration,
        admin_token: &str,
    ) -> Result<Self, String> {
        let (store, prefix) = super::objects::open(url)?;
        Ok(Self::new(
            Remote::new(store, prefix),
            url,
            replica,
            poll,
            admin_token,
        ))
    }

    /// The fleet over `remote`.
    pub fn new(
        remote: Remote,
        url: &str,
        replica: String,
        poll: std::time::Duration,
        admin_token: &str,
    ) -> Self {
        let mut key = [0u8; 32];
        key.copy_from_slice(&Sha256::digest(
            [b"tern registry artifact key\0", admin_token.as_bytes()].concat(),
        ));
        Self {
            remote,
            url: url.to_string(),
            replica,
            poll,
            key,
        }
    }

    /// The registry object of the artifact at local `path` (same file name).
    fn artifact_object(path: &Path) -> String {
        format!(
            "artifacts/{}",
            path.file_name().unwrap_or_default().to_string_lossy()
        )
    }

    fn tag(&self, object: &str, sealed: &[u8]) -> [u8; 32] {
        hmac_sha256(&self.key, &[object.as_bytes(), b"\0", sealed])
    }

    /// The signed form of a sealed artifact, stored as `object`.
    fn sign(&self, object: &str, sealed: &[u8]) -> Bytes {
        let mut out = Vec::with_capacity(SIGNED_MAGIC.len() + 32 + sealed.len());
        out.extend_from_slice(SIGNED_MAGIC);
        out.extend_from_slice(&self.tag(object, sealed));
        out.extend_from_slice(sealed);
        out.into()
    }

    /// The sealed artifact in a signed object, if its signature holds.
    fn verify<'a>(&self, object: &str, signed: &'a [u8]) -> Option<&'a [u8]> {
        let rest = signed.strip_prefix(SIGNED_MAGIC.as_slice())?;
        if rest.len() < 32 {
            return None;
        }
        let (tag, sealed) = rest.split_at(32);
        let expected = self.tag(object, sealed);
        // Constant time: every byte is compared.
        let same = tag
            .iter()
            .zip(expected.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0;
        same.then_some(sealed)
    }

    /// Brings what `versions` need onto this replica's disk: the compiled artifact for
    /// `engine` if the registry has a valid one, else the module; and the assets archive.
    /// Nothing already on disk is fetched again.
    pub async fn fetch(
        self: &Arc<Self>,
        store: &DataDir,
        engine: &Engine,
        versions: &[Version],
        metrics: &Metrics,
    ) -> Fetched {
        let mut out = Fetched::default();
        let mut seen = HashSet::new();
        let mut jobs = tokio::task::JoinSet::new();
        let limit = Arc::new(tokio::sync::Semaphore::new(PARALLEL_FETCHES));
        for v in versions {
            if !seen.insert(v.id.clone()) {
                continue;
            }
            let (this, store, engine, metrics) =
                (self.clone(), store.clone(), engine.clone(), metrics.clone());
            let (v, limit) = (v.clone(), limit.clone());
            jobs.spawn(async move {
                let _permit = limit.acquire_owned().await;
                let r = this.fetch_one(&store, &engine, &v, &metrics).await;
                (v, r)
            });
        }
        while let Some(done) = jobs.join_next().await {
            let Ok((v, r)) = done else { continue };
            match r {
                Ok(true) => {
                    out.compile_here.insert(v.module.clone());
                }
                Ok(false) => {}
                Err(e) => out.failed.push((v.id.clone(), e)),
            }
        }
        out
    }

    /// [`Fleet::fetch`] for one version; `true` if its module must be compiled here.
    async fn fetch_one(
        &self,
        store: &DataDir,
        engine: &Engine,
        v: &Version,
        metrics: &Metrics,
    ) -> Result<bool, RemoteError> {
        if let Some(assets) = &v.assets {
            self.fetch_blob(store, assets).await?;
        }
        let path = artifact::artifact_path(engine, &store.artifacts(), &v.module);
        if path.is_file() {
            return Ok(false);
        }
        let object = Self::artifact_object(&path);
        if let Some(signed) = self.remote.get_object(&object).await? {
            match self.verify(&object, &signed) {
                Some(sealed) => {
                    let sealed = Bytes::copy_from_slice(sealed);
                    let written =
                        tokio::task::spawn_blocking(move || artifact::write_atomic(&path, &sealed))
                            .await;
                    if let Ok(Ok(())) = written {
                        metrics
                            .registry_artifacts
                            .with_label_values(&["downloaded"])
                            .inc();
                        return Ok(false);
                    }
                }
                None => {
                    metrics
                        .registry_artifacts
                        .with_label_values(&["refused"])
                        .inc();
                    tracing::warn!(
                        object = %object,
                        "a compiled artifact in the registry failed verification (not signed \
                         with this fleet's key: another admin token, damaged or tampered \
                         with); compiling the module here instead"
                    );
                }
            }
        }
        self.fetch_blob(store, &v.module).await?;
        Ok(true)
    }

    /// Copies blob `hash` from the registry to the data directory, unless it is there.
    ///
    /// # Errors
    /// [`RemoteError`]: missing, damaged (never stored), unreachable; or the disk refused it.
    pub async fn fetch_blob(&self, store: &DataDir, hash: &str) -> Result<(), RemoteError> {
        if store.has_blob(hash) {
            return Ok(());
        }
        let bytes = self.remote.get_blob(hash).await?;
        let store = store.clone();
        tokio::task::spawn_blocking(move || store.put_blob(&bytes))
            .await
            .map_err(|e| RemoteError::Unreachable(e.to_string()))?
            .map_err(|e| RemoteError::Unreachable(format!("cannot store it here: {e}")))?;
        Ok(())
    }

    /// Publishes a module stored here (and its artifact for `engine`, if compiled) so the
    /// other replicas can load it without compiling.
    ///
    /// # Errors
    /// [`RemoteError::Unreachable`], or the local files could not be read.
    pub async fn publish(
        &self,
        store: &DataDir,
        engine: &Engine,
        module: &str,
        metrics: &Metrics,
    ) -> Result<(), RemoteError> {
        let (s, hash) = (store.clone(), module.to_string());
        let path = artifact::artifact_path(engine, &store.artifacts(), module);
        let object = Self::artifact_object(&path);
        let (wasm, sealed) = tokio::task::spawn_blocking(move || {
            let wasm = s.read_blob(&hash).map_err(|e| e.to_string())?;
            Ok::<_, String>((wasm, std::fs::read(&path).ok()))
        })
        .await
        .map_err(|e| RemoteError::Unreachable(e.to_string()))?
        .map_err(RemoteError::NotFound)?;
        self.remote.put_blob(wasm.into()).await?;
        if let Some(sealed) = sealed {
            self.remote
                .put_object(&object, self.sign(&object, &sealed), true)
                .await?;
            metrics
                .registry_artifacts
                .with_label_values(&["published"])
                .inc();
        }
        Ok(())
    }
}

/// HMAC-SHA256 (RFC 2104) of the concatenated `parts` under `key` (32 bytes, shorter than
/// SHA-256's block).
fn hmac_sha256(key: &[u8; 32], parts: &[&[u8]]) -> [u8; 32] {
    let mut block = [0u8; 64];
    block[..32].copy_from_slice(key);
    let pad = |byte: u8| block.map(|b| b ^ byte);
    let mut inner = Sha256::new();
    inner.update(pad(0x36));
    for p in parts {
        inner.update(p);
    }
    let mut outer = Sha256::new();
    outer.update(pad(0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_the_rfc_4231_vector() {
        // RFC 4231 test case 2 uses a 4-byte key ("Jefe"), zero-padded like any short key.
        let mut key = [0u8; 32];
        key[..4].copy_from_slice(b"Jefe");
        let tag = hmac_sha256(&key, &[b"what do ya want ", b"for nothing?"]);
        assert_eq!(
            artifact::hex(&tag),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn artifacts_verify_only_under_their_name_and_key() {
        let store: Arc<dyn object_store::ObjectStore> =
            Arc::new(object_store::memory::InMemory::new());
        let remote = Remote::new(store, object_store::path::Path::from("f"));
        let second = remote.clone();
        let a = Fleet::new(remote, "memory://", "a".into(), Default::default(), "token");
        let signed = a.sign("artifacts/x", b"code");
        assert_eq!(a.verify("artifacts/x", &signed), Some(&b"code"[..]));
        assert_eq!(
            a.verify("artifacts/y", &signed),
            None,
            "moved to another name"
        );
        let mut flipped = signed.to_vec();
        *flipped.last_mut().unwrap() ^= 1;
        assert_eq!(a.verify("artifacts/x", &flipped), None, "changed");
        let other = Fleet::new(second, "memory://", "b".into(), Default::default(), "other");
        assert_eq!(
            other.verify("artifacts/x", &signed),
            None,
            "another fleet's key"
        );
        assert_eq!(a.verify("artifacts/x", b"TERNSIG1short"), None);
    }
}
