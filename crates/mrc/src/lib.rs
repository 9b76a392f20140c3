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
//!
//! # Throughput
//!
//! Measured 2026-11-27 on this project's 2-core development machine, a
//! `--release` build run under `nice -n 19` while other work shared the
//! machine, so these are rough lower figures (accesses per second, one
//! thread, best and worst of three runs):
//!
//! | stream | exact ([`stack`]) | SHARDS rate 0.01 | SHARDS 8K blocks |
//! | --- | --- | --- | --- |
//! | Zipf 0.9, 2M accesses over 200k blocks | 3.1–3.5 M/s | 107–124 M/s | 36–48 M/s |
//! | uniform, 4M accesses over 1M blocks | 1.1–1.3 M/s | 102–119 M/s | 75–84 M/s |
//!
//! The exact profiler slows as the distinct blocks outgrow the processor's
//! caches (its hash map and tree are touched at random); SHARDS spends
//! most of its time hashing, as it skips 96–99% of the accesses.

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
