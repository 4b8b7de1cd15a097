//! `tern::kv_*`: a guest reads and writes its tenant's key-value stores ([`crate::kv`]).
//!
//! A store is a handle opened by name (only stores the tenant is granted). Every operation is
//! handed to the store's backend and the guest waits suspended, the wait counted against its
//! deadline and reported as the request's `kv` phase. Each failing call returns an error code;
//! `kv_last_error` then explains it in words. A request may make `limits.max_kv_ops`
//! operations; the rest answer `LIMIT_EXCEEDED`.

use std::sync::Arc;
use std::time::Instant;

use tern_sdk::abi::{self, errno, func};
use wasmtime::{Caller, Linker};

use super::handles::Handles;
use crate::guest::module::memory::{
    GuestFault, GuestMemory, add_text_call, copy_to_guest, guest_range, host_call, memory,
    read_guest,
};
use crate::kv::{KvError, Op, Reply, Session, Store};

/// Keys fetched per `kv_list` call (as many as fit the guest's buffer are given).
const LIST_BATCH: usize = 256;

/// The stores a request opened through the `tern` ABI, by handle (what it may open, its
/// operations and waits are its [`Session`], in its capabilities).
pub type Kv = Handles<Arc<Store>>;

impl Kv {
    /// The store behind `handle`, counted as one more operation of `session`.
    fn store(&mut self, session: &mut Session, handle: i32) -> Result<Arc<Store>, i32> {
        let store = self.get(handle)?.clone();
        session.count().map_err(|e| self.error(&e))?;
        Ok(store)
    }

    fn error(&mut self, e: &KvError) -> i32 {
        let code = match e {
            KvError::Invalid(_) => errno::INVALID_ARGUMENT,
            KvError::Limit(_) => errno::LIMIT_EXCEEDED,
            KvError::Unavailable(_) => errno::IO,
            KvError::Unknown(_) => errno::UNKNOWN_OUTCOME,
        };
        self.fail(code, e.to_string())
    }
}

/// What these functions reach of a request's store.
pub trait KvView: GuestMemory {
    /// The stores the request opened, and its key-value session
    /// ([`crate::capabilities::Capabilities::kv`]).
    fn kv(&mut self) -> (&mut Kv, &mut Session);
    /// The stores the request opened (their last error).
    fn kv_handles(&self) -> &Kv;
}

/// Runs `op` on the store behind `handle`, timing the wait: the answer, or the error code to
/// return (with `kv_last_error` set).
async fn run<T: KvView>(caller: &mut Caller<'_, T>, handle: i32, op: Op) -> Result<Reply, i32> {
    let (kv, session) = caller.data_mut().kv();
    let store = kv.store(session, handle)?;
    let tenant = session.grant().tenant.clone();
    let op_name = op.name();
    let started = Instant::now();
    let answer = store.run(&tenant, op).await;
    let (kv, session) = caller.data_mut().kv();
    session.waited += started.elapsed();
    session.traced(&store, op_name, started, answer.as_ref().err());
    answer.map_err(|e| kv.error(&e))
}

/// An answer of the wrong kind for its operation: a bug in the backend, never the guest's.
fn unexpected<T: KvView>(caller: &mut Caller<'_, T>, answer: &Reply) -> i32 {
    caller
        .data_mut()
        .kv()
        .0
        .fail(errno::IO, format!("the store answered {answer:?}"))
}

