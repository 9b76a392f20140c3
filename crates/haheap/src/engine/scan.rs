//! `scan` engine: userfaultfd asynchronous write-protection plus the `PAGEMAP_SCAN` ioctl
//! (Linux 6.7+), the modern form of the talk's "Scanxen". A store to a protected page is
//! resolved inside the kernel without a signal or a thread switch: it only clears the PTE's
//! write-protect bit. At the end of a transaction one ioctl both reports the written pages
//! and protects them again (`PM_SCAN_WP_MATCHING` with category `PAGE_IS_WRITTEN`, so only
//! written PTEs change): one page-table walk per transaction. The heap only reads the pages
//! until the next transaction, so protecting them before the diff costs nothing; measured
//! against a second walk to re-arm while the backup works, the single walk was faster (the
//! walk of a 10 MB region costs about as much as the round trip it would hide behind).
//! `PM_SCAN_CHECK_WPASYNC` makes the kernel fail loudly rather than report nothing if the
//! range ever left async tracking.

use super::{restore_from_shadow, Dirty, EngineError, Tracker};
use crate::config::EngineKind;
use crate::region::Region;
use crate::sys::{PageRegion, Pagemap, Uffd, UFFD_FEATURE_WP_ASYNC, UFFD_FEATURE_WP_UNPOPULATED};
use rebound_pagemap::{PAGE_IS_WRITTEN, PM_SCAN_CHECK_WPASYNC, PM_SCAN_WP_MATCHING};

/// Regions returned per ioctl; a region is a run of adjacent written pages, so one call
/// covers any transaction with up to this many separate runs.
const VEC_LEN: usize = 256;

pub struct ScanEngine {
    uffd: Uffd,
    pagemap: Pagemap,
    vec: Vec<PageRegion>,
    /// Pages found written while re-protecting after a restore that the restore did not write.
    carry: Vec<usize>,
    scratch: Vec<usize>,
    addr: usize,
    len: usize,
    page: usize,
}

impl ScanEngine {
    pub fn new(region: &Region) -> Result<ScanEngine, EngineError> {
        let uffd = Uffd::open(UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_UNPOPULATED)?;
        let pagemap = Pagemap::open()?;
        let (addr, len) = (region.addr(), region.len());
        // SAFETY: the region is private anonymous memory the Heap owns for the engine's
        // lifetime; async write-protect faults are resolved by the kernel, never by us.
        unsafe { uffd.register_wp(addr as u64, len as u64)? };
        uffd.writeprotect(addr as u64, len as u64, true)?;
        Ok(ScanEngine {
            uffd,
            pagemap,
            vec: vec![PageRegion::default(); VEC_LEN],
            carry: Vec::new(),
            scratch: Vec::new(),
            addr,
            len,
            page: region.page_size(),
        })
    }

    /// How the userfaultfd was obtained.
    pub fn access(&self) -> crate::sys::Access {
        self.uffd.access()
    }

    /// Appends the written pages of `[start, end)` to `out`; with `reprotect` the same
    /// call write-protects them.
    fn scan(
        &mut self,
        start: usize,
        end: usize,
        reprotect: bool,
        out: &mut Vec<usize>,
    ) -> Result<(), EngineError> {
        let flags = PM_SCAN_CHECK_WPASYNC | if reprotect { PM_SCAN_WP_MATCHING } else { 0 };
        let (mut start, end) = (start as u64, end as u64);
        while start < end {
            let (n, walk_end) =
                self.pagemap
                    .scan(start, end, flags, PAGE_IS_WRITTEN, &mut self.vec)?;
            for r in &self.vec[..n] {
                let first = (r.start as usize - self.addr) / self.page;
                let last = (r.end as usize - self.addr) / self.page;
                out.extend(first..last);
            }
            // The kernel stops early only when the vector filled up.
            if n < self.vec.len() || walk_end <= start {
                break;
            }
            start = walk_end;
        }
        Ok(())
    }
}

