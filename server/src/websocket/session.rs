//! Events mode: Tern holds the client's WebSocket and its guest sees only requests. Each
//! batch of the client's events (`OPEN` first, then `TEXT`, `BINARY`, `CLOSE`, `DISCONNECT`)
//! is a `POST` to the opening's path in a fresh instance, in Pushpin's WebSocket-over-HTTP
//! format ([`super::events`]); the events of its answer go back to the client. One batch is
//! in flight per connection at a time; what the client sends meanwhile waits for the next.
//!
//! With GRIP (the guest's `OPEN` answer carries `Sec-WebSocket-Extensions: grip`), a `TEXT`
//! event starting `c:` is a control message (`subscribe`, `unsubscribe`, `detach`, `set-meta`,
//! `keep-alive`, and Tern's own `publish`), and the others carry the prefix `m:` (or the
//! extension's `message-prefix`), taken off; one without it is dropped, as Pushpin does.
//!
//! Batches carry the opening's headers, `Connection-Id`, and the connection's metadata as
//! `Meta-*` headers (set by an answer's `Set-Meta-*` headers or a `set-meta` control
//! message): a guest keeps per-connection state there without a store.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures_util::future::BoxFuture;
use http::header::{
    ACCEPT, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, SEC_WEBSOCKET_EXTENSIONS, SEC_WEBSOCKET_KEY,
    SEC_WEBSOCKET_VERSION, TRANSFER_ENCODING, UPGRADE,
};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::channels::{Grant, Member, Push, Target};
use super::endpoint::{Incoming, Reader, close_payload, opcode, write_frame};
use super::events::{self, Event, Kind, MEDIA_TYPE};
use super::frame::{Violation, code};
use super::relay::Counts;
use crate::body::{RequestBody, ResponseBody};

/// The header a batch names its connection in.
pub static CONNECTION_ID: HeaderName = HeaderName::from_static("connection-id");

/// Largest answer body a batch reads; past it the connection is closed (`1011`).
const MAX_ANSWER: usize = 4 << 20;

/// Largest batch body sent to the guest (a batch holds at least one message whatever its
/// size), and at most the tenant's `max_request_bytes`.
const MAX_BATCH: usize = 1 << 20;

/// The most an event's name, length and CRLFs add to a message.
const EVENT_HEAD: u64 = 32;

/// Metadata a connection keeps: entries, and bytes of one value.
const MAX_META: usize = 32;
const MAX_META_VALUE: usize = 1024;

/// How long a closing connection waits for the client's close frame.
const CLOSING: Duration = Duration::from_secs(2);

/// What an events connection asks of the server: its guest's runs (each a request of the
/// tenant, through the front end's steps) and publishes beyond this server.
pub trait Origin: Send + Sync + 'static {
    /// Runs the tenant's guest on `req` (a batch): its answer.
    fn call(&self, req: Request<RequestBody>) -> BoxFuture<'static, Response<ResponseBody>>;
    /// Publishes `push` to `to` of this tenant on every replica (a guest's `publish` control
    /// message).
    fn publish(&self, to: Target, push: Push);
}

/// An events connection before it is accepted: what its batches are made of.
pub struct Session {
    origin: Arc<dyn Origin>,
    id: String,
    /// The opening's target and headers, as batches carry them.
    uri: http::Uri,
    headers: HeaderMap,
    meta: Vec<(HeaderName, HeaderValue)>,
}

/// Why an opening was not accepted: the answer the client gets instead.
pub enum Refused {
    /// The guest's own answer (a `401`, say), passed on.
    Guest(Response<ResponseBody>),
    /// The guest answered something that is not an acceptance: why (`502`).
    Bad(String),
}

/// An accepted opening: the guest's answer's headers for the client's `101`, and the rest
/// of what its events said.
pub struct Accepted {
    /// Headers for the client (`Sec-WebSocket-Protocol`, cookies...).
    pub headers: HeaderMap,
    session: Session,
    grip: Option<Bytes>,
    /// Events after `OPEN` in the answer.
    events: Vec<Event>,
}

