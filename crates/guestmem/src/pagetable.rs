//! x86-64 Linux kernel virtual → guest physical translation.
//!
//! The kernel's own page tables start at `init_top_pgt` (VMCOREINFO
//! `SYMBOL(init_top_pgt)`), a kernel-image symbol: its physical address is
//! `vaddr - __START_KERNEL_map + phys_base` (`__phys_addr_symbol` in
//! `arch/x86/include/asm/page_64.h`). From there a 4-level walk (5-level when
//! `NUMBER(pgtable_l5_enabled)=1`) maps any kernel address: the direct map,
//! vmemmap, vmalloc. Entries: bit 0 present, bit 7 page size (1 GiB at level 3,
//! 2 MiB at level 2), bits 12..51 the frame; the memory-encryption bit
//! (`NUMBER(sme_mask)`) is masked off.

use crate::memory::{GuestMemory, MemoryError};
use crate::source::PageSource;
use crate::vmcoreinfo::VmcoreInfo;

/// `__START_KERNEL_map`: where the kernel image is linked on x86-64.
pub const START_KERNEL_MAP: u64 = 0xffff_ffff_8000_0000;
const FRAME_MASK: u64 = 0x000f_ffff_ffff_f000;
const PRESENT: u64 = 1;
const PAGE_SIZE_BIT: u64 = 1 << 7;

/// Errors translating kernel addresses.
#[derive(Debug, thiserror::Error)]
pub enum PageTableError {
    /// VMCOREINFO lacks a value the walk needs.
    #[error("VMCOREINFO has no {0}")]
    Missing(&'static str),
    /// `NUMBER(pgtable_l5_enabled)` is neither 0 nor 1.
    #[error("VMCOREINFO pgtable_l5_enabled is {0}, expected 0 or 1")]
    BadLevels(i64),
    /// The address is not canonical for the paging mode.
    #[error("{0:#x} is not a canonical kernel address")]
    NonCanonical(u64),
    /// A table entry on the way is not present.
    #[error("{vaddr:#x} is not mapped (level {level} entry {entry:#x} not present)")]
    NotMapped { vaddr: u64, level: u8, entry: u64 },
    /// Reading a page table failed.
    #[error("cannot read a page table of {vaddr:#x}")]
    Memory {
        vaddr: u64,
        #[source]
        source: MemoryError,
    },
}

/// A translated address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Translation {
    pub paddr: u64,
    /// Size of the page that maps it: 4 KiB, 2 MiB or 1 GiB.
    pub page_size: u64,
}

/// The kernel's page tables, as described by VMCOREINFO.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelPageTables {
    /// Physical address of `init_top_pgt`.
    pub top: u64,
    /// 4 or 5.
    pub levels: u8,
    /// `phys_base`, kept as the kernel's unsigned long (wrapping arithmetic).
    pub phys_base: u64,
    /// Bits masked off every entry (AMD SME's C-bit).
    pub sme_mask: u64,
}

impl KernelPageTables {
    /// From `SYMBOL(init_top_pgt)`, `NUMBER(phys_base)`, and (optional)
    /// `NUMBER(pgtable_l5_enabled)` and `NUMBER(sme_mask)`.
    pub fn from_vmcoreinfo(info: &VmcoreInfo) -> Result<Self, PageTableError> {
        let top_v = info
            .symbol("init_top_pgt")
            .ok_or(PageTableError::Missing("SYMBOL(init_top_pgt)"))?;
        let phys_base = info
            .phys_base
            .ok_or(PageTableError::Missing("NUMBER(phys_base)"))?;
        let levels = match info.number("pgtable_l5_enabled").unwrap_or(0) {
            0 => 4,
            1 => 5,
            n => return Err(PageTableError::BadLevels(n)),
        };
        Ok(KernelPageTables {
            top: kernel_image_paddr(top_v, phys_base) & FRAME_MASK,
            levels,
            phys_base,
            sme_mask: info.number("sme_mask").unwrap_or(0) as u64,
        })
    }

    /// Physical address of a kernel-image symbol (text, data, bss) without
    /// a walk; `None` outside the kernel image mapping.
    pub fn symbol_paddr(&self, vaddr: u64) -> Option<u64> {
        (vaddr >= START_KERNEL_MAP).then(|| kernel_image_paddr(vaddr, self.phys_base))
    }

    /// Walks the page tables in guest memory.
    pub fn translate<S: PageSource>(
        &self,
        mem: &GuestMemory<S>,
        vaddr: u64,
    ) -> Result<Translation, PageTableError> {
        let va_bits = if self.levels == 5 { 57 } else { 48 };
        // Canonical: bits above va_bits-1 all copy bit va_bits-1; kernel half only.
        if (vaddr as i64) >> (va_bits - 1) != -1 {
            return Err(PageTableError::NonCanonical(vaddr));
        }
        let mut table = self.top;
        for level in (1..=self.levels).rev() {
            let shift = 12 + 9 * (u32::from(level) - 1);
            let index = (vaddr >> shift) & 511;
            let entry = mem
                .read_u64(table + index * 8)
                .map_err(|source| PageTableError::Memory { vaddr, source })?;
            if entry & PRESENT == 0 {
                return Err(PageTableError::NotMapped {
                    vaddr,
                    level,
                    entry,
                });
            }
            let frame = entry & !self.sme_mask & FRAME_MASK;
            if level == 1 || (level <= 3 && entry & PAGE_SIZE_BIT != 0) {
                let page_size = 1u64 << shift;
                return Ok(Translation {
                    paddr: (frame & !(page_size - 1)) | (vaddr & (page_size - 1)),
                    page_size,
                });
            }
            table = frame;
        }
        unreachable!("level 1 always returns")
    }

    /// Reads `buf.len()` bytes at kernel virtual address `vaddr`, page by page.
    pub fn read<S: PageSource>(
        &self,
        mem: &GuestMemory<S>,
        vaddr: u64,
        buf: &mut [u8],
    ) -> Result<(), PageTableError> {
        let mut done = 0;
        while done < buf.len() {
            let va = vaddr.wrapping_add(done as u64);
            let t = self.translate(mem, va)?;
            let left_in_page = t.page_size - (va & (t.page_size - 1));
            let n = (buf.len() - done).min(usize::try_from(left_in_page).unwrap_or(usize::MAX));
            mem.read(t.paddr, &mut buf[done..done + n])
                .map_err(|source| PageTableError::Memory { vaddr: va, source })?;
            done += n;
        }
        Ok(())
    }
}

fn kernel_image_paddr(vaddr: u64, phys_base: u64) -> u64 {
    vaddr.wrapping_sub(START_KERNEL_MAP).wrapping_add(phys_base)
}

#[cfg(test)]
mod tests;
