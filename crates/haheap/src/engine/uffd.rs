//! `uffd` engine: userfaultfd synchronous write-protection. A store to a protected page
//! blocks the writer; a handler thread records the page, removes the protection (which
//! wakes the writer) and goes back to waiting. With a spin budget the thread busy-polls
//! for the next fault that long before it sleeps: a transaction's faults then cost one
//! thread switch each (the writer's) instead of two.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::bitmap::PageBitmap;
use super::{for_each_run, restore_from_shadow, Dirty, EngineError, Tracker};
use crate::config::EngineKind;
use crate::region::Region;
use crate::sys::{
    Uffd, UffdMsg, UFFD_EVENT_PAGEFAULT, UFFD_FEATURE_WP_UNPOPULATED, UFFD_PAGEFAULT_FLAG_WP,
};

pub struct UffdEngine {
    shared: Arc<Shared>,
    stop: OwnedFd,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    uffd: Uffd,
    bitmap: PageBitmap,
    addr: usize,
    len: usize,
    page: usize,
}

impl UffdEngine {
    pub fn new(region: &Region, spin: Duration) -> Result<UffdEngine, EngineError> {
        // WP_UNPOPULATED makes never-touched pages fault like protected ones; without it we
        // pre-fault the region so every page has a PTE that can carry the protection bit.
        let (uffd, prefault) = match Uffd::open(UFFD_FEATURE_WP_UNPOPULATED) {
            Ok(u) => (u, false),
            Err(crate::sys::SysError::MissingFeature { .. }) => (Uffd::open(0)?, true),
            Err(e) => return Err(e.into()),
        };
        if prefault {
            populate_write(region)?;
        }
        let (addr, len) = (region.addr(), region.len());
        // SAFETY: the region is private anonymous memory the Heap owns for the engine's
        // lifetime; the handler thread started below resolves every fault until Drop unregisters.
        unsafe { uffd.register_wp(addr as u64, len as u64)? };
        let shared = Arc::new(Shared {
            uffd,
            bitmap: PageBitmap::new(region.pages()),
            addr,
            len,
            page: region.page_size(),
        });
        // SAFETY: eventfd takes an initial value and flags and returns a new descriptor or -1.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if efd < 0 {
            return Err(EngineError::Thread(io::Error::last_os_error()));
        }
        // SAFETY: eventfd just returned this descriptor and nothing else owns it.
        let stop = unsafe { OwnedFd::from_raw_fd(efd) };
        let (s, stop_raw) = (shared.clone(), stop.as_raw_fd());
        let thread = std::thread::Builder::new()
            .name("haheap-uffd".into())
            .spawn(move || serve(&s, stop_raw, spin))
            .map_err(EngineError::Thread)?;
        let engine = UffdEngine {
            shared,
            stop,
            thread: Some(thread),
        };
        engine
            .shared
            .uffd
            .writeprotect(addr as u64, len as u64, true)?;
        Ok(engine)
    }
}

/// The handler thread: resolve write-protect faults until the stop eventfd fires.
fn serve(s: &Shared, stop: i32, spin: Duration) {
    let mut msgs = [UffdMsg::default(); 16];
    loop {
        // After a fault, more tend to follow: look for them without sleeping for `spin`.
        let mut since = Instant::now();
        while since.elapsed() < spin {
            match s.uffd.read_msgs(&mut msgs) {
                Ok(0) => std::hint::spin_loop(),
                Ok(n) => {
                    resolve(s, &msgs[..n]);
                    since = Instant::now();
                }
                Err(_) => return,
            }
        }
        let mut fds = [
            libc::pollfd {
                fd: s.uffd.raw(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: stop,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: `fds` is a live array of two pollfd.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if rc < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        if fds[1].revents != 0 {
            return;
        }
        let n = match s.uffd.read_msgs(&mut msgs) {
            Ok(n) => n,
            Err(_) => return,
        };
        resolve(s, &msgs[..n]);
    }
}

/// Records and un-protects the pages of write-protect faults in `msgs`.
fn resolve(s: &Shared, msgs: &[UffdMsg]) {
    for m in msgs {
        if m.event != UFFD_EVENT_PAGEFAULT || m.pf_flags & UFFD_PAGEFAULT_FLAG_WP == 0 {
            continue;
        }
        let addr = m.pf_address as usize;
        if addr < s.addr || addr >= s.addr + s.len {
            continue;
        }
        let page = (addr - s.addr) / s.page;
        // Record before un-protecting: the writer resumes only after the ioctl, so once
        // its store has returned the bit is visible to `take`.
        s.bitmap.set(page);
        let _ = s
            .uffd
            .writeprotect((s.addr + page * s.page) as u64, s.page as u64, false);
    }
}

fn populate_write(region: &Region) -> Result<(), EngineError> {
    // SAFETY: MADV_POPULATE_WRITE only faults in our own private anonymous pages; contents
    // stay as they are.
    let rc = unsafe { libc::madvise(region.ptr().cast(), region.len(), libc::MADV_POPULATE_WRITE) };
    if rc != 0 {
        return Err(EngineError::Populate(io::Error::last_os_error()));
    }
    Ok(())
}

impl Tracker for UffdEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Uffd
    }

    fn begin(&mut self) -> Result<(), EngineError> {
        // Always armed: pages are re-protected at the end of the previous transaction.
        Ok(())
    }

    fn before_write(&mut self, _mem: &[u8], _off: usize, _len: usize) {
        // The store itself faults to the handler thread; nothing to log.
    }

    fn take(&mut self, out: &mut Dirty) -> Result<(), EngineError> {
        out.clear();
        self.shared.bitmap.drain(&mut out.pages);
        Ok(())
    }

    fn rearm(&mut self, taken: &Dirty) -> Result<(), EngineError> {
        let s = &self.shared;
        let mut res = Ok(());
        for_each_run(&taken.pages, |first, count| {
            if res.is_ok() {
                res = s
                    .uffd
                    .writeprotect(
                        (s.addr + first * s.page) as u64,
                        (count * s.page) as u64,
                        true,
                    )
                    .map_err(EngineError::from);
            }
        });
        res
    }

    fn restore(&mut self, taken: &Dirty, mem: &mut [u8], shadow: &[u8]) -> Result<(), EngineError> {
        // The taken pages are still unprotected: restoring them does not fault.
        restore_from_shadow(&taken.pages, self.shared.page, mem, shadow);
        self.rearm(taken)
    }
}

impl Drop for UffdEngine {
    fn drop(&mut self) {
        // Unregister first: it drops the protection, so no writer can block on a fault that
        // nobody will serve once the thread is gone.
        let _ = self
            .shared
            .uffd
            .unregister(self.shared.addr as u64, self.shared.len as u64);
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a live u64 to our eventfd.
        unsafe { libc::write(self.stop.as_raw_fd(), (&one as *const u64).cast(), 8) };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
