use std::os::unix::fs::FileExt;

use super::*;
use crate::layout::Layout;
use crate::testutil::{sparse_kernel, write_struct, DIRECT_MAP, RAM};

fn info(length: u64, mem_section_va: u64) -> VmcoreInfo {
    let text = format!(
        "OSRELEASE=6.1\nPAGESIZE=4096\nSYMBOL(mem_section)={mem_section_va:x}\n\
         LENGTH(mem_section)={length}\nSIZE(mem_section)=16\n\
         OFFSET(mem_section.section_mem_map)=0\nNUMBER(SECTION_SIZE_BITS)=27\n\
         NUMBER(MAX_PHYSMEM_BITS)=46\nSIZE(page)=64\nOFFSET(page._mapcount)=48\n\
         OFFSET(page.private)=40\nNUMBER(PAGE_BUDDY_MAPCOUNT_VALUE)=-129\n"
    );
    VmcoreInfo::parse(text.as_bytes()).unwrap()
}

/// The synthetic 64 MiB kernel with free blocks.
fn kernel(extreme: bool) -> (tempfile::TempDir, GuestMemory, KernelPageTables, VmcoreInfo) {
    let (dir, path, b, symbol, length) = sparse_kernel(extreme);
    // Free blocks: (pfn, order written in page.private).
    // 0x1f00 order 9 (unaligned, as only corruption makes it) runs across the
    // 8192-page read batch and over the "head" at 0x2000, which is inside it.
    for (pfn, order) in [
        (0x1000u64, 3u64),
        (0x1f00, 9),
        (0x2000, 0),
        (0x3000, 10),
        (0x3800, 99),
    ] {
        write_struct(&b.file, pfn, 48, &(-129i32).to_le_bytes());
        write_struct(&b.file, pfn, 40, &order.to_le_bytes());
    }
    let pt = b.tables(0);
    let mem = GuestMemory::open_ram_file(&path, Layout::pc(RAM).unwrap()).unwrap();
    (dir, mem, pt, info(length, symbol))
}

#[test]
fn finds_free_blocks_by_order() {
    for extreme in [true, false] {
        let (_d, mem, pt, info) = kernel(extreme);
        let free = free_pages(&mem, &info, &pt).unwrap();
        assert_eq!(
            free.ranges,
            vec![
                0x100_0000..0x100_8000,
                0x1f0_0000..0x210_0000,
                0x300_0000..0x340_0000,
                // order 99 is corrupt: one page.
                0x380_0000..0x380_1000,
            ],
            "extreme {extreme}"
        );
        assert_eq!(free.bytes, 0x8000 + 0x20_0000 + 0x40_0000 + 0x1000);
        assert!(free.contains(0x300_0000 + 0x3f_ffff));
        assert!(!free.contains(0x340_0000));
        assert!(!free.contains(0));
    }
}

#[test]
fn absent_sections_have_no_free_pages() {
    let (_d, mem, pt, info) = kernel(true);
    // Clear the root pointer through the file behind `mem`.
    let path = mem.source().path().to_path_buf();
    let f = std::fs::File::options().write(true).open(path).unwrap();
    f.write_all_at(&0u64.to_le_bytes(), 0x20_0000).unwrap();
    assert_eq!(free_pages(&mem, &info, &pt).unwrap(), FreePages::default());
}

#[test]
fn inconsistent_or_missing_values_are_errors() {
    let (_d, mem, pt, _) = kernel(true);
    let e = free_pages(&mem, &info(5, DIRECT_MAP), &pt).unwrap_err();
    assert!(
        e.to_string().contains("LENGTH(mem_section) 5 fits neither"),
        "{e}"
    );
    // An absurd struct page size is refused before anything is allocated.
    let huge = info(2048, DIRECT_MAP + 0x20_0000)
        .text
        .replace("SIZE(page)=64", "SIZE(page)=1000000000");
    let e = free_pages(&mem, &VmcoreInfo::parse(huge.as_bytes()).unwrap(), &pt).unwrap_err();
    assert!(e.to_string().contains("SIZE(page) 1000000000"), "{e}");
    let bare = VmcoreInfo::parse(b"OSRELEASE=6.1\nPAGESIZE=4096\n").unwrap();
    let e = free_pages(&mem, &bare, &pt).unwrap_err();
    assert_eq!(e.to_string(), "VMCOREINFO has no NUMBER(SECTION_SIZE_BITS)");
    // A mem_section pointer into unmapped kernel space is a read error.
    let e = free_pages(&mem, &info(2048, 0xffff_c900_0000_0000), &pt).unwrap_err();
    let chain = format!("{e}: {}", std::error::Error::source(&e).unwrap());
    assert!(chain.contains("not mapped"), "{chain}");
}

#[test]
fn exclude_from_subtracts_free_ranges() {
    let free = FreePages {
        ranges: vec![0x1000..0x3000, 0x5000..0x6000, 0x9000..0xa000],
        bytes: 0x4000,
    };
    let data = [0..0x2000, 0x2800..0x7000, 0x8000..0x9800, 0xb000..0xc000];
    assert_eq!(
        free.exclude_from(&data),
        vec![
            0..0x1000,
            0x3000..0x5000,
            0x6000..0x7000,
            0x8000..0x9000,
            0xb000..0xc000
        ]
    );
    assert_eq!(FreePages::default().exclude_from(&data), data.to_vec());
    assert_eq!(free.exclude_from(&[0x1000..0x3000]), vec![]);
}
