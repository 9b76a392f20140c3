//! The guest kernel's `struct page` array under the sparse memory model,
//! located from VMCOREINFO the way makedumpfile's `get_mm_sparsemem` does.
//!
//! Path (x86-64, `CONFIG_SPARSEMEM`):
//! 1. `SYMBOL(mem_section)` is the section root array. With
//!    `SPARSEMEM_EXTREME` each of the `LENGTH(mem_section)` roots points to a
//!    page of `PAGESIZE / SIZE(mem_section)` sections; without it the
//!    sections are inline (one per root). Which one is decided by which fits
//!    `2^(MAX_PHYSMEM_BITS - SECTION_SIZE_BITS)` sections.
//! 2. A section's `section_mem_map` holds `mem_map - first_pfn` (in struct
//!    pages) with flag bits below `SECTION_MAP_LAST_BIT` (bit 5 since Linux
//!    4.13): bit 0 present, bit 1 has a mem_map. A decoded `mem_map` that is
//!    not a kernel address means the sections are corrupt: the walk fails.
//! 3. The struct page of pfn `p` is at `mem_map + p * SIZE(page)`.
//!
//! All addresses are kernel virtual, read through [`KernelPageTables`].
//! Everything the walk allocates is sized by the host's idea of guest RAM or
//! by fixed caps, never by a value read from the guest.

use std::ops::Range;

use crate::memory::GuestMemory;
use crate::pagetable::{KernelPageTables, PageTableError};
use crate::source::PageSource;
use crate::vmcoreinfo::VmcoreInfo;

