//! Accuracy of SHARDS against the exact curve on generated traces of 20k to
//! 100k distinct blocks: uniform, Zipf, a loop, and working sets that change
//! halfway. The report (`accuracy_report`, ignored by default) prints the
//! figures quoted in the crate's README; the tests below hold the bounds.

use super::*;
use crate::curve::MissRatioCurve;
use crate::{stack, testutil};

/// A generated trace and its exact curve.
pub(super) struct Case {
    pub name: &'static str,
    pub trace: Vec<u64>,
    pub exact: MissRatioCurve,
    /// Distinct blocks of the trace: the sizes checked run up to 1.25 times this.
    pub distinct: u64,
}

impl Case {
    pub fn new(name: &'static str, trace: Vec<u64>) -> Self {
        let mut p = stack::ExactProfiler::new();
        trace.iter().for_each(|&b| p.access(b));
        let distinct = p.distinct_blocks() as u64;
        let exact = MissRatioCurve::from_histogram(&p.histogram(), 2 * distinct).unwrap();
        Case {
            name,
            trace,
            exact,
            distinct,
        }
    }

    /// 100 evenly spaced sizes from 1.25% to 125% of the distinct blocks.
    pub fn sizes(&self) -> impl Iterator<Item = u64> + '_ {
        (1..=100).map(|i| i * self.distinct * 5 / 400)
    }

    /// The trace with its block ids XORed with a key: the same stream up to
    /// renaming, so the same exact curve, but another sample of blocks.
    pub fn renamed(&self, key: u64) -> Vec<u64> {
        let k = crate::hash::block_hash(key);
        self.trace.iter().map(|b| b ^ k).collect()
    }

    /// Mean absolute and mean signed error (estimate minus exact) in miss
    /// ratio over [`Case::sizes`].
    pub fn errors(&self, h: &Histogram) -> (f64, f64) {
        let approx = MissRatioCurve::from_histogram(h, 2 * self.distinct).unwrap();
        let (mut abs, mut signed, mut n) = (0.0, 0.0, 0.0);
        for s in self.sizes() {
            let e = approx.miss_ratio(s).unwrap() - self.exact.miss_ratio(s).unwrap();
            abs += e.abs();
            signed += e;
            n += 1.0;
        }
        (abs / n, signed / n)
    }
}

/// The traces: 20k to 100k distinct blocks, 10 accesses a block (the loops
/// fewer: each pass is the same), `seed` drawing the random ones.
pub(super) fn cases(seed: u64, per_block: usize) -> Vec<Case> {
    let k = per_block;
    vec![
        Case::new("uniform 20k", testutil::uniform(seed, 20_000, 20_000 * k)),
        Case::new("uniform 100k", testutil::uniform(seed, 100_000, 100_000 * k)),
        Case::new("zipf 0.9 100k", testutil::zipf(seed, 100_000, 0.9, 100_000 * k)),
        Case::new("loop 30k", testutil::sequential(30_000, 30_000 * k)),
        Case::new(
            "phase uniform 40k+60k",
            testutil::phase_uniform(seed, 40_000, 60_000, 100_000 * k),
        ),
        Case::new("phase loop 25k+50k", testutil::phase_loop(25_000, 50_000, 75_000 * k)),
    ]
}

fn run(profiler: &mut impl Profiler, trace: &[u64]) -> Histogram {
    trace.iter().for_each(|&b| profiler.access(b));
    profiler.histogram()
}

/// Renamings averaged over in the report.
const REPORT_KEYS: u64 = 8;

