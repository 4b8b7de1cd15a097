//! A guest's time limit, counted in the guest's own time.
//!
//! `limits.timeout_ms` bounds how long a guest takes: its instantiation, its handler, and what
//! it waits for (backends, stores, the client's body, a client slow to read a streamed answer).
//! It does not count the time the guest was **ready to run but waited for its worker thread**,
//! busy with other requests: after a time-slice yield or a wake-up, a guest waits behind every
//! other runnable guest of that worker, and under load that wait is the server's, not the
//! guest's. Counted in wall time, 4 of 3,110 requests of a Python tenant needing ~2.3 ms of CPU
//! each ended `504` "guest exceeded its time limit (1000 ms)" with 64 of them interleaved on
//! one worker.
//!
//! The wait is measured around each poll of the guest's future: from the end of a poll in
//! which the guest yielded its time slice ([`slice::take_yield`]), or else from the first wake
//! of the waker it is polled with (or the poll's end, for a wake during the poll), to the next
//! poll. It is the
//! `ready` phase (`Server-Timing`, `tern_phase_duration_seconds{phase="ready"}`): a worker
//! too busy for its guests shows there first.
//!
//! A bound in wall time still holds, [`WALL_FACTOR`] times the limit: a server so busy that a
//! guest within its own limit cannot finish by then answers `503` (the server's overload), so
//! no request lives forever.

use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use super::turn::Hold;
use crate::guest::slice;

/// The bound in wall time, as a multiple of the guest's own limit.
pub const WALL_FACTOR: u32 = 4;

/// Why a run was cut off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expired {
    /// The guest used its own time up.
    Guest,
    /// The wall-time bound passed first: the guest spent most of it waiting for a busy worker.
    Server,
}

/// A run within its limit: how it ended, and how long it was ready but waited for its worker.
#[derive(Debug)]
pub struct Timed<T> {
    /// The run's output, or why it was cut off.
    pub ended: Result<T, Expired>,
    /// Time ready to run, waiting for the worker.
    pub ready: Duration,
}

/// Runs `run`, begun at `start` (its caller's reading of the clock), until it ends, its own
/// time passes `limit`, or the wall time passes [`WALL_FACTOR`] × `limit`; `hold` is told
/// after each poll whether the guest yielded its slice ([`super::turn`]: its tenant's line).
/// The clock is read only where a wait is measured: not before a poll nobody woke for, and
/// not after the poll it ends in.
///
/// (`run` is pinned by the caller: taken by value, a guest's call future — kilobytes — would
/// be held twice in this one, once as the argument and once pinned, and every request's
/// future boxed around it would copy both.)
pub async fn within<F: Future>(
    start: Instant,
    limit: Duration,
    mut run: Pin<&mut F>,
    mut hold: Hold,
) -> Timed<F::Output> {
    let wall_end = start + limit * WALL_FACTOR;
    let wakes = Arc::new(Wakes::new(start));
    let waker = Waker::from(Arc::clone(&wakes));
    let mut alarm = pin!(tokio::time::sleep_until((start + limit).into()));
    let mut ready = Duration::ZERO;
    let ended = poll_fn(|cx| {
        ready += wakes.waited(Instant::now);
        wakes.forward_to(cx.waker());
        let mut inner = Context::from_waker(&waker);
        slice::take_yield();
        if let Poll::Ready(out) = run.as_mut().poll(&mut inner) {
            return Poll::Ready(Ok(out));
        }
        let now = Instant::now();
        let yielded = slice::take_yield();
        wakes.polled(now, yielded);
        hold.pending(yielded);
        // The alarm rings at the earliest moment the limit could be passed; then it is moved
        // on by the time spent ready since.
        while alarm.as_mut().poll(&mut inner).is_ready() {
            let now = Instant::now();
            let own = now.saturating_duration_since(start).saturating_sub(ready);
            if own >= limit {
                return Poll::Ready(Err(Expired::Guest));
            }
            if now >= wall_end {
                return Poll::Ready(Err(Expired::Server));
            }
            let next = (now + (limit - own)).min(wall_end);
            alarm.as_mut().reset(next.into());
        }
        Poll::Pending
    })
    .await;
    Timed { ended, ready }
}

/// The waker a run is polled with: it notes when the run was first woken since its last poll,
/// and wakes the task polling it.
struct Wakes {
    /// Times are kept as nanoseconds since this instant.
    base: Instant,
    /// When the run was first woken since its last poll began (`0`: not woken).
    woken: AtomicU64,
    /// When its last poll ended.
    polled: AtomicU64,
    /// The waker of the task polling the run.
    task: Mutex<Option<Waker>>,
}

impl Wakes {
    fn new(base: Instant) -> Self {
        Self {
            base,
            woken: AtomicU64::new(0),
            polled: AtomicU64::new(0),
            task: Mutex::new(None),
        }
    }

