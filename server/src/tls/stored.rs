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

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use std::sync::Arc;

use super::{Loaded, Table};
use crate::artifact::{self, io_err};
use crate::store::{StoreError, is_hash, now, read_versioned};

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
pub struct Index {
    /// [`FORMAT`].
    pub format: u32,
    /// By name (an uploaded certificate's name; an ACME certificate's host).
    pub certificates: BTreeMap<String, Record>,
    /// ACME order leases by host name.
    #[serde(default)]
    pub leases: BTreeMap<String, Lease>,
}

impl Default for Index {
    fn default() -> Self {
        Self {
            format: FORMAT,
            certificates: BTreeMap::new(),
            leases: BTreeMap::new(),
        }
    }
}

impl Index {
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

/// The certificates directory of a data directory.
#[derive(Debug, Clone)]
pub struct CertStore {
    dir: PathBuf,
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
        Ok(Self { dir })
    }

    fn index_path(&self) -> PathBuf {
        self.dir.join("index.json")
    }

    fn bundle_path(&self, hash: &str) -> PathBuf {
        self.dir.join(format!("{hash}.pem"))
    }

    /// Reads the index (empty if there is none yet).
    ///
    /// # Errors
    /// If it cannot be read or is not an index of this format.
    pub fn read(&self) -> Result<Index, StoreError> {
        let index = read_versioned(&self.index_path(), |i: &Index| i.format, FORMAT)?;
        Ok(index.unwrap_or_default())
    }

    /// Reads the index, applies `change` and writes the result (when it changed), holding the
    /// directory's lock throughout so a change by another process sharing it is never lost.
    /// Bundles the new index no longer names are removed.
    ///
    /// # Errors
    /// If the lock cannot be taken or the index cannot be read or written; the index on disk
    /// is then the old one.
    pub fn change<R>(&self, change: impl FnOnce(&mut Index) -> R) -> Result<R, StoreError> {
        let lock_path = self.dir.join(".lock");
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io_err(&lock_path))?;
        // An exclusive flock, released when `lock` is closed at the end of this call.
        lock.lock().map_err(io_err(&lock_path))?;
        let old = self.read()?;
        let mut index = old.clone();
        let result = change(&mut index);
        if index != old {
            let mut text = serde_json::to_vec_pretty(&index).expect("an index serialises");
            text.push(b'\n');
            artifact::write_atomic(&self.index_path(), &text)?;
            self.remove_unnamed(&index);
        }
        Ok(result)
    }

    /// Stores a certificate chain and its key (PEM) as one bundle; returns its hash.
    ///
    /// # Errors
    /// If it cannot be written.
    pub fn put_bundle(&self, cert: &[u8], key: &[u8]) -> Result<String, StoreError> {
        let mut bundle = cert.to_vec();
        if !bundle.ends_with(b"\n") {
            bundle.push(b'\n');
        }
        bundle.extend_from_slice(key);
        let hash = artifact::hex(&Sha256::digest(&bundle));
        let path = self.bundle_path(&hash);
        if !path.is_file() {
            artifact::write_atomic_mode(&path, &bundle, 0o600)?;
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
        if !is_hash(&record.bundle) || artifact::hex(&Sha256::digest(&bytes)) != record.bundle {
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
    pub fn table(&self, index: &Index) -> Table {
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

    fn remove_unnamed(&self, index: &Index) {
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
            {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}

impl super::Certificates {
    /// Reads the data directory's index and, if its certificates changed since `seen` (another
    /// process sharing the directory stored or removed one), serves them; the index read.
    pub async fn sync_stored(&self, seen: &mut Option<Index>) -> Option<Index> {
        let store = self.store.clone();
        let unchanged = seen.clone();
        let read = tokio::task::spawn_blocking(move || {
            let index = store.read()?;
            // Leases come and go with every ACME order; the certificates are reloaded only
            // when they changed.
            let changed = unchanged.is_none_or(|u| u.certificates != index.certificates);
            let table = changed.then(|| store.table(&index));
            Ok::<_, crate::store::StoreError>((index, table))
        })
        .await;
        match read {
            Ok(Ok((index, table))) => {
                if let Some(table) = table {
                    self.replace_stored(table);
                }
                *seen = Some(index.clone());
                Some(index)
            }
            Ok(Err(e)) => {
                tracing::error!("cannot read the stored certificates: {e}");
                None
            }
            Err(_) => None,
        }
    }

    /// Serves what other processes sharing the data directory store, checking every `every`
    /// until `shutdown` (without `[tls.acme]`, whose rounds do it).
    pub fn watch_stored(
        self: Arc<Self>,
        every: std::time::Duration,
        shutdown: crate::shutdown::Shutdown,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut seen = None;
            loop {
                self.sync_stored(&mut seen).await;
                if !shutdown.sleep(every).await {
                    return;
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_held_until_it_lapses_or_is_given_back() {
        let mut index = Index::default();
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
