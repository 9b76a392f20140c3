//! The working-set trace: guest pages in the order the guest first touched them
//! (first-access-first-load, HotRestore section 3.1), recorded from QEMU's page
//! table through `/proc/<pid>/pagemap`, and the paper's working-set size estimate,
//! hit rate and accuracy.
//!
//! File `trace.fafl` (little-endian): magic `RBFAFL\0\0`, version u32 = 1, page
//! size u32 = 4096, count u64, `count` entries u64 (`block << 48 | page`), then the
//! xxh3-64 of everything before it.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use rebound_pagemap::{PageRegion, Pagemap, Query, PAGE_IS_PRESENT, PAGE_IS_SWAPPED};

use crate::PAGE_SIZE;

const MAGIC: &[u8; 8] = b"RBFAFL\0\0";
const VERSION: u32 = 1;
const HEADER: usize = 24;
const PAGE_BITS: u32 = 48;

/// Errors of traces.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("cannot read {0}")]
    Read(PathBuf, #[source] io::Error),
    #[error("cannot write {0}")]
    Write(PathBuf, #[source] io::Error),
    #[error("{0} is not a working-set trace (wrong magic)")]
    Magic(PathBuf),
    #[error("{0}: trace version {1} is not supported (supports {VERSION})")]
    Version(PathBuf, u32),
    #[error("{0}: page size {1} is not 4096")]
    PageSize(PathBuf, u32),
    #[error("{0}: {1} entries for a guest of {2} pages")]
    TooMany(PathBuf, u64, u64),
    #[error("{0} is truncated: {1} bytes, {2} expected")]
    Truncated(PathBuf, u64, u64),
    #[error("{0}: checksum mismatch: the trace is damaged")]
    Checksum(PathBuf),
    #[error("{0}: page {1} of block {2} is listed twice")]
    Duplicate(PathBuf, u64, u16),
    #[error("{0}: page {1} of block {2} is outside the guest")]
    OutOfRange(PathBuf, u64, u16),
    #[error("cannot read QEMU's page table (/proc/{0}/pagemap)")]
    Pagemap(u32, #[source] io::Error),
    #[error("the host swaps ({0}): unmapping guest RAM to trace it would push it to swap; the first restore records the trace instead")]
    Swap(String),
    #[error("cannot unmap guest RAM in process {0} for tracing")]
    Unmap(u32, #[source] io::Error),
    #[error("range {0:#x}+{1:#x} is not page-aligned")]
    Unaligned(u64, u64),
}

/// One guest page: a RAM block (index in the manifest) and a page within it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TracePage {
    pub block: u16,
    pub page: u64,
}

/// Pages in first-access order, each once.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Trace {
    pub pages: Vec<TracePage>,
}

impl Trace {
    /// Writes the trace file (replacing `path`).
    pub fn write(&self, path: &Path) -> Result<(), TraceError> {
        if let Some(p) = self.pages.iter().find(|p| p.page >> PAGE_BITS != 0) {
            return Err(TraceError::OutOfRange(path.to_path_buf(), p.page, p.block));
        }
        let mut b = Vec::with_capacity(HEADER + self.pages.len() * 8 + 8);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&(PAGE_SIZE as u32).to_le_bytes());
        b.extend_from_slice(&(self.pages.len() as u64).to_le_bytes());
        for p in &self.pages {
            b.extend_from_slice(&(((p.block as u64) << PAGE_BITS) | p.page).to_le_bytes());
        }
        let sum = xxhash_rust::xxh3::xxh3_64(&b);
        b.extend_from_slice(&sum.to_le_bytes());
        let werr = |e| TraceError::Write(path.to_path_buf(), e);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)
            .map_err(werr)?;
        f.write_all(&b).map_err(werr)?;
        f.sync_all().map_err(werr)
    }

    /// Reads a trace file of a guest with `max_pages` pages in all: at most that
    /// many entries, each page below it (whatever its block).
    pub fn read(path: &Path, max_pages: u64) -> Result<Trace, TraceError> {
        Trace::read_checked(path, max_pages, |p| p.page < max_pages)
    }

    /// Reads a trace file of a guest whose RAM block `i` has `block_pages[i]`
    /// pages: each entry must name a page of one of them.
    pub fn read_blocks(path: &Path, block_pages: &[u64]) -> Result<Trace, TraceError> {
        let total = block_pages.iter().sum();
        Trace::read_checked(path, total, |p| {
            block_pages
                .get(p.block as usize)
                .is_some_and(|&n| p.page < n)
        })
    }

    fn read_checked(
        path: &Path,
        max_pages: u64,
        inside: impl Fn(&TracePage) -> bool,
    ) -> Result<Trace, TraceError> {
        let p = || path.to_path_buf();
        let f = crate::open_nofollow(path).map_err(|e| TraceError::Read(p(), e))?;
        let len = f.metadata().map_err(|e| TraceError::Read(p(), e))?.len();
        let mut head = [0u8; HEADER];
        if len < HEADER as u64 + 8 {
            return Err(TraceError::Truncated(p(), len, HEADER as u64 + 8));
        }
        f.read_exact_at(&mut head, 0)
            .map_err(|e| TraceError::Read(p(), e))?;
        if &head[..8] != MAGIC {
            return Err(TraceError::Magic(p()));
        }
        let version = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes"));
        if version != VERSION {
            return Err(TraceError::Version(p(), version));
        }
        let ps = u32::from_le_bytes(head[12..16].try_into().expect("4 bytes"));
        if ps as u64 != PAGE_SIZE {
            return Err(TraceError::PageSize(p(), ps));
        }
        let count = u64::from_le_bytes(head[16..24].try_into().expect("8 bytes"));
        // Checked before anything is allocated for `count` entries.
        if count > max_pages {
            return Err(TraceError::TooMany(p(), count, max_pages));
        }
        let want = HEADER as u64 + count * 8 + 8;
        if len != want {
            return Err(TraceError::Truncated(p(), len, want));
        }
        let mut b = Vec::with_capacity(want as usize);
        f.take(want)
            .read_to_end(&mut b)
            .map_err(|e| TraceError::Read(p(), e))?;
        if b.len() as u64 != want {
            return Err(TraceError::Truncated(p(), b.len() as u64, want));
        }
        let body = want as usize - 8;
        let sum = u64::from_le_bytes(b[body..].try_into().expect("8 bytes"));
        if sum != xxhash_rust::xxh3::xxh3_64(&b[..body]) {
            return Err(TraceError::Checksum(p()));
        }
        let mut seen = std::collections::HashSet::with_capacity(count as usize);
        let mut pages = Vec::with_capacity(count as usize);
        for e in b[HEADER..body].chunks_exact(8) {
            let v = u64::from_le_bytes(e.try_into().expect("8 bytes"));
            let tp = TracePage {
                block: (v >> PAGE_BITS) as u16,
                page: v & ((1 << PAGE_BITS) - 1),
            };
            if !inside(&tp) {
                return Err(TraceError::OutOfRange(p(), tp.page, tp.block));
            }
            if !seen.insert(tp) {
                return Err(TraceError::Duplicate(p(), tp.page, tp.block));
            }
            pages.push(tp);
        }
        Ok(Trace { pages })
    }
}

