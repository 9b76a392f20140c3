use std::fs::File;
use std::os::unix::fs::FileExt;

use super::*;
use crate::layout::Layout;
use crate::pagetable::START_KERNEL_MAP;
use crate::testutil::{
    sparse_kernel, write_struct, DIRECT_MAP, MEM_MAP_PA, RAM, ROOTS_PA, SECTION_PA, VMEMMAP,
};

const PAGES: u64 = RAM / 4096;
// Flag bits as a 6.1 x86-64 kernel numbers them.
const LRU: u64 = 1 << 4;
const SLAB: u64 = 1 << 9;
const SWAPCACHE: u64 = 1 << 10;
const PRIVATE: u64 = 1 << 13;
const SWAPBACKED: u64 = 1 << 19;
const HWPOISON: u64 = 1 << 23;
const HEAD: u64 = 1 << 16;
const BUDDY: i32 = -129;
const OFFLINE: i32 = -257;

/// VMCOREINFO of the synthetic kernel, as a 6.1 kernel writes it.
fn text(symbol: u64, length: u64) -> String {
    format!(
        "OSRELEASE=6.1.0-56-amd64\nPAGESIZE=4096\nSYMBOL(mem_section)={symbol:x}\n\
         LENGTH(mem_section)={length}\nSIZE(mem_section)=16\n\
         OFFSET(mem_section.section_mem_map)=0\nNUMBER(SECTION_SIZE_BITS)=27\n\
         NUMBER(MAX_PHYSMEM_BITS)=46\nSIZE(page)=64\nOFFSET(page.flags)=0\n\
         OFFSET(page.compound_head)=8\nOFFSET(page.compound_dtor)=16\n\
         OFFSET(page.compound_order)=17\nOFFSET(page.mapping)=24\n\
         OFFSET(page.private)=40\nOFFSET(page._mapcount)=48\n\
         NUMBER(PAGE_BUDDY_MAPCOUNT_VALUE)=-129\nNUMBER(PAGE_OFFLINE_MAPCOUNT_VALUE)=-257\n\
         NUMBER(PG_lru)=4\nNUMBER(PG_slab)=9\nNUMBER(PG_swapcache)=10\nNUMBER(PG_private)=13\n\
         NUMBER(PG_head_mask)=65536\nNUMBER(PG_swapbacked)=19\nNUMBER(PG_hwpoison)=23\n\
         NUMBER(HUGETLB_PAGE_DTOR)=2\nLENGTH(zone.free_area)=11\n\
         SYMBOL(init_top_pgt)={:x}\nNUMBER(phys_base)=0\n",
        START_KERNEL_MAP + 0x10_0000
    )
}

fn parse(text: &str) -> VmcoreInfo {
    VmcoreInfo::parse(text.as_bytes()).unwrap()
}

struct Guest {
    dir: tempfile::TempDir,
    file: File,
    mem: GuestMemory,
    text: String,
}

impl Guest {
    fn new(extreme: bool) -> Guest {
        let (dir, path, b, symbol, length) = sparse_kernel(extreme);
        let mem = GuestMemory::open_ram_file(&path, Layout::pc(RAM).unwrap()).unwrap();
        Guest {
            dir,
            file: b.file,
            mem,
            text: text(symbol, length),
        }
    }

    /// A struct page: flags, mapping, private, _mapcount.
    fn page(&self, pfn: u64, flags: u64, mapping: u64, private: u64, mapcount: i32) {
        write_struct(&self.file, pfn, 0, &flags.to_le_bytes());
        write_struct(&self.file, pfn, 24, &mapping.to_le_bytes());
        write_struct(&self.file, pfn, 40, &private.to_le_bytes());
        write_struct(&self.file, pfn, 48, &mapcount.to_le_bytes());
    }

    /// A compound page: head flags and mapping, order and dtor in page[1],
    /// tails pointing at the head.
    fn compound(&self, pfn: u64, order: u8, dtor: u8, flags: u64, mapping: u64) {
        self.page(pfn, flags | HEAD, mapping, 0, -1);
        write_struct(&self.file, pfn + 1, 16, &[dtor, order]);
        for tail in pfn + 1..pfn + (1 << order) {
            let head = VMEMMAP + pfn * 64 + 1;
            write_struct(&self.file, tail, 8, &head.to_le_bytes());
        }
    }

