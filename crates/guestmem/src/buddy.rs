//! Free pages of a Linux guest: the buddy allocator's free blocks, found
//! from `struct page` the way makedumpfile's `-d 16` does, so a dump can
//! leave them out.
//!
//! Path (x86-64, `CONFIG_SPARSEMEM`, 6.1-era page types):
//! 1. `SYMBOL(mem_section)` is the section root array. With
//!    `SPARSEMEM_EXTREME` each of the `LENGTH(mem_section)` roots points to a
//!    page of `PAGESIZE / SIZE(mem_section)` sections; without it the
//!    sections are inline (one per root). Which one is decided by which fits
//!    `2^(MAX_PHYSMEM_BITS - SECTION_SIZE_BITS)` sections.
//! 2. A section's `section_mem_map` holds `mem_map - first_pfn` with flag
//!    bits below bit 8 (bit 0 present, bit 1 has a mem_map).
//! 3. The `struct page` (`SIZE(page)` bytes) of a free block's first page
//!    has `_mapcount == NUMBER(PAGE_BUDDY_MAPCOUNT_VALUE)` and the block's
//!    order in `private`.
//!
//! All addresses are kernel virtual, read through [`KernelPageTables`].
//! Read a paused guest: the free lists of a running one change under the scan.
//! Pages on per-CPU free lists are not marked buddy and count as used.

use std::ops::Range;

use crate::memory::GuestMemory;
use crate::pagetable::{KernelPageTables, PageTableError};
use crate::source::PageSource;
use crate::vmcoreinfo::VmcoreInfo;

