//! Relays one WebSocket connection between a client and a backend: each side's bytes go to
//! the other as they came, frame heads read on the way ([`super::frame`]); the limits and
//! shutdown end it with a close frame of the relay's own, put between two frames.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::frame::{Scanner, Violation, close_frame, code};

/// Bytes each way held at once: small, since an idle connection keeps them (a frame larger
/// than this passes in pieces).
const BUFFER: usize = 8 * 1024;

/// How long the relay waits for the two sides to close their connections once the close
/// handshake is done or the relay has sent its own close frames.
const CLOSING: Duration = Duration::from_secs(2);

/// A connection's limits (`[tenant.websocket]`).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// No bytes either way for this long ends it (`1001`).
    pub idle: Duration,
    /// It ends this long after it opened (`1001`).
    pub lifetime: Duration,
    /// Largest message either way (`1009`).
    pub max_message: u64,
    /// Frames the client may send in one second (`1008`).
    pub frames_per_second: u32,
}

impl Limits {
    /// The limits of `[tenant.websocket]`.
    pub fn of(ws: &super::WebsocketConfig) -> Self {
        Self {
            idle: Duration::from_millis(ws.idle_timeout_ms),
            lifetime: Duration::from_millis(ws.max_lifetime_ms),
            max_message: ws.max_message_bytes,
            frames_per_second: ws.max_frames_per_second,
        }
    }
}

/// What one connection did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Ended {
    /// The first close code sent, by either side or the relay ([`code::ABNORMAL`] when the
    /// connection ended with none).
    pub code: u16,
    /// Bytes from the client and to it.
    pub bytes_in: u64,
    /// Bytes to the client.
    pub bytes_out: u64,
}

/// Counters a relay adds to as it goes (the tenant's series).
pub struct Counts {
    /// Messages from the client, and to it.
    pub messages: [prometheus::IntCounter; 2],
    /// Bytes from the client, and to it.
    pub bytes: [prometheus::IntCounter; 2],
}

impl Counts {
    /// The series of the tenant labelled `label`.
    pub fn of(m: &crate::metrics::Metrics, label: &str) -> Self {
        Self {
            messages: ["in", "out"].map(|d| m.websocket_messages.with_label_values(&[label, d])),
            bytes: ["in", "out"].map(|d| m.websocket_bytes.with_label_values(&[label, d])),
        }
    }
}

/// One direction: what is read from one side and written to the other.
struct Way {
    buf: Box<[u8]>,
    /// Bytes of `buf` not yet written: `start..end`, of which the first `ready` may be
    /// written (read through by the scanner); the rest is a frame head not yet whole.
    start: usize,
    end: usize,
    ready: usize,
    scanner: Scanner,
    /// A close frame of the relay's own to write once `ready` is written.
    inject: Vec<u8>,
    /// No more frames are forwarded this way (the relay is closing it).
    stopped: bool,
    /// The reading side ended (EOF or an error).
    read_done: bool,
    /// The writing side was shut down.
    write_done: bool,
    /// Bytes written.
    written: u64,
    /// Frames this way may carry in a second (the client's way), this second's start and
    /// count.
    rate: Option<(u32, Instant, u32)>,
    /// The close frame sent on when the reading side ends without one of its own.
    on_eof: Vec<u8>,
}

impl Way {
    fn new(masked: bool, max_message: u64, rate: Option<u32>, on_eof: Vec<u8>) -> Self {
        Self {
            rate: rate.map(|max| (max, Instant::now(), 0)),
            on_eof,
            buf: vec![0; BUFFER].into_boxed_slice(),
            start: 0,
            end: 0,
            ready: 0,
            scanner: Scanner::new(masked, max_message),
            inject: Vec::new(),
            stopped: false,
            read_done: false,
            write_done: false,
            written: 0,
        }
    }

