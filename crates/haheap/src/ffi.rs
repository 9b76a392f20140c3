//! C ABI. The header `include/haheap.h` is generated from this file by cbindgen (see
//! `tests/header.rs`).
//!
//! Every function returns an `int` status (`HAHEAP_OK` or a negative `HAHEAP_ERR_*`), never
//! unwinds into C (each body runs under `catch_unwind`), and checks its pointers for null.
//! After a failure `haheap_last_error()` describes it on the calling thread.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use crate::config::{BackupFailure, EngineKind, HeapConfig, ReplMode, Spin};
use crate::heap::{Error, Heap};
use crate::repl::ReplError;

/// Success.
pub const HAHEAP_OK: c_int = 0;
/// A required pointer argument was null.
pub const HAHEAP_ERR_NULL: c_int = -1;
/// An argument was invalid: unknown engine name, non-UTF-8 string, zero size, unknown flag.
pub const HAHEAP_ERR_INVALID: c_int = -2;
/// haheap_tstart while a transaction is open.
pub const HAHEAP_ERR_NESTED: c_int = -3;
/// haheap_tend, haheap_abort or haheap_write with no transaction open.
pub const HAHEAP_ERR_NO_TRANSACTION: c_int = -4;
/// haheap_write would reach outside the heap; nothing was written.
pub const HAHEAP_ERR_OUT_OF_BOUNDS: c_int = -5;
/// The dirty-tracking engine is unavailable or failed.
pub const HAHEAP_ERR_ENGINE: c_int = -6;
/// The memory region could not be mapped or declared.
pub const HAHEAP_ERR_REGION: c_int = -7;
/// Replication to the backup failed (the transaction was rolled back), or takeover failed.
pub const HAHEAP_ERR_REPLICATION: c_int = -8;
/// The heap is unusable after an earlier engine failure.
pub const HAHEAP_ERR_BROKEN: c_int = -9;
/// A bug inside the library (a Rust panic was caught at the boundary).
pub const HAHEAP_ERR_PANIC: c_int = -10;
/// The transaction is committed locally and queued for the backup, which has not
/// acknowledged it yet (the backup is gone or restarting); call haheap_tend again to wait
/// for it, for instance once the backup is back (haheap_tstart and haheap_abort return
/// this code meanwhile). A primary that was fenced gets HAHEAP_ERR_FENCED instead.
pub const HAHEAP_ERR_IN_DOUBT: c_int = -11;
/// This primary was fenced: `rebound-ha promote` or another process's haheap_takeover
/// made a new primary current at the backup. It is final: haheap_tstart, haheap_tend,
/// haheap_abort and haheap_flush return it from then on, and nothing more can be
/// committed from this heap. Only the transactions whose haheap_tend returned HAHEAP_OK
/// are in the replica. A fenced primary must stop acting on the heap's contents (the
/// new primary has the replica's and moves on from it): haheap_destroy the heap, and
/// exit or become a standby; to be the primary again, haheap_takeover once the other
/// primary is gone.
pub const HAHEAP_ERR_FENCED: c_int = -12;

