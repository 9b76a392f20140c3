//! Every engine against a brute-force comparison, on the real kernel.
//!
//! Randomized transactions write random bytes at random places (across page boundaries, on
//! never-touched pages, on pages first read then written, the same page many times), through
//! `Heap::write` and, for page engines, through direct stores. After each `tend` the engine's
//! report is compared with what the test wrote and with a byte comparison of the region
//! against a snapshot taken at `tstart`.

use std::collections::BTreeSet;
use std::time::Duration;

use haheap::{DiffRun, EngineKind, Error, Heap, HeapConfig, Spin};

const PAGE: usize = 4096;

fn heap(engine: EngineKind, pages: usize) -> Heap {
    heap_spinning(engine, pages, Spin::Off)
}

/// A heap whose engine busy-polls for `spin` (the uffd handler thread does).
fn heap_spinning(engine: EngineKind, pages: usize, spin: Spin) -> Heap {
    let mut cfg = HeapConfig::local(pages * PAGE, engine);
    cfg.spin = spin;
    let h = Heap::create(cfg)
        .unwrap_or_else(|e| panic!("engine {engine} unavailable on this kernel: {e}"));
    assert_eq!(h.engine(), engine);
    h
}

/// Pages covered by `[off, off+len)`.
fn pages_of(off: usize, len: usize) -> impl Iterator<Item = usize> {
    off / PAGE..=(off + len - 1) / PAGE
}

/// Merges (offset, len) writes into sorted, non-overlapping, non-touching ranges.
fn coalesce(mut w: Vec<(usize, usize)>) -> Vec<(usize, usize)> {
    w.sort_unstable();
    let mut out: Vec<(usize, usize)> = Vec::new();
    for (o, l) in w {
        match out.last_mut() {
            Some((po, pl)) if o <= *po + *pl => *pl = (*pl).max(o + l - *po),
            _ => out.push((o, l)),
        }
    }
    out
}

fn run_random(engine: EngineKind, seed: u64, pages: usize, txs: usize) {
    run_random_spinning(engine, seed, pages, txs, Spin::Off)
}

