//! Seeded synthetic traces for the tests, after the paper's microbenchmarks
//! (section 6.1): sequential loops, uniform random, Zipf, and classes.

/// `len` accesses looping over blocks `0..blocks` in order.
pub fn sequential(blocks: u64, len: usize) -> Vec<u64> {
    (0..blocks).cycle().take(len).collect()
}

/// `len` accesses drawn uniformly from `0..blocks`.
pub fn uniform(seed: u64, blocks: u64, len: usize) -> Vec<u64> {
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..len).map(|_| rng.u64(0..blocks)).collect()
}

/// `len` accesses to `0..blocks`, block `i` with probability proportional
/// to `1 / (i + 1)^skew`, then scattered so hot blocks are not neighbours.
pub fn zipf(seed: u64, blocks: u64, skew: f64, len: usize) -> Vec<u64> {
    let mut cdf: Vec<f64> = Vec::with_capacity(blocks as usize);
    let mut sum = 0.0;
    for i in 0..blocks {
        sum += 1.0 / ((i + 1) as f64).powf(skew);
        cdf.push(sum);
    }
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..len)
        .map(|_| {
            let x = rng.f64() * sum;
            let rank = cdf.partition_point(|&c| c < x) as u64;
            // A fixed odd multiplier permutes the ids (mod 2^64).
            rank.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        })
        .collect()
}

/// Classes of blocks accessed at different rates: a small hot set, a larger
/// warm set and a scan over cold blocks, interleaved at random.
pub fn classes(seed: u64, len: usize) -> Vec<u64> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut scan = 0u64;
    (0..len)
        .map(|_| match rng.u32(0..10) {
            0..=5 => rng.u64(0..20),
            6..=8 => 1_000 + rng.u64(0..200),
            _ => {
                scan = (scan + 1) % 400;
                10_000 + scan
            }
        })
        .collect()
}

/// `len` accesses whose working set changes halfway: the first half drawn
/// uniformly from `0..first`, the second from `first..first + second`.
pub fn phase_uniform(seed: u64, first: u64, second: u64, len: usize) -> Vec<u64> {
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..len)
        .map(|i| {
            if i < len / 2 {
                rng.u64(0..first)
            } else {
                first + rng.u64(0..second)
            }
        })
        .collect()
}

/// `len` accesses looping in order over `0..first` for the first half,
/// then over `first..first + second`.
pub fn phase_loop(first: u64, second: u64, len: usize) -> Vec<u64> {
    let mut t = sequential(first, len / 2);
    t.extend((first..first + second).cycle().take(len - len / 2));
    t
}