impl Session {
    /// A session for the opening `req` (its headers as the guest saw them), answered by
    /// `origin`.
    pub fn new(origin: Arc<dyn Origin>, uri: http::Uri, mut headers: HeaderMap) -> Self {
        for name in [
            UPGRADE,
            CONNECTION,
            SEC_WEBSOCKET_KEY,
            SEC_WEBSOCKET_VERSION,
            SEC_WEBSOCKET_EXTENSIONS,
            CONTENT_LENGTH,
            TRANSFER_ENCODING,
            ACCEPT,
            CONTENT_TYPE,
            CONNECTION_ID.clone(),
            // (A batch's answer is read by Tern: never compressed.)
            http::header::ACCEPT_ENCODING,
            http::header::TE,
        ] {
            headers.remove(name);
        }
        // A client's own `Meta-*` would pass for the connection's metadata.
        let metas: Vec<HeaderName> = headers
            .keys()
            .filter(|n| n.as_str().starts_with("meta-"))
            .cloned()
            .collect();
        for n in metas {
            headers.remove(n);
        }
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(MEDIA_TYPE));
        headers.insert(ACCEPT, HeaderValue::from_static(MEDIA_TYPE));
        let id = new_id();
        headers.insert(
            CONNECTION_ID.clone(),
            HeaderValue::from_str(&id).expect("hex"),
        );
        Self {
            origin,
            id,
            uri,
            headers,
            meta: Vec::new(),
        }
    }

    /// The connection's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The request of a batch of `events`.
    fn request(&self, events: &[Event]) -> Request<RequestBody> {
        let body = events::encode(events);
        let mut req = Request::new(RequestBody::Full(body.clone()));
        *req.method_mut() = Method::POST;
        *req.uri_mut() = self.uri.clone();
        let h = req.headers_mut();
        *h = self.headers.clone();
        for (n, v) in &self.meta {
            h.append(n.clone(), v.clone());
        }
        h.insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
        req
    }

    /// The request that sends the guest the `OPEN` event.
    pub fn opening_request(&self) -> Request<RequestBody> {
        self.request(&[Event::bare(Kind::Open)])
    }

    /// Reads the guest's answer to the `OPEN` event.
    ///
    /// # Errors
    /// The guest refused (its answer), or answered something else than an acceptance.
    pub async fn accept(mut self, resp: Response<ResponseBody>) -> Result<Accepted, Refused> {
        let (parts, body) = resp.into_parts();
        if !is_events(parts.status, &parts.headers) {
            return Err(Refused::Guest(Response::from_parts(parts, body)));
        }
        let body = read_body(body).await.map_err(Refused::Bad)?;
        let mut events =
            events::decode(&body).map_err(|e| Refused::Bad(format!("its answer: {e}")))?;
        if events.first().map(|e| e.kind) != Some(Kind::Open) {
            return Err(Refused::Bad(
                "its answer's events do not start with OPEN".into(),
            ));
        }
        events.remove(0);
        let grip = grip_prefix(&parts.headers);
        self.set_meta_from(&parts.headers);
        let mut headers = parts.headers;
        for name in [
            CONTENT_TYPE,
            CONTENT_LENGTH,
            SEC_WEBSOCKET_EXTENSIONS,
            TRANSFER_ENCODING,
        ] {
            headers.remove(name);
        }
        let private: Vec<HeaderName> = headers
            .keys()
            .filter(|n| n.as_str().starts_with("set-meta-") || n.as_str() == "keep-alive-interval")
            .cloned()
            .collect();
        for n in private {
            headers.remove(n);
        }
        Ok(Accepted {
            headers,
            session: self,
            grip,
            events,
        })
    }

    /// Takes the `Set-Meta-*` headers of an answer into the connection's metadata.
    fn set_meta_from(&mut self, headers: &HeaderMap) {
        for (n, v) in headers {
            if let Some(name) = n.as_str().strip_prefix("set-meta-") {
                self.set_meta(name, v.clone());
            }
        }
    }

    fn set_meta(&mut self, name: &str, value: HeaderValue) {
        let Ok(header) = HeaderName::from_bytes(format!("meta-{name}").as_bytes()) else {
            return;
        };
        self.meta.retain(|(n, _)| *n != header);
        if !value.is_empty() && value.len() <= MAX_META_VALUE && self.meta.len() < MAX_META {
            self.meta.push((header, value));
        }
    }
}

/// Whether an answer is a body of events (`200` and the media type).
fn is_events(status: StatusCode, headers: &HeaderMap) -> bool {
    status == StatusCode::OK
        && headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| {
                v.split(';')
                    .next()
                    .is_some_and(|t| t.trim().eq_ignore_ascii_case(MEDIA_TYPE))
            })
}

