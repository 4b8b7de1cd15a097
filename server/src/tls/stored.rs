//! Certificates kept in the data directory, beside the tenants: uploaded through the admin API
//! (`tern cert put`) or obtained by ACME, with the leases that keep two processes from ordering
//! a certificate for the same name at once.
//!
//! ```text
//! <data-dir>/certificates/index.json       names → hosts, bundle, source, expiry; leases
//! <data-dir>/certificates/<sha256>.pem     a certificate chain and its key (mode 0600)
//! <data-dir>/certificates/.lock            held while the index is read, changed and written
//! ```
//!
//! A bundle is content-addressed and written before the index that names it; the index is
//! written atomically. A bundle whose bytes no longer match its name is refused, never served.
//! Processes sharing the directory change the index one at a time (an exclusive `flock`), so a
//! change never loses another's.
//!
//! In a fleet ([`CertStore::with_registry`]) the registry holds the truth and the directory is
//! this replica's copy of it, served while the registry cannot be read:
//!
//! ```text
//! <prefix>/certificates/index.json         the same index, changed only by compare-and-swap
//! <prefix>/certificates/<sha256>.sealed    a bundle, encrypted under a key derived from the
//!                                          fleet's admin token (the bucket alone reveals no key)
//! ```
//!
//! A change reads the registry's index, applies itself and writes it back if nobody wrote in
//! between (else it is made again on the newer index); every read first brings a changed index
//! and the bundles it names here. ACME leases and challenge answers travel in the index too, so
//! one replica orders a name and every replica answers the CA's validation.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use std::sync::{Arc, Mutex};

use object_store::UpdateVersion;

use super::challenge::Challenge;
use super::table::{Loaded, Table};
use crate::artifact::{self, io_err};
use crate::datadir::{StoreError, is_hash, now, parse_versioned, read_versioned};
use crate::fleet::Fleet;
use crate::fleet::objects::RemoteError;

/// The index's object in a fleet's registry.
const INDEX_OBJECT: &str = "certificates/index.json";

/// How many times a change is made again on a newer index before it gives up.
const CHANGE_ATTEMPTS: usize = 10;

/// Format version of `index.json`.
pub const FORMAT: u32 = 1;

/// Where a stored certificate came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// Uploaded through the admin API.
    Api,
    /// Obtained from the ACME CA.
    Acme,
}

/// One stored certificate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    /// The host names it serves (empty: the default certificate).
    pub hosts: Vec<String>,
    /// SHA-256 of its bundle file.
    pub bundle: String,
    /// Where it came from.
    pub source: Source,
    /// When it expires (Unix seconds).
    pub not_after: i64,
    /// When it was stored (Unix seconds).
    pub stored_at: u64,
}

/// A process's claim to order a certificate for one name, until a time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lease {
    /// The process holding it (random per process).
    pub holder: String,
    /// When it lapses (Unix seconds), so a holder that died does not block the name forever.
    pub until: u64,
}

/// `index.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CertificateIndex {
    /// [`FORMAT`].
    pub format: u32,
    /// By name (an uploaded certificate's name; an ACME certificate's host).
    pub certificates: BTreeMap<String, Record>,
    /// ACME order leases by host name.
    #[serde(default)]
    pub leases: BTreeMap<String, Lease>,
    /// ACME challenges being validated, by host name (only in a fleet's registry).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub challenges: BTreeMap<String, Challenge>,
    /// The ids of the last changes written to a fleet's registry, oldest first
    /// (`fleet::objects::record_change`; empty in one data directory).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<String>,
}

impl Default for CertificateIndex {
    fn default() -> Self {
        Self {
            format: FORMAT,
            certificates: BTreeMap::new(),
            leases: BTreeMap::new(),
            challenges: BTreeMap::new(),
            changes: Vec::new(),
        }
    }
}

