//! Guest memory access for Rebound: read a QEMU guest's RAM by guest
//! physical address, without disturbing the guest or its host memory, and
//! read the guest kernel's VMCOREINFO from it.
//!
//! Layers, bottom up:
//! - [`source`]: a RAM block addressed by offset ([`PageSource`]): the shared
//!   RAM file ([`FileSource`], `pread` + `SEEK_DATA`, never mmap) or the QEMU
//!   process's memory ([`ProcMemSource`], `/proc/<pid>/mem`, located with the
//!   [`maps`] parser).
//! - [`layout`]: where the RAM block sits in guest physical address space on
//!   the `pc` and `q35` machines (RAM below the PCI hole, RAM above 4 GiB).
//! - [`memory`]: [`GuestMemory`], reads by GPA across the hole (and from
//!   virtio-mem/DIMM device memory blocks) and lists the data ranges.
//! - [`vmcoreinfo`]: the kernel's VMCOREINFO note, read at a known address or
//!   found by scanning; its note and text formats are described there.
//! - [`pagetable`]: x86-64 kernel virtual → guest physical translation,
//!   starting from VMCOREINFO's `init_top_pgt` and `phys_base`.
//! - [`memmap`]: where the guest kernel's `struct page` array is (sparse
//!   memory sections).
//! - [`buddy`]: the guest kernel's free pages (buddy blocks), read from its
//!   `struct page`s, so dumps can leave them out.
//! - [`evict_ring`]: the guest's eviction-notice ring (`guest/evict`), read
//!   by guest physical address for the exclusive host cache.
//! - [`classify`]: every page frame sorted as makedumpfile's dump levels
//!   sort them (zero, cache, private cache, user, free, kernel), and the
//!   pages a dump at a given level leaves out.

#![allow(clippy::single_range_in_vec_init)] // ranges of offsets, not one-element vectors

pub mod buddy;
pub mod classify;
pub mod evict_ring;
pub mod layout;
pub mod maps;
pub mod memmap;
pub mod memory;
pub mod pagetable;
pub mod procmem;
pub mod source;
#[cfg(test)]
mod testutil;
pub mod vmcoreinfo;

pub use buddy::{free_pages, BuddyError, FreePages};
pub use classify::{
    classify, ClassCounts, Classification, ClassifyError, DumpLevel, Excluded, ExcludedCounts,
    PageClass,
};
pub use layout::{Layout, LayoutError, PcOptions, RamRange};
pub use maps::MapTarget;
pub use memmap::{MemMap, MemMapError};
pub use memory::{GuestMemory, MemoryError};
pub use pagetable::{KernelPageTables, PageTableError, Translation};
pub use procmem::ProcMemSource;
pub use source::{FileSource, PageSource, SourceError};
pub use vmcoreinfo::{
    find_vmcoreinfo, find_vmcoreinfo_all, read_vmcoreinfo, Found, VmcoreInfo, VmcoreinfoError,
};