/// The prefix of a GRIP answer's messages, when the answer turns GRIP on.
fn grip_prefix(headers: &HeaderMap) -> Option<Bytes> {
    for v in headers.get_all(SEC_WEBSOCKET_EXTENSIONS) {
        for ext in v.to_str().unwrap_or("").split(',') {
            let mut params = ext.split(';').map(str::trim);
            if params.next() != Some("grip") {
                continue;
            }
            let prefix = params
                .filter_map(|p| p.split_once('='))
                .find(|(k, _)| k.trim() == "message-prefix")
                .map(|(_, v)| v.trim().trim_matches('"').to_string());
            return Some(Bytes::from(prefix.unwrap_or_else(|| "m:".into())));
        }
    }
    None
}

/// An answer's body, read whole (up to [`MAX_ANSWER`]).
async fn read_body(body: ResponseBody) -> Result<Bytes, String> {
    use http_body_util::BodyExt;
    let mut body = std::pin::pin!(body);
    let mut out = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| format!("its answer's body was cut: {e}"))?;
        if let Ok(data) = frame.into_data() {
            if out.len() + data.len() > MAX_ANSWER {
                return Err(format!("its answer is over {MAX_ANSWER} bytes"));
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(out.freeze())
}

/// A new connection id: 16 random bytes in hex (unique across a fleet).
fn new_id() -> String {
    crate::hex::random_id::<16>()
}

/// An events connection's limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// What every connection is held to (`[tenant.websocket]`).
    pub base: super::relay::Limits,
    /// Largest batch: [`MAX_BATCH`], or less when the tenant's requests are smaller.
    pub max_batch: usize,
}

/// How an events connection ended: its close code and bytes sent to the client.
#[derive(Debug, Clone, Copy)]
pub struct Ended {
    pub code: u16,
    pub bytes_out: u64,
}

/// What the connection does next.
enum Next {
    Go,
    /// Send this close (code, reason) and wait for the client's; tell the guest `DISCONNECT`
    /// when `disconnect`.
    Close(Option<u16>, Bytes, bool),
    /// Drop the connection now (the guest's `DISCONNECT`, or the client gone); tell the guest
    /// when `disconnect`.
    Drop(u16, bool),
}

impl Accepted {
    /// The connection's id.
    pub fn id(&self) -> &str {
        self.session.id()
    }

