//! Checks on an uploaded module's first bytes, before anything is stored or compiled.

use super::ChangeError;

/// A `.wasm` upload's first bytes: a core module, not an artifact, a component or text.
pub(super) fn check_wasm_header(wasm: &[u8]) -> Result<(), ChangeError> {
    if wasm.is_empty() {
        return Err(ChangeError::Invalid(
            "the request body is empty; send the .wasm file as the body".into(),
        ));
    }
    if wasm.starts_with(b"\x7fELF") {
        return Err(ChangeError::Invalid(
            "this is a compiled artifact; upload the .wasm module (the server compiles it)".into(),
        ));
    }
    if !wasm.starts_with(b"\0asm") {
        return Err(ChangeError::Invalid(
            "not a WebAssembly module: it does not start with the `\\0asm` magic bytes".into(),
        ));
    }
    if wasm.len() < 8 {
        return Err(ChangeError::Invalid(
            "truncated WebAssembly module: no version after the magic bytes".into(),
        ));
    }
    if wasm[4..8] != [1, 0, 0, 0] {
        return Err(ChangeError::Unprocessable(
            "this is a WebAssembly component, not a core module; build the handler for \
             wasm32-wasip1 with the Tern guest SDK"
                .into(),
        ));
    }
    Ok(())
}
