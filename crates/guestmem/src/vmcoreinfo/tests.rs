use super::*;

/// Lines in the shape a Debian 6.1 x86-64 kernel writes (formats from
/// include/linux/vmcore_info.h and arch/x86/kernel/machine_kexec_64.c).
pub(crate) const SAMPLE: &str = "OSRELEASE=6.1.0-27-amd64
BUILD-ID=4d5f1cd4c2c7ac2e3d2dcb3b8a2b0b8fa3f4e1d2
PAGESIZE=4096
SYMBOL(init_uts_ns)=ffffffffb38152a0
OFFSET(uts_namespace.name)=0
SYMBOL(node_online_map)=ffffffffb390d8a8
SYMBOL(swapper_pg_dir)=ffffffffb380a000
SYMBOL(_stext)=ffffffffb1e00000
SYMBOL(mem_section)=ffff8880044d1000
LENGTH(mem_section)=2048
SIZE(mem_section)=16
OFFSET(mem_section.section_mem_map)=0
NUMBER(SECTION_SIZE_BITS)=27
NUMBER(MAX_PHYSMEM_BITS)=46
SIZE(page)=64
OFFSET(page.flags)=0
OFFSET(page._refcount)=52
OFFSET(page._mapcount)=48
LENGTH(zone.free_area)=11
NUMBER(PG_lru)=4
NUMBER(PG_head_mask)=65536
NUMBER(PAGE_BUDDY_MAPCOUNT_VALUE)=-129
NUMBER(phys_base)=-14680064
SYMBOL(init_top_pgt)=ffffffffb380a000
NUMBER(pgtable_l5_enabled)=0
KERNELOFFSET=30e00000
NUMBER(KERNEL_IMAGE_SIZE)=1073741824
NUMBER(sme_mask)=0
";

fn parse_err(text: &str) -> String {
    VmcoreInfo::parse(text.as_bytes())
        .expect_err(text)
        .to_string()
}

#[test]
fn parses_each_family_with_its_radix() {
    let v = VmcoreInfo::parse(SAMPLE.as_bytes()).unwrap();
    assert_eq!(v.osrelease, "6.1.0-27-amd64");
    assert_eq!(v.page_size, 4096);
    assert_eq!(v.kernel_offset, Some(0x30e0_0000));
    assert_eq!(v.symbol("init_top_pgt"), Some(0xffff_ffff_b380_a000));
    assert_eq!(v.symbol("nope"), None);
    assert_eq!(v.offset("page", "_mapcount"), Some(48));
    assert_eq!(v.offset("uts_namespace", "name"), Some(0));
    assert_eq!(v.size("page"), Some(64));
    assert_eq!(v.length("mem_section"), Some(2048));
    assert_eq!(v.length("zone.free_area"), Some(11));
    assert_eq!(v.number("PAGE_BUDDY_MAPCOUNT_VALUE"), Some(-129));
    assert_eq!(v.number("PG_head_mask"), Some(65536));
    // phys_base below the link address prints negative; the u64 wraps so that
    // `vaddr - __START_KERNEL_map + phys_base` works with wrapping arithmetic.
    assert_eq!(v.phys_base, Some((-14680064i64) as u64));
    assert_eq!(
        v.raw["BUILD-ID"],
        "4d5f1cd4c2c7ac2e3d2dcb3b8a2b0b8fa3f4e1d2"
    );
    assert_eq!(v.raw["SYMBOL(init_top_pgt)"], "ffffffffb380a000");
    assert_eq!(v.raw.len(), SAMPLE.lines().count());
    assert_eq!(v.text, SAMPLE);
}

#[test]
fn number_accepts_the_hex_form_some_arches_print() {
    let t = "OSRELEASE=6.1\nPAGESIZE=4096\nNUMBER(kimage_voffset)=0xffff800008000000\n";
    let v = VmcoreInfo::parse(t.as_bytes()).unwrap();
    assert_eq!(
        v.number("kimage_voffset"),
        Some(0xffff_8000_0800_0000u64 as i64)
    );
    assert_eq!(v.phys_base, None);
    assert_eq!(v.kernel_offset, None);
}

