//! SHARDS: sampled stack distances (Waldspurger, Park, Garthwaite and
//! Ahmad, "Efficient MRC Construction with SHARDS", FAST '15).
//!
//! SHARDS samples by block, not by access: a block is in the sample when
//! `hash(block) mod P < T`, so every access to a sampled block is seen and
//! the sampled blocks' stack distances among themselves are exact. The
//! sample is a fraction `R = T / P` of the blocks, so a sampled distance `d`
//! stands for about `d / R` distinct blocks of the full stream; each
//! distance is scaled by `1 / R` before it is counted (precisely, see
//! below). The stack of sampled blocks is the exact structure of
//! [`crate::stack`].
//!
//! - [`Shards::fixed_rate`] keeps `R` fixed; memory grows with the number of
//!   distinct blocks times `R`.
//! - [`Shards::fixed_size`] bounds memory instead: it tracks at most `s_max` sampled
//!   blocks. When one more would be admitted, the blocks with the highest
//!   hash value leave the sample and `T` drops to that value, so the sample
//!   is again "hash below `T`", at a lower rate. Each access is counted with
//!   the weight `1 / R` of its own rate, and [`Profiler::histogram`] scales
//!   the counts by the current `R`: the paper's rescaling by `R_new / R_old`
//!   at every drop, done once.
//!
//!   Once `T` has dropped, the sample is the `s` blocks of lowest hash among
//!   the `n` seen, so an access to a block seen before is sampled with
//!   probability `s / n`, not `T / P`; `s / R` is only the k-minimum-values
//!   estimate of `n`, about `1 / sqrt(s)` off (1.1% at 8K blocks) one way
//!   for a whole run. The fixed-size sampler also keeps a HyperLogLog sketch
//!   of every block seen (64 KiB, about 0.4%) and combines the two estimates
//!   of `n`; distances and weights of reuses use `s / n`, and the cold
//!   misses (one per distinct block) are `n` itself.
//!
//! SHARDS_adj (from the same paper): a few hot blocks in or out
//! of the sample make the number of sampled accesses differ from its
//! expectation `N * R` (`N` accesses in all), and that error lands mostly on
//! the smallest distances. The adjustment adds the difference to the first
//! bucket, so the histogram totals `N * R`. It is applied by default. At a
//! fixed size each count already carries its own rate's weight, so the
//! target is `N` before the final scaling; and since those weights rest on
//! the estimate of `n`, only the share of the difference that the sample's
//! own spread explains is added (see `Shards::adjustment_share`): on a loop
//! the whole difference would be the error of `n`, moving the curve by it.
//!
//! A sampled distance `d` stands for `(d - 1) / R + 1` blocks: the `d - 1`
//! sampled blocks above the reused one stand for `(d - 1) / R`.
//!
//! Defaults: `P = 2^24` (the SHARDS paper's modulus); fixed rate
//! [`DEFAULT_RATE`] = 0.01, which samples a thousand pages of a 400 MiB
//! guest; fixed size [`DEFAULT_MAX_BLOCKS`] = 8192 blocks (8K, the paper's
//! constant-memory setting) starting at rate 1, so a stream touching fewer
//! blocks than that is profiled exactly. The hash is XXH3 with a fixed seed,
//! so a run is reproducible.

use std::collections::BinaryHeap;

use crate::hash::{block_hash, BlockMap};
use crate::histogram::{Histogram, Profiler};
use crate::stack::StackDistance;
use distinct::Distinct;

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
    /// For the fixed-size variant: the bound, the sampled blocks by hash and
    /// the count of blocks seen.
    limit: Option<FixedSize>,
}