/// Errors finding free pages.
#[derive(Debug, thiserror::Error)]
pub enum BuddyError {
    /// VMCOREINFO lacks a value the scan needs.
    #[error("VMCOREINFO has no {0}")]
    Missing(&'static str),
    /// VMCOREINFO values that cannot describe a sparse memory model.
    #[error("VMCOREINFO sparse memory values are inconsistent ({0})")]
    Inconsistent(String),
    /// Reading kernel memory failed.
    #[error("cannot read kernel memory")]
    Read(#[from] PageTableError),
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

/// The kernel constants the scan uses, from VMCOREINFO.
struct Model {
    page_size: u64,
    roots: u64,
    sections_per_root: u64,
    /// `true` when roots are pointers to section pages (SPARSEMEM_EXTREME).
    extreme: bool,
    mem_section_size: u64,
    mem_map_offset: u64,
    pfn_section_shift: u32,
    page_struct: u64,
    mapcount_offset: u64,
    private_offset: u64,
    buddy_value: i32,
    mem_section: u64,
}

fn need<T>(v: Option<T>, what: &'static str) -> Result<T, BuddyError> {
    v.ok_or(BuddyError::Missing(what))
}

impl Model {
    fn new(info: &VmcoreInfo) -> Result<Model, BuddyError> {
        let bad = |m: String| BuddyError::Inconsistent(m);
        let page_size = info.page_size;
        let section_bits = need(
            info.number("SECTION_SIZE_BITS"),
            "NUMBER(SECTION_SIZE_BITS)",
        )?;
        let phys_bits = need(info.number("MAX_PHYSMEM_BITS"), "NUMBER(MAX_PHYSMEM_BITS)")?;
        let roots = need(info.length("mem_section"), "LENGTH(mem_section)")?;
        let mem_section_size = need(info.size("mem_section"), "SIZE(mem_section)")?;
        let page_shift = page_size.trailing_zeros() as i64;
        if !(page_shift..=phys_bits).contains(&section_bits) || phys_bits > 64 {
            return Err(bad(format!(
                "SECTION_SIZE_BITS {section_bits}, MAX_PHYSMEM_BITS {phys_bits}"
            )));
        }
        if mem_section_size == 0 || mem_section_size > page_size {
            return Err(bad(format!("SIZE(mem_section) {mem_section_size}")));
        }
        let sections = 1u64 << (phys_bits - section_bits);
        let per_page = page_size / mem_section_size;
        let (extreme, sections_per_root) = if roots.checked_mul(per_page) == Some(sections) {
            (true, per_page)
        } else if roots == sections {
            (false, 1)
        } else {
            return Err(bad(format!(
                "LENGTH(mem_section) {roots} fits neither {sections} sections per root page nor inline"
            )));
        };
        let buddy = need(
            info.number("PAGE_BUDDY_MAPCOUNT_VALUE"),
            "NUMBER(PAGE_BUDDY_MAPCOUNT_VALUE)",
        )?;
        let page_struct = need(info.size("page"), "SIZE(page)")?;
        let mapcount_offset = need(info.offset("page", "_mapcount"), "OFFSET(page._mapcount)")?;
        let private_offset = need(info.offset("page", "private"), "OFFSET(page.private)")?;
        // struct page is 64 bytes on x86-64; anything near a page is corrupt.
        if page_struct < mapcount_offset + 4
            || page_struct < private_offset + 8
            || page_struct > 1024
        {
            return Err(bad(format!("SIZE(page) {page_struct}")));
        }
        Ok(Model {
            page_size,
            roots,
            sections_per_root,
            extreme,
            mem_section_size,
            mem_map_offset: need(
                info.offset("mem_section", "section_mem_map"),
                "OFFSET(mem_section.section_mem_map)",
            )?,
            pfn_section_shift: (section_bits - page_shift) as u32,
            page_struct,
            mapcount_offset,
            private_offset,
            buddy_value: i32::try_from(buddy)
                .map_err(|_| bad(format!("PAGE_BUDDY_MAPCOUNT_VALUE {buddy}")))?,
            mem_section: need(info.symbol("mem_section"), "SYMBOL(mem_section)")?,
        })
    }

    /// The decoded `mem_map` base of section `nr` (struct page of pfn 0
    /// as if the section's array extended down to it), if it has one.
    fn section_mem_map<S: PageSource>(
        &self,
        mem: &GuestMemory<S>,
        pt: &KernelPageTables,
        nr: u64,
    ) -> Result<Option<u64>, BuddyError> {
        let root = nr / self.sections_per_root;
        if root >= self.roots {
            return Ok(None);
        }
        let base = if self.extreme {
            let mut b = [0u8; 8];
            pt.read(mem, self.mem_section + root * 8, &mut b)?;
            match u64::from_le_bytes(b) {
                0 => return Ok(None),
                p => p,
            }
        } else {
            self.mem_section + root * self.mem_section_size
        };
        let at = base + (nr % self.sections_per_root) * self.mem_section_size + self.mem_map_offset;
        let mut b = [0u8; 8];
        pt.read(mem, at, &mut b)?;
        let coded = u64::from_le_bytes(b);
        // SECTION_MARKED_PRESENT | SECTION_HAS_MEM_MAP
        if coded & 3 != 3 {
            return Ok(None);
        }
        Ok(Some(coded & !0xff))
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
    let section_pages = 1u64 << m.pfn_section_shift;
    let ranges: Vec<Range<u64>> = mem.layout().ranges().map(|r| r.gpa_range()).collect();
    let mut structs = Vec::new();
    for r in ranges {
        let (first, end) = (r.start / m.page_size, r.end / m.page_size);
        let mut pfn = first;
        while pfn < end {
            let nr = pfn >> m.pfn_section_shift;
            let section_end = ((nr + 1) * section_pages).min(end);
            let Some(mem_map) = m.section_mem_map(mem, pt, nr)? else {
                pfn = section_end;
                continue;
            };
            let mut at_pfn = pfn;
            while at_pfn < section_end {
                at_pfn = scan_batch(
                    mem,
                    pt,
                    &m,
                    mem_map,
                    at_pfn,
                    section_end,
                    &mut structs,
                    &mut out,
                )?;
            }
            pfn = section_end;
        }
    }
    Ok(out)
}

/// Struct pages read at once (512 KiB with 64-byte pages).
const BATCH: u64 = 8192;

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
) -> Result<u64, BuddyError> {
    let n = BATCH.min(section_end - pfn);
    structs.resize((n * m.page_struct) as usize, 0);
    pt.read(mem, mem_map.wrapping_add(pfn * m.page_struct), structs)?;
    let mut i = 0;
    while i < n {
        let s = &structs[(i * m.page_struct) as usize..][..m.page_struct as usize];
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
        let start = (pfn + i) * m.page_size;
        let stop = start + pages * m.page_size;
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
