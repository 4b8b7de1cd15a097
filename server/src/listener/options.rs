//! What every listener shares: its options (limits, timeouts, TLS, the connection cap) and how
//! it runs a request's task.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use super::alt_svc::AltSvc;

/// Client-facing limits of a listener. Clones share one connection cap: every worker of the
/// public listener counts against the same `max_connections`.
#[derive(Debug, Clone)]
pub struct ListenOptions {
    /// One permit per open connection, shared by the clones of these options: at the limit,
    /// accepting pauses and clients queue in the kernel's backlog instead of growing memory.
    pub(super) connections: Arc<tokio::sync::Semaphore>,
    /// The size of `connections`.
    pub(super) max_connections: usize,
    /// Counts the open connections, if set.
    pub open: Option<prometheus::IntGauge>,
    /// Counts this worker's open connections on this listener, if set.
    pub worker_open: Option<prometheus::IntGauge>,
    /// Counts request tasks that panicked, if set ([`caught`]).
    pub panics: Option<prometheus::IntCounter>,
    /// Time allowed to send a request head; also the keep-alive idle limit.
    pub header_read_timeout: Duration,
    /// Longest a connection (HTTP/3: a stream) may take none of its answer's bytes.
    pub send_timeout: Duration,
    /// Largest request head; larger gets `431`.
    pub max_header_bytes: usize,
    /// How long open connections may take to finish after shutdown.
    pub grace: Duration,
    /// TLS termination, for a TLS listener.
    pub tls: Option<Arc<crate::tls::Acceptor>>,
    /// The `Alt-Svc` of a TLS listener whose port also serves HTTP/3.
    pub alt_svc: Option<Arc<AltSvc>>,
}

impl ListenOptions {
    /// The options of `[server]`, with a connection cap of their own.
    pub fn from_config(c: &crate::config::ServerConfig) -> Self {
        Self {
            connections: Arc::new(tokio::sync::Semaphore::new(c.max_connections)),
            max_connections: c.max_connections,
            open: None,
            worker_open: None,
            panics: None,
            header_read_timeout: Duration::from_millis(c.header_read_timeout_ms),
            send_timeout: Duration::from_millis(c.send_timeout_ms),
            max_header_bytes: c.max_header_bytes,
            grace: Duration::from_millis(c.shutdown_grace_ms),
            tls: None,
            alt_svc: None,
        }
    }
}

/// How long idle keep-alive connections may still bring a request once shutdown has begun.
pub(super) const LINGER: Duration = Duration::from_secs(1);

/// Runs a request's task `task`, catching a panic in it: counted in `panics` and logged, and
/// the task ends as if its stream had been reset (what it owns is dropped) instead of
/// unwinding into the runtime, which would only print it.
///
/// The task comes boxed and stays where it is: an `async fn` wrapping it moved it whole (its
/// largest state, ~9 KB for an HTTP/3 request with `h3`'s futures and the front end's) into
/// itself, into the box and again into its pinned slot on the first poll; this is a pointer
/// and a counter, which tokio moves into its task cheaply.
pub fn caught<F: Future<Output = ()>>(
    task: Pin<Box<F>>,
    panics: Option<prometheus::IntCounter>,
) -> Caught<F> {
    Caught {
        task: Some(task),
        panics,
    }
}

/// The future of [`caught`].
pub struct Caught<F> {
    /// The task until it ends or panics; dropped then, with all it holds.
    task: Option<Pin<Box<F>>>,
    panics: Option<prometheus::IntCounter>,
}

impl<F: Future<Output = ()>> Future for Caught<F> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let Some(task) = self.task.as_mut() else {
            return Poll::Ready(());
        };
        let polled =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| task.as_mut().poll(cx)));
        match polled {
            Ok(Poll::Pending) => return Poll::Pending,
            Ok(Poll::Ready(())) => {}
            Err(panic) => {
                let why = panic
                    .downcast_ref::<&str>()
                    .copied()
                    .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
                    .unwrap_or("(no message)");
                tracing::error!("a request's task panicked (a bug; the server serves on): {why}");
                if let Some(panics) = &self.panics {
                    panics.inc();
                }
            }
        }
        self.task = None;
        Poll::Ready(())
    }
}

#[cfg(test)]
mod tests {
    use super::caught;
    use std::future::Future;
    use std::pin::pin;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Context, Poll, Wake, Waker};

    /// Counts its wakes.
    #[derive(Default)]
    struct Wakes(AtomicUsize);
    impl Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn a_caught_task_runs_to_its_end_and_a_panic_in_it_is_counted_not_unwound() {
        let wakes = Arc::new(Wakes::default());
        let waker = Waker::from(wakes.clone());
        let mut cx = Context::from_waker(&waker);
        let panics = prometheus::IntCounter::new("panics", "panics").unwrap();
        // A task that waits once (waking its caller's waker, which must reach it), then ends.
        let mut polls = 0;
        let waits_once = std::future::poll_fn(|cx| {
            polls += 1;
            if polls == 1 {
                cx.waker().wake_by_ref();
                Poll::Pending
            } else {
                Poll::Ready(())
            }
        });
        {
            let mut task = pin!(caught(Box::pin(waits_once), Some(panics.clone())));
            assert_eq!(task.as_mut().poll(&mut cx), Poll::Pending);
            assert_eq!(
                wakes.0.load(Ordering::Relaxed),
                1,
                "the task got another waker"
            );
            assert_eq!(task.as_mut().poll(&mut cx), Poll::Ready(()));
            // Polled again after its end: still ended, the task not resumed (which panics).
            assert_eq!(task.as_mut().poll(&mut cx), Poll::Ready(()));
        }
        assert_eq!(polls, 2);
        assert_eq!(panics.get(), 0);
        // A task that panics on its second poll ends there, counted once; the caller goes on.
        let mut polled = 0;
        let panics_later = std::future::poll_fn(|_| {
            polled += 1;
            assert!(polled < 2, "a bug in the task: {polled}");
            Poll::Pending
        });
        let mut task = pin!(caught(Box::pin(panics_later), Some(panics.clone())));
        assert_eq!(task.as_mut().poll(&mut cx), Poll::Pending);
        assert_eq!(task.as_mut().poll(&mut cx), Poll::Ready(()));
        assert_eq!(task.as_mut().poll(&mut cx), Poll::Ready(()));
        assert_eq!(panics.get(), 1);
        // Without a counter, the same.
        let mut task = pin!(caught(Box::pin(async { panic!("no counter") }), None));
        assert_eq!(task.as_mut().poll(&mut cx), Poll::Ready(()));
    }
}