fn run_random_spinning(engine: EngineKind, seed: u64, pages: usize, txs: usize, spin: Spin) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut h = heap_spinning(engine, pages, spin);
    let len = h.len();
    // What the backup would hold: the last committed state, updated only from shipped runs.
    let mut replica = vec![0u8; len];
    let mut aborts = 0;
    for tx in 0..txs {
        let snapshot = h.as_slice().to_vec();
        h.tstart().unwrap();
        let mut written: BTreeSet<usize> = BTreeSet::new();
        let mut writes: Vec<(usize, usize)> = Vec::new();
        let hot = rng.usize(0..pages);
        for _ in 0..rng.usize(1..=12) {
            let (off, n) = match rng.u8(0..5) {
                // Straddle a page boundary.
                0 => {
                    let b = rng.usize(1..pages) * PAGE;
                    let before = rng.usize(1..=64);
                    (b - before, before + rng.usize(1..=64))
                }
                // The same page again and again.
                1 => (hot * PAGE + rng.usize(0..PAGE - 16), rng.usize(1..=16)),
                // A whole page.
                2 => (rng.usize(0..pages) * PAGE, PAGE),
                // Anywhere, small.
                _ => {
                    let n = rng.usize(1..=300);
                    (rng.usize(0..len - n), n)
                }
            };
            // Sometimes read the page first: a never-populated page then gets the zero page
            // mapped read-only, and the write that follows must still be seen.
            if rng.u8(0..4) == 0 {
                std::hint::black_box(h.as_slice()[off]);
            }
            let data: Vec<u8> = if rng.u8(0..8) == 0 {
                h.as_slice()[off..off + n].to_vec() // same bytes: written but unchanged
            } else {
                (0..n).map(|_| rng.u8(..)).collect()
            };
            if engine.is_page_level() && rng.bool() {
                // SAFETY: off+n <= len, inside the heap's mapping; page engines track the store.
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), h.as_mut_ptr().add(off), n) };
            } else {
                h.write(off, &data).unwrap();
            }
            written.extend(pages_of(off, n));
            writes.push((off, n));
        }
        let changed: BTreeSet<usize> = (0..pages)
            .filter(|&p| {
                snapshot[p * PAGE..(p + 1) * PAGE] != h.as_slice()[p * PAGE..(p + 1) * PAGE]
            })
            .collect();
        if rng.u8(0..7) == 0 {
            h.abort().unwrap();
            aborts += 1;
            assert!(
                h.as_slice() == &snapshot[..],
                "{engine} tx {tx}: abort did not restore the committed state"
            );
            continue;
        }
        let stats = h.tend().unwrap();
        let reported: BTreeSet<usize> = h.dirty_pages_of_last_tx().iter().copied().collect();
        assert_eq!(
            reported.len(),
            h.dirty_pages_of_last_tx().len(),
            "duplicate pages reported"
        );
        assert!(
            changed.is_subset(&reported),
            "{engine} tx {tx}: missed pages {:?}",
            changed.difference(&reported)
        );
        // Every engine reports exactly the pages written: no misses, and no extras (the
        // region is kept off transparent huge pages, so nothing widens a write).
        assert_eq!(
            reported, written,
            "{engine} tx {tx}: reported pages differ from written pages"
        );
        assert_eq!(stats.pages, written.len());
        let runs = h.dirty_runs_of_last_tx().to_vec();
        if engine == EngineKind::Log {
            let expect: Vec<DiffRun> = coalesce(writes)
                .into_iter()
                .map(|(o, l)| DiffRun {
                    offset: o as u64,
                    len: l as u32,
                })
                .collect();
            assert_eq!(
                runs, expect,
                "{engine} tx {tx}: log must ship exactly the written bytes"
            );
        } else {
            for r in &runs {
                let p = r.offset as usize / PAGE;
                assert!(reported.contains(&p), "run outside the reported pages");
            }
        }
        let shipped: usize = runs.iter().map(|r| r.len as usize).sum();
        assert_eq!(stats.bytes_shipped, shipped);
        for r in &runs {
            let (s, e) = (r.offset as usize, r.offset as usize + r.len as usize);
            replica[s..e].copy_from_slice(&h.as_slice()[s..e]);
        }
        assert!(
            replica == h.as_slice(),
            "{engine} tx {tx}: shipped runs do not reproduce the heap"
        );
        assert_eq!(stats.tx_id, h.committed_tx_id());
    }
    assert!(aborts > 0, "the random mix must include aborts");
    let c = h.counters();
    assert_eq!(c.aborts, aborts);
    assert_eq!(c.commits, h.committed_tx_id());
    assert!(c.pages > 0 && c.runs > 0 && c.bytes_shipped > 0, "{c:?}");
    assert!(c.collect_ns > 0 && c.diff_ns > 0, "{c:?}");
    assert_eq!(c.ship_ns, 0, "no backup, nothing shipped");
    // A transaction that writes nothing reports nothing.
    h.tstart().unwrap();
    let s = h.tend().unwrap();
    assert_eq!(
        (s.pages, s.bytes_shipped),
        (0, 0),
        "{engine}: empty transaction reported writes"
    );
}

#[test]
fn mprotect_random_transactions_match_brute_force() {
    run_random(EngineKind::Mprotect, 1, 48, 300);
}

#[test]
fn uffd_random_transactions_match_brute_force() {
    run_random(EngineKind::Uffd, 2, 48, 300);
}

/// The handler thread busy-polls between faults: the same pages must be seen.
#[test]
fn uffd_with_a_spinning_handler_matches_brute_force() {
    let spin = Spin::Fixed(Duration::from_micros(200));
    run_random_spinning(EngineKind::Uffd, 5, 48, 300, spin);
}

#[test]
fn scan_random_transactions_match_brute_force() {
    run_random(EngineKind::Scan, 3, 48, 300);
}

#[test]
fn log_random_transactions_match_brute_force() {
    run_random(EngineKind::Log, 4, 48, 300);
}