/// Records first touches by polling QEMU's page table.
pub struct PagemapTracer {
    pid: u32,
    pagemap: Pagemap,
    blocks: Vec<(u16, u64, u64)>,
    /// Per block, one bit per page: seen present already.
    seen: Vec<Vec<u64>>,
    order: Vec<TracePage>,
    /// `PAGEMAP_SCAN` works here (Linux 6.7+); otherwise pagemap entries are read.
    scan: bool,
    buf: Vec<u8>,
    regions: Vec<PageRegion>,
}

/// pagemap entry: the page is present in RAM, or swapped.
const PM_PRESENT: u64 = 1 << 63;
const PM_SWAPPED: u64 = 1 << 62;

/// What a scan reports: pages present or swapped (`PAGEMAP_SCAN` returns their ranges
/// in one ioctl, instead of 8 bytes per page that user space must look at).
const PRESENT: Query = Query {
    flags: 0,
    inverted: 0,
    all_of: 0,
    any_of: PAGE_IS_PRESENT | PAGE_IS_SWAPPED,
    report: PAGE_IS_PRESENT | PAGE_IS_SWAPPED,
};

impl PagemapTracer {
    /// A tracer of QEMU process `pid`'s mappings `(block, host address, length)`.
    pub fn new(pid: u32, blocks: Vec<(u16, u64, u64)>) -> Result<PagemapTracer, TraceError> {
        let pagemap = Pagemap::open_pid(pid).map_err(|e| TraceError::Pagemap(pid, e))?;
        if let Some(&(_, a, l)) = blocks
            .iter()
            .find(|(_, a, l)| !a.is_multiple_of(PAGE_SIZE) || !l.is_multiple_of(PAGE_SIZE))
        {
            return Err(TraceError::Unaligned(a, l));
        }
        let seen = blocks
            .iter()
            .map(|(_, _, len)| vec![0u64; (len / PAGE_SIZE).div_ceil(64) as usize])
            .collect();
        let mut t = PagemapTracer {
            pid,
            pagemap,
            blocks,
            seen,
            order: Vec::new(),
            scan: true,
            buf: Vec::new(),
            regions: vec![PageRegion::default(); 4096],
        };
        // An empty range tells whether the kernel has the ioctl.
        if t.scan_range(0, 0).is_err() {
            t.scan = false;
            // 2 MiB: the entries of 1 GiB of guest RAM in one pread.
            t.buf = vec![0u8; 2 << 20];
        }
        Ok(t)
    }