    /// Runs the connection over `io` until it ends.
    #[allow(clippy::too_many_lines)]
    pub async fn run<S>(
        self,
        io: S,
        channels: &Grant,
        limits: Limits,
        counts: &Counts,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Ended
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let Accepted {
            mut session,
            grip,
            events: first,
            ..
        } = self;
        let (member, mut pushed) = channels.join(session.id());
        let mut c = Conn {
            member,
            grip,
            detached: false,
            out: BytesMut::new(),
            bytes_out: 0,
            counts,
        };
        let (mut rd, mut wr) = tokio::io::split(io);
        let mut inbuf = BytesMut::with_capacity(1024);
        let mut reader = Reader::new(limits.base.max_message);
        let mut pending: Vec<Event> = Vec::new();
        let mut pending_bytes = 0usize;
        let mut inflight: Option<tokio::task::JoinHandle<Answered>> = None;
        let opened = Instant::now();
        // The last frame either way (a client that only listens is not idle).
        let mut last_active = opened;
        let (mut second, mut frames_this_second) = (opened, 0u32);
        // The client has sent its close (its code), and the guest is told.
        let mut client_closed: Option<Option<u16>> = None;
        // The client broke the protocol or a limit: the close it gets once what it sent before
        // is answered (its messages already read go to the guest; nothing more is read).
        let mut failing: Option<Next> = None;
        let mut shutdown = std::pin::pin!(shutdown);
        let mut next = c.answer_events(&mut session, first);
        let write_timeout = limits.base.idle;
        loop {
            if let Next::Go = next
                && inflight.is_none()
                && (pending.is_empty() || c.detached)
            {
                // The client's close is answered once the guest has seen it; a failure's close
                // once the guest has answered what came before it.
                if let Some(code) = client_closed {
                    next = Next::Close(code, Bytes::new(), false);
                } else if let Some(failed) = failing.take() {
                    next = failed;
                }
            }
            if !matches!(next, Next::Go) {
                break;
            }
            if inflight.is_none() && !pending.is_empty() && !c.detached {
                let batch = take_batch(&mut pending, &mut pending_bytes, limits.max_batch);
                let req = session.request(&batch);
                let origin = session.origin.clone();
                // (Its answer's body is read in the batch's task: the connection goes on
                // meanwhile, pushes, timers and shutdown included.)
                inflight = Some(tokio::spawn(async move {
                    let (parts, body) = origin.call(req).await.into_parts();
                    if !is_events(parts.status, &parts.headers) {
                        return Err(format!("the guest answered {}", parts.status));
                    }
                    Ok((parts.headers, read_body(body).await?))
                }));
            }
            if !c.out.is_empty() {
                let n = c.out.len();
                match tokio::time::timeout(write_timeout, wr.write_all(&c.out)).await {
                    Ok(Ok(())) => {
                        c.bytes_out += n as u64;
                        c.counts.bytes[1].inc_by(n as u64);
                        c.out.clear();
                        last_active = Instant::now();
                    }
                    _ => {
                        next = Next::Drop(code::ABNORMAL, true);
                        continue;
                    }
                }
            }
            let reading =
                client_closed.is_none() && failing.is_none() && pending_bytes < limits.max_batch;
            let deadline = (last_active + limits.base.idle).min(opened + limits.base.lifetime);
            tokio::select! {
                read = rd.read_buf(&mut inbuf), if reading => {
                    match read {
                        Ok(0) | Err(_) => next = Next::Drop(code::ABNORMAL, true),
                        Ok(n) => {
                            counts.bytes[0].inc_by(n as u64);
                            last_active = Instant::now();
                            if last_active.duration_since(second) >= Duration::from_secs(1) {
                                (second, frames_this_second) = (last_active, 0);
                            }
                            loop {
                                let got = reader.next(&mut inbuf);
                                // Every frame counts, whether it ends a message or not.
                                frames_this_second += std::mem::take(&mut reader.frames);
                                if frames_this_second > limits.base.frames_per_second {
                                    failing = Some(violation(Violation::Rate));
                                    break;
                                }
                                match got {
                                    Ok(None) => break,
                                    Ok(Some(m)) => {
                                        match m {
                                            Incoming::Ping(p) => write_frame(&mut c.out, opcode::PONG, &p),
                                            Incoming::Pong(_) => {}
                                            Incoming::Text(t) => {
                                                counts.messages[0].inc();
                                                if !c.detached {
                                                    pending_bytes += t.len();
                                                    pending.push(Event::with(Kind::Text, t));
                                                }
                                            }
                                            Incoming::Binary(b) => {
                                                counts.messages[0].inc();
                                                if !c.detached {
                                                    pending_bytes += b.len();
                                                    pending.push(Event::with(Kind::Binary, b));
                                                }
                                            }
                                            Incoming::Close(code, reason) => {
                                                client_closed = Some(code);
                                                if !c.detached {
                                                    pending.push(Event::close(code, &reason));
                                                }
                                                break;
                                            }
                                        }
                                    }
                                    Err(v) => {
                                        failing = Some(violation(v));
                                        break;
                                    }
                                }
                            }
                            if inbuf.is_empty() && inbuf.capacity() > 64 * 1024 {
                                // A large message has gone: an idle connection holds little.
                                inbuf = BytesMut::with_capacity(1024);
                            }
                        }
                    }
                }
                answer = async { inflight.as_mut().expect("guarded").await }, if inflight.is_some() => {
                    inflight = None;
                    next = match answer {
                        Ok(answered) => c.answered(&mut session, answered),
                        Err(_) => guest_failed("the guest's run failed".into()),
                    };
                    if pending.is_empty() {
                        pending_bytes = 0;
                    }
                    if c.detached {
                        // Nothing more goes to the guest.
                        pending.clear();
                        pending_bytes = 0;
                    }
                }
                push = pushed.recv() => {
                    if let Some(push) = push {
                        next = c.push(push);
                    }
                }
                () = tokio::time::sleep_until(deadline.into()) => {
                    let now = Instant::now();
                    if now >= opened + limits.base.lifetime || now >= last_active + limits.base.idle {
                        next = Next::Close(Some(code::GOING_AWAY), Bytes::from_static(b"idle or lived its time"), true);
                    }
                }
                () = &mut shutdown => {
                    next = Next::Close(Some(code::GOING_AWAY), Bytes::from_static(b"server shutting down"), true);
                }
            }
        }
        let (code, disconnect) = match next {
            Next::Go => unreachable!("the loop ends on a close"),
            Next::Drop(code, disconnect) => (code, disconnect),
            Next::Close(code, reason, disconnect) => {
                // (What was queued before it goes first: a guest's last messages, a pong.)
                write_frame(&mut c.out, opcode::CLOSE, &close_payload(code, &reason));
                let sent = tokio::time::timeout(CLOSING, wr.write_all(&c.out)).await;
                if matches!(sent, Ok(Ok(()))) {
                    c.bytes_out += c.out.len() as u64;
                    counts.bytes[1].inc_by(c.out.len() as u64);
                    // The client's close, unless it sent it already (anything before it is
                    // dropped).
                    if client_closed.is_none() {
                        let _ = tokio::time::timeout(CLOSING, async {
                            loop {
                                match reader.next(&mut inbuf) {
                                    Ok(Some(Incoming::Close(..))) | Err(_) => break,
                                    Ok(Some(_)) => continue,
                                    Ok(None) => {}
                                }
                                match rd.read_buf(&mut inbuf).await {
                                    Ok(0) | Err(_) => break,
                                    Ok(_) => {}
                                }
                            }
                        })
                        .await;
                    }
                }
                let _ = tokio::time::timeout(CLOSING, wr.shutdown()).await;
                (code.unwrap_or(code::NO_STATUS), disconnect)
            }
        };
        if let Some(h) = inflight {
            h.abort();
        }
        if disconnect && !c.detached {
            // The guest is told, in the background.
            let req = session.request(&[Event::bare(Kind::Disconnect)]);
            let grip = c.grip.is_some();
            drop(tokio::spawn(tell_disconnect(
                session.origin.clone(),
                req,
                grip,
            )));
        }
        Ended {
            code,
            bytes_out: c.bytes_out,
        }
    }
}

