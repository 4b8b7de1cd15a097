//! Reading a tenant's ring as a stream: what it has kept (from `since`), then, when
//! following, each record as it comes; NDJSON (one JSON object a line) or server-sent
//! events. A reader that falls behind is told how many records it missed (`{"dropped": N}`);
//! a quiet stream says it is alive every [`HEARTBEAT`] (a tailer that left is noticed then).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::json;

use super::filter::Asked;
use super::record::Record;
use super::ring::Attached;

/// What this server's live log streams share: the replica name its records give, and the
/// shutdown that ends them (a following stream would otherwise hold the drain to its grace).
#[derive(Debug, Clone)]
pub struct Readers {
    /// This replica's name (`[registry] replica`, `TERN_REPLICA`, the host name).
    pub replica: Arc<str>,
    /// Fires at shutdown.
    pub shutdown: crate::shutdown::Shutdown,
}

/// How often a following stream with nothing to send says it is alive.
pub const HEARTBEAT: Duration = Duration::from_secs(15);

/// How often a following stream reads its ring: what came since goes out in one write.
/// (Woken per record, one tailer cost a request 3 µs at 14,000 requests/s on one core: a
/// wake-up and a write per record; `bash loadtest/bench.sh logs`.)
pub const FOLLOW_EVERY: Duration = Duration::from_millis(100);

/// Records read at a time.
const BATCH: usize = 256;

/// What a reader sends next.
pub enum Batch {
    /// Records it asked for (possibly none: all filtered out), after `dropped` it missed.
    Records {
        /// Records it missed before these (the ring no longer had them).
        dropped: u64,
        /// The records, oldest first.
        records: Vec<Arc<Record>>,
    },
    /// Nothing came for a while.
    Heartbeat,
}

/// One reader of a tenant's ring.
pub struct Reader {
    attached: Attached,
    /// The next record's sequence number.
    cursor: u64,
    /// Without `follow`: where the ring ended when the reader came (it stops there).
    end: Option<u64>,
    /// What it asked for.
    pub asked: Asked,
    read: Vec<Arc<Record>>,
    /// Ends it.
    shutdown: crate::shutdown::Shutdown,
    /// When it reads its ring next, following.
    due: Option<tokio::time::Instant>,
}

impl Reader {
    /// A reader of the ring `attached` holds a place at: from the records that ended at
    /// `since`, or (following) from the next one, or (not following) every record kept.
    pub fn new(attached: Attached, asked: Asked, shutdown: crate::shutdown::Shutdown) -> Self {
        let tail = attached.tail();
        let end = (!asked.follow).then(|| tail.next_seq());
        let cursor = match asked.since_ms {
            Some(ms) => tail.seq_since(ms),
            None if asked.follow => tail.next_seq(),
            None => 0,
        };
        Self {
            attached,
            cursor,
            end,
            asked,
            read: Vec::new(),
            shutdown,
            due: None,
        }
    }

    /// The shutdown that ends it.
    pub fn shutdown(&self) -> &crate::shutdown::Shutdown {
        &self.shutdown
    }

    /// What it sends next; `None` at its end (not following: once it has read what the ring
    /// held when it came).
    pub async fn next(&mut self) -> Option<Batch> {
        let tail = self.attached.tail().clone();
        let mut quiet = Duration::ZERO;
        loop {
            if self.shutdown.is_triggered() {
                return None;
            }
            // Following, the ring is read once per interval (unless the last read was cut
            // short at a full batch: then at once, to catch up).
            if let Some(due) = self.due.take() {
                tokio::select! {
                    () = tokio::time::sleep_until(due) => {}
                    () = self.shutdown.wait() => return None,
                }
            }
            let max = match self.end {
                Some(end) => usize::try_from(end.saturating_sub(self.cursor))
                    .unwrap_or(BATCH)
                    .min(BATCH),
                None => BATCH,
            };
            let mut read = std::mem::take(&mut self.read);
            let dropped = if max == 0 {
                0
            } else {
                tail.read(&mut self.cursor, max, &mut read)
            };
            let (read_any, full) = (!read.is_empty(), read.len() == BATCH);
            if self.end.is_none() && !full {
                self.due = Some(tokio::time::Instant::now() + FOLLOW_EVERY);
            }
            read.retain(|r| self.asked.filter.matches(r));
            if dropped > 0 || !read.is_empty() {
                return Some(Batch::Records {
                    dropped,
                    records: read,
                });
            }
            self.read = read;
            if self.end.is_some_and(|end| self.cursor >= end) {
                return None;
            }
            if !read_any {
                quiet += FOLLOW_EVERY;
                if quiet >= HEARTBEAT {
                    return Some(Batch::Heartbeat);
                }
            }
        }
    }
}

