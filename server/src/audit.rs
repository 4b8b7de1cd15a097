//! The audit log: one JSON line per change made through the admin API (and per refused
//! attempt: a wrong, expired or revoked token, a tenant or scope a token lacks), appended to
//! `<data-dir>/audit.log` (mode 0600; past [`ROTATE_AT`] bytes it becomes `audit.log.1`, the
//! one before that is dropped).
//!
//! A line says who (the operator, or a scoped token's id and name), from where (the client's
//! address), when, what (method, path, tenant, the names of the spec fields a change named, the
//! new version), and how it ended (status, outcome). Never a token, and never a value: a
//! variable's or secret's value is in a body, which is not logged.
//!
//! The API hands each line to a thread of its own through a bounded queue and never waits: a
//! full queue (a stuck disk) drops the line and counts it (`tern_audit_dropped_total`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc;

use serde::Serialize;

/// Size past which the log is rotated.
pub const ROTATE_AT: u64 = 16 << 20;

/// Lines waiting for the writer at most.
const QUEUE: usize = 4096;

/// One audited request.
#[derive(Debug, Serialize)]
pub struct Record<'a> {
    /// Unix seconds.
    pub time: u64,
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
    /// The spec fields a `PUT`/`PATCH` of a tenant named (names only).
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    pub fields: &'a [String],
}

/// Where audited requests go.
#[derive(Debug)]
pub struct AuditLog {
    lines: mpsc::SyncSender<Vec<u8>>,
    dropped: prometheus::IntCounter,
}

impl AuditLog {
    /// Starts the writer of `<data_dir>/audit.log`.
    ///
    /// # Errors
    /// If the file cannot be opened for appending.
    pub fn open(data_dir: &Path, dropped: prometheus::IntCounter) -> std::io::Result<Self> {
        let path = data_dir.join("audit.log");
        let file = append(&path)?;
        let (lines, queue) = mpsc::sync_channel::<Vec<u8>>(QUEUE);
        std::thread::Builder::new()
            .name("tern-audit".into())
            .spawn(move || write_lines(&path, file, &queue))?;
        Ok(Self { lines, dropped })
    }

    /// Appends `record` (never waits).
    pub fn record(&self, record: &Record<'_>) {
        let mut line = serde_json::to_vec(record).unwrap_or_default();
        line.push(b'\n');
        if self.lines.try_send(line).is_err() {
            self.dropped.inc();
        }
    }
}

fn append(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
}

/// The writer thread: each line written as it comes; the file rotated past [`ROTATE_AT`].
fn write_lines(path: &PathBuf, mut file: std::fs::File, queue: &mpsc::Receiver<Vec<u8>>) {
    let mut size = file.metadata().map_or(0, |m| m.len());
    while let Ok(line) = queue.recv() {
        if size + line.len() as u64 > ROTATE_AT && size > 0 {
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
    }
}
