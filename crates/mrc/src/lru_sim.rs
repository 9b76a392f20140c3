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

/// Misses of an exclusive cache of `size` blocks below a guest, over what the host saw
/// of it: an evicted page enters the cache (most recent first, the least recent leaving
/// when it is full), a miss that finds its page there is a hit and takes it out (the
/// page is back in the guest), a returned page leaves uncounted. The yardstick for
/// [`crate::curve::offset::ExclusiveTracer`]'s curve, one size at a time.
pub fn exclusive_misses(events: &[GuestEvent], size: u64) -> u64 {
    let mut at: BlockMap<u64> = BlockMap::default();
    let mut by_age: BTreeMap<u64, u64> = BTreeMap::new();
    let (mut clock, mut misses) = (0u64, 0u64);
    for e in events {
        match *e {
            GuestEvent::Evict(p) => {
                clock += 1;
                if let Some(t) = at.insert(p, clock) {
                    by_age.remove(&t);
                }
                by_age.insert(clock, p);
                if by_age.len() as u64 > size {
                    if let Some((_, victim)) = by_age.pop_first() {
                        at.remove(&victim);
                    }
                }
            }
            GuestEvent::Miss(p) => match at.remove(&p) {
                Some(t) => {
                    by_age.remove(&t);
                }
                None => misses += 1,
            },
            GuestEvent::Returned(p) => {
                if let Some(t) = at.remove(&p) {
                    by_age.remove(&t);
                }
            }
        }
    }
    misses
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exclusive_cache_by_hand() {
        use GuestEvent::*;
        // Evict 1 2 3; miss 1 (rank 3), miss 3 (rank 1), miss 9 (cold); 2 returned,
        // then missed (gone: a miss at every size).
        let ev = [
            Evict(1),
            Evict(2),
            Evict(3),
            Miss(1),
            Miss(3),
            Miss(9),
            Returned(2),
            Miss(2),
        ];
        assert_eq!(exclusive_misses(&ev, 0), 4);
        assert_eq!(exclusive_misses(&ev, 1), 3); // 3 hits
        assert_eq!(exclusive_misses(&ev, 2), 3); // 1 was dropped at size 2
        assert_eq!(exclusive_misses(&ev, 3), 2);
        // The tracer's ranks say the same at every size.
        let mut t = crate::ExclusiveTracer::new();
        ev.iter().for_each(|e| t.record(*e));
        let c = crate::MissRatioCurve::from_histogram(&t.histogram(), 4).unwrap();
        for s in 0..=3 {
            assert_eq!(
                c.misses(s).unwrap(),
                exclusive_misses(&ev, s) as f64,
                "size {s}"
            );
        }
    }

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
