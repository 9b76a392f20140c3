//! A plain LRU cache simulator, the yardstick for curves.
//!
//! It shares no code with [`crate::stack`]: it keeps the cache itself (a map
//! from block to last-use time and an ordered map from time to block) and
//! evicts the least recently used block when full, so a curve can be checked
//! against it size by size.

use std::collections::BTreeMap;

use crate::curve::offset::GuestEvent;
use crate::hash::BlockMap;

/// An LRU cache of a fixed number of blocks.
#[derive(Clone, Debug)]
pub struct Lru {
    size: u64,
    last_use: BlockMap<u64>,
    by_age: BTreeMap<u64, u64>,
    clock: u64,
}

/// What one access did to an [`Lru`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Hit,
    /// A miss, and the block evicted to make room for it, if any.
    Miss {
        evicted: Option<u64>,
    },
}

impl Lru {
    /// An empty cache of `size` blocks; a cache of 0 blocks misses everything.
    pub fn new(size: u64) -> Self {
        Lru {
            size,
            last_use: BlockMap::default(),
            by_age: BTreeMap::new(),
            clock: 0,
        }
    }

    /// Accesses `block`.
    pub fn access(&mut self, block: u64) -> Outcome {
        self.clock += 1;
        if let Some(t) = self.last_use.insert(block, self.clock) {
            self.by_age.remove(&t);
            self.by_age.insert(self.clock, block);
            return Outcome::Hit;
        }
        if self.size == 0 {
            self.last_use.remove(&block);
            return Outcome::Miss { evicted: None };
        }
        self.by_age.insert(self.clock, block);
        let evicted = if self.last_use.len() as u64 > self.size {
            self.by_age.pop_first().map(|(_, victim)| {
                self.last_use.remove(&victim);
                victim
            })
        } else {
            None
        };
        Outcome::Miss { evicted }
    }
}

/// Misses of an LRU cache of `size` blocks over `trace`.
pub fn misses(trace: &[u64], size: u64) -> u64 {
    let mut lru = Lru::new(size);
    trace
        .iter()
        .filter(|&&b| lru.access(b) != Outcome::Hit)
        .count() as u64
}

/// The accesses of `trace` that miss an LRU cache of `size` blocks, in order.
pub fn miss_stream(trace: &[u64], size: u64) -> Vec<u64> {
    let mut lru = Lru::new(size);
    trace
        .iter()
        .copied()
        .filter(|&b| lru.access(b) != Outcome::Hit)
        .collect()
}

/// What a hypervisor sees of a guest whose own memory is an LRU cache of
/// `direct` pages: each miss, followed by the eviction it caused (the order
/// [`crate::curve::offset::ExclusiveTracer`] expects).
pub fn guest_events(trace: &[u64], direct: u64) -> Vec<GuestEvent> {
    let mut lru = Lru::new(direct);
    let mut events = Vec::new();
    for &b in trace {
        if let Outcome::Miss { evicted } = lru.access(b) {
            events.push(GuestEvent::Miss(b));
            events.extend(evicted.map(GuestEvent::Evict));
        }
    }
    events
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_by_hand() {
        // Size 2: a b a c (evicts b) b (evicts a) a (evicts c).
        let trace = [1, 2, 1, 3, 2, 1];
        assert_eq!(misses(&trace, 2), 5);
        assert_eq!(misses(&trace, 3), 3);
        assert_eq!(misses(&trace, 0), 6);
        assert_eq!(miss_stream(&trace, 2), [1, 2, 3, 2, 1]);
        assert_eq!(
            guest_events(&trace, 2),
            [
                GuestEvent::Miss(1),
                GuestEvent::Miss(2),
                GuestEvent::Miss(3),
                GuestEvent::Evict(2),
                GuestEvent::Miss(2),
                GuestEvent::Evict(1),
                GuestEvent::Miss(1),
                GuestEvent::Evict(3),
            ]
        );
    }

    #[test]
    fn sequential_loop_larger_than_cache_always_misses() {
        let trace: Vec<u64> = (0..10).cycle().take(100).collect();
        assert_eq!(misses(&trace, 9), 100);
        assert_eq!(misses(&trace, 10), 10);
    }
}
