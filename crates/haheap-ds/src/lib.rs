//! The data-structure suite of the hypervisor-assisted checkpointing talk (Weiss, "Data
//! Structures and Algorithm Analysis in C"), kept entirely inside a byte region.
//!
//! Every byte of state — header, root pointers, node allocator and free list, nodes,
//! tables — lives in the region and is reached only through [`TxMem`], so that the
//! `log` engine of haheap sees every write and a replica taken over after the primary
//! died can be opened and checked with [`Structure::check`].
//!
//! Layout (all words little-endian u64): a 256-byte header at offset 0 (see
//! [`region`]), an optional table (hash cells, heap or queue array, binomial forest),
//! then fixed-size node records numbered from 1 (0 is the nil pointer).
//!
//! The algorithms follow Weiss's C code, including its habit of re-storing child
//! pointers on the way back up a recursion, so that write counts are comparable with
//! the talk's table. Where the book has no deletion (AVL, red-black, skip list, hash
//! tables) the standard algorithm in the same style is used and named in its module.
//! Operations trust a region that `check()` accepts; `check()` itself never trusts it.

pub mod ds;
mod error;
pub mod mem;
pub mod region;
mod rng;
pub mod stats;

pub use ds::{all, by_name, Ds};
pub use error::DsError;
pub use mem::{CountingMem, OpCount, VecMem};
pub use rng::SplitMix64;

/// Byte access to the region a structure lives in. Out-of-range accesses are caller
/// bugs and panic; `check()` validates every offset before it reads.
pub trait TxMem {
    /// Length of the region in bytes.
    fn len(&self) -> usize;
    /// Whether the region is empty (never true for a usable region).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Copies `buf.len()` bytes at `off` into `buf`.
    fn read(&self, off: usize, buf: &mut [u8]);
    /// Stores `data` at `off`; every structure store goes through here.
    fn write(&mut self, off: usize, data: &[u8]);
    /// Reads a little-endian u64.
    fn read_u64(&self, off: usize) -> u64 {
        let mut b = [0u8; 8];
        self.read(off, &mut b);
        u64::from_le_bytes(b)
    }
    /// Writes a little-endian u64.
    fn write_u64(&mut self, off: usize, v: u64) {
        self.write(off, &v.to_le_bytes())
    }
}

/// How a structure's `insert`/`delete` behave, so a test or replay can model it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A set: insert of a present key returns false, delete removes the given key.
    Set,
    /// A min-priority queue (multiset): delete removes and returns the minimum.
    MinHeap,
    /// A FIFO queue: delete dequeues the oldest key.
    Fifo,
}

/// Keys equal to this value are rejected by every structure (the skip list's sentinel).
pub const RESERVED_KEY: u64 = u64::MAX;

/// One data structure of the suite.
pub trait Structure {
    /// Short name as in the talk ("aa", "avl", "bin", ...).
    fn name() -> &'static str;
    /// Behaviour of insert/delete.
    fn kind() -> Kind;
    /// Formats an empty structure over the whole region.
    fn init(m: &mut dyn TxMem) -> Result<(), DsError>;
    /// Inserts `key`; `Ok(false)` when a set already holds it.
    fn insert(m: &mut dyn TxMem, key: u64) -> Result<bool, DsError>;
    /// Deletes `key` (sets) or the minimum / oldest key (heaps, queue, `key` ignored);
    /// returns the removed key, `None` when nothing was removed.
    fn delete(m: &mut dyn TxMem, key: u64) -> Result<Option<u64>, DsError>;
    /// Verifies every invariant and the allocator (each node reachable once, free list
    /// disjoint, nothing leaked); returns the stored keys in ascending order.
    fn check(m: &dyn TxMem) -> Result<Vec<u64>, DsError>;
}