    /// `at` in nanoseconds since `base`, never `0`.
    fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_nanos())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// At a poll beginning `now` (read only if the run was woken): how long the run was
    /// ready before it (from its wake, or the end of the poll it was woken during), zero if
    /// it was not woken.
    fn waited(&self, now: impl FnOnce() -> Instant) -> Duration {
        let woken = self.woken.swap(0, Ordering::AcqRel);
        if woken == 0 {
            return Duration::ZERO;
        }
        let from = woken.max(self.polled.load(Ordering::Acquire));
        Duration::from_nanos(self.nanos(now()).saturating_sub(from))
    }

    /// Notes that a poll ended at `now`, and whether the run yielded its slice then (it is
    /// ready from then on, whenever its wake comes).
    fn polled(&self, now: Instant, yielded: bool) {
        let now = self.nanos(now);
        self.polled.store(now, Ordering::Release);
        if yielded {
            let _ = self
                .woken
                .compare_exchange(0, now, Ordering::AcqRel, Ordering::Relaxed);
        }
    }

    /// Wakes go to `task` from now on (a run that streams moves to a task of its own).
    fn forward_to(&self, task: &Waker) {
        let mut held = self.task.lock().unwrap_or_else(PoisonError::into_inner);
        if !held.as_ref().is_some_and(|w| w.will_wake(task)) {
            *held = Some(task.clone());
        }
    }
}

impl Wake for Wakes {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let now = self.nanos(Instant::now());
        // The first wake since the last poll counts; later ones change nothing.
        let _ = self
            .woken
            .compare_exchange(0, now, Ordering::AcqRel, Ordering::Relaxed);
        let task = self.task.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(task) = task.as_ref() {
            task.wake_by_ref();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A future that computes for `busy` of CPU in slices of `slice`, yielding between them.
    async fn compute(busy: Duration, slice: Duration) {
        for _ in 0..busy.as_micros() / slice.as_micros() {
            let end = Instant::now() + slice;
            while Instant::now() < end {
                std::hint::spin_loop();
            }
            slice::Slicing::new(false).pause().await;
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn time_behind_other_tasks_is_not_the_guests() {
        // Eight tasks share one thread, each computing 60 ms in 1 ms slices: each takes about
        // 480 ms of wall time, over a limit of 300 ms, but only ~60 ms of its own.
        let runs: Vec<_> = (0..8)
            .map(|_| {
                tokio::spawn(async {
                    within(
                        Instant::now(),
                        Duration::from_millis(300),
                        pin!(compute(Duration::from_millis(60), Duration::from_millis(1))),
                        Hold::none(),
                    )
                    .await
                })
            })
            .collect();
        for run in runs {
            let timed = run.await.unwrap();
            assert_eq!(timed.ended, Ok(()));
            assert!(
                timed.ready > Duration::from_millis(100),
                "{:?}",
                timed.ready
            );
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_guest_over_its_own_time_is_cut_off() {
        let started = Instant::now();
        let timed = within(
            started,
            Duration::from_millis(50),
            pin!(compute(Duration::from_secs(5), Duration::from_millis(1))),
            Hold::none(),
        )
        .await;
        assert_eq!(timed.ended, Err(Expired::Guest));
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_limit_counts_from_the_start_the_caller_gives() {
        // Begun three seconds ago with a two-second limit: over at its first poll (a run
        // timed from its own first poll would wait two seconds).
        let limit = Duration::from_secs(2);
        let Some(start) = Instant::now().checked_sub(Duration::from_secs(3)) else {
            return;
        };
        let polled = Instant::now();
        let timed = within(
            start,
            limit,
            pin!(std::future::pending::<()>()),
            Hold::none(),
        )
        .await;
        assert_eq!(timed.ended, Err(Expired::Guest));
        assert!(
            polled.elapsed() < Duration::from_secs(1),
            "{:?}",
            polled.elapsed()
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn waiting_on_io_is_the_guests_time() {
        let started = Instant::now();
        let timed = within(
            started,
            Duration::from_millis(50),
            pin!(tokio::time::sleep(Duration::from_secs(5))),
            Hold::none(),
        )
        .await;
        // Cut off by its own time (not the wall bound, 4 x 50 ms): the sleep counted as the
        // guest's, all of the run's wall time but what it was ready for.
        assert_eq!(timed.ended, Err(Expired::Guest));
        let own = started.elapsed().saturating_sub(timed.ready);
        assert!(
            own >= Duration::from_millis(50) && timed.ready < own,
            "own {own:?}, ready {:?}",
            timed.ready
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_wall_bound_holds_when_the_worker_is_always_busy() {
        // Forty tasks computing 100 ms each on one thread: a guest within its own 100 ms
        // limit waits for the others far past 4 x 100 ms of wall time.
        let limit = Duration::from_millis(100);
        let runs: Vec<_> = (0..40)
            .map(|_| {
                tokio::spawn(async move {
                    within(
                        Instant::now(),
                        limit,
                        pin!(compute(Duration::from_millis(90), Duration::from_millis(1))),
                        Hold::none(),
                    )
                    .await
                })
            })
            .collect();
        let mut server = 0;
        for run in runs {
            if run.await.unwrap().ended == Err(Expired::Server) {
                server += 1;
            }
        }
        assert!(server > 0);
    }
}