/// haheap_create/haheap_takeover flag: replicate asynchronously (at most 64 transactions
/// unacknowledged) instead of waiting for the backup's acknowledgement in haheap_tend.
pub const HAHEAP_FLAG_ASYNC: u32 = 1;
const ASYNC_MAX_LAG: u32 = 64;
/// haheap_create/haheap_declare/haheap_takeover flag: while the backup is gone (killed,
/// restarting), haheap_tend blocks, reconnecting every 50 ms, until the backup is back and
/// has acknowledged, for up to the timeout in the flags' upper 16 bits (seconds; 0 there
/// means HAHEAP_BLOCK_DEFAULT_SECS), then returns HAHEAP_ERR_IN_DOUBT. Without this flag
/// haheap_tend returns HAHEAP_ERR_IN_DOUBT at once.
/// Example: `HAHEAP_FLAG_BLOCK | (30u << HAHEAP_BLOCK_SECS_SHIFT)` blocks up to 30 s.
pub const HAHEAP_FLAG_BLOCK: u32 = 2;
/// haheap_create/haheap_declare/haheap_takeover flag: always busy-poll up to
/// HAHEAP_SPIN_US before sleeping, for the backup's acknowledgement in haheap_tend and,
/// with the uffd engine, for faults; burns a CPU meanwhile. Without this flag (and without
/// HAHEAP_FLAG_NO_SPIN) haheap_tend adapts: it busy-polls up to 100 us for the
/// acknowledgement while the backup has been answering within that, on a machine with
/// more than one CPU, and sleeps otherwise (at most 100 us of CPU per commit, spent
/// instead of a sleeping thread's wake-up, 40-50 us on an idle virtual CPU).
pub const HAHEAP_FLAG_SPIN: u32 = 4;
/// haheap_create/haheap_declare/haheap_takeover flag: never busy-poll; haheap_tend sleeps
/// until the acknowledgement comes (the least CPU, the slowest synchronous commits).
pub const HAHEAP_FLAG_NO_SPIN: u32 = 8;
/// How long HAHEAP_FLAG_SPIN busy-polls, in microseconds.
pub const HAHEAP_SPIN_US: u32 = 200;
/// Bit position of the HAHEAP_FLAG_BLOCK timeout (seconds, 16 bits) in the flags.
pub const HAHEAP_BLOCK_SECS_SHIFT: u32 = 16;
/// The HAHEAP_FLAG_BLOCK timeout when the flags give none.
pub const HAHEAP_BLOCK_DEFAULT_SECS: u32 = 60;

/// An open heap. Opaque to C.
pub struct HaHeap {
    heap: Heap,
    reason: CString,
    /// The heap's base address, fixed for its life.
    base: *mut u8,
}

/// What one committed transaction did.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct HaheapTxStats {
    /// Id of the committed transaction (1 for the first).
    pub tx_id: u64,
    /// Pages the engine reported written.
    pub pages: u64,
    /// Bytes passed to haheap_write in the transaction.
    pub bytes_written_hint: u64,
    /// Payload bytes of the diff shipped to the backup (what would be shipped without one).
    pub bytes_shipped: u64,
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|l| *l.borrow_mut() = c);
}

/// A failure on its way to C: code and message.
struct Fail(c_int, String);

impl From<Error> for Fail {
    fn from(e: Error) -> Fail {
        let code = match &e {
            Error::Nested => HAHEAP_ERR_NESTED,
            Error::NoTransaction => HAHEAP_ERR_NO_TRANSACTION,
            Error::OutOfBounds { .. } => HAHEAP_ERR_OUT_OF_BOUNDS,
            Error::Config(_) | Error::SizeMismatch { .. } => HAHEAP_ERR_INVALID,
            Error::Region(_) => HAHEAP_ERR_REGION,
            Error::Engine(_) => HAHEAP_ERR_ENGINE,
            Error::Replication(ReplError::InDoubt { .. }) | Error::AwaitingAck(_) => {
                HAHEAP_ERR_IN_DOUBT
            }
            Error::Replication(_) | Error::NoBackup => HAHEAP_ERR_REPLICATION,
            Error::Broken => HAHEAP_ERR_BROKEN,
            Error::Fenced(_) => HAHEAP_ERR_FENCED,
        };
        Fail(code, rebound_errors::chain(&e))
    }
}

fn null(what: &str) -> Fail {
    Fail(HAHEAP_ERR_NULL, format!("{what} is null"))
}

/// Runs `f`, turning errors and panics into a status code plus last-error message.
fn guard(f: impl FnOnce() -> Result<(), Fail>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => HAHEAP_OK,
        Ok(Err(Fail(code, msg))) => {
            set_last_error(&msg);
            code
        }
        Err(_) => {
            set_last_error("internal error: the library panicked");
            HAHEAP_ERR_PANIC
        }
    }
}

/// Reads an optional C string; null gives None.
///
/// # Safety
/// `p` is null or a NUL-terminated string valid for the call.
unsafe fn opt_str<'a>(p: *const c_char, what: &str) -> Result<Option<&'a str>, Fail> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: caller contract: non-null means NUL-terminated and valid.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str()
        .map(Some)
        .map_err(|_| Fail(HAHEAP_ERR_INVALID, format!("{what} is not UTF-8")))
}

