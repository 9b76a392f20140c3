//! Classify a paused guest's pages from its RAM file, as a filtered dump
//! would, and print what a dump level leaves out (makedumpfile's report).
//!
//! ```text
//! cargo run --release -p rebound-guestmem --example classify -- RAM_FILE [MACHINE] [LEVEL]
//! ```
//! The RAM size is the file's size; MACHINE is QEMU's `-machine` argument
//! (default `pc`); LEVEL is makedumpfile's `-d` (default 31). VMCOREINFO is
//! found by scanning RAM.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use rebound_guestmem::{classify, find_vmcoreinfo, DumpLevel, GuestMemory, Layout};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (1..=3) = args.len() else {
        bail!("usage: classify RAM_FILE [MACHINE] [LEVEL]");
    };
    let size = std::fs::metadata(&args[0])
        .with_context(|| format!("cannot stat {}", args[0]))?
        .len();
    let machine = args.get(1).map(String::as_str).unwrap_or("pc");
    let level = match args.get(2) {
        Some(l) => DumpLevel::new(l.parse().context("LEVEL is a number")?)?,
        None => DumpLevel::ALL,
    };
    let mem = GuestMemory::open_ram_file(&args[0], Layout::from_machine(machine, size)?)?;
    let info = find_vmcoreinfo(&mem)?.info;
    let t0 = Instant::now();
    let c = classify(&mem, &info).context("dump unfiltered")?;
    let took = t0.elapsed().as_secs_f64();
    let allocated = mem.allocated_bytes()?;
    println!("osrelease {}", info.osrelease);
    println!("classes {:?}", c.counts());
    println!("level {} {:?}", level.bits(), c.excluded(level).counts());
    println!(
        "classified {} MiB ({} MiB allocated) in {:.1} ms: {:.0} MiB/s of guest RAM",
        size >> 20,
        allocated >> 20,
        took * 1e3,
        (size >> 20) as f64 / took
    );
    Ok(())
}
