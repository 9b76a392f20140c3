//! Dumps of synthetic guest RAM (sparse files holding a VMCOREINFO note and
//! page patterns), read back by Debian's crash and by our own page reader.
//! Fails, saying how to install it, when crash is missing.
#![allow(clippy::single_range_in_vec_init)] // ranges of addresses

use crate::common;

use std::ops::Range;
use std::path::{Path, PathBuf};

use common::*;
use rebound_dump::inspect::DumpKind;
use rebound_dump::{
    inspect, Compress, DumpError, DumpOptions, Dumper, Format, PfnBitmap, Progress,
};
use rebound_guestmem::vmcoreinfo::encode_note;
use rebound_guestmem::{GuestMemory, Layout};

const RELEASE: &str = "6.1.0-99-rebound-test";

/// A guest with `low` MiB below 4 GiB and `high` MiB above: the VMCOREINFO
/// note at 20 MiB, patterned pages in a few places, zeros elsewhere.
struct Ram {
    _dir: tempfile::TempDir,
    path: PathBuf,
    layout: Layout,
    text: String,
    /// Pages holding a pattern.
    patterned: Vec<u64>,
}

fn ram(low: u64, high: u64) -> Ram {
    let (dir, path) = sparse_ram(Some("/dev/shm"), (low + high) * MIB);
    let layout = Layout::with_below_4g((low + high) * MIB, low * MIB).unwrap();
    let text = vmcoreinfo_text(RELEASE, 0x1e00000);
    let note_gpa = 20 * MIB;
    write_at(&path, note_gpa, &encode_note(text.as_bytes()));
    let mut patterned = Vec::new();
    let mut put = |gpa: u64| {
        let off = layout.gpa_to_offset(gpa).unwrap();
        write_at(&path, off, &page_pattern(gpa / 4096));
        patterned.push(gpa / 4096);
    };
    for gpa in (0..MIB).step_by(4096) {
        put(gpa); // the first MiB, all patterned
    }
    for gpa in (3 * MIB..3 * MIB + 600 * 4096).step_by(4096) {
        put(gpa);
    }
    put(low * MIB - 4096); // last page below the hole
    if high > 0 {
        for gpa in (4 * GIB..4 * GIB + 64 * 4096).step_by(4096) {
            put(gpa);
        }
        put(4 * GIB + high * MIB - 4096);
    }
    Ram {
        _dir: dir,
        path,
        layout,
        text,
        patterned,
    }
}

#[derive(Default)]
struct Log {
    advanced: Vec<(u64, u64)>,
    durable: Vec<Range<u64>>,
}

impl Progress for Log {
    fn advanced(&mut self, covered: u64, written: u64) {
        self.advanced.push((covered, written));
    }
    fn durable(&mut self, gpa: Range<u64>) {
        self.durable.push(gpa);
    }
}

fn formats() -> Vec<Format> {
    vec![
        Format::Elf,
        Format::kdump(Compress::None),
        Format::kdump(Compress::Zlib),
        Format::kdump(Compress::Zstd),
        Format::kdump(Compress::Lzo),
    ]
}

fn opts(format: Format, chunk_mib: u64, threads: usize, batch: usize) -> DumpOptions {
    DumpOptions {
        format,
        chunk_bytes: chunk_mib * MIB,
        threads,
        batch_fsync: batch,
    }
}

/// Every page of every RAM range reads back from the dump as it is in RAM
/// (`dropped` pages: absent, or zero inside an ELF segment).
fn check_contents(r: &Ram, dump: &Path, dropped: &dyn Fn(u64) -> bool) {
    let mem = GuestMemory::open_ram_file(&r.path, r.layout).unwrap();
    let mut checked = 0;
    for range in r.layout.ranges() {
        for gpa in range.gpa_range().step_by(4096) {
            let got = dump_page(dump, gpa);
            if dropped(gpa / 4096) {
                assert!(
                    got.as_ref().is_none_or(|p| p.iter().all(|&b| b == 0)),
                    "{}: filtered page {gpa:#x} has data",
                    dump.display()
                );
                continue;
            }
            let want = mem.read_vec(gpa, 4096).unwrap();
            assert!(
                got.as_deref() == Some(&want[..]),
                "{}: page {gpa:#x} differs",
                dump.display()
            );
            checked += 1;
        }
    }
    assert!(checked > 1000);
}