/// # Safety
/// `engine` and `backup` are null or NUL-terminated strings.
unsafe fn config(
    size: usize,
    engine: *const c_char,
    backup: *const c_char,
    flags: u32,
) -> Result<HeapConfig, Fail> {
    // SAFETY: forwarded caller contract.
    let engine = match unsafe { opt_str(engine, "engine name")? } {
        None => EngineKind::Auto,
        Some(name) => name
            .parse()
            .map_err(|e: crate::ConfigError| Fail(HAHEAP_ERR_INVALID, e.to_string()))?,
    };
    // SAFETY: forwarded caller contract.
    let backup = unsafe { opt_str(backup, "backup endpoint")? }.map(str::to_string);
    let secs = flags >> HAHEAP_BLOCK_SECS_SHIFT;
    let low = flags & ((1 << HAHEAP_BLOCK_SECS_SHIFT) - 1);
    let known = HAHEAP_FLAG_ASYNC | HAHEAP_FLAG_BLOCK | HAHEAP_FLAG_SPIN | HAHEAP_FLAG_NO_SPIN;
    if low & !known != 0 {
        return Err(Fail(
            HAHEAP_ERR_INVALID,
            format!("unknown flags {flags:#x}"),
        ));
    }
    let spin = match (low & HAHEAP_FLAG_SPIN != 0, low & HAHEAP_FLAG_NO_SPIN != 0) {
        (false, false) => Spin::PRIMARY,
        (true, false) => Spin::Fixed(Duration::from_micros(u64::from(HAHEAP_SPIN_US))),
        (false, true) => Spin::Off,
        (true, true) => {
            return Err(Fail(
                HAHEAP_ERR_INVALID,
                "HAHEAP_FLAG_SPIN and HAHEAP_FLAG_NO_SPIN contradict each other".into(),
            ))
        }
    };
    let on_backup_failure = match (low & HAHEAP_FLAG_BLOCK != 0, secs) {
        (false, 0) => BackupFailure::Fail,
        (false, _) => {
            return Err(Fail(
                HAHEAP_ERR_INVALID,
                format!("flags {flags:#x} give a block timeout without HAHEAP_FLAG_BLOCK"),
            ))
        }
        (true, s) => BackupFailure::Block {
            timeout: Duration::from_secs(u64::from(if s == 0 {
                HAHEAP_BLOCK_DEFAULT_SECS
            } else {
                s
            })),
        },
    };
    let mode = if flags & HAHEAP_FLAG_ASYNC != 0 {
        ReplMode::Async {
            max_lag: ASYNC_MAX_LAG,
        }
    } else {
        ReplMode::Sync
    };
    Ok(HeapConfig {
        size,
        engine,
        backup,
        mode,
        on_backup_failure,
        spin,
    })
}

fn publish(mut heap: Heap, out: *mut *mut HaHeap) {
    let reason = CString::new(heap.engine_reason().replace('\0', " ")).unwrap_or_default();
    let base = heap.as_mut_ptr();
    let boxed = Box::into_raw(Box::new(HaHeap { heap, reason, base }));
    // SAFETY: callers checked `out` for null; the caller promised it is writable.
    unsafe { *out = boxed };
}

/// Creates a heap of `size` bytes (rounded up to whole pages), zero-filled.
///
/// `engine`: "auto", "mprotect", "uffd", "scan" or "log"; null means "auto".
/// `backup`: "tcp:HOST:PORT" or "unix:PATH" of a running backup, or null for a local heap.
/// A TCP backup needs its token: the file named by the REBOUND_HA_TOKEN_FILE environment
/// variable (at least 32 random bytes, owned by this user, mode 0600).
/// `flags`: 0, or any of HAHEAP_FLAG_ASYNC, HAHEAP_FLAG_SPIN or HAHEAP_FLAG_NO_SPIN, and
/// HAHEAP_FLAG_BLOCK (with its timeout in the upper bits).
///
/// # Safety
/// - `engine`: null or a NUL-terminated string, read during the call only.
/// - `backup`: null or a NUL-terminated string, read during the call only.
/// - `out`: must be non-null and writable; receives the heap on success, untouched on failure.
#[no_mangle]
pub unsafe extern "C" fn haheap_create(
    size: usize,
    engine: *const c_char,
    backup: *const c_char,
    flags: u32,
    out: *mut *mut HaHeap,
) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        if size == 0 {
            return Err(Fail(HAHEAP_ERR_INVALID, "size is zero".into()));
        }
        // SAFETY: forwarded caller contract for the strings.
        let cfg = unsafe { config(size, engine, backup, flags)? };
        publish(Heap::create(cfg)?, out);
        Ok(())
    })
}

