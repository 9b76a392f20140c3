//! `mprotect` engine (the talk's "PT"): the region stays read-only while tracked; the first
//! store to a page raises SIGSEGV, whose handler records the page and makes it writable.

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

impl Drop for MprotectEngine {
    fn drop(&mut self) {
        // Give the memory back writable before it leaves our table.
        let _ = self.protect(self.addr, self.len, libc::PROT_READ | libc::PROT_WRITE);
        self.registration.take();
    }
}
