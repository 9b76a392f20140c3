//! End to end: boot real Linux guests under QEMU with RAM in /dev/shm and
//! check what this crate reads against what the guest itself reports.
//!
//! Needs a bzImage: `REBOUND_TEST_KERNEL=/path/to/vmlinuz`, else the image
//! `make image` builds (`$REBOUND_HOME/images/default/vmlinuz`); without
//! either these tests fail, saying so. They boot four guests under TCG
//! (about a minute on a busy 2-core machine).

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use rebound_guestmem::maps::MapTarget;
use rebound_guestmem::vmcoreinfo::{encode_note, parse_sysfs_vmcoreinfo};
use rebound_guestmem::{
    find_vmcoreinfo, find_vmcoreinfo_all, free_pages, read_vmcoreinfo, Found, FreePages,
    GuestMemory, KernelPageTables, Layout, PageSource, VmcoreInfo,
};
use rebound_vmm::qemu::{Boot, Incoming, Machine, MemoryBackend};

const INIT: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
echo "UNAME=$(uname -r)"
echo "VMCOREINFO=$(cat /sys/kernel/vmcoreinfo)"
grep "System RAM" /proc/iomem | sed 's/^/IOMEM /'
echo "MEMFREE=$(grep MemFree /proc/meminfo | tr -s ' ' | cut -d' ' -f2)"
echo READY
while true; do sleep 1000; done
"#;

fn kernel() -> PathBuf {
    if let Some(k) = std::env::var_os("REBOUND_TEST_KERNEL") {
        return k.into();
    }
    let home = rebound_home();
    let k = home.join("images/default/vmlinuz");
    assert!(
        k.exists(),
        "no guest kernel at {}: run `make image` or set REBOUND_TEST_KERNEL",
        k.display()
    );
    k
}

/// A busybox initramfs whose init prints what the guest knows.
fn initramfs(dir: &Path) -> PathBuf {
    let root = dir.join("root");
    for d in ["bin", "proc", "sys", "dev"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::fs::copy("/usr/bin/busybox", root.join("bin/busybox")).expect(
        "no static busybox at /usr/bin/busybox: scripts/install-deps.sh installs it \
         (Debian package busybox-static)",
    );
    std::fs::write(root.join("init"), INIT).unwrap();
    let out = dir.join("initrd");
    let status = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "chmod +x init && find . | cpio -o -H newc --quiet > {}",
            out.display()
        ))
        .current_dir(&root)
        .status()
        .unwrap();
    assert!(
        status.success(),
        "cpio failed ({status}); scripts/install-deps.sh installs cpio"
    );
    out
}

struct Guest {
    qemu: Qemu,
    serial: PathBuf,
    ram: PathBuf,
}

struct Kernel {
    kernel: PathBuf,
    initrd: PathBuf,
}

impl Kernel {
    fn boot(&self) -> Boot {
        Boot {
            kernel: self.kernel.clone(),
            initrd: Some(self.initrd.clone()),
            append: "console=ttyS0 quiet panic=0".into(),
        }
    }
}

/// A scratch directory on tmpfs with the kernel and a fresh initramfs.
fn setup() -> (tempfile::TempDir, Kernel) {
    let dir = tempfile::Builder::new()
        .prefix("guestmem-boot")
        .tempdir_in("/dev/shm")
        .unwrap();
    let k = Kernel {
        kernel: kernel(),
        initrd: initramfs(dir.path()),
    };
    (dir, k)
}

/// Boots a guest with its RAM a shared file in `dir` and a human monitor on `monitor`.
fn boot(dir: &Path, k: &Kernel, machine: Machine, size_mib: u64, monitor: &Path) -> Guest {
    let name = format!("{machine:?}-{size_mib}");
    let ram = dir.join(format!("ram-{name}"));
    let serial = dir.join(format!("serial-{name}"));
    let backend = MemoryBackend::SharedFile(ram.clone());
    let mut q = guest_command(machine, size_mib, backend, k.boot(), &serial);
    q.control.hmp = Some(monitor.to_path_buf());
    Guest {
        qemu: spawn_qemu(&q, &dir.join(format!("qemu-{name}.log"))),
        serial,
        ram,
    }
}

/// What the guest printed about itself.
struct Report {
    uname: String,
    /// `/sys/kernel/vmcoreinfo`.
    sysfs: String,
    /// "System RAM" ranges of /proc/iomem.
    iomem: Vec<(u64, u64)>,
    /// MemFree in bytes.
    memfree: u64,
}

