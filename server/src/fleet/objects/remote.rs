//! The registry's objects in a store: the index, tenant records, blobs, artifacts, and the
//! compare-and-swap writes whose change ids are read back when a reply was lost.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use object_store::path::Path;
use object_store::{GetOptions, ObjectStore, ObjectStoreExt, PutMode, PutOptions, UpdateVersion};

/// The registry name of the blob `hash`.
fn blob_name(hash: &str) -> String {
    format!("blobs/{hash}")
}

/// The SHA-256 of `bytes` (modules and archives of up to `max_upload_bytes`), off the reactor.
async fn digest(bytes: bytes::Bytes) -> Result<String, RemoteError> {
    use sha2::Digest;
    tokio::task::spawn_blocking(move || crate::hex::encode(&sha2::Sha256::digest(&bytes)))
        .await
        .map_err(|e| RemoteError::Unreachable(e.to_string()))
}

/// Why a registry object could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// The store could not be reached or refused the request (credentials, network).
    #[error("the registry store is unreachable: {0}")]
    Unreachable(String),
    /// Another writer changed the object first: the conditional write was refused and can
    /// no longer be applied (the object moved past the version it was conditional on).
    #[error("{0}")]
    Conflict(String),
    /// A conditional write was sent and the store's answers never told whether it was
    /// applied (its reply was lost and the object could not be read back): the change may be
    /// in the registry or not.
    #[error("{0}")]
    Unknown(String),
    /// The object's bytes do not match its name: damaged or tampered with; never used.
    #[error("{0}")]
    Damaged(String),
    /// No such object.
    #[error("{0}")]
    NotFound(String),
}

/// The registry's objects in a store, under a prefix:
///
/// ```text
/// <prefix>/index.json          each tenant's record by name, and the revision: the one object
///                              every replica watches, replaced only by compare-and-swap
/// <prefix>/tenants/<sha256>.json   a tenant's record (spec, current and previous version),
///                              written once, named by its digest
/// <prefix>/blobs/<sha256>      modules and asset archives, written once, named by their digest
/// <prefix>/artifacts/<sha256>-<engine>.cwasm   compiled modules, written once, signed
/// <prefix>/tokens/<sha256>.json   the scoped admin tokens (digests, never a token), written
///                              once, named by their digest: the index names the current one
/// <prefix>/replicas/<name>.json                what each replica serves
/// <prefix>/certificates/index.json           uploaded and ACME certificates, ACME leases and
///                                              challenges (compare-and-swap), see crate::tls::stored
/// <prefix>/certificates/<sha256>.sealed        a certificate and its key, the key encrypted
/// ```
///
/// A change writes the records it made (a few hundred bytes each) and the index (about 75
/// bytes a tenant); a replica reading a changed index fetches only the records it has not seen.
#[derive(Debug, Clone)]
pub struct Remote {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    /// Tenant records read or written, by digest (those the last index named).
    records: Arc<std::sync::Mutex<HashMap<String, crate::datadir::StoredTenant>>>,
    /// The tokens record last read or written, and its digest.
    tokens: Arc<std::sync::Mutex<Option<(String, crate::access::Tokens)>>>,
}

/// `index.json`: the registry's tenants, each by the digest of its record.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantIndex {
    /// [`INDEX_FORMAT`].
    format: u32,
    /// Counts the changes written (each write adds one).
    revision: u64,
    /// Record digests by tenant name.
    tenants: BTreeMap<String, String>,
    /// The ids of the last changes written ([`record_change`]), oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    changes: Vec<String>,
    /// The digest of the tokens record (`tokens/<sha256>.json`), if there are tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tokens: Option<String>,
}

/// Format version of `index.json`.
const INDEX_FORMAT: u32 = 1;

/// How many change ids a compare-and-swap object remembers: far more than the writes that can
/// land between a replica's write and its reading the object back (seconds).
pub const CHANGES_KEPT: usize = 64;

/// A new change id (128 random bits, hex): recorded in the object a change writes, so the
/// writer recognises its change when it reads the object back after a lost reply.
pub fn change_id() -> String {
    crate::hex::random_id::<16>()
}

/// Adds `id` to the change ids `changes` of an object (keeping the last [`CHANGES_KEPT`]).
pub fn record_change(changes: &mut Vec<String>, id: &str) {
    changes.retain(|c| c != id);
    changes.push(id.to_string());
    let over = changes.len().saturating_sub(CHANGES_KEPT);
    changes.drain(..over);
}

