//! The server's end of a WebSocket Tern terminates itself (events mode): a client's frames
//! read into whole messages (unmasked, fragments joined, text checked as UTF-8, control frames
//! taken as they come between fragments), and the server's frames written.
//!
//! Everything RFC 6455 forbids a client closes the connection with the code that says why:
//! `1002` (a frame the protocol forbids: unmasked, reserved bits or opcodes with no extension
//! agreed, a fragmented or long control frame, a continuation of nothing, a close code nobody
//! may send), `1007` (text, or a close reason, that is not UTF-8), `1009` (a message over the
//! tenant's `max_message_bytes`), `1008` (frames faster than `max_frames_per_second`).

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::frame::Violation;

/// What a client sent: a whole message or a control frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Incoming {
    /// A text message (checked UTF-8).
    Text(Bytes),
    /// A binary message.
    Binary(Bytes),
    /// A ping (answered by Tern with a pong).
    Ping(Bytes),
    /// A pong.
    Pong(Bytes),
    /// A close: its code (`None`: the frame had none) and reason.
    Close(Option<u16>, Bytes),
}

/// Reads a client's frames from the bytes it sent.
#[derive(Debug)]
pub struct Reader {
    /// Frames read (whole), for the frame rate: the reader's user takes them.
    pub frames: u32,
    max_message: u64,
    /// The message being put together from its fragments: text or not, and its payload.
    message: Option<(bool, BytesMut)>,
}

impl Reader {
    /// A reader of messages up to `max_message` bytes.
    pub fn new(max_message: u64) -> Self {
        Self {
            frames: 0,
            max_message,
            message: None,
        }
    }

    /// The next whole message or control frame in `buf` (its bytes taken off), `None` when
    /// `buf` holds no whole frame yet. Each frame read is counted in [`Self::frames`].
    ///
    /// # Errors
    /// What the protocol or the tenant's limits forbid (the connection is then closed).
    pub fn next(&mut self, buf: &mut BytesMut) -> Result<Option<Incoming>, Violation> {
        loop {
            let Some((fin, opcode, payload)) = frame(buf, self.max_message, self.so_far())? else {
                return Ok(None);
            };
            self.frames += 1;
            match opcode {
                0x8 => return close(&payload).map(Some),
                0x9 => return Ok(Some(Incoming::Ping(payload.freeze()))),
                0xA => return Ok(Some(Incoming::Pong(payload.freeze()))),
                0x1 | 0x2 if self.message.is_some() => {
                    return Err(Violation::Protocol(
                        "a new message before the last one ended",
                    ));
                }
                0x0 if self.message.is_none() => {
                    return Err(Violation::Protocol(
                        "a continuation frame with no message to continue",
                    ));
                }
                0x1 | 0x2 if fin => {
                    return message(opcode == 0x1, payload).map(Some);
                }
                0x1 | 0x2 => self.message = Some((opcode == 0x1, payload)),
                _ => {
                    let (text, mut so_far) = self.message.take().expect("checked above");
                    so_far.extend_from_slice(&payload);
                    if fin {
                        return message(text, so_far).map(Some);
                    }
                    self.message = Some((text, so_far));
                }
            }
        }
    }

    fn so_far(&self) -> u64 {
        self.message.as_ref().map_or(0, |(_, m)| m.len() as u64)
    }
}

fn message(text: bool, payload: BytesMut) -> Result<Incoming, Violation> {
    if text {
        if std::str::from_utf8(&payload).is_err() {
            return Err(Violation::Utf8);
        }
        Ok(Incoming::Text(payload.freeze()))
    } else {
        Ok(Incoming::Binary(payload.freeze()))
    }
}

/// A close frame's payload read: a code a client may send, a UTF-8 reason.
fn close(payload: &[u8]) -> Result<Incoming, Violation> {
    match payload.len() {
        0 => Ok(Incoming::Close(None, Bytes::new())),
        1 => Err(Violation::Protocol("a close payload of one byte")),
        _ => {
            let c = u16::from_be_bytes([payload[0], payload[1]]);
            if !may_be_sent(c) {
                return Err(Violation::Protocol("a close code nobody may send"));
            }
            let reason = &payload[2..];
            if std::str::from_utf8(reason).is_err() {
                return Err(Violation::Utf8);
            }
            Ok(Incoming::Close(Some(c), Bytes::copy_from_slice(reason)))
        }
    }
}

/// Whether `c` may be sent in a close frame (RFC 6455 §7.4 and the IANA registry): `1005`,
/// `1006` and `1015` are for reporting only.
pub fn may_be_sent(c: u16) -> bool {
    matches!(c, 1000..=1003 | 1007..=1014 | 3000..=4999)
}

