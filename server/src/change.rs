//! Why a change made through the admin API (a tenant, a certificate) was refused, and the
//! status the API answers with. The registry and the TLS certificates report their refusals
//! in it.

use http::StatusCode;

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
    /// The caller may not do this (`403`): a scoped admin token without the scope.
    #[error("{0}")]
    Forbidden(String),
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
            Self::Forbidden(_) => StatusCode::FORBIDDEN,
        }
    }
}
