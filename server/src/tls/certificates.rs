//! The certificates a TLS listener serves ([`Certificates`]): the config file's table and
//! the data directory's, merged into the index each handshake reads, with the answers to ACME
//! challenges in progress; kept in step with what other processes store.

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use super::challenge::{AnswerChange, challenge_answers};
use super::stored::{self, CertificateIndex};
use super::table::{ByName, Table};
use crate::metrics::Metrics;

/// The certificates a TLS listener serves: the config file's table and the data directory's,
/// each replaced whole; the next handshake sees the new index (connections already open keep
/// theirs). Also the answers to ACME TLS-ALPN-01 and HTTP-01 challenges in progress.
#[derive(Debug)]
pub struct Certificates {
    pub(super) index: ArcSwap<ByName>,
    /// The config file's table and the data directory's; the lock orders rebuilds.
    pub(super) tables: std::sync::Mutex<(Arc<Table>, Arc<Table>)>,
    pub(super) expiry: prometheus::IntGaugeVec,
    /// TLS-ALPN-01 answers by host name (RFC 8737).
    pub(super) alpn_challenges: std::sync::Mutex<HashMap<String, Arc<CertifiedKey>>>,
    /// HTTP-01 key authorizations by token.
    pub(super) http_challenges: std::sync::Mutex<HashMap<String, String>>,
    /// Where uploaded and ACME certificates are kept.
    pub(super) store: stored::CertStore,
}

impl Certificates {
    /// Serves `table` (the config file's) and what `store` holds; the expiry dates go to
    /// `metrics`.
    pub fn new(table: Table, store: stored::CertStore, metrics: &Metrics) -> Arc<Self> {
        let this = Arc::new(Self {
            index: ArcSwap::from_pointee(ByName::default()),
            tables: std::sync::Mutex::new((Arc::new(Table::default()), Arc::default())),
            expiry: metrics.tls_certificate_expiry.clone(),
            alpn_challenges: std::sync::Mutex::default(),
            http_challenges: std::sync::Mutex::default(),
            store,
        });
        this.replace(table);
        this
    }

    /// Serves `table` in place of the config file's from the next handshake on.
    pub fn replace(&self, table: Table) {
        self.rebuild(|tables| tables.0 = Arc::new(table));
    }

    /// Serves `table` in place of the data directory's from the next handshake on.
    pub fn replace_stored(&self, table: Table) {
        self.rebuild(|tables| tables.1 = Arc::new(table));
    }

    /// The config file's table and the data directory's.
    pub fn tables(&self) -> (Arc<Table>, Arc<Table>) {
        self.tables
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(super) fn rebuild(&self, change: impl FnOnce(&mut (Arc<Table>, Arc<Table>))) {
        let mut tables = self.tables.lock().unwrap_or_else(|e| e.into_inner());
        change(&mut tables);
        let index = Arc::new(ByName::build([&*tables.0, &*tables.1]));
        let old = self.index.swap(index.clone());
        for (name, _) in &old.expiries {
            let _ = self.expiry.remove_label_values(&[name]);
        }
        for (name, at) in &index.expiries {
            self.expiry.with_label_values(&[name]).set(*at);
        }
    }

    /// Answers TLS-ALPN-01 challenges for `host` with `key` (`None`: stops answering).
    pub fn set_alpn_challenge(&self, host: &str, key: Option<Arc<CertifiedKey>>) {
        set_or_remove(&self.alpn_challenges, host, key);
    }

    /// Answers the HTTP-01 challenge `token` with `key_authorization` (`None`: stops).
    pub fn set_http_challenge(&self, token: &str, key_authorization: Option<String>) {
        set_or_remove(&self.http_challenges, token, key_authorization);
    }

    /// The key authorization of the HTTP-01 challenge `token`, if one is in progress.
    pub fn http_challenge(&self, token: &str) -> Option<String> {
        self.http_challenges
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(token)
            .cloned()
    }
}

/// Puts `value` under `key` in `map`, or removes the key for `None`.
pub(super) fn set_or_remove<V>(
    map: &std::sync::Mutex<HashMap<String, V>>,
    key: &str,
    value: Option<V>,
) {
    let mut map = map.lock().unwrap_or_else(|e| e.into_inner());
    match value {
        Some(v) => map.insert(key.to_string(), v),
        None => map.remove(key),
    };
}

/// The ALPN protocol of TLS-ALPN-01 validation (RFC 8737).
pub const ACME_TLS_ALPN: &[u8] = b"acme-tls/1";

impl ResolvesServerCert for Certificates {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        if hello
            .alpn()
            .is_some_and(|mut offered| offered.any(|p| p == ACME_TLS_ALPN))
        {
            // A CA validating a name: only its challenge certificate answers (RFC 8737 §3).
            let name = hello.server_name()?;
            let map = self
                .alpn_challenges
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            return map.get(name).cloned();
        }
        self.index.load().pick(hello.server_name())
    }
}

impl Certificates {
    /// Reads the data directory's index and, if its certificates changed since `seen` (another
    /// process sharing the directory stored or removed one), serves them; the index read.
    pub async fn sync_stored(
        &self,
        seen: &mut Option<CertificateIndex>,
    ) -> Option<CertificateIndex> {
        let store = self.store.clone();
        let unchanged = seen.clone();
        let read = tokio::task::spawn_blocking(move || {
            let index = store.read()?;
            // Leases come and go with every ACME order; the certificates are reloaded only
            // when they changed.
            let changed = unchanged
                .as_ref()
                .is_none_or(|u| u.certificates != index.certificates);
            let table = changed.then(|| store.table(&index));
            let before = unchanged.map(|u| u.challenges).unwrap_or_default();
            let answers = challenge_answers(&before, &index.challenges);
            Ok::<_, crate::datadir::StoreError>((index, table, answers))
        })
        .await;
        match read {
            Ok(Ok((index, table, answers))) => {
                let mut remembered = index.clone();
                if let Some(table) = table {
                    if table.certificates.len() < index.certificates.len() {
                        // Some could not be loaded (a bundle not brought from the registry
                        // yet): loaded again at the next sync.
                        remembered.certificates.clear();
                    }
                    self.replace_stored(table);
                }
                for (host, answer) in answers {
                    match answer {
                        AnswerChange::Http(token, body) => self.set_http_challenge(&token, body),
                        AnswerChange::Alpn(cert) => self.set_alpn_challenge(&host, cert),
                    }
                }
                *seen = Some(remembered);
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