/// Takes one whole frame off `buf`: FIN, opcode and the unmasked payload; `None` until it
/// is all there. `so_far`: bytes of the open message before it.
fn frame(
    buf: &mut BytesMut,
    max_message: u64,
    so_far: u64,
) -> Result<Option<(bool, u8, BytesMut)>, Violation> {
    if buf.len() < 2 {
        return Ok(None);
    }
    let (fin, rsv, opcode) = (buf[0] & 0x80 != 0, buf[0] & 0x70, buf[0] & 0x0F);
    if rsv != 0 {
        return Err(Violation::Protocol("reserved bits set"));
    }
    let control = opcode & 0x8 != 0;
    if !matches!(opcode, 0x0..=0x2 | 0x8..=0xA) {
        return Err(Violation::Protocol("a reserved opcode"));
    }
    if buf[1] & 0x80 == 0 {
        return Err(Violation::Protocol("a client's frames must be masked"));
    }
    let (len, head) = match buf[1] & 0x7F {
        126 if buf.len() < 4 => return Ok(None),
        126 => (u64::from(u16::from_be_bytes([buf[2], buf[3]])), 4),
        127 if buf.len() < 10 => return Ok(None),
        127 => {
            let n = u64::from_be_bytes(buf[2..10].try_into().expect("8 bytes"));
            if n >> 63 != 0 {
                return Err(Violation::Protocol("frame length over 2^63"));
            }
            (n, 10)
        }
        n => (u64::from(n), 2),
    };
    if control && (!fin || len > 125) {
        return Err(Violation::Protocol(
            "a control frame is unfragmented and at most 125 bytes",
        ));
    }
    if !control && so_far.saturating_add(len) > max_message {
        return Err(Violation::TooBig);
    }
    let len = usize::try_from(len).map_err(|_| Violation::TooBig)?;
    if buf.len() < head + 4 + len {
        // Room for the rest, once (not a reallocation per read).
        buf.reserve(head + 4 + len - buf.len());
        return Ok(None);
    }
    let mask: [u8; 4] = buf[head..head + 4].try_into().expect("4 bytes");
    buf.advance(head + 4);
    let mut payload = buf.split_to(len);
    unmask(&mut payload, mask);
    Ok(Some((fin, opcode, payload)))
}

/// Unmasks `data` (a word at a time where it can).
fn unmask(data: &mut [u8], mask: [u8; 4]) {
    let word = u32::from_ne_bytes(mask);
    let mut chunks = data.chunks_exact_mut(4);
    for c in &mut chunks {
        let v = u32::from_ne_bytes((&*c).try_into().expect("4 bytes")) ^ word;
        c.copy_from_slice(&v.to_ne_bytes());
    }
    for (i, b) in chunks.into_remainder().iter_mut().enumerate() {
        *b ^= mask[i];
    }
}

/// Appends a server frame (unmasked, one frame per message) of `opcode` with `payload`.
pub fn write_frame(out: &mut BytesMut, opcode: u8, payload: &[u8]) {
    out.reserve(10 + payload.len());
    out.put_u8(0x80 | opcode);
    match payload.len() {
        n if n < 126 => out.put_u8(n as u8),
        n if n <= 0xFFFF => {
            out.put_u8(126);
            out.put_u16(n as u16);
        }
        n => {
            out.put_u8(127);
            out.put_u64(n as u64);
        }
    }
    out.put_slice(payload);
}

/// Opcodes of the frames the server writes.
pub mod opcode {
    pub const TEXT: u8 = 0x1;
    pub const BINARY: u8 = 0x2;
    pub const CLOSE: u8 = 0x8;
    pub const PING: u8 = 0x9;
    pub const PONG: u8 = 0xA;
}

