//! Scoped admin tokens (`POST`/`GET /admin/v1/tokens`, `DELETE /admin/v1/tokens/{id}`, `POST
//! /admin/v1/tokens/{id}/rotate`, `tern token`): kept in the manifest as digests
//! ([`crate::access`]), changed like any record of it (committed: written, on a fleet to the
//! shared registry, before it is used), read by every admin request without the state's lock.
//! In a fleet every replica reads them from the registry: a token made or revoked on one
//! replica is valid or refused on the others once they read the change (at once when nudged,
//! else within the poll interval).
//!
//! When each token was last used is kept per replica ([`Registry::token_used`]), saved in the
//! data directory and, in a fleet, in the replica's report; the listing shows the latest.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;

use serde::{Deserialize, Serialize};

use super::state::{Change, Registry};
use crate::access::{self, MAX_TOKEN_TENANTS, Scope, StoredToken, TenantPattern};
use crate::change::ChangeError;

/// What `POST /admin/v1/tokens` reads.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewToken {
    /// A name for people (`ci-deploy`).
    pub name: String,
    /// The tenants it reaches: names, or patterns `team-a-*`.
    pub tenants: Vec<String>,
    /// Its scopes ([`Scope`] names).
    pub scopes: Vec<String>,
    /// Its lifetime (`30d`, `12h`, `90s`); none: until revoked.
    #[serde(default)]
    pub expires: Option<String>,
}

/// A token as the API lists it: never its secret nor its digest.
#[derive(Debug, Serialize)]
pub struct Listed {
    /// Its id (the part of the token after `tern_`, before the secret).
    pub id: String,
    /// Its name.
    pub name: String,
    /// The tenants it reaches.
    pub tenants: Vec<TenantPattern>,
    /// Its scopes.
    pub scopes: Vec<Scope>,
    /// When it was made (Unix seconds).
    pub created: u64,
    /// When it stops working (Unix seconds), if it does.
    pub expires: Option<u64>,
    /// Whether it has.
    pub expired: bool,
    /// When it was last used (Unix seconds) on any replica that reported it.
    pub last_used: Option<u64>,
}

impl Listed {
    fn of(id: &str, t: &StoredToken, now: u64) -> Self {
        Self {
            id: id.to_string(),
            name: t.name.clone(),
            tenants: t.tenants.clone(),
            scopes: t.scopes.clone(),
            created: t.created,
            expires: t.expires,
            expired: t.expired(now),
            last_used: None,
        }
    }
}

/// Why a bearer token that looks scoped is refused (`401`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenRefused {
    /// No such token (never made, revoked, or a wrong secret).
    Unknown,
    /// It has expired.
    Expired,
}

impl NewToken {
    /// The record this asks for, made at `now`.
    fn record(&self, digest: String, now: u64) -> Result<StoredToken, ChangeError> {
        let invalid = ChangeError::Invalid;
        access::check_name(&self.name).map_err(invalid)?;
        if self.tenants.is_empty() {
            return Err(invalid(
                "a token names at least one tenant (or pattern, `team-a-*`)".into(),
            ));
        }
        if self.tenants.len() > MAX_TOKEN_TENANTS {
            return Err(invalid(format!(
                "a token names at most {MAX_TOKEN_TENANTS} tenants or patterns, not {}",
                self.tenants.len()
            )));
        }
        let mut tenants = Vec::with_capacity(self.tenants.len());
        for t in &self.tenants {
            tenants.push(TenantPattern::parse(t).map_err(invalid)?);
        }
        if self.scopes.is_empty() {
            return Err(invalid(format!(
                "a token has at least one scope: {}",
                Scope::ALL.map(Scope::name).join(", ")
            )));
        }
        let mut scopes = Vec::with_capacity(self.scopes.len());
        for s in &self.scopes {
            scopes.push(Scope::parse(s).map_err(invalid)?);
        }
        scopes.sort_unstable();
        scopes.dedup();
        let expires = match &self.expires {
            None => None,
            Some(e) => Some(now.saturating_add(access::parse_lifetime(e).map_err(invalid)?)),
        };
        Ok(StoredToken {
            name: self.name.clone(),
            digest,
            tenants,
            scopes,
            created: now,
            expires,
        })
    }
}

impl Registry {
    /// Makes a token; returns the whole token (shown once: only its digest is kept) and how
    /// it is listed.
    ///
    /// # Errors
    /// `400` a bad name, tenant pattern, scope or expiry; `409` past [`access::MAX_TOKENS`]; `503` a
    /// fleet's registry cannot be reached; `500` if it cannot be written.
    pub async fn create_token(&self, new: &NewToken) -> Result<(String, Listed), ChangeError> {
        let (id, token, digest) = access::mint(None)
            .map_err(|e| ChangeError::Internal(format!("no random bytes for a token: {e}")))?;
        let now = crate::datadir::now();
        let record = new.record(digest, now)?;
        let listed = Listed::of(&id, &record, now);
        let mut state = self.lock().await?;
        access::check_room(&state.truth().tokens)?;
        let change = Change::Token {
            id: id.clone(),
            base: None,
            entry: Some(record),
        };
        self.commit(&mut state, change).await?;
        tracing::info!(token = %id, name = %new.name, "admin token created");
        Ok((token, listed))
    }

