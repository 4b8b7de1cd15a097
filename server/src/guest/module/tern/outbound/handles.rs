//! A guest's outbound requests as handles, each a small state machine: made (the policy
//! checked), given headers and a body, sent (its body whole or streamed), answered (its head,
//! then its body read on demand), closed. Every call answers with a value or an ABI error code,
//! its reason kept for `outbound_last_error`; the linker ([`super`]) only moves bytes between
//! the guest's memory and these calls.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::header::HeaderName;
use http::{HeaderMap, HeaderValue, Method, Request, Response};
use http_body_util::BodyExt;
use tern_sdk::abi::errno;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::body::ClientBody;
use crate::body::Fetched;
use crate::guest::module::memory::headers_blob;
use crate::guest::{ForwardError, GuestRequest, GuestResponse};
use crate::outbound::{Denied, Destination, MAX_HEADERS, NoHead, OutBody, Refused, Session};

/// Body chunks that may wait for the backend before a streaming guest's writes block.
const STREAM_CHUNKS: usize = 4;

/// Whether Tern sets or strips header `name` on outbound requests and responses: framing and
/// connection management (hop-by-hop), the host (from the target) and the loop marker.
fn hop_by_hop(name: &str) -> bool {
    crate::body::FRAMING_HEADERS.contains(&name) || SET_BY_TERN.contains(&name)
}

/// Headers Tern sets on outbound requests itself: the host (from the target), the loop marker.
const SET_BY_TERN: [&str; 2] = ["host", "cdn-loop"];

/// How an outbound request failed: its ABI code, its metrics status (`None`: counted by the
/// exchange already) and its message.
struct Failure {
    code: i32,
    status: Option<&'static str>,
    message: String,
}

impl Failure {
    fn new(code: i32, status: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            status: Some(status),
            message: message.into(),
        }
    }
}

impl From<NoHead> for Failure {
    fn from(f: NoHead) -> Self {
        Self {
            code: if f.is_timeout() {
                errno::TIMEOUT
            } else if matches!(f, NoHead::BadOverride(_)) {
                errno::INVALID_ARGUMENT
            } else {
                errno::IO
            },
            status: None,
            message: f.to_string(),
        }
    }
}

type Exchange = Result<Response<Fetched>, Failure>;

/// A request sent and not yet answered.
struct Pending {
    task: JoinHandle<Exchange>,
    label: Arc<str>,
    deadline: Instant,
    total: Duration,
}

/// A response whose head arrived; its body is read on demand.
struct Responded {
    status: u16,
    headers: HeaderMap,
    blob: Option<Vec<u8>>,
    /// (It holds the backend's concurrency slot until the response is read or closed.)
    body: Fetched,
    leftover: Bytes,
    received: u64,
    done: bool,
    deadline: Instant,
    total: Duration,
    label: Arc<str>,
}

/// A request made and not sent yet.
struct Draft {
    method: Method,
    target: Destination,
    headers: HeaderMap,
    body: BytesMut,
    /// The client's body, to be streamed on as this request's (`outbound_forward_request`).
    forward: Option<ClientBody>,
}

/// One handle's state.
enum Call {
    /// Made; headers and body being written.
    Building(Box<Draft>),
    /// Sent with a streaming body the guest is still writing.
    Streaming {
        body: mpsc::Sender<Bytes>,
        written: u64,
        pending: Pending,
    },
    /// Sent, body complete, waiting for the head.
    Sent(Pending),
    /// Head received.
    Responded(Box<Responded>),
    /// Failed or closed; any further use answers `code`.
    Done(i32),
}

/// A request's outbound handles through the `tern` ABI (what it may call, what it hands on
/// and how long it waited are its [`Session`], in its capabilities). Dropped with the store:
/// requests still in flight are aborted.
#[derive(Default)]
pub struct Outbound {
    handles: Vec<Call>,
    last_error: String,
}

/// The handles at work with their request's session: what every ABI call goes through.
pub struct OutboundCalls<'a> {
    session: &'a mut Session,
    table: &'a mut Outbound,
}