/// A batch's answer: its headers and body of events, or why it is not one.
type Answered = Result<(HeaderMap, Bytes), String>;

/// The connection's state the answers act on.
struct Conn<'a> {
    member: Member,
    grip: Option<Bytes>,
    /// A `detach` control message: the client's messages no longer go to the guest.
    detached: bool,
    /// Frames to write to the client.
    out: BytesMut,
    bytes_out: u64,
    counts: &'a Counts,
}

fn violation(v: Violation) -> Next {
    let (code, why) = v.close();
    Next::Close(Some(code), Bytes::from_static(why.as_bytes()), true)
}

fn guest_failed(why: String) -> Next {
    tracing::debug!("events WebSocket closed: {why}");
    Next::Close(
        Some(code::INTERNAL),
        Bytes::from_static(b"the server's handler failed"),
        false,
    )
}

/// Takes the next batch off `pending`: everything up to `max` bytes, at least one.
fn take_batch(pending: &mut Vec<Event>, pending_bytes: &mut usize, max: usize) -> Vec<Event> {
    let mut size = 0;
    let n = pending
        .iter()
        .position(|e| {
            size += e.encoded_len();
            size > max
        })
        .unwrap_or(pending.len())
        .max(1);
    let batch: Vec<Event> = pending.drain(..n).collect();
    let taken: usize = batch
        .iter()
        .map(|e| e.content.as_ref().map_or(0, Bytes::len))
        .sum();
    *pending_bytes = pending_bytes.saturating_sub(taken);
    batch
}

