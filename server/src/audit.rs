//! The audit log: one JSON line per change made through the admin API (and per refused
//! attempt: a wrong, expired or revoked token, a tenant or scope a token lacks), appended to
//! `<data-dir>/audit.log` (mode 0600; past [`ROTATE_AT`] bytes it becomes `audit.log.1`, the
//! one before that is dropped).
//!
//! The steps gradual deployments take by themselves (a stage, a promotion, an abort) are
//! recorded too, by the replica that took them (`"who": "rollout"`, `step`).
//!
//! A line says who (the operator, or a scoped token's id and name), from where (the client's
//! address), when, what (method, path, tenant, the names of the spec fields a change named, the
//! new version), and how it ended (status, outcome). Never a token, and never a value: a
//! variable's or secret's value is in a body, which is not logged.
//!
//! The API hands each line to a thread of its own through a bounded queue and never waits: a
//! full queue (a stuck disk) drops the line and counts it (`tern_audit_dropped_total`). A read
//! of this server's log sees every line recorded before it: it waits (at most [`CATCH_UP`]) for
//! the writer to have written as many lines as were handed to it.
//!
//! In a fleet each line also names its replica and goes to the shared registry: a replica
//! keeps the lines it has not shipped yet (at most [`PENDING_MAX_BYTES`]) and writes them every
//! [`SHIP_EVERY`] as one object `audit/<unix-ms>-<replica>.ndjson`, named so that the store
//! lists them in time order; each replica removes its own objects older than
//! [`KEPT_FOR`]. [`AuditLog::read`] (`GET /admin/v1/audit`, `tern audit`) merges every
//! replica's lines in time order; on a single server it reads the data directory's log.

use std::collections::VecDeque;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, mpsc};
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use crate::fleet::objects::{Remote, RemoteError};

/// Size past which the log is rotated.
pub const ROTATE_AT: u64 = 16 << 20;

/// Lines waiting for the writer at most.
const QUEUE: usize = 4096;

/// How often a replica writes its new lines to the shared registry.
pub const SHIP_EVERY: Duration = Duration::from_secs(1);

/// Lines a replica keeps for the registry at most (while it cannot be reached); past it the
/// oldest are dropped (and counted). They are in the data directory's log all the same.
pub const PENDING_MAX_BYTES: usize = 4 << 20;

/// How long the registry keeps the audit's objects (each replica removes its own).
pub const KEPT_FOR: Duration = Duration::from_secs(90 * 86_400);

/// How often a replica looks for its objects past [`KEPT_FOR`].
const EXPIRE_EVERY: Duration = Duration::from_secs(3600);

/// Most records one read answers.
pub const MAX_READ: usize = 10_000;

/// One audited request.
#[derive(Debug, Serialize)]
pub struct Record<'a> {
    /// Unix seconds.
    pub time: u64,
    /// Unix milliseconds (the order of records across replicas, as far as their clocks agree).
    pub time_ms: u64,
    /// The replica that took it (in a fleet).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replica: Option<&'a str>,
    /// The request's id (`x-request-id`: the client's, else one made for it).
    pub request_id: &'a str,
    /// `operator`, `token`, or `unknown` (a refused bearer).
    pub who: &'static str,
    /// A scoped token's id (also of a refused one that names an id).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<&'a str>,
    /// A scoped token's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_name: Option<&'a str>,
    /// The client's address.
    pub client: std::net::IpAddr,
    /// The method.
    pub method: &'a str,
    /// The path (no query).
    pub path: &'a str,
    /// The tenant it concerns, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<&'a str>,
    /// The answer's status.
    pub status: u16,
    /// `done`, `refused` (401/403, or a tenant a token does not reach), `failed` (any other
    /// error).
    pub outcome: &'static str,
    /// The version a deploy or rollback made current.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<&'a str>,
    /// The id of the token a `POST /admin/v1/tokens` made.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_made: Option<&'a str>,
    /// The spec fields a `PUT`/`PATCH` of a tenant named (names only).
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    pub fields: &'a [String],
    /// A step a gradual deployment took by itself (`advance`, `promote`, `abort`; `who` is
    /// then `rollout`, and `version` the candidate's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<&'a str>,
}

/// How long a read of this server's log waits for the writer to write the lines recorded
/// before it (a stuck disk: the read then answers with what the file holds).
const CATCH_UP: Duration = Duration::from_secs(2);

