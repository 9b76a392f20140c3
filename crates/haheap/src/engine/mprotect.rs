//! `mprotect` engine (the talk's "PT"): the region stays read-only while tracked; the first
//! store to a page raises SIGSEGV, whose handler records the page and makes it writable.
//! Re-arming takes one `mprotect` per run of written pages, or one over the whole region
//! when that is cheaper (many runs in a region of moderate size).

use std::io;

use super::bitmap::PageBitmap;
use super::sigsegv::{self, Registration};
use super::{for_each_run, restore_from_shadow, Dirty, EngineError, Tracker};
use crate::config::EngineKind;
use crate::region::Region;

pub struct MprotectEngine {
    // Field order matters: the registration must retire before the bitmap is freed.
    registration: Option<Registration>,
    bitmap: Box<PageBitmap>,
    addr: usize,
    len: usize,
    page: usize,
}

impl MprotectEngine {
    pub fn new(region: &Region) -> Result<MprotectEngine, EngineError> {
        let bitmap = Box::new(PageBitmap::new(region.pages()));
        // SAFETY: the bitmap is boxed (stable address) and owned by the engine, whose field
        // order drops the registration first; it covers region.pages() pages.
        let registration = unsafe {
            sigsegv::register(
                region.addr(),
                region.len(),
                region.page_size(),
                bitmap.as_ptr(),
            )?
        };
        let engine = MprotectEngine {
            registration: Some(registration),
            bitmap,
            addr: region.addr(),
            len: region.len(),
            page: region.page_size(),
        };
        engine.protect(engine.addr, engine.len, libc::PROT_READ)?;
        Ok(engine)
    }

    fn protect(&self, addr: usize, len: usize, prot: i32) -> Result<(), EngineError> {
        // SAFETY: [addr, addr+len) lies inside the region this engine tracks; changing its
        // protection is the tracking mechanism and the handler restores write access on demand.
        if unsafe { libc::mprotect(addr as *mut libc::c_void, len, prot) } != 0 {
            return Err(EngineError::Protect {
                addr,
                len,
                source: io::Error::last_os_error(),
            });
        }
        Ok(())
    }
}

impl Tracker for MprotectEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Mprotect
    }

    fn begin(&mut self) -> Result<(), EngineError> {
        // Always armed: pages are re-protected at the end of the previous transaction.
        Ok(())
    }

    fn before_write(&mut self, _mem: &[u8], _off: usize, _len: usize) {
        // The store itself faults; nothing to log.
    }

    fn take(&mut self, out: &mut Dirty) -> Result<(), EngineError> {
        out.clear();
        self.bitmap.drain(&mut out.pages);
        Ok(())
    }

    fn rearm(&mut self, taken: &Dirty) -> Result<(), EngineError> {
        let mut runs = 0;
        for_each_run(&taken.pages, |_, _| runs += 1);
        if whole_region_is_cheaper(runs, taken.pages.len(), self.len) {
            return self.protect(self.addr, self.len, libc::PROT_READ);
        }
        let mut res = Ok(());
        for_each_run(&taken.pages, |first, count| {
            if res.is_ok() {
                res = self.protect(
                    self.addr + first * self.page,
                    count * self.page,
                    libc::PROT_READ,
                );
            }
        });
        res
    }

    fn restore(&mut self, taken: &Dirty, mem: &mut [u8], shadow: &[u8]) -> Result<(), EngineError> {
        // The taken pages are still writable: restoring them does not fault.
        restore_from_shadow(&taken.pages, self.page, mem, shadow);
        self.rearm(taken)
    }
}

/// Whether one `mprotect` over the whole region re-arms `pages` written pages in `runs`
/// runs faster than one call per run. Costs measured here (C loop, 10 MB region): a call
/// per run ~3.6 µs each; one call over the region ~1.5 µs per page it makes read-only plus
/// a page-table walk of ~60 ns per MiB (32 random pages: 51 against 117 µs; 1 page: 4.0
/// against 3.4 µs). The engine is the fallback where userfaultfd is missing, and the
/// benchmarks' baseline: it should be as fast as the mechanism allows.
fn whole_region_is_cheaper(runs: usize, pages: usize, region_len: usize) -> bool {
    const PER_RUN_NS: usize = 3600;
    const PER_PAGE_NS: usize = 1500;
    const WALK_NS_PER_MIB: usize = 60;
    runs > 1 && runs * PER_RUN_NS > pages * PER_PAGE_NS + (region_len >> 20) * WALK_NS_PER_MIB
}

impl Drop for MprotectEngine {
    fn drop(&mut self) {
        // Give the memory back writable before it leaves our table.
        let _ = self.protect(self.addr, self.len, libc::PROT_READ | libc::PROT_WRITE);
        self.registration.take();
    }
}

#[cfg(test)]
mod tests {
    use super::whole_region_is_cheaper;

    #[test]
    fn one_call_over_the_region_only_when_it_pays() {
        let mib = 1 << 20;
        assert!(!whole_region_is_cheaper(1, 1, 10 * mib), "a single run");
        assert!(!whole_region_is_cheaper(1, 64, 10 * mib), "one long run");
        assert!(whole_region_is_cheaper(32, 32, 10 * mib), "scattered pages");
        assert!(whole_region_is_cheaper(2, 2, 10 * mib));
        assert!(
            !whole_region_is_cheaper(2, 2, 1024 * mib),
            "a walk of 1 GiB costs more"
        );
        assert!(whole_region_is_cheaper(64, 64, 1024 * mib));
    }
}
