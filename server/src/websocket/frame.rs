//! WebSocket frames (RFC 6455 §5) as a relay sees them: it forwards each side's bytes as they
//! are (masked or not, compressed or not), and reads only the frame heads going by, to count
//! messages, hold a message's size and a client's frame rate to the tenant's limits, refuse
//! what the protocol forbids, and know where a frame ends, so that a close frame of its own can
//! be put between two frames.

/// Opcodes (§5.2).
const CONTINUATION: u8 = 0x0;
const TEXT: u8 = 0x1;
const BINARY: u8 = 0x2;
const CLOSE: u8 = 0x8;
const PING: u8 = 0x9;
const PONG: u8 = 0xA;

/// The longest frame head: 2 bytes, an 8-byte length, a 4-byte mask.
const MAX_HEAD: usize = 14;

/// Close codes the relay sends (§7.4.1).
pub mod code {
    /// Going away: the server shuts down, the connection was idle or lived its time.
    pub const GOING_AWAY: u16 = 1001;
    /// A frame the protocol forbids.
    pub const PROTOCOL_ERROR: u16 = 1002;
    /// No status code in the close frame (never sent).
    pub const NO_STATUS: u16 = 1005;
    /// The connection ended without a close frame (never sent).
    pub const ABNORMAL: u16 = 1006;
    /// A text message or close reason that is not UTF-8.
    pub const INVALID_DATA: u16 = 1007;
    /// Against the tenant's policy: frames faster than its limit.
    pub const POLICY: u16 = 1008;
    /// A message larger than the tenant's limit.
    pub const TOO_BIG: u16 = 1009;
    /// The other side failed (a backend that cannot be reached any more).
    pub const INTERNAL: u16 = 1011;
}

/// Why a side's frames stop being forwarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Violation {
    /// A message over `max_message_bytes`.
    TooBig,
    /// A frame the protocol forbids (what is wrong).
    Protocol(&'static str),
    /// A frame past the client's frames in this second.
    Rate,
    /// Text that is not UTF-8 (a message Tern reads itself, in events mode).
    Utf8,
}

impl Violation {
    /// The close code and reason that say so.
    pub fn close(self) -> (u16, &'static str) {
        match self {
            Self::TooBig => (code::TOO_BIG, "message too big"),
            Self::Protocol(why) => (code::PROTOCOL_ERROR, why),
            Self::Rate => (code::POLICY, "too many frames a second"),
            Self::Utf8 => (code::INVALID_DATA, "text is not UTF-8"),
        }
    }
}

/// What one [`Scanner::scan`] found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Scanned {
    /// How many bytes from the start may be forwarded: whole frame heads and the payload
    /// bytes read (a head not yet whole waits for the next read).
    pub forward: usize,
    /// Frame heads read.
    pub frames: u32,
    /// Messages that ended (their last frame's head read).
    pub messages: u32,
    /// A frame that may not be forwarded: `forward` stops at its head.
    pub violation: Option<Violation>,
}

/// One side's stream of frames, read as it passes.
#[derive(Debug)]
pub struct Scanner {
    /// Frames from this side must be masked (a client's) or must not (a server's).
    masked: bool,
    /// Largest message, all its frames' payloads together.
    max_message: u64,
    /// Payload bytes of the current frame not yet gone by.
    payload_left: u64,
    /// A data message is open (its first frame had no FIN).
    in_message: bool,
    /// Payload bytes of the open message so far.
    message_len: u64,
    /// The current frame is a close frame: its status code's bytes as they go by.
    close: Option<CloseRead>,
    /// The status code of the first close frame this side sent, once read.
    pub close_code: Option<u16>,
}

/// The first two payload bytes of a close frame (its status code), unmasked.
#[derive(Debug, Clone, Copy)]
struct CloseRead {
    mask: [u8; 4],
    offset: u8,
    bytes: [u8; 2],
    len: u64,
}

impl Scanner {
    /// A scanner for a side whose frames are `masked` (the client's), holding messages to
    /// `max_message` bytes.
    pub fn new(masked: bool, max_message: u64) -> Self {
        Self {
            masked,
            max_message,
            payload_left: 0,
            in_message: false,
            message_len: 0,
            close: None,
            close_code: None,
        }
    }