/// Tracks memory the caller already has: `len` bytes at `base`, both page aligned. Its
/// current contents are the committed state. haheap_destroy gives the memory back
/// read-write and untracked (it does not unmap it). `flags` as for haheap_create.
///
/// # Safety
/// - `base`: page-aligned, readable and writable private anonymous memory of `len` bytes
///   that stays mapped until haheap_destroy, whose protection nobody else changes meanwhile.
/// - `engine`, `backup`: null or NUL-terminated strings, read during the call only.
/// - `out`: must be non-null and writable; receives the heap on success, untouched on failure.
#[no_mangle]
pub unsafe extern "C" fn haheap_declare(
    base: *mut u8,
    len: usize,
    engine: *const c_char,
    backup: *const c_char,
    flags: u32,
    out: *mut *mut HaHeap,
) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        if base.is_null() {
            return Err(null("base"));
        }
        // SAFETY: forwarded caller contract for the strings.
        let cfg = unsafe { config(len, engine, backup, flags)? };
        // SAFETY: forwarded caller contract for the memory.
        publish(unsafe { Heap::declare(base, len, cfg)? }, out);
        Ok(())
    })
}

/// Becomes the new primary after the old one died: attaches to the backup's replica,
/// copies its committed image into a fresh heap and continues replicating to it; the
/// backup's epoch is bumped, which fences the old primary (HAHEAP_ERR_FENCED there).
/// Transaction ids continue from the replica's last one (haheap_committed_tx_id).
/// If the old primary may still be connected, run `rebound-ha promote` first, or this
/// call is refused after 2 s. `flags` as for haheap_create.
///
/// # Safety
/// - `engine`: null or a NUL-terminated string, read during the call only.
/// - `backup`: must be a non-null NUL-terminated string, read during the call only.
/// - `out`: must be non-null and writable; receives the heap on success, untouched on failure.
#[no_mangle]
pub unsafe extern "C" fn haheap_takeover(
    engine: *const c_char,
    backup: *const c_char,
    flags: u32,
    out: *mut *mut HaHeap,
) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        if backup.is_null() {
            return Err(null("backup"));
        }
        // SAFETY: forwarded caller contract for the strings.
        let cfg = unsafe { config(0, engine, backup, flags)? };
        publish(Heap::takeover(cfg)?, out);
        Ok(())
    })
}

/// Borrows the heap behind `h`.
///
/// # Safety
/// `h` is null or a live pointer from haheap_create/haheap_takeover not used concurrently.
unsafe fn heap_mut<'a>(h: *mut HaHeap) -> Result<&'a mut HaHeap, Fail> {
    // SAFETY: caller contract.
    unsafe { h.as_mut() }.ok_or_else(|| null("heap"))
}

/// Reads a property of the heap behind `heap`, or returns `default` for null (or a panic).
///
/// # Safety
/// `heap` is null or a live heap from haheap_create/haheap_declare/haheap_takeover.
unsafe fn property<T>(heap: *const HaHeap, default: T, f: impl FnOnce(&HaHeap) -> T) -> T {
    // SAFETY: caller contract.
    let h = unsafe { heap.as_ref() };
    catch_unwind(AssertUnwindSafe(|| h.map(f)))
        .ok()
        .flatten()
        .unwrap_or(default)
}

/// Base address of the heap's memory, or null if `heap` is null. Stores through it inside a
/// transaction are tracked by the page engines (mprotect, uffd, scan), not by "log".
///
/// # Safety
/// `heap`: null or a live heap from haheap_create/haheap_declare/haheap_takeover.
#[no_mangle]
pub unsafe extern "C" fn haheap_base(heap: *mut HaHeap) -> *mut u8 {
    // SAFETY: caller contract.
    unsafe { property(heap, std::ptr::null_mut(), |h| h.base) }
}

