//! hyper's HTTP/1 header-read timeout on one tokio timer per connection.
//!
//! hyper arms its header-read timeout (`header_read_timeout`, the slow-header defence) anew for
//! every request head: a `Timer::sleep_until` for the new deadline, dropped once the head is
//! read. With hyper_util's `TokioTimer` each is a new tokio `Sleep`, which a keep-alive
//! connection files in the runtime's timer wheel while it waits for its next request and takes
//! out again when the request comes: ~800 instructions a request (`loadtest/instructions.sh`,
//! ~3 % of a cache hit's). A [`HeadTimer`] (one per connection) keeps one tokio `Sleep` for its
//! connection: each head's deadline moves that timer later, which tokio does with one atomic
//! exchange while the timer is filed (the wheel re-files it when the earlier deadline comes).
//!
//! Between heads (while a guest runs, say) the connection's timer may still ring at the last
//! head's deadline: it wakes the connection's task once, which finds nothing to do.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::rt::{Sleep, Timer};

/// One connection's timer, shared by the sleeps of its heads.
type Shared = Arc<Mutex<Option<Pin<Box<tokio::time::Sleep>>>>>;

/// The header-read timer of one HTTP/1 connection (each connection needs its own: it reads
/// one head at a time, so one timer serves every head).
#[derive(Default)]
pub(super) struct HeadTimer(Shared);

impl Timer for HeadTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Sleep>> {
        self.sleep_until(Instant::now() + duration)
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn Sleep>> {
        Box::pin(HeadSleep {
            timer: self.0.clone(),
            deadline: tokio::time::Instant::from_std(deadline),
        })
    }
}

/// One head's deadline, on its connection's timer.
struct HeadSleep {
    timer: Shared,
    deadline: tokio::time::Instant,
}

impl Future for HeadSleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let deadline = self.deadline;
        let mut timer = self.timer.lock().unwrap_or_else(PoisonError::into_inner);
        let sleep = timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        // A later head's deadline: the timer moved (the last one it rang for, or the one before
        // it was still waiting for).
        if sleep.deadline() != deadline {
            sleep.as_mut().reset(deadline);
        }
        sleep.as_mut().poll(cx)
    }
}

impl Sleep for HeadSleep {}

#[cfg(test)]
mod tests {
    use super::*;

    fn after(ms: u64) -> Instant {
        Instant::now() + Duration::from_millis(ms)
    }

    fn poll_once(s: &mut Pin<Box<dyn Sleep>>) -> Poll<()> {
        s.as_mut()
            .poll(&mut Context::from_waker(std::task::Waker::noop()))
    }

    /// Each head's sleep rings at its own deadline, never before: after the timer rang for an
    /// earlier head, and after an earlier head's sleep was dropped before its deadline.
    #[tokio::test]
    async fn each_head_rings_at_its_own_deadline() {
        let timer = HeadTimer::default();
        let first = after(50);
        timer.sleep_until(first).await;
        assert!(Instant::now() >= first);
        // The timer rang: a second head's sleep waits for its own deadline.
        let second = after(200);
        let mut sleep = timer.sleep_until(second);
        assert!(
            poll_once(&mut sleep).is_pending(),
            "rang at the first head's deadline"
        );
        sleep.await;
        assert!(Instant::now() >= second);
        // A head read in time (its sleep dropped), then the next head's: the later deadline.
        let mut read = timer.sleep_until(after(50));
        assert!(poll_once(&mut read).is_pending());
        drop(read);
        let fourth = after(300);
        timer.sleep_until(fourth).await;
        assert!(
            Instant::now() >= fourth,
            "rang at the dropped head's deadline"
        );
    }
}
