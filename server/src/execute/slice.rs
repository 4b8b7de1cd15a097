//! Time slicing: when a running guest yields its worker to the other requests.
//!
//! The epoch ticker interrupts a running guest every [`crate::engine::EPOCH_TICK`], and the
//! store's epoch callback asks [`Slicing::yields`] whether it yields there. A guest's first
//! slice lasts until it has used [`FIRST_SLICE_CPU`] of CPU after the first tick it meets, so
//! an ordinary request of a heavy guest (a Python `hello`: about 1 ms of CPU) ends in one turn;
//! past it the guest is CPU-bound and yields at every tick, so other tenants' requests wait at
//! most a tick behind it.
//!
//! Why CPU time and not ticks: each yield sends a guest behind every other connection's task.
//! With a first slice of 0.5-1 ms of wall time most Python requests yielded once or more and
//! took 2.5x the p50 at p99 (64 connections, one worker); with 1-1.5 ms a tenth still did, and
//! crawled through the short turns after it (p99 4-5x). Counted in ticks the slice also shrank
//! whenever the kernel ran another thread on the worker's core (the load generator on a shared
//! machine), so a slice long enough on a quiet core was too short on a busy one.
//!
//! `unsafe`: one `libc::clock_gettime` call on a local struct.
#![allow(unsafe_code)]

use std::thread::ThreadId;
use std::time::Duration;

/// CPU time a guest uses after the first epoch tick it meets before its first yield. With the
/// time before that tick (up to one tick) its first slice is 1.5-2 ms of CPU.
pub const FIRST_SLICE_CPU: Duration = Duration::from_micros(1500);

/// One guest's time slicing.
#[derive(Debug, Default)]
pub struct Slicing {
    /// The thread the first tick found the guest on, and its CPU time then.
    first_tick: Option<(ThreadId, Duration)>,
    /// Whether the first slice is used up: the guest yields at every tick.
    past_first_slice: bool,
}

impl Slicing {
    /// Whether the guest yields at this epoch tick. `clock` tells the thread the guest runs on
    /// and that thread's CPU time (`None`: no clock, which ends the first slice at once); it is
    /// asked only during the first slice. A guest that moved to another worker thread while
    /// suspended in a host call (the `shared` runtime) starts counting again there: two
    /// threads' CPU times do not compare.
    pub fn yields(&mut self, clock: impl FnOnce() -> Option<(ThreadId, Duration)>) -> bool {
        if self.past_first_slice {
            return true;
        }
        let Some((thread, now)) = clock() else {
            self.past_first_slice = true;
            return true;
        };
        match self.first_tick {
            Some((on, at)) if on == thread => {
                self.past_first_slice = now.saturating_sub(at) >= FIRST_SLICE_CPU;
                self.past_first_slice
            }
            _ => {
                self.first_tick = Some((thread, now));
                false
            }
        }
    }
}

/// The calling thread and the CPU time it has used (`CLOCK_THREAD_CPUTIME_ID`), or `None` if
/// that clock cannot be read.
pub fn thread_clock() -> Option<(ThreadId, Duration)> {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `clock_gettime` writes the two fields of a struct we own.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &raw mut t) } != 0 {
        return None;
    }
    let cpu = Duration::new(
        u64::try_from(t.tv_sec).ok()?,
        u32::try_from(t.tv_nsec).ok()?,
    );
    Some((std::thread::current().id(), cpu))
}

#[cfg(test)]
mod tests {
    use super::{FIRST_SLICE_CPU, Slicing, thread_clock};
    use std::time::Duration;

    fn ms(n: f64) -> Duration {
        Duration::from_secs_f64(n / 1e3)
    }

    #[test]
    fn the_first_slice_ends_after_its_cpu_time_then_every_tick_yields() {
        let me = std::thread::current().id();
        let mut s = Slicing::default();
        assert!(
            !s.yields(|| Some((me, ms(10.0)))),
            "the first tick starts the count"
        );
        assert!(
            !s.yields(|| Some((me, ms(10.0) + FIRST_SLICE_CPU - ms(0.001)))),
            "limit - 1 µs"
        );
        assert!(
            s.yields(|| Some((me, ms(10.0) + FIRST_SLICE_CPU))),
            "at the limit"
        );
        let mut beyond = Slicing::default();
        beyond.yields(|| Some((me, ms(10.0))));
        assert!(
            beyond.yields(|| Some((me, ms(10.0) + FIRST_SLICE_CPU + ms(0.001)))),
            "limit + 1 µs"
        );
        for _ in 0..100 {
            assert!(
                s.yields(|| panic!("no clock read past the first slice")),
                "past the first slice every tick yields"
            );
        }
    }

    #[test]
    fn a_slow_tick_does_not_end_the_first_slice_without_cpu_used() {
        // However many ticks pass while the thread runs others (a preempted worker), only the
        // guest's thread's CPU time ends the first slice.
        let me = std::thread::current().id();
        let mut s = Slicing::default();
        assert!(!s.yields(|| Some((me, ms(5.0)))));
        for _ in 0..50 {
            assert!(!s.yields(|| Some((me, ms(5.5)))), "0.5 ms used of 1.5");
        }
        assert!(s.yields(|| Some((me, ms(6.5)))));
    }

    #[test]
    fn a_guest_moved_to_another_thread_counts_again_there() {
        let me = std::thread::current().id();
        let other = std::thread::spawn(|| std::thread::current().id())
            .join()
            .unwrap();
        let mut s = Slicing::default();
        assert!(!s.yields(|| Some((me, ms(100.0)))));
        // The other thread's clock is far behind: neither a negative difference nor the
        // first thread's baseline may keep the guest running forever.
        assert!(
            !s.yields(|| Some((other, ms(1.0)))),
            "a new baseline on the new thread"
        );
        assert!(!s.yields(|| Some((other, ms(2.0)))));
        assert!(s.yields(|| Some((other, ms(2.5)))));
    }

    #[test]
    fn without_a_clock_every_tick_yields() {
        let me = std::thread::current().id();
        let mut s = Slicing::default();
        assert!(
            s.yields(|| None),
            "an unreadable clock ends the first slice"
        );
        assert!(s.yields(|| Some((me, ms(1.0)))));
    }

    #[test]
    fn the_threads_cpu_clock_advances_with_work() {
        let cpu = || thread_clock().expect("the thread's CPU clock").1;
        let before = cpu();
        let mut x = 0u64;
        while cpu() - before < ms(2.0) {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        assert!(x > 0 && cpu() > before);
        assert_eq!(
            thread_clock().map(|(on, _)| on),
            Some(std::thread::current().id()),
            "the clock names the calling thread"
        );
    }
}
