//! Highly available application heap (issue 3).
//!
//! An application keeps its important state in a [`Heap`], wraps each logical update in
//! [`Heap::tstart`] / [`Heap::tend`], and the heap finds what the update wrote, ships the
//! changed bytes to a backup and keeps a shadow of the last committed state for
//! [`Heap::abort`]. How writes are found is the engine's job ([`EngineKind`]): `mprotect`
//! (SIGSEGV on read-only pages), `uffd` (userfaultfd synchronous write-protect), `scan`
//! (userfaultfd async write-protect + `PAGEMAP_SCAN`) or `log` (explicit [`Heap::write`]).
//!
//! ```
//! use haheap::{EngineKind, Heap, HeapConfig};
//!
//! let mut heap = Heap::create(HeapConfig::local(1 << 20, EngineKind::Auto))?;
//! heap.tstart()?;
//! heap.write(4090, b"crosses a page boundary")?;
//! let stats = heap.tend()?;
//! assert_eq!((stats.tx_id, stats.pages), (1, 2));
//! assert_eq!(heap.dirty_pages_of_last_tx(), &[0, 1]);
//!
//! heap.tstart()?;
//! heap.write(0, b"never mind")?;
//! heap.abort()?;
//! assert_eq!(&heap.as_slice()[..10], &[0u8; 10]);
//! # Ok::<(), haheap::Error>(())
//! ```
//!
//! Rules of use:
//! - Transactions are single-writer: one thread stores into a heap at a time.
//! - Page engines track every store into the region, also direct ones through
//!   [`Heap::as_mut_ptr`]; a store made outside a transaction is reported (and shipped, or
//!   undone by an abort) with the next one. The `log` engine sees only [`Heap::write`].
//! - With `mprotect` the region is read-only between faults: a system call that writes
//!   into it (`read(2)` into the heap) fails with EFAULT instead of faulting. The engine
//!   installs a process-wide SIGSEGV handler that passes foreign faults on to the handler
//!   installed before it (or the default action); a handler installed later must chain too.
//!
//! A C ABI lives in [`ffi`]; its header is `include/haheap.h`.

mod config;
mod engine;
pub mod ffi;
mod heap;
mod region;
mod repl;
mod sys;

pub use config::{
    BackupFailure, ConfigError, EngineKind, HeapConfig, HeapCounters, ReplMode, Spin, TxStats,
};
pub use engine::{capabilities, Capabilities, EngineError};
pub use heap::{Error, Heap};
pub use region::RegionError;
pub use repl::{DiffRun, ReplError};
pub use sys::SysError;
