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