/// Where audited requests go.
#[derive(Debug)]
pub struct AuditLog {
    lines: mpsc::SyncSender<Vec<u8>>,
    /// The lines handed to the writer, and how many it has written.
    progress: Arc<Progress>,
    dropped: prometheus::IntCounter,
    path: PathBuf,
    /// In a fleet: this replica's name, and the lines not in the registry yet.
    shipping: Option<Shipping>,
}

#[derive(Debug)]
struct Shipping {
    replica: String,
    pending: Mutex<Pending>,
}

/// The lines handed to the writer thread, and the lines it has written (or failed to: the
/// disk's error is logged) — what a read waits for.
#[derive(Debug, Default)]
struct Progress {
    sent: AtomicU64,
    written: Mutex<u64>,
    wrote: Condvar,
    /// Held by a rotation and by a read of both files: a read between the rename and the new
    /// file would miss the lines just moved (read `audit.log.1` before, `audit.log` after).
    files: Mutex<()>,
}

impl Progress {
    /// Waits (at most `limit`) until the writer has written the lines handed to it so far;
    /// whether it has.
    fn catch_up(&self, limit: Duration) -> bool {
        let sent = self.sent.load(Ordering::Acquire);
        let written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        let (written, _) = self
            .wrote
            .wait_timeout_while(written, limit, |w| *w < sent)
            .unwrap_or_else(|e| e.into_inner());
        *written >= sent
    }

    /// One more line written.
    fn wrote_one(&self) {
        *self.written.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        self.wrote.notify_all();
    }
}

/// Lines not in the registry yet, oldest first.
#[derive(Debug, Default)]
struct Pending {
    lines: VecDeque<Vec<u8>>,
    bytes: usize,
}

/// What [`AuditLog::read`] reads.
#[derive(Debug, Clone, Default)]
pub struct Query {
    /// Only records of this time or later (Unix seconds).
    pub since: Option<u64>,
    /// Only records concerning this tenant.
    pub tenant: Option<String>,
    /// The last this many (at most [`MAX_READ`]).
    pub limit: usize,
}

impl Query {
    fn wants(&self, record: &Value) -> bool {
        self.since
            .is_none_or(|s| record["time"].as_u64().is_some_and(|t| t >= s))
            && self
                .tenant
                .as_deref()
                .is_none_or(|t| record["tenant"].as_str() == Some(t))
    }
}

/// What [`AuditLog::read`] found.
#[derive(Debug, Serialize)]
pub struct Found {
    /// The records, oldest first.
    pub records: Vec<Value>,
    /// Whether older records matched too (past the limit).
    pub truncated: bool,
    /// `registry` (every replica's) or `data-dir` (this server's).
    pub source: &'static str,
}

impl AuditLog {
    /// Starts the writer of `<data_dir>/audit.log`; `replica` names this server in a fleet
    /// (its lines then go to the registry too, [`AuditLog::ship`]).
    ///
    /// # Errors
    /// If the file cannot be opened for appending.
    pub fn open(
        data_dir: &Path,
        dropped: prometheus::IntCounter,
        replica: Option<String>,
    ) -> std::io::Result<Self> {
        Self::rotating_at(data_dir, dropped, replica, ROTATE_AT)
    }

    fn rotating_at(
        data_dir: &Path,
        dropped: prometheus::IntCounter,
        replica: Option<String>,
        rotate_at: u64,
    ) -> std::io::Result<Self> {
        let path = data_dir.join("audit.log");
        let file = append(&path)?;
        let (lines, queue) = mpsc::sync_channel::<Vec<u8>>(QUEUE);
        let writing = path.clone();
        let progress = Arc::new(Progress::default());
        let writer = progress.clone();
        std::thread::Builder::new()
            .name("tern-audit".into())
            .spawn(move || write_lines(&writing, file, &queue, &writer, rotate_at))?;
        Ok(Self {
            lines,
            progress,
            dropped,
            path,
            shipping: replica.map(|replica| Shipping {
                replica,
                pending: Mutex::default(),
            }),
        })
    }

