//! `unmap_for_trace` and `PagemapTracer` against a real process: a child maps a
//! tmpfs file shared (as QEMU maps guest RAM), touches all of it, and after the
//! unmap touches pages in a known order; the tracer must see them in that order,
//! and the file must keep every byte.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use rebound_snapshot::{unmap_for_trace, PagemapTracer, TraceError, TracePage};

const LEN: usize = 64 << 20;
const PAGE: usize = 4096;
/// Pages the child touches after the unmap, 1 MiB or more apart (a read fault maps
/// a 64 KiB window around the page), in this order.
const ORDER: [u64; 5] = [40 * 256, 3 * 256, 60 * 256, 10 * 256, 25 * 256];
/// The child writes this page (a write fault maps just it).
const WRITTEN: u64 = 50 * 256 + 7;

fn marker(page: usize) -> u8 {
    (page % 251) as u8 + 1
}

/// Kills and reaps the child however the test ends.
struct Child(libc::pid_t);

impl Drop for Child {
    fn drop(&mut self) {
        // SAFETY: signals and reaps our own child; no memory is involved.
        unsafe {
            libc::kill(self.0, libc::SIGKILL);
            libc::waitpid(self.0, std::ptr::null_mut(), 0);
        }
    }
}

/// The child's side: only system calls and stack memory (it runs after a fork of
/// a multi-threaded process), ends with `_exit`.
fn child(f: &File, mut to_parent: UnixStream, mut from_parent: UnixStream) -> ! {
    // SAFETY: maps the parent-created file shared for the rest of the child's life.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            LEN,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    } as *mut u8;
    if base as *mut libc::c_void == libc::MAP_FAILED {
        // SAFETY: leaves the child without running the parent's destructors.
        unsafe { libc::_exit(1) };
    }
    let mut sum = 0u64;
    for i in 0..LEN / PAGE {
        // SAFETY: inside the mapping.
        sum += unsafe { std::ptr::read_volatile(base.add(i * PAGE)) } as u64;
    }
    let _ = to_parent.write_all(&(base as u64).to_le_bytes());
    // Wait for the unmap, then touch the pages in order, each only once the parent
    // has polled after the one before (lockstep: a loaded host cannot merge two
    // touches into one poll).
    let mut go = [0u8; 1];
    if from_parent.read_exact(&mut go).is_ok() {
        for p in ORDER {
            // SAFETY: the pages of ORDER are inside the mapping.
            sum += unsafe { std::ptr::read_volatile(base.add(p as usize * PAGE)) } as u64;
            if to_parent.write_all(&[2]).is_err() || from_parent.read_exact(&mut go).is_err() {
                // SAFETY: as below.
                unsafe { libc::_exit(1) };
            }
        }
        // SAFETY: inside the mapping; a shared write lands in the file.
        unsafe { std::ptr::write_volatile(base.add(WRITTEN as usize * PAGE + 1), 0xee) };
        let _ = to_parent.write_all(&[1]);
        let _ = from_parent.read_exact(&mut go);
    }
    std::hint::black_box(sum);
    // SAFETY: as above.
    unsafe { libc::_exit(0) };
}

/// Whether the host has swap on: unmapping guest RAM could then push it out to swap,
/// so `unmap_for_trace` refuses before looking at anything else.
fn host_swaps() -> bool {
    std::fs::read_to_string("/proc/swaps")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .any(|l| !l.trim().is_empty())
}

/// On a swapping host the refusal is the behaviour to check; the rest of the test is
/// skipped, and says so.
fn refused_for_swap(what: &str) {
    let e = unmap_for_trace(std::process::id(), &[]).unwrap_err();
    assert!(matches!(e, TraceError::Swap(_)), "{e}");
    eprintln!("SKIPPED {what}: this host swaps, so only the refusal was checked");
}

