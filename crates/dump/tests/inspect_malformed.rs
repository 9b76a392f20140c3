//! `inspect` on damaged dumps: truncated at every part, wrong magic, wrong
//! version, oversized fields. Damage in headers is an error naming the
//! field; missing page data is a readable dump that says what is missing.

use crate::common;

use std::path::{Path, PathBuf};

use common::*;
use rebound_dump::{inspect, Compress, DumpOptions, Dumper, Format};
use rebound_guestmem::vmcoreinfo::encode_note;
use rebound_guestmem::{GuestMemory, Layout};

/// A 16 MiB guest with data in its first 2 MiB, dumped as `format`.
fn dump(dir: &Path, format: Format) -> PathBuf {
    let (_ram_dir, ram) = sparse_ram(Some("/dev/shm"), 16 * MIB);
    let text = vmcoreinfo_text("6.1.0-malformed", 0x1e00000);
    write_at(&ram, 8 * MIB, &encode_note(text.as_bytes()));
    for pfn in 0..512 {
        write_at(&ram, pfn * 4096, &page_pattern(pfn));
    }
    let mem = GuestMemory::open_ram_file(&ram, Layout::pc(16 * MIB).unwrap()).unwrap();
    let out = dir.join(format!("{format:?}").replace(' ', ""));
    let opts = DumpOptions {
        format,
        chunk_bytes: 4 * MIB,
        threads: 2,
        batch_fsync: 1,
    };
    Dumper::new(&mem)
        .vmcoreinfo(&text)
        .write(&out, &opts, &mut ())
        .unwrap();
    out
}

/// A damaged copy of `src`: `edit` changes its bytes.
fn damaged(src: &Path, name: &str, edit: impl FnOnce(&mut Vec<u8>)) -> PathBuf {
    let mut b = std::fs::read(src).unwrap();
    edit(&mut b);
    let p = src.with_file_name(name);
    std::fs::write(&p, b).unwrap();
    p
}

fn err_chain(p: &Path) -> String {
    let e = inspect(p).unwrap_err();
    let mut s = e.to_string();
    let mut src = std::error::Error::source(&e);
    while let Some(x) = src {
        s.push_str(&format!(": {x}"));
        src = x.source();
    }
    s
}

/// A named damage and what the error must say.
type Case = (&'static str, Box<dyn FnOnce(&mut Vec<u8>)>, &'static str);

/// Each damaged copy of `good` is refused with its message.
fn check_errors(good: &Path, cases: Vec<Case>) {
    for (name, edit, want) in cases {
        let p = damaged(good, name, edit);
        let e = err_chain(&p);
        assert!(e.contains(want), "{name}: {want:?} not in {e:?}");
    }
}

fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

#[test]
fn damaged_kdump_headers_are_errors_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let good = dump(dir.path(), Format::kdump(Compress::Zstd));
    let info = inspect(&good).unwrap();
    assert!(info.complete, "{:?}", info.problems);
    assert_eq!(info.osrelease.as_deref(), Some("6.1.0-malformed"));
    let len = std::fs::metadata(&good).unwrap().len() as usize;
    let cases: Vec<Case> = vec![
        ("empty", Box::new(|b| b.clear()), "is not a vmcore"),
        (
            "magic",
            Box::new(|b| b[..8].copy_from_slice(b"KDUMPX  ")),
            "is not a vmcore: it starts with",
        ),
        (
            "header",
            Box::new(|b| b.truncate(300)),
            "truncated: the header needs bytes up to 0x1d0",
        ),
        (
            "sub header",
            Box::new(|b| b.truncate(4096 + 50)),
            "truncated: the sub header",
        ),
        (
            "bitmaps",
            Box::new(|b| b.truncate(3 * 4096 + 10)),
            "truncated: the bitmaps",
        ),
        (
            "version",
            Box::new(|b| put32(b, 8, 5)),
            "kdump header version 5 is not supported (this reader knows version 6)",
        ),
        (
            "block size",
            Box::new(|b| put32(b, 428, 1 << 20)),
            "block_size = 0x100000 is out of range",
        ),
        (
            "odd block size",
            Box::new(|b| put32(b, 428, 5000)),
            "block_size = 0x1388",
        ),
        (
            "sub_hdr_size",
            Box::new(|b| put32(b, 432, 0x7fff_ffff)),
            "sub_hdr_size = 0x7fffffff",
        ),
        (
            "bitmap_blocks",
            Box::new(|b| put32(b, 436, u32::MAX - 1)),
            "bitmap_blocks = 0xfffffffe",
        ),
        (
            "bitmap too small",
            Box::new(|b| put32(b, 436, 0)),
            "bitmap_blocks = 0x0",
        ),
        (
            "max_mapnr",
            Box::new(|b| put64(b, 4096 + 96, 1 << 50)),
            "max_mapnr_64 = 0x4000000000000",
        ),
        (
            "offset_note",
            Box::new(|b| put64(b, 4096 + 48, 1 << 40)),
            "offset_note = 0x10000000000",
        ),
        (
            "size_vmcoreinfo",
            Box::new(|b| put64(b, 4096 + 40, u64::MAX)),
            "offset_vmcoreinfo",
        ),
        ("split", Box::new(|b| put32(b, 4096 + 12, 1)), "split = 0x1"),
        (
            "note size",
            Box::new(|b| put32(b, 4096 + 104 + 4, 1 << 30)),
            "malformed notes: note at byte 0 of the notes segment runs past its end",
        ),
    ];
    check_errors(&good, cases);
    // Cut inside the page data: readable, incomplete, the lost pages named.
    let p = damaged(&good, "data", |b| b.truncate(len - 100 * 1024));
    let i = inspect(&p).unwrap();
    assert!(!i.complete && !i.missing.is_empty(), "{i:?}");
    assert!(i.missing[0].start < 2 * MIB, "{:x?}", i.missing);
    assert!(i.problems[0].contains("bytes of dumped guest RAM are not in the file"));
    // A descriptor claiming a page larger than a block.
    let desc_at = {
        let b = std::fs::read(&good).unwrap();
        let sub = u32::from_le_bytes(b[432..436].try_into().unwrap()) as usize;
        let bitmaps = u32::from_le_bytes(b[436..440].try_into().unwrap()) as usize;
        4096 * (1 + sub + bitmaps)
    };
    let p = damaged(&good, "desc", |b| put32(b, desc_at + 8, 9000));
    let i = inspect(&p).unwrap();
    assert!(!i.complete);
    assert_eq!(
        i.problems,
        vec!["1 page descriptors have an impossible size"]
    );
    // The descriptors themselves cut short: with them went all page data
    // (it follows them), so every page is missing, and said to be.
    let p = damaged(&good, "descs", |b| b.truncate(desc_at + 24 * 10 + 5));
    let i = inspect(&p).unwrap();
    assert_eq!(i.missing, vec![0..16 * MIB]);
}

