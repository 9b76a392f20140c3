//! Helpers shared by the integration tests: real sparse RAM files, QEMU started from
//! the runtime's typed command line.
#![allow(dead_code)] // each test binary uses a subset

use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use rebound_vmm::api::Accel;
use rebound_vmm::paths::Paths;
use rebound_vmm::process::{find_qemu, qemu_command};
use rebound_vmm::qemu::{Boot, Machine, MemoryBackend, QemuCommand, Serial};

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

/// A QEMU process, killed and reaped when dropped; its output is in `log`.
pub struct Qemu {
    pub child: Child,
    pub log: PathBuf,
}

impl Qemu {
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Panics, showing QEMU's log, if QEMU has exited.
    pub fn assert_running(&mut self) {
        if let Some(status) = self.child.try_wait().unwrap() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            panic!("QEMU exited ({status}): {log}");
        }
    }
}

impl Drop for Qemu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts QEMU with `q`'s arguments, its output appended to `log`. Fails, saying how
/// to install it, when QEMU is missing.
pub fn spawn_qemu(q: &QemuCommand, log: &Path) -> Qemu {
    let qemu = find_qemu().unwrap_or_else(|e| {
        panic!("{e}; scripts/install-deps.sh installs it (Debian package qemu-system-x86)")
    });
    let args = q.args().expect("a QEMU command line QEMU can run");
    let child = qemu_command(&qemu, &args, log)
        .unwrap()
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", qemu.display()));
    Qemu {
        child,
        log: log.to_path_buf(),
    }
}

/// A TCG guest of `size_mib` on `machine`, RAM from `backend`, booting `boot`, its
/// console appended to `serial`.
pub fn guest_command(
    machine: Machine,
    size_mib: u64,
    backend: MemoryBackend,
    boot: Boot,
    serial: &Path,
) -> QemuCommand {
    let mut q = QemuCommand::new(Accel::Tcg, size_mib, backend);
    q.machine = machine;
    q.boot = Some(boot);
    q.control.serial = Serial::File(serial.to_path_buf());
    q
}

/// `$REBOUND_HOME`, resolved as the runtime resolves it (`REBOUND_HOME`, else
/// `$XDG_DATA_HOME/rebound`, else `~/.local/share/rebound`).
pub fn rebound_home() -> PathBuf {
    Paths::from_env()
        .expect("REBOUND_HOME, XDG_DATA_HOME or HOME is set")
        .home
}
