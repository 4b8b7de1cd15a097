//! A fleet's live log: the replica a reader asks reads its own ring and every other
//! replica's (`GET <peer>/admin/v1/tenants/{name}/logs?local=1`, the same filters, with the
//! fleet's token; the replicas' admin URLs come from the registry's reports) and merges them
//! in the order of their `time`. Following, a record is held [`HOLD`] for records of other
//! replicas that arrived before it. A replica that cannot be read is said so in the stream
//! (`{"error": ...}`) and the others go on; `dropped` counts add up.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::stream::{Batch, HEARTBEAT, Reader, Writer};

/// How long a following merge holds a record for records of other replicas that arrived
/// before it.
pub const HOLD: Duration = Duration::from_millis(500);

/// What a source (this replica's ring, or another replica's stream) gives the merge.
enum Item {
    /// A record: its `time` (the key it is merged by) and its JSON.
    Line(String, Bytes),
    /// Records the source's reader missed.
    Dropped(u64),
    /// A replica that could not be read, and why.
    Failed(String),
    /// The source has ended.
    Done,
}

/// The merged stream of `reader` (this replica's ring) and every peer of `fleet` (asked with
/// `query`, the reader's own, about tenant `(name, data key)`: a peer serving another tenant of
/// that name is said in the stream not to serve it), written as `writer` says.
pub fn merged(
    fleet: &Arc<crate::fleet::Fleet>,
    (tenant, data): (&str, &Arc<str>),
    reader: Reader,
    writer: Writer,
    query: Option<&str>,
) -> crate::body::ResponseBody {
    let follow = reader.asked.follow;
    let shutdown = reader.shutdown().clone();
    let path = format!(
        "/admin/v1/tenants/{tenant}/logs?{}",
        super::filter::Asked::for_peers(query, reader.asked.since_ms)
    );
    let peers = fleet.peers();
    let (tx, rx) = mpsc::channel(1024);
    tokio::spawn(local(reader, writer.clone(), tx.clone()));
    for peer in &peers {
        tokio::spawn(remote(
            fleet.clone(),
            peer.clone(),
            (path.clone(), data.clone()),
            tx.clone(),
        ));
    }
    let merge = Merge {
        rx,
        held: BinaryHeap::new(),
        n: 0,
        live: 1 + peers.len(),
        follow,
        writer,
        dropped: 0,
        failed: Vec::new(),
        shutdown,
    };
    let frames = futures_util::stream::unfold(merge, |mut merge| async move {
        let bytes = merge.next().await?;
        Some((
            Ok::<_, crate::body::BodyCut>(http_body::Frame::data(bytes)),
            merge,
        ))
    });
    crate::body::ResponseBody::Transformed(crate::body::Transformed::new(
        http_body_util::StreamBody::new(frames),
    ))
}

/// This replica's ring as a source (its records' JSON as `writer` names them).
async fn local(mut reader: Reader, writer: Writer, tx: mpsc::Sender<Item>) {
    loop {
        let batch = tokio::select! {
            batch = reader.next() => batch,
            () = tx.closed() => return,
        };
        let Some(batch) = batch else { break };
        let Batch::Records { dropped, records } = batch else {
            continue;
        };
        if dropped > 0 && tx.send(Item::Dropped(dropped)).await.is_err() {
            return;
        }
        for r in records {
            let line =
                Bytes::copy_from_slice(r.json(&writer.replica, &writer.tenant, writer.with_query));
            let key = super::record::utc_millis(r.arrived_ms());
            if tx.send(Item::Line(key, line)).await.is_err() {
                return;
            }
        }
    }
    let _ = tx.send(Item::Done).await;
}

/// Another replica's stream as a source.
async fn remote(
    fleet: Arc<crate::fleet::Fleet>,
    peer: String,
    (path, data): (String, Arc<str>),
    tx: mpsc::Sender<Item>,
) {
    let failed = |why: String| Item::Failed(format!("replica {peer}: {why}"));
    let resp = tokio::select! {
        resp = fleet.get(&peer, &path, &data) => resp,
        () = tx.closed() => return,
    };
    let item = match resp {
        Err(e) => Some(failed(format!("cannot be reached: {e}"))),
        Ok(resp) if !resp.status().is_success() => {
            let status = resp.status();
            // Its error, in its own words (`{"error": ...}`, a few hundred bytes).
            let body = http_body_util::Limited::new(resp.into_body(), 4096);
            let said = tokio::time::timeout(Duration::from_secs(2), body.collect())
                .await
                .ok()
                .and_then(Result::ok)
                .and_then(|b| serde_json::from_slice::<Value>(&b.to_bytes()).ok())
                .and_then(|v| v["error"].as_str().map(str::to_string));
            Some(failed(match said {
                Some(said) => format!("answered {status}: {said}"),
                None => format!("answered {status}"),
            }))
        }
        Ok(resp) => read_lines(resp.into_body(), &tx).await.err().map(failed),
    };
    if let Some(item) = item {
        let _ = tx.send(item).await;
    }
    let _ = tx.send(Item::Done).await;
}