/// Size of the heap in bytes (whole pages), or 0 if `heap` is null.
///
/// # Safety
/// `heap`: null or a live heap from haheap_create/haheap_declare/haheap_takeover.
#[no_mangle]
pub unsafe extern "C" fn haheap_size(heap: *const HaHeap) -> usize {
    // SAFETY: caller contract.
    unsafe { property(heap, 0, |h| h.heap.len()) }
}

/// Id of the last transaction committed in this heap: 0 before the first, or 0 if `heap`
/// is null. A transaction left in doubt (HAHEAP_ERR_IN_DOUBT) counts. After haheap_takeover
/// it is the replica's last transaction, and ids continue from it: the next haheap_tend
/// commits this id + 1.
///
/// # Safety
/// `heap`: null or a live heap from haheap_create/haheap_declare/haheap_takeover.
#[no_mangle]
pub unsafe extern "C" fn haheap_committed_tx_id(heap: *const HaHeap) -> u64 {
    // SAFETY: caller contract.
    unsafe { property(heap, 0, |h| h.heap.committed_tx_id()) }
}

/// Name of the engine in use ("mprotect", "uffd", "scan" or "log"; never "auto"), a static
/// string; null if `heap` is null.
///
/// # Safety
/// `heap`: null or a live heap from haheap_create/haheap_declare/haheap_takeover.
#[no_mangle]
pub unsafe extern "C" fn haheap_engine_name(heap: *const HaHeap) -> *const c_char {
    let name = |h: &HaHeap| -> *const c_char {
        match h.heap.engine() {
            EngineKind::Mprotect => c"mprotect",
            EngineKind::Uffd => c"uffd",
            EngineKind::Scan => c"scan",
            EngineKind::Log => c"log",
            EngineKind::Auto => c"auto",
        }
        .as_ptr()
    };
    // SAFETY: caller contract.
    unsafe { property(heap, std::ptr::null(), name) }
}

/// Why the engine was chosen (for "auto": what was probed), valid until haheap_destroy;
/// null if `heap` is null.
///
/// # Safety
/// `heap`: null or a live heap from haheap_create/haheap_declare/haheap_takeover.
#[no_mangle]
pub unsafe extern "C" fn haheap_engine_reason(heap: *const HaHeap) -> *const c_char {
    // SAFETY: caller contract.
    unsafe { property(heap, std::ptr::null(), |h| h.reason.as_ptr()) }
}

/// Opens a transaction. HAHEAP_ERR_NESTED if one is open.
///
/// # Safety
/// `heap`: null or a live heap, not used by another thread during the call.
#[no_mangle]
pub unsafe extern "C" fn haheap_tstart(heap: *mut HaHeap) -> c_int {
    // SAFETY: caller contract.
    guard(|| Ok(unsafe { heap_mut(heap)? }.heap.tstart()?))
}

/// Copies `len` bytes from `src` to `offset` in the heap inside the open transaction.
/// HAHEAP_ERR_OUT_OF_BOUNDS (nothing written) if `offset + len` exceeds the heap.
///
/// # Safety
/// - `heap`: null or a live heap, not used by another thread during the call.
/// - `src`: readable for `len` bytes; may be null only when `len` is 0.
#[no_mangle]
pub unsafe extern "C" fn haheap_write(
    heap: *mut HaHeap,
    offset: usize,
    src: *const u8,
    len: usize,
) -> c_int {
    guard(|| {
        // SAFETY: caller contract.
        let h = unsafe { heap_mut(heap)? };
        let data: &[u8] = match (src.is_null(), len) {
            (_, 0) => &[],
            (true, _) => return Err(null("src")),
            // SAFETY: caller contract: `src` is readable for `len` bytes.
            (false, _) => unsafe { std::slice::from_raw_parts(src, len) },
        };
        Ok(h.heap.write(offset, data)?)
    })
}

