//! `tern::response_*`: the guest sets the status and headers and writes the body of the
//! shared [`GuestResponse`](crate::guest::GuestResponse); its errors become ABI errnos here.

use http::{HeaderName, HeaderValue, StatusCode};
use tern_sdk::abi::{self, errno, func};
use wasmtime::{Caller, Linker};

use crate::guest::module::memory::{GuestFault, GuestMemory, guest_range, host_call, memory};
use crate::guest::{GuestResponse, HeaderError, WriteError};

/// What these functions reach of a request's store: the response the guest writes.
pub trait ResponseView: GuestMemory {
    /// The response.
    fn response(&mut self) -> &mut GuestResponse;
}

/// A refused header as the ABI reports it.
fn header_errno(e: HeaderError) -> i32 {
    match e {
        HeaderError::HeadersSent => errno::HEADERS_SENT,
        HeaderError::Invalid => errno::INVALID_ARGUMENT,
        HeaderError::Limit => errno::LIMIT_EXCEEDED,
    }
}

pub(super) fn add_to_linker<T: ResponseView>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    let m = abi::IMPORT_MODULE;
    linker.func_wrap(
        m,
        func::RESPONSE_SET_STATUS,
        |mut caller: Caller<'_, T>, status: i32| {
            let resp = &mut caller.data_mut().response();
            if resp.is_streaming() {
                return errno::HEADERS_SENT;
            }
            match u16::try_from(status)
                .ok()
                .and_then(|s| StatusCode::from_u16(s).ok())
            {
                Some(s) => {
                    resp.status = s;
                    0
                }
                None => errno::INVALID_ARGUMENT,
            }
        },
    )?;
    linker.func_wrap(
        m,
        func::RESPONSE_HEADER_APPEND,
        |mut caller: Caller<'_, T>, np: i32, nl: i32, vp: i32, vl: i32| {
            let (data, state) = memory(&caller)?.data_and_store_mut(&mut caller);
            let bad = || GuestFault::BadPointer(func::RESPONSE_HEADER_APPEND);
            let name = guest_range(np, nl, data.len()).ok_or_else(bad)?;
            let value = guest_range(vp, vl, data.len()).ok_or_else(bad)?;
            let resp = state.response();
            if resp.is_streaming() {
                return Ok(errno::HEADERS_SENT);
            }
            let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(&data[name]),
                HeaderValue::from_bytes(&data[value]),
            ) else {
                return Ok(errno::INVALID_ARGUMENT);
            };
            Ok(resp
                .append_header(name, value)
                .map_or_else(header_errno, |()| 0))
        },
    )?;
    host_call!(linker, m, func::RESPONSE_BODY_WRITE, |caller, ptr, len| {
        let mem = memory(&caller)?;
        let (data, state) = mem.data_and_store_mut(&mut caller);
        let range = guest_range(ptr, len, data.len())
            .ok_or(GuestFault::BadPointer(func::RESPONSE_BODY_WRITE))?;
        let n = i32::try_from(range.len()).unwrap_or(i32::MAX);
        Ok(match state.response().write(&data[range]).await {
            Ok(()) => n,
            Err(WriteError::Limit) => errno::LIMIT_EXCEEDED,
            Err(WriteError::ClientGone) => errno::IO,
            // The body is a backend's (`response_forward`).
            Err(WriteError::Forwarded) => errno::INVALID_ARGUMENT,
        })
    })?;
    Ok(())
}
