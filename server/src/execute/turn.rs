//! A cut guest's turn: while a guest that yielded its time slice waits for its worker, its
//! tenant starts no more guests on that worker.
//!
//! Why: a guest that yields goes to the back of its worker's run queue, behind every request
//! that arrived meanwhile, and each of those starts a guest that runs its own first slice
//! ([`crate::guest::slice`], 2-2.5 ms of CPU). A request needing a little more than a slice
//! (an asyncio Python component's, ~2.5 ms on a slow machine) then waited for a slice of every
//! other connection: with 64 connections on one worker its p99 was 2.6x its p50, where
//! `wasmtime serve`, which does not slice, had 1.3x. With this turn the tenant's requests that
//! arrive while one of its guests is cut wait in line (the `queue` phase, first come first
//! served, bounded by the pool's queue timeout: [`crate::pool::Pool::admit`]) until that guest
//! ends, waits on I/O (a backend, a store, the client: it takes the line again at its next
//! yield), or has had [`GRACE`] turns in all; so a cut guest waits only for the guests already
//! running, and a tenant's requests run to their end one after the other instead of all at
//! once (the same CPU, a shorter wait for each but the last).
//!
//! Other tenants' requests never wait here: a tenant's cut guests hold only its own line.
//! [`GRACE`] bounds the wait behind a long run (a report computing for a second): after it the
//! long run goes on in turns among the tenant's next guests, as without the line.
//!
//! Only on a per-core worker (`[server] runtime = "per-core"`, the default: a current-thread
//! runtime, so a guest never leaves its thread); [`per_worker`] switches it on for the calling
//! thread. On the shared runtime a guest may resume on another thread, and nothing waits.
//!
//! A line per tenant (by its address: a new version is a new tenant) that has a cut guest or a
//! waiting request on this thread; none otherwise, so a request of a tenant whose guests are
//! never cut (most) checks an empty list.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

/// Turns a cut guest holds its tenant's line for after its first yield: with a long first
/// slice its turns are 0.5-1 ms, so a request needing up to ~4-6 ms of CPU in all ends before
/// the tenant's next one begins; with a short one (a CPU-bound tenant's habit) 0-0.5 ms.
pub const GRACE: u8 = 4;

/// One tenant's line on this thread.
#[derive(Default)]
struct Line {
    /// Its guests that yielded and hold the line (ready to run, or running a turn).
    cut: u32,
    /// Requests waiting, by ticket (in order of arrival), with their wakers.
    waiting: VecDeque<(u64, Waker)>,
}

thread_local! {
    /// Whether this thread holds lines (a per-core worker).
    static ON: Cell<bool> = const { Cell::new(false) };
    /// The lines of this thread's tenants that have one; few at a time.
    static LINES: RefCell<Vec<(usize, Line)>> = const { RefCell::new(Vec::new()) };
    /// The next ticket.
    static TICKETS: Cell<u64> = const { Cell::new(0) };
}

/// Switches the lines on for this thread: a per-core worker's, where a guest never moves.
pub fn per_worker() {
    ON.set(true);
}

/// A tenant's key: its address (the guest holding its line keeps it alive).
pub fn key(tenant: &crate::tenant::Tenant) -> usize {
    std::ptr::from_ref(tenant) as usize
}

/// A guest's place in its tenant's line, kept by the run's time limit
/// ([`super::deadline::within`]) and told after each poll that left the guest pending.
#[derive(Debug)]
pub struct Hold {
    /// The tenant's key (`0`: a run that holds no line).
    key: usize,
    /// Yields so far, up to [`GRACE`] + 1.
    yields: u8,
    /// Whether it holds the line now.
    held: bool,
}

impl Hold {
    /// A run of the tenant `key` (see [`key`]).
    pub fn new(key: usize) -> Self {
        Self {
            key,
            yields: 0,
            held: false,
        }
    }

    /// A run that holds no line.
    #[cfg(test)]
    pub fn none() -> Self {
        Self::new(0)
    }

    /// The guest was polled and is pending: it `yielded` its slice (it is ready and waits for
    /// the worker), or else it waits on I/O.
    pub fn pending(&mut self, yielded: bool) {
        if !yielded || self.yields > GRACE {
            self.release();
            return;
        }
        self.yields += 1;
        if self.yields > GRACE {
            self.release();
        } else if !self.held && self.key != 0 && ON.get() {
            self.held = true;
            with_line(self.key, |line| line.cut += 1);
        }
    }

    /// Lets the line go on (the guest ended, waits on I/O, or had its turns).
    fn release(&mut self) {
        if !std::mem::take(&mut self.held) {
            return;
        }
        // (A held line is on this thread: lines are on only where a guest never moves.)
        debug_assert!(ON.try_with(Cell::get).unwrap_or(true));
        let next = LINES.try_with(|lines| {
            let mut lines = lines.borrow_mut();
            let i = lines.iter().position(|(k, _)| *k == self.key)?;
            let line = &mut lines[i].1;
            line.cut = line.cut.saturating_sub(1);
            settle(&mut lines, i)
        });
        wake(next.ok().flatten());
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.release();
    }
}

