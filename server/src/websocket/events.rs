//! The WebSocket-over-HTTP events (Pushpin's `application/websocket-events`): what an events
//! guest is sent and answers with, one event after another in a body.
//!
//! Each event is its name, then, when it has content, a space and the content's length in
//! hexadecimal; a CRLF; the content and a CRLF: `TEXT 5\r\nhello\r\n`, `OPEN\r\n`. A `CLOSE`
//! event's content is the close code (two bytes, big-endian) and the reason.

use bytes::{BufMut, Bytes, BytesMut};

/// The media type of a body of events.
pub const MEDIA_TYPE: &str = "application/websocket-events";

/// What an event is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The opening (asked by Tern, accepted by the guest).
    Open,
    /// A text message.
    Text,
    /// A binary message.
    Binary,
    /// A ping.
    Ping,
    /// A pong.
    Pong,
    /// A close, with its code and reason.
    Close,
    /// The connection ended without a close (or is to be dropped).
    Disconnect,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Self::Open => "OPEN",
            Self::Text => "TEXT",
            Self::Binary => "BINARY",
            Self::Ping => "PING",
            Self::Pong => "PONG",
            Self::Close => "CLOSE",
            Self::Disconnect => "DISCONNECT",
        }
    }

    fn named(name: &[u8]) -> Option<Self> {
        Some(match name {
            b"OPEN" => Self::Open,
            b"TEXT" => Self::Text,
            b"BINARY" => Self::Binary,
            b"PING" => Self::Ping,
            b"PONG" => Self::Pong,
            b"CLOSE" => Self::Close,
            b"DISCONNECT" => Self::Disconnect,
            _ => return None,
        })
    }
}

/// One event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub kind: Kind,
    /// Its content (`None`: none, as `OPEN` has).
    pub content: Option<Bytes>,
}

impl Event {
    /// An event without content.
    pub fn bare(kind: Kind) -> Self {
        Self {
            kind,
            content: None,
        }
    }

    /// An event with `content`.
    pub fn with(kind: Kind, content: Bytes) -> Self {
        Self {
            kind,
            content: Some(content),
        }
    }

    /// A `CLOSE` event of `code` (none: no code).
    pub fn close(code: Option<u16>, reason: &[u8]) -> Self {
        match code {
            None => Self::bare(Kind::Close),
            Some(code) => {
                let mut b = BytesMut::with_capacity(2 + reason.len());
                b.put_u16(code);
                b.put_slice(reason);
                Self::with(Kind::Close, b.freeze())
            }
        }
    }

    /// The bytes its encoding takes.
    pub fn encoded_len(&self) -> usize {
        let name = self.kind.name().len();
        match &self.content {
            None => name + 2,
            Some(c) => name + 1 + hex_digits(c.len()) + 2 + c.len() + 2,
        }
    }

    /// Appends its encoding to `out`.
    pub fn encode(&self, out: &mut BytesMut) {
        out.put_slice(self.kind.name().as_bytes());
        if let Some(c) = &self.content {
            out.put_u8(b' ');
            let _ = std::fmt::Write::write_fmt(&mut Hex(out), format_args!("{:X}", c.len()));
            out.put_slice(b"\r\n");
            out.put_slice(c);
        }
        out.put_slice(b"\r\n");
    }
}

/// Writes formatted text into a `BytesMut`.
struct Hex<'a>(&'a mut BytesMut);

impl std::fmt::Write for Hex<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.put_slice(s.as_bytes());
        Ok(())
    }
}

fn hex_digits(n: usize) -> usize {
    if n == 0 {
        1
    } else {
        (usize::BITS - n.leading_zeros()).div_ceil(4) as usize
    }
}

/// `events` encoded as one body.
pub fn encode(events: &[Event]) -> Bytes {
    let mut out = BytesMut::with_capacity(events.iter().map(Event::encoded_len).sum());
    for e in events {
        e.encode(&mut out);
    }
    out.freeze()
}

