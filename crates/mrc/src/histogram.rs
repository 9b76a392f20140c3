//! Histograms of LRU stack distances, the common output of the exact
//! ([`crate::stack`]) and sampled ([`crate::shards`]) profilers.
//!
//! An access of stack distance `d` (1 for a block re-used with nothing in
//! between) hits every LRU cache of at least `d` blocks and misses every
//! smaller one (Mattson et al.'s inclusion property); a first access (a cold
//! miss) misses every cache. So the misses of a cache of `s` blocks are the
//! cold misses plus the accesses of distance greater than `s`, which is what
//! [`crate::curve::MissRatioCurve`] sums.
//!
//! Counts are `f64` because SHARDS weighs and rescales them; the exact
//! profiler's counts stay whole numbers (exact up to 2^53).
//!
//! Buckets are a dense vector, so at most [`MAX_BUCKETS`] of them are kept;
//! larger distances are counted together as `beyond`. A cache no larger
//! than the last bucket's end is still counted exactly; beyond that,
//! those accesses count as misses (an upper bound). Without the cap a
//! scaled SHARDS distance at a tiny rate could ask for gigabytes of
//! buckets; a stream over more pages than the cap wants wider buckets.

use serde::{Deserialize, Serialize};

/// Most buckets a histogram keeps: 2^24, 128 MiB of counts, pages of 4 KiB
/// up to 64 GiB at one page a bucket.
pub const MAX_BUCKETS: usize = 1 << 24;

/// Accesses counted by stack distance, in buckets of `width` blocks:
/// bucket `i` holds the distances `i * width + 1 ..= (i + 1) * width`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Histogram {
    width: u64,
    buckets: Vec<f64>,
    /// Finite distances past the last bucket that may be kept.
    beyond: f64,
    cold: f64,
    /// The accesses of the traced stream that the counts stand for; with
    /// sampling the counts are a scaled-down sample of these.
    accesses: u64,
}

impl Histogram {
    /// An empty histogram with buckets `width` blocks wide (at least 1).
    pub(crate) fn new(width: u64) -> Self {
        Histogram {
            width: width.max(1),
            buckets: Vec::new(),
            beyond: 0.0,
            cold: 0.0,
            accesses: 0,
        }
    }

    /// Counts `weight` accesses at `distance` (`None`: a cold miss).
    pub(crate) fn add(&mut self, distance: Option<u64>, weight: f64) {
        match distance {
            None => self.cold += weight,
            Some(d) => {
                let i = usize::try_from((d.max(1) - 1) / self.width).unwrap_or(usize::MAX);
                if i >= MAX_BUCKETS {
                    self.beyond += weight;
                    return;
                }
                if i >= self.buckets.len() {
                    self.buckets.resize(i + 1, 0.0);
                }
                self.buckets[i] += weight;
            }
        }
    }

    pub(crate) fn set_accesses(&mut self, accesses: u64) {
        self.accesses = accesses;
    }

    /// Multiplies every count by `factor` (SHARDS' rescaling when its rate drops).
    pub(crate) fn scale(&mut self, factor: f64) {
        self.cold *= factor;
        self.beyond *= factor;
        self.buckets.iter_mut().for_each(|c| *c *= factor);
    }

    /// Width of a bucket in blocks.
    pub fn width(&self) -> u64 {
        self.width
    }

    /// Counts of the finite distances, bucket by bucket.
    pub fn buckets(&self) -> &[f64] {
        &self.buckets
    }

    /// Count of finite distances too large for [`MAX_BUCKETS`] buckets.
    pub fn beyond(&self) -> f64 {
        self.beyond
    }

    /// Count of cold misses (infinite distance).
    pub fn cold(&self) -> f64 {
        self.cold
    }

    /// Number of accesses of the traced stream.
    pub fn accesses(&self) -> u64 {
        self.accesses
    }

    /// Sum of all counts, finite and cold: the denominator of miss ratios.
    pub fn total(&self) -> f64 {
        self.cold + self.beyond + self.buckets.iter().sum::<f64>()
    }

    /// Largest finite distance that may have been counted (the end of the
    /// last non-empty bucket); beyond it every cache misses only cold misses.
    pub fn max_distance(&self) -> u64 {
        self.buckets.len() as u64 * self.width
    }
}

/// Something that turns a stream of block accesses into a [`Histogram`].
pub trait Profiler {
    /// Records one access to `block`.
    fn access(&mut self, block: u64);

    /// The histogram of the accesses recorded so far.
    fn histogram(&self) -> Histogram;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_group_distances_by_width() {
        let mut h = Histogram::new(4);
        for d in [1, 4, 5, 9] {
            h.add(Some(d), 1.0);
        }
        h.add(None, 2.0);
        assert_eq!(h.buckets(), &[2.0, 1.0, 1.0]);
        assert_eq!(h.cold(), 2.0);
        assert_eq!(h.total(), 6.0);
        assert_eq!(h.max_distance(), 12);
        h.scale(0.5);
        assert_eq!(h.total(), 3.0);
    }

    #[test]
    fn huge_distances_do_not_grow_the_buckets() {
        let mut h = Histogram::new(1);
        h.add(Some(u64::MAX), 1.0);
        h.add(Some(MAX_BUCKETS as u64 + 1), 1.0);
        assert!(h.buckets().is_empty());
        assert_eq!(h.beyond(), 2.0);
        assert_eq!(h.total(), 2.0);
    }
}