    fn classify(&self) -> Result<Classification, ClassifyError> {
        classify(&self.mem, &parse(&self.text))
    }

    fn without(&mut self, key: &str) -> &mut Self {
        self.text = self
            .text
            .lines()
            .filter(|l| !l.starts_with(&format!("{key}=")))
            .map(|l| format!("{l}\n"))
            .collect();
        self
    }

    fn set(&mut self, key: &str, value: &str) -> &mut Self {
        self.without(key);
        self.text.push_str(&format!("{key}={value}\n"));
        self
    }
}

const ANON: u64 = DIRECT_MAP + 0x30_0001;
const FILE_MAPPING: u64 = DIRECT_MAP + 0x30_0100;

/// One page of every kind makedumpfile tells apart.
fn zoo(g: &Guest) {
    g.page(0x1000, 0, 0, 3, BUDDY); // free, order 3
    g.page(0x1100, LRU, FILE_MAPPING, 0, -1); // page cache
    g.page(0x1101, LRU | PRIVATE, FILE_MAPPING, 0, -1); // with buffer heads
    g.page(0x1102, LRU, ANON, 0, 0); // anonymous, on the LRU
    g.page(0x1103, SWAPBACKED | SWAPCACHE, ANON, 0, 0); // anonymous in swap cache
    g.page(0x1104, SWAPBACKED | SWAPCACHE, FILE_MAPPING, 0, -1); // shmem in swap cache
    g.page(0x1105, SWAPCACHE, 0, 0, -1); // PG_swapcache alone means nothing
    g.page(0x1106, SLAB, ANON, 0, BUDDY); // a slab is never free nor anonymous
    g.page(0x1107, 0, 0, 0, OFFLINE); // ballooned out
    g.page(0x1108, HWPOISON, 0, 0, -1);
    g.page(0x1109, LRU | SLAB, ANON, 0, -1); // slab: not anonymous, so cache
    g.compound(0x1200, 9, 2, 0, FILE_MAPPING); // hugetlb: user, 512 pages
    g.compound(0x1400, 2, 0, LRU, ANON); // anonymous THP
    g.compound(0x1500, 2, 0, 0, 0); // kernel compound page...
    g.page(0x1502, LRU, FILE_MAPPING, 0, -1); // ...whose tail flags are ignored
    write_struct(
        &g.file,
        0x1502,
        8,
        &(VMEMMAP + 0x1500 * 64 + 1).to_le_bytes(),
    );
    g.compound(0x1601, 1, 0, LRU, FILE_MAPPING); // misaligned order: one page
    g.page(0x1700, 0, 0, 11, BUDDY); // order past LENGTH(zone.free_area): kept
    g.page(0x1701, LRU, FILE_MAPPING, 0, -1); // looked at on its own
    g.page(0x1800, 0, 0, 4, BUDDY); // a free block over...
    g.page(0x1805, LRU, FILE_MAPPING, 0, -1); // ...a stale cache page: free wins
    g.page(PAGES - 4, 0, 0, 10, BUDDY); // a free block past the end of RAM
}

#[test]
fn classes_follow_makedumpfiles_rules() {
    for extreme in [true, false] {
        let g = Guest::new(extreme);
        zoo(&g);
        let c = g.classify().unwrap();
        let class = |pfn| c.class(pfn).unwrap();
        use PageClass::*;
        for (pfn, want) in [
            (0x1000, Free),
            (0x1007, Free),
            (0x1008, Kernel),
            (0x1100, Cache),
            (0x1101, CachePrivate),
            (0x1102, User),
            (0x1103, User),
            (0x1104, Cache),
            (0x1105, Kernel),
            (0x1106, Kernel),
            (0x1107, Offline),
            (0x1108, Hwpoison),
            (0x1109, Cache),
            (0x1200, User),
            (0x13ff, User),
            (0x1400, User),
            (0x1403, User),
            (0x1404, Kernel),
            (0x1500, Kernel),
            (0x1502, Kernel),
            (0x1601, Cache),
            (0x1602, Kernel),
            (0x1700, Kernel),
            (0x1701, Cache),
            (0x1805, Free),
            (0x180f, Free),
            (PAGES - 1, Free),
            (0, Kernel),
        ] {
            assert_eq!(class(pfn), want, "pfn {pfn:#x} (extreme {extreme})");
        }
        assert_eq!(c.class(PAGES), None);
        let n = c.counts();
        assert_eq!(
            (n.free, n.cache, n.cache_private, n.user),
            (8 + 16 + 4, 5, 1, 2 + 512 + 4),
            "{n:?}"
        );
        assert_eq!((n.hwpoison, n.offline), (1, 1));
        assert_eq!(n.total(), PAGES);
    }
}