impl CertificateIndex {
    /// Takes the lease on `host` for `holder` for `seconds` if nobody else holds it; whether
    /// it did.
    pub fn take_lease(&mut self, host: &str, holder: &str, seconds: u64) -> bool {
        let now = now();
        if let Some(l) = self.leases.get(host)
            && l.holder != holder
            && l.until > now
        {
            return false;
        }
        self.leases.insert(
            host.to_string(),
            Lease {
                holder: holder.to_string(),
                until: now + seconds,
            },
        );
        true
    }

    /// Gives the lease on `host` back if `holder` has it.
    pub fn release_lease(&mut self, host: &str, holder: &str) {
        if self.leases.get(host).is_some_and(|l| l.holder == holder) {
            self.leases.remove(host);
        }
    }
}

/// The certificates directory of a data directory, and in a fleet the registry it copies.
#[derive(Debug, Clone)]
pub struct CertStore {
    dir: PathBuf,
    shared: Option<Arc<Shared>>,
}

/// A fleet's registry, as the certificates use it.
#[derive(Debug)]
struct Shared {
    fleet: Arc<Fleet>,
    /// The runtime the store's requests run on (the store's methods run on blocking threads).
    runtime: tokio::runtime::Handle,
    /// The version of the registry's index copied here last.
    seen: Mutex<Option<UpdateVersion>>,
    /// Whether the last read of the registry failed (logged once until it works again).
    failing: std::sync::atomic::AtomicBool,
}

impl Shared {
    fn run<T>(&self, f: impl std::future::Future<Output = T>) -> T {
        self.runtime.block_on(f)
    }

    fn unavailable(&self, e: &RemoteError) -> StoreError {
        StoreError::Unavailable(match e {
            RemoteError::Unknown(m) => format!(
                "the registry {} did not confirm this change and cannot be read back: it may \
                 have been applied or not ({m}); list the certificates again once it answers",
                self.fleet.url
            ),
            e => format!(
                "the registry {} cannot be reached, nothing changed: {e}",
                self.fleet.url
            ),
        })
    }

    /// The registry's index and its version (`None`: there is none yet).
    fn index(&self) -> Result<(CertificateIndex, Option<UpdateVersion>), StoreError> {
        let got = self
            .run(self.fleet.remote.get_if_changed(INDEX_OBJECT, None))
            .map_err(|e| self.unavailable(&e))?;
        match got {
            None => Ok((CertificateIndex::default(), None)),
            Some((bytes, version)) => Ok((self.parse(&bytes)?, Some(version))),
        }
    }

    fn parse(&self, bytes: &[u8]) -> Result<CertificateIndex, StoreError> {
        let name = format!("{}/{INDEX_OBJECT}", self.fleet.url);
        parse_versioned(bytes, &name, |i: &CertificateIndex| i.format, FORMAT)
    }
}

fn bundle_object(hash: &str) -> String {
    format!("certificates/{hash}.sealed")
}

fn serialise(index: &CertificateIndex) -> Vec<u8> {
    let mut text = serde_json::to_vec_pretty(index).expect("an index serialises");
    text.push(b'\n');
    text
}

impl CertStore {
    /// Opens (creating, mode 0700) `<data_dir>/certificates`.
    ///
    /// # Errors
    /// If it cannot be created.
    pub fn open(data_dir: &Path) -> Result<Self, StoreError> {
        use std::os::unix::fs::DirBuilderExt;
        let dir = data_dir.join("certificates");
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(io_err(&dir))?;
        Ok(Self { dir, shared: None })
    }

    /// This store as a copy of the certificates in `fleet`'s registry. Call it on the runtime
    /// the store's requests are to run on; use the store itself only off the reactor
    /// (`spawn_blocking`), as every disk operation.
    #[must_use]
    pub fn with_registry(mut self, fleet: Arc<Fleet>) -> Self {
        self.shared = Some(Arc::new(Shared {
            fleet,
            runtime: tokio::runtime::Handle::current(),
            seen: Mutex::new(None),
            failing: std::sync::atomic::AtomicBool::new(false),
        }));
        self
    }

