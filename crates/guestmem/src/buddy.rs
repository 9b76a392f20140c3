//! Free pages of a Linux guest: the buddy allocator's free blocks, found
//! from `struct page` the way makedumpfile's `-d 16` does, so a dump can
//! leave them out.
//!
//! The `struct page` array is located by [`MemMap`]; the struct page of a
//! free block's first page has `_mapcount == NUMBER(PAGE_BUDDY_MAPCOUNT_VALUE)`
//! and the block's order in `private`. [`crate::classify`] sorts every page
//! the way makedumpfile's dump levels do; this is the free pages alone.
//!
//! All addresses are kernel virtual, read through [`KernelPageTables`].
//! Read a paused guest: the free lists of a running one change under the scan.
//! Pages on per-CPU free lists are not marked buddy and count as used.

use std::ops::Range;

use crate::memmap::{need, MemMap, MemMapError, BATCH};
use crate::memory::GuestMemory;
use crate::pagetable::KernelPageTables;
use crate::source::PageSource;
use crate::vmcoreinfo::VmcoreInfo;

/// Errors finding free pages.
#[derive(Debug, thiserror::Error)]
pub enum BuddyError {
    /// The `struct page` array cannot be located or read.
    #[error(transparent)]
    MemMap(#[from] MemMapError),
}

/// Free memory of a guest.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FreePages {
    /// Guest physical ranges of free buddy blocks, sorted, merged.
    pub ranges: Vec<Range<u64>>,
    /// Total free bytes.
    pub bytes: u64,
}

impl FreePages {
    /// Whether the page holding `gpa` is free.
    pub fn contains(&self, gpa: u64) -> bool {
        let i = self.ranges.partition_point(|r| r.end <= gpa);
        self.ranges.get(i).is_some_and(|r| r.contains(&gpa))
    }

    /// `ranges` (sorted, disjoint; e.g. [`GuestMemory::data_ranges`]) minus
    /// the free pages: what a dump that leaves out free memory must write.
    pub fn exclude_from(&self, ranges: &[Range<u64>]) -> Vec<Range<u64>> {
        let mut out = Vec::new();
        let mut free = self.ranges.iter().peekable();
        for r in ranges {
            let mut start = r.start;
            // Skip free ranges wholly before this one.
            while free.peek().is_some_and(|f| f.end <= start) {
                free.next();
            }
            let mut rest = free.clone();
            while let Some(f) = rest.peek().filter(|f| f.start < r.end) {
                if f.start > start {
                    out.push(start..f.start);
                }
                start = start.max(f.end);
                rest.next();
            }
            if start < r.end {
                out.push(start..r.end);
            }
        }
        out
    }
}

/// The struct page fields the scan uses, from VMCOREINFO.
struct Model {
    map: MemMap,
    mapcount_offset: u64,
    private_offset: u64,
    buddy_value: i32,
}

impl Model {
    fn new(info: &VmcoreInfo) -> Result<Model, MemMapError> {
        let map = MemMap::from_vmcoreinfo(info)?;
        let buddy = need(
            info.number("PAGE_BUDDY_MAPCOUNT_VALUE"),
            "NUMBER(PAGE_BUDDY_MAPCOUNT_VALUE)",
        )?;
        let mapcount_offset = need(info.offset("page", "_mapcount"), "OFFSET(page._mapcount)")?;
        let private_offset = need(info.offset("page", "private"), "OFFSET(page.private)")?;
        map.check_field("OFFSET(page._mapcount)", mapcount_offset + 4)?;
        map.check_field("OFFSET(page.private)", private_offset + 8)?;
        Ok(Model {
            map,
            mapcount_offset,
            private_offset,
            buddy_value: i32::try_from(buddy).map_err(|_| {
                MemMapError::Inconsistent(format!("PAGE_BUDDY_MAPCOUNT_VALUE {buddy}"))
            })?,
        })
    }
}

/// Finds the free buddy blocks in the guest's RAM (the layout's ranges).
pub fn free_pages<S: PageSource>(
    mem: &GuestMemory<S>,
    info: &VmcoreInfo,
    pt: &KernelPageTables,
) -> Result<FreePages, BuddyError> {
    let m = Model::new(info)?;
    let mut out = FreePages::default();
    let page_size = m.map.page_size();
    let mut structs = Vec::new();
    for r in mem.layout().ranges().map(|r| r.gpa_range()) {
        let pfns = r.start / page_size..r.end / page_size;
        m.map
            .for_each_section(mem, pt, pfns, |_, section: Range<u64>, mem_map| {
                let mut pfn = section.start;
                while pfn < section.end {
                    pfn = scan_batch(
                        mem,
                        pt,
                        &m,
                        mem_map,
                        pfn,
                        section.end,
                        &mut structs,
                        &mut out,
                    )?;
                }
                Ok::<(), MemMapError>(())
            })?;
    }
    Ok(out)
}

/// Scans up to [`BATCH`] struct pages from `pfn`; returns where to go on
/// (past the batch, or past a free block that runs beyond it).
#[allow(clippy::too_many_arguments)]
fn scan_batch<S: PageSource>(
    mem: &GuestMemory<S>,
    pt: &KernelPageTables,
    m: &Model,
    mem_map: u64,
    pfn: u64,
    section_end: u64,
    structs: &mut Vec<u8>,
    out: &mut FreePages,
) -> Result<u64, MemMapError> {
    let n = BATCH.min(section_end - pfn);
    m.map
        .read_structs(mem, pt, mem_map, pfn..pfn + n, structs)?;
    let size = m.map.struct_size() as usize;
    let mut i = 0;
    while i < n {
        let s = &structs[i as usize * size..][..size];
        let at = m.mapcount_offset as usize;
        let mapcount = i32::from_le_bytes(s[at..at + 4].try_into().expect("4 bytes"));
        if mapcount != m.buddy_value {
            i += 1;
            continue;
        }
        let at = m.private_offset as usize;
        let order = u64::from_le_bytes(s[at..at + 8].try_into().expect("8 bytes"));
        // A corrupt order (the kernel's MAX_ORDER is 10 or 11) counts one page.
        let pages = if order < 20 { 1u64 << order } else { 1 };
        let pages = pages.min(section_end - (pfn + i));
        let start = (pfn + i) * m.map.page_size();
        let stop = start + pages * m.map.page_size();
        match out.ranges.last_mut() {
            Some(last) if last.end == start => last.end = stop,
            _ => out.ranges.push(start..stop),
        }
        out.bytes += stop - start;
        i += pages;
    }
    Ok(pfn + i)
}

#[cfg(test)]
mod tests;