    /// Looks once; appends pages newly present, in address order; returns how many.
    pub fn poll(&mut self) -> Result<usize, TraceError> {
        let before = self.order.len();
        for bi in 0..self.blocks.len() {
            if self.scan {
                self.poll_scan(bi)?;
            } else {
                self.poll_read(bi)?;
            }
        }
        Ok(self.order.len() - before)
    }

    fn note(&mut self, bi: usize, page: u64) {
        let (w, bit) = ((page / 64) as usize, page % 64);
        if self.seen[bi][w] & (1 << bit) == 0 {
            self.seen[bi][w] |= 1 << bit;
            self.order.push(TracePage {
                block: self.blocks[bi].0,
                page,
            });
        }
    }

    /// One `PAGEMAP_SCAN` from `start` (host address) to `end`: fills `regions`
    /// with present or swapped ranges; returns how many and where the walk ended.
    fn scan_range(&mut self, start: u64, end: u64) -> io::Result<(usize, u64)> {
        self.pagemap.scan(start, end, &PRESENT, &mut self.regions)
    }

    fn poll_scan(&mut self, bi: usize) -> Result<(), TraceError> {
        let (_, addr, len) = self.blocks[bi];
        let mut at = addr;
        while at < addr + len {
            let (n, walk_end) = self
                .scan_range(at, addr + len)
                .map_err(|e| TraceError::Pagemap(self.pid, e))?;
            for i in 0..n {
                let r = self.regions[i];
                let (mut page, end) = ((r.start - addr) / PAGE_SIZE, (r.end - addr) / PAGE_SIZE);
                while page < end {
                    // Most of a running guest's pages were seen long ago: 64 at a time.
                    if page.is_multiple_of(64)
                        && page + 64 <= end
                        && self.seen[bi][(page / 64) as usize] == u64::MAX
                    {
                        page += 64;
                        continue;
                    }
                    self.note(bi, page);
                    page += 1;
                }
            }
            if walk_end <= at {
                break;
            }
            at = walk_end;
        }
        Ok(())
    }

    fn poll_read(&mut self, bi: usize) -> Result<(), TraceError> {
        let (_, addr, len) = self.blocks[bi];
        let pages = len / PAGE_SIZE;
        let mut first = 0u64;
        let mut buf = std::mem::take(&mut self.buf);
        while first < pages {
            let n = ((pages - first) as usize).min(buf.len() / 8);
            let off = (addr / PAGE_SIZE + first) * 8;
            let b = &mut buf[..n * 8];
            self.pagemap
                .file()
                .read_exact_at(b, off)
                .map_err(|e| TraceError::Pagemap(self.pid, e))?;
            for (i, e) in b.chunks_exact(8).enumerate() {
                let v = u64::from_le_bytes(e.try_into().expect("8 bytes"));
                if v & (PM_PRESENT | PM_SWAPPED) != 0 {
                    self.note(bi, first + i as u64);
                }
            }
            first += n as u64;
        }
        self.buf = buf;
        Ok(())
    }

    /// Pages seen so far.
    pub fn seen(&self) -> usize {
        self.order.len()
    }

    pub fn into_trace(self) -> Trace {
        Trace { pages: self.order }
    }
}

