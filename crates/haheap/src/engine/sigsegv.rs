//! The process-wide SIGSEGV handler of the mprotect engine and its table of tracked regions.
//!
//! The handler runs on whatever thread wrote to a read-only page, so it may only do
//! async-signal-safe work: it looks the address up in a fixed table of atomics, sets a bit in
//! the region's preallocated bitmap, and mprotects that one page writable. A fault outside
//! every tracked region goes to the handler that was installed before ours, or to the default
//! action, so real segfaults still kill the process.
//!
//! Unregistering waits for handlers in flight: a handler announces itself in the slot's
//! in-flight count before it confirms the slot is live, and leaves after its bitmap write
//! and `mprotect`; [`Registration`]'s drop unpublishes the slot and then waits for the count
//! to reach zero, so no handler can write into a bitmap the engine frees next.

use std::io;
use std::sync::atomic::{AtomicPtr, AtomicU8, AtomicUsize, Ordering};
use std::sync::OnceLock;

use super::bitmap::PageBitmap;

/// Errors of the handler table.
#[derive(Debug, thiserror::Error)]
pub enum SignalError {
    /// Every slot of the fixed region table is taken.
    #[error("too many mprotect-tracked heaps in this process (limit {0})")]
    TableFull(usize),
    /// sigaction refused our handler.
    #[error("installing the SIGSEGV handler failed")]
    Install(#[source] io::Error),
}

const SLOTS: usize = 64;
const FREE: u8 = 0;
const CLAIMED: u8 = 1;
const LIVE: u8 = 2;

struct Slot {
    state: AtomicU8,
    start: AtomicUsize,
    end: AtomicUsize,
    page_shift: AtomicUsize,
    bitmap: AtomicPtr<PageBitmap>,
    /// Handlers between their confirming the slot live and their last use of it.
    in_flight: AtomicUsize,
}

#[allow(clippy::declare_interior_mutable_const)] // only used to initialise TABLE
const EMPTY: Slot = Slot {
    state: AtomicU8::new(FREE),
    start: AtomicUsize::new(0),
    end: AtomicUsize::new(0),
    page_shift: AtomicUsize::new(12),
    bitmap: AtomicPtr::new(std::ptr::null_mut()),
    in_flight: AtomicUsize::new(0),
};
static TABLE: [Slot; SLOTS] = [EMPTY; SLOTS];
/// The SIGSEGV disposition before ours, for chaining.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();
static INSTALLED: OnceLock<Result<(), i32>> = OnceLock::new();

/// A region's entry in the table; removing it is the Drop.
pub struct Registration(usize);

/// Adds `[start, start+len)` to the table so faults in it mark `bitmap`.
///
/// # Safety
/// `bitmap` must stay alive, at the same address, until the Registration is dropped, and
/// must cover `len / page_size` pages.
pub unsafe fn register(
    start: usize,
    len: usize,
    page_size: usize,
    bitmap: *const PageBitmap,
) -> Result<Registration, SignalError> {
    install()?;
    for (i, slot) in TABLE.iter().enumerate() {
        if slot
            .state
            .compare_exchange(FREE, CLAIMED, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            slot.start.store(start, Ordering::Relaxed);
            slot.end.store(start + len, Ordering::Relaxed);
            slot.page_shift
                .store(page_size.trailing_zeros() as usize, Ordering::Relaxed);
            slot.bitmap.store(bitmap.cast_mut(), Ordering::Relaxed);
            // Release: the handler sees the fields before it sees LIVE.
            slot.state.store(LIVE, Ordering::Release);
            return Ok(Registration(i));
        }
    }
    Err(SignalError::TableFull(SLOTS))
}

impl Drop for Registration {
    fn drop(&mut self) {
        let slot = &TABLE[self.0];
        // SeqCst pairs with the handler's SeqCst increment and re-check: either the handler
        // sees CLAIMED and leaves the slot alone, or we see its count and wait for it.
        slot.state.store(CLAIMED, Ordering::SeqCst);
        let mut spins = 0u32;
        while slot.in_flight.load(Ordering::SeqCst) != 0 {
            // A handler runs a bitmap write and one mprotect: microseconds, unless its
            // thread is descheduled, when yielding lets it finish.
            spins += 1;
            if spins < 1000 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        slot.bitmap.store(std::ptr::null_mut(), Ordering::Relaxed);
        slot.state.store(FREE, Ordering::Release);
    }
}

fn install() -> Result<(), SignalError> {
    let res = INSTALLED.get_or_init(|| {
        // SAFETY: sigaction is plain data; zeroed is a valid empty mask and no flags.
        let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
        sa.sa_sigaction = on_sigsegv as *const () as usize;
        // SA_ONSTACK keeps Rust's stack-overflow detection working on its alternate stack.
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART;
        // SAFETY: zeroed sigaction to receive the old disposition.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: `sa` and `old` are live sigaction structs; on_sigsegv has the SA_SIGINFO
        // signature and is async-signal-safe.
        if unsafe { libc::sigaction(libc::SIGSEGV, &sa, &mut old) } != 0 {
            return Err(io::Error::last_os_error().raw_os_error().unwrap_or(0));
        }
        let _ = PREVIOUS.set(old);
        Ok(())
    });
    res.map_err(|e| SignalError::Install(io::Error::from_raw_os_error(e)))
}

extern "C" fn on_sigsegv(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as usize;
    // SAFETY: __errno_location returns this thread's errno; mprotect below may change it and
    // the interrupted code must not notice.
    let saved_errno = unsafe { *libc::__errno_location() };
    if handle(addr) {
        // SAFETY: as above.
        unsafe { *libc::__errno_location() = saved_errno };
        return;
    }
    chain(sig, info, ctx);
}

/// Marks and unprotects the page holding `addr` if a tracked region contains it.
fn handle(addr: usize) -> bool {
    for slot in TABLE.iter() {
        // A cheap look first: most slots are free or hold other regions.
        if slot.state.load(Ordering::Acquire) != LIVE || !in_range(slot, addr) {
            continue;
        }
        slot.in_flight.fetch_add(1, Ordering::SeqCst);
        // Confirmed after announcing ourselves: a drop that unpublished the slot before
        // our increment is seen here; one after it waits for our decrement below. Until
        // then the slot cannot be freed and registered again, so its fields stay.
        let ours = slot.state.load(Ordering::SeqCst) == LIVE && in_range(slot, addr);
        let handled = ours && mark(slot, addr);
        slot.in_flight.fetch_sub(1, Ordering::SeqCst);
        if ours {
            return handled;
        }
    }
    false
}

fn in_range(slot: &Slot, addr: usize) -> bool {
    (slot.start.load(Ordering::Relaxed)..slot.end.load(Ordering::Relaxed)).contains(&addr)
}

/// Records the page of `addr` in the live `slot`'s bitmap and makes that page writable.
fn mark(slot: &Slot, addr: usize) -> bool {
    let start = slot.start.load(Ordering::Relaxed);
    let shift = slot.page_shift.load(Ordering::Relaxed);
    let page = (addr - start) >> shift;
    let bitmap = slot.bitmap.load(Ordering::Relaxed);
    if bitmap.is_null() {
        return false;
    }
    #[cfg(test)]
    tests::pause_at(addr);
    // SAFETY: register()'s contract keeps the bitmap alive until the Registration is
    // dropped, and its drop waits for this handler (counted in `in_flight`) to finish.
    unsafe { (*bitmap).set(page) };
    let page_addr = start + (page << shift);
    // SAFETY: the page lies inside a region its Heap owns and tracks (the registration
    // cannot end before we return); making it writable is exactly what the faulting store
    // needs. mprotect is a plain syscall (async-signal-safe in practice).
    let rc = unsafe {
        libc::mprotect(
            page_addr as *mut libc::c_void,
            1 << shift,
            libc::PROT_READ | libc::PROT_WRITE,
        )
    };
    rc == 0
}

/// Passes a fault that is not ours to the previous handler, or restores the default action
/// so that returning re-executes the access and the kernel kills the process as usual.
fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    if let Some(prev) = PREVIOUS.get() {
        let h = prev.sa_sigaction;
        if h != libc::SIG_DFL && h != libc::SIG_IGN {
            if prev.sa_flags & libc::SA_SIGINFO != 0 {
                // SAFETY: the previous owner installed `h` with the SA_SIGINFO signature.
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    unsafe { std::mem::transmute(h) };
                f(sig, info, ctx);
            } else {
                // SAFETY: the previous owner installed `h` with the plain handler signature.
                let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(h) };
                f(sig);
            }
            return;
        }
    }
    // SAFETY: zeroed sigaction is SIG_DFL with an empty mask.
    let dfl: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: resetting SIGSEGV to its default is async-signal-safe; the re-executed fault
    // then terminates the process with SIGSEGV.
    unsafe { libc::sigaction(libc::SIGSEGV, &dfl, std::ptr::null_mut()) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::time::{Duration, Instant};

    /// Test-only widening of a real race: a handler for a store to this address waits
    /// here, between confirming its slot and writing the bitmap, for `PAUSE`.
    static PAUSE_ADDR: AtomicUsize = AtomicUsize::new(0);
    static PAUSED: AtomicBool = AtomicBool::new(false);
    const PAUSE: Duration = Duration::from_millis(200);

    pub(super) fn pause_at(addr: usize) {
        if addr != PAUSE_ADDR.load(Ordering::SeqCst) {
            return;
        }
        PAUSED.store(true, Ordering::SeqCst);
        // clock_gettime is async-signal-safe.
        let t = Instant::now();
        while t.elapsed() < PAUSE {
            std::hint::spin_loop();
        }
    }

    #[test]
    fn drop_waits_for_a_handler_past_its_check() {
        // SAFETY: a fresh private anonymous page, ours alone, read-only so a store faults.
        let page = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(page, libc::MAP_FAILED);
        let addr = page as usize;
        let bitmap = Box::new(PageBitmap::new(1));
        // SAFETY: the bitmap outlives the registration (dropped below, before it) and
        // covers the one page.
        let reg = unsafe { register(addr, 4096, 4096, bitmap.as_ptr()) }.unwrap();
        PAUSE_ADDR.store(addr, Ordering::SeqCst);
        let writer = std::thread::spawn(move || {
            // SAFETY: the page is mapped; the store faults and our handler makes it
            // writable before the store is retried.
            unsafe { std::ptr::write_volatile(addr as *mut u8, 1) };
        });
        while !PAUSED.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        drop(reg);
        // From here the engine would free the bitmap: nothing may write it any more.
        let mut at_drop = Vec::new();
        bitmap.drain(&mut at_drop);
        writer.join().unwrap();
        let mut later = Vec::new();
        bitmap.drain(&mut later);
        PAUSE_ADDR.store(0, Ordering::SeqCst);
        // SAFETY: the page mapped above; no one uses it any more.
        unsafe { libc::munmap(page, 4096) };
        assert!(
            later.is_empty(),
            "a handler wrote the bitmap after its registration was dropped"
        );
        assert_eq!(
            at_drop,
            vec![0],
            "the handler's write came before the drop ended"
        );
    }
}
