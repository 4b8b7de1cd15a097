//! The durable store (`--data-dir`): content-addressed modules and asset archives, their
//! compiled artifacts, the manifest of tenants deployed through the admin API, and the admin
//! token.
//!
//! ```text
//! <data-dir>/manifest.json            tenants, their routes, limits and versions
//! <data-dir>/blobs/<sha256>           uploaded .wasm modules and asset archives
//! <data-dir>/artifacts/<sha256>-<engine>.cwasm   sealed compiled modules (mmapped)
//! <data-dir>/admin-token              generated admin token (mode 0600)
//! ```
//!
//! Every file is written atomically (temp file, fsync, rename, fsync the directory) and blobs
//! and artifacts are written before the manifest that names them, so a crash at any moment
//! leaves the old manifest or the new one, each naming only complete files. Leftover temp
//! files of an interrupted write are removed when the store is opened.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::artifact::{self, ArtifactError, FileError, io_err};
use crate::config::{TenantConfig, TenantSettings};

/// Format version of `manifest.json`.
pub const MANIFEST_FORMAT: u32 = 1;

/// Why the store could not be opened or read.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A file or directory could not be read or written.
    #[error(transparent)]
    Io(#[from] FileError),
    /// A file could not be written.
    #[error(transparent)]
    Write(#[from] ArtifactError),
    /// A fleet's registry could not be reached (the change was not made).
    #[error("{0}")]
    Unavailable(String),
    /// `manifest.json` (or another JSON file of the store) is not one this server understands.
    #[error("{path}: not a valid Tern store file: {reason}")]
    Manifest {
        /// The file.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// The tenants deployed through the admin API, and their versions.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// [`MANIFEST_FORMAT`].
    pub format: u32,
    /// Counts the changes written to a fleet's shared registry (each write adds one), so a
    /// change back to earlier contents is still a new version of the object.
    #[serde(default)]
    pub revision: u64,
    /// By tenant name.
    pub tenants: BTreeMap<String, StoredTenant>,
    /// With a shared registry: the ids of the last changes written to it, oldest first, so a
    /// replica whose write's reply was lost recognises its change when it reads the registry
    /// back (`fleet::objects::record_change`). Empty on a single server.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<String>,
    /// The scoped admin tokens, by id: digests, never a token ([`crate::access`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tokens: crate::access::Tokens,
}

impl Manifest {
    /// This manifest with tenant `name` set to `entry`, or removed (`None`).
    pub fn set(&mut self, name: &str, entry: Option<StoredTenant>) {
        match entry {
            Some(e) => self.tenants.insert(name.to_string(), e),
            None => self.tenants.remove(name),
        };
    }

    /// The module and assets hashes its versions (current and previous) refer to.
    pub fn referenced(&self) -> std::collections::HashSet<String> {
        let mut hashes = std::collections::HashSet::new();
        for t in self.tenants.values() {
            let candidate = t.candidate.as_ref().map(|c| &c.version);
            for v in t.current.iter().chain(&t.previous).chain(candidate) {
                hashes.insert(v.module.clone());
                hashes.extend(v.assets.clone());
            }
        }
        hashes
    }
}

impl Default for Manifest {
    fn default() -> Self {
        Self {
            format: MANIFEST_FORMAT,
            revision: 0,
            tenants: BTreeMap::new(),
            changes: Vec::new(),
            tokens: BTreeMap::new(),
        }
    }
}

/// One API-managed tenant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoredTenant {
    /// Routes, env and limits.
    pub spec: TenantSpec,
    /// The version serving requests; `None` until a module is deployed (the tenant is not
    /// routed until then).
    pub current: Option<Version>,
    /// The version before it, which `rollback` returns to.
    pub previous: Option<Version>,
    /// A new version serving a share of the traffic beside `current` until it is promoted
    /// (`tern promote`) or dropped (`tern rollback`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub candidate: Option<Candidate>,
    /// When the tenant was created (Unix seconds).
    pub created_at: u64,
    /// Made at random when the tenant is created, never reused: its guests' key-value data is
    /// kept under it ([`StoredTenant::data_key`]), so a tenant created again under the name of
    /// a deleted one (by its team or another) starts with none of the old one's. `None` for a
    /// tenant created before there were ids: its data is under its name, as it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Its variables (`tern var`, `tern secret`): plain values and sealed secrets, changed
    /// without a new version.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub variables: BTreeMap<String, crate::variables::Stored>,
}

impl StoredTenant {
    /// A tenant created now with `spec`: no version yet, a new id.
    pub fn created(spec: TenantSpec) -> Self {
        Self {
            spec,
            current: None,
            previous: None,
            candidate: None,
            created_at: now(),
            id: Some(format!("{:016x}", crate::random_u64())),
            variables: BTreeMap::new(),
        }
    }

    /// Whose key-value data tenant `name`'s guests reach: its name and id (`NAME/ID`: no
    /// tenant name has a `/`), or its name alone for a tenant made before ids.
    pub fn data_key(&self, name: &str) -> std::sync::Arc<str> {
        match &self.id {
            Some(id) => format!("{name}/{id}").into(),
            None => name.into(),
        }
    }

    /// The equivalent config-file tenant, serving `module`, its guests reaching its own data.
    pub fn to_config(&self, name: &str, module: &str) -> TenantConfig {
        TenantConfig {
            data: Some(self.data_key(name)),
            ..self.spec.to_config(name, module)
        }
    }

    /// The record as a fleet's registry stores it (compact JSON) and its SHA-256 (hex), which
    /// names it there.
    pub fn record(&self) -> (String, Vec<u8>) {
        let bytes = serde_json::to_vec(self).expect("a tenant serialises");
        let hash = crate::hex::encode(&<sha2::Sha256 as sha2::Digest>::digest(&bytes));
        (hash, bytes)
    }

    /// The tenant's entity tag in the admin API (`ETag`, `If-Match`): the first 128 bits of
    /// its record's digest, quoted. Every change to the tenant (spec, version, rollback)
    /// changes it.
    pub fn etag(&self) -> String {
        let (hash, _) = self.record();
        format!("\"{}\"", &hash[..32])
    }
}

/// A tenant's candidate: its version and its rollout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Candidate {
    /// The version in rollout.
    pub version: Version,
    /// Its share, stages, split key and abort rule.
    pub plan: crate::rollout::Plan,
}