/// A 10 MB heap, 32 scattered pages per transaction: the size the benchmark uses; more than
/// one PAGEMAP_SCAN vector's worth of runs is not needed here, but many runs are.
#[test]
fn page_engines_on_a_10mb_heap() {
    for engine in [EngineKind::Mprotect, EngineKind::Uffd, EngineKind::Scan] {
        let mut h = heap(engine, 2560);
        let mut rng = fastrand::Rng::with_seed(7);
        for _ in 0..20 {
            h.tstart().unwrap();
            let mut want = BTreeSet::new();
            while want.len() < 32 {
                let p = rng.usize(0..2560);
                want.insert(p);
                h.write(p * PAGE + rng.usize(0..PAGE), &[rng.u8(1..)])
                    .unwrap();
            }
            h.tend().unwrap();
            let got: BTreeSet<usize> = h.dirty_pages_of_last_tx().iter().copied().collect();
            assert_eq!(got, want, "{engine}");
        }
    }
}

/// More separate runs than one PAGEMAP_SCAN call returns (256): the scan must continue.
#[test]
fn scan_reports_more_runs_than_one_ioctl_returns() {
    let mut h = heap(EngineKind::Scan, 2048);
    h.tstart().unwrap();
    let want: Vec<usize> = (0..2048).step_by(3).collect();
    for &p in &want {
        h.write(p * PAGE, &[1]).unwrap();
    }
    h.tend().unwrap();
    assert_eq!(h.dirty_pages_of_last_tx(), &want[..]);
}

#[test]
fn nested_and_unbalanced_calls_are_rejected() {
    for engine in EngineKind::CONCRETE {
        let mut h = heap(engine, 4);
        assert!(
            matches!(h.tend(), Err(Error::NoTransaction)),
            "{engine}: tend without tstart"
        );
        assert!(
            matches!(h.abort(), Err(Error::NoTransaction)),
            "{engine}: abort without tstart"
        );
        assert!(
            matches!(h.write(0, b"x"), Err(Error::NoTransaction)),
            "{engine}: write outside tx"
        );
        h.tstart().unwrap();
        assert!(
            matches!(h.tstart(), Err(Error::Nested)),
            "{engine}: nested tstart"
        );
        h.write(0, b"kept").unwrap();
        h.tend().unwrap();
        assert!(
            matches!(h.tend(), Err(Error::NoTransaction)),
            "{engine}: double tend"
        );
        assert_eq!(
            &h.as_slice()[..4],
            b"kept",
            "{engine}: a rejected call damaged the heap"
        );
    }
}

/// Out-of-bounds writes are refused and memory on both sides of the heap stays untouched.
#[test]
fn writes_outside_the_region_are_rejected() {
    for engine in EngineKind::CONCRETE {
        // Guard page, 4 heap pages, guard page, all in one mapping.
        let mut backing = Mapping::new(6 * PAGE);
        backing.slice().fill(0xAA);
        // SAFETY: pages 1..5 of our own mapping, which outlives the heap.
        let mut h = unsafe {
            Heap::declare(
                backing.ptr().add(PAGE),
                4 * PAGE,
                HeapConfig::local(0, engine),
            )
        }
        .unwrap();
        assert_eq!(h.len(), 4 * PAGE);
        h.tstart().unwrap();
        for (off, len) in [
            (4 * PAGE, 1),
            (4 * PAGE - 1, 2),
            (usize::MAX, 1),
            (usize::MAX - 2, 8),
            (1, 4 * PAGE),
        ] {
            let r = h.write(off, &vec![0x55; len]);
            assert!(
                matches!(r, Err(Error::OutOfBounds { .. })),
                "{engine}: write {off}+{len} accepted"
            );
        }
        h.write(4 * PAGE - 1, &[7]).unwrap();
        h.tend().unwrap();
        drop(h);
        let s = backing.slice();
        assert!(
            s[..PAGE].iter().all(|&b| b == 0xAA),
            "{engine}: guard before the heap changed"
        );
        assert!(
            s[5 * PAGE..].iter().all(|&b| b == 0xAA),
            "{engine}: guard after the heap changed"
        );
        assert_eq!(s[5 * PAGE - 1], 7);
        assert!(
            s[PAGE..5 * PAGE - 1].iter().all(|&b| b == 0xAA),
            "{engine}: heap bytes changed"
        );
        // Dropping the heap handed the memory back writable and untracked.
        s[2 * PAGE] = 1;
    }
}

