//! Helpers of the dump tests: synthetic guest RAM, the crash and makedumpfile
//! binaries (failing with how to install them when missing), and a reader of
//! single pages out of a dump, to compare with the RAM they came from.
#![allow(dead_code)] // each test binary uses a subset

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use rebound_dump::elf::{read_elf, PT_LOAD};
use rebound_dump::kdump::{self, read_kdump, PageDesc};

/// The guest memory tests' helpers: sparse RAM files and VMCOREINFO text.
#[path = "../../../guestmem/tests/common/mod.rs"]
mod guestmem_common;
#[allow(unused_imports)] // each test binary uses a subset
pub use guestmem_common::{sparse_ram, vmcoreinfo_text, write_at, GIB, MIB};

/// A Debian tool from /usr/bin; fails saying how to get it.
pub fn tool(name: &str) -> PathBuf {
    let p = Path::new("/usr/bin").join(name);
    assert!(
        p.exists(),
        "{} is missing: `make test` installs it (scripts/install-deps.sh, Debian package {name})",
        p.display()
    );
    p
}

/// Runs a command; returns (success, stdout, stderr).
pub fn run(cmd: &mut Command) -> (bool, String, String) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `crash --osrelease DUMP`: the release crash reads from the dump.
pub fn crash_osrelease(dump: &Path) -> String {
    let (ok, out, err) = run(Command::new(tool("crash")).arg("--osrelease").arg(dump));
    assert!(
        ok,
        "crash --osrelease {} failed: {out}{err}",
        dump.display()
    );
    out.trim().to_string()
}

/// Deterministic bytes for page `pfn` (never all zero).
pub fn page_pattern(pfn: u64) -> Vec<u8> {
    let mut x = pfn.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..4096)
        .map(|i| {
            if i % 64 < 40 {
                // compressible part
                (pfn as u8).wrapping_add((i / 64) as u8)
            } else {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            }
        })
        .collect()
}

/// The page at `gpa` as the dump holds it: `None` when the dump does not
/// hold it (filtered out, outside RAM, or missing).
pub fn dump_page(dump: &Path, gpa: u64) -> Option<Vec<u8>> {
    let f = File::open(dump).unwrap();
    let mut magic = [0u8; 4];
    f.read_exact_at(&mut magic, 0).unwrap();
    let mut page = vec![0u8; 4096];
    if &magic == b"\x7fELF" {
        let core = read_elf(&f).unwrap();
        let p = core
            .phdrs
            .iter()
            .find(|p| p.p_type == PT_LOAD && (p.p_paddr..p.p_paddr + p.p_filesz).contains(&gpa))?;
        let at = p.p_offset + gpa - p.p_paddr;
        if at + 4096 > core.file_len {
            return None;
        }
        f.read_exact_at(&mut page, at).unwrap();
        return Some(page);
    }
    let k = read_kdump(&f).unwrap();
    let l = k.layout;
    let pfn = gpa / 4096;
    let mut map = vec![0u8; l.bitmap_len() as usize];
    f.read_exact_at(&mut map, l.bitmap2_offset()).unwrap();
    let bit = |p: u64| map[(p / 8) as usize] & (1 << (p % 8)) != 0;
    if pfn >= l.max_mapnr || !bit(pfn) {
        return None;
    }
    let idx = (0..pfn).filter(|&p| bit(p)).count() as u64;
    let mut d = [0u8; 24];
    f.read_exact_at(&mut d, l.desc_offset() + idx * 24).unwrap();
    let d = PageDesc::decode(&d);
    if d.offset == 0 {
        return None;
    }
    let mut stored = vec![0u8; d.size as usize];
    f.read_exact_at(&mut stored, d.offset).unwrap();
    if d.flags & kdump::DUMP_DH_COMPRESSED_ZSTD != 0 {
        page = zstd::bulk::decompress(&stored, 4096).unwrap();
    } else if d.flags & kdump::DUMP_DH_COMPRESSED_LZO != 0 {
        lzo1x::decompress(&stored, &mut page).unwrap();
    } else if d.flags & kdump::DUMP_DH_COMPRESSED_ZLIB != 0 {
        let mut z = flate2::Decompress::new(true);
        z.decompress(&stored, &mut page, flate2::FlushDecompress::Finish)
            .unwrap();
        assert_eq!(z.total_out(), 4096);
    } else {
        assert_eq!(d.flags, 0);
        page = stored;
    }
    Some(page)
}

/// Mode bits of a file.
pub fn mode(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}
