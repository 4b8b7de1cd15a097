//! `tern::request_*`: the guest reads the request's method, target, headers and body, and its
//! context (`request_info`: who asks, where the tenant is mounted, the URL).

use std::borrow::Cow;

use http::Version;
use tern_sdk::abi::{self, errno, func};
use wasmtime::{Caller, Linker};

use crate::context;
use crate::guest::GuestRequest;
use crate::guest::module::memory::{
    GuestFault, GuestMemory, copy_to_guest, guest_range, headers_blob, host_call, memory,
};
use crate::guest::request::BodyError;

/// What these functions reach of a request's store.
pub trait RequestView: GuestMemory {
    /// The request the guest reads.
    fn request(&mut self) -> &mut GuestRequest;
    /// The request, and its headers as `request_headers` gives them (made on its first call).
    fn request_headers(&mut self) -> (&GuestRequest, &mut Option<Vec<u8>>);
    /// The request and the guest's tenant, for `request_info`.
    fn request_info(&self) -> (&GuestRequest, &str);
}

/// The value of `request_info` key `key` for a guest of tenant `tenant`, or the error code:
/// `INVALID_ARGUMENT` for a key this server does not know, `UNAVAILABLE` for a value this
/// request has not got.
fn request_info<'a>(
    request: &'a GuestRequest,
    key: i32,
    tenant: &str,
) -> Result<Cow<'a, [u8]>, i32> {
    use abi::info;
    let text = |s: &'static str| Ok(Cow::Borrowed(s.as_bytes()));
    let owned = |s: String| Ok(Cow::Owned(s.into_bytes()));
    let path = request.uri.path();
    let split = request.context.prefix_len.min(path.len());
    match key {
        // Canonical: an IPv4 client of a dual-stack listener as `a.b.c.d` (`http::handle`).
        info::CLIENT_IP => owned(request.context.client().ip().to_string()),
        // Unknown behind a proxy that forwarded only the client's IP.
        info::CLIENT_PORT => match request.context.client().port() {
            0 => Err(abi::errno::UNAVAILABLE),
            port => owned(port.to_string()),
        },
        info::REQUEST_ID => Ok(Cow::Borrowed(request.context.request_id.as_bytes())),
        info::ROUTE_PREFIX => Ok(Cow::Borrowed(&path.as_bytes()[..split])),
        info::PATH_INFO => Ok(Cow::Borrowed(&path.as_bytes()[split..])),
        info::SCHEME => text(request.context.scheme()),
        info::HOST => context::host(&request.uri, &request.headers)
            .map(Cow::Borrowed)
            .ok_or(abi::errno::UNAVAILABLE),
        info::URL => {
            context::host(&request.uri, &request.headers).ok_or(abi::errno::UNAVAILABLE)?;
            Ok(Cow::Owned(context::url(
                &request.context,
                &request.uri,
                &request.headers,
            )))
        }
        info::HTTP_VERSION => text(match request.context.version {
            Version::HTTP_09 => "HTTP/0.9",
            Version::HTTP_10 => "HTTP/1.0",
            Version::HTTP_2 => "HTTP/2",
            Version::HTTP_3 => "HTTP/3",
            _ => "HTTP/1.1",
        }),
        info::TLS_PROTOCOL => match &request.context.conn.tls {
            Some(tls) => text(tls.protocol),
            None => Err(abi::errno::UNAVAILABLE),
        },
        info::TLS_SNI => match request
            .context
            .conn
            .tls
            .as_ref()
            .and_then(|t| t.sni.as_ref())
        {
            Some(sni) => Ok(Cow::Borrowed(sni.as_bytes())),
            None => Err(abi::errno::UNAVAILABLE),
        },
        info::TENANT => Ok(Cow::Owned(tenant.as_bytes().to_vec())),
        info::TRACEPARENT => match &request.context.trace {
            Some(t) => Ok(Cow::Owned(t.traceparent(t.run_span).as_bytes().to_vec())),
            None => Err(abi::errno::UNAVAILABLE),
        },
        _ => Err(abi::errno::INVALID_ARGUMENT),
    }
}

/// Links `name` as a copy-out function (see ABI.md) of the request value `value` returns.
fn copy_out<T: RequestView>(
    linker: &mut Linker<T>,
    name: &'static str,
    value: fn(&mut T) -> &[u8],
) -> wasmtime::Result<()> {
    linker.func_wrap(
        abi::IMPORT_MODULE,
        name,
        move |mut caller: Caller<'_, T>, ptr: i32, len: i32| {
            let (data, state) = memory(&caller)?.data_and_store_mut(&mut caller);
            copy_to_guest(data, ptr, len, value(state), name)
        },
    )?;
    Ok(())
}

pub(super) fn add_to_linker<T: RequestView>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    let m = abi::IMPORT_MODULE;
    copy_out(linker, func::REQUEST_METHOD, |s| {
        s.request().method.as_str().as_bytes()
    })?;
    copy_out(linker, func::REQUEST_URI, |s| {
        context::path_and_query(&s.request().uri).as_bytes()
    })?;
    copy_out(linker, func::REQUEST_HEADERS, |s| {
        let (request, blob) = s.request_headers();
        blob.get_or_insert_with(|| headers_blob(&request.headers))
    })?;
    linker.func_wrap(
        m,
        func::REQUEST_INFO,
        |mut caller: Caller<'_, T>, key: i32, ptr: i32, len: i32| {
            let (data, state) = memory(&caller)?.data_and_store_mut(&mut caller);
            // A bad buffer traps whatever the key, as in every copy-out function.
            guest_range(ptr, len, data.len()).ok_or(GuestFault::BadPointer(func::REQUEST_INFO))?;
            let (request, tenant) = state.request_info();
            match request_info(request, key, tenant) {
                Ok(value) => copy_to_guest(data, ptr, len, &value, func::REQUEST_INFO),
                Err(code) => Ok(code),
            }
        },
    )?;
    host_call!(linker, m, func::REQUEST_BODY_READ, |caller, ptr, len| {
        let mem = memory(&caller)?;
        // Check the buffer before waiting for data: a bad pointer traps even at the end.
        let range = guest_range(ptr, len, mem.data_size(&caller))
            .ok_or(GuestFault::BadPointer(func::REQUEST_BODY_READ))?;
        if range.is_empty() {
            return Ok(0);
        }
        let chunk = match caller.data_mut().request().read_up_to(range.len()).await {
            Ok(chunk) => chunk,
            Err(BodyError::TooLarge) => return Ok(errno::LIMIT_EXCEEDED),
            Err(BodyError::Failed) => return Ok(errno::IO),
        };
        let n = chunk.len();
        // The memory cannot shrink, so the range checked above is still inside it.
        mem.data_mut(&mut caller)[range.start..range.start + n].copy_from_slice(&chunk);
        Ok(i32::try_from(n).unwrap_or(i32::MAX))
    })?;
    Ok(())
}
