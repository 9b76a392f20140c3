//! What one `PagemapTracer::poll` costs over guest RAM of a given size, all of it
//! present (the first poll, which records every page) and then with nothing new
//! (each later poll): `trace_poll [MiB]`, default 1024.

use std::time::Instant;

fn main() {
    let mib: usize = std::env::args()
        .nth(1)
        .map_or(1024, |s| s.parse().expect("MiB"));
    // Page-aligned, every page written: all present, as a busy guest's RAM.
    let len = mib << 20;
    let mem = vec![1u8; len + 4096];
    let base = (mem.as_ptr() as u64).next_multiple_of(4096);
    let ranges = vec![(0u16, base, len as u64)];
    let mut t = rebound_snapshot::PagemapTracer::new(std::process::id(), ranges).expect("pagemap");
    let s = Instant::now();
    let n = t.poll().expect("poll");
    println!(
        "first poll: {n} pages in {:.2} ms",
        s.elapsed().as_secs_f64() * 1e3
    );
    let s = Instant::now();
    for _ in 0..10 {
        t.poll().expect("poll");
    }
    println!(
        "later polls: {:.2} ms each",
        s.elapsed().as_secs_f64() * 1e2
    );
}