impl Conn<'_> {
    /// A batch's answer: its events to the client, its controls done.
    fn answered(&mut self, session: &mut Session, answered: Answered) -> Next {
        let (headers, body) = match answered {
            Ok(a) => a,
            Err(e) => return guest_failed(e),
        };
        session.set_meta_from(&headers);
        match events::decode(&body) {
            Ok(evs) => self.answer_events(session, evs),
            Err(e) => guest_failed(format!("its answer: {e}")),
        }
    }

    /// Events from the guest, in order.
    fn answer_events(&mut self, session: &mut Session, evs: Vec<Event>) -> Next {
        for e in evs {
            let content = e.content.unwrap_or_default();
            match e.kind {
                Kind::Text | Kind::Binary => {
                    let text = e.kind == Kind::Text;
                    let message = match &self.grip {
                        None => content,
                        Some(_) if text && content.starts_with(b"c:") => {
                            if let Some(next) = self.control(session, &content[2..]) {
                                return next;
                            }
                            continue;
                        }
                        Some(prefix) if content.starts_with(prefix) => {
                            content.slice(prefix.len()..)
                        }
                        // (As Pushpin does: a message without the prefix is not sent.)
                        Some(_) => continue,
                    };
                    if text && std::str::from_utf8(&message).is_err() {
                        return guest_failed("a TEXT event that is not UTF-8".into());
                    }
                    self.counts.messages[1].inc();
                    let op = if text { opcode::TEXT } else { opcode::BINARY };
                    write_frame(&mut self.out, op, &message);
                }
                Kind::Ping if content.len() <= 125 => {
                    write_frame(&mut self.out, opcode::PING, &content)
                }
                Kind::Pong if content.len() <= 125 => {
                    write_frame(&mut self.out, opcode::PONG, &content)
                }
                Kind::Ping | Kind::Pong | Kind::Open => {}
                Kind::Close => {
                    let code = (content.len() >= 2)
                        .then(|| u16::from_be_bytes([content[0], content[1]]))
                        .filter(|c| super::endpoint::may_be_sent(*c));
                    let reason = if content.len() > 2 {
                        content.slice(2..)
                    } else {
                        Bytes::new()
                    };
                    return Next::Close(code.or(Some(1000)), reason, false);
                }
                Kind::Disconnect => return Next::Drop(code::ABNORMAL, false),
            }
        }
        Next::Go
    }

    /// A GRIP control message; what the connection does next if it ends it.
    fn control(&mut self, session: &mut Session, json: &[u8]) -> Option<Next> {
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(json) else {
            tracing::debug!("a guest's control message is not JSON");
            return None;
        };
        let str_of = |k: &str| v.get(k).and_then(serde_json::Value::as_str);
        match str_of("type") {
            Some("subscribe") => {
                if let Some(ch) = str_of("channel")
                    && let Err(e) = self.member.subscribe(ch)
                {
                    tracing::debug!("a guest's subscribe was refused: {e}");
                }
            }
            Some("unsubscribe") => {
                if let Some(ch) = str_of("channel") {
                    self.member.unsubscribe(ch);
                }
            }
            Some("detach") => self.detached = true,
            Some("set-meta") => {
                if let Some(name) = str_of("name") {
                    let value = str_of("value").unwrap_or("");
                    if let Ok(value) = HeaderValue::from_str(value) {
                        session.set_meta(&name.to_ascii_lowercase(), value);
                    }
                }
            }
            Some("publish") => publish_control(&*session.origin, &v),
            // Tern closes idle connections itself and clients ping: accepted, nothing to do.
            Some("keep-alive") => {}
            other => tracing::debug!(?other, "a guest's control message of unknown type"),
        }
        None
    }

    /// A published message for this connection.
    fn push(&mut self, push: Push) -> Next {
        match push {
            Push::Text(t) => {
                self.counts.messages[1].inc();
                write_frame(&mut self.out, opcode::TEXT, &t);
            }
            Push::Binary(b) => {
                self.counts.messages[1].inc();
                write_frame(&mut self.out, opcode::BINARY, &b);
            }
            Push::Close(code, reason) => return Next::Close(Some(code), reason, true),
        }
        Next::Go
    }
}

/// A guest's `publish` control message `v`, done.
fn publish_control(origin: &dyn Origin, v: &serde_json::Value) {
    let str_of = |k: &str| v.get(k).and_then(serde_json::Value::as_str);
    let message: Result<super::channels::WsMessage, _> =
        serde_json::from_value(strip(v, &["type", "channel", "connection"]));
    let target = match (str_of("channel"), str_of("connection")) {
        (Some(ch), None) if super::channels::check_channel(ch).is_ok() => {
            Some(Target::Channel(ch.to_string()))
        }
        (None, Some(id)) => Some(Target::Connection(id.to_string())),
        _ => None,
    };
    let message = message
        .map_err(|e| e.to_string())
        .and_then(super::channels::WsMessage::read);
    match (target, message) {
        (Some(to), Ok(push)) => origin.publish(to, push),
        (_, Err(e)) => tracing::debug!("a guest's publish was refused: {e}"),
        (None, _) => tracing::debug!("a guest's publish names no channel or connection"),
    }
}