#[allow(clippy::too_many_lines)] // one registration per ABI function
/// Links these functions (the composition root, [`crate::guest::link`], calls it).
///
/// # Errors
/// Only if wasmtime rejects a definition (a bug).
pub fn add_to_linker<T: KvView>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    let m = abi::IMPORT_MODULE;
    linker.func_wrap(
        m,
        func::KV_OPEN,
        |mut caller: Caller<'_, T>, name: i32, name_len: i32| {
            let name = read_guest(&caller, name, name_len, func::KV_OPEN)?;
            let (kv, session) = caller.data_mut().kv();
            let name = String::from_utf8_lossy(&name);
            let store = match session.open(&name) {
                Ok(store) => store,
                Err(message) => return Ok(kv.fail(errno::DENIED, message)),
            };
            // Opening the same store twice gives the same handle: handles stay few.
            Ok(kv
                .find(|s| Arc::ptr_eq(s, &store))
                .unwrap_or_else(|| kv.push(store)))
        },
    )?;
    host_call!(
        linker,
        m,
        func::KV_GET,
        |caller, store, key, key_len, buf, buf_len| {
            let key = read_guest(&caller, key, key_len, func::KV_GET)?;
            // The buffer is checked before the store is asked: a bad one traps either way.
            let mem = memory(&caller)?;
            guest_range(buf, buf_len, mem.data(&caller).len())
                .ok_or(GuestFault::BadPointer(func::KV_GET))?;
            match run(&mut caller, store, Op::Get(key)).await {
                Ok(Reply::Value(Some(v))) => {
                    copy_to_guest(mem.data_mut(&mut caller), buf, buf_len, &v, func::KV_GET)
                }
                Ok(Reply::Value(None)) => Ok(caller
                    .data_mut()
                    .kv()
                    .0
                    .fail(errno::NOT_FOUND, "no such key")),
                Ok(other) => Ok(unexpected(&mut caller, &other)),
                Err(code) => Ok(code),
            }
        }
    )?;
    host_call!(
        linker,
        m,
        func::KV_SET,
        |caller, store, key, key_len, value, value_len| {
            let key = read_guest(&caller, key, key_len, func::KV_SET)?;
            let value = read_guest(&caller, value, value_len, func::KV_SET)?;
            Ok(match run(&mut caller, store, Op::Set(key, value)).await {
                Ok(_) => 0,
                Err(code) => code,
            })
        }
    )?;
    host_call!(linker, m, func::KV_DELETE, |caller, store, key, key_len| {
        let key = read_guest(&caller, key, key_len, func::KV_DELETE)?;
        Ok(match run(&mut caller, store, Op::Delete(key)).await {
            Ok(_) => 0,
            Err(code) => code,
        })
    })?;
    host_call!(linker, m, func::KV_EXISTS, |caller, store, key, key_len| {
        let key = read_guest(&caller, key, key_len, func::KV_EXISTS)?;
        Ok(match run(&mut caller, store, Op::Exists(key)).await {
            Ok(Reply::Bool(b)) => i32::from(b),
            Ok(other) => unexpected(&mut caller, &other),
            Err(code) => code,
        })
    })?;
    host_call!(
        linker,
        m,
        func::KV_INCREMENT,
        |caller, store, key, key_len, delta| {
            let f = func::KV_INCREMENT;
            let key = read_guest(&caller, key, key_len, f)?;
            let bytes = read_guest(&caller, delta, 8, f)?;
            let by = i64::from_le_bytes(bytes.try_into().map_err(|_| GuestFault::BadPointer(f))?);
            Ok(
                match run(&mut caller, store, Op::Increment(key, by)).await {
                    Ok(Reply::Integer(n)) => {
                        let mem = memory(&caller)?;
                        copy_to_guest(mem.data_mut(&mut caller), delta, 8, &n.to_le_bytes(), f)?;
                        0
                    }
                    Ok(other) => unexpected(&mut caller, &other),
                    Err(code) => code,
                },
            )
        }
    )?;
    host_call!(
        linker,
        m,
        func::KV_COMPARE_AND_SWAP,
        |caller, store, key, key_len, old, old_len, new, new_len, flags| {
            let f = func::KV_COMPARE_AND_SWAP;
            let key = read_guest(&caller, key, key_len, f)?;
            let new = read_guest(&caller, new, new_len, f)?;
            let expected = if flags & abi::KV_CAS_ABSENT != 0 {
                None
            } else {
                Some(read_guest(&caller, old, old_len, f)?)
            };
            let (kv, _) = caller.data_mut().kv();
            if let Err(code) = kv.known_flags(flags, abi::KV_CAS_ABSENT) {
                return Ok(code);
            }
            let op = Op::CompareAndSwap { key, expected, new };
            Ok(match run(&mut caller, store, op).await {
                Ok(Reply::Bool(b)) => i32::from(b),
                Ok(other) => unexpected(&mut caller, &other),
                Err(code) => code,
            })
        }
    )?;
    host_call!(
        linker,
        m,
        func::KV_LIST,
        |caller, store, cursor, cursor_len, buf, buf_len| {
            let f = func::KV_LIST;
            let cursor = read_guest(&caller, cursor, cursor_len, f)?;
            let mem = memory(&caller)?;
            let room = guest_range(buf, buf_len, mem.data(&caller).len())
                .ok_or(GuestFault::BadPointer(f))?;
            let after = (!cursor.is_empty()).then_some(cursor);
            let op = Op::List {
                after,
                limit: LIST_BATCH,
            };
            let keys = match run(&mut caller, store, op).await {
                Ok(Reply::Keys(keys)) => keys,
                Ok(other) => return Ok(unexpected(&mut caller, &other)),
                Err(code) => return Ok(code),
            };
            let mut out = Vec::with_capacity(room.len().min(64 * 1024));
            for key in &keys {
                if out.len() + 2 + key.len() > room.len() {
                    break;
                }
                // Keys are at most `kv::KEY_BYTES_CEILING` (65,535) bytes.
                out.extend_from_slice(&u16::try_from(key.len()).unwrap_or(u16::MAX).to_le_bytes());
                out.extend_from_slice(key);
            }
            if out.is_empty() && !keys.is_empty() {
                let need = keys[0].len() + 2;
                return Ok(caller.data_mut().kv().0.fail(
                    errno::INVALID_ARGUMENT,
                    format!(
                        "the buffer of {} bytes cannot hold the next key ({need} bytes)",
                        room.len()
                    ),
                ));
            }
            mem.data_mut(&mut caller)[room.start..room.start + out.len()].copy_from_slice(&out);
            Ok(i32::try_from(out.len()).unwrap_or(errno::LIMIT_EXCEEDED))
        }
    )?;
    add_text_call(linker, m, func::KV_LAST_ERROR, |s| {
        &s.kv_handles().last_error
    })?;
    Ok(())
}