    /// Appends `record` (never waits; a read made after this returns sees it).
    pub fn record<'a>(&'a self, mut record: Record<'a>) {
        if let Some(s) = &self.shipping {
            record.replica = Some(&s.replica);
        }
        let mut line = serde_json::to_vec(&record).unwrap_or_default();
        line.push(b'\n');
        if let Some(s) = &self.shipping {
            let mut pending = s.pending.lock().unwrap_or_else(|e| e.into_inner());
            pending.bytes += line.len();
            pending.lines.push_back(line.clone());
            while pending.bytes > PENDING_MAX_BYTES {
                let Some(old) = pending.lines.pop_front() else {
                    break;
                };
                pending.bytes -= old.len();
                self.dropped.inc();
            }
        }
        if self.lines.try_send(line).is_ok() {
            self.progress.sent.fetch_add(1, Ordering::Release);
        } else {
            self.dropped.inc();
        }
    }

    /// Writes the lines not in the registry yet as one object; they are forgotten once it is
    /// written (kept for the next round if it is not).
    ///
    /// # Errors
    /// [`RemoteError::Unreachable`].
    pub async fn ship(&self, remote: &Remote) -> Result<(), RemoteError> {
        let Some(s) = &self.shipping else {
            return Ok(());
        };
        let (n, batch) = {
            let pending = s.pending.lock().unwrap_or_else(|e| e.into_inner());
            (
                pending.lines.len(),
                pending.lines.iter().flatten().copied().collect::<Vec<u8>>(),
            )
        };
        if n == 0 {
            return Ok(());
        }
        let name = object_name(now_ms(), &s.replica);
        remote.put_object(&name, batch.into(), true).await?;
        let mut pending = s.pending.lock().unwrap_or_else(|e| e.into_inner());
        // Only the lines written: others may have been added (or the oldest dropped) meanwhile.
        let shipped = n.min(pending.lines.len());
        let pending = &mut *pending;
        for line in pending.lines.drain(..shipped) {
            pending.bytes -= line.len();
        }
        Ok(())
    }

    /// Ships this replica's lines every [`SHIP_EVERY`] (and once more at the end), and
    /// removes its objects past [`KEPT_FOR`] every hour, until `shutdown`.
    pub async fn ship_until(&self, remote: &Remote, shutdown: &crate::shutdown::Shutdown) {
        let Some(s) = &self.shipping else {
            return;
        };
        let mut expired_at: Option<std::time::Instant> = None;
        let mut failing = false;
        loop {
            let more = shutdown.sleep(SHIP_EVERY).await;
            match self.ship(remote).await {
                Ok(()) => failing = false,
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(
                        "cannot write the audit's lines to the shared registry (kept, tried again): {e}"
                    );
                }
                Err(_) => {}
            }
            if !more {
                break;
            }
            if expired_at.is_none_or(|at| at.elapsed() >= EXPIRE_EVERY) {
                expired_at = Some(std::time::Instant::now());
                let cutoff = now_ms().saturating_sub(KEPT_FOR.as_millis() as u64);
                if let Err(e) = expire(remote, &s.replica, cutoff).await {
                    tracing::debug!("cannot remove old audit objects: {e}");
                }
            }
        }
    }

    /// The records `q` asks for: every replica's from the registry (and this one's not yet
    /// shipped) given one, else this server's log.
    ///
    /// # Errors
    /// [`RemoteError::Unreachable`] if the registry cannot be read.
    pub async fn read(&self, remote: Option<&Remote>, q: &Query) -> Result<Found, RemoteError> {
        let limit = q.limit.clamp(1, MAX_READ);
        let (mut records, source, mut truncated) = match (remote, &self.shipping) {
            (Some(remote), Some(s)) => {
                let (records, truncated) = read_registry(remote, q, limit).await?;
                let mut records = records;
                let pending = s.pending.lock().unwrap_or_else(|e| e.into_inner());
                records.extend(
                    pending
                        .lines
                        .iter()
                        .filter_map(|l| serde_json::from_slice::<Value>(l).ok())
                        .filter(|r| q.wants(r)),
                );
                (records, "registry", truncated)
            }
            _ => {
                let (path, q, progress) = (self.path.clone(), q.clone(), self.progress.clone());
                let records = tokio::task::spawn_blocking(move || {
                    if !progress.catch_up(CATCH_UP) {
                        tracing::warn!(
                            "the audit log's writer is behind (a slow disk?): read without its \
                             latest lines"
                        );
                    }
                    // Opened under the rotation's lock (the two files of one moment), read
                    // after it: a rotation renames, it does not change what an open file holds.
                    let files = {
                        let _files = progress.files.lock().unwrap_or_else(|e| e.into_inner());
                        [path.with_extension("log.1"), path]
                            .map(|file| std::fs::File::open(file).ok())
                    };
                    read_files(files.into_iter().flatten(), &q)
                })
                .await
                .unwrap_or_default();
                (records, "data-dir", false)
            }
        };
        // By time; lines of one millisecond keep the order they were read in (a replica's own).
        records.sort_by_key(|r| {
            r["time_ms"]
                .as_u64()
                .unwrap_or_else(|| r["time"].as_u64().unwrap_or(0).saturating_mul(1000))
        });
        if records.len() > limit {
            truncated = true;
            records.drain(..records.len() - limit);
        }
        Ok(Found {
            records,
            truncated,
            source,
        })
    }
}

