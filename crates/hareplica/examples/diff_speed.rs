//! Speed of `diff_pages`: pages with 4 changed words each, hot in cache and spread over
//! a 10 MiB region (cold). `cargo run --release -p hareplica --example diff_speed`

use std::time::Instant;

use hareplica::diff_pages;

const PAGE: usize = 4096;

fn main() {
    // An argument shrinks the run (for instruction counting under valgrind).
    let quick = std::env::args().nth(1).is_some();
    let size = if quick { 1 << 20 } else { 10 << 20 };
    let npages = size / PAGE;
    let mut rng = fastrand::Rng::with_seed(1);
    let shadow: Vec<u8> = (0..size).map(|_| rng.u8(..)).collect();
    let mut cur = shadow.clone();
    for p in 0..npages {
        for _ in 0..4 {
            let off = p * PAGE + rng.usize(..PAGE / 8) * 8;
            cur[off..off + 8].copy_from_slice(&rng.u64(..).to_le_bytes());
        }
    }
    let mut out = Vec::new();
    for (name, pages) in [
        ("hot: same 8 pages", (0..8).collect::<Vec<_>>()),
        ("cold: all pages in order", (0..npages).collect()),
        ("cold: random pages", {
            let mut v: Vec<usize> = (0..npages).collect();
            rng.shuffle(&mut v);
            v
        }),
    ] {
        // The minimum over many short trials: the machine is shared, the minimum is the
        // cost of the code rather than of the neighbours.
        let reps = (20_000 / pages.len()).max(1);
        let mut per_page = f64::MAX;
        for _ in 0..if quick { 1 } else { 50 } {
            let t = Instant::now();
            for _ in 0..reps {
                out.clear();
                diff_pages(&shadow, &cur, &pages, PAGE, &mut out);
            }
            let ns = t.elapsed().as_secs_f64() * 1e9 / (reps * pages.len()) as f64;
            per_page = per_page.min(ns);
        }
        println!(
            "{name:<26} {per_page:7.1} ns/page  ({:.1} GB/s of page pairs)",
            2.0 * PAGE as f64 / per_page
        );
    }
}
