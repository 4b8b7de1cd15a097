//! WebSocket events: what a guest of a tenant with `[tenant.websocket] mode = "events"` is
//! sent and answers with.
//!
//! Tern holds the client's WebSocket; the guest sees a `POST` to the opening's path with
//! `Content-Type: application/websocket-events`, a `Connection-Id` header and a body of
//! events (Pushpin's WebSocket-over-HTTP format): `OPEN` when the client opens, then batches
//! of `TEXT`, `BINARY` and `CLOSE`, and `DISCONNECT` when the connection ends without a close.
//! The answer is `200` with a body of events: `OPEN` first to accept an opening (any other
//! answer refuses it and goes to the client as it is), then messages for the client, `CLOSE`
//! to close it.
//!
//! Answer an opening with [`GRIP`] in `Sec-WebSocket-Extensions` to subscribe the connection
//! to channels: with it, messages for the client are [`message`]s (prefixed `m:`) and control
//! messages ([`subscribe`], [`publish`]) go among them. A message published to a channel (by a
//! guest, or the admin API's `POST /admin/v1/tenants/{name}/publish`) reaches every
//! connection subscribed to it, on every replica.
//!
//! ```no_run
//! use tern_sdk::websocket::{self, Event};
//!
//! fn main() {
//!     tern_sdk::serve(|req| {
//!         let mut body = Vec::new();
//!         std::io::Read::read_to_end(&mut req.into_body(), &mut body).unwrap();
//!         let mut out = Vec::new();
//!         for event in websocket::parse(&body).unwrap_or_default() {
//!             match event {
//!                 Event::Open => {
//!                     out.push(Event::Open);
//!                     out.push(websocket::subscribe("lobby"));
//!                 }
//!                 Event::Text(t) => out.push(websocket::publish("lobby", &t)),
//!                 _ => {}
//!             }
//!         }
//!         websocket::answer(&out, true)
//!     });
//! }
//! ```
//!
//! From any request (an events batch, or an ordinary one: a webhook, a form), a guest can
//! also publish at once with [`publish_to_channel`] and [`publish_to_connection`].
#![allow(unsafe_code)]

use crate::sys;

interface_error!(
    /// Why a publish failed: the host's error code and its message.
    PublishError,
    "publish",
    websocket_last_error,
    "The ABI error code ([`crate::abi::errno`]): `INVALID_ARGUMENT` (a channel name that is \
     empty, over 256 bytes or with control characters; a message over 1 MiB; a close code \
     nobody may send), `UNAVAILABLE` (the tenant's WebSockets are not in events mode), \
     `LIMIT_EXCEEDED` (over 100 publishes in one request)."
);

