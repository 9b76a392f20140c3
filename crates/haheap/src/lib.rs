//! Highly available application heap (issue 3).
//!
//! An application keeps its important state in a [`Heap`], wraps each logical update in
//! [`Heap::tstart`] / [`Heap::tend`], and the heap finds what the update wrote, ships the
//! changed bytes to a backup and keeps a shadow of the last committed state for
//! [`Heap::abort`]. How writes are found is the engine's job ([`EngineKind`]): `mprotect`
//! (SIGSEGV on read-only pages), `uffd` (userfaultfd synchronous write-protect), `scan`
//! (userfaultfd async write-protect + `PAGEMAP_SCAN`) or `log` (explicit [`Heap::write`]).
//!
//! Transactions are single-writer: one thread stores into a heap at a time.
//! A C ABI lives in [`ffi`]; its header is `include/haheap.h`.

mod config;
mod engine;
pub mod ffi;
mod heap;
mod region;
mod repl;
mod sys;

pub use config::{ConfigError, EngineKind, HeapConfig, HeapCounters, ReplMode, TxStats};
pub use engine::{capabilities, Capabilities, EngineError};
pub use heap::{Error, Heap};
pub use region::RegionError;
pub use repl::{DiffRun, ReplError};
pub use sys::SysError;