#[test]
fn unmapped_guest_ram_is_traced_again_in_touch_order_and_keeps_its_content() {
    if host_swaps() {
        refused_for_swap("the touch-order trace");
        return;
    }
    // Guest RAM lives in tmpfs; an unnamed file is enough here.
    let f = tempfile::tempfile_in("/dev/shm").unwrap();
    f.set_len(LEN as u64).unwrap();
    for i in 0..LEN / PAGE {
        f.write_all_at(&[marker(i)], (i * PAGE) as u64).unwrap();
    }
    let blocks_before = f.metadata().unwrap().blocks();

    let (to_child, from_parent) = UnixStream::pair().unwrap();
    let (to_parent, from_child) = UnixStream::pair().unwrap();
    // SAFETY: the child runs `child`, which uses system calls and its stack only.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // The parent's ends: closed here so that each side sees the other go away.
        drop((to_child, from_child));
        // SAFETY: asks for SIGKILL when the parent dies, so no child outlives the test.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
        child(&f, to_parent, from_parent);
    }
    let guard = Child(pid);
    drop((to_parent, from_parent));
    let (mut to_child, mut from_child) = (to_child, from_child);
    let mut b = [0u8; 8];
    from_child.read_exact(&mut b).unwrap();
    let base = u64::from_le_bytes(b);
    let pages = (LEN / PAGE) as u64;
    let ranges = vec![(0u16, base, LEN as u64)];

    let mut all = PagemapTracer::new(pid as u32, ranges.clone()).unwrap();
    assert_eq!(
        all.poll().unwrap() as u64,
        pages,
        "every page present before"
    );

    unmap_for_trace(pid as u32, &[(base, LEN as u64)]).unwrap();
    let mut tracer = PagemapTracer::new(pid as u32, ranges).unwrap();
    assert_eq!(
        tracer.poll().unwrap(),
        0,
        "pages still mapped after the unmap"
    );

    // One poll after each touch, then after the write.
    from_child
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    to_child.write_all(&[1]).unwrap();
    let mut msg = [0u8; 1];
    for _ in ORDER {
        from_child
            .read_exact(&mut msg)
            .expect("the child touched its page");
        assert_eq!(msg[0], 2);
        tracer.poll().unwrap();
        to_child.write_all(&[1]).unwrap();
    }
    from_child.read_exact(&mut msg).expect("the child wrote");
    assert_eq!(msg[0], 1);
    tracer.poll().unwrap();
    assert!(tracer.seen() > ORDER.len(), "the touches and the write");
    // Read faults map their 64 KiB neighbourhood, not the whole range.
    assert!(
        tracer.seen() <= (ORDER.len() + 1) * 32,
        "{} pages",
        tracer.seen()
    );
    let trace = tracer.into_trace();
    let pos = |page: u64| {
        trace
            .pages
            .iter()
            .position(|p| *p == TracePage { block: 0, page })
            .unwrap_or_else(|| panic!("page {page} was touched but not traced"))
    };
    let seen: Vec<usize> = ORDER.iter().map(|&p| pos(p)).collect();
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "order {seen:?}");
    assert!(pos(WRITTEN) > seen[ORDER.len() - 1]);
    drop(to_child);
    drop(guard);

    // The file kept every byte and every block, and has the child's write.
    assert_eq!(f.metadata().unwrap().blocks(), blocks_before);
    let mut page = vec![0u8; PAGE];
    for i in 0..LEN / PAGE {
        f.read_exact_at(&mut page, (i * PAGE) as u64).unwrap();
        assert_eq!(page[0], marker(i), "page {i}");
        let want = if i as u64 == WRITTEN { 0xee } else { 0 };
        assert_eq!(page[1], want, "page {i}");
    }
}

#[test]
fn unmap_for_trace_refuses_bad_input() {
    if host_swaps() {
        refused_for_swap("the bad-input checks");
        return;
    }
    let e = unmap_for_trace(std::process::id(), &[(4097, 4096)]).unwrap_err();
    assert_eq!(e.to_string(), "range 0x1001+0x1000 is not page-aligned");
    // No such process (pid_max is below 2^22).
    let e = unmap_for_trace(1 << 30, &[(4096, 4096)]).unwrap_err();
    assert!(
        e.to_string().contains("cannot unmap guest RAM in process"),
        "{e}"
    );
    assert!(PagemapTracer::new(1 << 30, vec![]).is_err());
}