/// Reads a replica's NDJSON stream into `tx`, a record a line. `Err`: the stream broke.
async fn read_lines(
    mut body: hyper::body::Incoming,
    tx: &mpsc::Sender<Item>,
) -> Result<(), String> {
    let mut buf: Vec<u8> = Vec::new();
    loop {
        let frame = tokio::select! {
            frame = body.frame() => frame,
            () = tx.closed() => return Ok(()),
        };
        let data = match frame {
            None => return Ok(()),
            Some(Err(e)) => return Err(format!("its stream broke: {e}")),
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => data,
                Err(_) => continue,
            },
        };
        buf.extend_from_slice(&data);
        while let Some(at) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=at).collect();
            let line = &line[..line.len() - 1];
            let Ok(v) = serde_json::from_slice::<Value>(line) else {
                continue;
            };
            let item = if let Some(n) = v["dropped"].as_u64() {
                Item::Dropped(n)
            } else if v.get("heartbeat").is_some() {
                continue;
            } else if let Some(e) = v["error"]
                .as_str()
                .filter(|_| v.get("request_id").is_none())
            {
                Item::Failed(e.to_string())
            } else {
                let key = v["time"].as_str().unwrap_or("").to_string();
                Item::Line(key, Bytes::copy_from_slice(line))
            };
            if tx.send(item).await.is_err() {
                return Ok(());
            }
        }
    }
}

/// The merge: records held in `time` order until their turn.
struct Merge {
    rx: mpsc::Receiver<Item>,
    /// Records waiting, by `time` (and by arrival among equals).
    held: BinaryHeap<Reverse<(String, u64, Bytes)>>,
    n: u64,
    /// Sources not yet ended.
    live: usize,
    follow: bool,
    writer: Writer,
    dropped: u64,
    failed: Vec<String>,
    shutdown: crate::shutdown::Shutdown,
}

impl Merge {
    /// The next bytes of the merged stream; `None` once every source has ended and
    /// everything held is sent.
    async fn next(&mut self) -> Option<Bytes> {
        loop {
            let mut out = Vec::new();
            if self.dropped > 0 {
                self.writer
                    .framed(&json!({ "dropped": self.dropped }), &mut out);
                self.dropped = 0;
            }
            for why in self.failed.drain(..) {
                self.writer.framed(&json!({ "error": why }), &mut out);
            }
            // Following, what arrived before the hold is sent; otherwise all, at the end.
            let horizon = if self.live == 0 {
                None
            } else if self.follow {
                Some(super::record::utc_millis(
                    super::record::now_ms().saturating_sub(HOLD.as_millis() as u64),
                ))
            } else {
                Some(String::new())
            };
            while let Some(Reverse((key, _, _))) = self.held.peek() {
                if horizon.as_ref().is_some_and(|h| key > h) {
                    break;
                }
                let Some(Reverse((_, _, line))) = self.held.pop() else {
                    break;
                };
                self.writer.line(&line, &mut out);
            }
            if !out.is_empty() {
                return Some(Bytes::from(out));
            }
            if self.live == 0 {
                return None;
            }
            let wait = if self.follow && !self.held.is_empty() {
                Duration::from_millis(100)
            } else {
                HEARTBEAT
            };
            tokio::select! {
                item = self.rx.recv() => match item {
                    Some(Item::Line(key, line)) => {
                        self.n += 1;
                        self.held.push(Reverse((key, self.n, line)));
                    }
                    Some(Item::Dropped(n)) => self.dropped += n,
                    Some(Item::Failed(why)) => self.failed.push(why),
                    Some(Item::Done) => self.live -= 1,
                    None => self.live = 0,
                },
                () = self.shutdown.wait() => return None,
                () = tokio::time::sleep(wait) => {
                    if self.follow && self.held.is_empty() {
                        let mut out = Vec::new();
                        self.writer.heartbeat(&mut out);
                        return Some(Bytes::from(out));
                    }
                }
            }
        }
    }
}
