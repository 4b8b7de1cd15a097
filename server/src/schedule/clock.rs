//! The clock schedules fire by: the system's, or for tests a simulated one read from a file
//! (`TERN_SCHEDULE_CLOCK=file:/path`, the file holding Unix milliseconds), which every
//! replica of a test fleet reads alike.

use std::path::PathBuf;
use std::time::Duration;

/// The environment variable naming a simulated clock.
pub const CLOCK_ENV: &str = "TERN_SCHEDULE_CLOCK";

/// How often a simulated clock is read while waiting.
const SIMULATED_POLL: Duration = Duration::from_millis(10);

/// The clock schedules fire by.
#[derive(Debug, Clone)]
pub enum Clock {
    /// The system's.
    System,
    /// A file holding Unix milliseconds.
    File(PathBuf),
}

impl Clock {
    /// The system's clock, or the simulated one `TERN_SCHEDULE_CLOCK` names.
    ///
    /// # Errors
    /// `TERN_SCHEDULE_CLOCK` set to something other than `file:PATH`.
    pub fn from_env() -> Result<Self, String> {
        match std::env::var(CLOCK_ENV) {
            Err(_) => Ok(Self::System),
            Ok(v) => match v.strip_prefix("file:") {
                Some(path) if !path.is_empty() => Ok(Self::File(PathBuf::from(path))),
                _ => Err(format!("{CLOCK_ENV}={v:?}: expected file:PATH")),
            },
        }
    }

    /// Now, in Unix milliseconds (a simulated clock whose file cannot be read: 0).
    pub fn now_ms(&self) -> i64 {
        match self {
            Self::System => chrono::Utc::now().timestamp_millis(),
            Self::File(path) => std::fs::read_to_string(path)
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(0),
        }
    }

    /// Waits until `ms` or at most `most`, whichever comes first.
    pub async fn sleep_until(&self, ms: i64, most: Duration) {
        match self {
            Self::System => {
                let wait = u64::try_from(ms.saturating_sub(self.now_ms())).unwrap_or(0);
                tokio::time::sleep(Duration::from_millis(wait).min(most)).await;
            }
            Self::File(_) => {
                let end = tokio::time::Instant::now() + most;
                while self.now_ms() < ms && tokio::time::Instant::now() < end {
                    tokio::time::sleep(SIMULATED_POLL).await;
                }
            }
        }
    }
}