#[test]
fn zero_pages_come_from_holes_and_content() {
    let g = Guest::new(true);
    zoo(&g);
    // A written page of zeros is allocated but zero; one byte at the end is not.
    g.file.write_all_at(&[0u8; 4096], 0x200_0000).unwrap();
    g.file.write_all_at(&[1], 0x200_1fff).unwrap();
    g.file.write_all_at(&[7], 0x110_0000).unwrap(); // the cache page has data
    let c = g.classify().unwrap();
    assert_eq!(c.is_zero(0x2000), Some(true));
    assert_eq!(c.is_zero(0x2001), Some(false));
    assert_eq!(c.is_zero(0x3000), Some(true), "a hole");
    assert_eq!(c.is_zero(0x1100), Some(false));
    // Page tables, sections and struct pages hold data; count them directly.
    let nonzero = (0..PAGES)
        .filter(|&p| {
            let mut b = vec![0u8; 4096];
            g.file.read_exact_at(&mut b, p * 4096).unwrap();
            b.iter().any(|&x| x != 0)
        })
        .count() as u64;
    assert_eq!(c.counts().zero, PAGES - nonzero);
    assert!(is_zero(&[0u8; 100]) && !is_zero(&[0, 0, 0, 1]) && is_zero(&[]));
    let mut odd = [0u8; 4099];
    odd[4098] = 1;
    assert!(!is_zero(&odd));
}

#[test]
fn levels_leave_out_what_makedumpfile_leaves_out() {
    let g = Guest::new(true);
    zoo(&g);
    g.file.write_all_at(&[7], 0x110_0000).unwrap(); // cache page 0x1100 has data
    g.file.write_all_at(&[7], 0x110_1000).unwrap(); // private cache page too
    g.file.write_all_at(&[7], 0x100_0000).unwrap(); // the free block too
    let c = g.classify().unwrap();
    let lvl = |b| c.excluded(DumpLevel::new(b).unwrap());
    // -d 2 leaves out cache without private only; -d 4 both kinds.
    assert!(lvl(2).is_excluded(0x1100) && !lvl(2).is_excluded(0x1101));
    assert!(lvl(4).is_excluded(0x1100) && lvl(4).is_excluded(0x1101));
    assert_eq!(
        (lvl(4).counts().cache, lvl(4).counts().cache_private),
        (5, 1)
    );
    // -d 1: zero content only; a free page with data stays, one without goes.
    assert!(!lvl(1).is_excluded(0x1000) && lvl(1).is_excluded(0x1001));
    assert!(!lvl(0).is_excluded(0x1001));
    // Without bit 16 a zero free page counts as a zero page.
    assert_eq!(lvl(15).counts().free, 0);
    assert!(lvl(15).is_excluded_gpa(0x100_1000));
    // Hwpoison pages go whenever struct pages are read (PG_hwpoison known).
    assert!(lvl(0).is_excluded(0x1108));
    let all = c.excluded(DumpLevel::ALL);
    let n = all.counts();
    assert_eq!(
        (
            n.free,
            n.cache,
            n.cache_private,
            n.user,
            n.hwpoison,
            n.offline
        ),
        (28, 5, 1, 518, 1, 1)
    );
    assert_eq!(n.zero + n.remaining + 28 + 5 + 1 + 518 + 2, PAGES);
    // The ranges are the excluded pages, merged.
    let ranges = all.excluded_ranges();
    let pages: u64 = ranges.iter().map(|r| (r.end - r.start) / 4096).sum();
    assert_eq!(pages, PAGES - n.remaining);
    assert!(ranges.windows(2).all(|w| w[0].end < w[1].start));
    for pfn in [0x1000, 0x1100, 0x1200, 0x1108] {
        assert!(ranges.iter().any(|r| r.contains(&(pfn * 4096))), "{pfn:#x}");
    }
    // The struct pages of the zoo hold data: kernel pages, kept.
    assert!(!ranges
        .iter()
        .any(|r| r.contains(&(MEM_MAP_PA + 0x1000 * 64))));
    let some = all.counts_in(&[0x100_0000..0x100_8000, 0x500_0000..0x600_0000]);
    assert_eq!(some.free, 8);
    assert!(matches!(
        DumpLevel::new(32),
        Err(ClassifyError::BadLevel(32))
    ));
}

