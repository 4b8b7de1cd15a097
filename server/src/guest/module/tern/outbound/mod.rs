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

use crate::guest::{GuestRequest, GuestResponse};
use tern_sdk::abi::{self, func};
use wasmtime::{Caller, Linker};

use crate::guest::module::memory::{
    GuestFault, GuestMemory, add_text_call, copy_to_guest, guest_range, host_call, memory,
    read_guest,
};

/// What these functions reach of a request's store.
pub trait OutboundView: GuestMemory {
    /// The requests the guest made, at work with its outbound session
    /// ([`crate::capabilities::Capabilities::outbound`]), and the client's request and the
    /// guest's response (which a backend's may stand in for, `response_forward`).
    fn outbound(&mut self) -> (OutboundCalls<'_>, &mut GuestRequest, &mut GuestResponse);
    /// The requests the guest made (their last error).
    fn outbound_handles(&self) -> &Outbound;
}

/// Links these functions (the composition root, [`crate::guest::link`], calls it).
///
/// # Errors
/// Only if wasmtime rejects a definition (a bug).
pub fn add_to_linker<T: OutboundView>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
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
            let (mut calls, request, _) = caller.data_mut().outbound();
            Ok(calls.request(request, &method, backend, url).await)
        }
    )?;
    linker.func_wrap(
        m,
        func::OUTBOUND_HEADER_APPEND,
        |mut caller: Caller<'_, T>,
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
                .outbound()
                .0
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
                .outbound()
                .0
                .body_write(handle, chunk)
                .await)
        }
    )?;
    linker.func_wrap(
        m,
        func::OUTBOUND_SEND,
        |mut caller: Caller<'_, T>, handle: i32, flags: i32| {
            let (mut calls, request, _) = caller.data_mut().outbound();
            Ok(calls.send(handle, flags & abi::OUTBOUND_STREAM_BODY != 0, request))
        },
    )?;
    host_call!(linker, m, func::OUTBOUND_BODY_FINISH, |caller, handle| {
        Ok(caller.data_mut().outbound().0.body_finish(handle).await)
    })?;
    host_call!(
        linker,
        m,
        func::OUTBOUND_RESPONSE_STATUS,
        |caller, handle| { Ok(caller.data_mut().outbound().0.response_status(handle).await) }
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
            let mut calls = state.outbound().0;
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
            let mut calls = caller.data_mut().outbound().0;
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
        |mut caller: Caller<'_, T>, handle: i32| Ok(caller.data_mut().outbound().0.close(handle)),
    )?;
    linker.func_wrap(
        m,
        func::OUTBOUND_FORWARD_REQUEST,
        |mut caller: Caller<'_, T>, handle: i32| {
            let (mut calls, request, _) = caller.data_mut().outbound();
            Ok(calls.forward_request(handle, request))
        },
    )?;
    host_call!(linker, m, func::RESPONSE_FORWARD, |caller, handle| {
        let (mut calls, _, response) = caller.data_mut().outbound();
        Ok(calls.forward_response(handle, response).await)
    })?;
    linker.func_wrap(
        m,
        func::HANDOFF_WEBSOCKET,
        |mut caller: Caller<'_, T>, backend: i32, backend_len: i32| {
            let backend = read_guest(&caller, backend, backend_len, func::HANDOFF_WEBSOCKET)?;
            let (mut calls, request, response) = caller.data_mut().outbound();
            Ok(calls.handoff_websocket(request, response, &backend))
        },
    )?;
    add_text_call(linker, m, func::OUTBOUND_LAST_ERROR, |s| {
        s.outbound_handles().last_error()
    })?;
    Ok(())
}
