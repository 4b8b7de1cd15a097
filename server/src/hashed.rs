//! Maps whose keys are already keyed hashes (SipHash under a random key of their owner: the
//! cache's keys, the rate limiters' keys) take a key as its own hash instead of hashing it
//! again (SipHash of 8 bytes: ~140 instructions a look). Every bit of such a key is as good as
//! another's, which the maps need (moka picks a segment by the high bits and a bucket by the
//! low ones; a sharded table its shard by bits the map does not use), and a client aims no
//! better at one bucket than at one key.

use std::hash::{BuildHasherDefault, Hasher};

/// The `BuildHasher` of maps keyed by keyed hashes.
pub type Hashed = BuildHasherDefault<AsHashed>;

/// [`Hashed`]'s hasher: a `u64` key is its own hash.
#[derive(Default, Clone, Copy)]
pub struct AsHashed(u64);

impl Hasher for AsHashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }

    /// Keys are `u64`s, hashed by [`Self::write_u64`]; other bytes are folded in (FNV-1a),
    /// so that a map given another key type still spreads it.
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn a_u64_is_its_own_hash_and_other_bytes_spread() {
        let h = Hashed::default();
        for n in [0, 1, 0xdead_beef, u64::MAX] {
            assert_eq!(h.hash_one(n), n);
        }
        assert_ne!(h.hash_one("ab"), h.hash_one("ba"));
    }
}
