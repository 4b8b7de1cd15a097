//! HTTP/3's streams as `h3` reads them, bounded: a frame the crate would buffer whole is
//! refused at its header when it declares more than the head limit, an unknown (reserved)
//! frame is skipped as its bytes come, and stopping a stream never panics.
//!
//! `h3` 0.0.8 decodes every frame but DATA only once all of it has arrived, and ignores an
//! unknown one only then: a reserved frame declaring 1 GiB on the control stream, or a HEADERS
//! frame declaring as much on a request stream, held everything the client sent of it in
//! memory (RFC 9114 §7.2.8 says unknown frames are ignored; §4.2.2 bounds a head). And
//! `h3-quinn` 0.0.10 moves the QUIC stream into a read while it waits, so its `stop_sending`
//! panicked (`unwrap` on the missing stream) when a client's upload raced its answer.
//!
//! So the listener hands `h3` this connection: the `h3-quinn` one, whose received streams pass
//! through [`Framed`], which reads the frame headers itself (zero-copy when a header lies
//! within one chunk, as it almost always does) and passes on only what `h3` should see.

use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use h3::quic::RecvStream as _;
use h3::quic::{self, ConnectionErrorIncoming, StreamErrorIncoming, StreamId, WriteBuf};

/// `H3_EXCESSIVE_LOAD` (RFC 9114 §8.1): a stream stopped for a frame over the limit.
const H3_EXCESSIVE_LOAD: u64 = 0x107;

/// The frame types `h3` reads whole (RFC 9114 §7.2; HTTP/2's, which it refuses), held to the
/// limit; DATA is read as it comes, and every other type is skipped.
const BOUNDED: [u64; 10] = [0x1, 0x2, 0x3, 0x4, 0x5, 0x6, 0x7, 0x8, 0x9, 0xd];
const DATA: u64 = 0x0;
/// A WebTransport stream's first frame (no length follows): not served.
const WEBTRANSPORT_STREAM: u64 = 0x41;

/// An `h3-quinn` connection (`C`: the connection, or the opener of its streams) whose
/// received streams are [`Framed`].
pub struct Guarded<C = h3_quinn::Connection> {
    inner: C,
    /// The largest frame `h3` may buffer (`server.max_header_bytes`).
    limit: u64,
}

impl Guarded {
    /// `quic`, with frames `h3` buffers held to `limit` bytes.
    pub fn new(quic: quinn::Connection, limit: u64) -> Self {
        Self {
            inner: h3_quinn::Connection::new(quic),
            limit,
        }
    }
}

/// A request stream: `h3-quinn`'s sending side, and its receiving side [`Framed`].
pub struct Bidi<B: Buf> {
    send: h3_quinn::SendStream<B>,
    recv: Framed,
}

fn bidi<B: Buf>(stream: h3_quinn::BidiStream<B>, limit: u64) -> Bidi<B> {
    let (send, recv) = quic::BidiStream::split(stream);
    Bidi {
        send,
        recv: Framed::new(recv, true, limit),
    }
}

impl<B: Buf> quic::Connection<B> for Guarded {
    type RecvStream = Framed;
    type OpenStreams = Guarded<h3_quinn::OpenStreams>;

