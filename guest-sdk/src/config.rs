//! The tenant's variables and secrets (ABI `config_get`): configuration the operator sets
//! with `[tenant.variables]`, `tern var set` or `tern secret set`, read as it is when the
//! request runs (a change reaches the next request, no new version needed).
//!
//! ```no_run
//! let region = tern_sdk::config::get("region")?.unwrap_or_else(|| "eu-west".into());
//! let Some(key) = tern_sdk::config::get("api_key")? else {
//!     panic!("set it with `tern secret set TENANT api_key`");
//! };
//! # Ok::<(), tern_sdk::config::ConfigError>(())
//! ```
#![allow(unsafe_code)]

use crate::abi::errno;
use crate::sys;

/// Why a variable could not be read: the ABI's error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConfigError {
    /// `INVALID_ARGUMENT` (not a variable name) or `UNAVAILABLE` (this server cannot open the
    /// tenant's secrets: its log says why).
    pub code: i32,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.code {
            errno::INVALID_ARGUMENT => f.write_str(
                "not a variable name (lower-case letters, digits and '_', starting with a letter)",
            ),
            errno::UNAVAILABLE => {
                f.write_str("this server cannot open the tenant's secrets (see the server log)")
            }
            code => write!(f, "config_get failed ({})", errno::name(code)),
        }
    }
}

impl std::error::Error for ConfigError {}

/// The value of the tenant's variable `name`; `None` if it has none.
///
/// # Errors
/// A name that cannot be a variable's, or secrets this server cannot open.
pub fn get(name: &str) -> Result<Option<String>, ConfigError> {
    let value = crate::copy_out_found(
        // SAFETY: the host reads `name` and writes at most `len` bytes at `buf`.
        |buf, len| unsafe { sys::config_get(name.as_ptr(), name.len(), buf, len) },
        256,
    )
    .map_err(|code| ConfigError { code })?;
    Ok(value.map(|v| String::from_utf8_lossy(&v).into_owned()))
}
