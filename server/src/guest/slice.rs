//! Time slicing: when a running guest yields its worker to the other requests.
//!
//! The epoch ticker interrupts a running guest every [`crate::engine::EPOCH_TICK`], and the
//! store's epoch callback asks [`Slicing::tick`] whether it yields there. How long a guest runs
//! before its first yield depends on its tenant's [`Habit`]:
//!
//! - **long first slice**, for a tenant whose requests end within it: the guest runs until it
//!   has used [`FIRST_SLICE_CPU`] of CPU after the first tick it meets, so an ordinary request
//!   of a heavy guest (a Python `hello`: 1-1.5 ms of CPU, by the machine) ends in one turn;
//! - **short first slice**, for a tenant whose requests keep using the long one up (a guest
//!   computing for 20 ms gains nothing from 2.5 ms without a yield, and every other tenant's
//!   request that arrives then waits for it): the guest yields at the second tick it meets.
//!
//! Once a guest has used [`FIRST_SLICE_CPU`] it runs in turns: with a short first slice it
//! yields at every tick (turns of 0-0.5 ms: other requests wait at most a tick behind a
//! CPU-bound tenant's), with a long one at the second tick of each turn (0.5-1 ms: the few
//! requests of a mostly quick tenant that run past their first slice do not crawl behind every
//! other connection through turns that can be a few microseconds long; with 64 connections
//! sharing the cores with the load generator Python's p99 was 4-6x its p50 with turns of a tick
//! and 1.3-1.4x with two). Each request that meets a tick tells its tenant's
//! habit whether it used the long slice up (it counts its CPU in either mode; in the short one
//! from each resumption to the next tick); requests that meet no tick (`hello`) touch nothing.
//!
//! Why CPU time and not ticks: each yield sends a guest behind every other connection's task.
//! With a first slice of 0.5-1 ms of wall time most Python requests yielded once or more and
//! took 2.5x the p50 at p99 (64 connections, one worker); with 1-1.5 ms a tenth still did, and
//! crawled through the short turns after it (p99 4-5x). Counted in ticks the slice also shrank
//! whenever the kernel ran another thread on the worker's core (the load generator on a shared
//! machine), so a slice long enough on a quiet core was too short on a busy one. With 1.5 ms of
//! CPU after the first tick, on a machine where a Python component's request took about that
//! much, 2-38 % of them were cut at 64 connections (10-31 % at one), and each cut one waited
//! behind the other 63 (p99 2.6-5.9x the p50); with 2 ms, 0.2-0.5 % (p99 1.5-1.6x; an asyncio
//! one using about 2.5 ms is still cut at times), while a 20 ms tenant's neighbours saw no
//! change (`loadtest/README.md`, "Python's tail on a slower machine").
//!
//! While a guest that yielded waits for its worker, its tenant's next requests on that worker
//! wait in line behind it ([`crate::execute::turn`]), so the wait after a yield is for the
//! guests already running, not for a slice of every request that arrived meanwhile.
//!
//! `unsafe`: one `libc::clock_gettime` call on a local struct.
#![allow(unsafe_code)]

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::ThreadId;
use std::time::Duration;

/// CPU time a guest uses after the first epoch tick it meets before its first slice is used up
/// (then it runs in turns). With the time before that tick (up to one tick) a long first slice
/// is 2-2.5 ms of CPU.
pub const FIRST_SLICE_CPU: Duration = Duration::from_micros(2000);

/// A thread and its CPU time then.
type Mark = (ThreadId, Duration);

/// How one guest's run is sliced, and what it used of its first slice.
#[derive(Debug)]
pub struct Slicing {
    /// Whether this guest's first slice is long (its tenant's habit when it began).
    long: bool,
    /// Whether it met a tick.
    ticked: bool,
    /// Ticks met since it last resumed (or began).
    turn_ticks: u8,
    /// Where its first slice stands.
    first: First,
    /// CPU counted since the first tick it met.
    used: Duration,
    /// Where the stretch being counted began (`None` while none is: a yield's future sets
    /// the next one when the guest resumes).
    mark: Option<Mark>,
    /// Where a yield's future leaves the clock when the guest resumes; made at the first
    /// yield while the first slice is being counted.
    resumed: Option<Arc<Mutex<Option<Mark>>>>,
}