    /// Every token, as listed, with when it was last used on this replica or, in a fleet, on
    /// any replica whose report says so.
    pub async fn list_tokens(&self) -> Vec<Listed> {
        let now = crate::datadir::now();
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(fleet) = &self.fleet {
            for report in super::shared::reports(fleet).await.unwrap_or_default() {
                let Some(theirs) = report["tokens_used"].as_object() else {
                    continue;
                };
                for (id, at) in theirs {
                    if let Some(at) = at.as_u64() {
                        let mine = used.entry(id.clone()).or_default();
                        *mine = (*mine).max(at);
                    }
                }
            }
        }
        self.tokens
            .load()
            .iter()
            .map(|(id, t)| Listed {
                last_used: used.get(id).copied(),
                ..Listed::of(id, t, now)
            })
            .collect()
    }

    /// Revokes token `id`: it is refused from the next request (on a fleet's other replicas,
    /// once they read the change).
    ///
    /// # Errors
    /// `404` no such token; `503` a fleet's registry cannot be reached; `500` if the change
    /// cannot be written.
    pub async fn revoke_token(&self, id: &str) -> Result<(), ChangeError> {
        let mut state = self.lock().await?;
        let base = state.truth().tokens.get(id).cloned();
        if base.is_none() {
            return Err(ChangeError::NotFound(format!("no token {id:?}")));
        }
        let change = Change::Token {
            id: id.to_string(),
            base,
            entry: None,
        };
        self.commit(&mut state, change).await?;
        tracing::info!(token = %id, "admin token revoked");
        Ok(())
    }

    /// Rotates token `id`: a new secret under the same id, name, tenants and scopes; the old
    /// secret is refused from the next request. `expires` (a lifetime from now) replaces its
    /// expiry; without it the expiry stays, and an expired token must be given one.
    ///
    /// # Errors
    /// `404` no such token; `400` a bad lifetime; `409` an expired token without a new
    /// lifetime; `503`/`500` as [`Registry::revoke_token`].
    pub async fn rotate_token(
        &self,
        id: &str,
        expires: Option<&str>,
    ) -> Result<(String, Listed), ChangeError> {
        let now = crate::datadir::now();
        let expires = expires
            .map(|e| access::parse_lifetime(e).map(|s| now.saturating_add(s)))
            .transpose()
            .map_err(ChangeError::Invalid)?;
        let mut state = self.lock().await?;
        let Some(base) = state.truth().tokens.get(id).cloned() else {
            return Err(ChangeError::NotFound(format!("no token {id:?}")));
        };
        if expires.is_none() && base.expired(now) {
            return Err(ChangeError::Conflict(format!(
                "token {id} has expired: give it a new lifetime to rotate it (tern token rotate \
                 {id} --expires 30d)"
            )));
        }
        let (_, token, digest) = access::mint(Some(id))
            .map_err(|e| ChangeError::Internal(format!("no random bytes for a token: {e}")))?;
        let mut entry = base.clone();
        entry.digest = digest;
        entry.expires = expires.or(base.expires);
        let listed = Listed::of(id, &entry, now);
        let change = Change::Token {
            id: id.to_string(),
            base: Some(base),
            entry: Some(entry),
        };
        self.commit(&mut state, change).await?;
        tracing::info!(token = %id, "admin token rotated");
        Ok((token, listed))
    }

    /// The scoped token `bearer` is, with its id; its use is noted ([`Registry::token_used`]).
    ///
    /// # Errors
    /// [`TokenRefused`].
    pub fn scoped_token(&self, bearer: &str) -> Result<(String, StoredToken), TokenRefused> {
        let id = access::id_of(bearer).ok_or(TokenRefused::Unknown)?;
        let tokens = self.tokens.load();
        let token = tokens
            .get(id)
            .filter(|t| access::matches(bearer, t))
            .ok_or(TokenRefused::Unknown)?;
        let now = crate::datadir::now();
        if token.expired(now) {
            return Err(TokenRefused::Expired);
        }
        let last = {
            let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
            match used.get_mut(id) {
                Some(at) => std::mem::replace(at, now),
                None => {
                    used.insert(id.to_string(), now);
                    0
                }
            }
        };
        self.used_dirty.store(true, Ordering::Relaxed);
        if now.saturating_sub(last) >= USE_REPORTED_WITHIN {
            // The fleet's listing learns of it at this replica's next report, not its
            // heartbeat's.
            self.changed();
        }
        Ok((id.to_string(), token.clone()))
    }

    /// When each token was last used on this replica (Unix seconds), for its report; revoked
    /// tokens are forgotten.
    pub(super) fn token_used(&self) -> BTreeMap<String, u64> {
        let tokens = self.tokens.load();
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        used.retain(|id, _| tokens.contains_key(id));
        used.iter().map(|(id, at)| (id.clone(), *at)).collect()
    }

    /// Saves when each token was last used in the data directory (`tokens-used.json`), if a
    /// use was noted since the last save; off the reactor.
    pub async fn save_token_use(&self) {
        if !self.used_dirty.swap(false, Ordering::Relaxed) {
            return;
        }
        let used = self.token_used();
        let store = self.loader.store.clone();
        let saved = tokio::task::spawn_blocking(move || {
            let text = serde_json::to_vec(&used).unwrap_or_default();
            crate::artifact::write_atomic(&store.root().join(USED_FILE), &text)
        })
        .await;
        if let Ok(Err(e)) = saved {
            tracing::warn!("cannot save when the admin tokens were last used: {e}");
        }
    }
}

/// How stale a token's last use may be in this replica's report: a use later than this after
/// the one reported makes the report due.
const USE_REPORTED_WITHIN: u64 = 60;

/// When each token was last used, in the data directory.
const USED_FILE: &str = "tokens-used.json";

/// When each token was last used as the data directory saved it (none: not saved yet).
pub(super) fn load_use(root: &std::path::Path) -> HashMap<String, u64> {
    std::fs::read(root.join(USED_FILE))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}
