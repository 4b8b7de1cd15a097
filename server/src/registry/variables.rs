//! Changes to tenants' variables (`PUT`/`DELETE /admin/v1/tenants/{name}/variables/{var}`,
//! `tern var`, `tern secret`): each is a change of the tenant's record, committed like any
//! other (in a fleet through the shared registry), that loads nothing: the variables guests
//! read follow the record ([`crate::variables::Table`]), so the next request sees it.

use std::collections::BTreeMap;

use serde::Serialize;

use super::state::{Change, Registry};
use crate::change::ChangeError;
use crate::datadir::{self, StoredTenant};
use crate::variables::{MAX_VARIABLES, SecretsKey, Stored, check_name, check_value};

/// A variable as the admin API lists it: a secret's value is never in it.
#[derive(Debug, Serialize)]
pub struct Listed {
    /// Its name.
    pub name: String,
    /// Whether it is a secret.
    pub secret: bool,
    /// A plain variable's value.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// A secret's digest (16 hex digits keyed by the secrets key: equal values, equal
    /// digests).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// When it was set (Unix seconds).
    pub updated_at: u64,
}

impl Listed {
    fn of(name: &str, stored: &Stored) -> Self {
        match stored {
            Stored::Plain { value, updated_at } => Self {
                name: name.to_string(),
                secret: false,
                value: Some(value.clone()),
                digest: None,
                updated_at: *updated_at,
            },
            Stored::Secret {
                digest, updated_at, ..
            } => Self {
                name: name.to_string(),
                secret: true,
                value: None,
                digest: Some(digest.clone()),
                updated_at: *updated_at,
            },
        }
    }
}

impl Registry {
    /// The id of the secrets key sealing new secrets (not secret: derived one-way).
    pub fn secrets_key_id(&self) -> Option<&str> {
        self.secrets.as_deref().map(SecretsKey::id)
    }

    /// The secrets key, or why there is none here (`409`).
    fn key(&self) -> Result<std::sync::Arc<SecretsKey>, ChangeError> {
        self.secrets
            .clone()
            .ok_or_else(|| ChangeError::Conflict(crate::variables::seal::NO_KEY.into()))
    }

    /// The variables of API tenant `name` (a config-file tenant's are in the file).
    ///
    /// # Errors
    /// `404` unknown tenant, `409` config-owned.
    pub async fn variables(&self, name: &str) -> Result<Vec<Listed>, ChangeError> {
        let state = self.state.lock().await;
        Self::check_api_owned(&state, name)?;
        let stored = state
            .truth()
            .tenants
            .get(name)
            .ok_or_else(|| ChangeError::NotFound(format!("no tenant {name:?}")))?;
        Ok(stored
            .variables
            .iter()
            .map(|(n, v)| Listed::of(n, v))
            .collect())
    }

    /// Sets API tenant `name`'s variable `var` to `value`, sealed when `secret`. Returns what
    /// the API lists of it (no secret value).
    ///
    /// # Errors
    /// `400` a bad name or a value too large, `404` unknown tenant, `409` config-owned or one
    /// variable too many.
    pub async fn set_variable(
        &self,
        name: &str,
        var: &str,
        value: &str,
        secret: bool,
    ) -> Result<Listed, ChangeError> {
        check_name(var).map_err(ChangeError::Invalid)?;
        check_value(var, value).map_err(ChangeError::Invalid)?;
        let updated_at = datadir::now();
        let stored = if secret {
            let key = self.key()?;
            Stored::Secret {
                sealed: key.seal(name, var, value),
                digest: key.digest(name, var, value),
                updated_at,
            }
        } else {
            Stored::Plain {
                value: value.to_string(),
                updated_at,
            }
        };
        let listed = Listed::of(var, &stored);
        self.change_variables(name, |vars| {
            if !vars.contains_key(var) && vars.len() >= MAX_VARIABLES {
                return Err(ChangeError::Conflict(format!(
                    "tenant {name:?} has {MAX_VARIABLES} variables, the most a tenant has; \
                     delete one first"
                )));
            }
            vars.insert(var.to_string(), stored);
            Ok(())
        })
        .await?;
        tracing::info!(tenant = name, variable = var, secret, "variable set");
        Ok(listed)
    }

    /// Deletes API tenant `name`'s variable `var`.
    ///
    /// # Errors
    /// `404` unknown tenant or variable, `409` config-owned.
    pub async fn delete_variable(&self, name: &str, var: &str) -> Result<(), ChangeError> {
        self.change_variables(name, |vars| {
            vars.remove(var).map(|_| ()).ok_or_else(|| {
                ChangeError::NotFound(format!("tenant {name:?} has no variable {var:?}"))
            })
        })
        .await?;
        tracing::info!(tenant = name, variable = var, "variable deleted");
        Ok(())
    }

    /// Seals every API tenant's secrets again under the current secrets key (after a
    /// rotation, with the old key given as the previous one). Returns how many were sealed
    /// again.
    ///
    /// # Errors
    /// A secret neither key opens (`409`, naming it; nothing after it is changed), or a
    /// registry that cannot be written.
    pub async fn reseal(&self) -> Result<usize, ChangeError> {
        let key = self.key()?;
        let names: Vec<String> = {
            let state = self.state.lock().await;
            state.truth().tenants.keys().cloned().collect()
        };
        let mut count = 0;
        for name in names {
            let key = key.clone();
            let mut resealed = 0;
            let outcome = self
                .change_variables(&name, |vars| {
                    for (var, stored) in vars.iter_mut() {
                        let Stored::Secret {
                            sealed, updated_at, ..
                        } = stored
                        else {
                            continue;
                        };
                        if key.is_current(sealed) {
                            continue;
                        }
                        let value = key.open(&name, var, sealed).map_err(|why| {
                            ChangeError::Conflict(format!("tenant {name:?}: {why}"))
                        })?;
                        *stored = Stored::Secret {
                            sealed: key.seal(&name, var, value.expose()),
                            digest: key.digest(&name, var, value.expose()),
                            updated_at: *updated_at,
                        };
                        resealed += 1;
                    }
                    if resealed == 0 {
                        return Err(ChangeError::NotFound(String::new()));
                    }
                    Ok(())
                })
                .await;
            match outcome {
                Ok(()) => count += resealed,
                // Nothing to seal again, or the tenant was deleted meanwhile.
                Err(ChangeError::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        tracing::info!(secrets = count, key = key.id(), "secrets sealed again");
        Ok(count)
    }

    /// Applies `change` to API tenant `name`'s variables and commits the record.
    async fn change_variables(
        &self,
        name: &str,
        change: impl FnOnce(&mut BTreeMap<String, Stored>) -> Result<(), ChangeError>,
    ) -> Result<(), ChangeError> {
        let mut state = self.lock().await?;
        Self::check_api_owned(&state, name)?;
        let base: StoredTenant = state
            .truth()
            .tenants
            .get(name)
            .cloned()
            .ok_or_else(|| ChangeError::NotFound(format!("no tenant {name:?}")))?;
        let mut entry = base.clone();
        change(&mut entry.variables)?;
        let commit = Change::Tenant {
            name: name.to_string(),
            base: Some(base),
            entry: Some(entry),
            // Nothing is loaded: the variables guests read follow the record.
            serve: None,
        };
        self.commit(&mut state, commit).await
    }
}
