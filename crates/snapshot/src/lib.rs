//! Snapshot directories of QEMU guests, as `docs/snapshot-format.md` describes them:
//!
//! - [`catalog`]: the snapshots a daemon wrote, which a cluster peer may restore;
//! - [`check`]: checking a RAM image's chunks while a restore runs from it, and how
//!   far to trust a snapshot's files;
//! - [`manifest`]: the versioned manifest, a directory that is complete or absent
//!   ([`SnapshotDir`]), opening and checking one ([`Snapshot`]);
//! - [`image`]: the RAM image, copied sparse, fast and durable, with per-chunk
//!   checksums;
//! - [`pagesums`]: a checksum per page of a RAM image, what a page server checks;
//! - [`trace`]: the working-set trace (first-access-first-load order), recorded from
//!   QEMU's page table, and the paper's working-set estimate and hit rate;
//! - [`load`]: reading an image's pages into the page cache in the order a restore
//!   mode wants, before and after the guest starts;
//! - [`restore_plan`]: what one restore does (mode fallbacks, working set, loader
//!   order, RAM check, settle) and its report phase by phase, without I/O.

pub mod catalog;
pub mod check;
pub mod image;
pub mod load;
pub mod manifest;
pub mod pagesums;
pub mod restore_plan;
pub mod trace;

pub use catalog::{Base, Catalog, CatalogError, Listing};
pub use check::{CheckError, ChunkChecker, Decision, RamCheck, Trust};
pub use image::{
    cached_bytes, copy_file, copy_ram_image, copy_ram_image_with_pages, drop_page_cache, hash_file,
    FileHash, ImageError,
};
pub use load::{ImageFile, LoadError, LoadStats, Loader, RestOrder};
pub use manifest::{
    DiskEntry, FileEntry, Manifest, ManifestError, PmemEntry, RamBlock, Snapshot, SnapshotDir,
    TraceInfo, VerifyReport, FORMAT_VERSION, MANIFEST_FORMAT,
};
pub use trace::{
    elastic_pages, estimate_wss, hit_rate_accuracy, unmap_for_trace, PagemapTracer, Trace,
    TraceError, TracePage,
};

/// Guest pages are 4 KiB on every machine Rebound runs.
pub const PAGE_SIZE: u64 = 4096;

/// Opens a snapshot's file for reading without following a symbolic link in its
/// last component (the directory itself is the user's to name).
pub fn open_nofollow(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}