/// Commits the open transaction: finds what it wrote, ships the changed bytes to the backup
/// (if any; waits for its acknowledgement unless HAHEAP_FLAG_ASYNC) and makes them the
/// committed state. On HAHEAP_ERR_REPLICATION the transaction was rolled back. On
/// HAHEAP_ERR_IN_DOUBT it is committed here and queued for the backup: call haheap_tend
/// again until it returns HAHEAP_OK (new transactions are refused meanwhile). With
/// HAHEAP_FLAG_BLOCK a missing backup makes this call wait (up to the flag's timeout)
/// for the backup to come back instead. HAHEAP_ERR_FENCED is final: see its
/// definition; calling again does not help.
///
/// # Safety
/// - `heap`: null or a live heap, not used by another thread during the call.
/// - `out_stats`: null, or writable; receives the statistics on success.
#[no_mangle]
pub unsafe extern "C" fn haheap_tend(heap: *mut HaHeap, out_stats: *mut HaheapTxStats) -> c_int {
    guard(|| {
        // SAFETY: caller contract.
        let s = unsafe { heap_mut(heap)? }.heap.tend()?;
        if !out_stats.is_null() {
            let stats = HaheapTxStats {
                tx_id: s.tx_id,
                pages: s.pages as u64,
                bytes_written_hint: s.bytes_written_hint as u64,
                bytes_shipped: s.bytes_shipped as u64,
            };
            // SAFETY: caller contract: non-null `out_stats` is writable.
            unsafe { out_stats.write(stats) };
        }
        Ok(())
    })
}

/// Drops the open transaction and restores the last committed contents.
///
/// # Safety
/// `heap`: null or a live heap, not used by another thread during the call.
#[no_mangle]
pub unsafe extern "C" fn haheap_abort(heap: *mut HaHeap) -> c_int {
    // SAFETY: caller contract.
    guard(|| Ok(unsafe { heap_mut(heap)? }.heap.abort()?))
}

/// Waits until the backup acknowledged every committed transaction (useful with
/// HAHEAP_FLAG_ASYNC; immediate without a backup).
///
/// # Safety
/// `heap`: null or a live heap, not used by another thread during the call.
#[no_mangle]
pub unsafe extern "C" fn haheap_flush(heap: *mut HaHeap) -> c_int {
    // SAFETY: caller contract.
    guard(|| Ok(unsafe { heap_mut(heap)? }.heap.flush()?))
}

/// Frees the heap: unmaps its memory and stops tracking. Null is accepted and ignored.
///
/// # Safety
/// `heap`: null or a live heap; it must not be used afterwards.
#[no_mangle]
pub unsafe extern "C" fn haheap_destroy(heap: *mut HaHeap) -> c_int {
    guard(|| {
        if !heap.is_null() {
            // SAFETY: caller contract: a live heap from Box::into_raw, given up now.
            drop(unsafe { Box::from_raw(heap) });
        }
        Ok(())
    })
}

/// Message of the last failed call on this thread ("" if none). The string stays valid
/// until the next failing haheap call on the same thread.
#[no_mangle]
pub extern "C" fn haheap_last_error() -> *const c_char {
    catch_unwind(|| {
        LAST_ERROR
            .try_with(|l| l.borrow().as_ptr())
            .unwrap_or(c"".as_ptr())
    })
    .unwrap_or(c"".as_ptr())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message() -> String {
        // SAFETY: haheap_last_error returns a valid NUL-terminated thread-local string.
        unsafe { CStr::from_ptr(haheap_last_error()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn a_panic_becomes_an_error_code_not_an_unwind() {
        // The default hook prints the expected panic into this test's captured output;
        // swapping the process-wide hook would hide other tests' panics meanwhile.
        let rc = guard(|| panic!("boom"));
        assert_eq!(rc, HAHEAP_ERR_PANIC);
        assert!(message().contains("panicked"), "{}", message());
        assert_eq!(
            guard(|| Err(Fail(HAHEAP_ERR_INVALID, "bad".into()))),
            HAHEAP_ERR_INVALID
        );
        assert_eq!(message(), "bad");
        assert_eq!(guard(|| Ok(())), HAHEAP_OK);
        assert_eq!(message(), "bad", "success keeps the last failure's message");
    }
}
