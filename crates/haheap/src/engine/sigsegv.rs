//! The process-wide SIGSEGV handler of the mprotect engine and its table of tracked regions.
//!
//! The handler runs on whatever thread wrote to a read-only page, so it may only do
//! async-signal-safe work: it looks the address up in a fixed table of atomics, sets a bit in
//! the region's preallocated bitmap, and mprotects that one page writable. A fault outside
//! every tracked region goes to the handler that was installed before ours, or to the default
//! action, so real segfaults still kill the process.

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
}

#[allow(clippy::declare_interior_mutable_const)] // only used to initialise TABLE
const EMPTY: Slot = Slot {
    state: AtomicU8::new(FREE),
    start: AtomicUsize::new(0),
    end: AtomicUsize::new(0),
    page_shift: AtomicUsize::new(12),
    bitmap: AtomicPtr::new(std::ptr::null_mut()),
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
        slot.state.store(CLAIMED, Ordering::Release);
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
        if slot.state.load(Ordering::Acquire) != LIVE {
            continue;
        }
        let start = slot.start.load(Ordering::Relaxed);
        let end = slot.end.load(Ordering::Relaxed);
        if addr < start || addr >= end {
            continue;
        }
        let shift = slot.page_shift.load(Ordering::Relaxed);
        let page = (addr - start) >> shift;
        let bitmap = slot.bitmap.load(Ordering::Relaxed);
        if bitmap.is_null() {
            return false;
        }
        // SAFETY: register()'s contract keeps the bitmap alive while the slot is LIVE, and
        // Registration::drop retires the slot before the engine frees the bitmap.
        unsafe { (*bitmap).set(page) };
        let page_addr = start + (page << shift);
        // SAFETY: the page lies inside a region its Heap owns and tracks; making it writable
        // is exactly what the faulting store needs. mprotect is a plain syscall (async-signal-safe
        // in practice).
        let rc = unsafe {
            libc::mprotect(
                page_addr as *mut libc::c_void,
                1 << shift,
                libc::PROT_READ | libc::PROT_WRITE,
            )
        };
        return rc == 0;
    }
    false
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