#[test]
fn elf_and_kdump_dumps_are_read_by_crash_and_hold_every_page() {
    let r = ram(64, 16);
    let mem = GuestMemory::open_ram_file(&r.path, r.layout).unwrap();
    let out_dir = tempfile::tempdir().unwrap();
    for (i, format) in formats().into_iter().enumerate() {
        let out = out_dir.path().join(format!("vmcore-{i}"));
        let mut log = Log::default();
        let report = Dumper::new(&mem)
            .vmcoreinfo(&r.text)
            .write(&out, &opts(format, 4, 3, 2), &mut log)
            .unwrap();
        let what = format!("{format:?}");
        assert_eq!(report.ram_bytes, 80 * MIB, "{what}");
        assert_eq!(report.pages_dumped, 80 * MIB / 4096);
        assert!(report.vmcoreinfo && !report.filtered);
        assert_eq!(
            report.warnings,
            vec!["no NT_PRSTATUS notes: the dump has no CPU registers".to_string()]
        );
        // Only the note's page and the patterned ones hold data.
        assert_eq!(
            report.zero_pages,
            report.pages_dumped - r.patterned.len() as u64 - 1,
            "{what}"
        );
        assert_eq!(mode(&out), 0o600, "{what}");
        assert!(!rebound_dump::write::partial_path(&out).exists());

        // Durability reports: every chunk once, in GPA order, after a flush.
        let total: u64 = log.durable.iter().map(|g| g.end - g.start).sum();
        assert_eq!(total, 80 * MIB, "{what}");
        assert_eq!(log.durable.len(), 16 + 4, "{what}: 4 MiB chunks");
        assert!(log.durable.windows(2).all(|w| w[0].end <= w[1].start));
        assert_eq!(log.durable.last().unwrap().end, 4 * GIB + 16 * MIB);
        assert_eq!(log.advanced.last().unwrap().0, 80 * MIB);
        assert!(log.advanced.windows(2).all(|w| w[0] <= w[1]));

        let info = inspect(&out).unwrap();
        assert!(info.complete, "{what}: {:?}", info.problems);
        assert_eq!(info.osrelease.as_deref(), Some(RELEASE));
        assert_eq!(info.ram, vec![0..64 * MIB, 4 * GIB..4 * GIB + 16 * MIB]);
        assert_eq!(info.pages_dumped, 80 * MIB / 4096);
        let kind = match format {
            Format::Elf => DumpKind::Elf,
            Format::Kdump { compress } => DumpKind::Kdump {
                compression: match compress {
                    Compress::None => "none",
                    Compress::Zlib => "zlib",
                    Compress::Lzo => "lzo",
                    _ => "zstd",
                },
            },
        };
        assert_eq!(info.kind, kind);

        assert_eq!(crash_osrelease(&out), RELEASE, "{what}");
        check_contents(&r, &out, &|_| false);
        if format != Format::Elf {
            assert!(
                report.file_bytes < 8 * MIB,
                "{what}: {} bytes for 3 MiB of data",
                report.file_bytes
            );
        }
    }
}

#[test]
fn the_elf_file_does_not_depend_on_threads_chunks_or_batches() {
    let r = ram(32, 0);
    let mem = GuestMemory::open_ram_file(&r.path, r.layout).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for (i, (chunk, threads, batch)) in [(1, 1, 1), (2, 4, 3), (32, 2, 1), (3, 3, 100)]
        .into_iter()
        .enumerate()
    {
        let out = dir.path().join(format!("e{i}"));
        Dumper::new(&mem)
            .vmcoreinfo(&r.text)
            .write(&out, &opts(Format::Elf, chunk, threads, batch), &mut ())
            .unwrap();
        files.push(std::fs::read(&out).unwrap());
    }
    assert!(files.windows(2).all(|w| w[0] == w[1]));
}

