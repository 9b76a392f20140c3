//! Miss-ratio curves: the misses of an LRU cache at every size (paper
//! section 4.1, after Zhou et al. \[27\]).
//!
//! A curve is built from a stack-distance [`Histogram`]: by LRU's inclusion
//! property a cache of `s` blocks misses the cold misses and every access of
//! distance greater than `s`, so the misses at every size are suffix sums of
//! the histogram, all computed in one pass. Points are `step` blocks apart
//! (the histogram's bucket width; 1 gives every size). A size between two
//! points is answered with the point below it: misses never grow with the
//! size, so that answer is an upper bound, and exact at the points. The
//! points end at the requested maximum, or earlier where the histogram's
//! distances end, since the curve is flat from there. Beyond the last point
//! the last value is returned: exact in the second case, an upper bound in
//! the first.
//!
//! [`offset`] turns a curve traced by the hypervisor below a guest's direct
//! memory into the guest's own curve (paper sections 3.4 and 4.1).

pub mod offset;

use serde::{Deserialize, Serialize};

use crate::histogram::Histogram;

/// Errors of building or reading a curve.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum CurveError {
    #[error("the histogram counts no access")]
    EmptyHistogram,
    #[error("size {size} is below the smallest size the curve covers ({base})")]
    BelowBase { size: u64, base: u64 },
    #[error("a curve needs a step of at least one block")]
    ZeroStep,
    #[error("a curve needs at least one point")]
    NoPoints,
    #[error("a curve needs a positive, finite number of accesses, not {0}")]
    BadAccesses(f64),
    #[error("miss counts must be finite, non-negative, at most the accesses and never growing with the size")]
    BadMisses,
}

/// Misses of an LRU cache of each size from `base` to `max_size`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "CurveRepr", into = "CurveRepr")]
pub struct MissRatioCurve {
    base: u64,
    step: u64,
    /// Misses at sizes `base`, `base + step`, ... (non-increasing).
    misses: Vec<f64>,
    /// The denominator of miss ratios: the accesses the misses are out of.
    accesses: f64,
}

/// The serialised form, checked on the way in so that a curve read from a
/// file obeys the same invariants as one built here.
#[derive(Serialize, Deserialize)]
struct CurveRepr {
    base: u64,
    step: u64,
    accesses: f64,
    misses: Vec<f64>,
}

impl TryFrom<CurveRepr> for MissRatioCurve {
    type Error = CurveError;

    fn try_from(r: CurveRepr) -> Result<Self, CurveError> {
        MissRatioCurve::from_parts(r.base, r.step, r.misses, r.accesses)
    }
}

impl From<MissRatioCurve> for CurveRepr {
    fn from(c: MissRatioCurve) -> Self {
        CurveRepr {
            base: c.base,
            step: c.step,
            accesses: c.accesses,
            misses: c.misses,
        }
    }
}

impl MissRatioCurve {
    /// The curve of `histogram` at sizes `0, w, 2w, ...` up to `max_size`
    /// (or the histogram's end), `w` being the histogram's bucket width.
    pub fn from_histogram(histogram: &Histogram, max_size: u64) -> Result<Self, CurveError> {
        let total = histogram.total();
        if histogram.accesses() == 0 || total.is_nan() || total <= 0.0 {
            return Err(CurveError::EmptyHistogram);
        }
        let step = histogram.width();
        let buckets = histogram.buckets();
        // Size buckets.len() * step already hits every counted distance.
        let points = usize::try_from(max_size / step)
            .unwrap_or(usize::MAX)
            .min(buckets.len())
            + 1;
        // Misses at size j*step: cold plus buckets j.. (suffix sums).
        let mut suffix = vec![0.0; buckets.len() + 1];
        for i in (0..buckets.len()).rev() {
            suffix[i] = suffix[i + 1] + buckets[i];
        }
        let accesses = histogram.accesses() as f64;
        // Exactly 1 for the exact profiler, so its misses stay whole numbers.
        let scale = accesses / total;
        let mut last = f64::INFINITY;
        let misses = (0..points)
            .map(|j| {
                let farther = suffix[j];
                // SHARDS' first-bucket adjustment can push a ratio slightly
                // outside [0, 1]; clamp, and keep the curve non-increasing.
                let misses = histogram.cold() + histogram.beyond() + farther;
                let m = (misses * scale).clamp(0.0, accesses);
                last = last.min(m);
                last
            })
            .collect();
        Ok(MissRatioCurve {
            base: 0,
            step,
            misses,
            accesses,
        })
    }

    /// A curve from its parts, checked: `misses[i]` are the misses at size
    /// `base + i * step` out of `accesses`.
    pub fn from_parts(
        base: u64,
        step: u64,
        misses: Vec<f64>,
        accesses: f64,
    ) -> Result<Self, CurveError> {
        if step == 0 {
            return Err(CurveError::ZeroStep);
        }
        if misses.is_empty() {
            return Err(CurveError::NoPoints);
        }
        if !(accesses.is_finite() && accesses > 0.0) {
            return Err(CurveError::BadAccesses(accesses));
        }
        let in_range = |m: &f64| m.is_finite() && *m >= 0.0 && *m <= accesses;
        if !misses.iter().all(in_range) || misses.windows(2).any(|w| w[1] > w[0]) {
            return Err(CurveError::BadMisses);
        }
        Ok(MissRatioCurve {
            base,
            step,
            misses,
            accesses,
        })
    }

    /// Misses of a cache of `size` blocks (see the module doc for sizes
    /// between points and beyond the last one).
    pub fn misses(&self, size: u64) -> Result<f64, CurveError> {
        let above = size.checked_sub(self.base).ok_or(CurveError::BelowBase {
            size,
            base: self.base,
        })?;
        let i = usize::try_from(above / self.step).unwrap_or(usize::MAX);
        Ok(self.misses[i.min(self.misses.len() - 1)])
    }

    /// Miss ratio (misses per access) of a cache of `size` blocks.
    pub fn miss_ratio(&self, size: u64) -> Result<f64, CurveError> {
        Ok(self.misses(size)? / self.accesses)
    }

    /// Smallest size covered (0 unless the curve was shifted).
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Distance between two points, in blocks.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// Largest size with a point of its own.
    pub fn max_size(&self) -> u64 {
        self.base + (self.misses.len() as u64 - 1) * self.step
    }

    /// The accesses that miss ratios are out of.
    pub fn accesses(&self) -> f64 {
        self.accesses
    }

    /// Every point as (size, misses).
    pub fn points(&self) -> impl Iterator<Item = (u64, f64)> + '_ {
        let (base, step) = (self.base, self.step);
        self.misses
            .iter()
            .enumerate()
            .map(move |(i, &m)| (base + i as u64 * step, m))
    }
}

#[cfg(test)]
mod tests;
