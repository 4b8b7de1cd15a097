//! The phases of a request and one request's durations in each: the `phase` label of
//! `tern_request_phase_duration_seconds` and the `Server-Timing` header.

use std::time::Duration;

/// The phases of a request, in order. Their names are the `phase` label values and the
/// `Server-Timing` metric names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Host/path lookup.
    Route = 0,
    /// Waiting for a free pool slot.
    Queue = 1,
    /// Taking a slot and instantiating the guest (`Store::new` + `instantiate_async`).
    Instantiate = 2,
    /// Running the handler on its fiber until it returns.
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
        let mut s = String::with_capacity(128);
        // Milliseconds with three decimals from whole microseconds, digits written directly:
        // float formatting, then `write!` of a u128 showed in profiles of the request path
        // (363 -> 114 ns for five phases, `cargo bench -p tern --bench logline server_timing`).
        let mut dur = |name: &str, d: Duration, sep: &str| {
            let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
            s.push_str(name);
            s.push_str(";dur=");
            push_u64(&mut s, us / 1000);
            let frac = us % 1000;
            s.push('.');
            for digit in [frac / 100, frac / 10 % 10, frac % 10] {
                s.push(char::from(b'0' + digit as u8));
            }
            s.push_str(sep);
        };
        for phase in &Phase::ALL[..=reached as usize] {
            dur(phase.name(), self.0[*phase as usize], ", ");
        }
        for phase in Phase::WHEN_USED {
            let d = self.0[phase as usize];
            if !d.is_zero() {
                dur(phase.name(), d, ", ");
            }
        }
        dur("total", total, "");
        if let Some(v) = version {
            s.push_str(", version;desc=");
            s.push_str(v);
        }
        s
    }
}

/// Appends `n` in decimal.
pub(super) fn push_u64(s: &mut String, n: u64) {
    s.push_str(crate::decimal::digits(n, &mut [0; 20]));
}