impl Outbound {
    /// The handles with their request's `session`.
    pub fn with<'a>(&'a mut self, session: &'a mut Session) -> OutboundCalls<'a> {
        OutboundCalls {
            session,
            table: self,
        }
    }

    /// The reason the last failing call failed (`outbound_last_error`).
    pub(super) fn last_error(&self) -> &str {
        &self.last_error
    }
}

impl Drop for Outbound {
    fn drop(&mut self) {
        for call in &self.handles {
            match call {
                Call::Streaming { pending, .. } | Call::Sent(pending) => pending.task.abort(),
                _ => {}
            }
        }
    }
}

impl OutboundCalls<'_> {
    /// Records `f` as the last error (for `outbound_last_error`), counts it and returns its code.
    fn fail(&mut self, label: &str, f: Failure) -> i32 {
        if let Some(status) = f.status {
            self.session.grant.count(label, status);
        }
        self.table.last_error = f.message;
        f.code
    }

    /// A usage error: the guest called in the wrong order or with a bad argument.
    fn misuse(&mut self, message: impl Into<String>) -> i32 {
        self.table.last_error = message.into();
        errno::INVALID_ARGUMENT
    }

    fn get(&mut self, handle: i32) -> Result<&mut Call, i32> {
        match usize::try_from(handle) {
            Ok(i) if i < self.table.handles.len() => Ok(&mut self.table.handles[i]),
            _ => Err(self.misuse(format!("{handle} is not an outbound request handle"))),
        }
    }

    /// Takes the call out (leaving `Done(INVALID_ARGUMENT)` while it is worked on).
    fn take(&mut self, handle: i32) -> Result<Call, i32> {
        let call = self.get(handle)?;
        Ok(std::mem::replace(call, Call::Done(errno::INVALID_ARGUMENT)))
    }

    fn put(&mut self, handle: i32, call: Call) {
        if let Some(slot) = usize::try_from(handle)
            .ok()
            .and_then(|i| self.table.handles.get_mut(i))
        {
            *slot = call;
        }
    }

    /// Whether one more request may be made (to `backend`, empty for a URL).
    fn check_new(&mut self, request: &GuestRequest, backend: &str) -> Result<(), i32> {
        let label = self.session.grant.label(backend);
        let n = self.table.handles.len() + 1;
        let calls = self.session.grant.clone();
        match calls.admit(
            n,
            self.session
                .passing(&request.headers, request.context.trace.as_ref()),
            &label,
            &request.context.request_id,
        ) {
            Ok(()) => Ok(()),
            Err(refused) => {
                self.table.last_error = refused.to_string();
                Err(match refused {
                    Refused::TooMany(_) => errno::LIMIT_EXCEEDED,
                    Refused::Loop(_) => errno::DENIED,
                })
            }
        }
    }

    /// `handoff_websocket`: the guest's answer hands the client's WebSocket to `backend`
    /// (one of the tenant's backends), as a `tern-handoff` header of it would.
    pub fn handoff_websocket(
        &mut self,
        request: &GuestRequest,
        response: &mut GuestResponse,
        backend: &[u8],
    ) -> i32 {
        let Ok(backend) = std::str::from_utf8(backend) else {
            return self.misuse("a backend name is UTF-8");
        };
        if !crate::websocket::is_opening(&request.method, request.context.version, &request.headers)
        {
            self.table.last_error = "the request opens no WebSocket (no Upgrade: websocket)".into();
            return errno::UNAVAILABLE;
        }
        if self.session.grant.policy.backend_label(backend).is_none() {
            self.table.last_error = Denied::UnknownBackend(backend.to_string()).to_string();
            return errno::DENIED;
        }
        if response.is_streaming() {
            return errno::HEADERS_SENT;
        }
        response.handoff =
            Some(HeaderValue::from_str(backend).expect("a backend name is a header value"));
        0
    }

    /// A request refused by the policy: counted, logged, and its reason kept for
    /// `outbound_last_error`.
    fn denied(&mut self, backend: &str, d: &Denied, request: &GuestRequest) -> i32 {
        let label = self.session.grant.label(backend);
        let why = d.to_string();
        self.session
            .grant
            .log_denied(&request.context.request_id, &why);
        let code = match d {
            Denied::BadTarget(_) => errno::INVALID_ARGUMENT,
            Denied::Unresolved { .. } => errno::IO,
            _ => errno::DENIED,
        };
        self.fail(&label, Failure::new(code, "denied", why))
    }

    /// Sends the request built in `handle`: its head now; its body whole, or (with `stream`)
    /// from later writes.
    pub(super) fn send(&mut self, handle: i32, stream: bool, incoming: &GuestRequest) -> i32 {
        let call = match self.take(handle) {
            Ok(c) => c,
            Err(code) => return code,
        };
        let Call::Building(draft) = call else {
            self.put(handle, call);
            return self.misuse("outbound_send: this request was already sent");
        };
        if stream && draft.forward.is_some() {
            self.put(handle, Call::Building(draft));
            return self.misuse("outbound_send: a forwarded body cannot be streamed by the guest");
        }
        let Draft {
            method,
            target,
            headers,
            body,
            forward,
        } = *draft;
        let (out_body, sender) = match forward {
            Some(client) => (OutBody::client(client), None),
            None if stream => {
                let (tx, rx) = mpsc::channel(STREAM_CHUNKS);
                (OutBody::stream(rx), Some(tx))
            }
            None => (OutBody::full(body.freeze()), None),
        };
        let mut req = Request::new(out_body);
        *req.method_mut() = method;
        *req.headers_mut() = headers;
        let (calls, passing) = (
            self.session.grant.clone(),
            self.session
                .passing(&incoming.headers, incoming.context.trace.as_ref())
                .clone(),
        );
        let (first_byte, label) = (target.timeouts.first_byte, target.label.clone());
        let started = Instant::now();
        let deadline = started + target.timeouts.total;
        let total = target.timeouts.total;
        // This runs on the guest's fiber stack: boxed, the exchange's (large) future and the
        // task cell around it are built on the heap. Built on the stack they took ~3 pages
        // beyond the part kept resident, faulted in and decommitted again on every request.
        let task = tokio::spawn(Box::pin(async move {
            Ok(calls.exchange(&target, req, first_byte, &passing).await?)
        }));
        let pending = Pending {
            task,
            label,
            deadline,
            total,
        };
        let call = match sender {
            Some(body) => Call::Streaming {
                body,
                written: 0,
                pending,
            },
            None => Call::Sent(pending),
        };
        self.put(handle, call);
        0
    }

    /// `outbound_forward_request`: the request in `handle`, not sent yet, takes the client's
    /// headers (not `host`, `content-length` or the hop-by-hop ones; after any the guest set)
    /// and its body, which is streamed on when the request is sent.
    pub(super) fn forward_request(&mut self, handle: i32, incoming: &mut GuestRequest) -> i32 {
        let passed =
            |name: &HeaderName| !hop_by_hop(name.as_str()) && *name != http::header::CONTENT_LENGTH;
        let adding = incoming.headers.iter().filter(|(n, _)| passed(n)).count();
        let refused = match self.get(handle) {
            Err(code) => return code,
            Ok(Call::Building(d)) if !d.body.is_empty() || d.forward.is_some() => {
                Some("the request already has a body (written or forwarded)".to_string())
            }
            Ok(Call::Building(d)) if d.headers.len() + adding > MAX_HEADERS => Some(format!(
                "more than {MAX_HEADERS} headers with the client's {adding}"
            )),
            Ok(Call::Building(_)) => None,
            Ok(_) => Some("the request was already sent".to_string()),
        };
        if let Some(why) = refused {
            return self.misuse(format!("outbound_forward_request: {why}"));
        }
        let client = match incoming.take_body() {
            Ok(body) => body,
            Err(why) => return self.misuse(format!("outbound_forward_request: {why}")),
        };
        let Ok(Call::Building(draft)) = self.get(handle) else {
            unreachable!("checked above");
        };
        for (name, value) in incoming.headers.iter().filter(|(n, _)| passed(n)) {
            draft.headers.append(name.clone(), value.clone());
        }
        draft.forward = Some(client);
        0
    }

    /// `response_forward`: the response of `handle` (its head waited for) becomes the guest's
    /// answer, its body streamed to the client by the server once the guest has ended, within
    /// the tenant's response limit and the backend's total timeout.
    pub(super) async fn forward_response(
        &mut self,
        handle: i32,
        response: &mut GuestResponse,
    ) -> i32 {
        // (The wait for the head counts as the outbound phase there.)
        if let Err(code) = self.responded(handle).await {
            return code;
        }
        let Ok(Call::Responded(r)) = self.take(handle) else {
            unreachable!("responded leaves the handle answered");
        };
        if r.received > 0 || !r.leftover.is_empty() {
            self.put(handle, Call::Responded(r));
            return self.misuse("response_forward: the guest has read from the response body");
        }
        let Responded {
            status,
            headers,
            body,
            deadline,
            total,
            ..
        } = *r;
        let status = http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::BAD_GATEWAY);
        let max = response
            .max_bytes
            .min(self.session.grant.policy.max_response_bytes);
        let body = crate::body::Forwarded::new(body, max, (deadline.into(), total));
        let forwarded = response.forward(status, headers, body);
        self.put(handle, Call::Done(errno::INVALID_ARGUMENT));
        let (code, why) = match forwarded {
            Ok(()) => return 0,
            Err(ForwardError::BodyWritten) => (
                errno::INVALID_ARGUMENT,
                "the guest wrote a body or forwarded a response already",
            ),
            Err(ForwardError::HeadersSent) => (errno::HEADERS_SENT, "the response has started"),
            Err(ForwardError::Limit) => (
                errno::LIMIT_EXCEEDED,
                "the backend's headers go past the tenant's limits",
            ),
        };
        self.table.last_error = format!("response_forward: {why}");
        code
    }

    /// Waits for the head of `handle`'s response (ending a streaming body first).
    async fn responded(&mut self, handle: i32) -> Result<&mut Responded, i32> {
        let waited = Instant::now();
        let call = self.take(handle)?;
        let pending = match call {
            Call::Responded(_) => {
                self.put(handle, call);
                return match self.get(handle)? {
                    Call::Responded(r) => Ok(r),
                    _ => unreachable!("just put back"),
                };
            }
            Call::Streaming { body, pending, .. } => {
                finish(&body).await;
                pending
            }
            Call::Sent(pending) => pending,
            Call::Building(_) => {
                self.put(handle, call);
                return Err(self.misuse("the request has not been sent (call outbound_send)"));
            }
            Call::Done(code) => {
                self.put(handle, Call::Done(code));
                return Err(code);
            }
        };
        // The exchange ends by the backend's total timeout.
        let result = pending.task.await;
        self.session.waited += waited.elapsed();
        let label = pending.label.clone();
        let outcome = match result {
            Ok(r) => r,
            Err(join) => Err(Failure::new(
                errno::IO,
                "error",
                format!("the request task ended: {join}"),
            )),
        };
        match outcome {
            Ok(resp) => {
                let status = resp.status().as_u16();
                let (parts, body) = resp.into_parts();
                let mut headers = parts.headers;
                for name in crate::body::FRAMING_HEADERS.iter().chain(&SET_BY_TERN) {
                    headers.remove(*name);
                }
                self.put(
                    handle,
                    Call::Responded(Box::new(Responded {
                        status,
                        headers,
                        blob: None,
                        body,
                        leftover: Bytes::new(),
                        received: 0,
                        done: false,
                        deadline: pending.deadline,
                        total: pending.total,
                        label,
                    })),
                );
                match self.get(handle)? {
                    Call::Responded(r) => Ok(r),
                    _ => unreachable!("just put"),
                }
            }
            Err(f) => {
                let code = self.fail(&label, f);
                self.put(handle, Call::Done(code));
                Err(code)
            }
        }
    }

    /// The next bytes of `handle`'s response body (empty at its end).
    async fn body_chunk(&mut self, handle: i32) -> Result<Bytes, i32> {
        let max = self.session.grant.policy.max_response_bytes;
        let r = self.responded(handle).await?;
        // (The wait for the head is counted by `responded`.)
        let waited = Instant::now();
        if !r.leftover.is_empty() {
            return Ok(std::mem::take(&mut r.leftover));
        }
        if r.done {
            return Ok(Bytes::new());
        }
        let result = loop {
            match tokio::time::timeout_at(r.deadline.into(), r.body.frame()).await {
                Err(_) => {
                    break Err(Failure::new(
                        errno::TIMEOUT,
                        "timeout",
                        format!(
                            "the response body did not end within {} ms (total_timeout_ms)",
                            r.total.as_millis()
                        ),
                    ));
                }
                Ok(None) => {
                    r.done = true;
                    break Ok(Bytes::new());
                }
                Ok(Some(Err(e))) => {
                    break Err(Failure::new(
                        errno::IO,
                        "error",
                        format!("the response body failed: {e}"),
                    ));
                }
                Ok(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data()
                        && !data.is_empty()
                    {
                        r.received += data.len() as u64;
                        if r.received > max {
                            break Err(Failure::new(
                                errno::LIMIT_EXCEEDED,
                                "limit",
                                format!(
                                    "the response body is larger than {max} bytes \
                                     (outbound.max_response_bytes)"
                                ),
                            ));
                        }
                        break Ok(data);
                    }
                }
            }
        };
        let label = r.label.clone();
        self.session.waited += waited.elapsed();
        result.map_err(|f| {
            let code = self.fail(&label, f);
            self.put(handle, Call::Done(code));
            code
        })
    }
}