    /// Stops forwarding this way: what was read through is still written, then `close` if
    /// the stream is between two frames there, then the writing side is shut down.
    fn stop(&mut self, close: Option<Vec<u8>>) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        // What was read but not read through (a head not yet whole, a refused frame) is
        // dropped.
        self.end = self.start + self.ready;
        if self.scanner.at_boundary()
            && let Some(frame) = close
        {
            self.inject = frame;
        }
    }

    /// Moves bytes from `from` to `to` until one of them is not ready. Returns what was
    /// read (for the idle timer, the counts and the limits).
    fn poll<R, W>(&mut self, cx: &mut Context<'_>, from: &mut R, to: &mut W) -> Poll<Moved>
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        let mut moved = Moved::default();
        loop {
            while self.ready > 0 && !self.write_done {
                let chunk = &self.buf[self.start..self.start + self.ready];
                match Pin::new(&mut *to).poll_write(cx, chunk) {
                    Poll::Pending => return pending_or(moved),
                    Poll::Ready(Ok(n)) if n > 0 => {
                        self.start += n;
                        self.ready -= n;
                        self.written += n as u64;
                    }
                    // The other side is gone: nothing more goes this way.
                    // (What is held is dropped, so the buffer has room to read and drop what
                    // still comes.)
                    Poll::Ready(_) => {
                        self.write_done = true;
                        self.stopped = true;
                        (self.start, self.end, self.ready) = (0, 0, 0);
                    }
                }
            }
            while !self.inject.is_empty() && !self.write_done {
                match Pin::new(&mut *to).poll_write(cx, &self.inject) {
                    Poll::Pending => return pending_or(moved),
                    Poll::Ready(Ok(n)) if n > 0 => {
                        self.inject.drain(..n);
                    }
                    Poll::Ready(_) => self.write_done = true,
                }
            }
            if (self.stopped || self.read_done) && !self.write_done {
                // (An error shutting down is the other side gone: done all the same.)
                if Pin::new(&mut *to).poll_shutdown(cx).is_pending() {
                    return pending_or(moved);
                }
                self.write_done = true;
            }
            if self.read_done {
                return pending_or(moved);
            }
            if self.start == self.end {
                self.start = 0;
                self.end = 0;
            } else if self.end == self.buf.len() {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            }
            let mut rb = ReadBuf::new(&mut self.buf[self.end..]);
            match Pin::new(&mut *from).poll_read(cx, &mut rb) {
                Poll::Pending => return pending_or(moved),
                Poll::Ready(Ok(())) if !rb.filled().is_empty() => {
                    let n = rb.filled().len();
                    moved.read += n as u64;
                    if self.stopped {
                        // Closing: what comes now is read and dropped.
                        continue;
                    }
                    let unscanned = self.start + self.ready;
                    self.end += n;
                    let left = match &mut self.rate {
                        Some((max, since, count)) => {
                            let now = Instant::now();
                            if now.duration_since(*since) >= Duration::from_secs(1) {
                                (*since, *count) = (now, 0);
                            }
                            *max - *count
                        }
                        None => u32::MAX,
                    };
                    let s = self.scanner.scan(&self.buf[unscanned..self.end], left);
                    if let Some((_, _, count)) = &mut self.rate {
                        *count += s.frames;
                    }
                    self.ready += s.forward;
                    moved.frames += s.frames;
                    moved.messages += s.messages;
                    if s.violation.is_some() {
                        moved.violation = s.violation;
                        return Poll::Ready(moved);
                    }
                }
                Poll::Ready(_) => {
                    self.read_done = true;
                    // The side went away without a close frame: the other is told so, if
                    // the stream is between two frames.
                    if !self.stopped
                        && self.scanner.close_code.is_none()
                        && self.scanner.at_boundary()
                    {
                        self.end = self.start + self.ready;
                        self.inject = std::mem::take(&mut self.on_eof);
                    }
                }
            }
        }
    }
}

/// `Ready` with what moved when something did, else `Pending`.
fn pending_or(moved: Moved) -> Poll<Moved> {
    if moved == Moved::default() {
        Poll::Pending
    } else {
        Poll::Ready(moved)
    }
}

/// What one poll of a way read.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Moved {
    read: u64,
    frames: u32,
    messages: u32,
    violation: Option<Violation>,
}

