//! GuestMemory over real sparse RAM files, on ext4 and on tmpfs (/dev/shm).

use crate::common;

use common::*;
use rebound_guestmem::vmcoreinfo::encode_note;
use rebound_guestmem::{find_vmcoreinfo, read_vmcoreinfo, GuestMemory, Layout};

const PARENTS: [Option<&str>; 2] = [None, Some("/dev/shm")];

#[test]
fn five_gib_sparse_file_reads_across_the_pci_hole() {
    for parent in PARENTS {
        let (_dir, path) = sparse_ram(parent, 5 * GIB);
        // 16 bytes straddling the end of low RAM: offset 3G-8 .. 3G+8.
        write_at(&path, 3 * GIB - 8, b"LOW-END!HIGH-BEG");
        write_at(&path, 5 * GIB - 4, b"LAST");
        let mem = GuestMemory::open_ram_file(&path, Layout::pc(5 * GIB).unwrap()).unwrap();
        assert_eq!(mem.read_vec(3 * GIB - 8, 8).unwrap(), b"LOW-END!");
        assert_eq!(mem.read_vec(4 * GIB, 8).unwrap(), b"HIGH-BEG");
        assert_eq!(mem.read_vec(6 * GIB - 4, 4).unwrap(), b"LAST");
        let err = mem.read_vec(3 * GIB - 8, 16).unwrap_err().to_string();
        assert!(
            err.contains("0xc0000000") && err.contains("PCI hole"),
            "{err}"
        );
        let err = mem.read_vec(6 * GIB - 2, 4).unwrap_err().to_string();
        assert!(
            err.contains("0x180000000") && err.contains("past the end"),
            "{err}"
        );

        // Data ranges are GPA ranges: the extent around offset 3G is split at the hole.
        let ranges = mem.data_ranges().unwrap();
        assert!(
            ranges
                .iter()
                .any(|r| r.end == 3 * GIB && r.contains(&(3 * GIB - 8))),
            "{parent:?}: {ranges:x?}"
        );
        assert!(
            ranges.iter().any(|r| r.start == 4 * GIB),
            "{parent:?}: {ranges:x?}"
        );
        assert!(
            ranges.iter().any(|r| r.contains(&(6 * GIB - 1))),
            "{parent:?}: {ranges:x?}"
        );
        assert!(
            ranges
                .iter()
                .all(|r| r.end <= 3 * GIB || r.start >= 4 * GIB),
            "{ranges:x?}"
        );
        // Three touched pages (fs blocks may be larger, never the whole file).
        let used = mem.allocated_bytes().unwrap();
        assert!((12 * 1024..=16 * MIB).contains(&used), "{parent:?}: {used}");
    }
}

#[test]
fn full_scan_keeps_holes_as_holes() {
    for parent in PARENTS {
        let (_dir, path) = sparse_ram(parent, 512 * MIB);
        for i in 0..16u64 {
            write_at(&path, i * 31 * MIB + 4096 * i, &[0xa5; 4096]);
        }
        write_at(
            &path,
            200 * MIB,
            &encode_note(vmcoreinfo_text("6.1.0-test", 0x1e00000).as_bytes()),
        );
        let before = allocated(&path);
        assert!(before < 8 * MIB, "{parent:?}: {before}");

        let mem = GuestMemory::open_ram_file(&path, Layout::pc(512 * MIB).unwrap()).unwrap();
        let found = find_vmcoreinfo(&mem).unwrap();
        assert_eq!(found.paddr, 200 * MIB);
        // Read every data range and some holes, too.
        for r in mem.data_ranges().unwrap() {
            mem.read_vec(r.start, (r.end - r.start) as usize).unwrap();
        }
        assert_eq!(
            mem.read_vec(300 * MIB, 4 * MIB as usize).unwrap(),
            vec![0; 4 << 20]
        );
        assert_eq!(
            allocated(&path),
            before,
            "{parent:?}: the scan allocated holes"
        );

        // The measurement does see allocation: touching one hole page grows it.
        write_at(&path, 400 * MIB, b"x");
        assert!(allocated(&path) > before, "{parent:?}");
    }
}