impl Default for Slicing {
    /// A long first slice, as a new tenant's requests get.
    fn default() -> Self {
        Self::new(true)
    }
}

/// Where a guest's first slice stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum First {
    /// Being counted.
    Counting,
    /// Used up ([`FIRST_SLICE_CPU`]): the guest yields at the second tick of each turn with a
    /// long first slice (turns of 0.5-1 ms), at every tick with a short one (0-0.5 ms); no
    /// clock is read.
    Spent,
    /// The clock could not be read: the guest yields at every tick and tells its tenant
    /// nothing.
    Unknown,
}

impl Slicing {
    /// A guest's slicing, with a long first slice or a short one.
    pub fn new(long: bool) -> Self {
        Self {
            long,
            ticked: false,
            turn_ticks: 0,
            first: First::Counting,
            used: Duration::ZERO,
            mark: None,
            resumed: None,
        }
    }

    /// Whether the guest yields at this epoch tick. `clock` tells the thread the guest runs on
    /// and that thread's CPU time (`None`: no clock, which ends the first slice at once); it is
    /// asked only while the first slice is counted. CPU is counted between two ticks, or
    /// between a resumption and the next tick, on one thread: a guest that moved to another
    /// worker thread while suspended (the `shared` runtime) counts on from there, and the time
    /// the thread spent on others while the guest waited is not the guest's.
    pub fn tick(&mut self, clock: impl FnOnce() -> Option<Mark>) -> bool {
        let first_tick = !self.ticked;
        self.ticked = true;
        self.turn_ticks = self.turn_ticks.saturating_add(1);
        let yields = self.decide(first_tick, clock);
        if yields {
            self.turn_ticks = 0;
        }
        yields
    }

    /// [`Slicing::tick`]'s answer.
    fn decide(&mut self, first_tick: bool, clock: impl FnOnce() -> Option<Mark>) -> bool {
        match self.first {
            First::Spent => return !self.long || self.turn_ticks >= 2,
            First::Unknown => return true,
            First::Counting => {}
        }
        if let Some(resumed) = self.resumed.as_ref().and_then(take) {
            self.mark = Some(resumed);
        }
        let Some((thread, now)) = clock() else {
            self.first = First::Unknown;
            return true;
        };
        if let Some((on, at)) = self.mark
            && on == thread
        {
            self.used += now.saturating_sub(at);
        }
        if self.used >= FIRST_SLICE_CPU {
            self.first = First::Spent;
            return true;
        }
        let yields = !self.long && !first_tick;
        self.mark = (!yields).then_some((thread, now));
        yields
    }

    /// What the guest awaits when [`Slicing::tick`] says it yields: tokio's `yield_now`, which
    /// lets the runtime poll its sockets before the guest resumes (a plain wake-and-pending
    /// requeues it at once, and the runtime checks for I/O only every 61 task polls). While the
    /// first slice is counted it also marks the thread's clock when the guest resumes.
    pub fn pause(&mut self) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        if self.first != First::Counting {
            return Box::pin(yield_slice());
        }
        let slot = Arc::clone(self.resumed.get_or_insert_with(Default::default));
        Box::pin(async move {
            yield_slice().await;
            *slot.lock().unwrap_or_else(PoisonError::into_inner) = thread_clock();
        })
    }

    /// Whether the run used its first slice up (and so ran on in turns): what
    /// `tern_guest_sliced_total` counts. A run that met no tick, ended within its slice, or had
    /// no clock is not.
    pub fn cut(&self) -> bool {
        self.used_up() == Some(true)
    }

    /// What the run tells its tenant: `Some(true)` if it used its first slice up, `Some(false)`
    /// if it met a tick and ended within it, `None` if it met no tick or had no clock.
    pub fn used_up(&self) -> Option<bool> {
        match self.first {
            _ if !self.ticked => None,
            First::Counting => Some(false),
            First::Spent => Some(true),
            First::Unknown => None,
        }
    }
}

thread_local! {
    /// Set when a guest polled on this thread yields its slice.
    static YIELDED: Cell<bool> = const { Cell::new(false) };
}