/// What the admin API accepts to create or change a tenant (`PUT /admin/v1/tenants/{name}`),
/// kept in the manifest: the tenant settings a config file's `[[tenant]]` has too, with routes
/// as plain strings.
pub type TenantSpec = TenantSettings<String>;

impl TenantSpec {
    /// The equivalent config-file tenant, so the API and the file share validation and loading.
    pub fn to_config(&self, name: &str, module: &str) -> TenantConfig {
        let spanned = |s: &String| toml::Spanned::new(0..0, s.clone());
        TenantConfig {
            name: spanned(&name.to_string()),
            module: spanned(&module.to_string()),
            kind: None,
            assets: None,
            variables: BTreeMap::new(),
            data: None,
            settings: self.map_routes(spanned),
        }
    }
}

/// One deployed version of a tenant: a module and, optionally, an assets archive.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Version {
    /// The version id: the module's SHA-256, or with assets the SHA-256 of both hashes.
    pub id: String,
    /// SHA-256 of the `.wasm` (its blob name).
    pub module: String,
    /// Size of the `.wasm` in bytes.
    pub module_bytes: u64,
    /// SHA-256 of the assets archive (its blob name), if any.
    pub assets: Option<String>,
    /// When it was deployed (Unix seconds).
    pub deployed_at: u64,
    /// Compile time when it was deployed, in milliseconds (0 if the artifact existed).
    pub compile_ms: f64,
    /// The guest kind the deploy asked for (`tern deploy --kind`); `None`: detected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<crate::config::GuestKind>,
}

impl Version {
    /// The id of a module + assets pair.
    pub fn id_of(module: &str, assets: Option<&str>) -> String {
        match assets {
            None => module.to_string(),
            Some(a) => crate::hex::encode(&Sha256::digest(format!("{module}+{a}"))),
        }
    }
}

/// Seconds since the Unix epoch.
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The data directory on disk.
#[derive(Debug, Clone)]
pub struct DataDir {
    root: PathBuf,
}

impl DataDir {
    /// Opens (creating if needed) the store at `root` and removes temp files left by an
    /// interrupted write.
    ///
    /// # Errors
    /// If the directories cannot be created or listed.
    pub fn open(root: &Path) -> Result<Self, StoreError> {
        let store = Self {
            root: root.to_path_buf(),
        };
        for dir in [store.root.clone(), store.blobs(), store.artifacts()] {
            std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
            for entry in std::fs::read_dir(&dir).map_err(io_err(&dir))? {
                let entry = entry.map_err(io_err(&dir))?;
                let name = entry.file_name();
                if artifact::is_temp_name(&name.to_string_lossy()) {
                    let path = entry.path();
                    tracing::warn!(file = %path.display(), "removing a leftover temp file of an interrupted write");
                    std::fs::remove_file(&path).map_err(io_err(&path))?;
                }
            }
        }
        Ok(store)
    }

