//! An emulated slow disk that reads and writes share, with a file system on it: what
//! a crash's dump and its recovery VM meet on a real host, where both use one disk.
//!
//! `qemu-storage-daemon` (Debian's QEMU) serves a sparse backing file through a
//! throttle group (`x-bps-total`: reads and writes together) as a FUSE file; a loop
//! device over that file carries an ext4 file system, mounted in the benchmark's
//! scratch directory. Every byte that reaches the "disk" (a dump's writes when they
//! are flushed, a guest's direct reads and writes of its disk image, a recovery VM's
//! reads) passes the one rate; the host page cache in front of the file system stays
//! at memory speed, as it would in front of a real slow disk. The backing file is
//! opened with `O_DIRECT`, so the host's cache of it cannot absorb what the throttle
//! is meant to hold. Needs root (loop devices, mounting) and `/dev/fuse`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;

/// Why the throttled file system could not be made or checked.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot prepare {} for the throttled device", .0.display())]
    Prepare(PathBuf, #[source] std::io::Error),
    #[error("cannot run qemu-storage-daemon (package qemu-system-common)")]
    Spawn(#[source] std::io::Error),
    #[error("qemu-storage-daemon exited ({status}): {log}")]
    Exited {
        status: std::process::ExitStatus,
        log: String,
    },
    #[error("qemu-storage-daemon's FUSE export did not appear in 10 s (is /dev/fuse there?)")]
    NoExport,
    #[error("a host tool failed on the throttled device")]
    Tool(#[source] rebound_image::ToolError),
    #[error("cannot drop the throttled device's file {} from the page cache", .0.display())]
    DropCache(PathBuf, #[source] rebound_snapshot::ImageError),
    #[error("cannot write and read back the rate check's file {}", .0.display())]
    CheckFile(PathBuf, #[source] std::io::Error),
    #[error("the emulated disk is not held to {limit_mbps} MB/s: a flushed write ran at {write_mbps:.0} MB/s, a cold read at {read_mbps:.0}")]
    NotHeld {
        limit_mbps: u32,
        write_mbps: f64,
        read_mbps: f64,
    },
}

/// What [`ThrottledFs::check`] writes and reads back.
const CHECK_BYTES: u64 = 256 << 20;

/// A mounted file system on a throttled device; unmounted and torn down when dropped.
pub struct ThrottledFs {
    /// Where the file system is mounted.
    pub mount: PathBuf,
    dir: PathBuf,
    loop_dev: Option<String>,
    daemon: Option<Child>,
    mounted: bool,
}

/// What a write and a read through the device achieved, to show the rate holds.
#[derive(Debug, Clone, Serialize)]
pub struct FsCheck {
    pub limit_mbps: u32,
    pub write_mbps: f64,
    pub read_mbps: f64,
}

/// Runs a host tool; its standard output, or why it failed.
fn run(cmd: &mut Command) -> Result<String, Error> {
    let out = rebound_image::run_tool(cmd).map_err(Error::Tool)?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn is_mounted(path: &Path) -> bool {
    let Ok(m) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let p = path.display().to_string();
    m.lines()
        .any(|l| l.split_whitespace().nth(4) == Some(p.as_str()))
}

impl ThrottledFs {
    /// A file system of `size` bytes under `dir` (which it creates) on a device whose
    /// reads and writes together run at `mbps` MB/s.
    pub fn new(dir: &Path, size: u64, mbps: u32) -> Result<ThrottledFs, Error> {
        let prep = |e| Error::Prepare(dir.to_path_buf(), e);
        std::fs::create_dir_all(dir).map_err(prep)?;
        let dir = dir.canonicalize().map_err(prep)?;
        let (backing, device, mount) = (
            dir.join("backing.img"),
            dir.join("device.img"),
            dir.join("fs"),
        );
        std::fs::File::create(&backing)
            .and_then(|f| f.set_len(size))
            .and_then(|()| std::fs::File::create(&device))
            .and_then(|_| std::fs::create_dir_all(&mount))
            .map_err(prep)?;
        let mut fs = ThrottledFs {
            mount,
            dir: dir.clone(),
            loop_dev: None,
            daemon: None,
            mounted: false,
        };
        let log = std::fs::File::create(dir.join("storage-daemon.log")).map_err(prep)?;
        let log2 = log.try_clone().map_err(prep)?;
        let bps = mbps as u64 * 1_000_000;
        let child = Command::new("qemu-storage-daemon")
            .args([
                "--object",
                &format!("throttle-group,id=tg,x-bps-total={bps}"),
            ])
            .args([
                "--blockdev",
                &format!(
                    "driver=file,node-name=f,filename={},cache.direct=on",
                    backing.display()
                ),
            ])
            .args([
                "--blockdev",
                "driver=throttle,node-name=t,throttle-group=tg,file=f",
            ])
            .args([
                "--export",
                &format!(
                    "type=fuse,id=e,node-name=t,mountpoint={},writable=on",
                    device.display()
                ),
            ])
            .stdin(Stdio::null())
            .stdout(log2)
            .stderr(log)
            .spawn()
            .map_err(Error::Spawn)?;
        fs.daemon = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !is_mounted(&device) {
            if let Some(Ok(Some(st))) = fs.daemon.as_mut().map(Child::try_wait) {
                let log =
                    std::fs::read_to_string(dir.join("storage-daemon.log")).unwrap_or_default();
                return Err(Error::Exited {
                    status: st,
                    log: log.trim().to_string(),
                });
            }
            if Instant::now() > deadline {
                return Err(Error::NoExport);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // Buffered: the loop device's direct I/O onto the FUSE export corrupted the
        // file system here. The host's cache of the device file is dropped instead
        // wherever reads must reach the throttle (`drop_device_cache`).
        let dev = run(Command::new("losetup").args(["-f", "--show"]).arg(&device))?;
        fs.loop_dev = Some(dev.clone());
        // Initialised in full now, so no background initialisation competes with
        // what is measured later.
        run(Command::new("mkfs.ext4").args([
            "-q",
            "-F",
            "-E",
            "lazy_itable_init=0,lazy_journal_init=0,nodiscard",
            &dev,
        ]))?;
        run(Command::new("mount").arg(&dev).arg(&fs.mount))?;
        fs.mounted = true;
        Ok(fs)
    }

    /// Flushes the file system and drops what the host caches of the device, so
    /// that the next reads reach the throttle.
    pub fn drop_device_cache(&self) -> Result<(), Error> {
        run(Command::new("sync").arg("-f").arg(&self.mount))?;
        let dev = self.dir.join("device.img");
        rebound_snapshot::drop_page_cache(&dev).map_err(|e| Error::DropCache(dev, e))
    }

    /// Writes [`CHECK_BYTES`] and flushes them, drops them from the page cache and
    /// reads them back: the rates the device gave.
    pub fn check(&self, limit_mbps: u32) -> Result<FsCheck, Error> {
        use std::io::{Read, Write};
        let f = self.mount.join("check.bin");
        let io = |e| Error::CheckFile(f.clone(), e);
        let buf = vec![0x5au8; 1 << 20];
        let t = Instant::now();
        let mut w = std::fs::File::create(&f).map_err(io)?;
        for _ in 0..CHECK_BYTES >> 20 {
            w.write_all(&buf).map_err(io)?;
        }
        w.sync_all().map_err(io)?;
        let write_s = t.elapsed().as_secs_f64();
        drop(w);
        rebound_snapshot::drop_page_cache(&f).map_err(|e| Error::DropCache(f.clone(), e))?;
        let t = Instant::now();
        let mut r = std::fs::File::open(&f).map_err(io)?;
        let mut b = vec![0u8; 1 << 20];
        while r.read(&mut b).map_err(io)? > 0 {}
        let read_s = t.elapsed().as_secs_f64();
        std::fs::remove_file(&f).map_err(io)?;
        let c = FsCheck {
            limit_mbps,
            write_mbps: CHECK_BYTES as f64 / 1e6 / write_s,
            read_mbps: CHECK_BYTES as f64 / 1e6 / read_s,
        };
        // A little over the limit is the throttle's burst; far over it, something
        // in front of the throttle answered.
        let most = limit_mbps as f64 * 1.25;
        if c.write_mbps > most || c.read_mbps > most {
            return Err(Error::NotHeld {
                limit_mbps,
                write_mbps: c.write_mbps,
                read_mbps: c.read_mbps,
            });
        }
        Ok(c)
    }
}

impl Drop for ThrottledFs {
    fn drop(&mut self) {
        if self.mounted && run(Command::new("umount").arg(&self.mount)).is_err() {
            // Something still holds a file (a QEMU on its way out): detach now, the
            // kernel finishes once it lets go.
            let _ = run(Command::new("umount").arg("-l").arg(&self.mount));
        }
        if let Some(dev) = &self.loop_dev {
            let _ = run(Command::new("losetup").args(["-d", dev]));
        }
        if let Some(mut c) = self.daemon.take() {
            // SIGTERM: the storage daemon unmounts its export on the way out.
            // SAFETY: kill(2) takes integers only; the pid is our own child's, not
            // yet reaped, so it names no other process.
            unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
