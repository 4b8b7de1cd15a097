//! A core module's memory as host calls see it: every pointer and length the guest passes is
//! checked against its memory; one out of range traps the guest with
//! [`GuestFault::BadPointer`] and never touches the host.
//!
//! Host functions are linked over any store state that gives out the guest's memory
//! ([`GuestMemory`]) and the parts their interface needs (each interface's view trait, e.g.
//! `tern::kv::KvView`), never over the whole state: the state implements them all.

use std::ops::Range;

use tern_sdk::abi;
use wasmtime::{Caller, Linker, Memory};

/// A store state that knows its guest's exported memory (set at instantiation).
pub trait GuestMemory: Send + 'static {
    /// The guest's memory, once instantiated.
    fn memory(&self) -> Option<Memory>;
}

/// A guest fault caused by a host call, which traps the guest.
#[derive(Debug, thiserror::Error)]
pub enum GuestFault {
    /// A pointer/length pair outside the guest's memory.
    #[error("guest passed a pointer/length outside its memory to `{0}`")]
    BadPointer(&'static str),
    /// The module has no memory export (refused at load, so only a broken module gets here).
    #[error("guest has no exported memory")]
    NoMemory,
}

/// The range `ptr..ptr+len` of guest memory, if it lies inside `mem_len` bytes.
///
/// Wasm passes `i32`s; they are reinterpreted as the unsigned 32-bit values the guest meant.
pub fn guest_range(ptr: i32, len: i32, mem_len: usize) -> Option<Range<usize>> {
    let start = ptr as u32 as usize;
    let end = start.checked_add(len as u32 as usize)?;
    (end <= mem_len).then_some(start..end)
}

/// The guest's exported memory (set at instantiation), or a fault.
///
/// # Errors
/// [`GuestFault::NoMemory`] for a module without one (refused at load).
pub fn memory<T: GuestMemory>(caller: &Caller<'_, T>) -> wasmtime::Result<Memory> {
    caller
        .data()
        .memory()
        .ok_or_else(|| wasmtime::Error::new(GuestFault::NoMemory))
}

/// Copies the guest's bytes at `ptr..ptr+len`, or traps naming `func`.
pub fn read_guest<T: GuestMemory>(
    caller: &Caller<'_, T>,
    ptr: i32,
    len: i32,
    func: &'static str,
) -> wasmtime::Result<Vec<u8>> {
    let data = memory(caller)?.data(caller);
    let range = guest_range(ptr, len, data.len()).ok_or(GuestFault::BadPointer(func))?;
    Ok(data[range].to_vec())
}

/// Headers as the ABI's copy-out functions give them: `name NUL value NUL` pairs, in order.
pub fn headers_blob(headers: &http::HeaderMap) -> Vec<u8> {
    let mut blob = Vec::with_capacity(headers.len() * 32);
    for (name, value) in headers {
        blob.extend_from_slice(name.as_str().as_bytes());
        blob.push(0);
        blob.extend_from_slice(value.as_bytes());
        blob.push(0);
    }
    blob
}

/// Copies as much of `src` as fits into the guest buffer `ptr..ptr+len` and returns the full
/// length of `src`, so the guest can retry with a larger buffer.
pub fn copy_to_guest(
    data: &mut [u8],
    ptr: i32,
    len: i32,
    src: &[u8],
    func: &'static str,
) -> wasmtime::Result<i32> {
    let range = guest_range(ptr, len, data.len())
        .ok_or_else(|| wasmtime::Error::new(GuestFault::BadPointer(func)))?;
    let n = range.len().min(src.len());
    data[range.start..range.start + n].copy_from_slice(&src[..n]);
    Ok(i32::try_from(src.len()).unwrap_or(abi::errno::LIMIT_EXCEEDED))
}

/// Defines `name(ptr, len) -> i32` in `module`: copies the text `text` reads from the guest's
/// state into the guest's buffer, as [`copy_to_guest`] answers (the ABI's `*_last_error`).
///
/// # Errors
/// Only if wasmtime rejects the definition (a bug).
pub fn add_text_call<T: GuestMemory>(
    linker: &mut Linker<T>,
    module: &str,
    name: &'static str,
    text: fn(&T) -> &str,
) -> wasmtime::Result<()> {
    linker.func_wrap(
        module,
        name,
        move |mut caller: Caller<'_, T>, ptr: i32, len: i32| {
            let (data, state) = memory(&caller)?.data_and_store_mut(&mut caller);
            copy_to_guest(data, ptr, len, text(state).as_bytes(), name)
        },
    )?;
    Ok(())
}

/// Defines an async host function of a core module's linker whose arguments are all `i32`
/// (the ABI's pointers, lengths and handles), named as the closure names them; the body is
/// the host call's, with `caller` the [`Caller`] of the guest's store (its state the linker's):
///
/// ```ignore
/// host_call!(linker, abi::IMPORT_MODULE, func::KV_DELETE, |caller, store, key, key_len| {
///     let key = read_guest(&caller, key, key_len, func::KV_DELETE)?;
///     Ok(0)
/// })?;
/// ```
macro_rules! host_call {
    (@i32 $arg:ident) => { i32 };
    ($linker:expr, $module:expr, $name:expr, |$caller:ident $(, $arg:ident)* $(,)?| $body:block) => {
        $linker.func_wrap_async(
            $module,
            $name,
            |#[allow(unused_mut)] mut $caller: wasmtime::Caller<'_, _>,
             ($($arg,)*): ($($crate::guest::module::memory::host_call!(@i32 $arg),)*)| {
                Box::new(async move $body)
            },
        )
    };
}
pub(crate) use host_call;

#[cfg(test)]
mod tests {
    use super::guest_range;

    #[test]
    fn guest_ranges_are_bounds_checked() {
        assert_eq!(guest_range(0, 4, 4), Some(0..4));
        assert_eq!(guest_range(4, 0, 4), Some(4..4));
        assert_eq!(guest_range(1, 4, 4), None);
        assert_eq!(guest_range(-1, 1, 1 << 16), None);
        assert_eq!(guest_range(1, -1, 1 << 16), None);
        assert_eq!(
            guest_range(i32::MAX, i32::MAX, usize::MAX),
            Some(0x7fff_ffff..0xffff_fffe)
        );
    }
}