    /// Whether the stream is between two frames (a frame of the relay's own may go next).
    pub fn at_boundary(&self) -> bool {
        self.payload_left == 0
    }

    /// Reads the frame heads in `buf` (bytes not yet forwarded, from a frame boundary or
    /// within the current frame's payload); a frame past `frames_left` more is refused at its
    /// head ([`Violation::Rate`]).
    pub fn scan(&mut self, buf: &[u8], frames_left: u32) -> Scanned {
        let mut s = Scanned::default();
        let mut pos = 0;
        while pos < buf.len() {
            if self.payload_left == 0 && s.frames >= frames_left {
                s.violation = Some(Violation::Rate);
                break;
            }
            if self.payload_left > 0 {
                let take = usize::try_from(self.payload_left)
                    .unwrap_or(usize::MAX)
                    .min(buf.len() - pos);
                self.read_close_code(&buf[pos..pos + take]);
                pos += take;
                self.payload_left -= take as u64;
                if self.payload_left == 0 {
                    self.end_close();
                }
                continue;
            }
            match self.head(&buf[pos..]) {
                Head::Partial => break,
                Head::Bad(v) => {
                    s.violation = Some(v);
                    break;
                }
                Head::Frame {
                    len,
                    payload,
                    message_ended,
                } => {
                    s.frames += 1;
                    s.messages += u32::from(message_ended);
                    pos += len;
                    self.payload_left = payload;
                    if payload == 0 {
                        self.end_close();
                    }
                }
            }
        }
        s.forward = pos;
        s
    }

    /// Reads one frame head at the start of `b`, and takes it into the message's state.
    fn head(&mut self, b: &[u8]) -> Head {
        if b.len() < 2 {
            return Head::Partial;
        }
        let (fin, rsv, opcode) = (b[0] & 0x80 != 0, b[0] & 0x70, b[0] & 0x0F);
        let masked = b[1] & 0x80 != 0;
        let (payload, mut len) = match b[1] & 0x7F {
            126 if b.len() < 4 => return Head::Partial,
            126 => (u64::from(u16::from_be_bytes([b[2], b[3]])), 4),
            127 if b.len() < 10 => return Head::Partial,
            127 => {
                let n = u64::from_be_bytes(b[2..10].try_into().expect("8 bytes"));
                if n >> 63 != 0 {
                    return Head::Bad(Violation::Protocol("frame length over 2^63"));
                }
                (n, 10)
            }
            n => (u64::from(n), 2),
        };
        if masked {
            len += 4;
        }
        if b.len() < len {
            return Head::Partial;
        }
        debug_assert!(len <= MAX_HEAD);
        if masked != self.masked {
            return Head::Bad(Violation::Protocol(if self.masked {
                "a client's frames must be masked"
            } else {
                "a server's frames must not be masked"
            }));
        }
        // (RSV2 and RSV3 belong to no extension in use; RSV1 is permessage-deflate's, which the
        // two ends may have agreed on: its frames pass as they are.)
        if rsv & 0x30 != 0 {
            return Head::Bad(Violation::Protocol("reserved bits set"));
        }
        // (Never on a control frame or a message's later fragments: RFC 7692 §6.1.)
        if rsv != 0 && !matches!(opcode, TEXT | BINARY) {
            return Head::Bad(Violation::Protocol(
                "RSV1 set on a control frame or a continuation",
            ));
        }
        let message_ended = match opcode {
            CLOSE | PING | PONG => {
                if !fin || payload > 125 {
                    return Head::Bad(Violation::Protocol(
                        "a control frame is unfragmented and at most 125 bytes",
                    ));
                }
                if opcode == CLOSE {
                    if payload == 1 {
                        return Head::Bad(Violation::Protocol("a close payload of one byte"));
                    }
                    let mask = if masked {
                        b[len - 4..len].try_into().expect("4 bytes")
                    } else {
                        [0; 4]
                    };
                    self.close = Some(CloseRead {
                        mask,
                        offset: 0,
                        bytes: [0; 2],
                        len: payload,
                    });
                }
                false
            }
            TEXT | BINARY | CONTINUATION => {
                if (opcode == CONTINUATION) != self.in_message {
                    return Head::Bad(Violation::Protocol(if self.in_message {
                        "a new message before the last one ended"
                    } else {
                        "a continuation frame with no message to continue"
                    }));
                }
                let so_far = if opcode == CONTINUATION {
                    self.message_len
                } else {
                    0
                };
                let total = so_far.saturating_add(payload);
                if total > self.max_message {
                    return Head::Bad(Violation::TooBig);
                }
                self.message_len = total;
                self.in_message = !fin;
                fin
            }
            _ => return Head::Bad(Violation::Protocol("a reserved opcode")),
        };
        Head::Frame {
            len,
            payload,
            message_ended,
        }
    }