    /// The data directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn blobs(&self) -> PathBuf {
        self.root.join("blobs")
    }

    /// Where compiled artifacts live.
    pub fn artifacts(&self) -> PathBuf {
        self.root.join("artifacts")
    }

    fn manifest_path(&self) -> PathBuf {
        self.root.join("manifest.json")
    }

    /// The path of the blob with this SHA-256.
    pub fn blob_path(&self, hash: &str) -> PathBuf {
        self.blobs().join(hash)
    }

    /// Whether a blob with this SHA-256 is stored.
    pub fn has_blob(&self, hash: &str) -> bool {
        is_hash(hash) && self.blob_path(hash).is_file()
    }

    /// Stores `bytes` under their SHA-256 (once) and returns the hash.
    ///
    /// # Errors
    /// If the blob cannot be written.
    pub fn put_blob(&self, bytes: &[u8]) -> Result<String, ArtifactError> {
        let hash = crate::hex::encode(&Sha256::digest(bytes));
        let path = self.blob_path(&hash);
        let complete = std::fs::metadata(&path).is_ok_and(|m| m.len() == bytes.len() as u64);
        if !complete {
            artifact::write_atomic(&path, bytes)?;
        }
        Ok(hash)
    }

    /// Reads a blob and checks it still has its hash.
    ///
    /// # Errors
    /// If it is missing, unreadable or damaged.
    pub fn read_blob(&self, hash: &str) -> Result<Vec<u8>, StoreError> {
        let path = self.blob_path(hash);
        let bytes = std::fs::read(&path).map_err(io_err(&path))?;
        if crate::hex::encode(&Sha256::digest(&bytes)) != hash {
            let damaged = std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "contents do not match their hash",
            );
            return Err(io_err(&path)(damaged).into());
        }
        Ok(bytes)
    }

    /// Reads `manifest.json` (an empty manifest if there is none yet).
    ///
    /// # Errors
    /// If it cannot be read or is not a manifest of this format.
    pub fn load_manifest(&self) -> Result<Manifest, StoreError> {
        let manifest = read_versioned(
            &self.manifest_path(),
            |m: &Manifest| m.format,
            MANIFEST_FORMAT,
        )?;
        Ok(manifest.unwrap_or_default())
    }

    /// Writes `manifest.json` atomically.
    ///
    /// # Errors
    /// If it cannot be written; the old manifest is then still in place.
    pub fn save_manifest(&self, manifest: &Manifest) -> Result<(), ArtifactError> {
        let mut text = serde_json::to_vec_pretty(manifest).expect("a manifest serialises");
        text.push(b'\n');
        artifact::write_atomic(&self.manifest_path(), &text)
    }

    /// Removes blobs and artifacts no version in `manifest` refers to (deleted tenants,
    /// versions older than `previous`). Returns how many files were removed.
    pub fn collect_garbage(&self, manifest: &Manifest) -> usize {
        let keep = manifest.referenced();
        self.remove_where(|hash| !keep.contains(hash))
    }

    /// Removes the blob and the artifacts of `hash`. Returns how many files were removed.
    pub fn remove_hash(&self, hash: &str) -> usize {
        self.remove_where(|h| h == hash)
    }

    fn remove_where(&self, remove: impl Fn(&str) -> bool) -> usize {
        let mut removed = 0;
        for dir in [self.blobs(), self.artifacts()] {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let hash = name.split(['-', '.']).next().unwrap_or("");
                if is_hash(hash) && remove(hash) && std::fs::remove_file(entry.path()).is_ok() {
                    removed += 1;
                }
            }
        }
        removed
    }
}

/// Reads a JSON file of the store that carries its format version: `None` if there is none
/// yet.
///
/// # Errors
/// If it cannot be read, is not that JSON, or has a format `format_of` says is not `format`.
pub fn read_versioned<T: serde::de::DeserializeOwned>(
    path: &Path,
    format_of: impl Fn(&T) -> u32,
    format: u32,
) -> Result<Option<T>, StoreError> {
    let text = match std::fs::read(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err(path)(e).into()),
    };
    parse_versioned(&text, &path.display().to_string(), format_of, format).map(Some)
}

/// `text` (the JSON file or object `name`) parsed, if its format is `format`.
///
/// # Errors
/// [`StoreError::Manifest`] if it is not JSON of `T` or has another format.
pub fn parse_versioned<T: serde::de::DeserializeOwned>(
    text: &[u8],
    name: &str,
    format_of: impl Fn(&T) -> u32,
    format: u32,
) -> Result<T, StoreError> {
    let bad = |reason: String| StoreError::Manifest {
        path: name.to_string(),
        reason,
    };
    let value: T = serde_json::from_slice(text).map_err(|e| bad(e.to_string()))?;
    let found = format_of(&value);
    if found != format {
        return Err(bad(format!(
            "format {found} (this server reads format {format})"
        )));
    }
    Ok(value)
}

