//! End to end with a real crashed guest: the `default` image boots under
//! QEMU/TCG (2 vCPUs, 256 MiB of RAM in /dev/shm), the agent crashes it, QEMU
//! pauses it on the panic; then its RAM file is dumped by this crate and the
//! dumps are read by Debian's makedumpfile 1.7.2 and crash 8.0.2. Needs the
//! image (built here as the other crates' tests build it), QEMU, crash and
//! makedumpfile; fails, saying what to install, without them.

use crate::common;
use crate::crashed;

use std::path::Path;
use std::process::Command;

use common::{crash_osrelease, run, tool, MIB};
use crashed::{crashed_guest, Result};
use rebound_dump::inspect::DumpKind;
use rebound_dump::{inspect, Compress, DumpOptions, Dumper, Format};
use rebound_guestmem::{free_pages, KernelPageTables};

/// `makedumpfile --dump-dmesg DUMP OUT`: the guest's kernel log.
fn dmesg(dump: &Path, out: &Path) -> String {
    let (ok, o, e) = run(Command::new(tool("makedumpfile"))
        .arg("--dump-dmesg")
        .arg(dump)
        .arg(out));
    assert!(
        ok,
        "makedumpfile --dump-dmesg {} failed: {o}{e}",
        dump.display()
    );
    std::fs::read_to_string(out).unwrap()
}

fn assert_panic_in(log: &str, what: &str) {
    assert!(
        log.contains("sysrq") && log.contains("Kernel panic"),
        "{what}: the kernel log lacks the panic:\n{}",
        &log[log.len().saturating_sub(3000)..]
    );
}

#[test]
fn dumps_of_a_crashed_guest_are_read_by_makedumpfile_and_crash() -> Result<()> {
    let (crash, makedumpfile) = (tool("crash"), tool("makedumpfile"));
    eprintln!("{} and {}", crash.display(), makedumpfile.display());
    let dir = tempfile::Builder::new().prefix("dump-test").tempdir()?;
    let c = crashed_guest(
        256,
        "rebound.workload=none",
        false,
        &dir.path().join("regs.elf"),
    )?;
    let (mem, info, notes, release) = (&c.mem, &c.info, &c.notes, c.release.clone());
    assert_eq!(notes.iter().filter(|n| n.is_prstatus()).count(), 2);
    assert_eq!(info.osrelease, release);
    let free = free_pages(mem, info, &KernelPageTables::from_vmcoreinfo(info)?)?;
    eprintln!("free pages: {} MiB", free.bytes >> 20);

    let opts = |format| DumpOptions {
        format,
        chunk_bytes: 32 * MIB,
        threads: 2,
        batch_fsync: 2,
    };
    let (zlib, zstd) = (Format::kdump(Compress::Zlib), Format::kdump(Compress::Zstd));
    let cases = [
        ("elf", Format::Elf, false),
        ("elf-free", Format::Elf, true),
        ("kdump-zlib", zlib, true),
        ("kdump-zstd", zstd, false),
        ("kdump-lzo", Format::kdump(Compress::Lzo), false),
    ];
    for (name, format, filtered) in cases {
        let out = dir.path().join(name);
        let mut d = Dumper::new(mem).vmcoreinfo(&info.text).notes(notes);
        if filtered {
            d = d.filter(&free);
        }
        let report = d.write(&out, &opts(format), &mut ())?;
        eprintln!(
            "{name}: {} MiB file, {} pages dumped, {} zero, {} excluded, {:.2} s",
            report.file_bytes >> 20,
            report.pages_dumped,
            report.zero_pages,
            report.pages_excluded,
            report.elapsed.as_secs_f64()
        );
        assert!(report.warnings.is_empty(), "{:?}", report.warnings);
        assert_eq!(report.cpus, 2);
        assert_eq!(crash_osrelease(&out), release, "{name}");
        let i = inspect(&out)?;
        assert!(i.complete && i.cpus == 2, "{name}: {i:?}");
        assert_eq!(i.osrelease.as_deref(), Some(release.as_str()));
        if filtered {
            assert_eq!(i.pages_covered - report.pages_excluded, report.pages_dumped);
        }
    }

    // makedumpfile reads our ELF: the kernel log with the panic, and a
    // re-filtered (-d 31) kdump file that crash and makedumpfile read again.
    let elf = dir.path().join("elf");
    let log = dmesg(&elf, &dir.path().join("elf.dmesg"));
    assert_panic_in(&log, "ELF");
    assert_panic_in(
        &dmesg(&dir.path().join("elf-free"), &dir.path().join("ef.dmesg")),
        "ELF without free pages",
    );
    let d31 = dir.path().join("elf-d31");
    let (ok, o, e) = run(Command::new(&makedumpfile)
        .args(["-d", "31", "-c"])
        .arg(&elf)
        .arg(&d31));
    assert!(ok, "makedumpfile -d 31 -c on our ELF failed: {o}{e}");
    let i31 = inspect(&d31)?;
    let ours = inspect(&elf)?;
    eprintln!(
        "makedumpfile -d 31 -c: {} of {} pages kept, {} MiB",
        i31.pages_dumped,
        ours.pages_dumped,
        i31.file_bytes >> 20
    );
    assert_eq!(
        i31.kind,
        DumpKind::Kdump {
            compression: "zlib"
        }
    );
    assert!(i31.complete && i31.pages_dumped < ours.pages_dumped / 2);
    assert_eq!(crash_osrelease(&d31), release);
    assert_panic_in(&dmesg(&d31, &dir.path().join("d31.dmesg")), "-d 31 of ELF");

    // makedumpfile reads our kdump (zlib, lzo) as input too: dmesg and re-filtering.
    let kl = dir.path().join("kdump-lzo");
    assert_panic_in(&dmesg(&kl, &dir.path().join("kl.dmesg")), "kdump-lzo");
    let kz = dir.path().join("kdump-zlib");
    assert_panic_in(&dmesg(&kz, &dir.path().join("kz.dmesg")), "kdump-zlib");
    let kz31 = dir.path().join("kdump-zlib-d31");
    let (ok, o, e) = run(Command::new(&makedumpfile)
        .args(["-d", "31", "-l"])
        .arg(&kz)
        .arg(&kz31));
    assert!(ok, "makedumpfile -d 31 -l on our kdump failed: {o}{e}");
    assert_eq!(crash_osrelease(&kz31), release);
    assert_panic_in(
        &dmesg(&kz31, &dir.path().join("kz31.dmesg")),
        "-d 31 of kdump",
    );
    Ok(())
}