/// Now, in Unix milliseconds.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `audit/<unix-ms, 13 digits>-<replica>.ndjson`: names sort by time.
fn object_name(ms: u64, replica: &str) -> String {
    format!("audit/{ms:013}-{replica}.ndjson")
}

/// The time in an object's name (Unix ms).
fn object_time(name: &str) -> Option<u64> {
    name.strip_prefix("audit/")?.get(..13)?.parse().ok()
}

/// The registry's records `q` asks for: the objects from just before `q.since` on, read from
/// the newest back while an older one can still hold one of the last `limit` records (a line
/// is never younger than the object it was shipped in); whether older ones were left unread.
async fn read_registry(
    remote: &Remote,
    q: &Query,
    limit: usize,
) -> Result<(Vec<Value>, bool), RemoteError> {
    // A batch is named by when it was written, up to SHIP_EVERY (and retries) after its
    // lines: start a minute early, and filter the lines.
    let from = q.since.map_or(0, |s| s.saturating_sub(60) * 1000);
    let names = remote.list_after("audit", &object_name(from, "")).await?;
    let mut records: Vec<Value> = Vec::new();
    // Of the records read, the times (ms), newest first once `limit` are in.
    let mut times: Vec<u64> = Vec::new();
    let mut truncated = false;
    for name in names.iter().rev() {
        if times.len() >= limit {
            times.sort_unstable_by(|a, b| b.cmp(a));
            let cut = times[limit - 1];
            if object_time(name).is_some_and(|t| t < cut) {
                truncated = true;
                break;
            }
        }
        let Some(bytes) = remote.get_object(name).await? else {
            // Expired meanwhile.
            continue;
        };
        for r in bytes
            .split(|b| *b == b'\n')
            .filter_map(|l| serde_json::from_slice::<Value>(l).ok())
            .filter(|r| q.wants(r))
        {
            times.push(r["time_ms"].as_u64().unwrap_or(0));
            records.push(r);
        }
    }
    Ok((records, truncated))
}

/// This server's records `q` asks for, from `files` (`audit.log.1`, then `audit.log`).
fn read_files(files: impl Iterator<Item = std::fs::File>, q: &Query) -> Vec<Value> {
    use std::io::Read;
    let mut out = Vec::new();
    for mut file in files {
        let mut text = Vec::new();
        if file.read_to_end(&mut text).is_err() {
            continue;
        }
        out.extend(
            text.split(|b| *b == b'\n')
                .filter_map(|l| serde_json::from_slice::<Value>(l).ok())
                .filter(|r| q.wants(r)),
        );
    }
    out
}

/// Removes `replica`'s audit objects written before `cutoff` (Unix ms).
async fn expire(remote: &Remote, replica: &str, cutoff: u64) -> Result<(), RemoteError> {
    let suffix = format!("-{replica}.ndjson");
    for name in remote.list_after("audit", &object_name(0, "")).await? {
        match object_time(&name) {
            Some(t) if t < cutoff => {
                if name.ends_with(&suffix) {
                    remote.delete_object(&name).await?;
                }
            }
            // Sorted by time: the rest are younger.
            _ => break,
        }
    }
    Ok(())
}

fn append(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
}