#[test]
fn newer_kernels_compound_orders_are_read_from_flags() {
    // 6.6-6.8: order in page[1].flags' low byte, hugetlb by PG_hugetlb there.
    let mut g = Guest::new(true);
    g.without("OFFSET(page.compound_order)")
        .without("OFFSET(page.compound_dtor)")
        .set("NUMBER(PG_hugetlb)", "8");
    g.page(0x1200, HEAD, FILE_MAPPING, 0, -1);
    write_struct(&g.file, 0x1201, 0, &(9u64 | 1 << 8).to_le_bytes());
    let c = g.classify().unwrap();
    assert_eq!(c.counts().user, 512);
    // 6.9+: hugetlb by the head's _mapcount.
    g.without("NUMBER(PG_hugetlb)")
        .set("NUMBER(PAGE_HUGETLB_MAPCOUNT_VALUE)", "-1025");
    g.page(0x1200, HEAD, FILE_MAPPING, 0, -1025);
    assert_eq!(g.classify().unwrap().counts().user, 512);
}

fn err(g: &Guest) -> String {
    let e = g.classify().unwrap_err();
    let mut s = e.to_string();
    let mut src = std::error::Error::source(&e);
    while let Some(x) = src {
        s += &format!(": {x}");
        src = x.source();
    }
    s
}

#[test]
fn missing_vmcoreinfo_keys_are_named() {
    for key in [
        "SYMBOL(mem_section)",
        "SIZE(page)",
        "OFFSET(page.flags)",
        "OFFSET(page.mapping)",
        "OFFSET(page._mapcount)",
        "OFFSET(page.private)",
        "OFFSET(page.compound_head)",
        "NUMBER(PG_lru)",
        "NUMBER(PG_private)",
        "NUMBER(PG_swapcache)",
        "NUMBER(PG_slab)",
        "NUMBER(PG_head_mask)",
        "NUMBER(PAGE_BUDDY_MAPCOUNT_VALUE)",
        "LENGTH(zone.free_area)",
        "NUMBER(SECTION_SIZE_BITS)",
    ] {
        let mut g = Guest::new(true);
        g.without(key);
        assert_eq!(err(&g), format!("VMCOREINFO has no {key}"));
    }
    let mut g = Guest::new(true);
    g.without("OFFSET(page.compound_order)");
    assert!(err(&g).contains("no compound page order"), "{}", err(&g));
    let mut g = Guest::new(true);
    g.without("SYMBOL(init_top_pgt)");
    assert!(err(&g).contains("page tables"), "{}", err(&g));
    g.set("OSRELEASE", "4.4.0");
    assert!(err(&g).contains("older than 4.16"), "{}", err(&g));
}

#[test]
fn out_of_range_values_are_refused_before_reading() {
    for (key, value, says) in [
        ("NUMBER(PG_lru)", "99", "NUMBER(PG_lru) is 99"),
        ("NUMBER(PG_slab)", "-1", "NUMBER(PG_slab) is -1"),
        ("LENGTH(zone.free_area)", "1000", "free_area) is 1000"),
        (
            "NUMBER(PAGE_BUDDY_MAPCOUNT_VALUE)",
            "99999999999",
            "is 99999999999",
        ),
        ("SIZE(page)", "1000000000", "SIZE(page) 1000000000"),
        (
            "OFFSET(page.private)",
            "60",
            "OFFSET(page.private) ends at byte 68",
        ),
        ("OFFSET(page.compound_order)", "64", "ends at byte 65"),
        ("NUMBER(SECTION_SIZE_BITS)", "70", "SECTION_SIZE_BITS 70"),
        ("LENGTH(mem_section)", "5", "fits neither"),
    ] {
        let mut g = Guest::new(true);
        g.set(key, value);
        let e = err(&g);
        assert!(e.contains(says), "{key}={value}: {e}");
    }
}

