//! What the registry's own errors (a tenant that cannot load, an artifact, a route clash) mean
//! as a refused change.

use crate::artifact::ArtifactError;
use crate::change::ChangeError;
use crate::router::Clash;
use crate::tenant::TenantError;

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
