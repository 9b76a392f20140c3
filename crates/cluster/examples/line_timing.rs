//! Times the restore line on synthetic clusters:
//! `cargo run --release -p rebound-cluster --example line_timing -- 1000 5000`.

use std::time::Instant;

use rebound_cluster::line::{solve, synthetic};

fn main() {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("sizes are VM counts"))
        .collect();
    let sizes = if sizes.is_empty() {
        vec![1000, 5000]
    } else {
        sizes
    };
    for n in sizes {
        for seed in 1..=3 {
            let input = synthetic(n, seed);
            let started = Instant::now();
            let line = solve(&input).expect("synthetic clusters are feasible");
            let took = started.elapsed();
            println!(
                "{n} VMs, {} dependencies, {} rings, seed {seed}: {:.3} s (total shift {:.1} s)",
                input.dependencies.len(),
                line.rings.len(),
                took.as_secs_f64(),
                line.total_shift_s
            );
        }
    }
}
