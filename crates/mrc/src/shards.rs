//! SHARDS: sampled stack distances (Waldspurger, Park, Garthwaite and
//! Ahmad, "Efficient MRC Construction with SHARDS", FAST '15).
//!
//! SHARDS samples by block, not by access: a block is in the sample when
//! `hash(block) mod P < T`, so every access to a sampled block is seen and
//! the sampled blocks' stack distances among themselves are exact. The
//! sample is a fraction `R = T / P` of the blocks, so a sampled distance `d`
//! stands for about `d / R` distinct blocks of the full stream; each
//! distance is scaled by `1 / R` before it is counted. The stack of sampled
//! blocks is the exact structure of [`crate::stack`].
//!
//! - [`Shards::fixed_rate`] keeps `R` fixed; memory grows with the number of
//!   distinct blocks times `R`.
//! - [`Shards::fixed_size`] bounds memory instead: it tracks at most `s_max` sampled
//!   blocks. When one more would be admitted, the blocks with the highest
//!   hash value leave the sample and `T` drops to that value, so the sample
//!   is again "hash below `T`", at a lower rate. Counts taken at the old
//!   rate are scaled by `R_new / R_old` so that the whole histogram reads
//!   as if sampled at the current rate.
//!
//! SHARDS_adj (from the same paper): a few hot blocks in or out
//! of the sample make the number of sampled accesses differ from its
//! expectation `N * R` (`N` accesses in all), and that error lands mostly on
//! the smallest distances. The adjustment adds the difference to the first
//! bucket, so the histogram totals `N * R`. It is applied by default.
//!
//! Defaults: `P = 2^24` (the SHARDS paper's modulus); fixed rate
//! [`DEFAULT_RATE`] = 0.01, which samples a thousand pages of a 400 MiB
//! guest; fixed size [`DEFAULT_MAX_BLOCKS`] = 8192 blocks (8K, the paper's
//! constant-memory setting) starting at rate 1, so a stream touching fewer
//! blocks than that is profiled exactly. The hash is XXH3 with a fixed seed,
//! so a run is reproducible.

use std::collections::BinaryHeap;

use crate::hash::block_hash;
use crate::histogram::{Histogram, Profiler};
use crate::stack::StackDistance;

/// The hash modulus `P`.
pub const MODULUS: u64 = 1 << 24;
/// Default sampling rate of [`Shards::fixed_rate`].
pub const DEFAULT_RATE: f64 = 0.01;
/// Default bound on the sampled blocks of [`Shards::fixed_size`].
pub const DEFAULT_MAX_BLOCKS: usize = 8192;

/// Errors of configuring a sampler.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ShardsError {
    #[error("a sampling rate must be in (0, 1] and at least 1/{MODULUS}, not {0}")]
    BadRate(f64),
    #[error("the fixed-size sample must hold at least one block")]
    ZeroMaxBlocks,
}

/// The threshold `T` for a rate.
pub(crate) fn threshold(rate: f64) -> Result<u64, ShardsError> {
    if !(rate > 0.0 && rate <= 1.0) {
        return Err(ShardsError::BadRate(rate));
    }
    // Rounded, so a rate of 1 samples every block.
    let t = (rate * MODULUS as f64).round() as u64;
    if t == 0 {
        return Err(ShardsError::BadRate(rate));
    }
    Ok(t)
}

/// `hash(block) mod P`.
pub(crate) fn spatial_hash(block: u64) -> u64 {
    block_hash(block) % MODULUS
}

/// A SHARDS sampler, of fixed rate or fixed size (see the module doc).
#[derive(Clone, Debug)]
pub struct Shards {
    stack: StackDistance,
    histogram: Histogram,
    threshold: u64,
    accesses: u64,
    adjust: bool,
    /// What one sampled access adds to the stored counts. Rescaling every
    /// stored count each time the rate drops would cost a pass over the
    /// histogram per drop; instead later accesses weigh more, by the
    /// inverse factor, and [`Profiler::histogram`] scales once.
    weight: f64,
    /// For the fixed-size variant: the bound and the sampled blocks by
    /// hash, highest first (the next to leave).
    limit: Option<(usize, BinaryHeap<(u64, u64)>)>,
}

impl Shards {
    /// Fixed-rate SHARDS at `rate` (in (0, 1]), with SHARDS_adj.
    pub fn fixed_rate(rate: f64) -> Result<Self, ShardsError> {
        Ok(Shards {
            stack: StackDistance::new(),
            histogram: Histogram::new(1),
            threshold: threshold(rate)?,
            accesses: 0,
            adjust: true,
            weight: 1.0,
            limit: None,
        })
    }

    /// Fixed-size SHARDS keeping at most `max_blocks` blocks, starting at
    /// rate 1, with SHARDS_adj.
    pub fn fixed_size(max_blocks: usize) -> Result<Self, ShardsError> {
        Self::fixed_size_from(max_blocks, 1.0)
    }

    /// As [`Shards::fixed_size`], starting at `rate` (in (0, 1]).
    pub fn fixed_size_from(max_blocks: usize, rate: f64) -> Result<Self, ShardsError> {
        if max_blocks == 0 {
            return Err(ShardsError::ZeroMaxBlocks);
        }
        let mut s = Self::fixed_rate(rate)?;
        s.limit = Some((max_blocks, BinaryHeap::new()));
        Ok(s)
    }

    /// Turns SHARDS_adj off (it is on by default).
    pub fn without_adjustment(mut self) -> Self {
        self.adjust = false;
        self
    }

    /// The current sampling rate `T / P`.
    pub fn rate(&self) -> f64 {
        self.threshold as f64 / MODULUS as f64
    }

    /// Number of blocks in the sample.
    pub fn sampled_blocks(&self) -> usize {
        self.stack.len()
    }

    /// Fixed size: while the sample is over its bound, drops the blocks of
    /// the highest hash value and lowers the threshold to that value,
    /// rescaling the counts to the new rate.
    fn shrink(&mut self) {
        let Some((max_blocks, by_hash)) = &mut self.limit else {
            return;
        };
        while self.stack.len() > *max_blocks {
            let Some(&(top, _)) = by_hash.peek() else {
                return;
            };
            while let Some(&(h, block)) = by_hash.peek() {
                if h < top {
                    break;
                }
                by_hash.pop();
                self.stack.remove(block);
            }
            self.weight *= self.threshold as f64 / top as f64;
            self.threshold = top;
        }
    }
}

impl Profiler for Shards {
    fn access(&mut self, block: u64) {
        self.accesses += 1;
        let h = spatial_hash(block);
        if h >= self.threshold {
            return;
        }
        let distance = self.stack.access(block);
        let rate = self.rate();
        let scaled = distance.map(|d| ((d as f64 / rate).round() as u64).max(1));
        self.histogram.add(scaled, self.weight);
        if let (None, Some((_, by_hash))) = (distance, &mut self.limit) {
            by_hash.push((h, block));
            self.shrink();
        }
    }

    fn histogram(&self) -> Histogram {
        let mut h = self.histogram.clone();
        h.set_accesses(self.accesses);
        if self.weight != 1.0 {
            h.scale(1.0 / self.weight);
        }
        let sampled = h.total();
        // With nothing sampled there is nothing to adjust: the histogram
        // stays empty and a curve of it is refused.
        if self.adjust && sampled > 0.0 {
            let expected = self.accesses as f64 * self.rate();
            h.add(Some(1), expected - sampled);
        }
        h
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod accuracy;
