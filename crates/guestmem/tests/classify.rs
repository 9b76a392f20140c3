//! Page classification against makedumpfile on a real guest: the image's
//! guest fills 64 MiB of anonymous memory, serves a file from its data disk
//! (page cache, ext4 buffer heads), gives 64 MiB to the balloon (offline
//! pages) and panics; QEMU pauses it. Its RAM file is classified, QEMU
//! dumps the same memory to an ELF, and makedumpfile filters that.
//! Every per-class count must match makedumpfile's report exactly, at seven
//! levels, and so must every page's fate in its dump's bitmap: the guest
//! is stopped, so both read the same bytes.
//!
//! Needs the image `make image` builds (`$REBOUND_HOME/images/default`),
//! QEMU and makedumpfile (`scripts/install-deps.sh`); fails, saying so,
//! without them.

use crate::common;

use std::fs::File;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use rebound_guestmem::{
    classify, find_vmcoreinfo, DumpLevel, ExcludedCounts, GuestMemory, Layout, PageClass,
};
use rebound_vmm::qemu::{
    Boot, Disk, DiskFormat, HostForward, Machine, MemoryBackend, NetBackend, Nic,
};

const RAM_MIB: u64 = 384;
const BALLOON_MIB: u64 = 64;

/// Waits until `path` (a console log) contains `what`; fails showing it.
fn wait_for_log(qemu: &mut Qemu, path: &Path, what: &str, within: Duration) {
    let t0 = Instant::now();
    loop {
        let log = std::fs::read_to_string(path).unwrap_or_default();
        if log.contains(what) {
            return;
        }
        qemu.assert_running();
        assert!(t0.elapsed() < within, "no {what:?} on the console: {log}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// GETs `path` from the guest's web workload; returns the body length.
fn http_get(port: u16, path: &str) -> usize {
    let t0 = Instant::now();
    loop {
        let attempt = (|| -> std::io::Result<Vec<u8>> {
            let mut s = TcpStream::connect((Ipv4Addr::LOCALHOST, port))?;
            s.set_read_timeout(Some(Duration::from_secs(30)))?;
            write!(
                s,
                "GET {path} HTTP/1.1\r\nHost: guest\r\nConnection: close\r\n\r\n"
            )?;
            let mut v = Vec::new();
            s.read_to_end(&mut v)?;
            Ok(v)
        })();
        match attempt {
            Ok(v) if v.starts_with(b"HTTP/1.1 200") => return v.len(),
            _ if t0.elapsed() < Duration::from_secs(60) => {
                std::thread::sleep(Duration::from_millis(200))
            }
            other => panic!("GET {path}: {other:?}"),
        }
    }
}

/// Makes QEMU's ELF readable by makedumpfile 1.7.2, which expects program
/// headers right after the ELF header: moves them to offset 64 and drops
/// the section headers. Returns the PT_LOAD ranges (guest physical).
fn fix_elf(path: &Path) -> Vec<Range<u64>> {
    let f = File::options().read(true).write(true).open(path).unwrap();
    let mut eh = [0u8; 64];
    f.read_exact_at(&mut eh, 0).unwrap();
    assert_eq!(&eh[..4], b"\x7fELF", "QEMU wrote an ELF");
    let u16_at = |b: &[u8], at: usize| u16::from_le_bytes(b[at..at + 2].try_into().unwrap());
    let u64_at = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    let phoff = u64_at(&eh, 32);
    let (phentsize, phnum) = (u16_at(&eh, 54) as usize, u16_at(&eh, 56) as usize);
    assert!(phnum > 0 && phnum < 0xffff, "{phnum} program headers");
    let mut ph = vec![0u8; phentsize * phnum];
    f.read_exact_at(&mut ph, phoff).unwrap();
    let loads = ph
        .chunks_exact(phentsize)
        .filter(|p| u32::from_le_bytes(p[..4].try_into().unwrap()) == 1)
        .map(|p| {
            let paddr = u64_at(p, 24);
            paddr..paddr + u64_at(p, 32)
        })
        .collect();
    eh[32..40].copy_from_slice(&64u64.to_le_bytes()); // e_phoff
    eh[40..48].copy_from_slice(&0u64.to_le_bytes()); // e_shoff
    eh[58..64].fill(0); // e_shentsize, e_shnum, e_shstrndx
    f.write_all_at(&eh, 0).unwrap();
    f.write_all_at(&ph, 64).unwrap();
    loads
}

/// The "Excluded pages" part of makedumpfile's report, and its "Original pages".
fn parse_report(text: &str) -> (ExcludedCounts, u64) {
    let field = |label: &str| -> u64 {
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with(label))
            .unwrap_or_else(|| panic!("no {label:?} in makedumpfile's report:\n{text}"));
        let hex = line.rsplit(':').next().unwrap().trim();
        u64::from_str_radix(hex.trim_start_matches("0x"), 16).unwrap()
    };
    let counts = ExcludedCounts {
        zero: field("Pages filled with zero"),
        cache: field("Non-private cache pages"),
        cache_private: field("Private cache pages"),
        user: field("User process data pages"),
        free: field("Free pages"),
        hwpoison: field("Hwpoison pages"),
        offline: field("Offline pages"),
        remaining: field("Remaining pages"),
    };
    (counts, field("Original pages"))
}

/// The dumpable-page bitmap (the second bitmap) of a kdump-compressed file:
/// bit `pfn % 8` of byte `pfn / 8`. Zero pages stay set in it (they are
/// written as one shared zero page), so it shows the struct page exclusions.
fn kdump_dumpable(path: &Path) -> Vec<u8> {
    let f = File::open(path).unwrap();
    let mut h = [0u8; 440];
    f.read_exact_at(&mut h, 0).unwrap();
    assert_eq!(&h[..8], b"KDUMP   ", "a kdump-compressed file");
    let int_at = |at: usize| u32::from_le_bytes(h[at..at + 4].try_into().unwrap()) as u64;
    let (block, sub_hdr, bitmap_blocks) = (int_at(428), int_at(432), int_at(436));
    let half = bitmap_blocks * block / 2;
    let mut bitmap = vec![0u8; half as usize];
    f.read_exact_at(&mut bitmap, (1 + sub_hdr) * block + half)
        .unwrap();
    bitmap
}

/// Runs `makedumpfile -d LEVEL` on `elf`; returns its report's counts,
/// its "Original pages", the whole output and its dumpable-page bitmap.
fn makedumpfile(
    elf: &Path,
    vmcoreinfo: &Path,
    level: u32,
    dir: &Path,
) -> (ExcludedCounts, u64, String, Vec<u8>) {
    let out = dir.join(format!("vmcore-{level}.kdump"));
    let run = Command::new("makedumpfile")
        .args(["-d", &level.to_string(), "--message-level", "31", "-i"])
        .arg(vmcoreinfo)
        .args([elf, &out])
        .output()
        .unwrap_or_else(|e| {
            panic!("running makedumpfile: {e}; scripts/install-deps.sh installs it (Debian package makedumpfile)")
        });
    let report =
        String::from_utf8_lossy(&run.stdout).into_owned() + &String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success(),
        "makedumpfile -d {level} failed:\n{report}"
    );
    let dumpable = kdump_dumpable(&out);
    std::fs::remove_file(&out).unwrap();
    let (counts, original) = parse_report(&report);
    (counts, original, report, dumpable)
}

#[test]
fn counts_per_class_match_makedumpfile_on_a_panicked_guest() {
    let home = rebound_home();
    let image = rebound_vmm::images::open(&home, "default").unwrap_or_else(|e| {
        panic!(
            "no default guest image under {}: run `make image` ({e})",
            home.display()
        )
    });
    let dir = tempfile::Builder::new()
        .prefix("guestmem-classify")
        .tempdir_in("/dev/shm")
        .unwrap();
    let d = dir.path();
    let (ram, serial, mon) = (d.join("ram"), d.join("serial"), d.join("hmp.sock"));
    let disk = d.join("data.ext4");
    std::fs::copy(&image.disk, &disk).unwrap();
    let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let boot = Boot {
        kernel: image.kernel.clone(),
        initrd: Some(image.initrd.clone()),
        append: format!(
            "{} rebound.workload=memfill,web rebound.memfill=64M",
            image.append
        ),
    };
    let backend = MemoryBackend::SharedFile(ram.clone());
    let mut q = guest_command(Machine::Pc, RAM_MIB, backend, boot, &serial).with_crash_devices();
    q.control.hmp = Some(mon.clone());
    let agent = d.join("agent.sock");
    q.control.agent = Some(agent.clone());
    q.disks.push(Disk::file(&disk, DiskFormat::Raw));
    q.nics.push(Nic {
        backend: NetBackend::User {
            forwards: vec![HostForward {
                bind: Ipv4Addr::LOCALHOST,
                host: port,
                guest: 8080,
            }],
        },
        mac: None,
        filters: vec![],
    });
    let mut qemu = spawn_qemu(&q, &d.join("qemu.log"));

    // Page cache from the data disk, anonymous memory from memfill.
    let body = http_get(port, "/blob-1m.bin");
    assert!(body > 1 << 20, "the blob came whole ({body} bytes)");
    wait_for_log(
        &mut qemu,
        &serial,
        "memfill: 64 MiB filled",
        Duration::from_secs(180),
    );
    // Ballooned pages are offline pages.
    hmp(&mon, &format!("balloon {}", RAM_MIB - BALLOON_MIB));
    let t0 = Instant::now();
    while !hmp(&mon, "info balloon").contains(&format!("actual={}", RAM_MIB - BALLOON_MIB)) {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "the balloon did not inflate"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The agent panics the kernel; pvpanic makes QEMU pause it.
    let mut link = std::os::unix::net::UnixStream::connect(&agent).unwrap();
    link.write_all(b"{\"cmd\":\"crash\"}\n").unwrap();
    let t0 = Instant::now();
    while !hmp(&mon, "info status").contains("guest-panicked") {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the guest did not panic"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    let mem = GuestMemory::open_ram_file(&ram, Layout::pc(RAM_MIB << 20).unwrap()).unwrap();
    let info = find_vmcoreinfo(&mem).unwrap().info;
    let t0 = Instant::now();
    let c = classify(&mem, &info).unwrap();
    let took = t0.elapsed();
    let counts = c.counts();
    let mb_s = RAM_MIB as f64 / took.as_secs_f64();
    eprintln!("classified {RAM_MIB} MiB in {took:.2?} ({mb_s:.0} MiB/s): {counts:?}");
    // What the workload put there is what we found.
    assert!(
        counts.user >= 64 << 8,
        "64 MiB of anonymous memory: {counts:?}"
    );
    assert!(counts.cache >= 256, "the 1 MiB blob is cached: {counts:?}");
    assert!(
        counts.cache_private > 0,
        "ext4 metadata with buffer heads: {counts:?}"
    );
    assert!(
        counts.free > 1 << 14,
        "a mostly idle guest has free memory: {counts:?}"
    );
    assert_eq!(counts.total(), RAM_MIB << 8);

    // The same memory through QEMU's ELF and makedumpfile.
    let elf = d.join("vmcore.elf");
    let out = hmp(&mon, &format!("dump-guest-memory {}", elf.display()));
    assert!(elf.exists(), "QEMU wrote no dump: {out}");
    let loads = fix_elf(&elf);
    let vmcoreinfo = d.join("vmcoreinfo");
    std::fs::write(&vmcoreinfo, &info.text).unwrap();
    eprintln!("PT_LOADs {loads:x?}");
    // Every bit alone, and mixes; makedumpfile sees the pages of QEMU's PT_LOADs only.
    for level in [31, 1, 2, 4, 8, 16, 22] {
        let (theirs, original, report, dumpable) = makedumpfile(&elf, &vmcoreinfo, level, d);
        assert_eq!(
            original,
            RAM_MIB << 8,
            "makedumpfile saw all of RAM:\n{report}"
        );
        let ours = c.excluded(DumpLevel::new(level).unwrap()).counts_in(&loads);
        eprintln!(
            "-d {level}: {:<14} {:>10} {:>14}",
            "class", "rebound", "makedumpfile"
        );
        for (name, a, b) in [
            ("zero", ours.zero, theirs.zero),
            ("cache", ours.cache, theirs.cache),
            ("cache private", ours.cache_private, theirs.cache_private),
            ("user", ours.user, theirs.user),
            ("free", ours.free, theirs.free),
            ("hwpoison", ours.hwpoison, theirs.hwpoison),
            ("offline", ours.offline, theirs.offline),
            ("remaining", ours.remaining, theirs.remaining),
        ] {
            eprintln!("       {name:<14} {a:>10} {b:>14}");
        }
        assert_eq!(ours, theirs, "-d {level}, makedumpfile's report:\n{report}");
        // The same pages, not just as many: every page's fate by its struct page
        // (the bitmap, read right, holds what the report says it does).
        let set: u32 = dumpable[..(RAM_MIB << 5) as usize]
            .iter()
            .map(|b| b.count_ones())
            .sum();
        assert_eq!(u64::from(set), theirs.remaining + theirs.zero, "-d {level}");
        let by_struct = c.excluded(DumpLevel::new(level & !1).unwrap());
        let differ: Vec<u64> = (0..RAM_MIB << 8)
            .filter(|&p| {
                (dumpable[p as usize / 8] >> (p % 8)) & 1 == u8::from(by_struct.is_excluded(p))
            })
            .collect();
        assert!(
            differ.is_empty(),
            "-d {level}: {} pages differ, first {:x?}",
            differ.len(),
            &differ[..differ.len().min(8)]
        );
    }

    // A dump writer skipping our ranges writes what makedumpfile keeps.
    let excluded = c.excluded(DumpLevel::ALL);
    let left_out: u64 = excluded
        .excluded_ranges()
        .iter()
        .map(|r| r.end - r.start)
        .sum::<u64>()
        / 4096;
    assert_eq!(
        left_out + c.excluded(DumpLevel::ALL).counts().remaining,
        RAM_MIB << 8
    );
    // Memfill's pages (data, not zero) go at -d 31 and stay at -d 23 (no bit 8).
    let filled = (0..RAM_MIB << 8)
        .find(|&p| c.class(p) == Some(PageClass::User) && c.is_zero(p) == Some(false))
        .unwrap();
    assert!(excluded.is_excluded(filled));
    assert!(!c.excluded(DumpLevel::new(23).unwrap()).is_excluded(filled));
}