/// Whether a guest polled on this thread yielded its slice since the last call (clearing it):
/// from then on the guest is ready to run and waits for its worker. tokio wakes a yielded task
/// only when the worker next checks its sockets, after the tasks queued before it, so the
/// wake does not tell when the wait began.
pub fn take_yield() -> bool {
    YIELDED.replace(false)
}

/// tokio's `yield_now`, noted for [`take_yield`].
async fn yield_slice() {
    YIELDED.set(true);
    tokio::task::yield_now().await;
}

/// Takes the mark a yield's future left.
fn take(slot: &Arc<Mutex<Option<Mark>>>) -> Option<Mark> {
    slot.lock().unwrap_or_else(PoisonError::into_inner).take()
}

/// A tenant's recent use of the first slice: a score raised by each request that used its
/// first slice up and lowered by each that met a tick and ended within it. Requests begin
/// with a long first slice while the score is below [`Habit::SHORT_FROM`]; a new tenant (and
/// each new version) starts at zero. A relaxed load per request; only requests that met a
/// tick and change the score write.
#[derive(Debug, Default)]
pub struct Habit(AtomicU8);

impl Habit {
    /// The highest score: a tenant that used the slice up this often needs as many requests
    /// ending within it, net, to get the long slice back.
    pub const MAX: u8 = 8;
    /// From this score on, requests begin with a short first slice.
    pub const SHORT_FROM: u8 = 4;

    /// Whether a request beginning now gets a long first slice.
    pub fn long_first_slice(&self) -> bool {
        self.0.load(Ordering::Relaxed) < Self::SHORT_FROM
    }

    /// Takes in how a run used its first slice.
    pub fn record(&self, slicing: &Slicing) {
        let Some(used_up) = slicing.used_up() else {
            return;
        };
        // Most requests that meet a tick end within their slice, of a tenant at zero: no write
        // (with two workers the line would pass between their cores at every request).
        let unchanged = if used_up { Self::MAX } else { 0 };
        if self.0.load(Ordering::Relaxed) == unchanged {
            return;
        }
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |score| {
                Some(if used_up {
                    (score + 1).min(Self::MAX)
                } else {
                    score.saturating_sub(1)
                })
            });
    }

    /// The current score.
    #[cfg(test)]
    fn score(&self) -> u8 {
        self.0.load(Ordering::Relaxed)
    }
}

