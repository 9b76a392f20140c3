//! Fixed-seed hashing of block ids.
//!
//! One function serves two purposes: the hash maps of the stack-distance
//! structures, and SHARDS' spatial sampling, which needs a hash that is the
//! same on every run and every machine so that a sample is reproducible.
//! XXH3 is a specified algorithm, so its output does not change between
//! releases of the crate that implements it.

use std::hash::{BuildHasher, Hasher};

/// The seed of every hash in this crate. Any constant works; it is fixed so
/// that two runs over the same trace sample the same blocks.
const SEED: u64 = 0x5245_424f_554e_444d; // "REBOUNDM"

/// The 64-bit hash of a block id.
pub(crate) fn block_hash(block: u64) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(&block.to_le_bytes(), SEED)
}

/// Hashes `u64` keys with [`block_hash`]; the maps here are keyed by block
/// ids only, which SipHash (the std default) would hash several times slower.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct BlockHashBuilder;

impl BuildHasher for BlockHashBuilder {
    type Hasher = BlockHasher;

    fn build_hasher(&self) -> BlockHasher {
        BlockHasher(SEED)
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct BlockHasher(u64);

impl Hasher for BlockHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Not used by `u64` keys, but a map may hash other key shapes.
        self.0 = xxhash_rust::xxh3::xxh3_64_with_seed(bytes, self.0);
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = xxhash_rust::xxh3::xxh3_64_with_seed(&value.to_le_bytes(), self.0);
    }
}

pub(crate) type BlockMap<V> = std::collections::HashMap<u64, V, BlockHashBuilder>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_is_fixed_across_runs() {
        // A change of seed or algorithm would silently change every sample.
        assert_eq!(block_hash(0), block_hash(0));
        assert_ne!(block_hash(0), block_hash(1));
        let mut h = BlockHashBuilder.build_hasher();
        h.write_u64(7);
        assert_eq!(h.finish(), block_hash(7));
    }
}
