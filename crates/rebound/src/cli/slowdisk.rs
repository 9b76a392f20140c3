//! An emulated slow disk for benchmarks: a block-I/O control group that limits the
//! reads of the processes in it from the device holding a file (cgroup v2 `io.max`,
//! or v1 `blkio.throttle.*`). Only reads that reach the device are limited: the host
//! page cache and Rebound's host cache stay at memory speed, as they would in front
//! of a real slow disk. The disk here reads at GB/s, far faster than the disks
//! operators run guests on.

use std::path::{Path, PathBuf};

use anyhow::Context;

/// A control group limiting reads from one device; removed when dropped.
pub struct SlowDisk {
    dir: PathBuf,
    /// What was asked, for the report.
    pub device: String,
}

impl SlowDisk {
    /// A group named `name` limiting reads from the device under `file` to `bps`
    /// bytes and `iops` requests per second (0: that one unlimited).
    pub fn new(name: &str, file: &Path, bps: u64, iops: u64) -> anyhow::Result<SlowDisk> {
        let device = super::bench_restore::whole_disk(file)?;
        let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers");
        let io_v2 =
            std::fs::read_to_string(v2).is_ok_and(|c| c.split_whitespace().any(|x| x == "io"));
        let dir = if io_v2 {
            PathBuf::from("/sys/fs/cgroup").join(name)
        } else {
            PathBuf::from("/sys/fs/cgroup/blkio").join(name)
        };
        if !dir.parent().is_some_and(Path::exists) {
            anyhow::bail!("no block-I/O control group hierarchy (cgroup v2 io or v1 blkio)");
        }
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {} (root is needed)", dir.display()))?;
        let d = SlowDisk { dir, device };
        let write = |f: &str, v: String| {
            std::fs::write(d.dir.join(f), &v)
                .with_context(|| format!("cannot write {v:?} to {}", d.dir.join(f).display()))
        };
        if io_v2 {
            let lim = |k: &str, v: u64| {
                if v == 0 {
                    format!("{k}=max")
                } else {
                    format!("{k}={v}")
                }
            };
            write(
                "io.max",
                format!("{} {} {}", d.device, lim("rbps", bps), lim("riops", iops)),
            )?;
        } else {
            if bps > 0 {
                write(
                    "blkio.throttle.read_bps_device",
                    format!("{} {bps}", d.device),
                )?;
            }
            if iops > 0 {
                write(
                    "blkio.throttle.read_iops_device",
                    format!("{} {iops}", d.device),
                )?;
            }
        }
        Ok(d)
    }

    /// Moves a process (all its threads) into the group.
    pub fn add(&self, pid: u32) -> anyhow::Result<()> {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string())
            .with_context(|| format!("cannot move pid {pid} into {}", self.dir.display()))
    }
}

impl Drop for SlowDisk {
    fn drop(&mut self) {
        // Any process still inside goes back to the root group first.
        if let Ok(procs) = std::fs::read_to_string(self.dir.join("cgroup.procs")) {
            let root = self.dir.parent().map(|p| p.join("cgroup.procs"));
            for pid in procs.lines() {
                if let Some(r) = &root {
                    let _ = std::fs::write(r, pid);
                }
            }
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}
