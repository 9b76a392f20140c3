//! Exact LRU stack distances (Mattson et al. 1970, the paper's reference
//! \[15\] for the "virtual LRU stack" of section 3.4) in O(log n) per access.
//!
//! The stack distance of an access is one plus the number of distinct
//! blocks touched since the previous access to the same block; it is the
//! block's depth in the LRU stack just before the access. Walking a linked
//! stack costs O(depth) per access; instead, following Bennett and Kruskal
//! (1975), every access gets a time stamp and a Fenwick tree over time
//! stamps holds a 1 at each block's most recent access time. The distinct
//! blocks touched after a block's previous access `t0` are exactly the ones
//! whose latest stamp is later than `t0`, so the distance is the count of
//! marks after `t0`, plus one: one prefix-sum query, and two point updates
//! to move the block's mark to the present.
//!
//! Time stamps grow without bound, but only one mark per distinct block is
//! live. When the stamps reach the tree's capacity the live marks are
//! renumbered in order (compaction) into a tree twice their number, so
//! memory stays proportional to the distinct blocks and the linear
//! compaction is paid for by the accesses in between (amortised O(1)).

use crate::hash::BlockMap;
use crate::histogram::{Histogram, Profiler};

/// The smallest time-stamp capacity; keeps tiny traces from compacting at
/// every other access.
const MIN_CAPACITY: usize = 1024;

/// A Fenwick (binary indexed) tree of 0/1 marks over positions `0..len`.
#[derive(Clone, Debug)]
struct Fenwick {
    tree: Vec<u32>,
}

impl Fenwick {
    /// A tree whose first `ones` positions are marked, built in O(len).
    fn with_prefix_marked(len: usize, ones: usize) -> Self {
        let mut tree: Vec<u32> = (0..len).map(|i| u32::from(i < ones)).collect();
        for i in 0..len {
            let parent = i | (i + 1);
            if parent < len {
                tree[parent] += tree[i];
            }
        }
        Fenwick { tree }
    }

    fn len(&self) -> usize {
        self.tree.len()
    }

    fn add(&mut self, mut i: usize, delta: i32) {
        while i < self.tree.len() {
            self.tree[i] = self.tree[i].wrapping_add_signed(delta);
            i |= i + 1;
        }
    }

    /// Number of marks at positions `0..=i`.
    fn prefix(&self, i: usize) -> u64 {
        let mut sum = 0u64;
        let mut i = i + 1;
        while i > 0 {
            sum += u64::from(self.tree[i - 1]);
            i &= i - 1;
        }
        sum
    }
}

/// The LRU stack of the blocks seen so far, answering depth queries.
#[derive(Clone, Debug)]
pub struct StackDistance {
    /// Each block's latest time stamp.
    stamp: BlockMap<usize>,
    /// The block stamped at each time, if that is still its latest stamp.
    owner: Vec<Option<u64>>,
    marks: Fenwick,
    now: usize,
}

impl Default for StackDistance {
    fn default() -> Self {
        Self::new()
    }
}

impl StackDistance {
    /// An empty stack.
    pub fn new() -> Self {
        StackDistance {
            stamp: BlockMap::default(),
            owner: vec![None; MIN_CAPACITY],
            marks: Fenwick::with_prefix_marked(MIN_CAPACITY, 0),
            now: 0,
        }
    }

    /// Number of distinct blocks on the stack.
    pub fn len(&self) -> usize {
        self.stamp.len()
    }

    /// Whether no block is on the stack.
    pub fn is_empty(&self) -> bool {
        self.stamp.is_empty()
    }

    /// Depth of the mark at time `t` (1 = top of the stack).
    fn depth(&self, t: usize) -> u64 {
        self.stamp.len() as u64 - self.marks.prefix(t) + 1
    }

    /// Moves `block` to the top of the stack and returns its stack distance
    /// (its depth before the move), or `None` if it was not on the stack.
    pub fn access(&mut self, block: u64) -> Option<u64> {
        let distance = self.remove(block);
        if self.now == self.marks.len() {
            self.compact();
        }
        self.stamp.insert(block, self.now);
        self.owner[self.now] = Some(block);
        self.marks.add(self.now, 1);
        self.now += 1;
        distance
    }

    /// Takes `block` off the stack, returning the depth it had.
    pub fn remove(&mut self, block: u64) -> Option<u64> {
        let t = *self.stamp.get(&block)?;
        let depth = self.depth(t);
        self.stamp.remove(&block);
        self.owner[t] = None;
        self.marks.add(t, -1);
        Some(depth)
    }

