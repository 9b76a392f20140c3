use super::*;
use crate::layout::{mib, Layout};
use crate::testutil::{ram, Builder, RAM};
use std::os::unix::fs::FileExt;

const VA_4K: u64 = 0xffff_8880_0123_4000;
const VA_2M: u64 = 0xffff_ea00_0040_0000;
const VA_1G: u64 = 0xffff_8881_4000_0000;

#[test]
fn walks_4k_2m_and_1g_pages() {
    for sme_mask in [0, 1 << 47] {
        let (_d, path, f) = ram();
        let mut b = Builder::new(f, 4);
        b.flags = sme_mask;
        b.map(VA_4K, 0x234_5000, 0x1000);
        b.map(VA_4K + 0x1000, 0x300_0000, 0x1000);
        b.map(VA_2M, 0x40_0000, 0x20_0000);
        b.map(VA_1G, 0, 0x4000_0000);
        b.file.write_all_at(b"ABCD", 0x234_5ffc).unwrap();
        b.file.write_all_at(b"EFGH", 0x300_0000).unwrap();
        let pt = b.tables(sme_mask);
        let mem = GuestMemory::open_ram_file(&path, Layout::pc(RAM).unwrap()).unwrap();
        let t = |va| pt.translate(&mem, va).unwrap();
        assert_eq!(
            t(VA_4K + 0x567),
            Translation {
                paddr: 0x234_5567,
                page_size: 0x1000
            }
        );
        assert_eq!(
            t(VA_2M + 0x1_2345),
            Translation {
                paddr: 0x41_2345,
                page_size: 0x20_0000
            }
        );
        assert_eq!(
            t(VA_1G + 0x123_4567),
            Translation {
                paddr: 0x123_4567,
                page_size: 0x4000_0000
            }
        );
        // A read across two 4K pages mapped to distant frames.
        let mut buf = [0u8; 8];
        pt.read(&mem, VA_4K + 0xffc, &mut buf).unwrap();
        assert_eq!(&buf, b"ABCDEFGH");
    }
}

#[test]
fn walks_five_levels() {
    let (_d, path, f) = ram();
    let mut b = Builder::new(f, 5);
    let va = 0xff11_0000_0012_3000;
    b.map(va, 0x77_7000, 0x1000);
    let mem = GuestMemory::open_ram_file(&path, Layout::pc(RAM).unwrap()).unwrap();
    let pt = b.tables(0);
    assert_eq!(pt.translate(&mem, va + 8).unwrap().paddr, 0x77_7008);
    // A 4-level-canonical address is not canonical with 57-bit addresses.
    let e = pt
        .translate(&mem, 0xffff_0000_0000_0000 & !(1 << 56))
        .unwrap_err();
    assert!(matches!(e, PageTableError::NonCanonical(_)), "{e}");
}

#[test]
fn bad_addresses_and_tables_give_clear_errors() {
    let (_d, path, f) = ram();
    let mut b = Builder::new(f, 4);
    b.map(VA_4K, 0x234_5000, 0x1000);
    let mem = GuestMemory::open_ram_file(&path, Layout::pc(RAM).unwrap()).unwrap();
    let pt = b.tables(0);
    let e = pt.translate(&mem, 0xffff_c900_0000_0000).unwrap_err();
    assert!(
        e.to_string().contains("not mapped (level 4 entry 0x0"),
        "{e}"
    );
    let e = pt.translate(&mem, VA_4K + 0x1000).unwrap_err();
    assert!(e.to_string().contains("level 1"), "{e}");
    for bad in [0x40_0000, 0x0000_8000_0000_0000, 0x7fff_ffff_ffff_ffff] {
        let e = pt.translate(&mem, bad).unwrap_err();
        assert!(
            e.to_string().contains("not a canonical kernel address"),
            "{bad:#x}: {e}"
        );
    }
    // Tables pointing outside RAM: an error naming the address, not a panic.
    b.set(b.top, 0x1ff, 0xd000_0000 | PRESENT);
    let e = pt.translate(&mem, 0xffff_ff80_0000_0000).unwrap_err();
    let chain = format!("{e}: {}", std::error::Error::source(&e).unwrap());
    assert!(
        chain.contains("0xd0000000") && chain.contains("not RAM"),
        "{chain}"
    );
}

#[test]
fn random_tables_never_panic() {
    let (_d, path, f) = ram();
    let mut rng = fastrand::Rng::with_seed(7);
    // Random garbage in the first 4 MiB, where the tables point.
    let junk: Vec<u8> = (0..mib(4)).map(|_| rng.u8(..)).collect();
    f.write_all_at(&junk, 0).unwrap();
    let mem = GuestMemory::open_ram_file(&path, Layout::pc(RAM).unwrap()).unwrap();
    for levels in [4, 5] {
        let pt = KernelPageTables {
            top: 0x1000,
            levels,
            phys_base: 0,
            sme_mask: 0,
        };
        for _ in 0..5000 {
            let va = rng.u64(..) | 0xff00_0000_0000_0000;
            let mut buf = [0u8; 64];
            let _ = pt.read(&mem, va, &mut buf);
        }
    }
}

#[test]
fn from_vmcoreinfo_uses_init_top_pgt_and_phys_base() {
    let text = "OSRELEASE=6.1\nPAGESIZE=4096\nSYMBOL(init_top_pgt)=ffffffff9a80a000\n\
                NUMBER(phys_base)=-14680064\nNUMBER(pgtable_l5_enabled)=0\nNUMBER(sme_mask)=0\n";
    let info = VmcoreInfo::parse(text.as_bytes()).unwrap();
    let pt = KernelPageTables::from_vmcoreinfo(&info).unwrap();
    // 0xffffffff9a80a000 - 0xffffffff80000000 - 0xe00000
    assert_eq!(pt.top, 0x1a80_a000 - 0xe0_0000);
    assert_eq!(pt.levels, 4);
    assert_eq!(pt.symbol_paddr(0xffff_ffff_8100_0000), Some(0x20_0000));
    assert_eq!(pt.symbol_paddr(0xffff_8880_0000_0000), None);

    let l5 = VmcoreInfo::parse(text.replace("enabled)=0", "enabled)=1").as_bytes()).unwrap();
    assert_eq!(KernelPageTables::from_vmcoreinfo(&l5).unwrap().levels, 5);
    let bad = VmcoreInfo::parse(text.replace("enabled)=0", "enabled)=2").as_bytes()).unwrap();
    let e = KernelPageTables::from_vmcoreinfo(&bad).unwrap_err();
    assert_eq!(
        e.to_string(),
        "VMCOREINFO pgtable_l5_enabled is 2, expected 0 or 1"
    );
    let no_pgt = VmcoreInfo::parse(b"OSRELEASE=6.1\nPAGESIZE=4096\nNUMBER(phys_base)=0\n").unwrap();
    let e = KernelPageTables::from_vmcoreinfo(&no_pgt).unwrap_err();
    assert_eq!(e.to_string(), "VMCOREINFO has no SYMBOL(init_top_pgt)");
    let no_base =
        VmcoreInfo::parse(b"OSRELEASE=6.1\nPAGESIZE=4096\nSYMBOL(init_top_pgt)=ffffffff9a80a000\n")
            .unwrap();
    let e = KernelPageTables::from_vmcoreinfo(&no_base).unwrap_err();
    assert_eq!(e.to_string(), "VMCOREINFO has no NUMBER(phys_base)");
}
