//! What every count of this module keeps per key: a bounded map from 64-bit keyed hashes to a
//! value, in shards with a lock each, that forgets keys when full (first those its owner says
//! may go, then the least recently seen quarter) and shows how many it tracks in a gauge.
//!
//! A key is already a keyed hash (SipHash with a random key per table, so a client cannot
//! choose keys that collide); the shard is taken from other bits than the map's own.

use std::collections::HashMap;
use std::sync::Mutex;

/// Shards of a table (a power of two).
pub const SHARDS: usize = 16;

/// A value kept per key.
pub trait Slot {
    /// When its key was last seen (the clock its owner counts in).
    fn last_seen(&self) -> u64;
}

type Map<V> = HashMap<u64, V, crate::hashed::Hashed>;

#[derive(Debug)]
struct Shard<V> {
    map: Map<V>,
    /// Reused when the least recent keys are chosen (no allocation once grown).
    scratch: Vec<u64>,
}

impl<V> Default for Shard<V> {
    fn default() -> Self {
        Self {
            map: Map::default(),
            scratch: Vec::new(),
        }
    }
}

/// A bounded map of keys to `V`, in shards.
#[derive(Debug)]
pub struct Shards<V> {
    shards: Box<[Mutex<Shard<V>>]>,
    per_shard: usize,
    /// How many keys it tracks.
    tracked: prometheus::IntGauge,
}

impl<V: Slot> Shards<V> {
    /// Room for about `max_keys` keys, counted in `tracked`.
    pub fn new(max_keys: usize, tracked: prometheus::IntGauge) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            per_shard: max_keys.div_ceil(SHARDS).max(1),
            tracked,
        }
    }

    /// Runs `f` on the value of `key` (`None`: not tracked) under its shard's lock; a value
    /// `f` gives back is stored under `key`. A new key in a full shard makes room: the keys
    /// `forgettable` says may go (other than this one) go, then, if fewer than an eighth went,
    /// the least recently seen quarter.
    pub fn with<R>(
        &self,
        key: u64,
        f: impl FnOnce(Option<&mut V>) -> (R, Option<V>),
        forgettable: impl Fn(&V) -> bool,
    ) -> R {
        let shard = &self.shards[(key >> 32) as usize & (SHARDS - 1)];
        let mut s = shard.lock().unwrap_or_else(|e| e.into_inner());
        let (answer, store) = f(s.map.get_mut(&key));
        if let Some(v) = store
            && s.map.insert(key, v).is_none()
        {
            self.tracked.inc();
            if s.map.len() > self.per_shard {
                let before = s.map.len();
                self.make_room(&mut s, key, forgettable);
                self.tracked.sub((before - s.map.len()) as i64);
            }
        }
        answer
    }

    fn make_room(&self, s: &mut Shard<V>, keep: u64, forgettable: impl Fn(&V) -> bool) {
        s.map.retain(|k, v| *k == keep || !forgettable(v));
        if s.map.len() < self.per_shard - self.per_shard / 8 {
            return;
        }
        let Shard { map, scratch } = s;
        scratch.clear();
        scratch.extend(map.values().map(Slot::last_seen));
        let quarter = (scratch.len() / 4).max(1);
        let (_, cut, _) = scratch.select_nth_unstable(quarter - 1);
        let cut = *cut;
        map.retain(|k, v| *k == keep || v.last_seen() > cut);
    }

    /// Changes the value of `key`, if tracked; it is forgotten if `f` says it is not to be kept.
    pub fn update(&self, key: u64, f: impl FnOnce(&mut V) -> bool) {
        let shard = &self.shards[(key >> 32) as usize & (SHARDS - 1)];
        let mut s = shard.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(v) = s.map.get_mut(&key)
            && !f(v)
        {
            s.map.remove(&key);
            self.tracked.dec();
        }
    }

    /// Whether it tracks `key`.
    pub fn contains(&self, key: u64) -> bool {
        self.with(key, |v| (v.is_some(), None), |_| false)
    }

    /// How many keys it tracks.
    pub fn keys(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).map.len())
            .sum()
    }
}

impl<V> Drop for Shards<V> {
    /// Its keys leave the gauge with it (a limit removed or changed by a redeploy).
    fn drop(&mut self) {
        let n: usize = self
            .shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).map.len())
            .sum();
        self.tracked.sub(n as i64);
    }
}