/// How a stream's records are written: who gives them, and in which format.
#[derive(Clone)]
pub struct Writer {
    /// This replica's name.
    pub replica: Arc<str>,
    /// The tenant's name.
    pub tenant: Arc<str>,
    /// Whether paths show their query (`access_log_query`).
    pub with_query: bool,
    /// Server-sent events rather than NDJSON.
    pub sse: bool,
}

impl Writer {
    /// `record` as one line of the stream (its JSON, framed).
    pub fn record(&self, record: &Record, out: &mut Vec<u8>) {
        self.line(
            record.json(&self.replica, &self.tenant, self.with_query),
            out,
        );
    }

    /// A JSON object's text framed for the stream: a line of NDJSON, or an SSE `data` event.
    pub fn line(&self, json: &[u8], out: &mut Vec<u8>) {
        if self.sse {
            out.extend_from_slice(b"data: ");
        }
        out.extend_from_slice(json);
        out.extend_from_slice(if self.sse { b"\n\n" } else { b"\n" });
    }

    /// A JSON object framed for the stream: a line of NDJSON, or an SSE event.
    pub fn framed(&self, v: &serde_json::Value, out: &mut Vec<u8>) {
        if self.sse {
            let event = if v.get("dropped").is_some() {
                "event: dropped\n"
            } else {
                ""
            };
            out.extend_from_slice(event.as_bytes());
            out.extend_from_slice(b"data: ");
        }
        // (Serialising a `Value` cannot fail; JSON escapes every control character, so no
        // output of a guest breaks a line or an event.)
        let _ = serde_json::to_writer(&mut *out, v);
        out.extend_from_slice(if self.sse { b"\n\n" } else { b"\n" });
    }

    /// A batch as the bytes of the stream.
    pub fn batch(&self, batch: &Batch) -> Bytes {
        let mut out = Vec::new();
        match batch {
            Batch::Records { dropped, records } => {
                if *dropped > 0 {
                    self.framed(&json!({ "dropped": dropped }), &mut out);
                }
                for r in records {
                    self.record(r, &mut out);
                }
            }
            Batch::Heartbeat => self.heartbeat(&mut out),
        }
        Bytes::from(out)
    }

    /// The stream is alive: an SSE comment, or an NDJSON object of its own.
    pub fn heartbeat(&self, out: &mut Vec<u8>) {
        if self.sse {
            out.extend_from_slice(b": heartbeat\n\n");
        } else {
            self.framed(
                &json!({ "heartbeat": super::record::utc_millis(super::record::now_ms()) }),
                out,
            );
        }
    }
}

/// The response body of one replica's stream: `reader`'s batches as `writer` writes them.
pub fn body(reader: Reader, writer: Writer) -> crate::body::ResponseBody {
    let frames =
        futures_util::stream::unfold((reader, writer), |(mut reader, writer)| async move {
            let batch = reader.next().await?;
            let bytes = writer.batch(&batch);
            Some((
                Ok::<_, crate::body::BodyCut>(http_body::Frame::data(bytes)),
                (reader, writer),
            ))
        });
    crate::body::ResponseBody::Transformed(crate::body::Transformed::new(
        http_body_util::StreamBody::new(frames),
    ))
}
