use super::*;

use crate::example::{snapshot_stream as stream, BIOS, MAIN, RAM_ID};

fn why(b: &[u8]) -> String {
    SnapshotStream::parse(b).unwrap_err().to_string()
}

#[test]
fn a_snapshot_stream_reads_apart_into_blocks_pages_and_devices() {
    let b = stream();
    let s = SnapshotStream::parse(&b).unwrap();
    assert_eq!(s.machine, "pc-i440fx-7.2");
    assert_eq!(s.capabilities, ["x-ignore-shared"]);
    assert_eq!(s.ram_section, RAM_ID);
    assert_eq!(
        s.blocks,
        [
            RamBlock {
                name: "pc.ram".into(),
                used_length: MAIN,
                addr: Some(0)
            },
            RamBlock {
                name: "pc.bios".into(),
                used_length: BIOS,
                addr: Some(0xfffc0000)
            }
        ]
    );
    assert_eq!(s.pages.len(), 2);
    let Page::Data(r) = &s.pages[0].page else {
        panic!("{:?}", s.pages[0])
    };
    assert_eq!((s.pages[0].block, s.pages[0].offset), (1, 0x1000));
    assert!(b[r.clone()].iter().all(|&x| x == 0xab) && r.len() == 4096);
    assert_eq!(
        s.pages[1],
        PageRecord {
            block: 1,
            offset: 0x2000,
            page: Page::Fill(0)
        }
    );
    let dev = &b[s.devices.clone()];
    assert_eq!(dev[0], kind::SECTION_FULL);
    assert_eq!(&dev[dev.len() - 5..], &[kind::FOOTER, 0, 0, 0, 4]);
    assert!(b[s.vmdesc.unwrap()].starts_with(b"{\"page_size\""));
}

#[test]
fn a_stream_without_its_description_is_refused_as_cut_short() {
    let mut b = stream();
    let eof = b.iter().rposition(|&x| x == kind::VMDESCRIPTION).unwrap();
    b.truncate(eof);
    assert!(why(&b).contains("no device description"), "{}", why(&b));
}

#[test]
fn every_truncation_is_refused_without_a_panic() {
    let b = stream();
    for n in 0..b.len() {
        assert!(SnapshotStream::parse(&b[..n]).is_err(), "cut at {n}");
    }
}

#[test]
fn wrong_magic_version_and_oversized_fields_are_named() {
    let mut b = stream();
    b[0] = b'X';
    assert!(
        why(&b).contains("not a QEMU migration stream"),
        "{}",
        why(&b)
    );
    let mut b = stream();
    b[7] = 2;
    assert!(why(&b).contains("version 2"), "{}", why(&b));
    // The machine name's length, huge.
    let mut b = stream();
    b[9..13].copy_from_slice(&u32::MAX.to_be_bytes());
    assert!(why(&b).contains("a machine name of"), "{}", why(&b));
    // A capability count no QEMU writes.
    let mut b = stream();
    let at = 9 + 4 + 13 + 1 + 1 + 26 + 4;
    b[at..at + 4].copy_from_slice(&100_000u32.to_be_bytes());
    assert!(why(&b).contains("100000 capabilities"), "{}", why(&b));
    assert!(matches!(
        SnapshotStream::parse(&vec![0; MAX_STREAM + 1]),
        Err(StreamError::TooLarge(_))
    ));
}

/// Finds `pat` in `b` (once).
fn at(b: &[u8], pat: &[u8]) -> usize {
    b.windows(pat.len()).position(|w| w == pat).unwrap()
}

#[test]
fn a_damaged_block_list_or_page_is_refused_with_where_and_why() {
    // A block longer than the list's total.
    let mut b = stream();
    let p = at(&b, b"pc.bios") + 7;
    b[p..p + 8].copy_from_slice(&(1u64 << 40).to_be_bytes());
    assert!(why(&b).contains("block pc.bios of"), "{}", why(&b));
    // A page beyond its block.
    let mut b = stream();
    let p = at(
        &b,
        &(0x2000 | ram_flag::ZERO | ram_flag::CONTINUE).to_be_bytes(),
    );
    b[p..p + 8].copy_from_slice(&(BIOS | ram_flag::ZERO | ram_flag::CONTINUE).to_be_bytes());
    assert!(
        why(&b).contains("a page at 0x40000 of block pc.bios"),
        "{}",
        why(&b)
    );
    // A page of a block the list does not name.
    let mut b = stream();
    let p = at(&b, &(0x1000 | ram_flag::PAGE).to_be_bytes()) + 9;
    b[p + 3] = b'X';
    assert!(why(&b).contains("unlisted block pc.Xios"), "{}", why(&b));
    // Flags this reader does not take (compressed).
    let mut b = stream();
    let p = at(&b, &(0x1000 | ram_flag::PAGE).to_be_bytes());
    b[p..p + 8].copy_from_slice(&(0x1000u64 | 0x100).to_be_bytes());
    assert!(why(&b).contains("only whole and zero pages"), "{}", why(&b));
    // A footer naming another section.
    let mut b = stream();
    let p = at(&b, &[kind::FOOTER, 0, 0, 0, RAM_ID as u8]);
    b[p + 4] = 9;
    assert!(why(&b).contains("footer names section 9"), "{}", why(&b));
    // Block migration's section in place of the RAM section.
    let mut b = stream();
    let p = at(&b, b"\x03ram");
    b[p + 1..p + 4].copy_from_slice(b"blk");
    assert!(why(&b).contains("only the RAM section"), "{}", why(&b));
    // An unknown configuration subsection.
    let mut b = stream();
    let p = at(&b, b"configuration/capabilities");
    b[p + 14] = b'X';
    assert!(
        why(&b).contains("unknown configuration subsection"),
        "{}",
        why(&b)
    );
    // Something other than a device's full section after the RAM section.
    let mut b = stream();
    let p = at(&b, b"\x05timer") - 5;
    b[p] = kind::SECTION_PART;
    assert!(
        why(&b).contains("expected the devices' sections"),
        "{}",
        why(&b)
    );
}