/// A message to publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Message<'a> {
    /// A text message.
    Text(&'a str),
    /// A binary message.
    Binary(&'a [u8]),
    /// Close the connections with this code (1000, or 3000-4999 for an application's own)
    /// and reason (at most 123 bytes).
    Close(u16, &'a str),
}

/// Publishes `message` to every connection of the tenant subscribed to `channel`, on this
/// server and on every other replica of a fleet. Returns how many connections on this server
/// it was queued for (a connection whose queue is full misses it).
///
/// ```no_run
/// use tern_sdk::websocket::{self, Message};
/// tern_sdk::serve(|req| {
///     // A webhook: tell everyone in the room.
///     let n = websocket::publish_to_channel("lobby", Message::Text("new order")).unwrap_or(0);
///     tern_sdk::http::Response::new(format!("told {n}\n").into_bytes())
/// });
/// ```
///
/// # Errors
/// [`PublishError`].
pub fn publish_to_channel(channel: &str, message: Message<'_>) -> Result<usize, PublishError> {
    publish_json(&item("channel", channel, message))
}

/// Sends `message` to the connection whose `Connection-Id` is `id`, on whichever replica
/// holds it. Returns 1 when it is on this server and the message was queued, else 0.
///
/// # Errors
/// [`PublishError`].
pub fn publish_to_connection(id: &str, message: Message<'_>) -> Result<usize, PublishError> {
    publish_json(&item("connection", id, message))
}

/// Publishes a body in Pushpin's publish format, several items at once (`{"items":
/// [{"channel": "room", "formats": {"ws-message": {"content": "hi"}}}, ...]}`), as the admin
/// API's `POST /admin/v1/tenants/{name}/publish` takes it.
///
/// # Errors
/// [`PublishError`].
pub fn publish_json(publish: &str) -> Result<usize, PublishError> {
    // SAFETY: the host reads `publish.len()` bytes at its pointer.
    check(unsafe { sys::websocket_publish(publish.as_ptr(), publish.len()) })
}

/// The publish of one item: `message` to `target` (`channel` or `connection`) `name`.
fn item(target: &str, name: &str, message: Message<'_>) -> String {
    let format = match message {
        Message::Text(t) => format!(r#"{{"content":{}}}"#, json_string(t)),
        Message::Binary(b) => format!(r#"{{"content-bin":"{}"}}"#, base64(b)),
        Message::Close(code, reason) => format!(
            r#"{{"action":"close","code":{code},"reason":{}}}"#,
            json_string(reason)
        ),
    };
    format!(
        r#"{{"items":[{{"{target}":{},"formats":{{"ws-message":{format}}}}}]}}"#,
        json_string(name)
    )
}

/// `bytes` in standard base64, padded.
fn base64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ABC[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The media type of a body of events.
pub const MEDIA_TYPE: &str = "application/websocket-events";

/// The `Sec-WebSocket-Extensions` value that turns control messages on (answer an `OPEN`
/// with it).
pub const GRIP: &str = "grip";

/// One event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The client opens (sent), or the guest accepts (answered first).
    Open,
    /// A text message.
    Text(String),
    /// A binary message.
    Binary(Vec<u8>),
    /// A ping.
    Ping(Vec<u8>),
    /// A pong.
    Pong(Vec<u8>),
    /// A close, with its code (if any) and reason.
    Close(Option<u16>, String),
    /// The connection ended without a close (sent), or is to be dropped (answered).
    Disconnect,
}

/// A body of events that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError(pub String);

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "bad websocket events: {}", self.0)
    }
}

impl std::error::Error for ParseError {}

/// The events of a request's body.
///
/// # Errors
/// An unknown event, a bad length, content cut short, text that is not UTF-8.
pub fn parse(body: &[u8]) -> Result<Vec<Event>, ParseError> {
    let bad = |s: &str| ParseError(s.to_string());
    let mut out = Vec::new();
    let mut at = 0;
    while at < body.len() {
        let rest = &body[at..];
        let end = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| bad("an event without CRLF"))?;
        let line = std::str::from_utf8(&rest[..end]).map_err(|_| bad("an event's name"))?;
        at += end + 2;
        let (name, content) = match line.split_once(' ') {
            None => (line, None),
            Some((name, hex)) => {
                let len = usize::from_str_radix(hex, 16).map_err(|_| bad("a length"))?;
                let stop = at
                    .checked_add(len)
                    .filter(|&s| s.saturating_add(2) <= body.len())
                    .ok_or_else(|| bad("content cut short"))?;
                let content = body[at..stop].to_vec();
                at = stop + 2;
                (name, Some(content))
            }
        };
        let content = content.unwrap_or_default();
        let text = |c: Vec<u8>| String::from_utf8(c).map_err(|_| bad("text is not UTF-8"));
        out.push(match name {
            "OPEN" => Event::Open,
            "TEXT" => Event::Text(text(content)?),
            "BINARY" => Event::Binary(content),
            "PING" => Event::Ping(content),
            "PONG" => Event::Pong(content),
            "CLOSE" => {
                let code =
                    (content.len() >= 2).then(|| u16::from_be_bytes([content[0], content[1]]));
                let reason = content.get(2..).unwrap_or_default().to_vec();
                Event::Close(code, text(reason)?)
            }
            "DISCONNECT" => Event::Disconnect,
            _ => return Err(bad("an unknown event")),
        });
    }
    Ok(out)
}

