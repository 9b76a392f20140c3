//! Read a guest's VMCOREINFO from its RAM file, as the daemon's
//! `/v1/vms/{name}/vmcoreinfo` endpoint does.
//!
//! ```text
//! cargo run -p rebound-guestmem --example vmcoreinfo -- RAM_FILE SIZE [MACHINE] [PADDR NOTE_SIZE]
//! ```
//! SIZE accepts a `M`/`G` suffix; MACHINE is QEMU's `-machine` argument
//! (`pc`, `q35`, `pc,max-ram-below-4g=2G`, ...; default `pc`). With PADDR and NOTE_SIZE (the guest's
//! `/sys/kernel/vmcoreinfo`, hex) the note is read there; otherwise RAM is scanned.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use rebound_guestmem::vmcoreinfo::parse_sysfs_vmcoreinfo;
use rebound_guestmem::{find_vmcoreinfo, read_vmcoreinfo, GuestMemory, Layout};

fn parse_size(s: &str) -> Result<u64> {
    let (digits, shift) = match s.as_bytes().last() {
        Some(b'G' | b'g') => (&s[..s.len() - 1], 30),
        Some(b'M' | b'm') => (&s[..s.len() - 1], 20),
        _ => (s, 0),
    };
    let n: u64 = digits.parse().with_context(|| format!("bad size {s:?}"))?;
    n.checked_mul(1 << shift).context("size overflows")
}

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if !(2..=5).contains(&args.len()) {
        bail!("usage: vmcoreinfo RAM_FILE SIZE [MACHINE] [PADDR NOTE_SIZE]");
    }
    let size = parse_size(&args[1])?;
    let machine = args.get(2).map(String::as_str).unwrap_or("pc");
    let layout = Layout::from_machine(machine, size)?;
    let mem = GuestMemory::open_ram_file(&args[0], layout)?;
    let t0 = Instant::now();
    let (paddr, info, source) = match (args.get(3), args.get(4)) {
        (Some(a), Some(s)) => {
            let (paddr, note_size) = parse_sysfs_vmcoreinfo(&format!("{a} {s}"))?;
            (paddr, read_vmcoreinfo(&mem, paddr, note_size)?, "agent")
        }
        (None, None) => {
            let f = find_vmcoreinfo(&mem)?;
            (f.paddr, f.info, "scan")
        }
        _ => bail!("give both PADDR and NOTE_SIZE, or neither"),
    };
    let elapsed = t0.elapsed();
    println!("osrelease {}", info.osrelease);
    println!("paddr {paddr:#x} ({source})");
    println!("entries {}", info.raw.len());
    println!(
        "data_bytes {} of {} RAM bytes",
        mem.allocated_bytes()?,
        layout.ram_size()
    );
    println!("elapsed_ms {:.3}", elapsed.as_secs_f64() * 1e3);
    Ok(())
}
