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

    /// Every size from 1 block to 125% of the distinct blocks. (A coarser
    /// grid would weigh a loop's single step by whether a point happens to
    /// sit on it.)
    pub fn sizes(&self) -> impl Iterator<Item = u64> + '_ {
        1..=self.distinct * 5 / 4
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
        Case::new(
            "uniform 100k",
            testutil::uniform(seed, 100_000, 100_000 * k),
        ),
        Case::new(
            "zipf 0.9 100k",
            testutil::zipf(seed, 100_000, 0.9, 100_000 * k),
        ),
        Case::new("loop 30k", testutil::sequential(30_000, 30_000 * k)),
        Case::new(
            "phase uniform 40k+60k",
            testutil::phase_uniform(seed, 40_000, 60_000, 100_000 * k),
        ),
        Case::new(
            "phase loop 25k+50k",
            testutil::phase_loop(25_000, 50_000, 75_000 * k),
        ),
    ]
}

fn run(profiler: &mut impl Profiler, trace: &[u64]) -> Histogram {
    trace.iter().for_each(|&b| profiler.access(b));
    profiler.histogram()
}

/// Renamings averaged over in the report.
const REPORT_KEYS: u64 = 8;

/// Prints, per trace, the error of fixed-size SHARDS (8K blocks) on the
/// blocks as generated (`0..n`) and its mean over renamings, with and
/// without SHARDS_adj, and of fixed-rate SHARDS at the rate the fixed-size
/// sampler ended at.
#[test]
#[ignore = "a measurement: cargo test --release -p rebound-mrc accuracy_report -- --ignored --nocapture"]
fn accuracy_report() {
    let per_block = std::env::var("PER_BLOCK").map_or(10, |v| v.parse().unwrap());
    println!(
        "{:<26} {:>6} | {:>14} | {:>23} | {:>6} | {:>6}",
        "trace", "rate", "as generated", "8 renamings: MAE max signed", "no adj", "fixed R"
    );
    for seed in [1, 2] {
        for case in cases(seed, per_block) {
            let fixed_size = |trace: &[u64]| {
                let mut fs = Shards::fixed_size(DEFAULT_MAX_BLOCKS).unwrap();
                let h = run(&mut fs, trace);
                (case.errors(&h), fs.rate())
            };
            let ((mae0, signed0), rate) = fixed_size(&case.trace);
            let (mut mae, mut max, mut signed, mut raw, mut fr) = (0.0, 0.0f64, 0.0, 0.0, 0.0);
            let n = REPORT_KEYS as f64;
            for key in 0..REPORT_KEYS {
                let trace = case.renamed(key);
                let ((m, sg), rate) = fixed_size(&trace);
                mae += m / n;
                max = max.max(m);
                signed += sg / n;
                let mut r = Shards::fixed_size(DEFAULT_MAX_BLOCKS)
                    .unwrap()
                    .without_adjustment();
                raw += case.errors(&run(&mut r, &trace)).0 / n;
                let mut f = Shards::fixed_rate(rate).unwrap();
                fr += case.errors(&run(&mut f, &trace)).0 / n;
            }
            println!(
                "{:<26} {rate:>6.4} | {mae0:.4} {signed0:+.4} | {mae:.4} {max:.4} {signed:+.4}       | {raw:.4} | {fr:.4}",
                format!("{} seed {seed}", case.name),
            );
        }
    }
}

/// A loop over `K` blocks, `passes` times: every reuse is at distance `K`,
/// so the miss ratio is 1 below `K` and `1 / passes` (the first pass) from
/// `K` on. The sample's estimate of the step is the estimate of `K` (about
/// 0.4% off, from the sketch and threshold together), and SHARDS_adj could
/// move the level by as much, so 1% on the level and 2% on the step are
/// several times the expected error; before the fix the blocks `0..30_000`
/// put the level 2.4% low.
#[test]
fn fixed_size_loop_matches_its_closed_form() {
    for (k, passes) in [(30_000u64, 5), (60_000, 3)] {
        let trace = testutil::sequential(k, (k * passes) as usize);
        let mut fs = Shards::fixed_size(DEFAULT_MAX_BLOCKS).unwrap();
        let curve = MissRatioCurve::from_histogram(&run(&mut fs, &trace), 2 * k).unwrap();
        assert!(fs.rate() < 0.3, "the sample must have dropped its rate");
        let after = 1.0 / passes as f64;
        for c in (1..=k * 5 / 4).step_by(50) {
            let got = curve.miss_ratio(c).unwrap();
            if c <= k * 98 / 100 {
                assert!((got - 1.0).abs() <= 0.01, "K {k}, size {c}: {got}");
            } else if c >= k * 102 / 100 {
                assert!((got - after).abs() <= 0.01, "K {k}, size {c}: {got}");
            }
        }
    }
}

/// MAE against the exact curve on the generated traces, on the blocks as
/// generated and on two renamings: at most 0.005 on average per trace and
/// 0.01 for any one sample (the loops' worst renamings are near 0.008: the
/// estimate of `K` is a few tenths of a percent off), with no systematic
/// sign. Before the fix the blocks as generated gave 0.005 to 0.024, each
/// low.
#[test]
#[cfg_attr(debug_assertions, ignore = "1.5M exact accesses: run with --release")]
fn fixed_size_error_is_small_on_generated_traces() {
    let mut signed_sum = 0.0;
    let mut runs = 0.0;
    for case in cases(3, 4) {
        let traces = [case.trace.clone(), case.renamed(100), case.renamed(101)];
        let mut mae_sum = 0.0;
        for (i, trace) in traces.iter().enumerate() {
            let mut fs = Shards::fixed_size(DEFAULT_MAX_BLOCKS).unwrap();
            let (mae, signed) = case.errors(&run(&mut fs, trace));
            assert!(mae <= 0.01, "{} sample {i}: MAE {mae}", case.name);
            mae_sum += mae;
            signed_sum += signed;
            runs += 1.0;
        }
        let mean = mae_sum / traces.len() as f64;
        assert!(mean <= 0.005, "{}: mean MAE {mean}", case.name);
    }
    let signed = signed_sum / runs;
    assert!(signed.abs() <= 0.002, "mean signed error {signed}");
}

/// Accesses per second of fixed-size SHARDS (8K blocks), best of three, on
/// the crate doc's two streams.
#[test]
#[ignore = "a measurement: cargo test --release -p rebound-mrc throughput_report -- --ignored --nocapture"]
fn throughput_report() {
    let streams = [
        (
            "zipf 0.9, 2M over 200k",
            testutil::zipf(7, 200_000, 0.9, 2_000_000),
        ),
        (
            "uniform, 4M over 1M",
            testutil::uniform(9, 1_000_000, 4_000_000),
        ),
    ];
    for (name, trace) in &streams {
        let rates: Vec<f64> = (0..3)
            .map(|_| {
                let start = std::time::Instant::now();
                let mut fs = Shards::fixed_size(DEFAULT_MAX_BLOCKS).unwrap();
                std::hint::black_box(run(&mut fs, trace));
                trace.len() as f64 / start.elapsed().as_secs_f64() / 1e6
            })
            .collect();
        println!("{name}: {rates:.1?} M/s");
    }
}