    /// How long a change to the index takes to reach every process that serves it: in a fleet
    /// two of its polls (an ACME challenge is answered everywhere before the CA is asked to
    /// validate it); `None` for one data directory.
    pub fn propagation(&self) -> Option<std::time::Duration> {
        self.shared.as_ref().map(|s| s.fleet.poll * 2)
    }

    fn index_path(&self) -> PathBuf {
        self.dir.join("index.json")
    }

    fn bundle_path(&self, hash: &str) -> PathBuf {
        self.dir.join(format!("{hash}.pem"))
    }

    /// Reads the index (empty if there is none yet). In a fleet it first copies a changed
    /// index of the registry here, with the bundles it names; if the registry cannot be read,
    /// the copy here is the index (logged).
    ///
    /// # Errors
    /// If it cannot be read or is not an index of this format.
    pub fn read(&self) -> Result<CertificateIndex, StoreError> {
        if let Some(shared) = &self.shared {
            use std::sync::atomic::Ordering;
            match self.pull(shared) {
                Ok(()) => {
                    if shared.failing.swap(false, Ordering::Relaxed) {
                        tracing::info!(registry = %shared.fleet.url, "certificates: the registry is read again");
                    }
                }
                Err(e) => {
                    if !shared.failing.swap(true, Ordering::Relaxed) {
                        tracing::warn!("certificates: serving this replica's copy: {e}");
                    }
                }
            }
        }
        self.read_local()
    }

    fn read_local(&self) -> Result<CertificateIndex, StoreError> {
        let index = read_versioned(&self.index_path(), |i: &CertificateIndex| i.format, FORMAT)?;
        Ok(index.unwrap_or_default())
    }

    /// Copies the registry's index here if it changed since the last copy, with the bundles
    /// it names. A bundle that cannot be brought (missing, not sealed under this fleet's
    /// token, damaged) is logged, and its certificate not served; the copy is tried again at
    /// the next read.
    fn pull(&self, shared: &Shared) -> Result<(), StoreError> {
        let seen = shared
            .seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let got = shared
            .run(
                shared
                    .fleet
                    .remote
                    .get_if_changed(INDEX_OBJECT, seen.as_ref()),
            )
            .map_err(|e| shared.unavailable(&e))?;
        let Some((bytes, version)) = got else {
            return Ok(());
        };
        let index = shared.parse(&bytes)?;
        self.mirror(shared, &index, Some(version))
    }

    /// Makes the copy here `index`, the registry's at `version` (`None`: the registry has
    /// moved past it; the next read fetches it whole), with the bundles it names.
    fn mirror(
        &self,
        shared: &Shared,
        index: &CertificateIndex,
        version: Option<UpdateVersion>,
    ) -> Result<(), StoreError> {
        let mut complete = true;
        for (name, record) in &index.certificates {
            if let Err(e) = self.bring(shared, record) {
                tracing::error!(certificate = %name, "certificate from the registry not served: {e}");
                complete = false;
            }
        }
        self.write_local(index)?;
        if complete || version.is_none() {
            *shared.seen.lock().unwrap_or_else(|e| e.into_inner()) = version;
        }
        Ok(())
    }