/// The events of `body`, or what is wrong with it (a guest's answer that cannot be read
/// closes the connection).
///
/// # Errors
/// An unknown event, a length that is not hexadecimal, content cut short, a missing CRLF.
pub fn decode(body: &Bytes) -> Result<Vec<Event>, String> {
    let mut events = Vec::new();
    let mut at = 0;
    while at < body.len() {
        let rest = &body[at..];
        let line_end = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| format!("event at byte {at} has no CRLF after its name"))?;
        let line = &rest[..line_end];
        let (name, len) = match line.iter().position(|&b| b == b' ') {
            Some(space) => {
                let digits = std::str::from_utf8(&line[space + 1..]).unwrap_or("");
                let len = usize::from_str_radix(digits, 16)
                    .ok()
                    .filter(|_| !digits.is_empty() && !digits.starts_with('+'))
                    .ok_or_else(|| format!("event at byte {at}: {digits:?} is not a hex length"))?;
                (&line[..space], Some(len))
            }
            None => (line, None),
        };
        let kind = Kind::named(name).ok_or_else(|| {
            format!(
                "event at byte {at}: unknown event {:?}",
                String::from_utf8_lossy(&name[..name.len().min(32)])
            )
        })?;
        at += line_end + 2;
        let content = match len {
            None => None,
            Some(len) => {
                let end = at
                    .checked_add(len)
                    .filter(|&e| e.saturating_add(2) <= body.len())
                    .ok_or_else(|| format!("{} event's content is cut short", kind.name()))?;
                if &body[end..end + 2] != b"\r\n" {
                    return Err(format!(
                        "{} event's content is not followed by CRLF",
                        kind.name()
                    ));
                }
                let content = body.slice(at..end);
                at = end + 2;
                Some(content)
            }
        };
        events.push(Event { kind, content });
    }
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_in_pushpins_format() {
        let events = vec![
            Event::bare(Kind::Open),
            Event::with(Kind::Text, Bytes::from_static(b"hello world")),
            Event::with(Kind::Binary, Bytes::from(vec![0u8; 300])),
            Event::with(Kind::Text, Bytes::new()),
            Event::close(Some(1000), b"bye"),
            Event::bare(Kind::Disconnect),
        ];
        let body = encode(&events);
        assert!(body.starts_with(b"OPEN\r\nTEXT B\r\nhello world\r\nBINARY 12C\r\n"));
        assert!(body.ends_with(b"TEXT 0\r\n\r\nCLOSE 5\r\n\x03\xe8bye\r\nDISCONNECT\r\n"));
        assert_eq!(
            body.len(),
            events.iter().map(Event::encoded_len).sum::<usize>()
        );
        assert_eq!(decode(&body).unwrap(), events);
        // Lower-case hex is read too.
        let lower = decode(&Bytes::from_static(
            b"BINARY 1a\r\nabcdefghijklmnopqrstuvwxyz\r\n",
        ));
        assert_eq!(lower.unwrap()[0].content.as_ref().unwrap().len(), 26);
        assert_eq!(decode(&Bytes::new()).unwrap(), vec![]);
    }

    #[test]
    fn a_body_that_cannot_be_read_says_where() {
        let bad = |b: &'static [u8]| decode(&Bytes::from_static(b)).unwrap_err();
        assert!(bad(b"OPEN").contains("no CRLF"));
        assert!(bad(b"SHOUT\r\n").contains("unknown event \"SHOUT\""));
        assert!(bad(b"TEXT zz\r\nab\r\n").contains("not a hex length"));
        assert!(bad(b"TEXT \r\n").contains("not a hex length"));
        assert!(bad(b"TEXT +2\r\nab\r\n").contains("not a hex length"));
        assert!(bad(b"TEXT 5\r\nab\r\n").contains("cut short"));
        assert!(bad(b"TEXT 2\r\nabcd\r\n").contains("not followed by CRLF"));
        assert!(bad(b"TEXT FFFFFFFFFFFFFFFF\r\nab\r\n").contains("cut short"));
        // A length that overflows with the CRLF after it.
        assert!(bad(b"TEXT FFFFFFFFFFFFFFE8\r\nab\r\n").contains("cut short"));
    }
}
