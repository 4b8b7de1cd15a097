//! Checks on an uploaded module's first bytes, before anything is stored or compiled.

use super::ChangeError;

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

/// What is wrong with `wasm`'s first bytes for a Tern module, if anything, and whether it is
/// WebAssembly Tern cannot run rather than not WebAssembly at all. `empty` is the message for
/// no bytes. Shared by uploads and `tern compile`.
pub fn wasm_header_problem(wasm: &[u8], empty: &str) -> Option<(String, bool)> {
    let invalid = |m: &str| Some((m.to_string(), false));
    if wasm.is_empty() {
        return invalid(empty);
    }
    if wasm.starts_with(b"\x7fELF") {
        return invalid(
            "this is a compiled artifact; give the .wasm module (the server compiles it)",
        );
    }
    if !wasm.starts_with(b"\0asm") {
        return invalid(
            "not a WebAssembly module: it does not start with the `\\0asm` magic bytes",
        );
    }
    if wasm.len() < 8 {
        return invalid("truncated WebAssembly module: no version after the magic bytes");
    }
    // A core module, or a component (version 0x0d of any draft, layer 1).
    if wasm[4..8] == [1, 0, 0, 0] || crate::artifact::is_component(wasm) {
        return None;
    }
    invalid("not a valid WebAssembly module: unknown version after the magic bytes")
}
