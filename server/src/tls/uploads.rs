//! Certificates uploaded through the admin API (`PUT /admin/v1/certificates/{name}`, `tern cert
//! put`): checked like a config file's, kept in the data directory ([`super::stored`]) and
//! served from the next handshake; a refused upload changes nothing.

use std::sync::Arc;

use serde_json::{Value, json};

use super::stored::{Record, Source};
use super::{Certificates, Loaded};
use crate::store::now;

/// Why a certificate change was refused.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    /// Malformed input (`400`).
    #[error("{0}")]
    Invalid(String),
    /// Well-formed but unusable: bad PEM, a key of another certificate, a host it does not
    /// cover (`422`).
    #[error("{0}")]
    Unusable(String),
    /// Clashes with a certificate that serves the name already (`409`).
    #[error("{0}")]
    Conflict(String),
    /// No such certificate (`404`).
    #[error("{0}")]
    NotFound(String),
    /// The data directory could not be read or written (`500`).
    #[error("{0}")]
    Internal(String),
    /// A fleet's registry could not be reached; nothing changed (`503`).
    #[error("{0}")]
    Unavailable(String),
}

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

fn internal(e: impl std::fmt::Display) -> Refused {
    Refused::Internal(e.to_string())
}

fn stored(e: crate::store::StoreError) -> Refused {
    match e {
        crate::store::StoreError::Unavailable(m) => Refused::Unavailable(m),
        e => internal(e),
    }
}

impl Certificates {
    /// Checks and stores `upload` as the certificate `name` (replacing one of that name);
    /// whether it is new. Served from the next handshake.
    ///
    /// # Errors
    /// See [`Refused`]; nothing changes then.
    pub async fn put_uploaded(
        self: &Arc<Self>,
        name: &str,
        upload: Upload,
    ) -> Result<bool, Refused> {
        if name.is_empty() || name.len() > 253 || name.contains(['/', ' ']) {
            return Err(Refused::Invalid(format!(
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
                return Err(Refused::Invalid(
                    "hosts: \"*\" is not a name; leave `hosts` out for the default certificate"
                        .into(),
                ));
            }
            crate::router::HostPattern::parse(h)
                .map_err(|m| Refused::Invalid(format!("hosts: {m}")))?;
        }
        let (file, _) = self.tables();
        if let Some(h) = hosts.iter().find(|h| file.names(h)) {
            return Err(Refused::Conflict(format!(
                "host {h:?} is served by a [[certificate]] of the config file; change it there"
            )));
        }
        if hosts.is_empty() && file.has_default() {
            return Err(Refused::Conflict(
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
            .map_err(|e| Refused::Unusable(e.to_string()))?;
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
                            return Err(Refused::Conflict(format!(
                                "host {h:?} is served by the uploaded certificate {other:?}"
                            )));
                        }
                        if hosts.is_empty() && r.hosts.is_empty() {
                            return Err(Refused::Conflict(format!(
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
            Ok::<_, Refused>((changed?, table))
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
    /// [`Refused::NotFound`] if there is none.
    pub async fn delete_stored(self: &Arc<Self>, name: &str) -> Result<(), Refused> {
        let store = self.store.clone();
        let name = name.to_string();
        let table = tokio::task::spawn_blocking(move || {
            let found = store
                .change(|index| index.certificates.remove(&name).is_some())
                .map_err(stored)?;
            if !found {
                return Err(Refused::NotFound(format!(
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
    pub async fn describe(&self) -> Result<Value, Refused> {
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
