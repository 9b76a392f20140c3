//! Dump throughput against QEMU's own `dump-guest-memory`, on one crashed
//! guest (the `default` image under TCG, 2 vCPUs, RAM touched by the memfill
//! workload). Every figure is timed until the file is on disk (QEMU's files
//! are fsynced after QEMU returns; ours fsync as they go). Prints, asserts
//! nothing.
//!
//! ```text
//! cargo run --release -p rebound-dump --example dump_bench -- [RAM_MIB] [FILL_MIB] [RUNS] [DIR]
//! ```
//! Defaults: 512 MiB guest, 320 MiB filled, 3 timed rounds over all cases
//! after one warm-up round, files in /var/tmp.

#[path = "../tests/common/crashed.rs"]
mod crashed;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crashed::{crashed_guest, Qmp, Result};
use rebound_dump::{Compress, DumpOptions, Dumper, Format, Progress};
use rebound_guestmem::{free_pages, KernelPageTables};

const MIB: u64 = 1 << 20;

fn arg(i: usize, default: u64) -> u64 {
    std::env::args()
        .nth(i)
        .map(|a| a.parse().expect("a number"))
        .unwrap_or(default)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Bytes the file takes on disk (holes left out).
fn size(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).map(|m| m.blocks() * 512).unwrap_or(0)
}

/// Seconds from each chunk's durability report, since the start.
struct Timeline {
    t0: Instant,
    durable: Vec<(f64, u64)>,
}

impl Progress for Timeline {
    fn durable(&mut self, gpa: std::ops::Range<u64>) {
        self.durable
            .push((self.t0.elapsed().as_secs_f64(), gpa.end - gpa.start));
    }
}

fn qemu_dump(q: &mut Qmp, format: &str, out: &Path) -> Result<f64> {
    let t = Instant::now();
    q.execute_args(
        "dump-guest-memory",
        serde_json::json!({"paging": false, "format": format,
                           "protocol": format!("file:{}", out.display())}),
        Instant::now() + Duration::from_secs(300),
    )?;
    std::fs::File::open(out)?.sync_all()?;
    Ok(t.elapsed().as_secs_f64())
}

fn main() -> Result<()> {
    let (ram_mib, fill_mib, runs) = (arg(1, 512), arg(2, 320), arg(3, 3) as usize);
    let dir = PathBuf::from(std::env::args().nth(4).unwrap_or("/var/tmp".into()));
    let dir = tempfile::Builder::new()
        .prefix("dump-bench")
        .tempdir_in(dir)?;
    let extra = format!("rebound.workload=memfill rebound.memfill={fill_mib}M");
    let c = crashed_guest(ram_mib, &extra, true, &dir.path().join("regs.elf"))?;
    let (mut q, mem, info, notes) = (c.qmp, &c.mem, &c.info, &c.notes);
    let notes_ms = c.notes_secs * 1e3;
    let t = Instant::now();
    let free = free_pages(mem, info, &KernelPageTables::from_vmcoreinfo(info)?)?;
    let free_ms = t.elapsed().as_secs_f64() * 1e3;
    println!(
        "guest: {ram_mib} MiB, {} MiB allocated in the RAM file, {} MiB free in the buddy allocator; \
         register notes from QEMU in {notes_ms:.1} ms, free pages found in {free_ms:.1} ms",
        mem.allocated_bytes()? >> 20,
        free.bytes >> 20
    );
    println!(
        "{:<34} {:>9} {:>9} {:>9} runs (s)",
        "what", "median s", "MiB/s", "disk MiB"
    );
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let report = |name: &str, secs: Vec<f64>, bytes: u64| {
        let m = median(secs.clone());
        let all: Vec<String> = secs.iter().map(|s| format!("{s:.2}")).collect();
        println!(
            "{name:<34} {m:>9.2} {:>9.0} {:>9} {}",
            ram_mib as f64 / m,
            bytes >> 20,
            all.join(" ")
        );
    };
    // (name, QEMU's format or ours, free pages left out)
    let (zlib, zstd) = (Format::kdump(Compress::Zlib), Format::kdump(Compress::Zstd));
    let cases = [
        ("QEMU dump-guest-memory elf", Err("elf"), false),
        (
            "QEMU dump-guest-memory kdump-zlib",
            Err("kdump-zlib"),
            false,
        ),
        ("rebound elf", Ok(Format::Elf), false),
        ("rebound kdump-zlib", Ok(zlib), false),
        ("rebound kdump-zstd", Ok(zstd), false),
        ("rebound kdump-lzo", Ok(Format::kdump(Compress::Lzo)), false),
        ("rebound elf, free pages left out", Ok(Format::Elf), true),
        ("rebound kdump-zstd, free left out", Ok(zstd), true),
    ];
    // Rounds over all cases, so each case sees the same disk history; the
    // first round only warms up.
    let mut secs = vec![Vec::new(); cases.len()];
    let mut bytes = vec![0; cases.len()];
    let mut timelines: Vec<Vec<Vec<(f64, u64)>>> = vec![Vec::new(); cases.len()];
    let out = dir.path().join("vmcore");
    for round in 0..=runs {
        for (k, (_, how, filtered)) in cases.iter().enumerate() {
            let _ = std::fs::remove_file(&out);
            let s = match how {
                Err(format) => qemu_dump(&mut q, format, &out)?,
                Ok(format) => {
                    let opts = DumpOptions {
                        format: *format,
                        chunk_bytes: 64 * MIB,
                        threads,
                        batch_fsync: 1,
                    };
                    let mut d = Dumper::new(mem).vmcoreinfo(&info.text).notes(notes);
                    if *filtered {
                        d = d.filter(&free);
                    }
                    let mut tl = Timeline {
                        t0: Instant::now(),
                        durable: Vec::new(),
                    };
                    let r = d.write(&out, &opts, &mut tl)?;
                    if round > 0 {
                        timelines[k].push(tl.durable);
                    }
                    r.elapsed.as_secs_f64()
                }
            };
            if round > 0 {
                secs[k].push(s);
            }
            bytes[k] = size(&out);
        }
    }
    std::fs::remove_file(&out)?;
    for (k, (name, _, _)) in cases.iter().enumerate() {
        report(name, secs[k].clone(), bytes[k]);
        // The durability timeline of the median run.
        let m = median(secs[k].clone());
        if let Some(i) = secs[k]
            .iter()
            .position(|&s| s == m)
            .filter(|_| !timelines[k].is_empty())
        {
            let steps: Vec<String> = timelines[k][i]
                .iter()
                .map(|(t, _)| format!("{:.0}", t * 1e3))
                .collect();
            println!(
                "    64 MiB chunks durable at ms (median run): {} ({threads} threads)",
                steps.join(" ")
            );
        }
    }
    Ok(())
}