    /// Renumbers the live stamps `0..live` in time order and makes room for
    /// as many new ones again.
    fn compact(&mut self) {
        let live: Vec<u64> = self.owner.iter().flatten().copied().collect();
        let capacity = (2 * live.len()).max(MIN_CAPACITY);
        for (t, block) in live.iter().enumerate() {
            self.stamp.insert(*block, t);
        }
        self.owner = live.iter().copied().map(Some).collect();
        self.owner.resize(capacity, None);
        self.marks = Fenwick::with_prefix_marked(capacity, live.len());
        self.now = live.len();
    }
}

/// Exact stack-distance histogram of a stream, one bucket per distance
/// unless a wider bucket is asked for.
#[derive(Clone, Debug)]
pub struct ExactProfiler {
    stack: StackDistance,
    histogram: Histogram,
    accesses: u64,
}

impl Default for ExactProfiler {
    fn default() -> Self {
        Self::new()
    }
}

impl ExactProfiler {
    /// A profiler with one bucket per distance.
    pub fn new() -> Self {
        Self::with_bucket_width(1)
    }

    /// A profiler whose histogram buckets are `width` blocks wide (a width
    /// of 0 is taken as 1); wide buckets keep the histogram small when the
    /// stream touches millions of blocks.
    pub fn with_bucket_width(width: u64) -> Self {
        ExactProfiler {
            stack: StackDistance::new(),
            histogram: Histogram::new(width),
            accesses: 0,
        }
    }

    /// Number of distinct blocks seen.
    pub fn distinct_blocks(&self) -> usize {
        self.stack.len()
    }
}

impl Profiler for ExactProfiler {
    fn access(&mut self, block: u64) {
        let distance = self.stack.access(block);
        self.histogram.add(distance, 1.0);
        self.accesses += 1;
    }

    fn histogram(&self) -> Histogram {
        let mut h = self.histogram.clone();
        h.set_accesses(self.accesses);
        h
    }
}

/// The exact stack-distance histogram of `trace`.
pub fn histogram(trace: impl IntoIterator<Item = u64>) -> Histogram {
    let mut p = ExactProfiler::new();
    trace.into_iter().for_each(|b| p.access(b));
    p.histogram()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stack distances by walking an explicit LRU stack: O(depth), obviously right.
    fn naive_distances(trace: &[u64]) -> Vec<Option<u64>> {
        let mut stack: Vec<u64> = Vec::new();
        trace
            .iter()
            .map(|&b| {
                let pos = stack.iter().position(|&x| x == b);
                if let Some(p) = pos {
                    stack.remove(p);
                }
                stack.insert(0, b);
                pos.map(|p| p as u64 + 1)
            })
            .collect()
    }

    #[test]
    fn distances_of_a_small_trace() {
        let mut s = StackDistance::new();
        let got: Vec<_> = [1, 2, 3, 1, 1, 3, 2].iter().map(|&b| s.access(b)).collect();
        assert_eq!(got, [None, None, None, Some(3), Some(1), Some(2), Some(3)]);
    }

    #[test]
    fn distances_survive_many_compactions() {
        // 20 000 accesses over 300 blocks force compactions every few
        // hundred accesses; the distances must not notice.
        let mut rng = fastrand::Rng::with_seed(11);
        let trace: Vec<u64> = (0..20_000).map(|_| rng.u64(0..300)).collect();
        let mut s = StackDistance::new();
        let got: Vec<_> = trace.iter().map(|&b| s.access(b)).collect();
        assert_eq!(got, naive_distances(&trace));
        assert_eq!(s.len(), 300);
        // Memory stays bounded by the live blocks, not the accesses.
        assert!(s.owner.len() <= MIN_CAPACITY.max(600), "{}", s.owner.len());
    }

    #[test]
    fn remove_reports_depth_and_unlinks() {
        let mut s = StackDistance::new();
        for b in [1, 2, 3, 4] {
            s.access(b);
        }
        assert_eq!(s.remove(2), Some(3));
        assert_eq!(s.remove(2), None);
        assert_eq!(s.access(1), Some(3));
        assert_eq!(s.len(), 3);
    }

    #[test]
    fn histogram_counts_every_access() {
        let h = histogram([5, 6, 5, 5, 7, 6]);
        assert_eq!(h.accesses(), 6);
        assert_eq!(h.cold(), 3.0);
        assert_eq!(h.buckets(), &[1.0, 1.0, 1.0]);
    }
}
