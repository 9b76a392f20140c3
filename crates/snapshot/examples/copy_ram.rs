//! Copies a guest RAM file into a RAM image the way a snapshot does and prints the
//! throughput: `copy_ram <ram file> <image> [chunk MiB]`. The image is replaced.

use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        eprintln!("usage: copy_ram <ram file> <image> [chunk MiB]");
        std::process::exit(2);
    }
    let (src, dst) = (
        std::path::Path::new(&args[1]),
        std::path::Path::new(&args[2]),
    );
    let chunk: u64 = args.get(3).map_or(2, |s| s.parse().expect("chunk MiB")) << 20;
    let size = std::fs::metadata(src).expect("ram file").len();
    let t = Instant::now();
    let b = rebound_snapshot::copy_ram_image(src, dst, size, chunk, &mut |_, _| {}).unwrap_or_else(
        |e| {
            eprintln!("copy_ram: {e}");
            std::process::exit(1)
        },
    );
    let s = t.elapsed().as_secs_f64();
    println!(
        "{} MiB ({} MiB data) in {:.3} s: {:.0} MB/s of data, {:.0} MB/s of RAM",
        size >> 20,
        b.data_bytes >> 20,
        s,
        b.data_bytes as f64 / s / 1e6,
        size as f64 / s / 1e6
    );
}