#[test]
fn trailing_nul_padding_is_tolerated_but_not_inner_nul() {
    let mut padded = SAMPLE.as_bytes().to_vec();
    padded.extend_from_slice(&[0, 0, 0]);
    assert!(VmcoreInfo::parse(&padded).is_ok());
    let e = VmcoreInfo::parse(b"OSRELEASE=6.1\0\nPAGESIZE=4096\n").unwrap_err();
    assert_eq!(
        e.to_string(),
        "VMCOREINFO text contains a NUL byte at byte 13"
    );
}

#[test]
fn malformed_text_gives_a_clear_error() {
    let ok = "OSRELEASE=6.1\nPAGESIZE=4096\n";
    let cases: &[(&str, &str)] = &[
        ("", "empty"),
        ("\n\n", "line"), // no lines with content: no OSRELEASE
        ("OSRELEASE=6.1\nPAGESIZE 4096\n", "line 2 has no '='"),
        (
            "OSRELEASE=6.1\nPAGESIZE=4096\nOSRELEASE=6.2\n",
            "OSRELEASE appears twice (lines 1 and 3)",
        ),
        ("OSRELEASE=6.1\n", "no PAGESIZE line"),
        ("PAGESIZE=4096\n", "no OSRELEASE line"),
        ("OSRELEASE=6.1\nPAGESIZE=4k\n", "PAGESIZE has a bad value"),
        ("OSRELEASE=6.1\nPAGESIZE=4095\n", "power of two"),
        ("OSRELEASE=6.1\nPAGESIZE=0\n", "power of two"),
        ("=x\nOSRELEASE=6.1\nPAGESIZE=4096\n", "malformed key"),
        ("SYM BOL=x\nOSRELEASE=6.1\nPAGESIZE=4096\n", "malformed key"),
    ];
    for (text, want) in cases {
        let msg = parse_err(text);
        assert!(msg.contains(want), "{text:?}: {msg}");
    }
    let bad_lines: &[(&str, &str)] = &[
        ("SYMBOL(init_top_pgt)=ffffffffz380a000", "expected hex"),
        ("SYMBOL(init_top_pgt)=", "expected hex"),
        ("SYMBOL(x)=1ffffffffffffffff", "fits 64 bits"),
        ("KERNELOFFSET=-1", "expected hex"),
        ("SIZE(page)=-64", "unsigned decimal"),
        ("SIZE(page)=0x40", "unsigned decimal"),
        ("OFFSET(page.flags)= 0", "unsigned decimal"),
        ("LENGTH(mem_section)=99999999999999999999", "fits 64 bits"),
        ("NUMBER(PG_lru)=4x", "decimal or 0x-prefixed hex"),
        ("NUMBER(PG_lru)=--4", "decimal or 0x-prefixed hex"),
        ("NUMBER(PG_lru)=0x", "decimal or 0x-prefixed hex"),
        ("NUMBER(PG_lru)=9223372036854775808", "fits 64 bits"),
        ("SYMBOL(init_top_pgt=1", "malformed key"),
        ("SYMBOL()=1", "malformed key"),
        ("SIZE((page))=1", "malformed key"),
        ("OFFSET(page)=1", "malformed key"),
        ("OFFSET(.flags)=1", "malformed key"),
        ("OFFSET(page.)=1", "malformed key"),
    ];
    for (line, want) in bad_lines {
        let text = format!("{ok}{line}\n");
        let msg = parse_err(&text);
        assert!(msg.contains(want), "{line:?}: {msg}");
    }
    let e = VmcoreInfo::parse(b"OSRELEASE=6.1\xff\nPAGESIZE=4096\n").unwrap_err();
    assert_eq!(e.to_string(), "VMCOREINFO text is not UTF-8 at byte 13");
    // Unknown keys and values containing '=' are fine.
    let v = VmcoreInfo::parse(format!("{ok}CONFIG_X86=y\nWEIRD=a=b\n").as_bytes()).unwrap();
    assert_eq!(v.raw["WEIRD"], "a=b");
}

