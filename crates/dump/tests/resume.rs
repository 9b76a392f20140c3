//! A dump that stopped part way, after its durable chunks were punched out of the
//! RAM file (as the daemon does for a crashed guest), is finished by a new dump that
//! reads those chunks from the stopped one: the finished dump holds every page of
//! the guest as it was, in every format.

use crate::common;

use std::ops::Range;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use common::*;
use rebound_dump::read::ResumeSource;
use rebound_dump::{inspect, Compress, DumpOptions, DumpPages, Dumper, Format, Progress};
use rebound_guestmem::vmcoreinfo::encode_note;
use rebound_guestmem::{FileSource, GuestMemory, Layout};

/// Punches each durable chunk out of the RAM file, as the daemon does; after `n`
/// chunks the process dies on the spot (no unwinding, no cleanup), as a killed
/// daemon does.
struct PunchThenDie {
    ram: std::fs::File,
    n: usize,
    seen: usize,
}

impl Progress for PunchThenDie {
    fn durable(&mut self, gpa: Range<u64>) {
        // SAFETY: fallocate on a descriptor this struct owns, freeing only the file's
        // blocks of a range the dump holds durably.
        let rc = unsafe {
            libc::fallocate(
                self.ram.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                gpa.start as libc::off_t,
                (gpa.end - gpa.start) as libc::off_t,
            )
        };
        assert_eq!(rc, 0);
        self.seen += 1;
        if self.seen == self.n {
            std::process::exit(DIED);
        }
    }
}

const DIED: i32 = 77;

fn opts(format: Format) -> DumpOptions {
    DumpOptions {
        format,
        chunk_bytes: 4 * MIB,
        threads: 2,
        batch_fsync: 1,
    }
}

fn format_named(name: &str) -> Format {
    match name {
        "elf" => Format::Elf,
        "zstd" => Format::kdump(Compress::Zstd),
        "zlib" => Format::kdump(Compress::Zlib),
        _ => panic!("{name}"),
    }
}

/// Run by the test below in a child process: dumps until it dies.
#[test]
#[ignore = "a child of a_stopped_dump_is_finished_from_its_partial_file_and_what_ram_still_holds"]
fn dump_until_killed() {
    let var = |k: &str| std::env::var(k).unwrap();
    let ram = PathBuf::from(var("RESUME_RAM"));
    let mem = GuestMemory::open_ram_file(&ram, Layout::pc(64 * MIB).unwrap()).unwrap();
    let mut die = PunchThenDie {
        ram: std::fs::OpenOptions::new().write(true).open(&ram).unwrap(),
        n: 5,
        seen: 0,
    };
    let r = Dumper::new(&mem).vmcoreinfo(&var("RESUME_TEXT")).write(
        Path::new(&var("RESUME_OUT")),
        &opts(format_named(&var("RESUME_FORMAT"))),
        &mut die,
    );
    panic!("the dump ended instead of dying: {r:?}");
}

fn guest(dir: &Path) -> (tempfile::TempDir, PathBuf, PathBuf, String) {
    let (ramdir, ram) = sparse_ram(Some("/dev/shm"), 64 * MIB);
    let text = vmcoreinfo_text("6.1.0-99-rebound-test", 0x1e00000);
    write_at(&ram, 20 * MIB, &encode_note(text.as_bytes()));
    // Data in every chunk, some pages zero.
    for pfn in (0..64 * MIB / 4096).filter(|p| p % 3 != 0) {
        write_at(&ram, pfn * 4096, &page_pattern(pfn));
    }
    let copy = dir.join("original");
    std::fs::copy(&ram, &copy).unwrap();
    (ramdir, ram, copy, text)
}

#[test]
fn a_stopped_dump_is_finished_from_its_partial_file_and_what_ram_still_holds() {
    let dir = tempfile::tempdir().unwrap();
    let layout = Layout::pc(64 * MIB).unwrap();
    for (i, name) in ["elf", "zstd", "zlib"].into_iter().enumerate() {
        let format = format_named(name);
        let (_ramdir, ram, original, text) = guest(dir.path());
        let out = dir.path().join(format!("vmcore{i}"));
        let held = |p: &Path| {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(p).unwrap().blocks() * 512
        };
        let before = held(&ram);
        let child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "resume::dump_until_killed",
                "--ignored",
                "--nocapture",
            ])
            .env("RESUME_RAM", &ram)
            .env("RESUME_TEXT", &text)
            .env("RESUME_OUT", &out)
            .env("RESUME_FORMAT", name)
            .output()
            .unwrap();
        assert_eq!(
            child.status.code(),
            Some(DIED),
            "{}",
            String::from_utf8_lossy(&child.stderr)
        );
        // Five chunks (20 MiB of RAM, two thirds of it data) went back to the host
        // before the kill.
        assert!(held(&ram) + 13 * MIB <= before, "{} {before}", held(&ram));
        let partial = rebound_dump::write::partial_path(&out);
        let earlier = dir.path().join(format!("vmcore{i}.resume"));
        std::fs::rename(&partial, &earlier).unwrap();

        // The memory is split between the RAM file and the stopped dump ...
        let src = ResumeSource::new(
            FileSource::open(&ram, 64 * MIB).unwrap(),
            vec![DumpPages::open(&earlier).unwrap()],
            layout,
        );
        let mem = GuestMemory::new(src, layout).unwrap();
        let want = GuestMemory::open_ram_file(&original, layout).unwrap();
        for gpa in (0..64 * MIB).step_by(4 * MIB as usize) {
            assert!(
                mem.read_vec(gpa, 4 * MIB as usize).unwrap()
                    == want.read_vec(gpa, 4 * MIB as usize).unwrap(),
                "{format:?}: chunk at {gpa:#x} differs"
            );
        }
        // ... and a new dump of it holds every page.
        Dumper::new(&mem)
            .vmcoreinfo(&text)
            .write(&out, &opts(format), &mut ())
            .unwrap();
        assert!(inspect(&out).unwrap().complete);
        for pfn in 0..64 * MIB / 4096 {
            let got = dump_page(&out, pfn * 4096).unwrap_or_else(|| vec![0; 4096]);
            let want = want.read_vec(pfn * 4096, 4096).unwrap();
            assert!(got == want, "{format:?}: page {pfn:#x} differs");
        }
        assert_eq!(crash_osrelease(&out), "6.1.0-99-rebound-test");
    }
}
