//! One limit's counts: nginx's leaky bucket per key, in shards of bounded hash tables.
//!
//! A key is kept as a 64-bit keyed hash of its parts (SipHash with a random key per limit, so a
//! client cannot choose keys that collide), with its excess (milli-requests over the rate) and
//! when it was last accounted (ms): 16 bytes of state and 8 of key, under 64 bytes a key with
//! the table's slack. A shard past its share of `max_keys` first forgets the keys whose excess
//! has drained (they count as new ones), then, if that freed too little, the least recently
//! seen quarter.

use std::time::Duration;

use super::shards::{Shards, Slot};

/// Bytes a tracked key costs at most (documented): key, state and the table's slack.
pub const BYTES_PER_KEY: usize = 64;

/// What accounting one request decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Within the rate (or the burst answered at once).
    Pass,
    /// Within the burst, past `delay`: wait this long.
    Wait(Duration),
    /// Over the burst: refused; a request is taken again after this many seconds.
    Over {
        /// Seconds until one more request fits (at least 1).
        retry_after: u64,
    },
}

#[derive(Debug, Clone, Copy)]
struct State {
    /// Milli-requests over the rate.
    excess: u64,
    /// When it was last accounted (ms since the table's start).
    last: u64,
}

impl Slot for State {
    fn last_seen(&self) -> u64 {
        self.last
    }
}

/// One limit's counts.
#[derive(Debug)]
pub struct Table {
    keys: Shards<State>,
    /// Milli-requests per second.
    rate: u64,
    /// `burst` × 1000.
    burst: u64,
    /// `delay` × 1000.
    delay: u64,
}

impl Table {
    /// A table for `rate` (milli-requests per second), `burst`, `delay` (of the burst, answered
    /// at once) and at most `max_keys` keys.
    pub fn new(
        rate: u64,
        burst: u32,
        delay: u32,
        max_keys: usize,
        tracked: prometheus::IntGauge,
    ) -> Self {
        Self {
            keys: Shards::new(max_keys, tracked),
            rate: rate.max(1),
            burst: u64::from(burst) * 1000,
            delay: u64::from(delay) * 1000,
        }
    }

    /// Accounts one request of `key` at `now` (ms since the table's start), as nginx's
    /// `limit_req` does: a key's first request is free; then its excess grows by one request
    /// and drains at the rate; over the burst the request is refused (and not counted).
    pub fn account(&self, key: u64, now: u64) -> Verdict {
        self.charge(key, now).0
    }

    /// [`Self::account`], and whether `key` was new (a refund then forgets it again).
    pub fn charge(&self, key: u64, now: u64) -> (Verdict, bool) {
        let rate = self.rate;
        let (excess, new) = self.keys.with(
            key,
            |st| {
                let new = st.is_none();
                let (excess, last) = match st {
                    None => (0, now),
                    Some(st) => {
                        // Requests accounted out of order (two workers) never move `last` back.
                        let drained = rate.saturating_mul(now.saturating_sub(st.last)) / 1000;
                        ((st.excess + 1000).saturating_sub(drained), now.max(st.last))
                    }
                };
                let store = (excess <= self.burst).then_some(State { excess, last });
                ((excess, new), store)
            },
            // A full shard forgets the keys that have drained so far that their next request
            // would count from zero (as a new key's does).
            |st| st.excess + 1000 <= rate.saturating_mul(now.saturating_sub(st.last)) / 1000,
        );
        (self.verdict(excess), new)
    }

    /// Gives back one request charged to `key` (another limit refused it): its excess less
    /// one request; a key that request made is forgotten (its next request is free again)
    /// unless other requests were charged to it since (their charges stay).
    pub fn refund(&self, key: u64, new: bool) {
        self.keys.update(key, |st| {
            if new && st.excess == 0 {
                return false;
            }
            st.excess = st.excess.saturating_sub(1000);
            true
        });
    }

    /// What a key's excess with one more request (milli-requests) decides.
    pub fn verdict(&self, excess: u64) -> Verdict {
        if excess > self.burst {
            let wait_ms = (excess - self.burst) * 1000 / self.rate;
            return Verdict::Over {
                retry_after: wait_ms.div_ceil(1000).max(1),
            };
        }
        if excess > self.delay {
            Verdict::Wait(Duration::from_millis(
                (excess - self.delay) * 1000 / self.rate,
            ))
        } else {
            Verdict::Pass
        }
    }

    /// Its rate (milli-requests per second) and burst (milli-requests).
    pub fn rate_and_burst(&self) -> (u64, u64) {
        (self.rate, self.burst)
    }

