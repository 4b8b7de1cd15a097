//! The `tern` guest kind: Tern's own ABI v1, a core module importing from `tern`.
//!
//! One file per interface of the ABI (guest-sdk/ABI.md): [`request`] (what the guest reads),
//! [`response`] (what it writes), [`outbound`] (the requests it sends) and [`kv`] (its
//! key-value stores). Each maps the shared
//! request, response and outbound errors to the ABI's errnos. The store state, the linker and
//! the driver are the core modules' ([`crate::guest::module`]); the CGI kind links these
//! functions too.

pub mod kv;
pub mod outbound;
pub mod request;
pub mod response;

pub use kv::Kv;
pub use outbound::Outbound;

use tern_sdk::abi;
use wasmtime::{Linker, Module};

use super::GuestState;

/// Adds the `tern` ABI v1 functions to a core module linker.
///
/// # Errors
/// Only if wasmtime rejects a definition (a bug).
pub fn add_to_linker(linker: &mut Linker<GuestState>) -> wasmtime::Result<()> {
    request::add_to_linker(linker)?;
    response::add_to_linker(linker)?;
    outbound::add_to_linker(linker)?;
    kv::add_to_linker(linker)
}

/// Whether `module` imports from the `tern` ABI (a module that does not is a CGI program
/// unless its deployer says otherwise).
pub fn imports_abi(module: &Module) -> bool {
    module.imports().any(|i| i.module() == abi::IMPORT_MODULE)
}

/// A warning for a module deployed as kind `tern` that imports nothing from `tern`: a plain
/// WASI program, which can neither read the request nor write a response through the ABI.
pub fn kind_warning(module: &Module) -> Option<String> {
    if imports_abi(module) {
        return None;
    }
    Some(
        "this module imports nothing from `tern` but is deployed as kind `tern`: it cannot \
         read the request, its stdout goes to the server log, and every client gets an empty \
         200. Deploy it as kind `cgi` (the default for such modules) to answer on stdout"
            .into(),
    )
}
