//! Certificates uploaded through the admin API (`PUT /admin/v1/certificates/{name}`, `tern cert
//! put`): checked like a config file's, kept in the data directory ([`super::stored`]) and
//! served from the next handshake; a refused upload changes nothing.

use std::sync::Arc;

use serde_json::{Value, json};

use super::certificates::Certificates;
use super::stored::{Record, Source};
use super::table::Loaded;
use crate::change::ChangeError;
use crate::datadir::now;

/// An upload: the certificate's host names (none: the default certificate) and PEM texts.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Upload {
    /// Host names it serves, exact or `*.wildcard`; empty: the default certificate.
    #[serde(default)]
    pub hosts: Vec<String>,
    /// The certificate, then its chain (PEM).
    pub cert: String,
    /// Its private key (PEM).
    pub key: String,
}

fn internal(e: impl std::fmt::Display) -> ChangeError {
    ChangeError::Internal(e.to_string())
}

fn stored(e: crate::datadir::StoreError) -> ChangeError {
    match e {
        crate::datadir::StoreError::Unavailable(m) => ChangeError::Unavailable(m),
        e => internal(e),
    }
}

impl Certificates {
    /// Checks and stores `upload` as the certificate `name` (replacing one of that name);
    /// whether it is new. Served from the next handshake.
    ///
    /// # Errors
    /// See [`ChangeError`]; nothing changes then.
    pub async fn put_uploaded(
        self: &Arc<Self>,
        name: &str,
        upload: Upload,
    ) -> Result<bool, ChangeError> {
        if name.is_empty() || name.len() > 253 || name.contains(['/', ' ']) {
            return Err(ChangeError::Invalid(format!(
                "{name:?} is not a certificate name (1-253 characters, no `/` or spaces)"
            )));
        }
        let hosts: Vec<String> = upload
            .hosts
            .iter()
            .map(|h| h.to_ascii_lowercase())
            .collect();
        for h in &hosts {
            if h == "*" {
                return Err(ChangeError::Invalid(
                    "hosts: \"*\" is not a name; leave `hosts` out for the default certificate"
                        .into(),
                ));
            }
            crate::router::HostPattern::parse(h)
                .map_err(|m| ChangeError::Invalid(format!("hosts: {m}")))?;
        }
        let (file, _) = self.tables();
        if let Some(h) = hosts.iter().find(|h| file.names(h)) {
            return Err(ChangeError::Conflict(format!(
                "host {h:?} is served by a [[certificate]] of the config file; change it there"
            )));
        }
        if hosts.is_empty() && file.has_default() {
            return Err(ChangeError::Conflict(
                "the config file has a default certificate (no `hosts`); give this one `hosts`"
                    .into(),
            ));
        }
        let store = self.store.clone();
        let name = name.to_string();
        // Parsing and the key check, like the disk work, stay off the reactor.
        let created = tokio::task::spawn_blocking(move || {
            let loaded = Loaded::from_pem(
                upload.cert.as_bytes(),
                upload.key.as_bytes(),
                &hosts,
                ("cert", "key"),
            )
            .map_err(|e| ChangeError::Unprocessable(e.to_string()))?;
            let bundle = store
                .put_bundle(upload.cert.as_bytes(), upload.key.as_bytes())
                .map_err(stored)?;
            let record = Record {
                hosts: hosts.clone(),
                bundle,
                source: Source::Api,
                not_after: loaded.not_after,
                stored_at: now(),
            };
            let changed = store
                .change(|index| {
                    let others = index
                        .certificates
                        .iter()
                        .filter(|(n, r)| **n != name && r.source == Source::Api);
                    for (other, r) in others {
                        if let Some(h) = hosts.iter().find(|h| r.hosts.contains(h)) {
                            return Err(ChangeError::Conflict(format!(
                                "host {h:?} is served by the uploaded certificate {other:?}"
                            )));
                        }
                        if hosts.is_empty() && r.hosts.is_empty() {
                            return Err(ChangeError::Conflict(format!(
                                "{other:?} is the default certificate already; give this one \
                                 `hosts`"
                            )));
                        }
                    }
                    Ok(index
                        .certificates
                        .insert(name.clone(), record.clone())
                        .is_none())
                })
                .map_err(stored)?;
            let table = store.table(&store.read().map_err(stored)?);
            Ok::<_, ChangeError>((changed?, table))
        })
        .await
        .map_err(internal)??;
        self.replace_stored(created.1);
        Ok(created.0)
    }

    /// Removes the stored certificate `name` (uploaded, or obtained by ACME, which orders it
    /// again if its name is still wanted).
    ///
    /// # Errors
    /// [`ChangeError::NotFound`] if there is none.
    pub async fn delete_stored(self: &Arc<Self>, name: &str) -> Result<(), ChangeError> {
        let store = self.store.clone();
        let name = name.to_string();
        let table = tokio::task::spawn_blocking(move || {
            let found = store
                .change(|index| index.certificates.remove(&name).is_some())
                .map_err(stored)?;
            if !found {
                return Err(ChangeError::NotFound(format!(
                    "no stored certificate {name:?} (config-file certificates are changed in \
                     the file)"
                )));
            }
            Ok(store.table(&store.read().map_err(stored)?))
        })
        .await
        .map_err(internal)??;
        self.replace_stored(table);
        Ok(())
    }

    /// Every certificate: the config file's and the stored ones, with hosts, source and expiry.
    ///
    /// # Errors
    /// If the data directory cannot be read.
    pub async fn describe(&self) -> Result<Value, ChangeError> {
        let store = self.store.clone();
        let index = tokio::task::spawn_blocking(move || store.read())
            .await
            .map_err(internal)?
            .map_err(stored)?;
        let (file, _) = self.tables();
        let mut list: Vec<Value> = file
            .certificates
            .iter()
            .map(|c| {
                json!({
                    "name": c.hosts.first().map_or("default", String::as_str),
                    "hosts": c.hosts,
                    "source": "config",
                    "not_after": c.not_after,
                })
            })
            .collect();
        list.extend(index.certificates.iter().map(|(name, r)| {
            json!({
                "name": name,
                "hosts": r.hosts,
                "source": r.source,
                "not_after": r.not_after,
                "stored_at": r.stored_at,
            })
        }));
        Ok(json!({ "certificates": list, "now": now() }))
    }
}