#[test]
fn filtered_pages_are_left_out_the_way_makedumpfile_leaves_them_out() {
    let r = ram(64, 0);
    let mem = GuestMemory::open_ram_file(&r.path, r.layout).unwrap();
    // Drop 10 pages inside the first MiB (a short gap: stays inside a
    // segment, reads as zeros) and 300 patterned pages at 3 MiB (a long gap:
    // a new segment starts after it).
    let mut filter = PfnBitmap::all_kept(64 * MIB / 4096, 16);
    let dropped = |pfn: u64| (100..110).contains(&pfn) || (768..1068).contains(&pfn);
    for pfn in 0..64 * MIB / 4096 {
        if dropped(pfn) {
            filter.set(pfn, false);
        }
    }
    let dir = tempfile::tempdir().unwrap();
    for (i, format) in formats().into_iter().enumerate() {
        let out = dir.path().join(format!("f{i}"));
        let report = Dumper::new(&mem)
            .vmcoreinfo(&r.text)
            .filter(&filter)
            .write(&out, &opts(format, 8, 2, 1), &mut ())
            .unwrap();
        assert!(report.filtered);
        assert_eq!(report.pages_excluded, 310, "{format:?}");
        let info = inspect(&out).unwrap();
        assert!(info.complete, "{:?}", info.problems);
        assert_eq!(info.ram, vec![0..64 * MIB]);
        match format {
            // The 10-page gap stays in the file (as zeros): 300 fewer pages.
            Format::Elf => assert_eq!(info.pages_dumped, 64 * MIB / 4096 - 300),
            _ => assert_eq!(info.pages_dumped, 64 * MIB / 4096 - 310),
        }
        assert_eq!(crash_osrelease(&out), RELEASE);
        check_contents(&r, &out, &dropped);
    }
}

#[test]
fn without_vmcoreinfo_the_dump_is_unfiltered_and_says_so() {
    let r = ram(16, 0);
    let mem = GuestMemory::open_ram_file(&r.path, r.layout).unwrap();
    let filter = PfnBitmap::all_kept(0, 16); // would keep everything anyway
    let dir = tempfile::tempdir().unwrap();
    for (i, format) in formats().into_iter().enumerate() {
        let out = dir.path().join(format!("n{i}"));
        let report = Dumper::new(&mem)
            .filter(&filter)
            .write(&out, &opts(format, 4, 2, 1), &mut ())
            .unwrap();
        assert!(!report.vmcoreinfo && !report.filtered);
        let w = report.warnings.join("\n");
        assert!(w.contains("the page filter was not applied"), "{w}");
        assert!(w.contains("no VMCOREINFO note"), "{w}");
        let info = inspect(&out).unwrap();
        assert!(info.complete && !info.vmcoreinfo && info.osrelease.is_none());
        check_contents(&r, &out, &|_| false);
    }
}

/// Makes guest RAM unreadable (the file shrinks) after the `n`th durable chunk.
struct CutAfter {
    n: usize,
    ram: PathBuf,
    durable: Vec<Range<u64>>,
}

impl Progress for CutAfter {
    fn durable(&mut self, gpa: Range<u64>) {
        self.durable.push(gpa);
        if self.durable.len() == self.n {
            std::fs::File::options()
                .write(true)
                .open(&self.ram)
                .unwrap()
                .set_len(0)
                .unwrap();
        }
    }
}