/// The change ids an object of the registry records: every compare-and-swap object is a JSON
/// object with a `changes` list.
#[derive(serde::Deserialize)]
struct Recorded {
    #[serde(default)]
    changes: Vec<String>,
}

/// How many times [`Remote::put_if`] reads an object back (and writes it again while it has
/// not moved) before it calls the write's fate unknown.
const SETTLE_ROUNDS: u32 = 4;

/// The first pause before an object is read back after a failed write (doubled each round).
const SETTLE_PAUSE: std::time::Duration = std::time::Duration::from_millis(200);

/// How many records a replica reads or writes at once.
const PARALLEL_RECORDS: usize = 32;

fn record_name(hash: &str) -> String {
    format!("tenants/{hash}.json")
}

fn tokens_name(hash: &str) -> String {
    format!("tokens/{hash}.json")
}

/// The tokens record as stored (compact JSON) and its digest.
fn tokens_hash(tokens: &crate::access::Tokens) -> (String, Vec<u8>) {
    let bytes = serde_json::to_vec(tokens).expect("tokens serialise");
    let hash = crate::hex::encode(&<sha2::Sha256 as sha2::Digest>::digest(&bytes));
    (hash, bytes)
}

/// A tenant's record as stored (compact JSON) and its digest.
fn record_hash(tenant: &crate::datadir::StoredTenant) -> (String, Vec<u8>) {
    tenant.record()
}

impl Remote {
    /// The registry under `prefix` of `store`.
    pub fn new(store: Arc<dyn ObjectStore>, prefix: Path) -> Self {
        Self {
            store,
            prefix,
            records: Arc::default(),
            tokens: Arc::default(),
        }
    }

