//! The compressed body: the codecs of `compression-codecs` over a [`ResponseBody`].

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use compression_codecs::core::Level;
use compression_codecs::core::util::{PartialBuffer, WriteBuffer};
use compression_codecs::zstd::params::CParameter;
use compression_codecs::{BrotliEncoder, EncodeV2, GzipEncoder, ZstdEncoder};
use http::HeaderMap;
use http_body::{Body, Frame};

use super::encoding::Encoding;
use crate::body::{BodyCut, ResponseBody, Transformed};

/// The most input compressed in one poll (a large body is compressed in pieces, so the worker
/// serves other requests between them), and the largest body known whole that is compressed
/// at once (and sent with its compressed length).
pub const PIECE: usize = 64 * 1024;

/// The window of Brotli and zstd, as a power of two (512 KiB): what one compressed stream
/// holds in memory is bounded by it (their defaults, 4 and 2 MiB, only help bodies larger than
/// the window).
const WINDOW_LOG: u32 = 19;

/// Compression levels.
#[derive(Debug, Clone, Copy)]
pub struct Levels {
    /// gzip level.
    pub gzip: u32,
    /// Brotli quality.
    pub brotli: u32,
    /// zstd level.
    pub zstd: u32,
}

/// A codec for `encoding` at `levels`; `size`: the whole input's length, when known.
fn encoder(encoding: Encoding, levels: Levels, size: Option<usize>) -> Box<dyn Codec> {
    let level = |l: u32| Level::Precise(i32::try_from(l).unwrap_or(i32::MAX));
    match encoding {
        Encoding::Gzip => Box::new(GzipEncoder::new(level(levels.gzip).into())),
        Encoding::Br => {
            let mut params = compression_codecs::brotli::params::EncoderParams::default()
                .quality(level(levels.brotli))
                .window_size(WINDOW_LOG as i32);
            if let Some(size) = size {
                params = params.size_hint(size);
            }
            Box::new(BrotliEncoder::new(params))
        }
        Encoding::Zstd => Box::new(ZstdEncoder::new_with_params(
            i32::try_from(levels.zstd).unwrap_or(3),
            &[CParameter::window_log(WINDOW_LOG)],
        )),
    }
}

/// `tern_compression_bytes_total` of one tenant (counted per thread: every compressed answer
/// adds to both).
#[derive(Debug, Clone)]
pub struct Counted {
    /// Bytes before compression.
    pub plain: crate::counter::Counter,
    /// Bytes after.
    pub sent: crate::counter::Counter,
}

/// A codec that may move between threads.
trait Codec: EncodeV2 + Send {}
impl<T: EncodeV2 + Send> Codec for T {}

/// What [`pump`] asks of a codec.
#[derive(Clone, Copy)]
enum Step {
    /// Take the input.
    Encode,
    /// Write out what it holds, so the client can decode everything given so far.
    Flush,
    /// Write out the rest and the end of the stream.
    Finish,
}

/// Runs `step` of `codec` over `input` (for `Encode`), appending its output to `out`.
fn pump(codec: &mut dyn Codec, input: &[u8], out: &mut BytesMut, step: Step) -> io::Result<()> {
    let mut input = PartialBuffer::new(input);
    loop {
        if out.capacity() - out.len() < 1024 {
            out.reserve(out.len().clamp(4096, PIECE));
        }
        let start = out.len();
        out.resize(out.capacity(), 0);
        let mut w = WriteBuffer::new_initialized(&mut out[start..]);
        let done = match step {
            Step::Encode => {
                codec.encode(&mut input, &mut w)?;
                input.unwritten().is_empty()
            }
            Step::Flush => codec.flush(&mut w)?,
            Step::Finish => codec.finish(&mut w)?,
        };
        let written = w.written_len();
        out.truncate(start + written);
        if done {
            return Ok(());
        }
    }
}

/// `plain` compressed with `encoding` at `levels`, at once.
///
/// # Errors
/// The codec's.
pub fn whole(plain: &[u8], encoding: Encoding, levels: Levels) -> io::Result<Bytes> {
    let mut codec = encoder(encoding, levels, Some(plain.len()));
    let mut out = BytesMut::with_capacity(plain.len() / 2 + 64);
    pump(&mut *codec, plain, &mut out, Step::Encode)?;
    pump(&mut *codec, &[], &mut out, Step::Finish)?;
    Ok(out.freeze())
}