    /// Brings the bundle of `record` from the registry unless it is here already.
    fn bring(&self, shared: &Shared, record: &Record) -> Result<(), String> {
        let path = self.bundle_path(&record.bundle);
        if !is_hash(&record.bundle) {
            return Err(format!("{:?} is not a bundle name", record.bundle));
        }
        if std::fs::read(&path)
            .is_ok_and(|b| crate::hex::encode(&Sha256::digest(&b)) == record.bundle)
        {
            return Ok(());
        }
        let object = bundle_object(&record.bundle);
        let sealed = shared
            .run(shared.fleet.remote.get_object(&object))
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("registry object {object} is missing"))?;
        let bundle = shared
            .fleet
            .open_secret(&object, &sealed)
            .filter(|b| crate::hex::encode(&Sha256::digest(b)) == record.bundle)
            .ok_or_else(|| {
                format!(
                    "registry object {object}: not sealed under this fleet's admin token, or \
                     damaged; not served"
                )
            })?;
        artifact::write_atomic_mode(&path, &bundle, 0o600).map_err(|e| e.to_string())
    }

    /// Writes `index` here, holding the directory's lock, and removes the bundles it no longer
    /// names.
    fn write_local(&self, index: &CertificateIndex) -> Result<(), StoreError> {
        self.locked(|| {
            artifact::write_atomic(&self.index_path(), &serialise(index))?;
            self.remove_unnamed(index);
            Ok(())
        })
    }

    /// Runs `f` holding the directory's lock (an exclusive `flock`, released when the file
    /// closes at the end of this call).
    fn locked<R>(&self, f: impl FnOnce() -> Result<R, StoreError>) -> Result<R, StoreError> {
        let lock_path = self.dir.join(".lock");
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io_err(&lock_path))?;
        lock.lock().map_err(io_err(&lock_path))?;
        f()
    }

    /// Reads the index, applies `change` and writes the result (when it changed) so that a
    /// change by another process is never lost: in one data directory under its lock; in a
    /// fleet by compare-and-swap on the registry's index, `change` made again on a newer
    /// index when another replica wrote first. Bundles the new index no longer names are
    /// removed here.
    ///
    /// # Errors
    /// If the lock cannot be taken or the index cannot be read or written
    /// ([`StoreError::Unavailable`]: the registry cannot be reached); the index is then the
    /// old one.
    pub fn change<R>(
        &self,
        mut change: impl FnMut(&mut CertificateIndex) -> R,
    ) -> Result<R, StoreError> {
        let Some(shared) = &self.shared else {
            return self.locked(|| {
                let old = self.read_local()?;
                let mut index = old.clone();
                let result = change(&mut index);
                if index != old {
                    artifact::write_atomic(&self.index_path(), &serialise(&index))?;
                    self.remove_unnamed(&index);
                }
                Ok(result)
            });
        };
        // One id for every attempt: a write whose reply was lost is recognised by it.
        let id = crate::fleet::objects::change_id();
        for _ in 0..CHANGE_ATTEMPTS {
            let (old, version) = shared.index()?;
            let mut index = old.clone();
            let result = change(&mut index);
            if index == old {
                return Ok(result);
            }
            crate::fleet::objects::record_change(&mut index.changes, &id);
            let text = bytes::Bytes::from(serialise(&index));
            match shared.run(
                shared
                    .fleet
                    .remote
                    .put_if(INDEX_OBJECT, text, version.as_ref(), &id),
            ) {
                Ok(written) => {
                    self.mirror(shared, &index, written.version())?;
                    return Ok(result);
                }
                Err(RemoteError::Conflict(_)) => {}
                Err(e) => return Err(shared.unavailable(&e)),
            }
        }
        Err(StoreError::Unavailable(format!(
            "the certificates of the registry {} changed {CHANGE_ATTEMPTS} times during this \
             change; nothing changed, try again",
            shared.fleet.url
        )))
    }

    /// Stores a certificate chain and its key (PEM) as one bundle; returns its hash. In a
    /// fleet the bundle goes to the registry too (sealed), before any index names it.
    ///
    /// # Errors
    /// If it cannot be written.
    pub fn put_bundle(&self, cert: &[u8], key: &[u8]) -> Result<String, StoreError> {
        let mut bundle = cert.to_vec();
        if !bundle.ends_with(b"\n") {
            bundle.push(b'\n');
        }
        bundle.extend_from_slice(key);
        let hash = crate::hex::encode(&Sha256::digest(&bundle));
        let path = self.bundle_path(&hash);
        if !path.is_file() {
            artifact::write_atomic_mode(&path, &bundle, 0o600)?;
        }
        if let Some(shared) = &self.shared {
            let object = bundle_object(&hash);
            let sealed = shared.fleet.seal_secret(&object, &bundle);
            shared
                .run(shared.fleet.remote.put_object(&object, sealed, true))
                .map_err(|e| shared.unavailable(&e))?;
        }
        Ok(hash)
    }

    /// Reads and checks the bundle of `record` (its hash, its key, its hosts).
    ///
    /// # Errors
    /// Missing or damaged (its bytes no longer match its hash), or not a usable certificate.
    pub fn load(&self, record: &Record) -> Result<Loaded, String> {
        let path = self.bundle_path(&record.bundle);
        let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        if !is_hash(&record.bundle) || crate::hex::encode(&Sha256::digest(&bytes)) != record.bundle
        {
            return Err(format!(
                "{}: contents do not match their hash (damaged or tampered with); not served",
                path.display()
            ));
        }
        let name = path.display().to_string();
        Loaded::from_pem(&bytes, &bytes, &record.hosts, (&name, &name)).map_err(|e| e.to_string())
    }

    /// The certificates `index` names, loaded: uploaded ones first, then ACME's. One that
    /// cannot be loaded is logged and left out.
    pub fn table(&self, index: &CertificateIndex) -> Table {
        let mut records: Vec<(&String, &Record)> = index.certificates.iter().collect();
        records.sort_by_key(|(_, r)| r.source == Source::Acme);
        let loaded = records
            .into_iter()
            .filter_map(|(name, r)| match self.load(r) {
                Ok(l) => Some(l),
                Err(e) => {
                    tracing::error!(certificate = %name, "stored certificate not served: {e}");
                    None
                }
            })
            .collect();
        Table::of(loaded)
    }

    /// Removes the bundles `index` does not name, but not one written in the last minutes: a
    /// bundle is written before the change of the index that names it, which another process
    /// (or a copy from the registry) may be writing an older index over at that moment.
    fn remove_unnamed(&self, index: &CertificateIndex) {
        const YOUNG: std::time::Duration = std::time::Duration::from_secs(600);
        let named: std::collections::HashSet<&str> = index
            .certificates
            .values()
            .map(|r| r.bundle.as_str())
            .collect();
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(hash) = name.strip_suffix(".pem")
                && is_hash(hash)
                && !named.contains(hash)
                && entry
                    .metadata()
                    .and_then(|m| m.modified())
                    .is_ok_and(|t| t.elapsed().is_ok_and(|age| age > YOUNG))
            {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_held_until_it_lapses_or_is_given_back() {
        let mut index = CertificateIndex::default();
        assert!(index.take_lease("a.test", "p1", 60));
        assert!(!index.take_lease("a.test", "p2", 60), "p1 holds it");
        assert!(index.take_lease("a.test", "p1", 60), "the holder renews it");
        index.release_lease("a.test", "p2");
        assert!(
            index.leases.contains_key("a.test"),
            "only the holder releases"
        );
        index.release_lease("a.test", "p1");
        assert!(index.take_lease("a.test", "p2", 60));
        index.leases.get_mut("a.test").unwrap().until = now() - 1;
        assert!(
            index.take_lease("a.test", "p3", 60),
            "a lapsed lease is taken over"
        );
    }

    #[test]
    fn a_damaged_bundle_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = CertStore::open(dir.path()).unwrap();
        let hash = store.put_bundle(b"cert", b"key").unwrap();
        let record = Record {
            hosts: vec![],
            bundle: hash.clone(),
            source: Source::Api,
            not_after: 0,
            stored_at: 0,
        };
        std::fs::write(store.bundle_path(&hash), b"other").unwrap();
        let e = store.load(&record).unwrap_err();
        assert!(e.contains("do not match their hash"), "{e}");
    }
}