/// Unmaps the running guest's pages from QEMU's page table (they stay in the shared
/// RAM file), so its next touch of each shows in `pagemap` again: `MADV_PAGEOUT`
/// through `process_madvise`. Without swap the kernel cannot page shared tmpfs
/// memory out, so it only drops the mappings; with swap it would push guest RAM
/// out, so a host with active swap is refused.
pub fn unmap_for_trace(pid: u32, ranges: &[(u64, u64)]) -> Result<(), TraceError> {
    let swaps = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
    if let Some(active) = swaps.lines().nth(1).filter(|l| !l.trim().is_empty()) {
        let dev = active.split_whitespace().next().unwrap_or("?").to_string();
        return Err(TraceError::Swap(dev));
    }
    if let Some(&(a, l)) = ranges
        .iter()
        .find(|(a, l)| !a.is_multiple_of(PAGE_SIZE) || !l.is_multiple_of(PAGE_SIZE))
    {
        return Err(TraceError::Unaligned(a, l));
    }
    let raw = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw);
    let pidfd = raw
        .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))
        .and_then(|p| {
            Ok(rustix::process::pidfd_open(
                p,
                rustix::process::PidfdFlags::empty(),
            )?)
        })
        .map_err(|e| TraceError::Unmap(pid, e))?;
    for &(addr, len) in ranges {
        advise(pid, &pidfd, addr, len)?;
    }
    // MADV_PAGEOUT passes over pages it cannot take at that moment, e.g. one still
    // in some CPU's LRU batch, which only that CPU drains: advise what is still
    // mapped again from each CPU in turn (a running guest maps pages back as it
    // touches them; that is fine, the tracer's baseline comes after this).
    let cpus = allowed_cpus();
    let mut r = Ok(());
    for round in 0..4 * cpus.len().max(1) {
        let mut left = Vec::new();
        for &(addr, len) in ranges {
            match present_runs(pid, addr, len) {
                Ok(v) => left.extend(v),
                Err(e) => r = Err(e),
            }
        }
        if left.is_empty() || r.is_err() {
            break;
        }
        if let Some(&cpu) = cpus.get(round % cpus.len().max(1)) {
            pin_to(&[cpu]);
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
        if let Some(e) = left
            .into_iter()
            .find_map(|(addr, len)| advise(pid, &pidfd, addr, len).err())
        {
            r = Err(e);
            break;
        }
    }
    pin_to(&cpus);
    r
}

/// The CPUs this thread may run on.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: sched_getaffinity writes at most the size given into `set`.
    let ok =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if ok != 0 {
        return Vec::new();
    }
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `i` is below CPU_SETSIZE, inside the set.
        .filter(|&i| unsafe { libc::CPU_ISSET(i, &set) })
        .collect()
}

/// Lets this thread run on `cpus` only (nothing changes for an empty list).
fn pin_to(cpus: &[usize]) {
    if cpus.is_empty() {
        return;
    }
    // SAFETY: a zeroed cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
        // SAFETY: CPU_SET writes inside the set for c < CPU_SETSIZE.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: `set` is a valid cpu_set_t of the size given.
    unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
}

/// `MADV_PAGEOUT` of one range of the process behind `pidfd`.
fn advise(pid: u32, pidfd: &OwnedFd, addr: u64, len: u64) -> Result<(), TraceError> {
    let mut done = 0u64;
    // The kernel may advise part of a range and return the bytes it did.
    while done < len {
        let iov = libc::iovec {
            iov_base: (addr + done) as *mut libc::c_void,
            iov_len: (len - done) as usize,
        };
        // SAFETY: the iovec names memory of the *other* process, which the kernel
        // checks; from ours it reads only `iov`, alive for the call.
        let r = unsafe {
            libc::syscall(
                libc::SYS_process_madvise,
                pidfd.as_raw_fd(),
                &iov as *const libc::iovec,
                1usize,
                libc::MADV_PAGEOUT,
                0u32,
            )
        };
        if r <= 0 {
            let e = if r == 0 {
                io::Error::other("the kernel advised no bytes")
            } else {
                io::Error::last_os_error()
            };
            return Err(TraceError::Unmap(pid, e));
        }
        done += r as u64;
    }
    Ok(())
}