/// Several mprotect heaps in one process each see only their own pages.
#[test]
fn several_mprotect_heaps_coexist() {
    let mut heaps: Vec<Heap> = (0..5).map(|_| heap(EngineKind::Mprotect, 8)).collect();
    for round in 0..10usize {
        for h in heaps.iter_mut() {
            h.tstart().unwrap();
        }
        for (i, h) in heaps.iter_mut().enumerate() {
            let p = (i + round) % 8;
            // SAFETY: inside the heap, page p.
            unsafe { *h.as_mut_ptr().add(p * PAGE + round) = (i + 1) as u8 };
        }
        for (i, h) in heaps.iter_mut().enumerate() {
            h.tend().unwrap();
            assert_eq!(h.dirty_pages_of_last_tx(), &[(i + round) % 8]);
        }
    }
}

#[test]
fn auto_picks_a_working_engine_and_says_why() {
    let h = heap_auto();
    assert_ne!(h.engine(), EngineKind::Auto);
    assert!(
        h.engine_reason().starts_with(h.engine().name()),
        "{}",
        h.engine_reason()
    );
    let caps = haheap::capabilities();
    if caps.scan.is_ok() {
        assert_eq!(h.engine(), EngineKind::Scan);
    }
    assert!(h.engine_reason().contains("soft-dirty"));
}

fn heap_auto() -> Heap {
    Heap::create(HeapConfig::local(PAGE, EngineKind::Auto)).unwrap()
}

/// A real segfault outside any heap still kills the process (checked in a child).
#[test]
fn foreign_segfault_still_kills() {
    if std::env::var_os("HAHEAP_SEGV_CHILD").is_some() {
        let mut h = heap(EngineKind::Mprotect, 2);
        h.tstart().unwrap();
        // SAFETY: inside the heap.
        unsafe { *h.as_mut_ptr() = 1 };
        h.tend().unwrap();
        println!("heap-write-ok");
        let bad = Mapping::new_none(PAGE);
        // SAFETY: deliberately faulting store to a PROT_NONE page: this child must die.
        unsafe { std::ptr::write_volatile(bad.ptr(), 1) };
        println!("survived");
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "engines::foreign_segfault_still_kills",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("HAHEAP_SEGV_CHILD", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    use std::os::unix::process::ExitStatusExt;
    assert!(
        stdout.contains("heap-write-ok"),
        "child did not get to the faulting store: {stdout}"
    );
    assert!(!stdout.contains("survived"));
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGSEGV),
        "child status {:?}",
        out.status
    );
}

/// A private anonymous mapping owned by a test.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