/// Ends a streamed request body with its end marker (an empty chunk). If the request already
/// failed nobody reads it, which is fine: the failure is what the guest will see.
async fn finish(body: &mpsc::Sender<Bytes>) {
    let _ = body.send(Bytes::new()).await;
}

impl OutboundCalls<'_> {
    /// `outbound_request`: makes a request of `method` to `backend` (a configured backend,
    /// `url` its path) or to `url` (an allowed host), after the admission and policy checks.
    /// Returns its handle, or an error code with its reason kept for `outbound_last_error`.
    pub(super) async fn request(
        &mut self,
        incoming: &GuestRequest,
        method: &[u8],
        backend: Vec<u8>,
        url: Vec<u8>,
    ) -> i32 {
        let (Ok(backend), Ok(url)) = (String::from_utf8(backend), String::from_utf8(url)) else {
            return self.misuse("the backend name and URL must be UTF-8");
        };
        if let Err(code) = self.check_new(incoming, &backend) {
            return code;
        }
        let Ok(method) = Method::from_bytes(method) else {
            return self.misuse("not an HTTP method");
        };
        if backend.is_empty() && url.is_empty() {
            return self.misuse("give a backend name and a path, or a URL");
        }
        let calls = self.session.grant.clone();
        let waited = Instant::now();
        let target = calls.policy.destination(&backend, &url).await;
        self.session.waited += waited.elapsed();
        let target = match target {
            Ok(t) => t,
            Err(d) => return self.denied(&backend, &d, incoming),
        };
        self.table.handles.push(Call::Building(Box::new(Draft {
            method,
            target,
            headers: HeaderMap::new(),
            body: BytesMut::new(),
            forward: None,
        })));
        i32::try_from(self.table.handles.len() - 1).unwrap_or(errno::LIMIT_EXCEEDED)
    }

    /// `outbound_header_append`: adds a header to the request being built in `handle`. The
    /// headers Tern sets itself (framing, the host, the loop marker) are dropped silently.
    pub(super) fn header_append(&mut self, handle: i32, name: &[u8], value: &[u8]) -> i32 {
        let (Ok(name), Ok(value)) = (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
        else {
            return self.misuse("not a valid header name or value");
        };
        let call = match self.get(handle) {
            Ok(c) => c,
            Err(code) => return code,
        };
        let Call::Building(draft) = call else {
            return self.misuse("headers can be added only before outbound_send");
        };
        if hop_by_hop(name.as_str()) || name == http::header::CONTENT_LENGTH {
            return 0; // Tern frames the request and sets the host itself.
        }
        if draft.headers.len() >= MAX_HEADERS {
            return errno::LIMIT_EXCEEDED;
        }
        draft.headers.append(name, value);
        0
    }

    /// `outbound_body_write`: adds `chunk` to the body of the request in `handle`: kept until
    /// it is sent, or (a streaming request) handed to the backend, waiting while it is slow.
    /// Returns the bytes taken, or an error code.
    pub(super) async fn body_write(&mut self, handle: i32, chunk: Vec<u8>) -> i32 {
        let max = self.session.grant.policy.max_request_bytes;
        let too_large = |out: &mut OutboundCalls<'_>| {
            out.misuse(format!(
                "the request body is larger than {max} bytes (outbound.max_request_bytes)"
            ));
            errno::LIMIT_EXCEEDED
        };
        let n = i32::try_from(chunk.len()).unwrap_or(i32::MAX);
        let sender = match self.get(handle) {
            Err(code) => return code,
            Ok(Call::Building(draft)) if draft.forward.is_some() => {
                return self.misuse("the request's body is the client's (forwarded)");
            }
            Ok(Call::Building(draft)) => {
                if (draft.body.len() + chunk.len()) as u64 > max {
                    return too_large(self);
                }
                draft.body.extend_from_slice(&chunk);
                return n;
            }
            Ok(Call::Streaming { body, written, .. }) => {
                *written += chunk.len() as u64;
                if *written > max {
                    return too_large(self);
                }
                body.clone()
            }
            Ok(_) => return self.misuse("the request body is complete"),
        };
        if chunk.is_empty() {
            return 0;
        }
        let waited = Instant::now();
        let sent = sender.send(Bytes::from(chunk)).await;
        self.session.waited += waited.elapsed();
        match sent {
            Ok(()) => n,
            Err(_) => {
                self.table.last_error = "the backend stopped reading the request body".into();
                errno::IO
            }
        }
    }

    /// `outbound_body_finish`: ends a streaming request's body (a request sent whole has
    /// nothing to finish).
    pub(super) async fn body_finish(&mut self, handle: i32) -> i32 {
        let call = match self.take(handle) {
            Ok(c) => c,
            Err(code) => return code,
        };
        match call {
            Call::Streaming { body, pending, .. } => {
                let waited = Instant::now();
                finish(&body).await;
                self.session.waited += waited.elapsed();
                self.put(handle, Call::Sent(pending));
                0
            }
            Call::Building(_) => {
                self.put(handle, call);
                self.misuse("the request has not been sent (call outbound_send)")
            }
            other => {
                self.put(handle, other);
                0
            }
        }
    }

    /// The status of the response to `handle`, waiting for its head.
    pub(super) async fn response_status(&mut self, handle: i32) -> i32 {
        match self.responded(handle).await {
            Ok(r) => i32::from(r.status),
            Err(code) => code,
        }
    }

    /// The headers of the response to `handle` as `outbound_response_headers` gives them,
    /// waiting for its head.
    pub(super) async fn response_headers(&mut self, handle: i32) -> Result<&[u8], i32> {
        let r = self.responded(handle).await?;
        let headers = &r.headers;
        Ok(r.blob.get_or_insert_with(|| headers_blob(headers)))
    }

    /// The next bytes of the response body of `handle`, at most `max`: what the guest did not
    /// take of the last chunk, else the next chunk (empty at the end).
    pub(super) async fn body_read(&mut self, handle: i32, max: usize) -> Result<Bytes, i32> {
        let mut chunk = self.body_chunk(handle).await?;
        let n = max.min(chunk.len());
        if let Ok(Call::Responded(r)) = self.get(handle) {
            r.leftover = chunk.split_off(n);
        }
        Ok(chunk)
    }

    /// `outbound_close`: the request in `handle` is dropped (a running one aborted); the
    /// handle answers `INVALID_ARGUMENT` from then on.
    pub(super) fn close(&mut self, handle: i32) -> i32 {
        let call = match self.take(handle) {
            Ok(c) => c,
            Err(code) => return code,
        };
        if let Call::Streaming { pending, .. } | Call::Sent(pending) = &call {
            pending.task.abort();
        }
        self.put(handle, Call::Done(errno::INVALID_ARGUMENT));
        0
    }
}

#[cfg(test)]
mod tests;