/// Whether `s` is a lowercase hex SHA-256 (so it is safe as a file name).
pub fn is_hash(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The admin token and, if it was generated, the file it was written to.
#[derive(Debug, Clone)]
pub struct AdminToken {
    /// The token.
    pub token: String,
    /// Where a generated token was written.
    pub file: Option<PathBuf>,
}

/// The admin token: `TERN_ADMIN_TOKEN`, else `configured`, else a new random one written to
/// `<data-dir>/admin-token` with mode 0600.
///
/// # Errors
/// If a token must be generated and cannot be written.
pub fn admin_token(configured: &str, data_dir: &Path) -> Result<AdminToken, StoreError> {
    if let Some(t) = std::env::var("TERN_ADMIN_TOKEN")
        .ok()
        .filter(|t| !t.is_empty())
    {
        return Ok(AdminToken {
            token: t,
            file: None,
        });
    }
    if !configured.is_empty() {
        return Ok(AdminToken {
            token: configured.to_string(),
            file: None,
        });
    }
    let mut bytes = [0u8; 32];
    let urandom = Path::new("/dev/urandom");
    std::fs::File::open(urandom)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .map_err(io_err(urandom))?;
    let token = crate::hex::encode(&bytes);
    let path = data_dir.join("admin-token");
    artifact::write_atomic_mode(&path, format!("{token}\n").as_bytes(), 0o600)?;
    Ok(AdminToken {
        token,
        file: Some(path),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blobs_are_content_addressed_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let store = DataDir::open(dir.path()).unwrap();
        let hash = store.put_blob(b"hello").unwrap();
        assert!(is_hash(&hash) && store.has_blob(&hash));
        assert_eq!(store.read_blob(&hash).unwrap(), b"hello");
        std::fs::write(store.blob_path(&hash), b"hellO").unwrap();
        assert!(store.read_blob(&hash).is_err());
        assert!(!store.has_blob("../manifest.json"));
    }

    #[test]
    fn a_tenant_created_again_keeps_its_data_under_a_key_of_its_own() {
        let (one, two) = (
            StoredTenant::created(TenantSpec::default()),
            StoredTenant::created(TenantSpec::default()),
        );
        assert_ne!(one.id, two.id);
        assert_ne!(one.data_key("a"), two.data_key("a"));
        let key = one.data_key("a");
        assert!(key.starts_with("a/") && key.len() == 2 + 16, "{key}");
        assert_eq!(one.to_config("a", "m").data, Some(key));
        // Made before ids: its data under its name, as before.
        let old = StoredTenant { id: None, ..one };
        assert_eq!(&*old.data_key("a"), "a");
        let text = serde_json::to_string(&old).unwrap();
        assert!(!text.contains("\"id\""), "{text}");
        let read: StoredTenant = serde_json::from_str(&text).unwrap();
        assert_eq!(read.id, None);
    }

    #[test]
    fn leftover_temp_files_are_removed_and_the_manifest_survives() {
        let dir = tempfile::tempdir().unwrap();
        let store = DataDir::open(dir.path()).unwrap();
        let mut m = Manifest::default();
        m.tenants.insert(
            "a".into(),
            StoredTenant {
                spec: TenantSpec::default(),
                current: None,
                previous: None,
                candidate: None,
                created_at: 1,
                id: None,
                variables: BTreeMap::new(),
            },
        );
        store.save_manifest(&m).unwrap();
        // A crash between writing a temp file and renaming it.
        std::fs::write(dir.path().join(".manifest.json.tmp-1-0"), b"{ torn").unwrap();
        std::fs::write(dir.path().join("blobs/.x.tmp-1-0"), b"torn").unwrap();
        let store = DataDir::open(dir.path()).unwrap();
        assert!(!dir.path().join(".manifest.json.tmp-1-0").exists());
        assert!(!dir.path().join("blobs/.x.tmp-1-0").exists());
        assert_eq!(store.load_manifest().unwrap().tenants.len(), 1);
    }

    #[test]
    fn generated_tokens_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let t = admin_token("", dir.path()).unwrap();
        let Some(file) = t.file else {
            // TERN_ADMIN_TOKEN is set in this environment: no file is written.
            assert_eq!(Some(t.token), std::env::var("TERN_ADMIN_TOKEN").ok());
            return;
        };
        assert_eq!(t.token.len(), 64);
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(std::fs::read_to_string(file).unwrap().trim(), t.token);
        if std::env::var_os("TERN_ADMIN_TOKEN").is_none() {
            assert_eq!(admin_token("fixed", dir.path()).unwrap().token, "fixed");
        }
    }
}
