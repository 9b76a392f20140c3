//! Helpers shared by the integration tests: real sparse RAM files.
#![allow(dead_code)] // each test binary uses a subset

use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// A sparse RAM file of `size` bytes in a fresh directory under `parent`
/// (`None`: the default temp dir, here ext4; `/dev/shm`: tmpfs, as QEMU's mem-path).
pub fn sparse_ram(parent: Option<&str>, size: u64) -> (tempfile::TempDir, PathBuf) {
    let dir = match parent {
        Some(p) => tempfile::Builder::new()
            .prefix("guestmem-test")
            .tempdir_in(p),
        None => tempfile::Builder::new().prefix("guestmem-test").tempdir(),
    }
    .unwrap();
    let path = dir.path().join("ram");
    File::create(&path).unwrap().set_len(size).unwrap();
    (dir, path)
}

pub fn write_at(path: &Path, offset: u64, bytes: &[u8]) {
    let f = File::options().write(true).open(path).unwrap();
    f.write_all_at(bytes, offset).unwrap();
}

/// Host bytes allocated to the file.
pub fn allocated(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().blocks() * 512
}

/// VMCOREINFO text in the shape a 6.1 x86-64 kernel writes.
pub fn vmcoreinfo_text(osrelease: &str, kernel_offset: u64) -> String {
    format!(
        "OSRELEASE={osrelease}\nPAGESIZE=4096\nSYMBOL(init_uts_ns)=ffffffff9a8152a0\n\
         SIZE(page)=64\nOFFSET(page.flags)=0\nOFFSET(page._mapcount)=48\n\
         NUMBER(PAGE_BUDDY_MAPCOUNT_VALUE)=-129\nNUMBER(phys_base)=75497472\n\
         SYMBOL(init_top_pgt)=ffffffff9a80a000\nKERNELOFFSET={kernel_offset:x}\n"
    )
}

/// One HMP command over QEMU's monitor socket; returns its output.
pub fn hmp(sock: &Path, cmd: &str) -> String {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;
    let t0 = Instant::now();
    let mut s = loop {
        match UnixStream::connect(sock) {
            Ok(s) => break s,
            Err(_) if t0.elapsed() < Duration::from_secs(20) => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => panic!("monitor socket: {e}"),
        }
    };
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(format!("{cmd}\n").as_bytes()).unwrap();
    // The output ends with the next prompt (the first came with the greeting).
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while String::from_utf8_lossy(&out).matches("(qemu)").count() < 2 {
        let n = s.read(&mut buf).expect("monitor answers");
        assert!(n > 0, "monitor closed");
        out.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A child process (QEMU), killed and reaped when dropped.
pub struct ChildGuard(pub Child);

impl std::ops::Deref for ChildGuard {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for ChildGuard {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `$REBOUND_HOME`, by default `~/.local/share/rebound` (as the CLI does).
pub fn rebound_home() -> PathBuf {
    std::env::var_os("REBOUND_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap()).join(".local/share/rebound")
        })
}
