//! Times the VMCOREINFO scan against the naive way, side by side.
//!
//! ```text
//! cargo run --release -p rebound-guestmem --example scan_bench -- RAM_FILE SIZE [MACHINE] [RUNS]
//! ```
//! - `rebound`: [`find_vmcoreinfo`]: only the data extents (`SEEK_DATA`), 4 MiB preads.
//! - `naive`: every byte of the file in 4 MiB preads, same search and checks, also
//!   to the end (both must see every note to notice a stale copy).
//!
//! Both must report the same address; prints the median of RUNS (default 5),
//! the file's allocated bytes before and after (a scan must not grow them),
//! and the ratio.

use std::os::unix::fs::{FileExt, MetadataExt};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use rebound_guestmem::vmcoreinfo::{parse_note, NOTE_NAME};
use rebound_guestmem::{find_vmcoreinfo, GuestMemory, Layout, VmcoreInfo};

const CHUNK: usize = 4 << 20;

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

/// Reads the whole file and returns the RAM offsets of all valid notes
/// (all, like `find_vmcoreinfo`, which must see stale copies too).
fn naive_scan(file: &std::fs::File, size: u64) -> Result<Vec<u64>> {
    let mut found = Vec::new();
    let finder = memchr::memmem::Finder::new(&NOTE_NAME[..]);
    let mut buf = vec![0u8; CHUNK + 64 * 1024];
    let mut pos = 0u64;
    while pos < size {
        // Read a little past the chunk so a note starting near its end is whole.
        let len = (buf.len() as u64).min(size - pos) as usize;
        file.read_exact_at(&mut buf[..len], pos)?;
        let scan_len = len.min(CHUNK);
        for hit in finder.find_iter(&buf[..scan_len]) {
            let Some(at) = hit.checked_sub(12).filter(|a| a % 4 == 0) else {
                continue;
            };
            if let Ok(desc) = parse_note(&buf[at..len]) {
                if VmcoreInfo::parse(desc).is_ok() {
                    found.push(pos + at as u64);
                }
            }
        }
        pos += scan_len as u64;
    }
    Ok(found)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn run() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if !(2..=4).contains(&args.len()) {
        bail!("usage: scan_bench RAM_FILE SIZE [MACHINE] [RUNS]");
    }
    let size: u64 = match args[1].strip_suffix(['M', 'G']) {
        Some(n) if args[1].ends_with('G') => n.parse::<u64>()? << 30,
        Some(n) => n.parse::<u64>()? << 20,
        None => args[1].parse()?,
    };
    let layout = Layout::from_machine(args.get(2).map_or("pc", String::as_str), size)?;
    let runs: usize = args.get(3).map_or(Ok(5), |r| r.parse()).context("RUNS")?;
    ensure!(runs > 0, "RUNS must be at least 1");
    let file = std::fs::File::open(&args[0]).with_context(|| args[0].clone())?;
    let blocks = || file.metadata().map(|m| m.blocks() * 512);
    let before = blocks()?;

    let mem = GuestMemory::open_ram_file(&args[0], layout)?;
    let mut ours = Vec::new();
    let mut paddr = 0;
    for _ in 0..runs {
        let t0 = Instant::now();
        paddr = find_vmcoreinfo(&mem)?.paddr;
        ours.push(t0.elapsed());
    }
    let mut naive = Vec::new();
    let mut naive_offsets = Vec::new();
    for _ in 0..runs {
        let t0 = Instant::now();
        naive_offsets = naive_scan(&file, size)?;
        naive.push(t0.elapsed());
    }
    let naive_paddrs: Vec<_> = naive_offsets
        .iter()
        .filter_map(|&o| layout.offset_to_gpa(o))
        .collect();
    ensure!(
        naive_paddrs == [paddr],
        "naive scan found {naive_paddrs:x?}, rebound {paddr:#x}"
    );
    let (ours, naive) = (median(ours), median(naive));
    println!(
        "note at {paddr:#x}; data {} MiB of {} MiB",
        mem.allocated_bytes()? >> 20,
        size >> 20
    );
    println!(
        "rebound (SEEK_DATA + pread): {:8.1} ms",
        ours.as_secs_f64() * 1e3
    );
    println!(
        "naive   (pread every byte):  {:8.1} ms",
        naive.as_secs_f64() * 1e3
    );
    println!(
        "ratio naive/rebound: {:.2}",
        naive.as_secs_f64() / ours.as_secs_f64()
    );
    println!("allocated bytes before {before}, after {}", blocks()?);
    Ok(())
}