#[test]
fn scan_skips_the_rodata_format_string_and_finds_the_note_above_4g() {
    let (_dir, path) = sparse_ram(Some("/dev/shm"), 5 * GIB);
    let text = vmcoreinfo_text("6.1.0-27-amd64", 0x30e00000);
    // The kernel's rodata holds "VMCOREINFO\0OSRELEASE=%s\n"; give it even a
    // plausible header (namesz 11, type 0) in front: only the padding differs.
    let mut decoy = Vec::new();
    decoy.extend_from_slice(&11u32.to_le_bytes());
    decoy.extend_from_slice(&64u32.to_le_bytes());
    decoy.extend_from_slice(&0u32.to_le_bytes());
    decoy.extend_from_slice(b"VMCOREINFO\0OSRELEASE=%s\n");
    write_at(&path, 16 * MIB + 0x40, &decoy);
    // A note at offset 3G+2M lives at GPA 4G+2M on a 5G pc guest.
    write_at(&path, 3 * GIB + 2 * MIB, &encode_note(text.as_bytes()));
    let mem = GuestMemory::open_ram_file(&path, Layout::pc(5 * GIB).unwrap()).unwrap();
    let found = find_vmcoreinfo(&mem).unwrap();
    assert_eq!(found.paddr, 4 * GIB + 2 * MIB);
    assert_eq!(found.info.osrelease, "6.1.0-27-amd64");
    assert_eq!(found.info.kernel_offset, Some(0x30e00000));
    assert_eq!(found.info.text, text);
    // The same note read at the address an agent would report.
    let info = read_vmcoreinfo(&mem, found.paddr, 0x1024).unwrap();
    assert_eq!(info, found.info);
    // The decoy at its address is refused with the reason.
    let err = read_vmcoreinfo(&mem, 16 * MIB + 0x40, 0x1024).unwrap_err();
    assert!(err.to_string().contains("NUL padding"), "{err}");
    // An agent's size smaller than the note is refused, not read past.
    let err = read_vmcoreinfo(&mem, found.paddr, 64).unwrap_err();
    assert!(err.to_string().contains("truncated"), "{err}");
}

#[test]
fn note_straddling_a_scan_chunk_is_found() {
    let (_dir, path) = sparse_ram(Some("/dev/shm"), 64 * MIB);
    let text = vmcoreinfo_text("6.1.0-straddle", 0x1000000);
    // Chunks are 4 MiB; put the header 12 bytes before the boundary so the
    // name lies just past it, and fill the whole area so it is one data extent.
    write_at(&path, 0, &vec![0x11; 12 * MIB as usize]);
    for at in [4 * MIB - 12, 8 * MIB - 4000] {
        write_at(&path, at, &encode_note(text.as_bytes()));
    }
    let mem = GuestMemory::open_ram_file(&path, Layout::pc(64 * MIB).unwrap()).unwrap();
    let (found, _) = rebound_guestmem::find_vmcoreinfo_all(&mem).unwrap();
    let addrs: Vec<u64> = found.iter().map(|f| f.paddr).collect();
    assert_eq!(addrs, vec![4 * MIB - 12, 8 * MIB - 4000]);
    // Identical copies are equivalent: the lowest is returned.
    assert_eq!(find_vmcoreinfo(&mem).unwrap().paddr, 4 * MIB - 12);
}

#[test]
fn differing_notes_no_kernel_vouches_for_are_ambiguous() {
    // Neither note comes with page tables or struct pages to tell which
    // kernel is live (boot_guest.rs covers the case where one does).
    let (_dir, path) = sparse_ram(Some("/dev/shm"), 256 * MIB);
    write_at(
        &path,
        0x5800000,
        &encode_note(vmcoreinfo_text("6.1.0-a", 0x4800000).as_bytes()),
    );
    write_at(
        &path,
        0x8200000,
        &encode_note(vmcoreinfo_text("6.1.0-a", 0x7200000).as_bytes()),
    );
    let mem = GuestMemory::open_ram_file(&path, Layout::pc(256 * MIB).unwrap()).unwrap();
    let err = find_vmcoreinfo(&mem).unwrap_err().to_string();
    assert!(err.contains("2 different VMCOREINFO notes"), "{err}");
    assert!(
        err.contains("0x5800000") && err.contains("0x8200000"),
        "{err}"
    );
}