    /// How many keys it tracks.
    pub fn keys(&self) -> usize {
        self.keys.keys()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ratelimit::shards::SHARDS;

    fn table(rate_per_sec: u64, burst: u32, delay: u32, max_keys: usize) -> Table {
        let gauge = prometheus::IntGauge::new("k", "k").unwrap();
        Table::new(rate_per_sec * 1000, burst, delay, max_keys, gauge)
    }

    #[test]
    fn a_burst_then_the_rate_as_nginx_counts_them() {
        // rate=10r/s burst=5 nodelay: the first request is free, five more fit, the seventh
        // at the same instant is refused; 100 ms later one more fits.
        let t = table(10, 5, 5, 100);
        let verdicts: Vec<Verdict> = (0..7).map(|_| t.account(1, 0)).collect();
        assert!(
            verdicts[..6].iter().all(|v| *v == Verdict::Pass),
            "{verdicts:?}"
        );
        assert_eq!(verdicts[6], Verdict::Over { retry_after: 1 });
        assert_eq!(
            t.account(1, 99),
            Verdict::Over { retry_after: 1 },
            "limit - 1 ms"
        );
        assert_eq!(t.account(1, 100), Verdict::Pass, "at the limit");
        assert!(
            matches!(t.account(1, 100), Verdict::Over { .. }),
            "limit + 1 request"
        );
        // Another key has its own count.
        assert_eq!(t.account(2, 100), Verdict::Pass);
        // Refused requests are not counted: after a second of quiet the whole burst is back.
        for _ in 0..50 {
            t.account(1, 150);
        }
        let back: Vec<Verdict> = (0..7).map(|_| t.account(1, 1_200)).collect();
        assert!(back[..6].iter().all(|v| *v == Verdict::Pass), "{back:?}");
        assert!(matches!(back[6], Verdict::Over { .. }));
    }

    #[test]
    fn past_delay_requests_wait_until_the_rate_lets_them_through() {
        // rate=10r/s burst=5 delay=2 (nginx's delay=2): excess 1 and 2 at once, 3 waits
        // 100 ms, 4 200 ms, 5 300 ms; the next is refused.
        let t = table(10, 5, 2, 100);
        let got: Vec<Verdict> = (0..7).map(|_| t.account(7, 0)).collect();
        let ms = |n| Verdict::Wait(Duration::from_millis(n));
        assert_eq!(
            got,
            [
                Verdict::Pass,
                Verdict::Pass,
                Verdict::Pass,
                ms(100),
                ms(200),
                ms(300),
                Verdict::Over { retry_after: 1 }
            ]
        );
        // delay = 0 (nginx without nodelay): every excess request waits.
        let t = table(10, 5, 0, 100);
        assert_eq!(t.account(7, 0), Verdict::Pass);
        assert_eq!(t.account(7, 0), ms(100));
    }

    #[test]
    fn a_full_table_keeps_the_counts_of_busy_keys_with_no_burst() {
        // burst = 0: every stored excess is 0; a key seen this instant still counts (its next
        // request within the rate's interval is refused) when its full shard makes room: the
        // keys that went are the drained ones.
        let t = table(1, 0, 0, 160);
        let in_shard_0 = |k: u64| (k + 1) << 36;
        for k in 0..9 {
            t.account(in_shard_0(k), 0);
        }
        assert_eq!(t.account(42, 5_000), Verdict::Pass);
        for k in 100..103 {
            t.account(in_shard_0(k), 5_000);
        }
        assert!(t.keys() <= 10 + 1, "{}", t.keys());
        assert!(
            matches!(t.account(42, 5_001), Verdict::Over { .. }),
            "the busy key was forgotten"
        );
        // Out of order (another worker's older instant): `last` does not go back.
        let t = table(10, 0, 0, 16);
        assert_eq!(t.account(1, 1_000), Verdict::Pass);
        assert!(matches!(t.account(1, 900), Verdict::Over { .. }));
        assert!(matches!(t.account(1, 1_050), Verdict::Over { .. }));
        assert_eq!(t.account(1, 1_100), Verdict::Pass);
        // A refund gives the place back; a key the refunded request made is forgotten.
        let t = table(10, 1, 1, 1600);
        assert_eq!(t.charge(5, 0), (Verdict::Pass, true));
        assert_eq!(t.charge(5, 0), (Verdict::Pass, false));
        assert!(matches!(t.account(5, 0), Verdict::Over { .. }));
        t.refund(5, false);
        assert_eq!(t.account(5, 0), Verdict::Pass, "its place given back");
        assert_eq!(t.keys(), 1);
        let (_, new) = t.charge(6, 0);
        t.refund(6, new);
        assert_eq!(t.keys(), 1, "the new key is forgotten");
        assert_eq!(t.charge(6, 0), (Verdict::Pass, true), "free again");
        // A request charged to a new key meanwhile keeps its charge when the one that made
        // the key is given back.
        let (_, new) = t.charge(7, 0);
        assert_eq!(t.charge(7, 0), (Verdict::Pass, false));
        t.refund(7, new);
        assert_eq!(t.account(7, 0), Verdict::Pass, "the refunded place");
        assert!(
            matches!(t.account(7, 0), Verdict::Over { .. }),
            "the other request's charge was forgotten"
        );
    }

    #[test]
    fn retry_after_says_when_one_more_fits() {
        // 1 r/min, burst 0: the second request within the minute waits about 60 s (62: the
        // rate in milli-requests per second is truncated to 16, as nginx's is).
        let gauge = prometheus::IntGauge::new("k", "k").unwrap();
        let t = Table::new(1000 / 60, 0, 0, 10, gauge);
        assert_eq!(t.account(1, 0), Verdict::Pass);
        let Verdict::Over { retry_after } = t.account(1, 1_000) else {
            panic!("refused")
        };
        assert!((58..=63).contains(&retry_after), "{retry_after}");
    }

    #[test]
    fn a_million_keys_stay_within_max_keys() {
        let gauge = prometheus::IntGauge::new("k", "k").unwrap();
        let max = 10_000;
        let t = Table::new(10_000, 5, 5, max, gauge.clone());
        for k in 0..1_000_000u64 {
            // Spread over the shards as hashes are; each key busy (excess not drained).
            let key = k.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            t.account(key, k / 1000);
            t.account(key, k / 1000);
        }
        let n = t.keys();
        assert!(n <= max + SHARDS, "{n} keys tracked, max {max}");
        assert!(n >= max / 2, "most of the table is in use: {n}");
        assert_eq!(gauge.get() as usize, n, "the gauge follows");
        // The most recent keys are the ones kept (looked at before it is counted again).
        let last = 999_999u64.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let first = 0u64;
        assert!(t.keys.contains(last));
        assert!(!t.keys.contains(first), "the oldest went");
    }
}