fn guest_report(g: &mut Guest) -> Report {
    let t0 = Instant::now();
    loop {
        g.qemu.assert_running();
        let log = std::fs::read_to_string(&g.serial).unwrap_or_default();
        if log.contains("READY") {
            let value = |k: &str| {
                log.lines()
                    .find_map(|l| l.split_once(k).map(|(_, v)| v.trim().to_string()))
                    .unwrap()
            };
            let iomem = log
                .lines()
                .filter_map(|l| l.split_once("IOMEM ").map(|(_, v)| v))
                .map(|v| {
                    let (range, _) = v.split_once(' ').unwrap();
                    let (a, b) = range.split_once('-').unwrap();
                    (
                        u64::from_str_radix(a, 16).unwrap(),
                        u64::from_str_radix(b, 16).unwrap() + 1,
                    )
                })
                .collect();
            return Report {
                uname: value("UNAME="),
                sysfs: value("VMCOREINFO="),
                iomem,
                memfree: value("MEMFREE=").parse::<u64>().unwrap() * 1024,
            };
        }
        assert!(
            t0.elapsed() < Duration::from_secs(180),
            "guest did not boot: {log}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn live_guests_vmcoreinfo_and_layout_match_what_the_guest_reports() {
    let (dir, k) = setup();
    let cases = [
        (Machine::Pc, 256, Layout::pc(256 * MIB).unwrap()),
        (Machine::Pc, 5 << 10, Layout::pc(5 * GIB).unwrap()),
        (Machine::Q35, 4 << 10, Layout::q35(4 * GIB).unwrap()),
    ];
    let monitor = |i: usize| dir.path().join(format!("mon-{i}.sock"));
    let mut guests: Vec<Guest> = cases
        .iter()
        .enumerate()
        .map(|(i, (m, mib, _))| boot(dir.path(), &k, *m, *mib, &monitor(i)))
        .collect();
    for (i, ((machine, mib, layout), g)) in cases.iter().zip(guests.iter_mut()).enumerate() {
        let what = format!("{machine:?} {mib} MiB");
        let Report {
            uname,
            sysfs,
            iomem,
            memfree,
        } = guest_report(g);
        let mem = GuestMemory::open_ram_file(&g.ram, *layout).unwrap();

        let before = allocated(&g.ram);
        let t0 = Instant::now();
        let found = find_vmcoreinfo(&mem).unwrap();
        let scan = t0.elapsed();
        assert_eq!(
            allocated(&g.ram),
            before,
            "{what}: the scan allocated guest RAM"
        );
        assert_eq!(found.info.osrelease, uname, "{what}");
        let (paddr, note_size) = parse_sysfs_vmcoreinfo(&sysfs).unwrap();
        assert_eq!(
            found.paddr, paddr,
            "{what}: scan and guest disagree on the note address"
        );
        assert_eq!(
            read_vmcoreinfo(&mem, paddr, note_size).unwrap(),
            found.info,
            "{what}"
        );
        assert_eq!(release_via_page_tables(&mem, &found.info), uname, "{what}");
        assert_eq!(found.info.page_size, 4096);
        // Free pages of the paused guest against its own MemFree.
        hmp(&monitor(i), "stop");
        let free = check_free_pages(&mem, &found.info, memfree, paddr, &what);
        if i == 0 {
            check_stale_notes(dir.path(), &g.ram, *layout, &found, &free);
        }
        // The same through the QEMU process (the path a lazily restored guest needs).
        let target = MapTarget::Path(g.ram.clone());
        let via_proc = GuestMemory::open_process(g.qemu.id(), &target, *layout).unwrap();
        let found_proc = find_vmcoreinfo(&via_proc).unwrap();
        assert_eq!(
            (found_proc.paddr, &found_proc.info),
            (paddr, &found.info),
            "{what}"
        );
        assert_eq!(
            allocated(&g.ram),
            before,
            "{what}: the process scan allocated guest RAM"
        );
        eprintln!(
            "{what}: note at {paddr:#x}, scan {:.1} ms over {} MiB of data",
            scan.as_secs_f64() * 1e3,
            mem.allocated_bytes().unwrap() >> 20
        );

        // The guest's own view of RAM (e820 via /proc/iomem) lies inside the
        // layout, and RAM above 4 GiB matches it exactly.
        let ranges: Vec<_> = layout.ranges().collect();
        for &(a, b) in &iomem {
            assert!(
                ranges.iter().any(|r| r.gpa <= a && b <= r.gpa + r.len),
                "{what}: guest RAM {a:#x}-{b:#x} outside layout {ranges:x?}"
            );
        }
        if layout.above_4g_size() > 0 {
            let high = ranges[1];
            assert!(
                iomem.contains(&(high.gpa, high.gpa + high.len)),
                "{what}: {iomem:x?}"
            );
        }
        let low_end = iomem
            .iter()
            .filter(|r| r.1 <= 4 * GIB)
            .map(|r| r.1)
            .max()
            .unwrap();
        // SeaBIOS reserves the top 128 KiB of low RAM for itself.
        assert!(
            layout.below_4g_size() - low_end <= 256 * 1024,
            "{what}: {low_end:#x}"
        );
    }
}

/// The kernel's `init_uts_ns.name.release`, read through its page tables.
fn release_via_page_tables<S: PageSource>(mem: &GuestMemory<S>, info: &VmcoreInfo) -> String {
    let pt = KernelPageTables::from_vmcoreinfo(info).unwrap();
    let uts = info.symbol("init_uts_ns").unwrap();
    // The walk and the kernel-image shortcut agree.
    assert_eq!(
        Some(pt.translate(mem, uts).unwrap().paddr),
        pt.symbol_paddr(uts)
    );
    // struct new_utsname: sysname[65], nodename[65], release[65], ...
    let release = uts + info.offset("uts_namespace", "name").unwrap() + 2 * 65;
    let mut buf = [0u8; 65];
    pt.read(mem, release, &mut buf).unwrap();
    let end = buf.iter().position(|&b| b == 0).unwrap();
    String::from_utf8(buf[..end].to_vec()).unwrap()
}

fn check_free_pages<S: PageSource>(
    mem: &GuestMemory<S>,
    info: &VmcoreInfo,
    memfree: u64,
    note: u64,
    what: &str,
) -> FreePages {
    let pt = KernelPageTables::from_vmcoreinfo(info).unwrap();
    let t0 = Instant::now();
    let free = free_pages(mem, info, &pt).unwrap();
    let took = t0.elapsed();
    let data = mem.data_ranges().unwrap();
    let dump = free.exclude_from(&data);
    let total = |v: &[std::ops::Range<u64>]| v.iter().map(|r| r.end - r.start).sum::<u64>();
    eprintln!(
        "{what}: buddy free {} KiB, guest MemFree {} KiB ({:.1} ms); \
         allocated {} MiB, to dump without free pages {} MiB",
        free.bytes >> 10,
        memfree >> 10,
        took.as_secs_f64() * 1e3,
        total(&data) >> 20,
        total(&dump) >> 20
    );
    assert!(total(&dump) <= total(&data));
    assert!(
        dump.iter().any(|r| r.contains(&note)),
        "{what}: the note is not dumped"
    );
    // MemFree also counts per-CPU lists (not marked buddy); the shell that
    // printed it freed a little since.
    assert!(
        free.bytes <= memfree + 8 * MIB,
        "{what}: {} > {memfree}",
        free.bytes
    );
    assert!(
        free.bytes + 32 * MIB >= memfree,
        "{what}: {} << {memfree}",
        free.bytes
    );
    // Pages the kernel is using are never free.
    assert!(
        !free.contains(note),
        "{what}: the VMCOREINFO page is 'free'"
    );
    let uts = pt
        .symbol_paddr(info.symbol("init_uts_ns").unwrap())
        .unwrap();
    assert!(!free.contains(uts), "{what}: init_uts_ns is 'free'");
    assert!(!free.contains(pt.top), "{what}: init_top_pgt is 'free'");
    free
}

/// Plants notes "left by a previous boot" in a copy of a paused guest's RAM:
/// one in a free page is told apart from the live note, one in a page the
/// kernel uses makes the scan refuse to choose.
fn check_stale_notes(dir: &Path, ram: &Path, layout: Layout, live: &Found, free: &FreePages) {
    let copy = dir.join("ram-with-stale-notes");
    let cp = Command::new("cp")
        .arg("--sparse=always")
        .arg(ram)
        .arg(&copy)
        .status()
        .unwrap();
    assert!(cp.success());
    let ko = live.info.kernel_offset.unwrap();
    let stale = live.info.text.replace(
        &format!("KERNELOFFSET={ko:x}\n"),
        &format!("KERNELOFFSET={:x}\n", ko + 0x20_0000),
    );
    assert_ne!(stale, live.info.text);
    let note = encode_note(stale.as_bytes());
    let in_free = free
        .ranges
        .iter()
        .find(|r| r.start >= 16 * MIB && r.end - r.start >= 0x2000)
        .unwrap()
        .start
        + 0x1000;
    write_at(&copy, layout.gpa_to_offset(in_free).unwrap(), &note);
    let mem = GuestMemory::open_ram_file(&copy, layout).unwrap();
    let (all, _) = find_vmcoreinfo_all(&mem).unwrap();
    assert_eq!(all.len(), 2);
    assert_eq!(find_vmcoreinfo(&mem).unwrap().paddr, live.paddr);

    let pt = KernelPageTables::from_vmcoreinfo(&live.info).unwrap();
    let text = pt
        .symbol_paddr(live.info.symbol("_stext").unwrap())
        .unwrap()
        + 0x100;
    write_at(&copy, layout.gpa_to_offset(text).unwrap(), &note);
    let e = find_vmcoreinfo(&mem).unwrap_err().to_string();
    assert!(e.contains("3 different VMCOREINFO notes"), "{e}");
}

/// Pages QEMU has mapped among `pages` pages from host address `base`.
fn present_pages(pid: u32, base: u64, pages: u64) -> usize {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(format!("/proc/{pid}/pagemap")).unwrap();
    let mut buf = vec![0u8; (pages * 8) as usize];
    f.read_exact_at(&mut buf, base / 4096 * 8).unwrap();
    buf.chunks_exact(8)
        .filter(|e| u64::from_le_bytes((*e).try_into().unwrap()) & (1 << 63) != 0)
        .count()
}

fn wait_migration(mon: &Path) {
    let t0 = Instant::now();
    loop {
        let info = hmp(mon, "info migrate");
        if info.contains("Migration status: completed") {
            return;
        }
        assert!(!info.contains("failed"), "migration failed: {info}");
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "migration stuck: {info}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn lazily_restored_guest_is_read_through_qemu_without_faulting_pages() {
    let (dir, k) = setup();
    let d = dir.path();
    let mon_a = d.join("mon-a.sock");
    let mut g = boot(d, &k, Machine::Pc, 256, &mon_a);
    let Report {
        uname,
        sysfs,
        memfree,
        ..
    } = guest_report(&mut g);
    let (paddr, _) = parse_sysfs_vmcoreinfo(&sysfs).unwrap();

    // Snapshot as PLATFORM-NOTES describes: device state only, RAM file copied sparsely.
    let state = d.join("dev.state");
    hmp(&mon_a, "stop");
    hmp(&mon_a, "migrate_set_capability x-ignore-shared on");
    hmp(
        &mon_a,
        &format!("migrate \"exec:cat > {}\"", state.display()),
    );
    wait_migration(&mon_a);
    let image = d.join("ram.image");
    let cp = Command::new("cp")
        .arg("--sparse=always")
        .arg(&g.ram)
        .arg(&image)
        .status()
        .unwrap();
    assert!(cp.success());
    drop(g);

    // Restore onto a MAP_PRIVATE mapping of the image, left paused.
    let mon_b = d.join("mon-b.sock");
    let backend = MemoryBackend::PrivateImage(image.clone());
    let mut q = guest_command(
        Machine::Pc,
        256,
        backend,
        k.boot(),
        &d.join("serial-restored"),
    );
    q.control.hmp = Some(mon_b.clone());
    q.incoming = Some(Incoming::Defer);
    q.paused = true;
    let restored = spawn_qemu(&q, &d.join("qemu-restored.log"));
    hmp(&mon_b, "migrate_set_capability x-ignore-shared on");
    hmp(
        &mon_b,
        &format!("migrate_incoming \"exec:cat {}\"", state.display()),
    );
    wait_migration(&mon_b);

    let layout = Layout::pc(256 * MIB).unwrap();
    let pid = restored.id();
    let mem = GuestMemory::open_process(pid, &MapTarget::Path(image.clone()), layout).unwrap();
    let pages = 256 * MIB / 4096;
    let present_before = present_pages(pid, mem.source().base(), pages);
    let blocks_before = allocated(&image);
    let t0 = Instant::now();
    let found = find_vmcoreinfo(&mem).unwrap();
    let scan = t0.elapsed();
    assert_eq!(
        (found.paddr, found.info.osrelease.as_str()),
        (paddr, uname.as_str())
    );
    // Page-table walk and free pages through QEMU, too: still nothing faulted in.
    assert_eq!(release_via_page_tables(&mem, &found.info), uname);
    check_free_pages(&mem, &found.info, memfree, paddr, "restored pc 256M");
    assert_eq!(
        present_pages(pid, mem.source().base(), pages),
        present_before
    );
    assert_eq!(allocated(&image), blocks_before);
    eprintln!(
        "restored pc 256M: note at {paddr:#x} through QEMU, {present_before} pages mapped before \
         and after, scan {:.1} ms over {} MiB of data",
        scan.as_secs_f64() * 1e3,
        mem.allocated_bytes().unwrap() >> 20
    );
    // The restored guest still runs afterwards.
    hmp(&mon_b, "cont");
    assert!(hmp(&mon_b, "info status").contains("running"));
}