    /// Takes the status code of a close frame from its payload bytes as they go by.
    fn read_close_code(&mut self, bytes: &[u8]) {
        let Some(c) = &mut self.close else {
            return;
        };
        for &byte in bytes
            .iter()
            .take(2usize.saturating_sub(usize::from(c.offset)))
        {
            let i = usize::from(c.offset);
            c.bytes[i] = byte ^ c.mask[i % 4];
            c.offset += 1;
        }
    }

    /// The close frame has gone by: its code kept (the first one only).
    fn end_close(&mut self) {
        if let Some(c) = self.close.take()
            && self.close_code.is_none()
        {
            self.close_code = Some(if c.len == 0 {
                code::NO_STATUS
            } else {
                u16::from_be_bytes(c.bytes)
            });
        }
    }
}

enum Head {
    /// More bytes are needed.
    Partial,
    /// A frame the relay does not forward.
    Bad(Violation),
    /// A frame: its head's length, its payload's, and whether it ends a data message.
    Frame {
        len: usize,
        payload: u64,
        message_ended: bool,
    },
}

/// A close frame with `code` and `reason` (cut to fit 125 bytes), masked with `mask` when it
/// goes to a server.
pub fn close_frame(code: u16, reason: &str, mask: Option<[u8; 4]>) -> Vec<u8> {
    let mut reason = &reason.as_bytes()[..reason.len().min(123)];
    // (Cut on a character boundary: a close reason must be UTF-8.)
    while std::str::from_utf8(reason).is_err() {
        reason = &reason[..reason.len() - 1];
    }
    let mut payload = Vec::with_capacity(2 + reason.len());
    payload.extend_from_slice(&code.to_be_bytes());
    payload.extend_from_slice(reason);
    let mut frame = Vec::with_capacity(6 + payload.len());
    frame.push(0x80 | CLOSE);
    let len = u8::try_from(payload.len()).expect("at most 125");
    match mask {
        None => {
            frame.push(len);
            frame.extend_from_slice(&payload);
        }
        Some(mask) => {
            frame.push(0x80 | len);
            frame.extend_from_slice(&mask);
            frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        }
    }
    frame
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A frame: `first` (FIN, RSV, opcode), `payload`, masked with `mask` if given.
    fn frame(first: u8, payload: &[u8], mask: Option<[u8; 4]>) -> Vec<u8> {
        let mut f = vec![first];
        let m = if mask.is_some() { 0x80 } else { 0 };
        match payload.len() {
            n if n < 126 => f.push(m | n as u8),
            n if n <= 0xFFFF => {
                f.push(m | 126);
                f.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                f.push(m | 127);
                f.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        match mask {
            Some(k) => {
                f.extend_from_slice(&k);
                f.extend(payload.iter().enumerate().map(|(i, b)| b ^ k[i % 4]));
            }
            None => f.extend_from_slice(payload),
        }
        f
    }

    const K: Option<[u8; 4]> = Some([1, 2, 3, 4]);

    #[test]
    fn frames_are_read_whole_or_held_back_at_any_split() {
        let mut stream = frame(0x81, b"hello", K);
        stream.extend(frame(0x02, &[7; 300], K));
        stream.extend(frame(0x89, b"p", K));
        stream.extend(frame(0x80, &[8; 70_000], K));
        // Every split point: what is forwarded adds up, heads are never cut.
        for split in 0..stream.len().min(400) {
            let mut s = Scanner::new(true, 1 << 20);
            let a = s.scan(&stream[..split], u32::MAX);
            let rest = &stream[a.forward..];
            let b = s.scan(rest, u32::MAX);
            assert_eq!(a.forward + b.forward, stream.len(), "split {split}");
            assert_eq!(a.frames + b.frames, 4, "split {split}");
            assert_eq!(a.messages + b.messages, 2, "split {split}");
            assert!(s.at_boundary());
        }
    }

    #[test]
    fn a_message_over_the_limit_stops_at_the_frame_that_makes_it_so() {
        // limit - 1, limit: forwarded; limit + 1: stopped at its head.
        for (len, over) in [(99, false), (100, false), (101, true)] {
            let mut s = Scanner::new(true, 100);
            let f = frame(0x82, &vec![0; len], K);
            let r = s.scan(&f, u32::MAX);
            assert_eq!(r.violation.is_some(), over, "{len}");
            assert_eq!(r.forward, if over { 0 } else { f.len() });
        }
        // Fragments count together.
        let mut s = Scanner::new(true, 100);
        let mut f = frame(0x02, &[0; 60], K);
        let first = f.len();
        f.extend(frame(0x80, &[0; 41], K));
        let r = s.scan(&f, u32::MAX);
        assert_eq!(r.violation, Some(Violation::TooBig));
        assert_eq!(r.forward, first);
        assert_eq!(Violation::TooBig.close().0, 1009);
    }

    #[test]
    fn what_the_protocol_forbids_is_refused() {
        let bad: [(Vec<u8>, bool); 9] = [
            (frame(0x81, b"x", None), true),   // unmasked from a client
            (frame(0x81, b"x", K), false),     // masked from a server
            (frame(0xA1, b"x", K), true),      // RSV2
            (frame(0x83, b"x", K), true),      // reserved opcode
            (frame(0x09, b"x", K), true),      // fragmented ping
            (frame(0x89, &[0; 126], K), true), // ping over 125 bytes
            (frame(0x80, b"x", K), true),      // continuation of nothing
            (frame(0xC9, b"x", K), true),      // RSV1 on a ping
            (frame(0xC8, &[3, 232], K), true), // RSV1 on a close
        ];
        for (i, (f, masked)) in bad.iter().enumerate() {
            let r = Scanner::new(*masked, 1 << 20).scan(f, u32::MAX);
            assert!(
                matches!(r.violation, Some(Violation::Protocol(_))),
                "case {i}: {r:?}"
            );
            assert_eq!(r.forward, 0, "case {i}");
        }
        // RSV1 (permessage-deflate) passes; a new message inside an open one does not.
        let mut s = Scanner::new(true, 1 << 20);
        assert_eq!(s.scan(&frame(0xC1, b"x", K), u32::MAX).violation, None);
        // ... on a message's first frame only.
        let mut f = frame(0x41, b"a", K);
        f.extend(frame(0xC0, b"b", K));
        assert!(matches!(
            Scanner::new(true, 1 << 20).scan(&f, u32::MAX).violation,
            Some(Violation::Protocol(_))
        ));
        let mut f = frame(0x01, b"a", K);
        f.extend(frame(0x81, b"b", K));
        assert!(matches!(
            Scanner::new(true, 1 << 20).scan(&f, u32::MAX).violation,
            Some(Violation::Protocol(_))
        ));
    }

    #[test]
    fn a_close_frames_code_is_read_through_the_mask_and_any_split() {
        let mut payload = 1000u16.to_be_bytes().to_vec();
        payload.extend_from_slice(b"bye");
        let f = frame(0x88, &payload, K);
        for split in 0..=f.len() {
            let mut s = Scanner::new(true, 100);
            let a = s.scan(&f[..split], u32::MAX);
            s.scan(&f[a.forward..], u32::MAX);
            assert_eq!(s.close_code, Some(1000), "split {split}");
        }
        let mut s = Scanner::new(false, 100);
        s.scan(&frame(0x88, &[], None), u32::MAX);
        assert_eq!(s.close_code, Some(code::NO_STATUS));
    }

    #[test]
    fn the_relays_own_close_frames_read_back() {
        for mask in [None, K] {
            let f = close_frame(1009, &"é".repeat(100), mask);
            assert!(f.len() <= 2 + 4 + 125);
            let mut s = Scanner::new(mask.is_some(), 100);
            let r = s.scan(&f, u32::MAX);
            assert_eq!((r.forward, r.violation), (f.len(), None));
            assert_eq!(s.close_code, Some(1009));
        }
    }
}