/// The tenant's line, made if it has none.
fn with_line(key: usize, f: impl FnOnce(&mut Line)) {
    LINES.with(|lines| {
        let mut lines = lines.borrow_mut();
        let i = match lines.iter().position(|(k, _)| *k == key) {
            Some(i) => i,
            None => {
                lines.push((key, Line::default()));
                lines.len() - 1
            }
        };
        f(&mut lines[i].1);
    });
}

/// After a change to line `i`: with no guest cut, its first request is to be woken (it goes
/// on, and wakes the next): its waker is returned, to be woken once the lines are no longer
/// borrowed. A line with no one in it is dropped.
fn settle(lines: &mut Vec<(usize, Line)>, i: usize) -> Option<Waker> {
    let line = &lines[i].1;
    if line.cut > 0 {
        return None;
    }
    match line.waiting.front() {
        Some((_, first)) => Some(first.clone()),
        None => {
            lines.swap_remove(i);
            None
        }
    }
}

/// Wakes what [`settle`] returned.
fn wake(next: Option<Waker>) {
    if let Some(next) = next {
        next.wake();
    }
}

/// Waits for the tenant `key`'s turn on this thread: at once unless one of its guests here is
/// cut, or requests arrived before this one wait.
pub fn wait(key: usize) -> Wait {
    Wait { key, ticket: None }
}

/// [`wait`]'s future.
#[derive(Debug)]
pub struct Wait {
    key: usize,
    /// Its place in the line, once it waited.
    ticket: Option<u64>,
}

impl Future for Wait {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let key = self.key;
        // Wakers are woken and dropped after the lines are no longer borrowed.
        let (polled, next, _replaced) = LINES.with(|lines| {
            let mut lines = lines.borrow_mut();
            let Some(i) = lines.iter().position(|(k, _)| *k == key) else {
                return (Poll::Ready(()), None, None);
            };
            let line = &mut lines[i].1;
            let first = line.waiting.front().map(|(t, _)| *t);
            let behind = match (first, self.ticket) {
                (None, _) => false,
                (Some(first), Some(mine)) => first < mine,
                (Some(_), None) => true,
            };
            if line.cut == 0 && !behind {
                let left = self
                    .ticket
                    .take()
                    .and_then(|_| line.waiting.pop_front())
                    .map(|(_, w)| w);
                return (Poll::Ready(()), settle(&mut lines, i), left);
            }
            let replaced = match self.ticket {
                Some(mine) => line
                    .waiting
                    .iter_mut()
                    .find(|(t, w)| *t == mine && !w.will_wake(cx.waker()))
                    .map(|(_, w)| std::mem::replace(w, cx.waker().clone())),
                None => {
                    let mine = TICKETS.get();
                    TICKETS.set(mine + 1);
                    self.ticket = Some(mine);
                    line.waiting.push_back((mine, cx.waker().clone()));
                    None
                }
            };
            (Poll::Pending, None, replaced)
        });
        wake(next);
        polled
    }
}

