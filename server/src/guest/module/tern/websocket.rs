//! `tern::websocket_publish`: a guest publishes to its tenant's events-mode WebSocket
//! connections, from any request ([`crate::websocket::channels`]): the body is Pushpin's
//! publish format, as the admin API takes it. A failing call returns an error code;
//! `websocket_last_error` then explains it in words.

use tern_sdk::abi::{self, errno, func};
use wasmtime::{Caller, Linker};

use crate::guest::module::memory::{GuestMemory, add_text_call, read_guest};
use crate::websocket::channels::{MAX_PUBLISH_BODY, PublishError, Session};

/// What these functions reach of a request's store.
pub trait WebsocketView: GuestMemory {
    /// The request's channels session ([`crate::capabilities::Capabilities::channels`]) and
    /// where its last error is kept.
    fn channels(&mut self) -> (&mut Session, &mut String);
    /// The message of its last failed call.
    fn websocket_last_error(&self) -> &str;
}

/// Links these functions (the composition root, [`crate::guest::link`], calls it).
///
/// # Errors
/// Only if wasmtime rejects a definition (a bug).
pub fn add_to_linker<T: WebsocketView>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    let m = abi::IMPORT_MODULE;
    linker.func_wrap(
        m,
        func::WEBSOCKET_PUBLISH,
        |mut caller: Caller<'_, T>, body: i32, body_len: i32| {
            let too_long = usize::try_from(body_len).is_ok_and(|n| n > MAX_PUBLISH_BODY);
            let result = if too_long {
                Err(PublishError::Invalid(format!(
                    "a publish is at most {MAX_PUBLISH_BODY} bytes of JSON"
                )))
            } else {
                let body = read_guest(&caller, body, body_len, func::WEBSOCKET_PUBLISH)?;
                caller.data_mut().channels().0.publish(&body)
            };
            let (_, last_error) = caller.data_mut().channels();
            Ok(match result {
                Ok(done) => i32::try_from(done.delivered).unwrap_or(i32::MAX),
                Err(e) => {
                    *last_error = e.to_string();
                    match e {
                        PublishError::NotEvents => errno::UNAVAILABLE,
                        PublishError::Limit => errno::LIMIT_EXCEEDED,
                        PublishError::Invalid(_) => errno::INVALID_ARGUMENT,
                    }
                }
            })
        },
    )?;
    add_text_call(linker, m, func::WEBSOCKET_LAST_ERROR, |s| {
        s.websocket_last_error()
    })
}
