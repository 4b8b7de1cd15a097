//! Shutdown: SIGTERM or SIGINT stops accepting and drains in-flight requests within the grace
//! period; a second signal exits at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::watch;

/// A shutdown trigger shared by the listeners.
#[derive(Debug, Clone)]
pub struct Shutdown {
    tx: watch::Sender<bool>,
    /// The same as the channel's value, readable per request without a lock.
    fired: Arc<AtomicBool>,
}

impl Default for Shutdown {
    fn default() -> Self {
        Self::new()
    }
}

impl Shutdown {
    /// A trigger that has not fired.
    pub fn new() -> Self {
        Self {
            tx: watch::channel(false).0,
            fired: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Fires the trigger: listeners stop accepting and start draining.
    pub fn trigger(&self) {
        self.fired.store(true, Ordering::Relaxed);
        self.tx.send_replace(true);
    }

    /// Whether the trigger has fired.
    pub fn is_triggered(&self) -> bool {
        self.fired.load(Ordering::Relaxed)
    }

    /// Resolves once the trigger fires.
    pub async fn wait(&self) {
        let mut rx = self.tx.subscribe();
        let _ = rx.wait_for(|fired| *fired).await;
    }

    /// Sleeps for `d`; `false` if the trigger fired first (the caller should stop).
    pub async fn sleep(&self, d: std::time::Duration) -> bool {
        tokio::select! {
            () = tokio::time::sleep(d) => true,
            () = self.wait() => false,
        }
    }

    /// Fires the trigger on the first SIGTERM or SIGINT; exits the process on the second.
    ///
    /// # Errors
    /// If the signal handlers cannot be installed.
    pub fn on_signals(&self) -> std::io::Result<()> {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let this = self.clone();
        tokio::spawn(async move {
            tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
            tracing::info!("shutting down: draining in-flight requests (signal again to exit now)");
            this.trigger();
            tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
            tracing::warn!("second signal: exiting now");
            std::process::exit(130);
        });
        Ok(())
    }
}
