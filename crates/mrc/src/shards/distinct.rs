//! A count of the distinct blocks a stream touched, in constant memory: a
//! HyperLogLog sketch (Flajolet et al. 2007) read with Ertl's estimator
//! ("New cardinality estimation algorithms for HyperLogLog sketches", 2017),
//! which needs no empirical bias tables and is nearly unbiased from a handful of
//! blocks to billions. Its relative error is about `1.04 / sqrt(m)`.
//!
//! Fixed-size SHARDS needs it because its own estimate of how many blocks it
//! has seen, `s / R` with `R` the threshold's rate, is the `k`-minimum-values
//! estimate with `k = s + 1`: about `1 / sqrt(s)` off (1.1% at 8K blocks),
//! and the error scales every distance and the SHARDS_adj target alike.

/// Index bits: `m = 2^16` registers, 64 KiB, about 0.4% relative error.
const INDEX_BITS: u32 = 16;
const REGISTERS: usize = 1 << INDEX_BITS;
/// Hash bits ranked: bits `24..48` of the 64-bit block hash. The low 24 bits
/// are SHARDS' sampling hash (`mod 2^24`), the top 16 pick the register, so
/// the sketch's error is independent of which blocks the sample holds.
const RANK_BITS: u32 = 24;

/// Relative variance of [`Distinct::estimate`], `1.04^2 / m` (an upper
/// bound: below about `2.5 m` blocks the estimator does better).
pub(super) const RELATIVE_VARIANCE: f64 = 1.04 * 1.04 / REGISTERS as f64;

#[derive(Clone, Debug)]
pub(super) struct Distinct {
    registers: Vec<u8>,
    /// How many registers hold each value `0..=RANK_BITS + 1`.
    counts: [u32; RANK_BITS as usize + 2],
}

impl Distinct {
    pub fn new() -> Self {
        let mut counts = [0; RANK_BITS as usize + 2];
        counts[0] = REGISTERS as u32;
        Distinct {
            registers: vec![0; REGISTERS],
            counts,
        }
    }

    /// Records a block by its 64-bit hash; true if the sketch changed.
    pub fn insert(&mut self, hash: u64) -> bool {
        let index = (hash >> (64 - INDEX_BITS)) as usize;
        let w = (hash >> 24) & ((1 << RANK_BITS) - 1);
        // Position of the first one bit of the 24, from the top: 1..=25.
        let rank = (w.leading_zeros() - (64 - RANK_BITS) + 1) as u8;
        let r = &mut self.registers[index];
        if rank <= *r {
            return false;
        }
        self.counts[*r as usize] -= 1;
        self.counts[rank as usize] += 1;
        *r = rank;
        true
    }

    /// Estimated number of distinct blocks recorded.
    pub fn estimate(&self) -> f64 {
        let m = REGISTERS as f64;
        let q = RANK_BITS as usize;
        let mut z = m * tau(1.0 - f64::from(self.counts[q + 1]) / m);
        for k in (1..=q).rev() {
            z = 0.5 * (z + f64::from(self.counts[k]));
        }
        z += m * sigma(f64::from(self.counts[0]) / m);
        if z.is_infinite() {
            return 0.0;
        }
        m * m / (2.0 * std::f64::consts::LN_2) / z
    }
}

/// `x + sum_{k>=1} x^(2^k) 2^(k-1)`, infinite at 1 (an empty sketch).
fn sigma(mut x: f64) -> f64 {
    if x == 1.0 {
        return f64::INFINITY;
    }
    let (mut y, mut z) = (1.0, x);
    loop {
        x *= x;
        let before = z;
        z += x * y;
        y += y;
        if z == before {
            return z;
        }
    }
}

/// `(1 - x - sum_{k>=1} (1 - x^(2^-k))^2 2^-k) / 3`.
fn tau(mut x: f64) -> f64 {
    if x == 0.0 || x == 1.0 {
        return 0.0;
    }
    let (mut y, mut z) = (1.0, 1.0 - x);
    loop {
        x = x.sqrt();
        let before = z;
        y *= 0.5;
        z -= (1.0 - x) * (1.0 - x) * y;
        if z == before {
            return z / 3.0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::block_hash;

    #[test]
    fn estimates_are_within_a_few_errors() {
        assert_eq!(Distinct::new().estimate(), 0.0);
        // Several ranges of block ids at each count; the relative error
        // should be about 0.4% (at most 0.4% below 2.5 m = 164k blocks).
        let sd = RELATIVE_VARIANCE.sqrt();
        for n in [100u64, 1_000, 20_000, 100_000, 300_000, 2_000_000] {
            let mut sum = 0.0;
            for start in [0u64, 1 << 32, 77_777_777] {
                let mut d = Distinct::new();
                (start..start + n).for_each(|b| {
                    d.insert(block_hash(b));
                });
                // Accesses again: a block seen twice counts once.
                (start..start + n / 2).for_each(|b| {
                    d.insert(block_hash(b));
                });
                let rel = d.estimate() / n as f64 - 1.0;
                assert!(rel.abs() < 4.0 * sd, "n {n} start {start}: {rel:+.4}");
                sum += rel;
            }
            // No bias beyond the error of a mean of three.
            assert!(
                (sum / 3.0).abs() < 3.0 * sd,
                "n {n}: mean {:+.4}",
                sum / 3.0
            );
        }
    }
}