/// `plain` compressed with `encoding`, its bytes counted in `counted` (a streamed body's as
/// they go): a body known whole and at most [`PIECE`] long at once
/// (`Full`, its length known), any other as it streams ([`Encoded`]). `Err` gives `plain`
/// back if the codec failed.
pub fn encode(
    plain: ResponseBody,
    encoding: Encoding,
    levels: Levels,
    counted: &Counted,
) -> Result<ResponseBody, ResponseBody> {
    match plain {
        ResponseBody::Full(Some(bytes)) if bytes.len() <= PIECE => {
            match whole(&bytes, encoding, levels) {
                Ok(out) => {
                    counted.plain.inc_by(bytes.len() as u64);
                    counted.sent.inc_by(out.len() as u64);
                    Ok(ResponseBody::Full(Some(out)))
                }
                Err(_) => Err(ResponseBody::Full(Some(bytes))),
            }
        }
        plain => {
            let size = match &plain {
                ResponseBody::Full(Some(b)) => Some(b.len()),
                _ => None,
            };
            Ok(ResponseBody::Transformed(Transformed::new(Encoded {
                plain,
                codec: encoder(encoding, levels, size),
                input: Bytes::new(),
                unflushed: false,
                trailers: None,
                state: State::Open,
                counted: counted.clone(),
            })))
        }
    }
}

/// A body compressed as it streams.
pub struct Encoded {
    plain: ResponseBody,
    codec: Box<dyn Codec>,
    /// Input taken from `plain`, not yet compressed.
    input: Bytes,
    /// Input was compressed since the last flush.
    unflushed: bool,
    /// The plain body's trailers, sent after the compressed stream's end.
    trailers: Option<HeaderMap>,
    state: State,
    counted: Counted,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Taking the plain body.
    Open,
    /// The plain body ended: the codec's end is next.
    Finishing,
    /// The trailers are next.
    Trailers,
    /// Ended.
    Done,
}

debug_fields!(Encoded: plain, state);

impl Body for Encoded {
    type Data = Bytes;
    type Error = BodyCut;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> crate::body::Framed<BodyCut> {
        self.get_mut().next(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.state == State::Done
    }
}

impl Encoded {
    /// The next frame of the compressed body.
    fn next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyCut>>> {
        loop {
            match self.state {
                State::Done => return Poll::Ready(None),
                State::Trailers => {
                    self.state = State::Done;
                    return Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))));
                }
                State::Finishing => {
                    self.state = if self.trailers.is_some() {
                        State::Trailers
                    } else {
                        State::Done
                    };
                    match self.run(&[], Step::Finish) {
                        Some(done) => return Poll::Ready(Some(done)),
                        None => continue,
                    }
                }
                State::Open => {}
            }
            if !self.input.is_empty() {
                let piece = self.input.split_to(self.input.len().min(PIECE));
                self.counted.plain.inc_by(piece.len() as u64);
                self.unflushed = true;
                match self.run(&piece, Step::Encode) {
                    Some(done) => return Poll::Ready(Some(done)),
                    None => continue,
                }
            }
            match Pin::new(&mut self.plain).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => self.input = data,
                    Err(frame) => {
                        self.trailers = frame.into_trailers().ok();
                        self.state = State::Finishing;
                    }
                },
                Poll::Ready(Some(Err(e))) => {
                    self.state = State::Done;
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(None) => self.state = State::Finishing,
                Poll::Pending => {
                    // Nothing more for now: what was compressed goes to the client.
                    if std::mem::take(&mut self.unflushed)
                        && let Some(done) = self.run(&[], Step::Flush)
                    {
                        return Poll::Ready(Some(done));
                    }
                    return Poll::Pending;
                }
            }
        }
    }

    /// Runs `step`: the frame of what it wrote, `None` if it wrote nothing, or the error that
    /// ends the body.
    fn run(&mut self, input: &[u8], step: Step) -> Option<Result<Frame<Bytes>, BodyCut>> {
        let mut out = BytesMut::new();
        match pump(&mut *self.codec, input, &mut out, step) {
            Ok(()) => (!out.is_empty()).then(|| {
                self.counted.sent.inc_by(out.len() as u64);
                Ok(Frame::data(out.freeze()))
            }),
            Err(e) => {
                self.state = State::Done;
                Some(Err(BodyCut::Compress(e.to_string())))
            }
        }
    }
}
