//! Automatic certificates (`[tls.acme]`, RFC 8555): one certificate per host name, ordered
//! from the CA with instant-acme, validated by TLS-ALPN-01 on the TLS listener (RFC 8737) or
//! HTTP-01 on the cleartext one, kept in the data directory ([`super::stored`]) and renewed
//! inside the window the CA suggests (ACME Renewal Information, RFC 9773) or, where it
//! suggests none, when a third of the certificate's life is left.
//!
//! One task per process does it all, off the request path. Each round (every
//! `check_interval_seconds`) it loads certificates other processes sharing the data directory
//! stored, then orders what is missing or due. An order holds the name's lease in the store,
//! so processes sharing a data directory never order the same name at once. A failed order is
//! retried after `retry_seconds`, doubling up to 6 hours; the certificate serving meanwhile
//! keeps serving.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use instant_acme::{
    Account, AccountCredentials, AuthorizationStatus, CertificateIdentifier, ChallengeType,
    Identifier, NewAccount, NewOrder, OrderStatus, RetryPolicy,
};
use sha2::{Digest, Sha256};

use super::certificates::Certificates;
use super::challenge::{Challenge, alpn_certificate};
use super::stored::{CertificateIndex, Record, Source};
use super::table::{Loaded, wildcard_match};
use crate::config::{AcmeChallenge, AcmeConfig};
use crate::datadir::now;
use crate::shutdown::Shutdown;

/// How long an order may hold a name's lease (an order that takes longer has failed).
const LEASE_SECONDS: u64 = 600;

/// Longest wait between tries after failures.
const MAX_RETRY_SECONDS: u64 = 6 * 3600;

/// The host names tenants route, asked for at each round (the registry's; tenants come and
/// go at runtime).
pub type TenantHosts = Box<dyn Fn() -> Vec<String> + Send + Sync>;

/// Obtains and renews certificates for a TLS listener.
pub struct Manager {
    config: AcmeConfig,
    /// The config file's directory (for `ca_root`).
    base_dir: PathBuf,
    certificates: Arc<Certificates>,
    /// Where the ACME account is kept.
    account_dir: PathBuf,
    tenant_hosts: TenantHosts,
    /// This process, in leases.
    holder: String,
    orders: prometheus::IntCounterVec,
    account: Option<Account>,
    /// Per host: failures in a row and when to try again (Unix seconds).
    retry: HashMap<String, (u32, u64)>,
    /// Per certificate bundle: when to renew it and when to ask the CA again (Unix seconds).
    renew_at: HashMap<String, (u64, u64)>,
}

impl std::fmt::Debug for Manager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Manager")
            .field("directory", self.config.directory.get_ref())
            .finish_non_exhaustive()
    }
}

/// Why an order did not produce a certificate.
pub(super) enum OrderFailed {
    /// Another process holds the name's lease.
    Busy,
    /// The CA refused, could not be reached, or gave something unusable.
    Error(String),
}

impl<E: std::error::Error> From<E> for OrderFailed {
    fn from(e: E) -> Self {
        Self::Error(crate::error_chain(&e))
    }
}

impl Manager {
    /// A manager serving what it obtains through `certificates` and keeping it in their store;
    /// its ACME account is kept in `data_dir`.
    pub fn new(
        config: AcmeConfig,
        base_dir: &Path,
        data_dir: &Path,
        certificates: Arc<Certificates>,
        tenant_hosts: TenantHosts,
        metrics: &crate::metrics::Metrics,
    ) -> Self {
        Self {
            config,
            base_dir: base_dir.to_path_buf(),
            certificates,
            account_dir: data_dir.join("acme"),
            tenant_hosts,
            holder: format!("{}-{}", std::process::id(), crate::hex::random_id::<8>()),
            orders: metrics.acme_orders.clone(),
            account: None,
            retry: HashMap::new(),
            renew_at: HashMap::new(),
        }
    }