/// Tells the guest the connection is gone (`DISCONNECT`); of its answer only `publish`
/// control messages are done (a "left the room" for the others, say).
async fn tell_disconnect(origin: Arc<dyn Origin>, req: Request<RequestBody>, grip: bool) {
    let resp = origin.call(req).await;
    let (parts, body) = resp.into_parts();
    if !grip || !is_events(parts.status, &parts.headers) {
        return;
    }
    let Ok(body) = read_body(body).await else {
        return;
    };
    for e in events::decode(&body).unwrap_or_default() {
        if e.kind == Kind::Text
            && let Some(json) = e.content.as_ref().and_then(|c| c.strip_prefix(b"c:"))
            && let Ok(v) = serde_json::from_slice::<serde_json::Value>(json)
            && v.get("type").and_then(serde_json::Value::as_str) == Some("publish")
        {
            publish_control(&*origin, &v);
        }
    }
}

/// `v` without the keys `keys`.
fn strip(v: &serde_json::Value, keys: &[&str]) -> serde_json::Value {
    let mut v = v.clone();
    if let Some(o) = v.as_object_mut() {
        for k in keys {
            o.remove(*k);
        }
    }
    v
}

/// Answers an accepted opening (`101`, or `200` over HTTP/2) and runs the connection in a
/// task of `sockets` once the client's side has switched. The access line is written when
/// the connection closes.
pub fn start(
    mut accepted: Accepted,
    opening: super::Opening,
    place: super::Place,
    sockets: &Arc<super::Sockets>,
    channels: &Arc<Grant>,
    tenant: super::Tenant<'_>,
) -> Response<ResponseBody> {
    let counts = Counts::of(&sockets.metrics, tenant.label);
    // A message travels in a request of the tenant's: its size is bounded by both (less the
    // bytes of its event's head).
    let mut base = super::relay::Limits::of(tenant.limits);
    base.max_message = base
        .max_message
        .min(tenant.max_request_bytes.saturating_sub(EVENT_HEAD));
    let limits = Limits {
        base,
        max_batch: usize::try_from(tenant.max_request_bytes)
            .unwrap_or(usize::MAX)
            .min(MAX_BATCH),
    };
    let channels = channels.clone();
    let headers = std::mem::take(&mut accepted.headers);
    super::handoff::switch(
        sockets,
        opening,
        place,
        tenant.label,
        headers,
        move |client, shutdown| async move {
            let shutdown = async move { shutdown.wait().await };
            let ended = accepted
                .run(client, &channels, limits, &counts, shutdown)
                .await;
            (ended.code, ended.bytes_out)
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grip_is_turned_on_by_the_extension_with_its_prefix() {
        let mut h = HeaderMap::new();
        assert_eq!(grip_prefix(&h), None);
        h.insert(SEC_WEBSOCKET_EXTENSIONS, HeaderValue::from_static("grip"));
        assert_eq!(grip_prefix(&h), Some(Bytes::from_static(b"m:")));
        h.insert(
            SEC_WEBSOCKET_EXTENSIONS,
            HeaderValue::from_static("x, grip; message-prefix=\"\""),
        );
        assert_eq!(grip_prefix(&h), Some(Bytes::new()));
        h.insert(
            SEC_WEBSOCKET_EXTENSIONS,
            HeaderValue::from_static("gripper"),
        );
        assert_eq!(grip_prefix(&h), None);
    }

    #[test]
    fn an_answer_is_events_by_status_and_media_type() {
        let mut h = HeaderMap::new();
        h.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/websocket-events"),
        );
        assert!(is_events(StatusCode::OK, &h));
        assert!(!is_events(StatusCode::CREATED, &h));
        h.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("Application/WebSocket-Events; x=1"),
        );
        assert!(is_events(StatusCode::OK, &h));
        h.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        assert!(!is_events(StatusCode::OK, &h));
    }

    #[test]
    fn a_batch_is_at_most_its_size_but_never_empty() {
        let big = Event::with(Kind::Binary, Bytes::from(vec![0; MAX_BATCH]));
        let small = Event::with(Kind::Text, Bytes::from_static(b"x"));
        let mut pending = vec![big, small.clone(), small];
        let mut bytes = MAX_BATCH + 2;
        assert_eq!(take_batch(&mut pending, &mut bytes, MAX_BATCH).len(), 1);
        assert_eq!(bytes, 2);
        assert_eq!(take_batch(&mut pending, &mut bytes, MAX_BATCH).len(), 2);
        assert_eq!(bytes, 0);
    }
}
