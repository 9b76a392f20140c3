//! Test support: kernel page tables written into real sparse RAM files.

use std::fs::File;
use std::os::unix::fs::FileExt;

use crate::pagetable::KernelPageTables;

pub const PRESENT: u64 = 1;
pub const PAGE_SIZE_BIT: u64 = 1 << 7;
const FRAME_MASK: u64 = 0x000f_ffff_ffff_f000;

pub const RAM: u64 = 64 << 20;

/// Page tables written into a real sparse RAM file.
pub struct Builder {
    pub file: File,
    next: u64,
    levels: u8,
    pub top: u64,
    pub flags: u64,
}

impl Builder {
    pub fn new(file: File, levels: u8) -> Builder {
        Builder {
            file,
            next: 0x10_0000 + 0x1000,
            levels,
            top: 0x10_0000,
            flags: 0,
        }
    }

    pub fn entry(&self, table: u64, index: u64) -> u64 {
        let mut b = [0u8; 8];
        self.file.read_exact_at(&mut b, table + index * 8).unwrap();
        u64::from_le_bytes(b)
    }

    pub fn set(&self, table: u64, index: u64, value: u64) {
        self.file
            .write_all_at(&value.to_le_bytes(), table + index * 8)
            .unwrap();
    }

    /// Maps `va` to `pa` with a page of `size` (4K, 2M or 1G).
    pub fn map(&mut self, va: u64, pa: u64, size: u64) {
        let leaf_level = match size {
            0x1000 => 1,
            0x20_0000 => 2,
            0x4000_0000 => 3,
            _ => panic!("size"),
        };
        let mut table = self.top;
        for level in (leaf_level + 1..=self.levels).rev() {
            let index = (va >> (12 + 9 * (level as u32 - 1))) & 511;
            let e = self.entry(table, index);
            table = if e & PRESENT != 0 {
                e & FRAME_MASK & !self.flags
            } else {
                let t = self.next;
                self.next += 0x1000;
                self.set(table, index, t | PRESENT | 2 | self.flags);
                t
            };
        }
        let index = (va >> (12 + 9 * (leaf_level as u32 - 1))) & 511;
        let ps = if leaf_level > 1 { PAGE_SIZE_BIT } else { 0 };
        self.set(table, index, pa | PRESENT | 2 | ps | self.flags | (1 << 63));
    }

    pub fn tables(&self, sme_mask: u64) -> KernelPageTables {
        KernelPageTables {
            top: self.top,
            levels: self.levels,
            phys_base: 0,
            sme_mask,
        }
    }
}

pub fn ram() -> (tempfile::TempDir, std::path::PathBuf, File) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ram");
    let f = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    f.set_len(RAM).unwrap();
    (dir, path, f)
}

/// Where the synthetic kernel maps all of RAM (the direct map).
pub const DIRECT_MAP: u64 = 0xffff_8880_0000_0000;
/// Where the synthetic kernel maps its struct page array.
pub const VMEMMAP: u64 = 0xffff_ea00_0000_0000;
/// Physical home of the struct page array (RAM / 4 KiB * 64 B = 1 MiB).
pub const MEM_MAP_PA: u64 = 0x40_0000;
/// Physical address of the section roots (extreme) and of the section page.
pub const ROOTS_PA: u64 = 0x20_0000;
pub const SECTION_PA: u64 = 0x20_1000;

/// A 64 MiB sparse-memory "kernel" in a real sparse RAM file: direct map in
/// 2 MiB pages, vmemmap in 4 KiB pages, the section roots at [`ROOTS_PA`],
/// the section page at [`SECTION_PA`] with section 0's mem_map present.
/// Returns the builder (its file is the RAM) and `SYMBOL(mem_section)`,
/// `LENGTH(mem_section)` for the chosen model.
pub fn sparse_kernel(extreme: bool) -> (tempfile::TempDir, std::path::PathBuf, Builder, u64, u64) {
    let (dir, path, f) = ram();
    let mut b = Builder::new(f, 4);
    for pa in (0..RAM).step_by(0x20_0000) {
        b.map(DIRECT_MAP + pa, pa, 0x20_0000);
    }
    for off in (0..RAM / 4096 * 64).step_by(4096) {
        b.map(VMEMMAP + off, MEM_MAP_PA + off, 0x1000);
    }
    let coded = VMEMMAP | 3; // mem_map of pfn 0, present, has mem_map
    let (symbol, length) = if extreme {
        b.file
            .write_all_at(&(DIRECT_MAP + SECTION_PA).to_le_bytes(), ROOTS_PA)
            .unwrap();
        (DIRECT_MAP + ROOTS_PA, 2048)
    } else {
        (DIRECT_MAP + SECTION_PA, 1 << 19)
    };
    b.file
        .write_all_at(&coded.to_le_bytes(), SECTION_PA)
        .unwrap();
    (dir, path, b, symbol, length)
}

/// Writes `bytes` at byte `offset` of the struct page of `pfn`.
pub fn write_struct(file: &File, pfn: u64, offset: u64, bytes: &[u8]) {
    file.write_all_at(bytes, MEM_MAP_PA + pfn * 64 + offset)
        .unwrap();
}
