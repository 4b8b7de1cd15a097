//! The phases of a request and one request's durations in each: the `phase` label of
//! `tern_request_phase_duration_seconds` and the `Server-Timing` header.

use std::time::Duration;

/// The phases of a request, in order. Their names are the `phase` label values and the
/// `Server-Timing` metric names.
///
/// The clock is read once at each boundary, and a phase begins where the one before it ended
/// (a rate limit's delay, and a shared store's round trip for it, excepted): route from the
/// request's arrival; the cache's look, or the queue, from route's end (so with the checks and
/// rate limits between them); instantiate from the queue's end; run from the handler's call;
/// teardown from the run's end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Host/path lookup.
    Route = 0,
    /// Waiting for a free pool slot.
    Queue = 1,
    /// Taking a slot and instantiating the guest (`Store::new` + `instantiate_async`).
    Instantiate = 2,
    /// Running the handler on its fiber until it returns, and its answer taken from it.
    Run = 3,
    /// Dropping the store: the slot is reset and returned to the pool.
    Teardown = 4,
    /// Part of `run`: the guest waiting for its outbound requests (connect, send, response
    /// head and body). Recorded only for requests that made outbound requests.
    Outbound = 5,
    /// Part of `run`: the guest waiting for its key-value stores. Recorded only for requests
    /// that used one.
    Kv = 6,
    /// Looking the request up in its tenant's cache (`[tenant.cache]`), and for a hit making
    /// the answer. Recorded only for tenants with a cache.
    Cache = 7,
    /// Part of `instantiate` + `run`: the guest ready to run but waiting for its worker thread,
    /// busy with other requests (time the guest's limit does not count). Recorded only for
    /// requests that waited.
    Ready = 8,
}

/// How many phases there are.
pub const PHASES: usize = 9;

impl Phase {
    /// All phases in request order.
    pub const ALL: [Phase; 5] = [
        Phase::Route,
        Phase::Queue,
        Phase::Instantiate,
        Phase::Run,
        Phase::Teardown,
    ];

    /// Every phase, in `Timings` order (the request's, then the parts of `run`).
    pub const EVERY: [Phase; PHASES] = [
        Phase::Route,
        Phase::Queue,
        Phase::Instantiate,
        Phase::Run,
        Phase::Teardown,
        Phase::Outbound,
        Phase::Kv,
        Phase::Cache,
        Phase::Ready,
    ];

    /// Phases recorded only for requests that had them: the cache lookup, and the parts of
    /// `instantiate` + `run`.
    pub const WHEN_USED: [Phase; 4] = [Phase::Cache, Phase::Ready, Phase::Outbound, Phase::Kv];

    /// The label value / `Server-Timing` name.
    pub fn name(self) -> &'static str {
        [
            "route",
            "queue",
            "instantiate",
            "run",
            "teardown",
            "outbound",
            "kv",
            "cache",
            "ready",
        ][self as usize]
    }
}

/// Durations of each phase of one request (zero for phases it did not reach).
#[derive(Debug, Clone, Copy, Default)]
pub struct Timings(pub [Duration; PHASES]);

impl Timings {
    /// Records `d` for `phase`.
    pub fn set(&mut self, phase: Phase, d: Duration) {
        self.0[phase as usize] = d;
    }

    /// The `Server-Timing` header value: each phase up to `reached` and the total, in
    /// milliseconds, then the tenant's `version` that answered (`version;desc=<12 digits>`)
    /// when it has one.
    pub fn server_timing(&self, total: Duration, reached: Phase, version: Option<&str>) -> String {
        let mut s = Vec::with_capacity(128);
        self.write_timing(&mut s, total, reached, version);
        String::from_utf8(s).expect("ASCII")
    }

    /// [`Self::server_timing`] as a header value: written on the stack, then copied once into
    /// an allocation of its length (no growing `String`, no cut to length); `None` if a
    /// `version` made it no header value.
    pub fn server_timing_value(
        &self,
        total: Duration,
        reached: Phase,
        version: Option<&str>,
    ) -> Option<http::HeaderValue> {
        let mut line = Stack {
            buf: [0; STACK_LINE],
            len: 0,
            over: false,
        };
        self.write_timing(&mut line, total, reached, version);
        let bytes = if line.over {
            let text = self.server_timing(total, reached, version);
            bytes::Bytes::from(text.into_bytes().into_boxed_slice())
        } else {
            bytes::Bytes::copy_from_slice(&line.buf[..line.len])
        };
        http::HeaderValue::from_maybe_shared(bytes).ok()
    }

    fn write_timing(
        &self,
        out: &mut impl Sink,
        total: Duration,
        reached: Phase,
        version: Option<&str>,
    ) {
        // Milliseconds with three decimals from whole microseconds, digits written directly:
        // float formatting, then `write!` of a u128 showed in profiles of the request path
        // (363 -> 114 ns for five phases, `cargo bench -p tern --bench logline server_timing`).
        let mut dur = |name: &str, d: Duration, sep: &[u8]| {
            let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
            out.put(name.as_bytes());
            out.put(b";dur=");
            out.put(crate::decimal::bytes(us / 1000, &mut [0; 20]));
            // (Each digit below 10: the cast keeps it whole.)
            let frac = us % 1000;
            out.put(&[
                b'.',
                b'0' + (frac / 100) as u8,
                b'0' + (frac / 10 % 10) as u8,
                b'0' + (frac % 10) as u8,
            ]);
            out.put(sep);
        };
        for phase in &Phase::ALL[..=reached as usize] {
            dur(phase.name(), self.0[*phase as usize], b", ");
        }
        for phase in Phase::WHEN_USED {
            let d = self.0[phase as usize];
            if !d.is_zero() {
                dur(phase.name(), d, b", ");
            }
        }
        dur("total", total, b"");
        if let Some(v) = version {
            out.put(b", version;desc=");
            out.put(v.as_bytes());
        }
    }
}

/// Room on the stack for a `Server-Timing` value: every phase at its longest (~40 bytes
/// each) and a version; a longer one (a long version label) is written again on the heap.
pub(super) const STACK_LINE: usize = 448;

/// Where a `Server-Timing` value is written.
trait Sink {
    fn put(&mut self, bytes: &[u8]);
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

/// A value written on the stack, and whether it outgrew it (then the rest is dropped).
struct Stack {
    buf: [u8; STACK_LINE],
    len: usize,
    over: bool,
}

impl Sink for Stack {
    fn put(&mut self, bytes: &[u8]) {
        match self.buf.get_mut(self.len..self.len + bytes.len()) {
            Some(to) => {
                to.copy_from_slice(bytes);
                self.len += bytes.len();
            }
            None => self.over = true,
        }
    }
}
