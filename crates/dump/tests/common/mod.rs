//! Helpers of the dump tests: synthetic guest RAM, the crash and makedumpfile
//! binaries (failing with how to install them when missing), and single pages out
//! of a dump (through `rebound_dump::DumpPages`), to compare with the RAM they came from.
#![allow(dead_code)] // each test binary uses a subset

use std::path::{Path, PathBuf};
use std::process::Command;

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
    let mut page = vec![0u8; 4096];
    rebound_dump::DumpPages::open(dump)
        .unwrap()
        .read_page(gpa / 4096, &mut page)
        .unwrap()
        .then_some(page)
}

/// Mode bits of a file.
pub fn mode(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}