#[test]
fn damaged_elf_dumps_are_errors_or_say_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let good = dump(dir.path(), Format::Elf);
    assert!(inspect(&good).unwrap().complete);
    let cases: Vec<Case> = vec![
        (
            "magic",
            Box::new(|b| b[0] = 0),
            "is not a vmcore: it starts with [00, 45, 4c, 46",
        ),
        (
            "header",
            Box::new(|b| b.truncate(60)),
            "truncated: the ELF header",
        ),
        (
            "phdrs",
            Box::new(|b| b.truncate(64 + 56 + 20)),
            "truncated: the program headers",
        ),
        (
            "version",
            Box::new(|b| b[6] = 9),
            "unsupported ELF file: version 9/1",
        ),
        (
            "phnum",
            // The table now runs into the notes and the data: garbage fields.
            Box::new(|b| b[56..58].copy_from_slice(&0xfffeu16.to_le_bytes())),
            "is out of range",
        ),
        (
            "note size",
            Box::new(|b| put64(b, 64 + 32, 1 << 40)),
            "exceeds the 16777216-byte limit",
        ),
        (
            "note past the end",
            Box::new(|b| put64(b, 64 + 8, 1 << 40)),
            "truncated: PT_NOTE",
        ),
        (
            "filesz > memsz",
            Box::new(|b| put64(b, 64 + 56 + 32, 1 << 40)),
            "PT_LOAD p_filesz/p_memsz",
        ),
    ];
    check_errors(&good, cases);
    // Cut inside the data: what is left is readable, the rest is named.
    let p = damaged(&good, "data", |b| b.truncate(b.len() - 3 * MIB as usize));
    let i = inspect(&p).unwrap();
    assert!(!i.complete);
    assert_eq!(i.missing, vec![13 * MIB..16 * MIB]);
    assert_eq!(i.osrelease.as_deref(), Some("6.1.0-malformed"));
}

/// Found by the `dump_header` fuzz target: a page descriptor whose offset plus size
/// passes the end of u64 overflowed the reader's bounds check (a panic with overflow
/// checks; without them, a read at an absurd offset). It is a page the dump does not
/// hold, as one past the end of the file is.
#[test]
fn a_kdump_page_descriptor_past_the_end_of_u64_is_a_page_not_held() {
    use rebound_dump::kdump::read_kdump;
    use rebound_dump::DumpPages;
    let dir = tempfile::tempdir().unwrap();
    let good = dump(dir.path(), Format::kdump(Compress::Zstd));
    let desc = read_kdump(&std::fs::File::open(&good).unwrap())
        .unwrap()
        .layout
        .desc_offset() as usize;
    let mut page = vec![0u8; 4096];
    assert!(DumpPages::open(&good)
        .unwrap()
        .read_page(0, &mut page)
        .unwrap());
    assert_eq!(page, page_pattern(0));
    let p = damaged(&good, "desc-offset", |b| put64(b, desc, u64::MAX - 8));
    let pages = DumpPages::open(&p).unwrap();
    assert!(
        !pages.read_page(0, &mut page).unwrap(),
        "page 0 is not in the file"
    );
    assert!(pages.read_page(1, &mut page).unwrap());
    assert_eq!(page, page_pattern(1));
}