/// The calling thread and the CPU time it has used (`CLOCK_THREAD_CPUTIME_ID`), or `None` if
/// that clock cannot be read.
pub fn thread_clock() -> Option<Mark> {
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
    use super::{FIRST_SLICE_CPU, Habit, Mark, Slicing, thread_clock};
    use std::time::Duration;

    fn ms(n: f64) -> Duration {
        Duration::from_secs_f64(n / 1e3)
    }

    fn me() -> std::thread::ThreadId {
        std::thread::current().id()
    }

    /// What a yield's future leaves when the guest resumes.
    fn resume(s: &mut Slicing, at: Mark) {
        *s.resumed
            .get_or_insert_with(Default::default)
            .lock()
            .unwrap() = Some(at);
    }

    #[test]
    fn a_long_first_slice_ends_after_its_cpu_time_then_every_tick_yields() {
        let me = me();
        let mut s = Slicing::new(true);
        assert_eq!(s.used_up(), None, "no tick met yet");
        assert!(
            !s.tick(|| Some((me, ms(10.0)))),
            "the first tick starts the count"
        );
        assert!(
            !s.tick(|| Some((me, ms(10.0) + FIRST_SLICE_CPU - ms(0.001)))),
            "limit - 1 µs"
        );
        assert_eq!(s.used_up(), Some(false), "met a tick, still within");
        assert!(
            s.tick(|| Some((me, ms(10.0) + FIRST_SLICE_CPU))),
            "at the limit"
        );
        assert_eq!(s.used_up(), Some(true));
        let mut beyond = Slicing::new(true);
        beyond.tick(|| Some((me, ms(10.0))));
        assert!(
            beyond.tick(|| Some((me, ms(10.0) + FIRST_SLICE_CPU + ms(0.001)))),
            "limit + 1 µs"
        );
        for _ in 0..100 {
            assert!(
                !s.tick(|| panic!("no clock read past the first slice")),
                "a turn's first tick"
            );
            assert!(
                s.tick(|| panic!("no clock read past the first slice")),
                "past a long first slice a turn ends at its second tick"
            );
        }
    }

    #[test]
    fn a_slow_tick_does_not_end_the_first_slice_without_cpu_used() {
        // However many ticks pass while the thread runs others (a preempted worker), only the
        // guest's thread's CPU time ends the first slice.
        let me = me();
        let mut s = Slicing::new(true);
        assert!(!s.tick(|| Some((me, ms(5.0)))));
        for _ in 0..50 {
            assert!(!s.tick(|| Some((me, ms(5.5)))), "0.5 ms used of 2");
        }
        assert!(s.tick(|| Some((me, ms(5.0) + FIRST_SLICE_CPU))));
    }

    #[test]
    fn a_guest_moved_to_another_thread_counts_on_there() {
        let me = me();
        let other = std::thread::spawn(|| std::thread::current().id())
            .join()
            .unwrap();
        let mut s = Slicing::new(true);
        assert!(!s.tick(|| Some((me, ms(100.0)))));
        assert!(!s.tick(|| Some((me, ms(101.0)))), "1 ms counted");
        // The other thread's clock is far behind: neither a negative difference nor the
        // first thread's baseline may count; what was counted stays.
        assert!(
            !s.tick(|| Some((other, ms(1.0)))),
            "a new baseline on the new thread"
        );
        let rest = FIRST_SLICE_CPU - ms(1.0);
        assert!(
            !s.tick(|| Some((other, ms(1.0) + rest - ms(0.001)))),
            "limit - 1 µs counted"
        );
        assert!(
            s.tick(|| Some((other, ms(1.0) + rest))),
            "the limit counted"
        );
    }

    #[test]
    fn a_short_first_slice_yields_at_the_second_tick_and_counts_only_its_turns() {
        let me = me();
        let mut s = Slicing::new(false);
        assert!(
            !s.tick(|| Some((me, ms(10.0)))),
            "the first tick: a turn's start"
        );
        assert!(s.tick(|| Some((me, ms(10.5)))), "the second tick yields");
        // While the guest waits its thread runs others for 20 ms: not the guest's.
        resume(&mut s, (me, ms(30.5)));
        assert!(s.tick(|| Some((me, ms(30.9)))), "0.9 ms counted, yields");
        assert_eq!(s.used_up(), Some(false));
        // A turn that resumed on another thread and ticked on this one counts nothing.
        let other = std::thread::spawn(|| std::thread::current().id())
            .join()
            .unwrap();
        resume(&mut s, (other, ms(3.0)));
        assert!(s.tick(|| Some((me, ms(50.0)))));
        assert_eq!(s.used_up(), Some(false), "still 0.9 ms");
        resume(&mut s, (me, ms(60.0)));
        assert!(
            s.tick(|| Some((me, ms(60.0) + FIRST_SLICE_CPU - ms(0.9) - ms(0.001)))),
            "limit - 1 µs"
        );
        assert_eq!(s.used_up(), Some(false));
        resume(&mut s, (me, ms(70.0)));
        assert!(s.tick(|| Some((me, ms(70.001)))), "at the limit");
        assert_eq!(s.used_up(), Some(true));
        for _ in 0..100 {
            assert!(
                s.tick(|| panic!("no clock read past the first slice")),
                "past a short first slice every tick yields"
            );
        }
    }

    #[test]
    fn a_yield_marks_the_clock_when_the_guest_resumes() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut s = Slicing::new(false);
        s.tick(thread_clock);
        assert!(s.tick(thread_clock));
        assert!(
            s.mark.is_none(),
            "no stretch is counted while the guest waits"
        );
        let before = thread_clock().unwrap().1;
        rt.block_on(s.pause());
        let (on, at) = super::take(s.resumed.as_ref().unwrap()).expect("a mark at resumption");
        assert_eq!(on, me());
        assert!(at >= before);
        // Past the first slice a yield marks nothing.
        let mut spent = Slicing::new(true);
        spent.tick(|| None);
        rt.block_on(spent.pause());
        assert!(spent.resumed.is_none());
    }

    #[test]
    fn only_a_run_that_used_its_first_slice_up_is_cut() {
        let me = me();
        assert!(!Slicing::new(true).cut(), "no tick met");
        let mut within = Slicing::new(true);
        within.tick(|| Some((me, ms(0.0))));
        within.tick(|| Some((me, FIRST_SLICE_CPU - ms(0.001))));
        assert_eq!(within.used_up(), Some(false));
        assert!(
            !within.cut(),
            "met ticks, ended within its slice (limit - 1 µs)"
        );
        let mut spent = Slicing::new(true);
        spent.tick(|| Some((me, ms(0.0))));
        spent.tick(|| Some((me, FIRST_SLICE_CPU)));
        assert!(spent.cut(), "used it up (the limit)");
        let mut short = Slicing::new(false);
        short.tick(|| Some((me, ms(0.0))));
        assert!(short.tick(|| Some((me, ms(0.5)))), "a short slice yields");
        assert!(!short.cut(), "yielded, but 0.5 ms is within the slice");
        let mut unknown = Slicing::new(true);
        unknown.tick(|| None);
        assert!(!unknown.cut(), "no clock");
    }

    #[test]
    fn without_a_clock_every_tick_yields_and_the_tenant_learns_nothing() {
        let me = me();
        let mut s = Slicing::new(true);
        assert!(s.tick(|| None), "an unreadable clock ends the first slice");
        for _ in 0..10 {
            assert!(s.tick(|| Some((me, ms(1.0)))), "and every tick yields");
        }
        assert_eq!(s.used_up(), None);
        let habit = Habit::default();
        habit.record(&s);
        assert_eq!(habit.score(), 0);
    }

    #[test]
    fn a_tenant_whose_requests_use_the_first_slice_up_gets_short_ones_until_they_fit() {
        let me = me();
        let spent = {
            let mut s = Slicing::new(true);
            s.tick(|| Some((me, ms(0.0))));
            s.tick(|| Some((me, FIRST_SLICE_CPU)));
            s
        };
        let fits = {
            let mut s = Slicing::new(true);
            s.tick(|| Some((me, ms(0.0))));
            s
        };
        let untouched = Slicing::new(true);
        let habit = Habit::default();
        assert!(habit.long_first_slice(), "a new tenant starts long");
        for _ in 0..100 {
            habit.record(&untouched);
            habit.record(&fits);
        }
        assert_eq!(
            habit.score(),
            0,
            "requests that fit or met no tick keep it at zero"
        );
        for n in 1..Habit::SHORT_FROM {
            habit.record(&spent);
            assert!(habit.long_first_slice(), "{n} used up: limit - 1");
        }
        habit.record(&spent);
        assert!(!habit.long_first_slice(), "at the limit");
        habit.record(&spent);
        assert!(!habit.long_first_slice(), "limit + 1");
        for _ in 0..100 {
            habit.record(&spent);
        }
        assert_eq!(habit.score(), Habit::MAX, "the score saturates");
        for n in 1..=Habit::MAX - Habit::SHORT_FROM {
            habit.record(&fits);
            assert!(
                !habit.long_first_slice(),
                "{n} fitted of {}",
                Habit::MAX - Habit::SHORT_FROM + 1
            );
        }
        habit.record(&fits);
        assert!(habit.long_first_slice(), "back to long");
        for _ in 0..100 {
            habit.record(&fits);
        }
        assert_eq!(habit.score(), 0);
    }

    #[test]
    fn the_threads_cpu_clock_advances_with_work() {
        let cpu = || thread_clock().expect("the thread's CPU clock").1;
        // Busy for 20 ms of wall time (bounded by the wall clock, so a stuck CPU clock fails
        // the assertion below instead of hanging the test).
        let (before, started) = (cpu(), std::time::Instant::now());
        let mut x = 0u64;
        while started.elapsed() < ms(20.0) {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        let (used, wall) = (cpu() - before, started.elapsed());
        assert!(x > 0);
        assert!(used > Duration::ZERO, "the thread's CPU clock did not move");
        assert!(
            used <= wall + ms(1.0),
            "one thread cannot use more CPU than wall time: {used:?} in {wall:?}"
        );
        assert_eq!(
            thread_clock().map(|(on, _)| on),
            Some(std::thread::current().id()),
            "the clock names the calling thread"
        );
    }
}