/// The writer thread: each line written as it comes; the file rotated past `rotate_at` bytes
/// ([`ROTATE_AT`]).
fn write_lines(
    path: &PathBuf,
    mut file: std::fs::File,
    queue: &mpsc::Receiver<Vec<u8>>,
    progress: &Progress,
    rotate_at: u64,
) {
    let mut size = file.metadata().map_or(0, |m| m.len());
    while let Ok(line) = queue.recv() {
        if size + line.len() as u64 > rotate_at && size > 0 {
            let _files = progress.files.lock().unwrap_or_else(|e| e.into_inner());
            let _ = file.sync_all();
            let _ = std::fs::rename(path, path.with_extension("log.1"));
            match append(path) {
                Ok(f) => {
                    file = f;
                    size = 0;
                }
                Err(e) => tracing::error!("cannot open a new {}: {e}", path.display()),
            }
        }
        match file.write_all(&line) {
            Ok(()) => size += line.len() as u64,
            Err(e) => tracing::error!("cannot write {}: {e}", path.display()),
        }
        progress.wrote_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(log: &AuditLog, tenant: &str, time_ms: u64) {
        log.record(Record {
            time: time_ms / 1000,
            time_ms,
            replica: None,
            request_id: "r",
            who: "operator",
            token: None,
            token_name: None,
            client: std::net::Ipv4Addr::LOCALHOST.into(),
            method: "POST",
            path: "/admin/v1/tenants/x/module",
            tenant: Some(tenant),
            status: 200,
            outcome: "done",
            version: None,
            token_made: None,
            fields: &[],
            step: None,
        });
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_read_sees_every_line_recorded_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let dropped = prometheus::IntCounter::new("d", "d").unwrap();
        let log = AuditLog::open(dir.path(), dropped.clone(), None).unwrap();
        let all = Query {
            limit: MAX_READ,
            ..Query::default()
        };
        // Rounds of lines read right after they are handed over: the writer thread has not
        // written the last of them yet unless the read waits for it.
        let mut recorded = 0;
        for round in 1..=20u64 {
            for i in 0..round * 10 {
                record(&log, "t", round * 1_000_000 + i);
                recorded += 1;
            }
            let found = log.read(None, &all).await.unwrap();
            assert_eq!(found.source, "data-dir");
            assert_eq!(
                found.records.len(),
                recorded.min(MAX_READ),
                "round {round}: every line recorded before the read"
            );
            assert_eq!(
                found.records.last().unwrap()["time_ms"].as_u64(),
                Some(round * 1_000_000 + round * 10 - 1)
            );
        }
        assert_eq!(dropped.get(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_read_during_rotations_sees_an_unbroken_run_of_lines() {
        let dir = tempfile::tempdir().unwrap();
        let dropped = prometheus::IntCounter::new("d", "d").unwrap();
        // ~150 lines a file: the writer rotates every few milliseconds while the reads go on.
        let log =
            Arc::new(AuditLog::rotating_at(dir.path(), dropped.clone(), None, 32 * 1024).unwrap());
        let all = Query {
            limit: MAX_READ,
            ..Query::default()
        };
        // The writer stops when the test ends, passed or not.
        struct Stop(Arc<std::sync::atomic::AtomicBool>);
        impl Drop for Stop {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let stop = Stop(Arc::new(std::sync::atomic::AtomicBool::new(false)));
        // Lines recorded so far (each one before it is counted here).
        let recorded = Arc::new(AtomicU64::new(0));
        let writer = {
            let (log, stop, recorded) = (log.clone(), stop.0.clone(), recorded.clone());
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    record(&log, "t", 1_000_000 + i);
                    i += 1;
                    recorded.store(i, Ordering::Release);
                    if i.is_multiple_of(1024) {
                        assert!(log.progress.catch_up(Duration::from_secs(10)));
                    }
                }
                i
            })
        };
        let first = dir.path().join("audit.log.1");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !first.exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "the log never rotated"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let mut longest = 0;
        for _ in 0..300 {
            let before = recorded.load(Ordering::Acquire);
            let found = log.read(None, &all).await.unwrap();
            let times: Vec<u64> = found
                .records
                .iter()
                .map(|r| r["time_ms"].as_u64().unwrap())
                .collect();
            // Every line recorded before the read is in it ...
            assert!(
                times.last().is_some_and(|t| *t + 1 >= 1_000_000 + before),
                "a read missed lines recorded before it ({before} recorded): {times:?}"
            );
            // ... after the older file's lines, then the newer's: one run without a gap (the
            // oldest are gone with the file rotated out).
            for pair in times.windows(2) {
                assert_eq!(pair[1], pair[0] + 1, "a gap in a read: {times:?}");
            }
            longest = longest.max(times.len());
        }
        drop(stop);
        let written = writer.join().unwrap();
        assert!(
            written > 1024,
            "only {written} lines were written beside the reads"
        );
        // Reads took lines of both files: more than a rotated file holds.
        let one_file = std::fs::read(&first)
            .unwrap()
            .split(|b| *b == b'\n')
            .count()
            - 1;
        assert!(
            longest > one_file,
            "no read spanned both files ({longest} lines, {one_file} a file)"
        );
        assert_eq!(dropped.get(), 0);
    }

    #[test]
    fn objects_are_named_to_sort_by_time() {
        let early = object_name(999, "b");
        let late = object_name(1_795_923_197_000, "a");
        assert!(early < late, "{early} {late}");
        assert_eq!(object_time(&late), Some(1_795_923_197_000));
        assert_eq!(object_time("audit/x"), None);
        assert!(object_name(0, "") < early, "the offset that lists them all");
    }

    #[tokio::test]
    async fn replicas_ship_their_lines_and_a_read_merges_them_in_time_order() {
        let store: Arc<dyn object_store::ObjectStore> =
            Arc::new(object_store::memory::InMemory::new());
        let remote = Remote::new(store, object_store::path::Path::from("fleet"));
        let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
        let counter = || prometheus::IntCounter::new("d", "d").unwrap();
        let a = AuditLog::open(dirs[0].path(), counter(), Some("a".into())).unwrap();
        let b = AuditLog::open(dirs[1].path(), counter(), Some("b".into())).unwrap();
        record(&a, "t1", 1_000);
        record(&b, "t2", 2_000);
        record(&a, "t1", 3_000);
        a.ship(&remote).await.unwrap();
        assert!(
            a.shipping
                .as_ref()
                .unwrap()
                .pending
                .lock()
                .unwrap()
                .lines
                .is_empty()
        );
        // b's line is not shipped yet: b's read has it, a's does not.
        let all = Query {
            limit: 100,
            ..Query::default()
        };
        let seen = |f: &Found| -> Vec<(String, u64)> {
            f.records
                .iter()
                .map(|r| {
                    (
                        r["replica"].as_str().unwrap().to_string(),
                        r["time_ms"].as_u64().unwrap(),
                    )
                })
                .collect()
        };
        let from_b = b.read(Some(&remote), &all).await.unwrap();
        assert_eq!(
            seen(&from_b),
            [
                ("a".into(), 1_000),
                ("b".into(), 2_000),
                ("a".into(), 3_000)
            ]
        );
        assert_eq!(a.read(Some(&remote), &all).await.unwrap().records.len(), 2);
        b.ship(&remote).await.unwrap();
        let from_a = a.read(Some(&remote), &all).await.unwrap();
        assert_eq!(seen(&from_a), seen(&from_b));
        // Filters: a tenant, a time, a limit (the last ones).
        let t1 = Query {
            tenant: Some("t1".into()),
            ..all.clone()
        };
        assert_eq!(a.read(Some(&remote), &t1).await.unwrap().records.len(), 2);
        let since = Query {
            since: Some(2),
            ..all.clone()
        };
        assert_eq!(
            seen(&a.read(Some(&remote), &since).await.unwrap()),
            [("b".into(), 2_000), ("a".into(), 3_000)]
        );
        let last = a
            .read(
                Some(&remote),
                &Query {
                    limit: 1,
                    ..all.clone()
                },
            )
            .await
            .unwrap();
        assert_eq!(seen(&last), [("a".into(), 3_000)]);
        assert!(last.truncated);
        // Objects past the time kept are removed, each replica its own.
        expire(&remote, "a", u64::MAX).await.unwrap();
        let left = b.read(Some(&remote), &all).await.unwrap();
        assert_eq!(seen(&left), [("b".into(), 2_000)]);
    }

    #[test]
    fn pending_lines_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let dropped = prometheus::IntCounter::new("d", "d").unwrap();
        let log = AuditLog::open(dir.path(), dropped.clone(), Some("a".into())).unwrap();
        // Each line is about 190 bytes: twice the bound's worth.
        let n = 2 * PENDING_MAX_BYTES / 150;
        for i in 0..n {
            record(&log, "t", i as u64);
        }
        let pending = log.shipping.as_ref().unwrap().pending.lock().unwrap();
        assert!(pending.bytes <= PENDING_MAX_BYTES);
        assert_eq!(
            pending.bytes,
            pending.lines.iter().map(Vec::len).sum::<usize>()
        );
        assert!(
            pending.bytes > PENDING_MAX_BYTES - 1024,
            "full to its bound: {}",
            pending.bytes
        );
        assert!(dropped.get() > 0, "the oldest dropped and counted");
        let first: Value = serde_json::from_slice(&pending.lines[0]).unwrap();
        assert!(
            first["time_ms"].as_u64().unwrap() > 0,
            "the oldest went first"
        );
    }
}