impl Tracker for ScanEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Scan
    }

    fn begin(&mut self) -> Result<(), EngineError> {
        // Always armed: the previous scan re-protected what it reported.
        Ok(())
    }

    fn before_write(&mut self, _mem: &[u8], _off: usize, _len: usize) {
        // The kernel marks the page on the store itself; nothing to log.
    }

    fn take(&mut self, out: &mut Dirty) -> Result<(), EngineError> {
        out.clear();
        let (start, end) = (self.addr, self.addr + self.len);
        self.scan(start, end, true, &mut out.pages)?;
        // The scan reports in address order; only carried pages need merging in.
        if !self.carry.is_empty() {
            out.pages.append(&mut self.carry);
            out.pages.sort_unstable();
            out.pages.dedup();
        }
        Ok(())
    }

    fn rearm(&mut self, _taken: &Dirty) -> Result<(), EngineError> {
        // `take` protected what it reported.
        Ok(())
    }

    fn restore(&mut self, taken: &Dirty, mem: &mut [u8], shadow: &[u8]) -> Result<(), EngineError> {
        // Putting the bytes back writes the pages again: protect them once more without
        // reporting them.
        restore_from_shadow(&taken.pages, self.page, mem, shadow);
        self.reprotect_quietly(taken)
    }
}

impl ScanEngine {
    /// Protects the written pages in the span of `taken`. Pages the restore did not write
    /// (a store from another thread meanwhile) are kept for the next `take`.
    fn reprotect_quietly(&mut self, taken: &Dirty) -> Result<(), EngineError> {
        let (Some(&first), Some(&last)) = (taken.pages.first(), taken.pages.last()) else {
            return Ok(());
        };
        let (start, end) = (
            self.addr + first * self.page,
            self.addr + (last + 1) * self.page,
        );
        let mut seen = std::mem::take(&mut self.scratch);
        seen.clear();
        let res = self.scan(start, end, true, &mut seen);
        // Anything else written in the span belongs to the next transaction.
        self.carry.extend(
            seen.iter()
                .filter(|p| taken.pages.binary_search(p).is_err()),
        );
        self.scratch = seen;
        res
    }
}

impl Drop for ScanEngine {
    fn drop(&mut self) {
        // Leaves the memory plain and writable; the descriptors close after this.
        let _ = self.uffd.unregister(self.addr as u64, self.len as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An 8-page region whose pages 1 and 5 were written and taken.
    fn pages_1_and_5_taken() -> (usize, Region, ScanEngine, Dirty) {
        let page = crate::sys::page_size();
        let mut region = Region::map(8 * page, page).unwrap();
        let mut e = match ScanEngine::new(&region) {
            Ok(e) => e,
            Err(err) => panic!("the scan engine must work on the test machines: {err}"),
        };
        let mem = region.as_mut_slice();
        mem[page] = 1;
        mem[5 * page] = 1;
        let mut taken = Dirty::default();
        e.take(&mut taken).unwrap();
        assert_eq!(taken.pages, vec![1, 5]);
        (page, region, e, taken)
    }

    /// `take` protects what it reports: a store right after it, even to a page it just
    /// reported, belongs to the next transaction.
    #[test]
    fn a_store_after_take_is_reported_by_the_next_take() {
        let (page, mut region, mut e, mut taken) = pages_1_and_5_taken();
        region.as_mut_slice()[5 * page + 7] = 2;
        e.rearm(&taken).unwrap();
        e.take(&mut taken).unwrap();
        assert_eq!(taken.pages, vec![5]);
        e.take(&mut taken).unwrap();
        assert!(taken.pages.is_empty(), "{:?}", taken.pages);
    }

    /// Restoring the taken pages is not reported as a write, but a store meanwhile to a
    /// page the transaction did not take (another thread breaking the single-writer rule)
    /// is carried to the next `take`, not lost to the re-protection.
    #[test]
    fn a_restore_is_not_reported_but_a_stray_store_is_carried() {
        let (page, mut region, mut e, taken) = pages_1_and_5_taken();
        let shadow = vec![0u8; 8 * page];
        region.as_mut_slice()[3 * page] = 1; // inside the span the restore re-protects
        e.restore(&taken, region.as_mut_slice(), &shadow).unwrap();
        assert_eq!(region.as_slice()[page], 0, "page 1 restored");
        let mut next = Dirty::default();
        e.take(&mut next).unwrap();
        assert_eq!(next.pages, vec![3]);
        e.take(&mut next).unwrap();
        assert!(next.pages.is_empty(), "{:?}", next.pages);
    }
}
