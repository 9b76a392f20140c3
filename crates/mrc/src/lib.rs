//! Miss-ratio curves and memory allocation between VMs, after Lu and Shen,
//! "Virtual Machine Memory Access Tracing With Hypervisor Exclusive Cache"
//! (USENIX ATC '07).
//!
//! The crate holds the algorithms only; it traces nothing itself.
//!
//! - [`stack`]: exact LRU stack distances (Mattson), O(log n) per access.
//! - [`shards`]: SHARDS sampled stack distances (Waldspurger et al., FAST '15).
//! - [`histogram`]: the stack-distance histogram both produce.
//! - [`curve`]: the miss-ratio curve of a histogram, and [`curve::offset`],
//!   which turns what the hypervisor traces below a guest's direct memory
//!   into the guest's curve (paper sections 3.4, 4.1).
//! - [`lru_sim`]: a plain LRU simulator to check curves against.
//! - [`alloc`]: memory allocation between VMs from their curves (section 4.2).

pub mod alloc;
pub mod curve;
mod hash;
pub mod histogram;
pub mod lru_sim;
pub mod shards;
pub mod stack;

#[cfg(test)]
mod testutil;

pub use curve::offset::{ExclusiveTracer, GuestEvent};
pub use curve::MissRatioCurve;
pub use histogram::{Histogram, Profiler};
