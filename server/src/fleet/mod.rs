//! A fleet's shared registry: the objects every replica reads and writes (see
//! [`objects::Remote`]), and how a replica brings what a version needs onto its own disk.
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

pub mod objects;

use crate::artifact;
use crate::datadir::{DataDir, Version};
use crate::metrics::Metrics;
use objects::{Remote, RemoteError};

/// How many objects a replica downloads at once.
const PARALLEL_FETCHES: usize = 32;

/// Marks a signed artifact in the registry (format 1): this, the 32-byte tag, the sealed
/// artifact.
const SIGNED_MAGIC: &[u8; 8] = b"TERNSIG1";

/// How long a nudge to another replica may take.
const NUDGE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// The header a nudge names its sender's admin URL in, so a replica learns of one that joined
/// without reading the registry's reports.
pub const NUDGE_FROM: &str = "tern-replica-url";

/// The header a replica's request to another about a tenant (a forwarded publish, a read of
/// its live log) names whose tenant it is in ([`crate::tenant::Tenant::data`]): the other
/// replica answers `409` and does nothing when the tenant it serves under that name is
/// another (one replica has not seen a delete and a create again yet).
pub const TENANT_KEY: &str = "tern-tenant-key";

/// `POST <peer>/admin/v1/fleet/sync` with the fleet's token, from the replica at `from`.
async fn nudge(peer: &str, token: &str, from: Option<&str>) -> Result<(), String> {
    let from = from.map(|url| (NUDGE_FROM, url));
    post(peer, "/admin/v1/fleet/sync", token, from, Bytes::new()).await
}

/// An HTTP/1.1 connection to replica `peer` (its admin URL): the sender, and the `Host` its
/// requests name.
async fn connect<B>(
    peer: &str,
) -> Result<(hyper::client::conn::http1::SendRequest<B>, String), String>
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let uri: hyper::Uri = peer
        .parse()
        .map_err(|e| format!("{peer:?} is not a URL: {e}"))?;
    let host = uri.host().ok_or("no host")?.to_string();
    let port = uri.port_u16().unwrap_or(80);
    let stream = tokio::net::TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| e.to_string())?;
    let (send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    Ok((send, format!("{host}:{port}")))
}

/// `POST <peer><path>` of `body` with the fleet's token, and `header` when given.
async fn post(
    peer: &str,
    path: &str,
    token: &str,
    header: Option<(&'static str, &str)>,
    body: Bytes,
) -> Result<(), String> {
    use http_body_util::Full;
    let (mut send, host) = connect(peer).await?;
    let req = hyper::Request::post(path)
        .header(hyper::header::HOST, host)
        .header(hyper::header::AUTHORIZATION, format!("Bearer {token}"));
    let req = match header {
        Some((name, value)) => req.header(name, value),
        None => req,
    }
    .body(Full::new(body))
    .map_err(|e| e.to_string())?;
    let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
    if resp.status().is_success() {
        Ok(())
    } else {
        Err(format!("answered {}", resp.status()))
    }
}

/// Marks a secret sealed for the registry (format 1): this, the 12-byte nonce, the ciphertext
/// and its 16-byte tag.
const SECRET_MAGIC: &[u8; 8] = b"TERNENC1";

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
    /// The key secrets kept in the registry (certificates' private keys) are encrypted with.
    secret_key: [u8; 32],
    /// The admin token the replicas share (a nudge carries it).
    token: String,
    /// This replica's admin URL as the others reach it, if it has one (set once its admin
    /// listener is bound).
    pub advertise: std::sync::OnceLock<String>,
    /// The other replicas' admin URLs, from their reports.
    peers: std::sync::Mutex<Vec<String>>,
    /// Woken by a nudge: read the registry now.
    pub wake: tokio::sync::Notify,
}