    /// Runs the rounds until `shutdown`.
    pub fn spawn(mut self, shutdown: Shutdown) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let every = Duration::from_secs(self.config.check_interval_seconds);
            let mut seen = None;
            loop {
                self.round(&mut seen).await;
                if !shutdown.sleep(every).await {
                    return;
                }
            }
        })
    }

    /// Serves what the store holds (if it changed since `seen`), then orders what is due.
    async fn round(&mut self, seen: &mut Option<CertificateIndex>) {
        let Some(index) = self.sync(seen).await else {
            return;
        };
        for host in self.wanted(&index) {
            let (failures, retry_at) = self.retry.get(&host).copied().unwrap_or((0, 0));
            if now() < retry_at {
                continue;
            }
            let current = index
                .certificates
                .get(&host)
                .filter(|r| r.source == Source::Acme)
                .cloned();
            if let Some(r) = &current
                && now() < self.renewal_time(&host, r).await
            {
                continue;
            }
            match self.obtain(&host, current.as_ref()).await {
                Ok(record) => {
                    // Served first, then counted and logged: whoever sees the count can use it.
                    self.sync(seen).await;
                    self.orders.with_label_values(&["issued"]).inc();
                    self.retry.remove(&host);
                    tracing::info!(
                        host = %host,
                        expires = record.not_after,
                        "ACME: certificate {}",
                        if current.is_some() { "renewed" } else { "obtained" }
                    );
                }
                Err(OrderFailed::Busy) => {
                    self.orders.with_label_values(&["busy"]).inc();
                    tracing::debug!(host = %host, "ACME: another process is ordering this name");
                }
                Err(OrderFailed::Error(e)) => {
                    self.orders.with_label_values(&["failed"]).inc();
                    let wait = self
                        .config
                        .retry_seconds
                        .saturating_mul(1 << failures.min(20))
                        .min(MAX_RETRY_SECONDS);
                    self.retry
                        .insert(host.clone(), (failures + 1, now() + wait));
                    tracing::error!(
                        host = %host,
                        retry_in_seconds = wait,
                        serving = if current.is_some() { "the current certificate" } else { "no certificate for this name yet" },
                        "ACME: order failed: {e}"
                    );
                }
            }
        }
    }

    /// Reads the store's index and, if its certificates changed since `seen`, serves them.
    async fn sync(&self, seen: &mut Option<CertificateIndex>) -> Option<CertificateIndex> {
        self.certificates.sync_stored(seen).await
    }

    /// The names to keep certificates for: the configured ones, else the tenants' exact host
    /// names; less those a config-file or uploaded certificate serves.
    fn wanted(&self, index: &CertificateIndex) -> Vec<String> {
        let names: Vec<String> = if self.config.hosts.is_empty() {
            (self.tenant_hosts)()
                .into_iter()
                .map(|h| h.to_ascii_lowercase())
                .filter(|h| crate::config::acme_name(h).is_ok())
                .collect()
        } else {
            self.config
                .hosts
                .iter()
                .map(|h| h.get_ref().to_ascii_lowercase())
                .collect()
        };
        let (file, _) = self.certificates.tables();
        let uploaded: Vec<&Record> = index
            .certificates
            .values()
            .filter(|r| r.source == Source::Api)
            .collect();
        let mut names: Vec<String> = names
            .into_iter()
            .filter(|h| {
                !file.serves(h)
                    && !uploaded
                        .iter()
                        .any(|r| r.hosts.iter().any(|p| p == h || wildcard_match(p, h)))
            })
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// When to renew `record` (Unix seconds): a random moment in the CA's suggested window
    /// (asked again when the CA says to), else when a third of its life is left.
    async fn renewal_time(&mut self, host: &str, record: &Record) -> u64 {
        let now = now();
        if let Some(&(at, ask_again)) = self.renew_at.get(&record.bundle)
            && now < ask_again
        {
            return at;
        }
        let life_left = u64::try_from(record.not_after).unwrap_or(0);
        let fallback = life_left.saturating_sub(life_left.saturating_sub(record.stored_at) / 3);
        let (at, ask_again) = match self.suggested_window(record).await {
            Ok((start, end, retry_after)) => {
                let span = end.saturating_sub(start);
                let at = start + crate::random_below(span);
                let again = now + retry_after.clamp(self.config.check_interval_seconds, 86_400);
                (at, again)
            }
            Err(e) => {
                tracing::debug!(
                    host,
                    "ACME: no renewal information ({e}); renewing at two thirds of the certificate's life"
                );
                (fallback, now + self.config.check_interval_seconds)
            }
        };
        self.renew_at.retain(|b, _| *b == record.bundle);
        self.renew_at.insert(record.bundle.clone(), (at, ask_again));
        at
    }

    /// The CA's suggested renewal window for `record` and when to ask again (Unix seconds).
    async fn suggested_window(&mut self, record: &Record) -> Result<(u64, u64, u64), String> {
        let id = self.certificate_id(record).await?;
        let account = self.account().await?;
        let (info, retry_after) = account
            .renewal_info(&id)
            .await
            .map_err(|e| crate::error_chain(&e))?;
        let secs = |t: i64| u64::try_from(t).unwrap_or(0);
        Ok((
            secs(info.suggested_window.start.unix_timestamp()),
            secs(info.suggested_window.end.unix_timestamp()),
            retry_after.as_secs(),
        ))
    }

    /// How the CA names the certificate of `record` (RFC 9773: its issuer's key id and serial),
    /// read from the store off the reactor.
    async fn certificate_id(
        &self,
        record: &Record,
    ) -> Result<CertificateIdentifier<'static>, String> {
        let (store, record) = (self.certificates.store.clone(), record.clone());
        tokio::task::spawn_blocking(move || {
            let loaded = store.load(&record)?;
            CertificateIdentifier::try_from(loaded.leaf()).map(CertificateIdentifier::into_owned)
        })
        .await
        .map_err(|e| e.to_string())?
    }

    /// The ACME account: the stored one for this directory, else a new one (stored).
    async fn account(&mut self) -> Result<Account, String> {
        if let Some(a) = &self.account {
            return Ok(a.clone());
        }
        let directory = self.config.directory.get_ref().clone();
        let file = self.account_dir.join(format!(
            "account-{}.json",
            &crate::hex::encode(&Sha256::digest(directory.as_bytes()))[..16]
        ));
        let builder = || match &self.config.ca_root {
            Some(root) => Account::builder_with_root(self.base_dir.join(root.get_ref())),
            None => Account::builder(),
        };
        let stored = {
            let file = file.clone();
            tokio::task::spawn_blocking(move || std::fs::read(&file).ok())
                .await
                .ok()
                .flatten()
        };
        let account = match stored
            .and_then(|b| serde_json::from_slice::<AccountCredentials>(&b).ok())
        {
            Some(credentials) => builder()
                .map_err(|e| format!("ACME client: {}", crate::error_chain(&e)))?
                .from_credentials(credentials)
                .await
                .map_err(|e| format!("{directory}: {}", crate::error_chain(&e)))?,
            None => {
                let contact: Vec<&str> = self.config.contact.iter().map(String::as_str).collect();
                let (account, credentials) = builder()
                    .map_err(|e| format!("ACME client: {}", crate::error_chain(&e)))?
                    .create(
                        &NewAccount {
                            contact: &contact,
                            terms_of_service_agreed: true,
                            only_return_existing: false,
                        },
                        directory.clone(),
                        None,
                    )
                    .await
                    .map_err(|e| {
                        format!(
                            "{directory}: cannot create an account: {}",
                            crate::error_chain(&e)
                        )
                    })?;
                let text = serde_json::to_vec(&credentials).map_err(|e| e.to_string())?;
                tokio::task::spawn_blocking(move || {
                    crate::artifact::write_atomic_mode(&file, &text, 0o600)
                })
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())?;
                tracing::info!(directory = %directory, id = account.id(), "ACME: account created");
                account
            }
        };
        self.account = Some(account.clone());
        Ok(account)
    }

    /// Orders a certificate for `host` under its lease, stores it and returns its record.
    async fn obtain(
        &mut self,
        host: &str,
        current: Option<&Record>,
    ) -> Result<Record, OrderFailed> {
        let (store, h, holder) = (
            self.certificates.store.clone(),
            host.to_string(),
            self.holder.clone(),
        );
        let seen = current.map(|r| r.bundle.clone());
        let leased = tokio::task::spawn_blocking(move || {
            store.change(|i| {
                // Another process stored a certificate for the name since this round read the
                // index (and gave its lease back): it is served at the next sync, not ordered
                // again.
                let now_stored = i
                    .certificates
                    .get(&h)
                    .filter(|r| r.source == Source::Acme)
                    .map(|r| r.bundle.clone());
                now_stored == seen && i.take_lease(&h, &holder, LEASE_SECONDS)
            })
        })
        .await??;
        if !leased {
            return Err(OrderFailed::Busy);
        }
        let ordered = tokio::time::timeout(
            Duration::from_secs(LEASE_SECONDS - 60),
            self.order(host, current),
        )
        .await
        .unwrap_or_else(|_| Err(OrderFailed::Error("the order took too long".into())));
        let (store, h, holder) = (
            self.certificates.store.clone(),
            host.to_string(),
            self.holder.clone(),
        );
        let record = ordered.as_ref().ok().cloned();
        tokio::task::spawn_blocking(move || {
            store.change(|i| {
                if let Some(r) = &record {
                    i.certificates.insert(h.clone(), r.clone());
                }
                i.challenges.remove(&h);
                i.release_lease(&h, &holder);
            })
        })
        .await??;
        ordered
    }

    /// In a fleet, puts the answer to `host`'s challenge in the registry's index, and waits
    /// until every replica has read it: the CA's validation may reach any of them. (It leaves
    /// the index with the order's lease.) Nothing to do for one data directory.
    async fn publish_challenge(&self, host: &str, challenge: Challenge) -> Result<(), OrderFailed> {
        let store = self.certificates.store.clone();
        let Some(wait) = store.propagation() else {
            return Ok(());
        };
        let h = host.to_string();
        tokio::task::spawn_blocking(move || {
            store.change(|i| {
                i.challenges.insert(h.clone(), challenge.clone());
            })
        })
        .await??;
        tokio::time::sleep(wait).await;
        Ok(())
    }

    /// One order: answer the challenge, finalize, fetch and check the certificate, store it.
    async fn order(&mut self, host: &str, current: Option<&Record>) -> Result<Record, OrderFailed> {
        let account = self.account().await.map_err(OrderFailed::Error)?;
        let ids = [Identifier::Dns(host.to_string())];
        // The certificate this one replaces, for CAs with renewal information (RFC 9773).
        let replaces = match current {
            Some(r) => self.certificate_id(r).await.ok(),
            None => None,
        };
        let mut order = match replaces {
            Some(id) => match account.new_order(&NewOrder::new(&ids).replaces(id)).await {
                Err(instant_acme::Error::Unsupported(_)) => {
                    account.new_order(&NewOrder::new(&ids)).await?
                }
                // The CA refused the order for the certificate it names as replaced: one
                // already replaced (by an order whose answer was lost, or finalized by a process
                // that stopped before storing it), one another account ordered, one the CA does
                // not find. `replaces` only asks the CA to link the two certificates, so the
                // renewal is a plain order; without this, such a name could never be renewed
                // again. (A refusal for the rate only would be refused again: not repeated.)
                Err(instant_acme::Error::Api(p)) if !is_rate_limited(&p) => {
                    if is_already_replaced(&p) {
                        tracing::info!(
                            host,
                            "ACME: the CA says this certificate was already replaced; ordering a new one"
                        );
                    } else {
                        tracing::warn!(
                            host,
                            problem = %p,
                            "ACME: the CA refused an order replacing the current certificate; ordering a new one"
                        );
                    }
                    account.new_order(&NewOrder::new(&ids)).await?
                }
                other => other?,
            },
            None => account.new_order(&NewOrder::new(&ids)).await?,
        };
        let kind = match self.config.challenge {
            AcmeChallenge::TlsAlpn01 => ChallengeType::TlsAlpn01,
            AcmeChallenge::Http01 => ChallengeType::Http01,
        };
        let mut answers = Answers {
            certificates: &self.certificates,
            alpn: Vec::new(),
            http: Vec::new(),
        };
        let mut authorizations = order.authorizations();
        while let Some(a) = authorizations.next().await {
            let mut a = a?;
            match a.status {
                AuthorizationStatus::Valid => continue,
                AuthorizationStatus::Pending => {}
                s => {
                    return Err(OrderFailed::Error(format!(
                        "the authorization for {host} is {s:?}"
                    )));
                }
            }
            let Some(mut challenge) = a.challenge(kind.clone()) else {
                return Err(OrderFailed::Error(format!(
                    "the CA offers no {kind:?} challenge for {host}"
                )));
            };
            let key_authorization = challenge.key_authorization();
            let shared = match self.config.challenge {
                AcmeChallenge::TlsAlpn01 => {
                    let digest = key_authorization.digest();
                    let cert = alpn_certificate(host, digest.as_ref())?;
                    self.certificates.set_alpn_challenge(host, Some(cert));
                    answers.alpn.push(host.to_string());
                    Challenge::TlsAlpn01 {
                        digest: crate::hex::encode(digest.as_ref()),
                    }
                }
                AcmeChallenge::Http01 => {
                    let token = challenge.token.clone();
                    let answer = key_authorization.as_str().to_string();
                    self.certificates
                        .set_http_challenge(&token, Some(answer.clone()));
                    answers.http.push(token.clone());
                    Challenge::Http01 {
                        token,
                        key_authorization: answer,
                    }
                }
            };
            self.publish_challenge(host, shared).await?;
            challenge.set_ready().await?;
        }
        let retries = RetryPolicy::new()
            .initial_delay(Duration::from_millis(250))
            .timeout(Duration::from_secs(90));
        let status = order.poll_ready(&retries).await?;
        drop(answers);
        if status != OrderStatus::Ready {
            let why = order
                .state()
                .error
                .as_ref()
                .map_or_else(|| format!("{status:?}"), ToString::to_string);
            return Err(OrderFailed::Error(format!(
                "the CA did not validate {host}: {why}"
            )));
        }
        let key = order.finalize().await?;
        let chain = order.poll_certificate(&retries).await?;
        // Checked (parsed, key matched, name covered) and stored off the reactor.
        let (store, hosts) = (self.certificates.store.clone(), vec![host.to_string()]);
        let (loaded, bundle) = tokio::task::spawn_blocking(move || {
            let names = ("the CA's certificate", "the generated key");
            let loaded = Loaded::from_pem(chain.as_bytes(), key.as_bytes(), &hosts, names)
                .map_err(|e| OrderFailed::Error(e.to_string()))?;
            let bundle = store.put_bundle(chain.as_bytes(), key.as_bytes())?;
            Ok::<_, OrderFailed>((loaded, bundle))
        })
        .await??;
        Ok(Record {
            hosts: vec![host.to_string()],
            bundle,
            source: Source::Acme,
            not_after: loaded.not_after,
            stored_at: now(),
        })
    }
}

/// The CA refused an order's `replaces` because the certificate already has a replacement
/// (RFC 9773 section 5).
fn is_already_replaced(p: &instant_acme::Problem) -> bool {
    p.r#type.as_deref() == Some("urn:ietf:params:acme:error:alreadyReplaced")
}

/// The CA refused a request for its rate limits (RFC 8555 section 6.6).
fn is_rate_limited(p: &instant_acme::Problem) -> bool {
    p.r#type.as_deref() == Some("urn:ietf:params:acme:error:rateLimited")
}

/// The challenge answers of one order, withdrawn when it ends however it ends.
struct Answers<'a> {
    certificates: &'a Certificates,
    alpn: Vec<String>,
    http: Vec<String>,
}

impl Drop for Answers<'_> {
    fn drop(&mut self) {
        for name in &self.alpn {
            self.certificates.set_alpn_challenge(name, None);
        }
        for token in &self.http {
            self.certificates.set_http_challenge(token, None);
        }
    }
}