/// `events` as a body.
pub fn encode(events: &[Event]) -> Vec<u8> {
    let mut out = Vec::new();
    for e in events {
        let (name, content): (&str, Option<Vec<u8>>) = match e {
            Event::Open => ("OPEN", None),
            Event::Text(t) => ("TEXT", Some(t.as_bytes().to_vec())),
            Event::Binary(b) => ("BINARY", Some(b.clone())),
            Event::Ping(b) => ("PING", Some(b.clone())),
            Event::Pong(b) => ("PONG", Some(b.clone())),
            Event::Close(None, _) => ("CLOSE", None),
            Event::Close(Some(code), reason) => {
                let mut c = code.to_be_bytes().to_vec();
                c.extend_from_slice(reason.as_bytes());
                ("CLOSE", Some(c))
            }
            Event::Disconnect => ("DISCONNECT", None),
        };
        out.extend_from_slice(name.as_bytes());
        if let Some(c) = content {
            out.extend_from_slice(format!(" {:X}\r\n", c.len()).as_bytes());
            out.extend_from_slice(&c);
        }
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// The answer of `events` (`200`, the media type), with [`GRIP`] when `grip` (answering an
/// `OPEN`: control messages on).
pub fn answer(events: &[Event], grip: bool) -> http::Response<Vec<u8>> {
    let b = http::Response::builder().header("content-type", MEDIA_TYPE);
    let b = if grip {
        b.header("sec-websocket-extensions", GRIP)
    } else {
        b
    };
    b.body(encode(events)).expect("a valid answer")
}

/// A message for the client on a GRIP connection (`m:` and the text).
pub fn message(text: &str) -> Event {
    Event::Text(format!("m:{text}"))
}

/// Subscribes the connection to `channel` (a GRIP control message).
pub fn subscribe(channel: &str) -> Event {
    control(&format!(
        r#"{{"type":"subscribe","channel":{}}}"#,
        json_string(channel)
    ))
}

/// Unsubscribes the connection from `channel`.
pub fn unsubscribe(channel: &str) -> Event {
    control(&format!(
        r#"{{"type":"unsubscribe","channel":{}}}"#,
        json_string(channel)
    ))
}

/// Publishes `text` to every connection subscribed to `channel` (this one too, if it is),
/// on every replica.
pub fn publish(channel: &str, text: &str) -> Event {
    control(&format!(
        r#"{{"type":"publish","channel":{},"content":{}}}"#,
        json_string(channel),
        json_string(text)
    ))
}

/// Sets the connection's metadata `name` (sent back as a `Meta-NAME` header with each
/// later batch; an empty value removes it).
pub fn set_meta(name: &str, value: &str) -> Event {
    control(&format!(
        r#"{{"type":"set-meta","name":{},"value":{}}}"#,
        json_string(name),
        json_string(value)
    ))
}

fn control(json: &str) -> Event {
    Event::Text(format!("c:{json}"))
}

/// `s` as a JSON string.
fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip() {
        let events = vec![
            Event::Open,
            Event::Text("héllo".into()),
            Event::Binary(vec![0, 1, 2]),
            Event::Close(Some(1000), "bye".into()),
            Event::Close(None, String::new()),
            Event::Disconnect,
        ];
        let body = encode(&events);
        assert!(body.starts_with(b"OPEN\r\nTEXT 6\r\nh\xc3\xa9llo\r\nBINARY 3\r\n"));
        assert_eq!(parse(&body).unwrap(), events);
        assert!(parse(b"TEXT 9\r\nab\r\n").is_err());
        assert!(parse(b"WAVE\r\n").is_err());
    }

    #[test]
    fn control_messages_are_json() {
        let Event::Text(t) = publish("room \"1\"", "a\nb") else {
            panic!()
        };
        let v: serde_json::Value = serde_json::from_str(t.strip_prefix("c:").unwrap()).unwrap();
        assert_eq!(v["channel"], "room \"1\"");
        assert_eq!(v["content"], "a\nb");
        assert_eq!(message("x"), Event::Text("m:x".into()));
    }

    #[test]
    fn a_publish_item_is_pushpins_json() {
        let v: serde_json::Value =
            serde_json::from_str(&item("channel", "a\"b", Message::Text("hi\n"))).unwrap();
        assert_eq!(v["items"][0]["channel"], "a\"b");
        assert_eq!(v["items"][0]["formats"]["ws-message"]["content"], "hi\n");
        let v: serde_json::Value =
            serde_json::from_str(&item("connection", "c1", Message::Close(4000, "done"))).unwrap();
        assert_eq!(v["items"][0]["connection"], "c1");
        assert_eq!(v["items"][0]["formats"]["ws-message"]["action"], "close");
        assert_eq!(v["items"][0]["formats"]["ws-message"]["code"], 4000);
        for (bytes, b64) in [
            (&b""[..], ""),
            (b"f", "Zg=="),
            (b"fo", "Zm8="),
            (b"foo", "Zm9v"),
            (b"foob", "Zm9vYg=="),
            (&[0xff, 0xfe, 0x00][..], "//4A"),
        ] {
            assert_eq!(base64(bytes), b64, "{bytes:?}");
        }
    }
}