impl Mapping {
    fn new(len: usize) -> Mapping {
        Mapping::with_prot(len, libc::PROT_READ | libc::PROT_WRITE)
    }
    fn new_none(len: usize) -> Mapping {
        Mapping::with_prot(len, libc::PROT_NONE)
    }
    fn with_prot(len: usize, prot: i32) -> Mapping {
        // SAFETY: fresh anonymous mapping at a kernel-chosen address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        Mapping { ptr: p.cast(), len }
    }
    fn ptr(&self) -> *mut u8 {
        self.ptr
    }
    fn slice(&mut self) -> &mut [u8] {
        // SAFETY: our own read-write mapping of `len` bytes.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: we mapped exactly this range.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// Without privilege (a child running as nobody, with vm.unprivileged_userfaultfd=0 here)
/// the library still tracks through a user-mode-only userfaultfd, or says why it cannot.
/// As root the child drops to nobody, running a copy of this test binary from a directory
/// nobody can enter (the checkout may be in a private home or a mode-700 temp dir); as
/// another user the child is already unprivileged and runs as that user.
#[test]
fn unprivileged_process_tracks_or_explains() {
    if std::env::var_os("HAHEAP_UNPRIV_CHILD").is_some() {
        let caps = haheap::capabilities();
        println!("uffd={:?}", caps.uffd_wp);
        println!("scan={:?}", caps.scan);
        println!("access={:?}", caps.uffd_access);
        let h = heap_auto();
        println!("auto={} reason={}", h.engine(), h.engine_reason());
        run_random(h.engine(), 5, 16, 60);
        println!("child-ok");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    // SAFETY: geteuid has no side effects.
    let root = unsafe { libc::geteuid() } == 0;
    let public = tempfile::tempdir().unwrap();
    let exe = public.path().join("engines-test");
    std::fs::copy(std::env::current_exe().unwrap(), &exe).unwrap();
    for (path, mode) in [(public.path(), 0o755), (exe.as_path(), 0o755)] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let mut child = std::process::Command::new(&exe);
    child
        .args([
            "--exact",
            "engines::unprivileged_process_tracks_or_explains",
            "--nocapture",
            "--test-threads=1",
        ])
        .current_dir(public.path())
        .env("HAHEAP_UNPRIV_CHILD", "1");
    if root {
        child.uid(65534).gid(65534);
    }
    let out = child.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("child-ok"), "{stdout}");
    let unprivileged_uffd =
        std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd").unwrap_or_default();
    if unprivileged_uffd.trim() == "0" {
        // Either the user-mode-only fallback worked and the reason says so, or the reason
        // names the sysctl.
        assert!(
            stdout.contains("user-mode faults only")
                || stdout.contains("vm.unprivileged_userfaultfd=0"),
            "{stdout}"
        );
    }
}

/// Heaps of every engine used at once from several threads: the process-wide SIGSEGV table,
/// several userfaultfd handler threads and scans must not see each other's pages.
#[test]
fn heaps_of_every_engine_in_parallel_threads() {
    let threads: Vec<_> = (0..8u64)
        .map(|i| {
            let engine = EngineKind::CONCRETE[i as usize % 4];
            std::thread::spawn(move || run_random(engine, 1000 + i, 24, 120))
        })
        .collect();
    for t in threads {
        t.join().expect("a heap thread failed");
    }
}

/// A system call writing into the heap (read(2) from a pipe): the uffd engines see it like
/// a store; with mprotect the region is read-only, so the kernel refuses with EFAULT and the
/// heap is unchanged (a documented limit of that engine).
#[test]
fn kernel_writes_into_the_heap() {
    for engine in [EngineKind::Mprotect, EngineKind::Uffd, EngineKind::Scan] {
        let mut h = heap(engine, 8);
        let mut fds = [0i32; 2];
        // SAFETY: `fds` is a live array of two ints.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let msg = b"written by the kernel on behalf of read(2)";
        // SAFETY: writing our buffer to our pipe.
        let wrote = unsafe { libc::write(fds[1], msg.as_ptr().cast(), msg.len()) };
        assert_eq!(wrote, msg.len() as isize);
        h.tstart().unwrap();
        let at = 3 * PAGE + 100;
        // SAFETY: reading at most msg.len() bytes into the heap, inside its bounds.
        let n = unsafe { libc::read(fds[0], h.as_mut_ptr().add(at).cast(), msg.len()) };
        let errno = std::io::Error::last_os_error().raw_os_error();
        h.tend().unwrap();
        if engine == EngineKind::Mprotect {
            assert_eq!((n, errno), (-1, Some(libc::EFAULT)), "{engine}");
            assert!(h.as_slice().iter().all(|&b| b == 0));
        } else {
            assert_eq!(n, msg.len() as isize, "{engine}");
            assert_eq!(&h.as_slice()[at..at + msg.len()], msg);
            assert_eq!(
                h.dirty_pages_of_last_tx(),
                &[3],
                "{engine}: kernel write not tracked"
            );
        }
        // SAFETY: closing our own pipe.
        unsafe { libc::close(fds[0]) };
        // SAFETY: as above.
        unsafe { libc::close(fds[1]) };
    }
}