#[test]
fn note_round_trip() {
    let note = encode_note(SAMPLE.as_bytes());
    assert_eq!(note.len() % 4, 0);
    assert_eq!(&note[12..24], b"VMCOREINFO\0\0");
    let desc = parse_note(&note).unwrap();
    assert_eq!(desc, SAMPLE.as_bytes());
}

#[test]
fn malformed_notes_are_refused() {
    let good = encode_note(SAMPLE.as_bytes());
    // Every truncation fails cleanly.
    for cut in 0..PREFIX_LEN + SAMPLE.len() {
        let e = parse_note(&good[..cut]).unwrap_err();
        assert!(
            matches!(e, VmcoreinfoError::Truncated { .. }),
            "cut {cut}: {e}"
        );
    }
    let with = |at: usize, bytes: &[u8]| {
        let mut n = good.clone();
        n[at..at + bytes.len()].copy_from_slice(bytes);
        parse_note(&n).map(|_| ()).unwrap_err().to_string()
    };
    assert_eq!(
        with(0, &12u32.to_le_bytes()),
        "VMCOREINFO note name size is 12, expected 11"
    );
    assert_eq!(
        with(8, &1u32.to_le_bytes()),
        "VMCOREINFO note type is 1, expected 0"
    );
    assert!(with(12, b"VMCOREINFX").contains("not \"VMCOREINFO\""));
    // The kernel's rodata "VMCOREINFO\0OSRELEASE=%s\n": the byte after the NUL is 'O'.
    assert!(with(23, b"O").contains("NUL padding"));
    assert_eq!(
        with(4, &(MAX_DESC_SIZE + 1).to_le_bytes()),
        "VMCOREINFO text size 65537 exceeds the 65536-byte limit"
    );
    assert_eq!(
        with(4, &u32::MAX.to_le_bytes()),
        "VMCOREINFO text size 4294967295 exceeds the 65536-byte limit"
    );
    assert_eq!(with(4, &0u32.to_le_bytes()), "VMCOREINFO text is empty");
    let e = with(4, &((SAMPLE.len() + 100) as u32).to_le_bytes());
    assert!(e.contains("truncated"), "{e}");
}

const PREFIX_LEN: usize = 24;

#[test]
fn random_bytes_never_panic() {
    let mut rng = fastrand::Rng::with_seed(0x5eed_cafe);
    let good = encode_note(SAMPLE.as_bytes());
    for i in 0..20_000 {
        let input: Vec<u8> = if i % 2 == 0 {
            let len = rng.usize(0..300);
            let mut v: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
            if i % 4 == 0 && v.len() >= 24 {
                // Keep a valid prefix so the text parser sees random bytes too.
                v[..24].copy_from_slice(&good[..24]);
                let descsz = (v.len() - 24) as u32;
                v[4..8].copy_from_slice(&descsz.to_le_bytes());
            }
            v
        } else {
            // Mutations of a valid note: byte flips, inserted '=', '(' and newlines.
            let mut v = good.clone();
            for _ in 0..rng.usize(1..8) {
                let at = rng.usize(..v.len());
                v[at] = *rng.choice(b"=()\n\0x0-9.\xff".iter()).unwrap();
            }
            v
        };
        if let Ok(desc) = parse_note(&input) {
            let _ = VmcoreInfo::parse(desc);
        }
        let _ = VmcoreInfo::parse(&input);
    }
}

#[test]
fn sysfs_contents() {
    assert_eq!(
        parse_sysfs_vmcoreinfo("0x0000000006c3f000 1024\n").unwrap(),
        (0x6c3f000, 0x1024)
    );
    assert_eq!(
        parse_sysfs_vmcoreinfo("6c3f000 0x1024").unwrap(),
        (0x6c3f000, 0x1024)
    );
    for bad in [
        "",
        "0x1000",
        "0x1000 10 7",
        "zz 10",
        "0x 10",
        "0x1000 -1",
        "0x1000 1ffffffffffffffff",
    ] {
        let e = parse_sysfs_vmcoreinfo(bad).unwrap_err();
        assert!(
            e.to_string().contains("malformed /sys/kernel/vmcoreinfo"),
            "{bad:?}: {e}"
        );
    }
}
