//! The unit the host cache, the page map and the miss-ratio curves count in: a 4 KiB
//! block of the disk, which is exactly one guest page when the guest caches it. A leaf:
//! the cache, the curves and the page map all use it, and it uses none of them.

/// Bytes of a cache block.
pub const BLOCK: u64 = 4096;

/// Bytes of a guest page, the unit of eviction notices.
pub const PAGE: u64 = 4096;
const _: () = assert!(PAGE == BLOCK, "a guest page holds exactly one cache block");
