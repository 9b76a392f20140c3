//! The `PAGEMAP_SCAN` ioctl on `/proc/<pid>/pagemap` (Linux 6.7+): one call returns the
//! ranges of pages in given categories (present, swapped, written since write-protected,
//! ...) instead of 8 bytes per page for user space to look at, and can write-protect
//! the pages it reports in the same page-table walk.
//!
//! Debian 12's 6.1 user headers lack everything about it, so the structs and numbers
//! are written out here from the Linux uapi (`include/uapi/linux/fs.h`) and pinned with
//! compile-time size assertions. The kernel decides at run time whether it has the
//! ioctl: a kernel without it fails the call (`ENOTTY` or `EINVAL`), which callers use
//! to fall back.
//!
//! Users: the snapshot crate's working-set tracer (present or swapped pages of a QEMU
//! process) and the HA heap's `scan` engine (pages written since the last scan).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// Category: the page may be write-protected asynchronously (userfaultfd `WP_ASYNC`).
pub const PAGE_IS_WPALLOWED: u64 = 1 << 0;
/// Category: the page was written since it was last write-protected.
pub const PAGE_IS_WRITTEN: u64 = 1 << 1;
/// Category: the page maps a file.
pub const PAGE_IS_FILE: u64 = 1 << 2;
/// Category: the page is present in RAM.
pub const PAGE_IS_PRESENT: u64 = 1 << 3;
/// Category: the page is swapped out.
pub const PAGE_IS_SWAPPED: u64 = 1 << 4;

/// Flag: write-protect the pages that matched.
pub const PM_SCAN_WP_MATCHING: u64 = 1 << 0;
/// Flag: fail if a page in the range is not under async write-protection.
pub const PM_SCAN_CHECK_WPASYNC: u64 = 1 << 1;

/// `struct page_region`: pages `[start, end)` (addresses) all in `categories`.
#[repr(C)]
#[derive(Default, Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageRegion {
    pub start: u64,
    pub end: u64,
    pub categories: u64,
}

/// `struct pm_scan_arg`.
#[repr(C)]
#[derive(Default, Debug)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

const _: () = assert!(std::mem::size_of::<PageRegion>() == 24);
const _: () = assert!(std::mem::size_of::<PmScanArg>() == 96);

/// `_IOWR('f', 16, struct pm_scan_arg)`.
pub const PAGEMAP_SCAN: u64 =
    (3 << 30) | ((std::mem::size_of::<PmScanArg>() as u64) << 16) | ((b'f' as u64) << 8) | 16;
// The value the C headers give (linux/fs.h, 6.7): catches a slip in the expression.
const _: () = assert!(PAGEMAP_SCAN == 0xc060_6610);

/// Which pages one scan reports, as the kernel matches them: a page matches when its
/// categories, after flipping those in `inverted`, include all of `all_of` and, if
/// `any_of` is not empty, at least one of `any_of`; only the categories in `report`
/// are reported (adjacent pages with the same reported categories form one region).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Query {
    /// `PM_SCAN_*` flags.
    pub flags: u64,
    pub inverted: u64,
    pub all_of: u64,
    pub any_of: u64,
    pub report: u64,
}

/// A process's `pagemap`, for `PAGEMAP_SCAN` (and for reading its entries).
pub struct Pagemap(File);

impl Pagemap {
    /// `/proc/self/pagemap`.
    pub fn open_self() -> io::Result<Pagemap> {
        File::open("/proc/self/pagemap").map(Pagemap)
    }

    /// `/proc/<pid>/pagemap`.
    pub fn open_pid(pid: u32) -> io::Result<Pagemap> {
        File::open(format!("/proc/{pid}/pagemap")).map(Pagemap)
    }

    /// The file, for reading its 8-byte entries where the kernel lacks the ioctl.
    pub fn file(&self) -> &File {
        &self.0
    }

    /// One `PAGEMAP_SCAN` over the addresses `[start, end)`: fills `out` from its start
    /// with the regions `q` matches; returns how many it filled and where the walk
    /// ended (before `end` when `out` filled up).
    pub fn scan(
        &self,
        start: u64,
        end: u64,
        q: &Query,
        out: &mut [PageRegion],
    ) -> io::Result<(usize, u64)> {
        let mut arg = PmScanArg {
            size: std::mem::size_of::<PmScanArg>() as u64,
            flags: q.flags,
            start,
            end,
            vec: out.as_mut_ptr() as u64,
            vec_len: out.len() as u64,
            category_inverted: q.inverted,
            category_mask: q.all_of,
            category_anyof_mask: q.any_of,
            return_mask: q.report,
            ..Default::default()
        };
        // SAFETY: `arg` lives across the call; `vec` points at `out`, `vec_len` elements
        // of the kernel's `page_region` layout (size asserted above), borrowed mutably
        // for the call; the kernel writes at most `vec_len` of them, and `walk_end`.
        let n = unsafe { libc::ioctl(self.0.as_raw_fd(), PAGEMAP_SCAN as _, &mut arg) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok((n as usize, arg.walk_end))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pages of this process, touched or not, as the kernel sees them (skipped, and
    /// said so, on a kernel without the ioctl).
    #[test]
    fn present_pages_are_the_touched_ones() {
        let page = 4096usize;
        let pages = 16;
        let mut buf = vec![0u8; (pages + 1) * page];
        // A page-aligned window of `pages` pages inside the buffer.
        let base = (buf.as_mut_ptr() as usize).next_multiple_of(page);
        let pm = Pagemap::open_self().unwrap();
        let q = Query {
            any_of: PAGE_IS_PRESENT | PAGE_IS_SWAPPED,
            report: PAGE_IS_PRESENT | PAGE_IS_SWAPPED,
            ..Query::default()
        };
        let mut out = [PageRegion::default(); 8];
        let (b, e) = (base as u64, (base + pages * page) as u64);
        // An empty range tells whether the kernel has the ioctl.
        if let Err(err) = pm.scan(b, b, &q, &mut out) {
            eprintln!("skipped: PAGEMAP_SCAN unavailable here ({err})");
            return;
        }
        // Every page written: one region of them all.
        for i in 0..pages {
            // SAFETY: inside `buf`, which lives until the end of the test.
            unsafe { std::ptr::write_volatile((base + i * page) as *mut u8, 1) };
        }
        let (n, walk_end) = pm.scan(b, e, &q, &mut out).unwrap();
        assert_eq!(walk_end, e);
        assert_eq!(n, 1, "{:?}", &out[..n]);
        assert_eq!((out[0].start, out[0].end), (b, e));
        assert_ne!(out[0].categories & PAGE_IS_PRESENT, 0);
        drop(buf);
    }

    #[test]
    fn a_process_that_does_not_exist_has_no_pagemap() {
        assert!(Pagemap::open_pid(u32::MAX).is_err());
    }
}