/// The runs of pages of `addr..addr+len` that are mapped in `pid` now, as one poll
/// of a [`PagemapTracer`] sees them.
fn present_runs(pid: u32, addr: u64, len: u64) -> Result<Vec<(u64, u64)>, TraceError> {
    let mut t = PagemapTracer::new(pid, vec![(0, addr, len)])?;
    t.poll()?;
    let mut pages: Vec<u64> = t.into_trace().pages.iter().map(|p| p.page).collect();
    pages.sort_unstable();
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for p in pages {
        let a = addr + p * PAGE_SIZE;
        match runs.last_mut() {
            Some((start, l)) if *start + *l == a => *l += PAGE_SIZE,
            _ => runs.push((a, PAGE_SIZE)),
        }
    }
    Ok(runs)
}

/// The paper's weights of the sampled and the post-snapshot working-set sizes.
pub const WSS_A: f64 = 0.7;
pub const WSS_B: f64 = 0.3;

/// The paper's working-set size: `a * WSS_sample + b * WSS_snapshot`; without a
/// sample, the post-snapshot count alone.
pub fn estimate_wss(sample: Option<u64>, snapshot: u64, a: f64, b: f64) -> u64 {
    match sample {
        Some(s) => (a * s as f64 + b * snapshot as f64).round() as u64,
        None => snapshot,
    }
}

/// The elastic working set the paper restores by default: half the estimate.
pub fn elastic_pages(wss: u64) -> u64 {
    wss / 2
}