    fn cached(&self) -> std::sync::MutexGuard<'_, HashMap<String, crate::datadir::StoredTenant>> {
        self.records.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stores `bytes` under their SHA-256, once (a name that exists already holds the same
    /// bytes), and returns the hash.
    ///
    /// # Errors
    /// [`RemoteError::Unreachable`].
    pub async fn put_blob(&self, bytes: bytes::Bytes) -> Result<String, RemoteError> {
        let hash = digest(bytes.clone()).await?;
        self.put_object(&blob_name(&hash), bytes, true).await?;
        Ok(hash)
    }

    /// Writes `bytes` as `name` under the prefix (`artifacts/...`, `replicas/...`); with
    /// `once`, only if there is no such object yet (one that exists is left as it is).
    ///
    /// # Errors
    /// [`RemoteError::Unreachable`].
    pub async fn put_object(
        &self,
        name: &str,
        bytes: bytes::Bytes,
        once: bool,
    ) -> Result<(), RemoteError> {
        let opts = PutOptions {
            mode: if once {
                PutMode::Create
            } else {
                PutMode::Overwrite
            },
            ..PutOptions::default()
        };
        match self
            .store
            .put_opts(&self.object(name), bytes.into(), opts)
            .await
        {
            Ok(_) | Err(object_store::Error::AlreadyExists { .. }) => Ok(()),
            Err(e) => Err(RemoteError::Unreachable(e.to_string())),
        }
    }

    /// Reads the object `name` under the prefix (`None`: there is none).
    ///
    /// # Errors
    /// [`RemoteError::Unreachable`].
    pub async fn get_object(&self, name: &str) -> Result<Option<bytes::Bytes>, RemoteError> {
        let got = match self.store.get(&self.object(name)).await {
            Ok(r) => r.bytes().await,
            Err(e) => Err(e),
        };
        match got {
            Ok(b) => Ok(Some(b)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(RemoteError::Unreachable(e.to_string())),
        }
    }

    /// Deletes the object `name` under the prefix (one that is not there is no error).
    ///
    /// # Errors
    /// [`RemoteError::Unreachable`].
    pub async fn delete_object(&self, name: &str) -> Result<(), RemoteError> {
        match self.store.delete(&self.object(name)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(RemoteError::Unreachable(e.to_string())),
        }
    }

    /// The objects under `dir` (`replicas`), by name relative to the prefix.
    ///
    /// # Errors
    /// [`RemoteError::Unreachable`].
    pub async fn list(&self, dir: &str) -> Result<Vec<String>, RemoteError> {
        let listed = self
            .store
            .list_with_delimiter(Some(&self.object(dir)))
            .await
            .map_err(|e| RemoteError::Unreachable(e.to_string()))?;
        Ok(listed
            .objects
            .iter()
            .filter_map(|m| self.name_of(&m.location))
            .collect())
    }

    /// The objects under `dir` whose names sort after `after` (a name under `dir`), by name
    /// relative to the prefix, in the order the store lists them (by name).
    ///
    /// # Errors
    /// [`RemoteError::Unreachable`].
    pub async fn list_after(&self, dir: &str, after: &str) -> Result<Vec<String>, RemoteError> {
        use futures_util::TryStreamExt;
        let listed: Vec<object_store::ObjectMeta> = self
            .store
            .list_with_offset(Some(&self.object(dir)), &self.object(after))
            .try_collect()
            .await
            .map_err(|e| RemoteError::Unreachable(e.to_string()))?;
        let mut names: Vec<String> = listed
            .iter()
            .filter_map(|m| self.name_of(&m.location))
            .collect();
        names.sort_unstable();
        Ok(names)
    }

    /// The name under the prefix of the object at `location`.
    fn name_of(&self, location: &Path) -> Option<String> {
        location.prefix_match(&self.prefix).map(|parts| {
            parts
                .map(|p| p.as_ref().to_string())
                .collect::<Vec<_>>()
                .join("/")
        })
    }

    fn object(&self, name: &str) -> Path {
        name.split('/')
            .fold(self.prefix.clone(), |p, part| p.join(part))
    }

    /// Reads the blob `hash` and checks its digest.
    ///
    /// # Errors
    /// [`RemoteError::NotFound`], [`RemoteError::Damaged`] (never returned as good bytes), or
    /// [`RemoteError::Unreachable`].
    pub async fn get_blob(&self, hash: &str) -> Result<bytes::Bytes, RemoteError> {
        if !crate::datadir::is_hash(hash) {
            return Err(RemoteError::NotFound(format!(
                "{hash:?} is not a blob name"
            )));
        }
        let name = blob_name(hash);
        let Some(bytes) = self.get_object(&name).await? else {
            return Err(RemoteError::NotFound(format!(
                "no blob {hash} in the registry"
            )));
        };
        if digest(bytes.clone()).await? != hash {
            return Err(RemoteError::Damaged(format!(
                "registry object {}: its contents do not match their digest (damaged or \
                 tampered with); not used",
                self.object(&name)
            )));
        }
        Ok(bytes)
    }

    /// The manifest and its version, if there is one yet.
    ///
    /// # Errors
    /// [`RemoteError::Unreachable`], or [`RemoteError::Damaged`] if the index or a record is
    /// not one (or a record does not match its digest), [`RemoteError::NotFound`] if a record
    /// the index names is missing.
    pub async fn manifest(
        &self,
    ) -> Result<Option<(crate::datadir::Manifest, UpdateVersion)>, RemoteError> {
        self.manifest_if_changed(None).await
    }

    /// The manifest if the index's version is no longer `seen` (a conditional read: an
    /// unchanged one costs one small request and no body). Only the records not read before
    /// are fetched.
    ///
    /// # Errors
    /// See [`Remote::manifest`].
    pub async fn manifest_if_changed(
        &self,
        seen: Option<&UpdateVersion>,
    ) -> Result<Option<(crate::datadir::Manifest, UpdateVersion)>, RemoteError> {
        let Some((bytes, version)) = self.get_if_changed("index.json", seen).await? else {
            return Ok(None);
        };
        // About 75 KB for 1,000 tenants: parsed off the reactor.
        let parsed =
            tokio::task::spawn_blocking(move || serde_json::from_slice::<TenantIndex>(&bytes))
                .await
                .map_err(|e| RemoteError::Unreachable(e.to_string()))?;
        let index = parsed
            .ok()
            .filter(|i| i.format == INDEX_FORMAT)
            .ok_or_else(|| {
                RemoteError::Damaged(format!(
                    "registry object {}: not an index of format {INDEX_FORMAT}",
                    self.object("index.json")
                ))
            })?;
        // The records this replica has, then those it has not read yet. (Collected here, not
        // looked up in the cache afterwards: a concurrent read may prune it meanwhile.)
        let mut records: HashMap<String, crate::datadir::StoredTenant> = {
            let cached = self.cached();
            index
                .tenants
                .values()
                .filter_map(|h| cached.get(h).map(|r| (h.clone(), r.clone())))
                .collect()
        };
        let mut jobs = tokio::task::JoinSet::new();
        let limit = Arc::new(tokio::sync::Semaphore::new(PARALLEL_RECORDS));
        for hash in index.tenants.values() {
            if records.contains_key(hash) {
                continue;
            }
            let (this, limit, hash) = (self.clone(), limit.clone(), hash.clone());
            jobs.spawn(async move {
                let _permit = limit.acquire_owned().await;
                this.read_record(&hash).await.map(|r| (hash, r))
            });
        }
        while let Some(done) = jobs.join_next().await {
            let (hash, record) = done.map_err(|e| RemoteError::Unreachable(e.to_string()))??;
            records.insert(hash, record);
        }
        let tenants = index
            .tenants
            .iter()
            .map(|(name, hash)| (name.clone(), records[hash].clone()))
            .collect();
        let tokens = match &index.tokens {
            None => crate::access::Tokens::new(),
            Some(hash) => self.read_tokens(hash).await?,
        };
        {
            let mut cached = self.cached();
            cached.retain(|h, _| records.contains_key(h));
            cached.extend(records);
        }
        let manifest = crate::datadir::Manifest {
            format: crate::datadir::MANIFEST_FORMAT,
            revision: index.revision,
            tenants,
            changes: index.changes,
            tokens,
        };
        Ok(Some((manifest, version)))
    }

    /// Takes the records of `manifest` (a snapshot of this registry kept elsewhere) as read,
    /// so reading an index that names them fetches none of them.
    pub async fn remember(&self, manifest: &crate::datadir::Manifest) {
        let tenants = manifest.tenants.clone();
        let hashed = tokio::task::spawn_blocking(move || {
            tenants
                .into_values()
                .map(|t| (record_hash(&t).0, t))
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
        self.cached().extend(hashed);
    }

    /// The tokens record `hash` (the one read last, or read now and checked against its
    /// digest).
    async fn read_tokens(&self, hash: &str) -> Result<crate::access::Tokens, RemoteError> {
        if let Some((seen, tokens)) = &*self.tokens.lock().unwrap_or_else(|e| e.into_inner())
            && seen == hash
        {
            return Ok(tokens.clone());
        }
        let tokens: crate::access::Tokens = self
            .read_checked(&tokens_name(hash), hash, "not a tokens record")
            .await?;
        *self.tokens.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((hash.to_string(), tokens.clone()));
        Ok(tokens)
    }

    /// Reads the tenant record `hash` and checks its digest.
    async fn read_record(&self, hash: &str) -> Result<crate::datadir::StoredTenant, RemoteError> {
        self.read_checked(&record_name(hash), hash, "not a tenant record")
            .await
    }

    /// Reads the JSON object `name`, written once under its digest `hash`, and checks it
    /// (`not_one`: what a body that does not parse is called).
    async fn read_checked<T: serde::de::DeserializeOwned>(
        &self,
        name: &str,
        hash: &str,
        not_one: &str,
    ) -> Result<T, RemoteError> {
        if !crate::datadir::is_hash(hash) {
            return Err(RemoteError::Damaged(format!(
                "registry object {}: {hash:?} is not a record name",
                self.object("index.json")
            )));
        }
        let Some(bytes) = self.get_object(name).await? else {
            return Err(RemoteError::NotFound(format!(
                "registry object {} is missing",
                self.object(name)
            )));
        };
        let damaged = |why: &str| {
            RemoteError::Damaged(format!(
                "registry object {}: {why} (damaged or tampered with); not used",
                self.object(name)
            ))
        };
        if digest(bytes.clone()).await? != hash {
            return Err(damaged("its contents do not match their digest"));
        }
        serde_json::from_slice(&bytes).map_err(|_| damaged(not_one))
    }

    /// Writes `manifest` if the stored one is still `expected` (`None`: if there is none): the
    /// records it names that are not in the registry yet, then the index by compare-and-swap
    /// ([`Remote::put_if`], `change` being the id `manifest.changes` records for this write).
    ///
    /// # Errors
    /// See [`Remote::put_if`]; [`RemoteError::Unreachable`] if a record could not be written
    /// (the index, and so what the registry serves, is unchanged then).
    pub async fn put_manifest(
        &self,
        manifest: &crate::datadir::Manifest,
        expected: Option<&UpdateVersion>,
        change: &str,
    ) -> Result<Written, RemoteError> {
        let copy = manifest.clone();
        let known: std::collections::HashSet<String> = self.cached().keys().cloned().collect();
        // Serialising and hashing every record (a few hundred bytes each) stays off the reactor.
        let (index, new, tokens) = tokio::task::spawn_blocking(move || {
            let tokens = (!copy.tokens.is_empty()).then(|| tokens_hash(&copy.tokens));
            let mut index = TenantIndex {
                format: INDEX_FORMAT,
                revision: copy.revision,
                tenants: BTreeMap::new(),
                changes: copy.changes,
                tokens: tokens.as_ref().map(|(hash, _)| hash.clone()),
            };
            let mut new = Vec::new();
            for (name, tenant) in copy.tenants {
                let (hash, bytes) = record_hash(&tenant);
                if !known.contains(&hash) {
                    new.push((hash.clone(), bytes, tenant));
                }
                index.tenants.insert(name, hash);
            }
            let text = serde_json::to_vec(&index).expect("an index serialises");
            (text, new, tokens)
        })
        .await
        .map_err(|e| RemoteError::Unreachable(e.to_string()))?;
        let mut jobs = tokio::task::JoinSet::new();
        let limit = Arc::new(tokio::sync::Semaphore::new(PARALLEL_RECORDS));
        for (hash, bytes, tenant) in new {
            let (this, limit) = (self.clone(), limit.clone());
            jobs.spawn(async move {
                let _permit = limit.acquire_owned().await;
                this.put_object(&record_name(&hash), bytes.into(), true)
                    .await
                    .map(|()| (hash, tenant))
            });
        }
        while let Some(done) = jobs.join_next().await {
            let (hash, tenant) = done.map_err(|e| RemoteError::Unreachable(e.to_string()))??;
            self.cached().insert(hash, tenant);
        }
        if let Some((hash, bytes)) = tokens {
            let seen = self
                .tokens
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
                .is_some_and(|(h, _)| *h == hash);
            if !seen {
                self.put_object(&tokens_name(&hash), bytes.into(), true)
                    .await?;
                *self.tokens.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some((hash, manifest.tokens.clone()));
            }
        }
        self.put_if("index.json", index.into(), expected, change)
            .await
    }

    /// The object `name` under the prefix and its version, if it is no longer `seen` (`None`:
    /// unchanged, or there is none). With `seen`, a conditional read (`If-None-Match`).
    ///
    /// # Errors
    /// [`RemoteError::Unreachable`].
    pub async fn get_if_changed(
        &self,
        name: &str,
        seen: Option<&UpdateVersion>,
    ) -> Result<Option<(bytes::Bytes, UpdateVersion)>, RemoteError> {
        let opts = GetOptions {
            if_none_match: seen.and_then(|v| v.e_tag.clone()),
            ..GetOptions::default()
        };
        let got = match self.store.get_opts(&self.object(name), opts).await {
            Ok(r) => r,
            Err(object_store::Error::NotFound { .. } | object_store::Error::NotModified { .. }) => {
                return Ok(None);
            }
            Err(e) => return Err(RemoteError::Unreachable(e.to_string())),
        };
        let version = UpdateVersion {
            e_tag: got.meta.e_tag.clone(),
            version: got.meta.version.clone(),
        };
        let bytes = got
            .bytes()
            .await
            .map_err(|e| RemoteError::Unreachable(e.to_string()))?;
        Ok(Some((bytes, version)))
    }

    /// Writes `bytes` as `name` if the stored object is still `expected` (`None`: if there is
    /// none): a compare-and-swap (`If-Match`, `If-None-Match: *`). `bytes` is a JSON object
    /// whose `changes` list records `change` ([`record_change`]).
    ///
    /// A write whose answer is not a success may still have been applied: the store applied
    /// it and its reply was lost, the client sent it again and the store refused the copy
    /// (`412`, as if another writer had come first), or the answer came too late. So a failed
    /// write is settled by reading the object back: if it records `change`, the write was
    /// applied; if the object moved on without it, it never will be (its condition no longer
    /// holds); if the object is still at `expected`, the same write is sent again (it can only
    /// be applied once: both copies are conditional on `expected`), for a few rounds.
    ///
    /// # Errors
    /// [`RemoteError::Conflict`] if another writer changed the object first (nothing was
    /// written, nor can be later), [`RemoteError::Unknown`] if the store's answers never
    /// settled whether it was written.
    pub async fn put_if(
        &self,
        name: &str,
        bytes: bytes::Bytes,
        expected: Option<&UpdateVersion>,
        change: &str,
    ) -> Result<Written, RemoteError> {
        let mode = expected.map_or(PutMode::Create, |v| PutMode::Update(v.clone()));
        let mut pause = SETTLE_PAUSE;
        let mut last = String::new();
        for round in 0..=SETTLE_ROUNDS {
            if round > 0 {
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
            let opts = PutOptions {
                mode: mode.clone(),
                ..PutOptions::default()
            };
            match self
                .store
                .put_opts(&self.object(name), bytes.clone().into(), opts)
                .await
            {
                Ok(r) => return Ok(Written::Exactly(r.into())),
                Err(e) => last = e.to_string(),
            }
            // What the store holds now tells what became of the write.
            match self.get_if_changed(name, None).await {
                Ok(Some((now, version))) => {
                    let recorded = serde_json::from_slice::<Recorded>(&now)
                        .map(|r| r.changes)
                        .unwrap_or_default();
                    match recorded.iter().position(|c| c == change) {
                        // Applied, and nothing since: that version is this write's.
                        Some(i) if i + 1 == recorded.len() => {
                            return Ok(Written::Exactly(version));
                        }
                        Some(_) => return Ok(Written::Followed),
                        None if !expected.is_some_and(|e| same_version(e, &version)) => {
                            return Err(RemoteError::Conflict(
                                "another change to the registry was made first; nothing was \
                                 written (read it again and retry)"
                                    .into(),
                            ));
                        }
                        // Not applied yet and the object has not moved: the write may still
                        // be on its way; sending it again settles it.
                        None => {}
                    }
                }
                // No object yet: a create that was not applied (or not yet).
                Ok(None) if expected.is_none() => {}
                Ok(None) => {
                    return Err(RemoteError::Conflict(
                        "the registry object was removed meanwhile; nothing was written".into(),
                    ));
                }
                Err(e) => last = format!("{last}; reading it back: {e}"),
            }
        }
        Err(RemoteError::Unknown(format!(
            "the store did not confirm the write of {} ({last}), and reading it back did not \
             tell whether it was applied",
            self.object(name)
        )))
    }
}

/// What a successful [`Remote::put_if`] knows of the version it wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Written {
    /// The object's version is the one this write made.
    Exactly(UpdateVersion),
    /// The write was applied (recognised when read back after a lost reply) and other writes
    /// followed it: read the object again for its current version.
    Followed,
}

impl Written {
    /// The version this write made, if the object is still at it.
    pub fn version(self) -> Option<UpdateVersion> {
        match self {
            Self::Exactly(v) => Some(v),
            Self::Followed => None,
        }
    }
}

/// Whether two versions of an object are the same: their ETags, as a `PUT` and a `GET` may
/// quote them differently.
fn same_version(a: &UpdateVersion, b: &UpdateVersion) -> bool {
    matches!((etag(a), etag(b)), (Some(x), Some(y)) if x == y)
}

/// An object version's ETag without the weak prefix and the quotes.
fn etag(v: &UpdateVersion) -> Option<&str> {
    v.e_tag
        .as_deref()
        .map(|t| t.trim_start_matches("W/").trim_matches('"'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::PutPayload;

    fn remote() -> Remote {
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        Remote::new(store, Path::from("fleet"))
    }

    /// Writes `m` as a change of its own over `expected`; the version it made.
    async fn put(
        r: &Remote,
        m: &crate::datadir::Manifest,
        expected: Option<&UpdateVersion>,
    ) -> Result<UpdateVersion, RemoteError> {
        let id = change_id();
        let mut m = m.clone();
        record_change(&mut m.changes, &id);
        let written = r.put_manifest(&m, expected, &id).await?;
        Ok(written.version().expect("nothing wrote in between"))
    }

    #[test]
    fn an_object_remembers_its_last_change_ids_and_a_retry_counts_once() {
        let mut changes = Vec::new();
        for i in 0..CHANGES_KEPT + 5 {
            record_change(&mut changes, &format!("c{i}"));
        }
        assert_eq!(changes.len(), CHANGES_KEPT);
        assert_eq!(changes[0], "c5", "the oldest go first");
        record_change(&mut changes, "c10");
        assert_eq!(changes.len(), CHANGES_KEPT);
        assert_eq!(
            changes.last().unwrap(),
            "c10",
            "a retry moves to the end, once"
        );
        assert_eq!(changes.iter().filter(|c| *c == "c10").count(), 1);
        assert_ne!(change_id(), change_id());
        assert_eq!(change_id().len(), 32);
        // Versions compare by ETag, however quoted.
        let v = |tag: &str| UpdateVersion {
            e_tag: Some(tag.into()),
            version: None,
        };
        assert!(same_version(&v("\"abc\""), &v("abc")));
        assert!(same_version(&v("W/\"abc\""), &v("\"abc\"")));
        assert!(!same_version(&v("\"abc\""), &v("\"abd\"")));
        let none = UpdateVersion {
            e_tag: None,
            version: None,
        };
        assert!(!same_version(&none, &none), "no tag: never the same");
    }

    #[tokio::test]
    async fn blobs_are_written_once_and_read_back_only_with_their_digest() {
        let r = remote();
        let hash = r
            .put_blob(bytes::Bytes::from_static(b"module"))
            .await
            .unwrap();
        assert_eq!(
            r.put_blob(bytes::Bytes::from_static(b"module"))
                .await
                .unwrap(),
            hash
        );
        assert_eq!(&r.get_blob(&hash).await.unwrap()[..], b"module");
        // Tampered with in the store: refused.
        r.store
            .put(
                &r.object(&blob_name(&hash)),
                PutPayload::from_static(b"other"),
            )
            .await
            .unwrap();
        assert!(matches!(
            r.get_blob(&hash).await,
            Err(RemoteError::Damaged(_))
        ));
        let missing = crate::hex::encode(&[0u8; 32]);
        assert!(matches!(
            r.get_blob(&missing).await,
            Err(RemoteError::NotFound(_))
        ));
    }

    #[tokio::test]
    async fn of_two_writers_from_one_manifest_version_one_wins_and_one_is_told() {
        let r = remote();
        assert!(r.manifest().await.unwrap().is_none());
        let mut m = crate::datadir::Manifest::default();
        let v1 = put(&r, &m, None).await.unwrap();
        assert!(matches!(
            put(&r, &m, None).await,
            Err(RemoteError::Conflict(_))
        ));
        let (_, read) = r.manifest().await.unwrap().unwrap();
        assert!(
            r.manifest_if_changed(Some(&read)).await.unwrap().is_none(),
            "unchanged"
        );
        m.format = crate::datadir::MANIFEST_FORMAT;
        let v2 = put(&r, &m, Some(&v1)).await.unwrap();
        let lost = put(&r, &m, Some(&v1)).await;
        assert!(matches!(lost, Err(RemoteError::Conflict(_))), "{lost:?}");
        assert!(
            r.manifest_if_changed(Some(&read)).await.unwrap().is_some(),
            "changed"
        );
        let (_, now) = r.manifest().await.unwrap().unwrap();
        assert_eq!(now.e_tag, v2.e_tag);
    }

    #[tokio::test]
    async fn tokens_travel_as_one_record_read_only_when_it_changed_and_checked() {
        use crate::access::{Scope, StoredToken, TenantPattern};
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let writer = Remote::new(store.clone(), Path::from("fleet"));
        let reader = Remote::new(store.clone(), Path::from("fleet"));
        let mut m = crate::datadir::Manifest::default();
        let v1 = put(&writer, &m, None).await.unwrap();
        assert!(
            writer.list("tokens").await.unwrap().is_empty(),
            "none: no record"
        );
        let token = StoredToken {
            name: "ci".into(),
            digest: "d".repeat(64),
            tenants: vec![TenantPattern::parse("team-a-*").unwrap()],
            scopes: vec![Scope::Deploy],
            created: 1,
            expires: None,
        };
        m.tokens.insert("0123456789abcdef".into(), token);
        m.revision = 1;
        let v2 = put(&writer, &m, Some(&v1)).await.unwrap();
        let (read, _) = reader.manifest().await.unwrap().unwrap();
        assert_eq!(read.tokens, m.tokens);
        // A change of a tenant only: the same tokens record, not written again.
        m.revision = 2;
        let v3 = put(&writer, &m, Some(&v2)).await.unwrap();
        assert_eq!(writer.list("tokens").await.unwrap().len(), 1);
        // Revoked: the index names no record, the reader has none.
        m.tokens.clear();
        m.revision = 3;
        put(&writer, &m, Some(&v3)).await.unwrap();
        assert!(
            reader
                .manifest()
                .await
                .unwrap()
                .unwrap()
                .0
                .tokens
                .is_empty()
        );
        // A record whose bytes do not match its name is refused.
        m.tokens = read.tokens.clone();
        m.revision = 4;
        let (_, now) = writer.manifest().await.unwrap().unwrap();
        put(&writer, &m, Some(&now)).await.unwrap();
        let name = tokens_name(&tokens_hash(&m.tokens).0);
        store
            .put(
                &Path::from(format!("fleet/{name}")),
                PutPayload::from_static(b"{}"),
            )
            .await
            .unwrap();
        let e = Remote::new(store.clone(), Path::from("fleet"))
            .manifest()
            .await
            .unwrap_err();
        assert!(
            matches!(&e, RemoteError::Damaged(m) if m.contains("do not match their digest")),
            "{e}"
        );
    }

    #[tokio::test]
    async fn a_change_writes_and_a_reader_fetches_only_the_records_it_changed() {
        use crate::datadir::{Manifest, StoredTenant, TenantSpec};
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let writer = Remote::new(store.clone(), Path::from("fleet"));
        let reader = Remote::new(store.clone(), Path::from("fleet"));
        let tenant = |created_at| StoredTenant {
            spec: TenantSpec::default(),
            current: None,
            previous: None,
            candidate: None,
            created_at,
            id: None,
            variables: std::collections::BTreeMap::new(),
        };
        let mut m = Manifest::default();
        for (i, name) in ["a", "b", "c"].into_iter().enumerate() {
            m.set(name, Some(tenant(i as u64)));
        }
        let v1 = put(&writer, &m, None).await.unwrap();
        assert_eq!(writer.list("tenants").await.unwrap().len(), 3);
        let (read, seen) = reader.manifest().await.unwrap().unwrap();
        assert_eq!(read.tenants, m.tenants);

        // One tenant changes: one new record; the reader fetches it alone (the others it has).
        m.set("b", Some(tenant(7)));
        m.revision = 1;
        let v2 = put(&writer, &m, Some(&v1)).await.unwrap();
        let records = writer.list("tenants").await.unwrap();
        assert_eq!(records.len(), 4, "records are written once: {records:?}");
        let old_a = record_name(&record_hash(&tenant(0)).0);
        store
            .delete(&Path::from(format!("fleet/{old_a}")))
            .await
            .unwrap();
        let (read, _) = reader
            .manifest_if_changed(Some(&seen))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            read.tenants, m.tenants,
            "a's record came from the reader's cache"
        );
        assert_eq!(read.revision, 1);
        let e = Remote::new(store.clone(), Path::from("fleet"))
            .manifest()
            .await
            .unwrap_err();
        assert!(
            matches!(e, RemoteError::NotFound(_)),
            "a fresh reader needs it: {e}"
        );
        let restarted = Remote::new(store.clone(), Path::from("fleet"));
        restarted.remember(&read).await;
        assert_eq!(
            restarted.manifest().await.unwrap().unwrap().0.tenants,
            m.tenants,
            "a reader that remembers its snapshot needs none"
        );

        // A record whose bytes do not match its name is refused.
        m.set("d", Some(tenant(9)));
        m.revision = 2;
        put(&writer, &m, Some(&v2)).await.unwrap();
        let d = record_name(&record_hash(&tenant(9)).0);
        store
            .put(
                &Path::from(format!("fleet/{d}")),
                PutPayload::from_static(b"{}"),
            )
            .await
            .unwrap();
        let e = reader.manifest().await.unwrap_err();
        assert!(
            matches!(&e, RemoteError::Damaged(m) if m.contains("do not match their digest")),
            "{e}"
        );
    }
}