    fn poll_accept_recv(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Framed, ConnectionErrorIncoming>> {
        let polled =
            <h3_quinn::Connection as quic::Connection<B>>::poll_accept_recv(&mut self.inner, cx);
        polled.map_ok(|recv| Framed::new(recv, false, self.limit))
    }

    fn poll_accept_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Bidi<B>, ConnectionErrorIncoming>> {
        let polled =
            <h3_quinn::Connection as quic::Connection<B>>::poll_accept_bidi(&mut self.inner, cx);
        polled.map_ok(|stream| bidi(stream, self.limit))
    }

    fn opener(&self) -> Guarded<h3_quinn::OpenStreams> {
        Guarded {
            inner: <h3_quinn::Connection as quic::Connection<B>>::opener(&self.inner),
            limit: self.limit,
        }
    }
}

/// Streams the server opens (its control and QPACK streams) as `h3-quinn` opens them.
impl<B, C> quic::OpenStreams<B> for Guarded<C>
where
    B: Buf,
    C: quic::OpenStreams<
            B,
            BidiStream = h3_quinn::BidiStream<B>,
            SendStream = h3_quinn::SendStream<B>,
        >,
{
    type BidiStream = Bidi<B>;
    type SendStream = h3_quinn::SendStream<B>;

    fn poll_open_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Bidi<B>, StreamErrorIncoming>> {
        let limit = self.limit;
        <C as quic::OpenStreams<B>>::poll_open_bidi(&mut self.inner, cx)
            .map_ok(|stream| bidi(stream, limit))
    }

    fn poll_open_send(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<h3_quinn::SendStream<B>, StreamErrorIncoming>> {
        <C as quic::OpenStreams<B>>::poll_open_send(&mut self.inner, cx)
    }

    fn close(&mut self, code: h3::error::Code, reason: &[u8]) {
        <C as quic::OpenStreams<B>>::close(&mut self.inner, code, reason);
    }
}

impl<B: Buf> quic::BidiStream<B> for Bidi<B> {
    type SendStream = h3_quinn::SendStream<B>;
    type RecvStream = Framed;

    fn split(self) -> (Self::SendStream, Framed) {
        (self.send, self.recv)
    }
}

impl<B: Buf> quic::RecvStream for Bidi<B> {
    type Buf = Bytes;

    fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Bytes>, StreamErrorIncoming>> {
        self.recv.poll_data(cx)
    }

    fn stop_sending(&mut self, error_code: u64) {
        self.recv.stop_sending(error_code);
    }

    fn recv_id(&self) -> StreamId {
        self.recv.recv_id()
    }
}

impl<B: Buf> quic::SendStream<B> for Bidi<B> {
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        self.send.poll_ready(cx)
    }

    fn send_data<T: Into<WriteBuf<B>>>(&mut self, data: T) -> Result<(), StreamErrorIncoming> {
        self.send.send_data(data)
    }

    fn poll_finish(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        self.send.poll_finish(cx)
    }

    fn reset(&mut self, reset_code: u64) {
        self.send.reset(reset_code);
    }

    fn send_id(&self) -> StreamId {
        self.send.send_id()
    }
}

/// Where a received stream's reader is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum At {
    /// A unidirectional stream's type (a variable-length integer) is being read.
    StreamType,
    /// A frame's type and length are being read.
    Head,
    /// This many bytes of a frame's payload go on to `h3`.
    Pass(u64),
    /// This many bytes of an unknown frame's payload are dropped.
    Skip(u64),
    /// Not framed (a QPACK stream, a stream type `h3` handles itself): bytes go on as they are.
    Raw,
    /// Refused: the stream was stopped.
    Refused,
}

/// What comes after a frame header.
enum Next {
    Pass(u64),
    Skip(u64),
    Refuse,
}

/// A received stream (a request's, or a unidirectional one) as `h3` reads it: frames `h3`
/// buffers whole are refused at their header past the limit, unknown frames are skipped as
/// they come, and everything else is passed on untouched.
pub struct Framed {
    /// `None` once dropped while a read waited (see [`Self::stop_sending`]).
    inner: Option<h3_quinn::RecvStream>,
    id: StreamId,
    /// The last read of `inner` waits for the client.
    reading: bool,
    /// Received bytes not yet looked at.
    rest: Bytes,
    at: At,
    /// A frame header (or stream type) split across chunks, gathered here.
    head: [u8; 16],
    head_len: usize,
    limit: u64,
}

impl Framed {
    fn new(inner: h3_quinn::RecvStream, request: bool, limit: u64) -> Self {
        let id = quic::RecvStream::recv_id(&inner);
        Self {
            inner: Some(inner),
            id,
            reading: false,
            rest: Bytes::new(),
            at: if request { At::Head } else { At::StreamType },
            head: [0; 16],
            head_len: 0,
            limit,
        }
    }