/// Hit rate and accuracy of the `loaded` working set (n pages) against the pages
/// the guest touched after its start, in order (repeats ignored), as HotRestore
/// section 6.1.1 defines them:
///
/// - hit rate: of the first n distinct pages touched, the share that was loaded;
/// - accuracy: the paper traces "an extra 1/5 size" and divides the hits by "1.2
///   times given size". Read literally, accuracy could never exceed 1/1.2 = 0.83,
///   yet its Table 2 reports 1.0 for MySQL and Mummer; so the hits among the first
///   1.2·n distinct pages are counted against n: the share of the loaded pages
///   the guest used soon after it started (at most 1).
///
/// `None` when the guest touched fewer than n distinct pages (not enough accesses
/// to tell) or nothing was loaded.
pub fn hit_rate_accuracy(loaded: &[TracePage], touched: &[TracePage]) -> Option<(f64, f64)> {
    let n = loaded.len();
    let m = n + n / 5;
    let mut seen = std::collections::HashSet::with_capacity(m);
    let distinct: Vec<&TracePage> = touched
        .iter()
        .filter(|p| seen.insert(**p))
        .take(m)
        .collect();
    if n == 0 || distinct.len() < n {
        return None;
    }
    let ws: std::collections::HashSet<&TracePage> = loaded.iter().collect();
    let hits = distinct[..n].iter().filter(|p| ws.contains(*p)).count();
    let used = distinct.iter().filter(|p| ws.contains(*p)).count();
    Some((hits as f64 / n as f64, (used as f64 / n as f64).min(1.0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(page: u64) -> TracePage {
        TracePage { block: 0, page }
    }

    #[test]
    fn traces_round_trip_and_malformed_files_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("t");
        let t = Trace {
            pages: vec![tp(9), tp(1), TracePage { block: 1, page: 2 }],
        };
        t.write(&p).unwrap();
        assert_eq!(Trace::read(&p, 100).unwrap(), t);
        let good = std::fs::read(&p).unwrap();
        let try_with = |b: &[u8], max: u64| {
            std::fs::write(&p, b).unwrap();
            Trace::read(&p, max).unwrap_err().to_string()
        };
        assert!(try_with(&good[..10], 100).contains("truncated"));
        assert!(try_with(&good[..good.len() - 1], 100).contains("truncated"));
        let mut b = good.clone();
        b[0] = b'X';
        assert!(try_with(&b, 100).contains("wrong magic"));
        let mut b = good.clone();
        b[8] = 9;
        assert!(try_with(&b, 100).contains("version 9"));
        let mut b = good.clone();
        b[13] = 0;
        assert!(try_with(&b, 100).contains("page size"));
        assert!(try_with(&good, 2).contains("3 entries for a guest of 2 pages"));
        let mut b = good.clone();
        b[HEADER] ^= 1;
        assert!(try_with(&b, 100).contains("checksum"));
        // An oversized count is refused before anything is allocated for it.
        let mut b = good.clone();
        b[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(try_with(&b, 100).contains("entries for a guest"));
        // Duplicates and pages outside the guest, with a valid checksum.
        let dup = Trace {
            pages: vec![tp(1), tp(1)],
        };
        dup.write(&p).unwrap();
        assert!(Trace::read(&p, 100)
            .unwrap_err()
            .to_string()
            .contains("twice"));
        Trace {
            pages: vec![tp(500)],
        }
        .write(&p)
        .unwrap();
        assert!(Trace::read(&p, 100)
            .unwrap_err()
            .to_string()
            .contains("outside the guest"));
        // Per block: block 1 has 2 pages, there is no block 2.
        t.write(&p).unwrap();
        assert_eq!(Trace::read_blocks(&p, &[10, 3]).unwrap(), t);
        assert!(Trace::read_blocks(&p, &[10, 2])
            .unwrap_err()
            .to_string()
            .contains("page 2 of block 1 is outside"));
        assert!(Trace::read_blocks(&p, &[100]).is_err());
        // Pages that do not fit an entry are refused when writing.
        assert!(Trace {
            pages: vec![tp(1 << 48)]
        }
        .write(&p)
        .is_err());
    }

    /// Both ways of reading the page table (the ioctl and plain pagemap entries)
    /// see the same pages, in address order within a poll, each once.
    #[test]
    fn both_pagemap_readers_see_the_same_first_touches() {
        let len = 4usize << 20;
        // SAFETY: a fresh shared anonymous mapping, unmapped at the end of the test.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        let touch = |pages: &[usize]| {
            for &p in pages {
                // SAFETY: pages below 1024 are inside the 4 MiB mapping.
                unsafe { std::ptr::write_volatile((base as *mut u8).add(p * 4096), 1) };
            }
        };
        let blocks = vec![(2u16, base as u64, len as u64)];
        let pid = std::process::id();
        let mut scan = PagemapTracer::new(pid, blocks.clone()).unwrap();
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
        let mut v = release
            .split(|c: char| !c.is_ascii_digit())
            .map(|n| n.parse::<u32>().unwrap_or(0));
        let (major, minor) = (v.next().unwrap_or(0), v.next().unwrap_or(0));
        assert_eq!(
            scan.scan,
            (major, minor) >= (6, 7),
            "PAGEMAP_SCAN on {release}"
        );
        let mut read = PagemapTracer::new(pid, blocks).unwrap();
        read.scan = false;
        read.buf = vec![0u8; 4096];
        touch(&[900, 5, 100, 7]);
        assert_eq!(scan.poll().unwrap(), 4);
        assert_eq!(read.poll().unwrap(), 4);
        touch(&[3, 5, 1023]);
        assert_eq!(scan.poll().unwrap(), 2);
        assert_eq!(read.poll().unwrap(), 2);
        let want: Vec<TracePage> = [5, 7, 100, 900, 3, 1023]
            .iter()
            .map(|&page| TracePage { block: 2, page })
            .collect();
        assert_eq!(scan.into_trace().pages, want);
        assert_eq!(read.into_trace().pages, want);
        // SAFETY: unmaps the mapping made above; nothing refers to it any more.
        unsafe { libc::munmap(base, len) };
    }

    #[test]
    fn estimates_and_rates_follow_the_paper() {
        assert_eq!(estimate_wss(Some(1000), 2000, 0.7, 0.3), 1300);
        assert_eq!(estimate_wss(None, 2000, 0.7, 0.3), 2000);
        assert_eq!(elastic_pages(1301), 650);
        let loaded: Vec<TracePage> = (0..10).map(tp).collect();
        // The guest touches 8 of the 10 first, then 2 others, then the last 2.
        // Repeats count once.
        let touched: Vec<TracePage> = (0..8).chain([3, 50, 51, 8, 9]).map(tp).collect();
        let (h, a) = hit_rate_accuracy(&loaded, &touched).unwrap();
        assert!((h - 0.8).abs() < 1e-9, "{h}");
        assert!((a - 1.0).abs() < 1e-9, "{a}");
        assert_eq!(hit_rate_accuracy(&loaded, &touched[..5]), None);
        // Only the first 1.2 n distinct pages count for accuracy: 8 of them is late.
        let late: Vec<TracePage> = (0..8).chain([50, 51, 52, 8, 9]).map(tp).collect();
        let (h, a) = hit_rate_accuracy(&loaded, &late).unwrap();
        assert!((h - 0.8).abs() < 1e-9 && (a - 0.9).abs() < 1e-9, "{h} {a}");
        assert_eq!(hit_rate_accuracy(&[], &touched), None);
    }
}