debug_fields!(Fleet: url, replica);

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
        let (store, prefix) = objects::open(url)?;
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
        let derive = |purpose: &[u8]| -> [u8; 32] {
            Sha256::digest([purpose, admin_token.as_bytes()].concat()).into()
        };
        Self {
            remote,
            url: url.to_string(),
            replica,
            poll,
            key: derive(b"tern registry artifact key\0"),
            secret_key: derive(b"tern registry secret key\0"),
            token: admin_token.to_string(),
            advertise: std::sync::OnceLock::new(),
            peers: std::sync::Mutex::default(),
            wake: tokio::sync::Notify::new(),
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

    /// The other replicas' admin URLs (from their reports and nudges).
    pub fn peers(&self) -> Vec<String> {
        self.peers.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// `GET <peer><path>` with the fleet's token, about the tenant whose key is `tenant_key`
    /// ([`TENANT_KEY`]): the answer's head, its body to be read as it comes.
    ///
    /// # Errors
    /// The peer cannot be reached or answered no head, in words.
    pub async fn get(
        &self,
        peer: &str,
        path: &str,
        tenant_key: &str,
    ) -> Result<hyper::Response<hyper::body::Incoming>, String> {
        let (mut send, host) = connect(peer).await?;
        let req = hyper::Request::get(path)
            .header(hyper::header::HOST, host)
            .header(
                hyper::header::AUTHORIZATION,
                format!("Bearer {}", self.token),
            )
            .header(TENANT_KEY, tenant_key)
            .body(http_body_util::Empty::<Bytes>::new())
            .map_err(|e| e.to_string())?;
        send.send_request(req).await.map_err(|e| e.to_string())
    }

    /// Remembers the other replicas' admin URLs (from their reports), for nudges.
    pub fn set_peers(&self, peers: Vec<String>, metrics: &Metrics) {
        self.change_peers(metrics, |p| *p = peers);
    }

    /// Adds the replica at `url` to those nudged (one that nudged this one).
    pub fn add_peer(&self, url: &str, metrics: &Metrics) {
        self.change_peers(metrics, |p| p.push(url.trim_end_matches('/').to_string()));
    }

    fn change_peers(&self, metrics: &Metrics, change: impl FnOnce(&mut Vec<String>)) {
        let own = self.advertise.get();
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        change(&mut peers);
        peers.retain(|p| Some(p) != own && p.starts_with("http://"));
        peers.sort();
        peers.dedup();
        metrics
            .registry_peers
            .set(i64::try_from(peers.len()).unwrap_or(i64::MAX));
    }

    /// Tells every other replica to read the registry now (a change was written here), so
    /// they need not wait for their next poll; in the background, each within 1 s. One that
    /// cannot be told reads the change at its next poll.
    pub fn nudge_peers(&self, metrics: &Metrics) {
        let peers = self.peers.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for peer in peers {
            let (token, counter) = (self.token.clone(), metrics.registry_nudges.clone());
            let from = self.advertise.get().cloned();
            tokio::spawn(async move {
                let sent =
                    tokio::time::timeout(NUDGE_TIMEOUT, nudge(&peer, &token, from.as_deref()))
                        .await;
                match sent {
                    Ok(Ok(())) => counter.with_label_values(&["sent"]).inc(),
                    Ok(Err(e)) => {
                        counter.with_label_values(&["failed"]).inc();
                        tracing::debug!(peer = %peer, "cannot nudge a replica: {e}");
                    }
                    Err(_) => {
                        counter.with_label_values(&["failed"]).inc();
                        tracing::debug!(peer = %peer, "cannot nudge a replica: no answer within 1 s");
                    }
                }
            });
        }
    }

    /// Sends a publish of tenant `tenant`'s WebSocket messages (`body`, Pushpin's format) to
    /// every other replica (`POST <peer>/admin/v1/fleet/publish/{tenant}`, naming whose
    /// tenant it is: `data`, [`TENANT_KEY`]), in the background, each within 1 s; each
    /// applies it to its own connections only. A replica that cannot be reached, or serves
    /// another tenant of that name, misses it (messages are not kept: as in Pushpin, a publish
    /// reaches the connections open when it is made).
    pub fn publish_to_peers(
        &self,
        (tenant, data): (&str, &str),
        body: Bytes,
        sent: &prometheus::IntCounterVec,
    ) {
        let peers = self.peers.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for peer in peers {
            let (token, counter) = (self.token.clone(), sent.clone());
            let (path, body) = (format!("/admin/v1/fleet/publish/{tenant}"), body.clone());
            let data = data.to_string();
            tokio::spawn(async move {
                let header = Some((TENANT_KEY, data.as_str()));
                let sent =
                    tokio::time::timeout(NUDGE_TIMEOUT, post(&peer, &path, &token, header, body))
                        .await;
                let outcome = match sent {
                    Ok(Ok(())) => "sent",
                    Ok(Err(e)) => {
                        tracing::debug!(peer = %peer, "cannot send a publish to a replica: {e}");
                        "failed"
                    }
                    Err(_) => "failed",
                };
                counter.with_label_values(&[outcome]).inc();
            });
        }
    }

    /// `plain` encrypted for the registry object `object` (AES-256-GCM under a key derived
    /// from the admin token, the object's name authenticated with it): what a reader of the
    /// bucket without the token learns is its length.
    pub fn seal_secret(&self, object: &str, plain: &[u8]) -> Bytes {
        use aws_lc_rs::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
        let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &self.secret_key).expect("a key"));
        let mut nonce = [0u8; NONCE_LEN];
        aws_lc_rs::rand::fill(&mut nonce).expect("the system's random source");
        let mut body = plain.to_vec();
        key.seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(object.as_bytes()),
            &mut body,
        )
        .expect("sealing cannot fail for this size");
        let mut out = Vec::with_capacity(SECRET_MAGIC.len() + NONCE_LEN + body.len());
        out.extend_from_slice(SECRET_MAGIC);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&body);
        out.into()
    }

    /// The plain bytes of a registry object [`Fleet::seal_secret`] wrote as `object`; `None`
    /// if it was not sealed under this fleet's token for that name, or was changed since.
    pub fn open_secret(&self, object: &str, sealed: &[u8]) -> Option<Vec<u8>> {
        use aws_lc_rs::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
        let rest = sealed.strip_prefix(SECRET_MAGIC.as_slice())?;
        if rest.len() < NONCE_LEN {
            return None;
        }
        let (nonce, body) = rest.split_at(NONCE_LEN);
        let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &self.secret_key).ok()?);
        let mut body = body.to_vec();
        let plain = key
            .open_in_place(
                Nonce::try_assume_unique_for_key(nonce).ok()?,
                Aad::from(object.as_bytes()),
                &mut body,
            )
            .ok()?;
        Some(plain.to_vec())
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