#[derive(Clone, Debug)]
struct FixedSize {
    max_blocks: usize,
    /// The sampled blocks by hash, highest first (the next to leave).
    by_hash: BinaryHeap<(u64, u64)>,
    /// Every block seen, sampled or not.
    distinct: Distinct,
    /// Accesses to each sampled block: how unequal they are says how far
    /// the sampled accesses may stray from their expectation (SHARDS_adj).
    counts: BlockMap<u32>,
    /// Whether the threshold has dropped: from then on the sample is the
    /// `s` blocks of lowest hash among the `n` seen.
    dropped: bool,
    /// The fraction `s / n` of the seen blocks that the sample holds, as
    /// last estimated, and whether the sample or the sketch changed since.
    held: f64,
    stale: bool,
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
        s.limit = Some(FixedSize {
            max_blocks,
            by_hash: BinaryHeap::new(),
            distinct: Distinct::new(),
            counts: BlockMap::default(),
            dropped: false,
            held: 1.0,
            stale: true,
        });
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
    /// the highest hash value and lowers the threshold to that value.
    fn shrink(&mut self) {
        let Some(fs) = &mut self.limit else {
            return;
        };
        while self.stack.len() > fs.max_blocks {
            let Some(&(top, _)) = fs.by_hash.peek() else {
                return;
            };
            while let Some(&(h, block)) = fs.by_hash.peek() {
                if h < top {
                    break;
                }
                fs.by_hash.pop();
                fs.counts.remove(&block);
                self.stack.remove(block);
            }
            self.threshold = top;
            fs.dropped = true;
            fs.stale = true;
        }
    }

    /// The probability that an access to a block already seen is sampled:
    /// the rate for a fixed rate, or until a fixed-size sample first drops
    /// its threshold; after that, the fraction `s / n` of the seen blocks
    /// that the sample holds.
    ///
    /// Why not `T / P`: a fixed-size sample's threshold is the `(s + 1)`-th
    /// lowest hash of the `n` blocks seen, so `s / R` is the k-minimum-values
    /// estimate of `n`, off by about `1 / sqrt(s)` (1.1% at 8K blocks) one
    /// way or the other for a whole run; every distance is scaled by it and
    /// SHARDS_adj makes the histogram total `N * R`, so the whole curve moved
    /// by that error, the same way at every size (on blocks `0..100_000` the
    /// hash puts `R` 2.1% high, and the curve was 0.012 low). `n` is
    /// estimated instead from both the threshold and a HyperLogLog sketch
    /// of every block seen (0.4%), weighted by the inverse of their
    /// variances.
    fn reuse_rate(&mut self) -> f64 {
        let rate = self.rate();
        let Some(n) = self.seen_estimate() else {
            return rate;
        };
        let s = self.stack.len() as f64;
        let fs = self.limit.as_mut().expect("a fixed-size sample");
        if fs.stale {
            fs.held = (s / n).min(1.0);
            fs.stale = false;
        }
        fs.held
    }

    /// Fixed size, once the threshold has dropped: the estimated number of
    /// distinct blocks seen, from the threshold (`s / R`, relative variance
    /// `1 / (s - 1)`) and from the sketch, weighted by the inverse of their
    /// variances. Recomputed only when stale (see [`Shards::reuse_rate`]).
    fn seen_estimate(&self) -> Option<f64> {
        let fs = self.limit.as_ref().filter(|fs| fs.dropped)?;
        if !fs.stale {
            return Some(self.stack.len() as f64 / fs.held);
        }
        let s = self.stack.len() as f64;
        let (var_threshold, var_sketch) = self.seen_variances();
        let by_threshold = s / self.rate();
        let by_sketch = fs.distinct.estimate();
        Some((by_threshold * var_sketch + by_sketch * var_threshold) / (var_sketch + var_threshold))
    }

    /// Relative variances of the two estimates of the blocks seen.
    fn seen_variances(&self) -> (f64, f64) {
        let s = self.stack.len() as f64;
        (1.0 / (s - 1.0).max(1.0), distinct::RELATIVE_VARIANCE)
    }