/// A close frame's payload: `code` (none: an empty close) and `reason`, cut to 123 bytes on
/// a character boundary.
pub fn close_payload(c: Option<u16>, reason: &[u8]) -> Vec<u8> {
    let Some(c) = c else { return Vec::new() };
    let mut reason = &reason[..reason.len().min(123)];
    while std::str::from_utf8(reason).is_err() {
        reason = &reason[..reason.len() - 1];
    }
    let mut p = c.to_be_bytes().to_vec();
    p.extend_from_slice(reason);
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(first: u8, payload: &[u8]) -> Vec<u8> {
        let k = [0x37, 0xfa, 0x21, 0x3d];
        let mut f = vec![first];
        match payload.len() {
            n if n < 126 => f.push(0x80 | n as u8),
            n if n <= 0xFFFF => {
                f.push(0x80 | 126);
                f.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                f.push(0x80 | 127);
                f.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        f.extend_from_slice(&k);
        f.extend(payload.iter().enumerate().map(|(i, b)| b ^ k[i % 4]));
        f
    }

    fn read_all(stream: &[u8], max: u64) -> Result<Vec<Incoming>, Violation> {
        let mut r = Reader::new(max);
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        // A byte at a time: every split point.
        for &b in stream {
            buf.put_u8(b);
            while let Some(m) = r.next(&mut buf)? {
                out.push(m);
            }
        }
        assert!(buf.is_empty());
        Ok(out)
    }

    #[test]
    fn fragments_join_and_control_frames_come_between_them() {
        let mut s = frame(0x01, "hé".as_bytes()[..2].as_ref());
        s.extend(frame(0x89, b"ping"));
        s.extend(frame(0x00, &"hé".as_bytes()[2..]));
        s.extend(frame(0x80, b"!"));
        s.extend(frame(0x82, &[1; 70_000]));
        s.extend(frame(0x81, b""));
        s.extend(frame(0x88, &[0x03, 0xe8, b'o', b'k']));
        let got = read_all(&s, 1 << 20).unwrap();
        assert_eq!(
            got,
            vec![
                Incoming::Ping(Bytes::from_static(b"ping")),
                Incoming::Text(Bytes::from("hé!")),
                Incoming::Binary(Bytes::from(vec![1; 70_000])),
                Incoming::Text(Bytes::new()),
                Incoming::Close(Some(1000), Bytes::from_static(b"ok")),
            ]
        );
    }

    #[test]
    fn a_message_at_its_limit_passes_and_one_byte_more_closes_1009() {
        for (len, ok) in [(99, true), (100, true), (101, false)] {
            let r = read_all(&frame(0x82, &vec![0; len]), 100);
            assert_eq!(r.is_ok(), ok, "{len}");
        }
        let mut s = frame(0x02, &[0; 60]);
        s.extend(frame(0x80, &[0; 41]));
        assert_eq!(read_all(&s, 100), Err(Violation::TooBig));
        assert_eq!(Violation::TooBig.close().0, 1009);
    }

    #[test]
    fn what_a_client_may_not_send_closes_with_its_code() {
        let protocol = |s: Vec<u8>| {
            let r = read_all(&s, 1 << 20);
            assert!(matches!(r, Err(Violation::Protocol(_))), "{s:x?}: {r:?}");
        };
        protocol(vec![0x81, 0x01, b'x']); // unmasked
        protocol(frame(0xC1, b"x")); // RSV1 without an extension
        protocol(frame(0x83, b"x")); // reserved opcode
        protocol(frame(0x8B, b"x")); // reserved control opcode
        protocol(frame(0x09, b"x")); // fragmented ping
        protocol(frame(0x89, &[0; 126])); // long ping
        protocol(frame(0x80, b"x")); // continuation of nothing
        protocol(frame(0x88, &[0x03])); // a one-byte close
        for bad in [0u16, 999, 1004, 1005, 1006, 1015, 1016, 2000, 2999, 5000] {
            protocol(frame(0x88, &bad.to_be_bytes()));
        }
        let mut s = frame(0x01, b"a");
        s.extend(frame(0x81, b"b"));
        protocol(s);
        // Text and close reasons that are not UTF-8: 1007.
        assert_eq!(read_all(&frame(0x81, &[0xff]), 100), Err(Violation::Utf8));
        assert_eq!(
            read_all(&frame(0x88, &[0x03, 0xe8, 0xc3]), 100),
            Err(Violation::Utf8)
        );
        assert_eq!(Violation::Utf8.close().0, 1007);
        for good in [1000u16, 1003, 1007, 1011, 1014, 3000, 4999] {
            let got = read_all(&frame(0x88, &good.to_be_bytes()), 100).unwrap();
            assert_eq!(got, vec![Incoming::Close(Some(good), Bytes::new())]);
        }
    }

    #[test]
    fn every_frame_counts_for_the_rate_even_of_a_message_never_finished() {
        // Empty continuation frames forever: no message ends, each frame is counted.
        let mut s = frame(0x01, b"");
        for _ in 0..99 {
            s.extend(frame(0x00, b""));
        }
        let mut r = Reader::new(100);
        let mut buf = BytesMut::from(&s[..]);
        assert_eq!(r.next(&mut buf), Ok(None));
        assert_eq!(r.frames, 100);
    }

    #[test]
    fn server_frames_have_the_three_length_forms() {
        for (len, head) in [(125, 2), (126, 4), (65_535, 4), (65_536, 10)] {
            let mut out = BytesMut::new();
            write_frame(&mut out, opcode::BINARY, &vec![0; len]);
            assert_eq!(out.len(), head + len, "{len}");
            assert_eq!(out[0], 0x82);
        }
        assert_eq!(
            close_payload(Some(1000), "é".repeat(70).as_bytes()).len(),
            2 + 122
        );
        assert!(close_payload(None, b"x").is_empty());
    }
}