/// Relays between `client` and `backend` until both are closed, within `limits`; `shutdown`
/// closes it (`1001`) when it fires.
pub async fn relay<C, B>(
    mut client: C,
    mut backend: B,
    limits: Limits,
    counts: &Counts,
    shutdown: impl Future<Output = ()>,
) -> Ended
where
    C: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    // To the backend: the client's frames (masked); to the client: the backend's.
    let mut up = Way::new(
        true,
        limits.max_message,
        Some(limits.frames_per_second),
        close_frame(code::GOING_AWAY, "the client went away", Some(mask())),
    );
    let mut down = Way::new(
        false,
        limits.max_message,
        None,
        close_frame(code::INTERNAL, "the backend went away", None),
    );
    let idle = tokio::time::sleep(limits.idle);
    let lifetime = tokio::time::sleep(limits.lifetime);
    tokio::pin!(idle, lifetime, shutdown);
    // Set once the relay is closing: how long the two sides have left to close.
    let mut closing: Option<Pin<Box<tokio::time::Sleep>>> = None;
    let mut first_close: Option<u16> = None;
    let mut shut_down = false;
    // When either side last sent a byte: the idle timer is moved on when it fires, not at
    // every read (a timer reset per read is work on the reactor for every frame).
    let mut last_read = tokio::time::Instant::now();
    std::future::poll_fn(|cx| {
        loop {
            // The close the client is sent, and the one the backend is (if not the same).
            let mut stop: Option<(u16, &'static str)> = None;
            let mut to_backend: Option<(u16, &'static str)> = None;
            let mut progressed = false;
            if let Poll::Ready(m) = up.poll(cx, &mut client, &mut backend) {
                progressed = true;
                account(counts, 0, &m, &mut last_read);
                match m.violation {
                    // A frame the protocol forbids from the client: the backend is told, as
                    // by a close of the client's own, and nothing more of the client's goes
                    // to it; what the backend still sends (its answers to what came before,
                    // its close) goes to the client.
                    Some(v @ Violation::Protocol(_)) => {
                        let (code, why) = v.close();
                        first_close.get_or_insert(code);
                        up.stop(Some(close_frame(code, why, Some(mask()))));
                    }
                    Some(v) => stop = Some(v.close()),
                    None => {}
                }
            }
            if let Poll::Ready(m) = down.poll(cx, &mut backend, &mut client) {
                progressed = true;
                account(counts, 1, &m, &mut last_read);
                match m.violation {
                    // A message too big either way: both are told so.
                    Some(v @ Violation::TooBig) => stop = Some(v.close()),
                    // A frame the protocol forbids from the backend: the client is told the
                    // server failed, the backend why.
                    Some(v) => {
                        stop = Some((code::INTERNAL, "the backend failed"));
                        to_backend = Some(v.close());
                    }
                    None => {}
                }
            }
            if first_close.is_none() {
                first_close = up.scanner.close_code.or(down.scanner.close_code);
            }
            if stop.is_none() && !up.stopped && !down.stopped && first_close.is_none() {
                let idle_over = idle.as_mut().poll(cx).is_ready() && {
                    let due = last_read + limits.idle;
                    let read_since = due > tokio::time::Instant::now();
                    if read_since {
                        idle.as_mut().reset(due);
                        // (Polled again so that it wakes this task at its new deadline.)
                        let _ = idle.as_mut().poll(cx);
                    }
                    !read_since
                };
                if idle_over {
                    stop = Some((code::GOING_AWAY, "idle"));
                } else if lifetime.as_mut().poll(cx).is_ready() {
                    stop = Some((code::GOING_AWAY, "connection lifetime over"));
                } else if !shut_down && shutdown.as_mut().poll(cx).is_ready() {
                    shut_down = true;
                    stop = Some((code::GOING_AWAY, "server shutting down"));
                }
            }
            if let Some((code, reason)) = stop {
                let (backend_code, backend_reason) = to_backend.unwrap_or((code, reason));
                // (What the client was told is what is counted.)
                first_close.get_or_insert(code);
                up.stop(Some(close_frame(
                    backend_code,
                    backend_reason,
                    Some(mask()),
                )));
                down.stop(Some(close_frame(code, reason, None)));
                progressed = true;
            }
            // Once either side has sent its close frame, the other has CLOSING to answer it
            // and both to end their connections.
            let close_sent = up.scanner.close_code.is_some() || down.scanner.close_code.is_some();
            if closing.is_none() && (up.stopped || down.stopped || close_sent) {
                closing = Some(Box::pin(tokio::time::sleep(CLOSING)));
            }
            let done = up.read_done && up.write_done && down.read_done && down.write_done;
            if done
                || closing
                    .as_mut()
                    .is_some_and(|c| c.as_mut().poll(cx).is_ready())
            {
                return Poll::Ready(());
            }
            if !progressed {
                return Poll::Pending;
            }
        }
    })
    .await;
    Ended {
        code: first_close.unwrap_or(code::ABNORMAL),
        bytes_in: up.written,
        bytes_out: down.written,
    }
}

/// Counts what one way moved (`i`: 0 from the client, 1 to it), and when it last read.
fn account(counts: &Counts, i: usize, m: &Moved, last_read: &mut tokio::time::Instant) {
    counts.messages[i].inc_by(m.messages.into());
    counts.bytes[i].inc_by(m.read);
    if m.read > 0 {
        *last_read = tokio::time::Instant::now();
    }
}

/// A mask for a frame of the relay's own to a backend (RFC 6455 §5.3: masked, as a client's).
fn mask() -> [u8; 4] {
    (crate::random_u64() as u32).to_ne_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream, duplex};

    fn counts() -> Counts {
        let c = || prometheus::IntCounter::new("c", "c").unwrap();
        Counts {
            messages: [c(), c()],
            bytes: [c(), c()],
        }
    }

    fn limits() -> Limits {
        Limits {
            idle: Duration::from_secs(30),
            lifetime: Duration::from_secs(60),
            max_message: 100,
            frames_per_second: 1000,
        }
    }

    fn masked_text(payload: &[u8]) -> Vec<u8> {
        let k = [9, 8, 7, 6];
        let mut f = vec![0x81, 0x80 | payload.len() as u8];
        f.extend_from_slice(&k);
        f.extend(payload.iter().enumerate().map(|(i, b)| b ^ k[i % 4]));
        f
    }

    /// Reads one frame head and payload (short frames only).
    async fn read_frame(s: &mut DuplexStream) -> (u8, Vec<u8>) {
        let mut h = [0u8; 2];
        s.read_exact(&mut h).await.unwrap();
        let masked = h[1] & 0x80 != 0;
        let len = usize::from(h[1] & 0x7F);
        let mut k = [0u8; 4];
        if masked {
            s.read_exact(&mut k).await.unwrap();
        }
        let mut p = vec![0u8; len];
        s.read_exact(&mut p).await.unwrap();
        if masked {
            p.iter_mut().enumerate().for_each(|(i, b)| *b ^= k[i % 4]);
        }
        (h[0], p)
    }

    struct Ends {
        client: DuplexStream,
        backend: DuplexStream,
        relay: tokio::task::JoinHandle<Ended>,
        stop: tokio::sync::oneshot::Sender<()>,
    }

    fn start(limits: Limits) -> Ends {
        let (client, client_side) = duplex(64 * 1024);
        let (backend, backend_side) = duplex(64 * 1024);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let relay = tokio::spawn(async move {
            let c = counts();
            relay(client_side, backend_side, limits, &c, async {
                let _ = stopped.await;
            })
            .await
        });
        Ends {
            client,
            backend,
            relay,
            stop,
        }
    }

    #[tokio::test]
    async fn frames_pass_both_ways_as_they_came_and_a_close_ends_it() {
        let mut e = start(limits());
        let f = masked_text(b"hello");
        e.client.write_all(&f).await.unwrap();
        let mut got = vec![0u8; f.len()];
        e.backend.read_exact(&mut got).await.unwrap();
        assert_eq!(got, f, "the same bytes, mask and all");
        e.backend.write_all(&[0x81, 2, b'h', b'i']).await.unwrap();
        assert_eq!(read_frame(&mut e.client).await, (0x81, b"hi".to_vec()));
        // The client closes; the backend answers and ends the connection.
        let close = close_frame(1000, "bye", Some([1, 2, 3, 4]));
        e.client.write_all(&close).await.unwrap();
        let (op, p) = read_frame(&mut e.backend).await;
        assert_eq!((op, &p[..2]), (0x88, &1000u16.to_be_bytes()[..]));
        e.backend
            .write_all(&close_frame(1000, "", None))
            .await
            .unwrap();
        e.backend.shutdown().await.unwrap();
        drop(e.backend);
        assert_eq!(read_frame(&mut e.client).await.0, 0x88);
        e.client.shutdown().await.unwrap();
        let ended = e.relay.await.unwrap();
        assert_eq!(ended.code, 1000);
        assert_eq!(ended.bytes_in, (f.len() + close.len()) as u64);
    }

    /// A frame the protocol forbids from the client: the backend gets a close (`1002`) in its
    /// place, and what the backend sends after it (its answer to what came before, its close)
    /// still reaches the client.
    #[tokio::test]
    async fn a_clients_protocol_error_goes_to_the_backend_whose_answers_still_reach_the_client() {
        let mut e = start(limits());
        let hello = masked_text(b"hello");
        let mut bad = masked_text(b"x");
        bad[0] = 0x83; // a reserved opcode
        e.client
            .write_all(&[hello.clone(), bad].concat())
            .await
            .unwrap();
        let mut got = vec![0u8; hello.len()];
        e.backend.read_exact(&mut got).await.unwrap();
        assert_eq!(got, hello);
        let (op, p) = read_frame(&mut e.backend).await;
        assert_eq!((op, &p[..2]), (0x88, &1002u16.to_be_bytes()[..]));
        e.backend
            .write_all(&[0x81, 5, b'h', b'e', b'l', b'l', b'o'])
            .await
            .unwrap();
        e.backend
            .write_all(&close_frame(1002, "", None))
            .await
            .unwrap();
        e.backend.shutdown().await.unwrap();
        assert_eq!(read_frame(&mut e.client).await, (0x81, b"hello".to_vec()));
        let (op, p) = read_frame(&mut e.client).await;
        assert_eq!((op, &p[..2]), (0x88, &1002u16.to_be_bytes()[..]));
        drop(e.backend);
        e.client.shutdown().await.unwrap();
        assert_eq!(e.relay.await.unwrap().code, 1002);
    }

    /// A masked binary frame of any length.
    fn masked_binary(len: usize) -> Vec<u8> {
        let k = [3, 1, 4, 1];
        let mut f = vec![0x82];
        match len {
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
        f.extend((0..len).map(|i| (i % 251) as u8 ^ k[i % 4]));
        f
    }

    #[tokio::test]
    async fn frames_larger_than_the_buffer_and_heads_cut_anywhere_pass_whole() {
        use tokio::io::AsyncReadExt;
        let mut e = start(Limits {
            max_message: 1 << 20,
            frames_per_second: 100_000,
            ..limits()
        });
        // A 70,000-byte frame, then 2,000 7-byte frames, sent in odd-sized pieces.
        let mut stream = masked_binary(70_000);
        for _ in 0..2_000 {
            stream.extend(masked_text(b"x"));
        }
        let expected = stream.clone();
        let writer = tokio::spawn(async move {
            for piece in stream.chunks(1_237) {
                e.client.write_all(piece).await.unwrap();
            }
            e.client
        });
        let mut got = vec![0u8; expected.len()];
        e.backend.read_exact(&mut got).await.unwrap();
        assert!(got == expected, "the same bytes in the same order");
        drop(writer.await.unwrap());
        drop(e.backend);
        drop(e.stop);
        assert_eq!(e.relay.await.unwrap().bytes_in, expected.len() as u64);
    }

    #[tokio::test]
    async fn traffic_keeps_a_connection_past_its_idle_time_and_silence_ends_it() {
        let mut e = start(Limits {
            idle: Duration::from_millis(300),
            ..limits()
        });
        // Ten frames 40 ms apart: 400 ms, past the idle time, open all along (a close would
        // come to the backend instead of a frame).
        for _ in 0..10 {
            e.client.write_all(&masked_text(b"x")).await.unwrap();
            assert_eq!(read_frame(&mut e.backend).await.0, 0x81);
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
        let (op, p) = read_frame(&mut e.client).await;
        assert_eq!((op, &p[2..]), (0x88, &b"idle"[..]));
        drop((e.client, e.backend, e.stop));
        assert_eq!(e.relay.await.unwrap().code, 1001);
    }

    #[tokio::test]
    async fn a_backend_gone_without_a_close_is_told_to_the_client_with_1011() {
        let mut e = start(limits());
        e.backend.shutdown().await.unwrap();
        drop(e.backend);
        let (op, p) = read_frame(&mut e.client).await;
        assert_eq!((op, &p[..2]), (0x88, &1011u16.to_be_bytes()[..]));
        drop((e.client, e.stop));
        e.relay.await.unwrap();
    }

    #[tokio::test]
    async fn a_message_over_the_limit_closes_both_sides_with_1009_and_is_not_forwarded() {
        let mut e = start(limits());
        e.client.write_all(&masked_text(&[1; 100])).await.unwrap();
        let (op, p) = read_frame(&mut e.backend).await;
        assert_eq!((op, p.len()), (0x81, 100), "the limit itself passes");
        e.client.write_all(&masked_text(&[1; 101])).await.unwrap();
        let (op, p) = read_frame(&mut e.client).await;
        assert_eq!((op, &p[..2]), (0x88, &1009u16.to_be_bytes()[..]));
        let (op, p) = read_frame(&mut e.backend).await;
        assert_eq!((op, &p[..2]), (0x88, &1009u16.to_be_bytes()[..]), "masked");
        // Nothing of the refused frame reached the backend: its stream ends after the close.
        let mut rest = Vec::new();
        e.backend.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty(), "{rest:?}");
        drop((e.client, e.backend));
        assert_eq!(e.relay.await.unwrap().code, 1009);
    }

    #[tokio::test]
    async fn shutdown_idle_and_frame_rate_close_with_their_codes() {
        // Shutdown: 1001 to both.
        let mut e = start(limits());
        e.stop.send(()).unwrap();
        let (op, p) = read_frame(&mut e.client).await;
        assert_eq!((op, &p[2..]), (0x88, &b"server shutting down"[..]));
        assert_eq!(read_frame(&mut e.backend).await.0, 0x88);
        drop((e.client, e.backend));
        assert_eq!(e.relay.await.unwrap().code, 1001);

        // Idle: nothing either way for 50 ms.
        let mut e = start(Limits {
            idle: Duration::from_millis(50),
            ..limits()
        });
        let (op, p) = read_frame(&mut e.client).await;
        assert_eq!((op, &p[2..]), (0x88, &b"idle"[..]));
        drop((e.client, e.backend, e.stop));
        assert_eq!(e.relay.await.unwrap().code, 1001);

        // Frames past the rate: limit frames pass, one more closes with 1008.
        let mut e = start(Limits {
            frames_per_second: 3,
            ..limits()
        });
        let mut three = Vec::new();
        for _ in 0..3 {
            three.extend(masked_text(b"x"));
        }
        e.client.write_all(&three).await.unwrap();
        for _ in 0..3 {
            assert_eq!(read_frame(&mut e.backend).await.0, 0x81);
        }
        e.client.write_all(&masked_text(b"x")).await.unwrap();
        let (op, p) = read_frame(&mut e.client).await;
        assert_eq!((op, &p[..2]), (0x88, &1008u16.to_be_bytes()[..]));
        // The frame past the limit never reached the backend: its close comes next.
        let (op, p) = read_frame(&mut e.backend).await;
        assert_eq!((op, &p[..2]), (0x88, &1008u16.to_be_bytes()[..]));
        drop((e.client, e.backend, e.stop));
        assert_eq!(e.relay.await.unwrap().code, 1008);
    }
}