#[test]
fn a_dump_that_stops_stays_partial_and_says_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    for (i, format) in formats().into_iter().enumerate() {
        let r = ram(64, 0);
        // Data in every chunk, so every chunk needs a read.
        for chunk in 0..16 {
            write_at(&r.path, chunk * 4 * MIB + 8192, &page_pattern(chunk));
        }
        let mem = GuestMemory::open_ram_file(&r.path, r.layout).unwrap();
        let out = dir.path().join(format!("p{i}"));
        let mut cut = CutAfter {
            n: 1,
            ram: r.path.clone(),
            durable: Vec::new(),
        };
        let e = Dumper::new(&mem)
            .vmcoreinfo(&r.text)
            .write(&out, &opts(format, 4, 1, 1), &mut cut)
            .unwrap_err();
        let msg = e.to_string();
        let partial = rebound_dump::write::partial_path(&out);
        let DumpError::Stopped { durable, total, .. } = e else {
            panic!("{format:?}: {msg}");
        };
        // Workers read at most 2 chunks ahead of the writer, and flushes run
        // one batch behind it: the dump stops within a few chunks of the cut.
        let reported: u64 = cut.durable.iter().map(|g| g.end - g.start).sum();
        assert_eq!(durable, reported, "{msg}");
        assert!((4 * MIB..=32 * MIB).contains(&durable), "{msg}");
        assert_eq!(total, 64 * MIB);
        assert!(
            msg.contains(&format!(
                "{} holds {durable:#x} of 0x4000000 bytes of guest RAM durably; missing: everything from GPA {durable:#x} on",
                partial.display()
            )),
            "{msg}"
        );
        assert!(
            !out.exists(),
            "{format:?}: a stopped dump got the final name"
        );
        assert_eq!(mode(&partial), 0o600);
        let info = inspect(&partial).unwrap();
        assert!(!info.complete);
        assert!(
            info.problems.iter().any(|p| p.contains(".partial")),
            "{:?}",
            info.problems
        );
        // What was reported durable is in the file; the rest is reported missing.
        let first_missing = info.missing.first().expect("missing ranges").start;
        assert!(first_missing >= durable, "{format:?}: {first_missing:#x}");
        assert_eq!(info.missing.last().unwrap().end, 64 * MIB, "{format:?}");
        assert_eq!(crash_osrelease(&partial), RELEASE, "{format:?}");
        if let Format::Kdump { .. } = format {
            assert!(info
                .problems
                .iter()
                .any(|p| p.contains("DUMP_DH_COMPRESSED_INCOMPLETE")));
        }
    }
}

#[test]
fn lz4_and_bad_options_are_refused() {
    let r = ram(8, 0);
    let mem = GuestMemory::open_ram_file(&r.path, r.layout).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x");
    let lz4 = Format::kdump(Compress::Lz4);
    let e = Dumper::new(&mem)
        .write(&out, &opts(lz4, 4, 1, 1), &mut ())
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "lz4 is not a kdump page compression: crash 8.0.2 and makedumpfile 1.7.2 read only zlib, lzo, snappy and zstd pages"
    );
    let mut o = opts(Format::Elf, 4, 1, 1);
    o.chunk_bytes = 5000;
    let e = Dumper::new(&mem).write(&out, &o, &mut ()).unwrap_err();
    assert!(e.to_string().contains("chunk_bytes 5000"), "{e}");
    o.chunk_bytes = MIB;
    o.batch_fsync = 0;
    let e = Dumper::new(&mem).write(&out, &o, &mut ()).unwrap_err();
    assert!(e.to_string().contains("batch_fsync"), "{e}");
    assert!(!out.exists() && !rebound_dump::write::partial_path(&out).exists());
}

#[test]
fn a_dump_never_replaces_a_file_at_its_path() {
    let r = ram(8, 0);
    let mem = GuestMemory::open_ram_file(&r.path, r.layout).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("vmcore");
    // A finished dump is there already: a second dump to that path is refused
    // before it writes anything, and the first stays byte for byte.
    Dumper::new(&mem)
        .vmcoreinfo(&r.text)
        .write(&out, &opts(Format::Elf, 4, 1, 1), &mut ())
        .unwrap();
    let before = std::fs::read(&out).unwrap();
    let e = Dumper::new(&mem)
        .write(&out, &opts(Format::kdump(Compress::Zlib), 4, 1, 1), &mut ())
        .unwrap_err();
    assert!(matches!(e, DumpError::Exists(_)), "{e}");
    assert_eq!(std::fs::read(&out).unwrap(), before);
    assert!(!rebound_dump::write::partial_path(&out).exists());

    // Something appears at the path while a dump is written: the rename does not
    // replace it, and the finished dump stays in the partial file.
    struct Squatter<'a>(&'a Path);
    impl Progress for Squatter<'_> {
        fn renaming(&mut self) {
            std::fs::write(self.0, b"not a dump").unwrap();
        }
    }
    let other = dir.path().join("vmcore2");
    let e = Dumper::new(&mem)
        .vmcoreinfo(&r.text)
        .write(&other, &opts(Format::Elf, 4, 1, 1), &mut Squatter(&other))
        .unwrap_err();
    assert!(matches!(e, DumpError::Stopped { .. }), "{e}");
    assert_eq!(std::fs::read(&other).unwrap(), b"not a dump");
    let partial = rebound_dump::write::partial_path(&other);
    assert_eq!(std::fs::read(&partial).unwrap(), before);
}