/// Sends a tenant's WebSocket publishes to the fleet's other replicas
/// ([`Fleet::publish_to_peers`]), counted by outcome in `sent`.
pub struct Forwarder {
    /// The fleet.
    pub fleet: Arc<Fleet>,
    /// `tern_websocket_fleet_publishes_total`.
    pub sent: prometheus::IntCounterVec,
}

impl crate::websocket::channels::Forward for Forwarder {
    fn forward(&self, name: &str, data: &str, body: Bytes) {
        self.fleet.publish_to_peers((name, data), body, &self.sent);
    }
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
            crate::hex::encode(&tag),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn artifacts_verify_only_under_their_name_and_key() {
        let a = fleet("token");
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
        assert_eq!(
            fleet("other").verify("artifacts/x", &signed),
            None,
            "another fleet's key"
        );
        assert_eq!(a.verify("artifacts/x", b"TERNSIG1short"), None);
    }

    /// A fleet over an in-memory store, its replicas sharing `token`.
    fn fleet(token: &str) -> Fleet {
        let store: Arc<dyn object_store::ObjectStore> =
            Arc::new(object_store::memory::InMemory::new());
        let remote = Remote::new(store, object_store::path::Path::from("f"));
        Fleet::new(remote, "memory://", "r".into(), Default::default(), token)
    }

    #[test]
    fn secrets_open_only_under_their_name_and_token() {
        let a = fleet("token");
        let sealed = a.seal_secret("certificates/x.sealed", b"-----BEGIN PRIVATE KEY-----");
        assert!(
            !sealed.windows(7).any(|w| w == b"PRIVATE"),
            "the key is not readable in the bucket"
        );
        assert_ne!(
            sealed,
            a.seal_secret("certificates/x.sealed", b"-----BEGIN PRIVATE KEY-----"),
            "a fresh nonce each time"
        );
        assert_eq!(
            a.open_secret("certificates/x.sealed", &sealed).as_deref(),
            Some(&b"-----BEGIN PRIVATE KEY-----"[..])
        );
        assert_eq!(
            a.open_secret("certificates/y.sealed", &sealed),
            None,
            "moved"
        );
        let mut flipped = sealed.to_vec();
        flipped[20] ^= 1;
        assert_eq!(
            a.open_secret("certificates/x.sealed", &flipped),
            None,
            "changed"
        );
        assert_eq!(
            fleet("other").open_secret("certificates/x.sealed", &sealed),
            None,
            "another token"
        );
        assert_eq!(a.open_secret("certificates/x.sealed", b"TERNENC1"), None);
    }
}