#[test]
fn corrupt_sections_fail_or_end() {
    // A root pointing into unmapped kernel space: a read error, not a guess.
    let g = Guest::new(true);
    g.file
        .write_all_at(&0xffff_c900_0000_0000u64.to_le_bytes(), ROOTS_PA)
        .unwrap();
    assert!(err(&g).contains("not mapped"), "{}", err(&g));
    // A section whose mem_map decodes into user space.
    let g = Guest::new(true);
    g.file
        .write_all_at(&(0x1000u64 | 3).to_le_bytes(), SECTION_PA)
        .unwrap();
    assert!(err(&g).contains("not a kernel address"), "{}", err(&g));
    // A mem_map into unmapped vmemmap.
    let g = Guest::new(true);
    g.file
        .write_all_at(&((VMEMMAP + (1 << 30)) | 3).to_le_bytes(), SECTION_PA)
        .unwrap();
    assert!(err(&g).contains("not mapped"), "{}", err(&g));
    // A root that points at the root array itself: section 0 reads as the
    // root pointer, which has no flag bits: no mem_map, everything kept.
    let g = Guest::new(true);
    g.file
        .write_all_at(&(DIRECT_MAP + ROOTS_PA).to_le_bytes(), ROOTS_PA)
        .unwrap();
    assert_eq!(g.classify().unwrap().counts().kernel, PAGES);
    // A mem_map into the direct map: page tables read as struct pages,
    // garbage classes, but one pass within RAM.
    let g = Guest::new(true);
    g.file
        .write_all_at(&(DIRECT_MAP | 3).to_le_bytes(), SECTION_PA)
        .unwrap();
    assert_eq!(g.classify().unwrap().counts().total(), PAGES);
    // Every struct page says "free, order 63" or "compound of order 255":
    // still one pass, no page counted twice.
    let g = Guest::new(true);
    for pfn in 0..PAGES {
        g.page(pfn, 0, 0, 63, BUDDY);
    }
    assert_eq!(g.classify().unwrap().counts().kernel, PAGES);
    let g = Guest::new(true);
    for pfn in 0..PAGES {
        g.page(pfn, HEAD | LRU, FILE_MAPPING, 0, -1);
        write_struct(&g.file, pfn, 17, &[255]);
    }
    assert_eq!(g.classify().unwrap().counts().cache, PAGES);
    // No section has a mem_map: nothing is known, everything is kept.
    let g = Guest::new(true);
    g.file.write_all_at(&0u64.to_le_bytes(), ROOTS_PA).unwrap();
    let c = g.classify().unwrap();
    assert_eq!(c.counts().kernel, PAGES);
    assert_eq!(
        c.excluded(DumpLevel::new(30).unwrap()).counts().remaining,
        PAGES
    );
}

#[test]
fn device_memory_is_classified_too() {
    let mut g = Guest::new(true);
    zoo(&g);
    let dev = g.dir.path().join("vmem");
    File::create(&dev).unwrap().set_len(2 << 20).unwrap();
    File::options()
        .write(true)
        .open(&dev)
        .unwrap()
        .write_all_at(b"plugged", 0x1000)
        .unwrap();
    let base = g.mem.layout().device_memory_base();
    g.mem.add_device_memory_file(&dev, base, 2 << 20).unwrap();
    let c = g.classify().unwrap();
    let first = base / 4096;
    // No section describes it: kept, zero where it is zero.
    assert_eq!(c.class(first + 1), Some(PageClass::Kernel));
    assert_eq!(c.is_zero(first), Some(true));
    assert_eq!(c.is_zero(first + 1), Some(false));
    assert_eq!(c.counts().total(), PAGES + 512);
    let ranges = c.excluded(DumpLevel::ALL).excluded_ranges();
    assert!(
        ranges.contains(&(base + 0x2000..base + (2 << 20))),
        "{ranges:x?}"
    );
    assert!(!c.excluded(DumpLevel::ALL).is_excluded_gpa(base + 0x1000));
}
