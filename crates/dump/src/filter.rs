//! Which guest pages a dump writes.

use rebound_guestmem::FreePages;

/// Chooses the pages that go into a dump. A page left out reads as zero in
/// an ELF dump (inside a segment) or is absent from the kdump bitmap, as
/// makedumpfile leaves out what its dump level excludes.
pub trait PageFilter: Sync {
    /// Whether the page at guest physical address `gpa` (page-aligned) is written.
    fn keep(&self, gpa: u64) -> bool;

    /// The makedumpfile dump level (`-d`) this filter amounts to, recorded in
    /// kdump headers so makedumpfile's refiltering knows what is already
    /// gone: 16 for free pages, 0 for nothing excluded.
    fn dump_level(&self) -> u32 {
        0
    }
}

/// The guest kernel's free buddy pages are left out (makedumpfile `-d 16`).
impl PageFilter for FreePages {
    fn keep(&self, gpa: u64) -> bool {
        !self.contains(gpa)
    }

    fn dump_level(&self) -> u32 {
        16
    }
}

/// A bitmap over page frame numbers (4 KiB pages): a set bit keeps the page;
/// pages past its end are kept.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PfnBitmap {
    bits: Vec<u64>,
    pages: u64,
    level: u32,
}

impl PfnBitmap {
    /// `pages` page frames, all kept, reported as dump level `level`.
    pub fn all_kept(pages: u64, level: u32) -> PfnBitmap {
        PfnBitmap {
            bits: vec![u64::MAX; pages.div_ceil(64) as usize],
            pages,
            level,
        }
    }

    /// Keeps or drops page frame `pfn` (ignored past the end).
    pub fn set(&mut self, pfn: u64, keep: bool) {
        if pfn >= self.pages {
            return;
        }
        let (w, b) = ((pfn / 64) as usize, pfn % 64);
        if keep {
            self.bits[w] |= 1 << b;
        } else {
            self.bits[w] &= !(1 << b);
        }
    }

    /// Whether `pfn` is kept.
    pub fn get(&self, pfn: u64) -> bool {
        pfn >= self.pages || self.bits[(pfn / 64) as usize] & (1 << (pfn % 64)) != 0
    }
}

impl PageFilter for PfnBitmap {
    fn keep(&self, gpa: u64) -> bool {
        self.get(gpa / crate::PAGE_SIZE)
    }

    fn dump_level(&self) -> u32 {
        self.level
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitmap_and_free_pages_filters() {
        let mut b = PfnBitmap::all_kept(100, 31);
        b.set(3, false);
        b.set(99, false);
        b.set(500, false);
        assert!(!b.keep(3 * 4096) && !b.keep(99 * 4096 + 5));
        assert!(b.keep(4 * 4096) && b.keep(500 * 4096));
        assert_eq!(b.dump_level(), 31);
        let free = FreePages {
            ranges: vec![0x10000..0x20000],
            bytes: 0x10000,
        };
        assert!(!free.keep(0x10000) && free.keep(0x20000) && free.keep(0));
        assert_eq!(free.dump_level(), 16);
    }
}
