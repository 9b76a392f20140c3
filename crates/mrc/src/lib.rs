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
//! ```
//! use rebound_mrc::alloc::{isolated_sharing, Params, Vm};
//! use rebound_mrc::{lru_sim, ExclusiveTracer, MissRatioCurve};
//!
//! // A guest with 2 pages of direct memory loops over 4 pages; below it the
//! // hypervisor sees its misses and evictions.
//! let trace: Vec<u64> = (0..4).cycle().take(40).collect();
//! let mut tracer = ExclusiveTracer::new();
//! for event in lru_sim::guest_events(&trace, 2) {
//!     tracer.record(event);
//! }
//! let host = MissRatioCurve::from_histogram(&tracer.histogram(), 8)?;
//! let guest = host.shifted(2, Some(trace.len() as u64))?;
//! assert_eq!(guest.miss_ratio(3)?, 1.0); // a loop of 4 misses 3 pages
//! assert_eq!(guest.misses(4)?, 4.0); // 4 pages: only the first touches
//!
//! // Two such guests, 8 pages between them, misses may grow by 10% at most;
//! // the plan stays the default margin (3 points) under that, for the curves' error.
//! let vms = [Vm::new(&guest, 4), Vm::new(&guest, 4)];
//! let params = Params::new(8, 1, 0.1);
//! let got = isolated_sharing(&vms, &params)?;
//! assert_eq!(got.vms[0].size, 4);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
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
//! | Zipf 0.9, 2M accesses over 200k blocks | 3.1–3.5 M/s | 107–124 M/s | 31–47 M/s |
//! | uniform, 4M accesses over 1M blocks | 1.1–1.3 M/s | 102–119 M/s | 70–81 M/s |
//!
//! The last column was measured again on 2026-11-28, after the fixed-size
//! sampler gained its count of distinct blocks (a sketch updated on every
//! access) and per-block access counts: the version before it ran 65–70 and
//! 81–124 M/s in the same session, on a loaded machine
//! (`cargo test --release -p rebound-mrc throughput_report -- --ignored --nocapture`).
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