/// Errors locating the `struct page` array.
#[derive(Debug, thiserror::Error)]
pub enum MemMapError {
    /// VMCOREINFO lacks a value the walk needs.
    #[error("VMCOREINFO has no {0}")]
    Missing(&'static str),
    /// VMCOREINFO values that cannot describe a sparse memory model.
    #[error("VMCOREINFO sparse memory values are inconsistent ({0})")]
    Inconsistent(String),
    /// A section decodes to a `mem_map` outside kernel space.
    #[error("memory section {section} decodes to mem_map {mem_map:#x}, not a kernel address")]
    BadMemMap { section: u64, mem_map: u64 },
    /// Reading kernel memory failed.
    #[error("cannot read kernel memory")]
    Read(#[from] PageTableError),
}

/// `SECTION_MAP_LAST_BIT`: the flag bits of `section_mem_map` lie below it.
const SECTION_MAP_LAST_BIT: u64 = 1 << 5;
const SECTION_MARKED_PRESENT: u64 = 1;
const SECTION_HAS_MEM_MAP: u64 = 2;
/// Struct pages read at once (512 KiB with 64-byte pages).
pub(crate) const BATCH: u64 = 8192;
/// Lowest x86-64 kernel address (5-level paging's half; 4-level starts higher).
const KERNEL_SPACE: u64 = 0xff00_0000_0000_0000;

/// Returns VMCOREINFO's value or names the missing key.
pub(crate) fn need<T>(v: Option<T>, what: &'static str) -> Result<T, MemMapError> {
    v.ok_or(MemMapError::Missing(what))
}

/// Where the guest kernel keeps its `struct page`s.
#[derive(Debug, Clone)]
pub struct MemMap {
    page_size: u64,
    roots: u64,
    sections_per_root: u64,
    /// `true` when roots are pointers to section pages (SPARSEMEM_EXTREME).
    extreme: bool,
    mem_section_size: u64,
    mem_map_offset: u64,
    pfn_section_shift: u32,
    page_struct: u64,
    mem_section: u64,
}

impl MemMap {
    /// From `SYMBOL(mem_section)`, `LENGTH(mem_section)`, `SIZE(mem_section)`,
    /// `OFFSET(mem_section.section_mem_map)`, `NUMBER(SECTION_SIZE_BITS)`,
    /// `NUMBER(MAX_PHYSMEM_BITS)` and `SIZE(page)`.
    pub fn from_vmcoreinfo(info: &VmcoreInfo) -> Result<MemMap, MemMapError> {
        let bad = |m: String| MemMapError::Inconsistent(m);
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
        let page_struct = need(info.size("page"), "SIZE(page)")?;
        // struct page is 64 bytes on x86-64; anything near a page is corrupt.
        if !(8..=1024).contains(&page_struct) {
            return Err(bad(format!("SIZE(page) {page_struct}")));
        }
        let mem_map_offset = need(
            info.offset("mem_section", "section_mem_map"),
            "OFFSET(mem_section.section_mem_map)",
        )?;
        if mem_map_offset + 8 > mem_section_size {
            return Err(bad(format!(
                "OFFSET(mem_section.section_mem_map) {mem_map_offset}"
            )));
        }
        Ok(MemMap {
            page_size,
            roots,
            sections_per_root,
            extreme,
            mem_section_size,
            mem_map_offset,
            pfn_section_shift: (section_bits - page_shift) as u32,
            page_struct,
            mem_section: need(info.symbol("mem_section"), "SYMBOL(mem_section)")?,
        })
    }

    /// `SIZE(page)`.
    pub fn struct_size(&self) -> u64 {
        self.page_struct
    }

    /// `PAGESIZE`.
    pub fn page_size(&self) -> u64 {
        self.page_size
    }

    /// Checks that `end` (a byte offset into a struct page) fits in one.
    pub(crate) fn check_field(&self, name: &str, end: u64) -> Result<(), MemMapError> {
        if end > self.page_struct {
            return Err(MemMapError::Inconsistent(format!(
                "{name} ends at byte {end}, past SIZE(page) {}",
                self.page_struct
            )));
        }
        Ok(())
    }

    /// The decoded `mem_map` of section `nr` (the struct page of pfn 0 as if
    /// the section's array extended down to it), if the section has one.
    fn section_mem_map<S: PageSource>(
        &self,
        mem: &GuestMemory<S>,
        pt: &KernelPageTables,
        nr: u64,
    ) -> Result<Option<u64>, MemMapError> {
        let root = nr / self.sections_per_root;
        if root >= self.roots {
            return Ok(None);
        }
        let base = if self.extreme {
            let mut b = [0u8; 8];
            pt.read(mem, self.mem_section.wrapping_add(root * 8), &mut b)?;
            match u64::from_le_bytes(b) {
                0 => return Ok(None),
                p => p,
            }
        } else {
            self.mem_section.wrapping_add(root * self.mem_section_size)
        };
        let at = base
            .wrapping_add((nr % self.sections_per_root) * self.mem_section_size)
            .wrapping_add(self.mem_map_offset);
        let mut b = [0u8; 8];
        pt.read(mem, at, &mut b)?;
        let coded = u64::from_le_bytes(b);
        let flags = SECTION_MARKED_PRESENT | SECTION_HAS_MEM_MAP;
        if coded & flags != flags {
            return Ok(None);
        }
        let first_pfn = nr << self.pfn_section_shift;
        let mem_map = coded & !(SECTION_MAP_LAST_BIT - 1);
        // The section's own first struct page must be a kernel address.
        let first = mem_map.wrapping_add(first_pfn.wrapping_mul(self.page_struct));
        if first < KERNEL_SPACE {
            return Err(MemMapError::BadMemMap {
                section: nr,
                mem_map: first,
            });
        }
        Ok(Some(mem_map))
    }

    /// Calls `f(section, pfns, mem_map)` for each piece of `pfns` that lies in one
    /// section with a `mem_map`, in increasing order. Sections without one
    /// are skipped: their pages have no struct page to read.
    pub(crate) fn for_each_section<S, E>(
        &self,
        mem: &GuestMemory<S>,
        pt: &KernelPageTables,
        pfns: Range<u64>,
        mut f: impl FnMut(u64, Range<u64>, u64) -> Result<(), E>,
    ) -> Result<(), E>
    where
        S: PageSource,
        E: From<MemMapError>,
    {
        let section_pages = 1u64 << self.pfn_section_shift;
        let mut pfn = pfns.start;
        while pfn < pfns.end {
            let nr = pfn >> self.pfn_section_shift;
            let section_end = (nr + 1).saturating_mul(section_pages).min(pfns.end);
            if let Some(mem_map) = self.section_mem_map(mem, pt, nr)? {
                f(nr, pfn..section_end, mem_map)?;
            }
            pfn = section_end;
        }
        Ok(())
    }

    /// Reads the struct pages of `pfns` (at most [`BATCH`] + 1) into `buf`.
    pub(crate) fn read_structs<S: PageSource>(
        &self,
        mem: &GuestMemory<S>,
        pt: &KernelPageTables,
        mem_map: u64,
        pfns: Range<u64>,
        buf: &mut Vec<u8>,
    ) -> Result<(), MemMapError> {
        let n = pfns.end - pfns.start;
        debug_assert!(n <= BATCH + 1);
        buf.resize((n * self.page_struct) as usize, 0);
        let at = mem_map.wrapping_add(pfns.start.wrapping_mul(self.page_struct));
        pt.read(mem, at, buf)?;
        Ok(())
    }
}
