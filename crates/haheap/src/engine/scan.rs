//! `scan` engine: userfaultfd asynchronous write-protection plus the `PAGEMAP_SCAN` ioctl
//! (Linux 6.7+), the modern form of the talk's "Scanxen". A store to a protected page is
//! resolved inside the kernel without a signal or a thread switch: it only clears the PTE's
//! write-protect bit. At the end of a transaction one ioctl reports the written pages and
//! protects them again.
//!
//! The scan walks only the heap's range, asks the kernel for written pages only and re-protects
//! only those (`PM_SCAN_WP_MATCHING` with category `PAGE_IS_WRITTEN`), so clean and never
//! populated parts cost a page-table walk and no PTE updates. `PM_SCAN_CHECK_WPASYNC` makes the
//! kernel fail loudly rather than report nothing if the range ever left async tracking.

use super::{restore_from_shadow, Dirty, EngineError, Tracker};
use crate::config::EngineKind;
use crate::region::Region;
use crate::sys::{
    PageRegion, Pagemap, Uffd, PAGE_IS_WRITTEN, PM_SCAN_CHECK_WPASYNC, PM_SCAN_WP_MATCHING,
    UFFD_FEATURE_WP_ASYNC, UFFD_FEATURE_WP_UNPOPULATED,
};

/// Regions returned per ioctl; a region is a run of adjacent written pages, so one call
/// covers any transaction with up to this many separate runs.
const VEC_LEN: usize = 256;

pub struct ScanEngine {
    uffd: Uffd,
    pagemap: Pagemap,
    vec: Vec<PageRegion>,
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
            addr,
            len,
            page: region.page_size(),
        })
    }

    /// How the userfaultfd was obtained.
    pub fn access(&self) -> crate::sys::Access {
        self.uffd.access()
    }

    /// Appends written pages to `out`; with `reprotect` the same call write-protects them.
    fn scan(&mut self, reprotect: bool, out: &mut Vec<usize>) -> Result<(), EngineError> {
        let flags = PM_SCAN_CHECK_WPASYNC | if reprotect { PM_SCAN_WP_MATCHING } else { 0 };
        let end = (self.addr + self.len) as u64;
        let mut start = self.addr as u64;
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
        self.scan(true, &mut out.pages)
    }

    fn restore(&mut self, taken: &Dirty, mem: &mut [u8], shadow: &[u8]) -> Result<(), EngineError> {
        restore_from_shadow(&taken.pages, self.page, mem, shadow);
        let mut scratch = Vec::new();
        self.scan(true, &mut scratch)
    }
}

impl Drop for ScanEngine {
    fn drop(&mut self) {
        // Leaves the memory plain and writable; the descriptors close after this.
        let _ = self.uffd.unregister(self.addr as u64, self.len as u64);
    }
}
