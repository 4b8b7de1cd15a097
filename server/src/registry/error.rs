//! Why a change was refused, and the status the admin API answers with.

use http::StatusCode;

use crate::artifact::ArtifactError;
use crate::router::Clash;
use crate::tenant::TenantError;

/// A change that was refused; the running tenants are unchanged.
#[derive(Debug, thiserror::Error)]
pub enum ChangeError {
    /// No such tenant (`404`).
    #[error("{0}")]
    NotFound(String),
    /// The change conflicts with the current state: a route or name clash, a tenant owned by
    /// the config file, nothing to roll back to (`409`).
    #[error("{0}")]
    Conflict(String),
    /// Malformed input: not Wasm, truncated, bad JSON or values (`400`).
    #[error("{0}")]
    Invalid(String),
    /// An upload over the size limit (`413`).
    #[error("{0}")]
    TooLarge(String),
    /// Well-formed but unusable: imports Tern does not provide, no handler, bad assets
    /// (`422`).
    #[error("{0}")]
    Unprocessable(String),
    /// The tenant is not in the state the request's `If-Match` / `If-None-Match` requires; nothing
    /// changed (`412`).
    #[error("{0}")]
    PreconditionFailed(String),
    /// The endpoint exists but not with this method (`405`).
    #[error("{0}")]
    MethodNotAllowed(String),
    /// The fleet's shared registry cannot be reached, or did not confirm the change (the
    /// message says which: nothing changed, or its fate is unknown) (`503`).
    #[error("{0}")]
    Unavailable(String),
    /// The host has no room for another module: open files or memory mappings (`507`).
    #[error("{0}")]
    Capacity(String),
    /// The server could not complete it (disk full, ...) (`500`).
    #[error("{0}")]
    Internal(String),
}

impl ChangeError {
    /// The status the admin API answers with.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::Conflict(_) => StatusCode::CONFLICT,
            Self::Invalid(_) => StatusCode::BAD_REQUEST,
            Self::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Unprocessable(_) => StatusCode::UNPROCESSABLE_ENTITY,
            Self::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            Self::PreconditionFailed(_) => StatusCode::PRECONDITION_FAILED,
            Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Capacity(_) => StatusCode::INSUFFICIENT_STORAGE,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl From<TenantError> for ChangeError {
    fn from(e: TenantError) -> Self {
        match e {
            TenantError::Artifact {
                source: ArtifactError::InvalidWasm { .. },
                ..
            } => Self::Invalid(e.to_string()),
            TenantError::Artifact {
                source: ArtifactError::TooCostly { .. } | ArtifactError::Unsupported { .. },
                ..
            } => Self::Unprocessable(e.to_string()),
            TenantError::Artifact { ref source, .. } => Self::of_artifact(e.to_string(), source),
            TenantError::Abi { .. }
            | TenantError::Assets { .. }
            | TenantError::DoesNotFit { .. } => Self::Unprocessable(e.to_string()),
            TenantError::UnknownBuiltin { .. } => Self::Invalid(e.to_string()),
        }
    }
}

impl ChangeError {
    /// What the artifact error `source`, told as `text`, means for a change: `507` when the
    /// host ran out of files or mappings (with the limit and how to raise it, which a
    /// `HostLimit` tells already), else `500`.
    fn of_artifact(text: String, source: &ArtifactError) -> Self {
        match source.exhausted() {
            None => Self::Internal(text),
            Some(_) if matches!(source, ArtifactError::HostLimit { .. }) => Self::Capacity(text),
            Some(limit) => Self::Capacity(format!("{text}; {}", limit.advice())),
        }
    }
}

/// Storing a file failed: `507` if the host ran out of file descriptors, else `500`.
impl From<ArtifactError> for ChangeError {
    fn from(e: ArtifactError) -> Self {
        Self::of_artifact(e.to_string(), &e)
    }
}

impl From<Clash> for ChangeError {
    fn from(c: Clash) -> Self {
        Self::Conflict(format!(
            "tenant {:?}: {c}; choose other hosts or paths",
            c.other
        ))
    }
}

pub(super) fn internal(e: impl std::fmt::Display) -> ChangeError {
    ChangeError::Internal(e.to_string())
}