/// Prints, per trace, the mean over renamings of the MAE and of the signed
/// error of fixed-size SHARDS (8K blocks), with and without SHARDS_adj, and
/// of fixed-rate SHARDS at the rate the fixed-size sampler ended at.
#[test]
#[ignore = "a measurement: cargo test --release -p rebound-mrc accuracy_report -- --ignored --nocapture"]
fn accuracy_report() {
    println!(
        "{:<22} {:>7} | {:>7} {:>8} {:>7} | {:>7} {:>8} | {:>7} {:>8} | {:>7} {:>8}",
        "trace", "rate", "fs MAE", "signed", "max", "noadj", "signed", "fr MAE", "signed", "fr-noadj", "signed"
    );
    let per_block = std::env::var("PER_BLOCK").map_or(10, |v| v.parse().unwrap());
    for seed in [1, 2] {
        for case in cases(seed, per_block) {
            let mut sums = [0.0f64; 9];
            for key in 0..REPORT_KEYS {
                let trace = case.renamed(key);
                let mut fs = Shards::fixed_size(DEFAULT_MAX_BLOCKS).unwrap();
                let h = run(&mut fs, &trace);
                let rate = fs.rate();
                let (mae, signed) = case.errors(&h);
                let mut raw = Shards::fixed_size(DEFAULT_MAX_BLOCKS)
                    .unwrap()
                    .without_adjustment();
                let (mae_raw, signed_raw) = case.errors(&run(&mut raw, &trace));
                let mut fr = Shards::fixed_rate(rate).unwrap();
                let (mae_fr, signed_fr) = case.errors(&run(&mut fr, &trace));
                let mut frr = Shards::fixed_rate(rate).unwrap().without_adjustment();
                let (mae_frr, signed_frr) = case.errors(&run(&mut frr, &trace));
                let row = [
                    rate, mae, signed, mae, mae_raw, signed_raw, mae_fr, signed_fr, mae_frr,
                ];
                for (i, v) in row.iter().enumerate() {
                    if i == 3 {
                        sums[3] = sums[3].max(*v);
                    } else {
                        sums[i] += v / REPORT_KEYS as f64;
                    }
                }
                let _ = signed_frr;
            }
            println!(
                "{:<22} {:>7.4} | {:>7.4} {:>+8.4} {:>7.4} | {:>7.4} {:>+8.4} | {:>7.4} {:>+8.4} | {:>7.4}",
                format!("{} s{seed}", case.name),
                sums[0], sums[1], sums[2], sums[3], sums[4], sums[5], sums[6], sums[7], sums[8]
            );
        }
    }
}

#[test]
#[ignore = "diagnosis"]
fn diag_keys() {
    for case in cases(1, 10) {
        for key in [None, Some(0), Some(1), Some(2), Some(3), Some(4), Some(5)] {
            let trace = match key {
                None => case.trace.clone(),
                Some(k) => case.renamed(k),
            };
            let mut fs = Shards::fixed_size(DEFAULT_MAX_BLOCKS).unwrap();
            let h = run(&mut fs, &trace);
            let mut raw = Shards::fixed_size(DEFAULT_MAX_BLOCKS).unwrap().without_adjustment();
            let hr = run(&mut raw, &trace);
            let (mae, signed) = case.errors(&h);
            let (mae_r, signed_r) = case.errors(&hr);
            println!(
                "{:<22} {key:?} R*n/s {:.4} adj/total {:+.4} fs {mae:.4} {signed:+.4} noadj {mae_r:.4} {signed_r:+.4}",
                case.name,
                fs.rate() * case.distinct as f64 / DEFAULT_MAX_BLOCKS as f64,
                (h.total() - hr.total()) / h.total(),
            );
        }
    }
}

#[test]
#[ignore = "diagnosis"]
fn diag_hash() {
    // For block ranges start..start+n, the realised fraction below a few rates.
    for (start, mul) in [(0u64, 1u64), (1_000_000, 1), (0, 8), (0, 4096), (12345, 7)] {
        for n in [20_000u64, 50_000, 100_000, 1_000_000] {
            let mut line = format!("start {start} x{mul} n {n}:");
            for rate in [0.01, 0.0822, 0.4] {
                let t = threshold(rate).unwrap();
                let c = (start..start + n).filter(|b| spatial_hash(b * mul) < t).count() as f64;
                let z = (c - n as f64 * rate) / (n as f64 * rate * (1.0 - rate)).sqrt();
                line += &format!("  r{rate} z {z:+.2}");
            }
            // KMV: the 8193rd smallest hash.
            let mut hs: Vec<u64> = (start..start + n).map(|b| spatial_hash(b * mul)).collect();
            hs.sort_unstable();
            if n > 8192 {
                line += &format!("  R*n/s {:.4}", hs[8192] as f64 / MODULUS as f64 * n as f64 / 8192.0);
            }
            println!("{line}");
        }
    }
}