    /// What follows a frame of type `ty` declaring `len` bytes.
    fn next(&self, ty: u64, len: u64) -> Next {
        if ty == DATA {
            Next::Pass(len)
        } else if ty == WEBTRANSPORT_STREAM || (BOUNDED.contains(&ty) && len > self.limit) {
            Next::Refuse
        } else if BOUNDED.contains(&ty) {
            Next::Pass(len)
        } else {
            Next::Skip(len)
        }
    }

    fn poll_inner(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Bytes>, StreamErrorIncoming>> {
        let Some(inner) = self.inner.as_mut() else {
            return Poll::Ready(Ok(None));
        };
        let polled = quic::RecvStream::poll_data(inner, cx);
        self.reading = polled.is_pending();
        polled
    }

    /// Stops the stream for a frame over the limit; the error `h3` gets.
    fn refuse(&mut self) -> StreamErrorIncoming {
        self.at = At::Refused;
        self.rest = Bytes::new();
        self.stop_sending(H3_EXCESSIVE_LOAD);
        StreamErrorIncoming::Unknown(
            format!(
                "a frame declaring more than server.max_header_bytes ({} bytes), or a \
                 WebTransport stream",
                self.limit
            )
            .into(),
        )
    }

    /// The frame header at the start of `bytes`: its type, length and size, if all there.
    fn header(bytes: &[u8]) -> Option<(u64, u64, usize)> {
        let (ty, a) = varint(bytes)?;
        let (len, b) = varint(&bytes[a..])?;
        Some((ty, len, a + b))
    }

    fn poll_framed(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Bytes>, StreamErrorIncoming>> {
        loop {
            if self.at == At::Refused {
                return Poll::Ready(Err(StreamErrorIncoming::Unknown(
                    "the stream was refused".into(),
                )));
            }
            if self.rest.is_empty() {
                match std::task::ready!(self.poll_inner(cx))? {
                    Some(chunk) => self.rest = chunk,
                    None => {
                        // A header cut by the stream's end goes on as it is: `h3` sees the
                        // truncated frame.
                        let cut = Bytes::copy_from_slice(&self.head[..self.head_len]);
                        self.head_len = 0;
                        return Poll::Ready(Ok((!cut.is_empty()).then_some(cut)));
                    }
                }
            }
            match self.at {
                At::Refused => {}
                At::Raw => return Poll::Ready(Ok(Some(std::mem::take(&mut self.rest)))),
                At::Pass(n) => {
                    let k = n.min(self.rest.len() as u64);
                    self.at = if k == n { At::Head } else { At::Pass(n - k) };
                    return Poll::Ready(Ok(Some(self.rest.split_to(k as usize))));
                }
                At::Skip(n) => {
                    let k = n.min(self.rest.len() as u64);
                    self.rest.advance(k as usize);
                    self.at = if k == n { At::Head } else { At::Skip(n - k) };
                }
                At::StreamType => {
                    let Some(whole) = self.gather(|b| varint(b).map(|(_, n)| n)) else {
                        continue;
                    };
                    let (ty, _) = varint(&whole).expect("gathered whole");
                    // Only the control stream (0x00) is framed.
                    self.at = if ty == 0 { At::Head } else { At::Raw };
                    return Poll::Ready(Ok(Some(whole)));
                }
                At::Head if self.head_len == 0 => {
                    // The header within this chunk: passed on as a slice of it.
                    let Some((ty, len, size)) = Self::header(&self.rest) else {
                        self.gather(|b| Self::header(b).map(|(_, _, n)| n));
                        continue;
                    };
                    match self.next(ty, len) {
                        Next::Refuse => return Poll::Ready(Err(self.refuse())),
                        Next::Skip(n) => {
                            self.rest.advance(size);
                            self.at = At::Skip(n);
                        }
                        Next::Pass(n) => {
                            let k = n.min((self.rest.len() - size) as u64);
                            self.at = if k == n { At::Head } else { At::Pass(n - k) };
                            return Poll::Ready(Ok(Some(self.rest.split_to(size + k as usize))));
                        }
                    }
                }
                At::Head => {
                    let Some(whole) = self.gather(|b| Self::header(b).map(|(_, _, n)| n)) else {
                        continue;
                    };
                    let (ty, len, _) = Self::header(&whole).expect("gathered whole");
                    match self.next(ty, len) {
                        Next::Refuse => return Poll::Ready(Err(self.refuse())),
                        Next::Skip(n) => self.at = At::Skip(n),
                        Next::Pass(n) => {
                            self.at = if n == 0 { At::Head } else { At::Pass(n) };
                            return Poll::Ready(Ok(Some(whole)));
                        }
                    }
                }
            }
        }
    }

    /// Moves bytes of `rest` into `head` until `size` says how long the item (a stream type or
    /// a frame header) is and all of it is there; then the item, taken out. `None`: `rest` is
    /// used up first.
    fn gather(&mut self, size: impl Fn(&[u8]) -> Option<usize>) -> Option<Bytes> {
        loop {
            if let Some(n) = size(&self.head[..self.head_len]) {
                let whole = Bytes::copy_from_slice(&self.head[..n]);
                self.head_len = 0;
                return Some(whole);
            }
            let (&next, _) = self.rest.split_first()?;
            self.head[self.head_len] = next;
            self.head_len += 1;
            self.rest.advance(1);
        }
    }
}

/// A QUIC variable-length integer at the start of `bytes` (RFC 9000 §16) and its size, if all
/// of it is there.
fn varint(bytes: &[u8]) -> Option<(u64, usize)> {
    let first = *bytes.first()?;
    let size = 1usize << (first >> 6);
    let raw = bytes.get(..size)?;
    let value = raw[1..]
        .iter()
        .fold(u64::from(first & 0x3f), |v, b| (v << 8) | u64::from(*b));
    Some((value, size))
}

impl quic::RecvStream for Framed {
    type Buf = Bytes;

    fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Bytes>, StreamErrorIncoming>> {
        self.poll_framed(cx)
    }

    /// Asks the client to stop sending. `h3-quinn`'s own panics while a read waits (the
    /// stream is inside the read): the read is polled once more, and if it still waits the
    /// stream is dropped with it, which stops it too (quinn sends code 0, which an HTTP/3
    /// client reads as `H3_NO_ERROR`, RFC 9114 §9).
    fn stop_sending(&mut self, error_code: u64) {
        let Some(inner) = self.inner.as_mut() else {
            return;
        };
        if self.reading {
            let mut cx = Context::from_waker(std::task::Waker::noop());
            if quic::RecvStream::poll_data(inner, &mut cx).is_pending() {
                self.inner = None;
                return;
            }
            // Read (and no longer wanted): the stream is back.
            self.reading = false;
        }
        quic::RecvStream::stop_sending(inner, error_code);
    }

    fn recv_id(&self) -> StreamId {
        self.id
    }
}

#[cfg(test)]
mod tests {
    use super::{Framed, varint};

    #[test]
    fn variable_length_integers_and_frame_headers_are_read_whole_or_not_at_all() {
        assert_eq!(varint(&[0x25]), Some((37, 1)));
        assert_eq!(varint(&[0x7b, 0xbd]), Some((15_293, 2)));
        assert_eq!(varint(&[0x9d, 0x7f, 0x3e, 0x7d]), Some((494_878_333, 4)));
        let gib = [0xc0, 0, 0, 0, 0x40, 0, 0, 0];
        assert_eq!(varint(&gib), Some((1 << 30, 8)));
        assert_eq!(varint(&gib[..7]), None);
        assert_eq!(varint(&[]), None);
        // A reserved frame type (0x21) declaring 1 GiB; HEADERS (0x01) declaring 5 bytes.
        let mut reserved = vec![0x21];
        reserved.extend_from_slice(&gib);
        assert_eq!(Framed::header(&reserved), Some((0x21, 1 << 30, 9)));
        assert_eq!(Framed::header(&reserved[..5]), None);
        assert_eq!(Framed::header(&[0x01, 0x05, 0xff]), Some((1, 5, 2)));
        assert_eq!(Framed::header(&[0x01]), None);
    }
}
