//! `tern::outbound_*`: a guest sends HTTP requests to its tenant's backends and allowed hosts
//! and reads the responses, several at once if it likes.
//!
//! A request is a handle: made (`outbound_request`, where the policy is checked), given
//! headers and a body, sent, then read. A request runs in its own task once sent, so a guest
//! can send two and then read both. While the guest waits (connect, response head, body) its
//! instance is suspended and holds no thread; the wait counts against its deadline and is
//! recorded as the request's `outbound` phase. Every task still running when the guest ends is
//! aborted with it: nothing of a request outlives its instance, but for a body the guest
//! handed to the server: `outbound_forward_request` makes the client's body (and headers) the
//! request's, `response_forward` makes a response the guest's answer, whose body the server
//! streams to the client after the instance is gone (`body::Forwarded`).

//!
//! The handles and their state machine are `handles.rs`; this file is the ABI's linker, which
//! reads and writes the guest's memory and calls them.

mod handles;

pub use handles::{Outbound, OutboundCalls};

use tern_sdk::abi::{self, func};
use wasmtime::{Caller, Linker};

use crate::guest::module::GuestState;
use crate::guest::module::memory::{
    GuestFault, add_text_call, copy_to_guest, guest_range, host_call, memory, read_guest,
};

/// Links these functions (the composition root, [`crate::guest::link`], calls it).
///
/// # Errors
/// Only if wasmtime rejects a definition (a bug).
pub fn add_to_linker(linker: &mut Linker<GuestState>) -> wasmtime::Result<()> {
    let m = abi::IMPORT_MODULE;
    host_call!(
        linker,
        m,
        func::OUTBOUND_REQUEST,
        |caller, method, method_len, backend, backend_len, url, url_len| {
            let f = func::OUTBOUND_REQUEST;
            let method = read_guest(&caller, method, method_len, f)?;
            let backend = read_guest(&caller, backend, backend_len, f)?;
            let url = read_guest(&caller, url, url_len, f)?;
            let state = caller.data_mut();
            Ok(state
                .outbound
                .with(&mut state.host.outbound)
                .request(&state.request, &method, backend, url)
                .await)
        }
    )?;
    linker.func_wrap(
        m,
        func::OUTBOUND_HEADER_APPEND,
        |mut caller: Caller<'_, GuestState>,
         handle: i32,
         name: i32,
         name_len: i32,
         value: i32,
         value_len: i32| {
            let f = func::OUTBOUND_HEADER_APPEND;
            let name = read_guest(&caller, name, name_len, f)?;
            let value = read_guest(&caller, value, value_len, f)?;
            Ok(caller
                .data_mut()
                .outbound_calls()
                .header_append(handle, &name, &value))
        },
    )?;
    host_call!(
        linker,
        m,
        func::OUTBOUND_BODY_WRITE,
        |caller, handle, ptr, len| {
            let chunk = read_guest(&caller, ptr, len, func::OUTBOUND_BODY_WRITE)?;
            Ok(caller
                .data_mut()
                .outbound_calls()
                .body_write(handle, chunk)
                .await)
        }
    )?;
    linker.func_wrap(
        m,
        func::OUTBOUND_SEND,
        |mut caller: Caller<'_, GuestState>, handle: i32, flags: i32| {
            let state = caller.data_mut();
            Ok(state.outbound.with(&mut state.host.outbound).send(
                handle,
                flags & abi::OUTBOUND_STREAM_BODY != 0,
                &state.request,
            ))
        },
    )?;
    host_call!(linker, m, func::OUTBOUND_BODY_FINISH, |caller, handle| {
        Ok(caller.data_mut().outbound_calls().body_finish(handle).await)
    })?;
    host_call!(
        linker,
        m,
        func::OUTBOUND_RESPONSE_STATUS,
        |caller, handle| {
            Ok(caller
                .data_mut()
                .outbound_calls()
                .response_status(handle)
                .await)
        }
    )?;
    host_call!(
        linker,
        m,
        func::OUTBOUND_RESPONSE_HEADERS,
        |caller, handle, ptr, len| {
            let f = func::OUTBOUND_RESPONSE_HEADERS;
            let mem = memory(&caller)?;
            guest_range(ptr, len, mem.data_size(&caller)).ok_or(GuestFault::BadPointer(f))?;
            let (data, state) = mem.data_and_store_mut(&mut caller);
            let mut calls = state.outbound_calls();
            match calls.response_headers(handle).await {
                Ok(blob) => copy_to_guest(data, ptr, len, blob, f),
                Err(code) => Ok(code),
            }
        }
    )?;
    host_call!(
        linker,
        m,
        func::OUTBOUND_RESPONSE_BODY_READ,
        |caller, handle, ptr, len| {
            let f = func::OUTBOUND_RESPONSE_BODY_READ;
            let mem = memory(&caller)?;
            let range =
                guest_range(ptr, len, mem.data_size(&caller)).ok_or(GuestFault::BadPointer(f))?;
            if range.is_empty() {
                return Ok(0);
            }
            let mut calls = caller.data_mut().outbound_calls();
            let chunk = match calls.body_read(handle, range.len()).await {
                Ok(c) => c,
                Err(code) => return Ok(code),
            };
            mem.data_mut(&mut caller)[range.start..range.start + chunk.len()]
                .copy_from_slice(&chunk);
            Ok(i32::try_from(chunk.len()).unwrap_or(i32::MAX))
        }
    )?;
    linker.func_wrap(
        m,
        func::OUTBOUND_CLOSE,
        |mut caller: Caller<'_, GuestState>, handle: i32| {
            Ok(caller.data_mut().outbound_calls().close(handle))
        },
    )?;
    linker.func_wrap(
        m,
        func::OUTBOUND_FORWARD_REQUEST,
        |mut caller: Caller<'_, GuestState>, handle: i32| {
            let state = caller.data_mut();
            Ok(state
                .outbound
                .with(&mut state.host.outbound)
                .forward_request(handle, &mut state.request))
        },
    )?;
    host_call!(linker, m, func::RESPONSE_FORWARD, |caller, handle| {
        let state = caller.data_mut();
        let mut calls = state.outbound.with(&mut state.host.outbound);
        Ok(calls.forward_response(handle, &mut state.response).await)
    })?;
    add_text_call(linker, m, func::OUTBOUND_LAST_ERROR, |s| {
        s.outbound.last_error()
    })?;
    Ok(())
}