    /// The share of SHARDS_adj to apply. At a fixed rate, all of it (the
    /// paper's). At a fixed size, the expected count `N` is itself
    /// estimated (the weights are `n / s`), so the difference between it and
    /// the sampled count is partly the error of `n`; the share is the
    /// sample's own variance over the sum of both. A sample of `s` of `n`
    /// blocks whose access counts have a coefficient of variation `cv`
    /// counts accesses with a relative variance of `(1 - s/n) cv^2 / s`: near 0
    /// for a loop, whose every block is accessed alike (there SHARDS_adj
    /// would only move the curve by the error of `n`), large for a skewed
    /// stream, where a hot block in or out of the sample is what it corrects.
    fn adjustment_share(&self) -> f64 {
        let Some(fs) = self.limit.as_ref().filter(|fs| fs.dropped) else {
            return 1.0;
        };
        let s = fs.counts.len() as f64;
        if s < 2.0 {
            return 1.0;
        }
        let mean = fs.counts.values().map(|&c| f64::from(c)).sum::<f64>() / s;
        let var = fs
            .counts
            .values()
            .map(|&c| (f64::from(c) - mean).powi(2))
            .sum::<f64>()
            / (s - 1.0);
        let held = self.stack.len() as f64 / self.seen_estimate().unwrap_or(s);
        let var_sample = (1.0 - held).max(0.0) * var / (mean * mean) / s;
        let (vt, vs) = self.seen_variances();
        let var_seen = vt * vs / (vt + vs);
        var_sample / (var_sample + var_seen)
    }

    /// What one sampled access taken at `rate` adds to the histogram: 1 at
    /// a fixed rate; `1 / rate` at a fixed size, whose rate falls, so the
    /// counts estimate the whole stream's until [`Profiler::histogram`]
    /// scales them to the current rate (the paper's `T' / T` at every drop).
    fn weight(&self, rate: f64) -> f64 {
        match self.limit {
            None => 1.0,
            Some(_) => 1.0 / rate,
        }
    }
}

impl Profiler for Shards {
    fn access(&mut self, block: u64) {
        self.accesses += 1;
        let hash = block_hash(block);
        let h = hash % MODULUS;
        if let Some(fs) = &mut self.limit {
            fs.stale |= fs.distinct.insert(hash);
        }
        if h >= self.threshold {
            return;
        }
        match self.stack.access(block) {
            Some(d) => {
                if let Some(fs) = &mut self.limit {
                    *fs.counts.entry(block).or_default() += 1;
                }
                let rate = self.reuse_rate();
                // The `d - 1` sampled blocks in between stand for
                // `(d - 1) / R` blocks of the stream (`d / R` would count
                // the block itself `1 / R` times).
                let scaled = ((d - 1) as f64 / rate).round() as u64 + 1;
                self.histogram.add(Some(scaled), self.weight(rate));
            }
            None => {
                // A block never seen is admitted with probability `T / P`.
                self.histogram.add(None, self.weight(self.rate()));
                if let Some(fs) = &mut self.limit {
                    fs.by_hash.push((h, block));
                    fs.counts.insert(block, 1);
                    fs.stale = true;
                    self.shrink();
                }
            }
        }
    }

    fn histogram(&self) -> Histogram {
        let mut h = self.histogram.clone();
        h.set_accesses(self.accesses);
        // Every distinct block is one cold miss: once a fixed-size sample
        // has dropped its threshold, their count is the estimate of the
        // blocks seen, better than the admissions, which count `n` no
        // better than the threshold does.
        if let Some(n) = self.seen_estimate() {
            h.add(None, n - h.cold());
        }
        let sampled = h.total();
        // With nothing sampled there is nothing to adjust: the histogram
        // stays empty and a curve of it is refused.
        if self.adjust && sampled > 0.0 {
            // At a fixed size the counts already estimate the stream's, so
            // the target is `N` itself: each access's own rate is in them.
            let expected = match self.limit {
                None => self.accesses as f64 * self.rate(),
                Some(_) => self.accesses as f64,
            };
            h.add(Some(1), self.adjustment_share() * (expected - sampled));
        }
        if self.limit.is_some() {
            h.scale(self.rate());
        }
        h
    }
}

mod distinct;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod accuracy;
