//! Checks on an uploaded module's first bytes, before anything is stored or compiled.

use crate::artifact::wasm_header_problem;
use crate::change::ChangeError;

/// A `.wasm` upload's first bytes: a core module or a component, not an artifact or text.
pub(super) fn check_wasm_header(wasm: &[u8]) -> Result<(), ChangeError> {
    match wasm_header_problem(
        wasm,
        "the request body is empty; send the .wasm file as the body",
    ) {
        None => Ok(()),
        Some((message, false)) => Err(ChangeError::Invalid(message)),
        Some((message, true)) => Err(ChangeError::Unprocessable(message)),
    }
}
