//! Rebound's block backend: a vhost-user-blk device for raw disk images, in its own
//! process per disk, so that Rebound sees every block request of the guest.
//!
//! - [`config`]: the virtio-blk configuration space and features offered;
//! - [`request`]: one request, from descriptor chain to status byte, checked;
//! - [`cache`]: the host cache, which admits only blocks provably equal to the disk,
//!   and the access log the miss-ratio curves are computed from;
//! - [`curve`]: the guest's miss-ratio curve, traced from the misses and evictions an
//!   exclusive cache sees;
//! - [`exclusive`]: which guest page holds which block (P2S, S2P) and the checks an
//!   eviction notice passes before the evicted page enters the cache;
//! - [`ring`]: the guest's eviction-notice ring, drained before every request;
//! - [`faults`]: test builds only, correctness checks that can be turned off;
//! - [`disk`]: the raw backing file (`O_DIRECT` where possible);
//! - [`args`]: the `blk serve` command line;
//! - [`timing`]: where a request's time goes, by phase, always on;
//! - [`units`]: the block (one guest page) everything above counts in;
//! - [`guest_memory`]: guest memory as the vhost-user connection maps it;
//! - [`backend`] and [`serve`]: the vhost-user device on the rust-vmm crates, one
//!   thread per queue, serving QEMU again each time it reconnects.

pub mod args;
pub mod backend;
pub mod cache;
pub mod config;
pub mod curve;
pub mod disk;
pub mod exclusive;
pub mod faults;
pub mod guest_memory;
pub mod request;
pub mod ring;
pub mod serve;
pub mod timing;
pub mod units;

pub use cache::{Cache, CacheStats};
pub use serve::{serve, Options, ServeError, Stats};