#[test]
fn no_note_is_a_clear_error_counting_rejected_candidates() {
    let (_dir, path) = sparse_ram(Some("/dev/shm"), 64 * MIB);
    let mut bad = encode_note(vmcoreinfo_text("6.1.0-x", 0).as_bytes());
    bad[8] = 1; // type 1
    write_at(&path, 8 * MIB, &bad);
    // The rodata string does not even match the padded name searched for...
    write_at(&path, 9 * MIB + 64, b"VMCOREINFO\0OSRELEASE=%s\n");
    // ...while a padded name after a zero header is a candidate, refused.
    write_at(&path, 10 * MIB + 64, b"VMCOREINFO\0\0OSRELEASE=x\n");
    let mem = GuestMemory::open_ram_file(&path, Layout::pc(64 * MIB).unwrap()).unwrap();
    let err = find_vmcoreinfo(&mem).unwrap_err().to_string();
    assert!(
        err.starts_with("no VMCOREINFO note in guest RAM (2 candidates rejected"),
        "{err}"
    );
    // An empty (all-hole) RAM file has nothing to scan at all.
    let (_dir2, empty) = sparse_ram(Some("/dev/shm"), 64 * MIB);
    let mem = GuestMemory::open_ram_file(&empty, Layout::pc(64 * MIB).unwrap()).unwrap();
    assert_eq!(mem.data_ranges().unwrap(), vec![]);
    let err = find_vmcoreinfo(&mem).unwrap_err().to_string();
    assert!(err.contains("0 candidates"), "{err}");
}

#[test]
fn scanner_survives_random_ram_full_of_fake_notes() {
    let (_dir, path) = sparse_ram(Some("/dev/shm"), 32 * MIB);
    let mut rng = fastrand::Rng::with_seed(0x0bad_5eed);
    let mut ram: Vec<u8> = (0..16 * MIB).map(|_| rng.u8(..)).collect();
    // Plant padded names behind random, half-plausible headers, including
    // text sizes that run past the data and past the end of RAM.
    for _ in 0..2000 {
        let at = rng.usize(..ram.len() - 24) & !3;
        let namesz: u32 = if rng.bool() { 11 } else { rng.u32(..) };
        let n_type: u32 = if rng.bool() { 0 } else { rng.u32(..) };
        let descsz: u32 = match rng.u8(..4) {
            0 => rng.u32(..),
            1 => rng.u32(..70_000),
            _ => rng.u32(..200),
        };
        ram[at..at + 4].copy_from_slice(&namesz.to_le_bytes());
        ram[at + 4..at + 8].copy_from_slice(&descsz.to_le_bytes());
        ram[at + 8..at + 12].copy_from_slice(&n_type.to_le_bytes());
        ram[at + 12..at + 24].copy_from_slice(b"VMCOREINFO\0\0");
    }
    // One at the very end of the data, its text reaching into the hole after it.
    let end = ram.len() - 24;
    ram[end..end + 12].copy_from_slice(&[11, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0]);
    ram[end + 12..].copy_from_slice(b"VMCOREINFO\0\0");
    write_at(&path, 0, &ram);
    let mem = GuestMemory::open_ram_file(&path, Layout::pc(32 * MIB).unwrap()).unwrap();
    let err = find_vmcoreinfo(&mem).unwrap_err().to_string();
    assert!(err.starts_with("no VMCOREINFO note in guest RAM"), "{err}");
    // A real note among them is still found.
    let text = vmcoreinfo_text("6.1.0-fuzz", 0x2000000);
    write_at(&path, 20 * MIB, &encode_note(text.as_bytes()));
    let found = find_vmcoreinfo(&mem).unwrap();
    assert_eq!(
        (found.paddr, found.info.osrelease.as_str()),
        (20 * MIB, "6.1.0-fuzz")
    );
}
