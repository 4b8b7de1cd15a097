//! `tern::config_get`: a guest reads its tenant's variables ([`crate::variables`]), as they
//! are when it asks.

use tern_sdk::abi::{self, errno, func};
use wasmtime::{Caller, Linker};

use crate::guest::module::memory::{
    GuestFault, GuestMemory, copy_to_guest, guest_range, memory, read_guest,
};
use crate::variables::{Found, check_name};

/// What `config_get` reaches of a request's store: its tenant's variables.
pub trait ConfigView: GuestMemory {
    /// The tenant's variables ([`crate::capabilities::Capabilities::variables`]).
    fn variables(&self) -> &crate::variables::Grant;
}

/// Adds `config_get` to `linker`.
///
/// # Errors
/// Only if wasmtime rejects a definition (a bug).
pub fn add_to_linker<T: ConfigView>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    linker.func_wrap(
        abi::IMPORT_MODULE,
        func::CONFIG_GET,
        |mut caller: Caller<'_, T>, name: i32, name_len: i32, buf: i32, buf_len: i32| {
            let name = read_guest(&caller, name, name_len, func::CONFIG_GET)?;
            let mem = memory(&caller)?;
            guest_range(buf, buf_len, mem.data(&caller).len())
                .ok_or(GuestFault::BadPointer(func::CONFIG_GET))?;
            let Ok(name) = std::str::from_utf8(&name) else {
                return Ok(errno::INVALID_ARGUMENT);
            };
            if check_name(name).is_err() {
                return Ok(errno::INVALID_ARGUMENT);
            }
            let values = caller.data().variables().values();
            match values.get(name) {
                Found::Value(v) => copy_to_guest(
                    mem.data_mut(&mut caller),
                    buf,
                    buf_len,
                    v.as_bytes(),
                    func::CONFIG_GET,
                ),
                Found::Undefined => Ok(errno::NOT_FOUND),
                Found::Unavailable(_) => Ok(errno::UNAVAILABLE),
            }
        },
    )?;
    Ok(())
}