impl Drop for Wait {
    fn drop(&mut self) {
        let Some(mine) = self.ticket else {
            return;
        };
        let key = self.key;
        // A request given up (its client left) leaves the line; if it was first, the next is
        // woken in its place.
        let woken = LINES.try_with(|lines| {
            let mut lines = lines.borrow_mut();
            let i = lines.iter().position(|(k, _)| *k == key)?;
            let waiting = &mut lines[i].1.waiting;
            let mine = waiting.iter().position(|(t, _)| *t == mine)?;
            let left = waiting.remove(mine);
            Some((settle(&mut lines, i), left))
        });
        if let Ok(Some((next, _left))) = woken {
            wake(next);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    /// The order things happened in, shared by a test's tasks.
    type Log = Arc<Mutex<Vec<String>>>;

    fn note(log: &Log, what: String) {
        log.lock().unwrap().push(what);
    }

    /// A guest of tenant `key` that yields `turns` times (as a cut guest does), then ends.
    async fn guest(key: usize, turns: u8, name: &'static str, log: Log) {
        let mut hold = Hold::new(key);
        for turn in 0..turns {
            note(&log, format!("{name} turn {turn}"));
            hold.pending(true);
            tokio::task::yield_now().await;
        }
        note(&log, format!("{name} ends"));
    }

    /// A request of tenant `key` that waits for its turn, then notes it began.
    async fn request(key: usize, name: &'static str, log: Log) {
        wait(key).await;
        note(&log, format!("{name} begins"));
    }

    /// Runs `tasks` on a per-core worker's kind of runtime; a lost wake-up fails (it would
    /// leave a task waiting) instead of hanging.
    fn run_all(tasks: impl FnOnce() -> Vec<tokio::task::JoinHandle<()>>) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            per_worker();
            let all = async {
                for task in tasks() {
                    task.await.unwrap();
                }
            };
            tokio::time::timeout(Duration::from_secs(10), all)
                .await
                .expect("a task was never woken");
        });
    }

    fn lines_left() -> usize {
        LINES.with(|l| l.borrow().len())
    }

    /// A waker that counts its wakes.
    #[derive(Default)]
    struct Wakes(AtomicUsize);

    impl std::task::Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counting() -> (Arc<Wakes>, Waker) {
        let wakes = Arc::new(Wakes::default());
        (wakes.clone(), Waker::from(wakes))
    }

    fn woken(wakes: &Wakes) -> usize {
        wakes.0.load(Ordering::SeqCst)
    }

    #[test]
    fn a_cut_guest_ends_before_its_tenants_next_requests_begin() {
        let log = Log::default();
        let l = log.clone();
        run_all(move || {
            let a = tokio::spawn(guest(1, 3, "a", l.clone()));
            // `b`, `c` and `other` are first polled after `a`'s first turn: `a` is cut then.
            // Its tenant's requests wait, another tenant's does not.
            let b = tokio::spawn(request(1, "b", l.clone()));
            let c = tokio::spawn(request(1, "c", l.clone()));
            let other = tokio::spawn(request(2, "other", l));
            vec![a, b, c, other]
        });
        let log = log.lock().unwrap().clone();
        let at = |what: &str| log.iter().position(|l| l == what).unwrap();
        assert!(at("a turn 0") < at("other begins"), "{log:?}");
        assert!(at("other begins") < at("a ends"), "{log:?}");
        assert!(at("a ends") < at("b begins"), "{log:?}");
        assert!(at("b begins") < at("c begins"), "{log:?}");
        assert_eq!(lines_left(), 0);
    }

    #[test]
    fn a_long_run_lets_the_line_go_after_its_grace() {
        let log = Log::default();
        let l = log.clone();
        run_all(move || {
            let a = tokio::spawn(guest(1, 3 * GRACE, "a", l.clone()));
            let b = tokio::spawn(request(1, "b", l));
            vec![a, b]
        });
        let log = log.lock().unwrap().clone();
        let at = |what: &str| log.iter().position(|l| l == what).unwrap();
        let b = at("b begins");
        // Not before `a` had its grace (its first yield and GRACE turns more), and long
        // before it ends.
        assert!(b > at(&format!("a turn {GRACE}")), "{log:?}");
        assert!(b < at("a ends"), "{log:?}");
        assert_eq!(lines_left(), 0);
    }

    #[test]
    fn a_guest_waiting_on_io_or_dropped_wakes_the_line() {
        per_worker();
        let (wakes, waker) = counting();
        let mut cx = Context::from_waker(&waker);
        let mut hold = Hold::new(7);
        hold.pending(true);
        let mut waiting = Box::pin(wait(7));
        assert!(waiting.as_mut().poll(&mut cx).is_pending());
        // Waiting on I/O: the line goes on, its first request woken.
        hold.pending(false);
        assert_eq!(woken(&wakes), 1);
        assert!(waiting.as_mut().poll(&mut cx).is_ready());
        assert_eq!(lines_left(), 0);
        // Cut again (its yields so far count towards its grace), then dropped (its request
        // was given up): the same.
        hold.pending(true);
        let mut waiting = Box::pin(wait(7));
        assert!(waiting.as_mut().poll(&mut cx).is_pending());
        drop(hold);
        assert_eq!(woken(&wakes), 2);
        assert!(waiting.as_mut().poll(&mut cx).is_ready());
        assert_eq!(lines_left(), 0);
    }

    #[test]
    fn a_request_given_up_hands_its_place_on() {
        per_worker();
        let (first_wakes, first_waker) = counting();
        let (second_wakes, second_waker) = counting();
        let mut hold = Hold::new(9);
        hold.pending(true);
        let mut first = Box::pin(wait(9));
        let mut second = Box::pin(wait(9));
        assert!(
            first
                .as_mut()
                .poll(&mut Context::from_waker(&first_waker))
                .is_pending()
        );
        let mut cx = Context::from_waker(&second_waker);
        assert!(second.as_mut().poll(&mut cx).is_pending());
        drop(hold);
        // The first is woken; the second stays behind it until it goes or is given up.
        assert_eq!((woken(&first_wakes), woken(&second_wakes)), (1, 0));
        assert!(second.as_mut().poll(&mut cx).is_pending());
        drop(first);
        assert_eq!(woken(&second_wakes), 1);
        assert!(second.as_mut().poll(&mut cx).is_ready());
        assert_eq!(lines_left(), 0);
    }

    #[test]
    fn off_the_per_core_workers_nothing_waits() {
        // A fresh thread: lines are off.
        std::thread::spawn(|| {
            let mut hold = Hold::new(3);
            hold.pending(true);
            let waker = futures_util::task::noop_waker();
            let mut cx = Context::from_waker(&waker);
            assert!(Box::pin(wait(3)).as_mut().poll(&mut cx).is_ready());
            assert_eq!(lines_left(), 0);
        })
        .join()
        .unwrap();
    }
}
