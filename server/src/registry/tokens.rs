//! Scoped admin tokens (`POST`/`GET /admin/v1/tokens`, `DELETE /admin/v1/tokens/{id}`, `tern
//! token`): kept in the manifest as digests ([`crate::access`]), changed like any record of it
//! (written before it is used), read by every admin request without the state's lock.
//!
//! On a single server. A fleet's registry does not carry them yet: a replica of a fleet
//! refuses to make one (`409`), so no token works on one replica and not another.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::state::Registry;
use crate::access::{
    self, MAX_TOKEN_TENANTS, MAX_TOKENS, Scope, StoredToken, TenantPattern, Tokens,
};
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
    /// `400` a bad name, tenant pattern, scope or expiry; `409` past [`MAX_TOKENS`], or on a
    /// replica of a fleet; `500` if it cannot be written.
    pub async fn create_token(&self, new: &NewToken) -> Result<(String, Listed), ChangeError> {
        let (id, token, digest) = access::mint()
            .map_err(|e| ChangeError::Internal(format!("no random bytes for a token: {e}")))?;
        let now = crate::datadir::now();
        let record = new.record(digest, now)?;
        let listed = Listed::of(&id, &record, now);
        self.change_tokens(|tokens| {
            if tokens.len() >= MAX_TOKENS {
                return Err(ChangeError::Conflict(format!(
                    "{MAX_TOKENS} tokens already: revoke some first (tern token list, tern \
                     token revoke ID)"
                )));
            }
            tokens.insert(id.clone(), record);
            Ok(())
        })
        .await?;
        tracing::info!(token = %id, name = %new.name, "admin token created");
        Ok((token, listed))
    }

    /// Every token, as listed.
    pub fn list_tokens(&self) -> Vec<Listed> {
        let now = crate::datadir::now();
        self.tokens
            .load()
            .iter()
            .map(|(id, t)| Listed::of(id, t, now))
            .collect()
    }

    /// Revokes token `id`: it is refused from the next request.
    ///
    /// # Errors
    /// `404` no such token; `500` if the change cannot be written.
    pub async fn revoke_token(&self, id: &str) -> Result<(), ChangeError> {
        self.change_tokens(|tokens| {
            tokens
                .remove(id)
                .map(drop)
                .ok_or_else(|| ChangeError::NotFound(format!("no token {id:?}")))
        })
        .await?;
        tracing::info!(token = %id, "admin token revoked");
        Ok(())
    }

    /// The scoped token `bearer` is, with its id.
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
        if token.expired(crate::datadir::now()) {
            return Err(TokenRefused::Expired);
        }
        Ok((id.to_string(), token.clone()))
    }

    /// Changes the tokens with `f`, writes the manifest, then uses them.
    async fn change_tokens<T>(
        &self,
        f: impl FnOnce(&mut Tokens) -> Result<T, ChangeError>,
    ) -> Result<T, ChangeError> {
        if self.fleet.is_some() {
            return Err(ChangeError::Conflict(
                "scoped tokens are not shared through a fleet's registry yet: on a replica of \
                 a fleet use the operator's token"
                    .into(),
            ));
        }
        let mut state = self.state.lock().await;
        let mut manifest = state.manifest.clone();
        let out = f(&mut manifest.tokens)?;
        self.save_manifest(&manifest).await?;
        self.tokens.store(Arc::new(manifest.tokens.clone()));
        state.manifest = manifest;
        Ok(out)
    }
}
