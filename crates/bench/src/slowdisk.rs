//! An emulated slow disk for benchmarks: a block-I/O control group that limits the
//! reads of the processes in it from the device holding a file (cgroup v2 `io.max`,
//! or v1 `blkio.throttle.*`). Only reads that reach the device are limited: the host
//! page cache and Rebound's host cache stay at memory speed, as they would in front
//! of a real slow disk. The disk here reads at GB/s, far faster than the disks
//! operators run guests on.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

/// Why the slow disk could not be set up or checked.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no block-I/O control group hierarchy (cgroup v2 io or v1 blkio): the slow disk cannot be emulated here")]
    NoHierarchy,
    #[error("cannot create {} (root is needed)", .0.display())]
    Create(PathBuf, #[source] std::io::Error),
    #[error("cannot write {value:?} to {}", .file.display())]
    Write {
        value: String,
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot move pid {pid} into {}", .group.display())]
    Add {
        pid: u32,
        group: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write the rate check's file {}", .0.display())]
    CheckFile(PathBuf, #[source] std::io::Error),
    #[error("cannot run dd for the rate check")]
    Dd(#[source] std::io::Error),
    #[error("dd of {} failed: {why}", .file.display())]
    DdFailed { file: PathBuf, why: String },
    #[error("cannot find the device under {}", .0.display())]
    Device(PathBuf, #[source] std::io::Error),
    #[error("{} is on device {maj}:{min}, which is not a block device (tmpfs?): it cannot be throttled", .path.display())]
    NotBlock { path: PathBuf, maj: u32, min: u32 },
}

/// What [`SlowDisk::check`] reads.
const CHECK_BYTES: u64 = 256 << 20;

/// A control group limiting reads from one device; removed when dropped, and every
/// process added goes back to the group it was in.
pub struct SlowDisk {
    dir: PathBuf,
    /// What was asked, for the report.
    pub device: String,
    /// Each added process and the `cgroup.procs` of the group it came from.
    added: std::sync::Mutex<Vec<(u32, PathBuf)>>,
}

/// The emulated disk's check: what a direct read in its group achieved.
#[derive(Debug, Clone, Serialize)]
pub struct DiskCheck {
    pub device: String,
    pub limit_mbps: u32,
    pub dd_bytes: u64,
    pub dd_mbps: f64,
}

impl SlowDisk {
    /// A group named `name` limiting reads from the device under `file` to `bps`
    /// bytes and `iops` requests per second (0: that one unlimited).
    pub fn new(name: &str, file: &Path, bps: u64, iops: u64) -> Result<SlowDisk, Error> {
        let device = whole_disk(file)?;
        let io_v2 = io_v2();
        let dir = hierarchy(io_v2).join(name);
        if !dir.parent().is_some_and(Path::exists) {
            return Err(Error::NoHierarchy);
        }
        std::fs::create_dir_all(&dir).map_err(|e| Error::Create(dir.clone(), e))?;
        let d = SlowDisk {
            dir,
            device,
            added: Default::default(),
        };
        let write = |f: &str, v: String| {
            let file = d.dir.join(f);
            std::fs::write(&file, &v).map_err(|source| Error::Write {
                value: v,
                file,
                source,
            })
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

    /// Moves a process (all its threads) into the group, until the group is dropped.
    pub fn add(&self, pid: u32) -> Result<(), Error> {
        let was = group_of(pid).unwrap_or_else(|| hierarchy(io_v2()));
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string()).map_err(|source| {
            Error::Add {
                pid,
                group: self.dir.clone(),
                source,
            }
        })?;
        self.added
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((pid, was.join("cgroup.procs")));
        Ok(())
    }

    /// Writes a dense file of `CHECK_BYTES` in `dir` (an image's holes would read
    /// without touching the disk), then reads it with O_DIRECT from inside the
    /// group: the rate the limit lets through.
    pub fn check(&self, dir: &Path, limit_mbps: u32) -> Result<DiskCheck, Error> {
        use std::io::Write;
        let file = dir.join(".rate-check");
        (|| {
            let mut f = std::fs::File::create(&file)?;
            let block = vec![0x5au8; 1 << 20];
            for _ in 0..CHECK_BYTES >> 20 {
                f.write_all(&block)?;
            }
            f.sync_all()
        })()
        .map_err(|e| Error::CheckFile(file.clone(), e))?;
        let t = Instant::now();
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(r#"echo $$ > "$1" && exec dd if="$2" of=/dev/null bs=1M iflag=direct status=none"#)
            .arg("sh")
            .arg(self.dir.join("cgroup.procs"))
            .arg(&file)
            .output();
        let secs = t.elapsed().as_secs_f64();
        let _ = std::fs::remove_file(&file);
        let out = out.map_err(Error::Dd)?;
        if !out.status.success() {
            let why = String::from_utf8_lossy(&out.stderr).trim().to_string();
            return Err(Error::DdFailed { file, why });
        }
        Ok(DiskCheck {
            device: self.device.clone(),
            limit_mbps,
            dd_bytes: CHECK_BYTES,
            dd_mbps: CHECK_BYTES as f64 / secs / 1e6,
        })
    }
}

impl Drop for SlowDisk {
    fn drop(&mut self) {
        let added = std::mem::take(self.added.get_mut().unwrap_or_else(|e| e.into_inner()));
        for (pid, was) in added {
            let _ = std::fs::write(was, pid.to_string());
        }
        // Anything else still inside (a child of an added process) goes to the root
        // group, or the group could not be removed.
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

/// Whether the v2 hierarchy has the io controller (else v1 blkio is used).
fn io_v2() -> bool {
    std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
        .is_ok_and(|c| c.split_whitespace().any(|x| x == "io"))
}

fn hierarchy(io_v2: bool) -> PathBuf {
    if io_v2 {
        PathBuf::from("/sys/fs/cgroup")
    } else {
        PathBuf::from("/sys/fs/cgroup/blkio")
    }
}

/// The block-I/O group a process is in now, from `/proc/PID/cgroup`.
fn group_of(pid: u32) -> Option<PathBuf> {
    let v2 = io_v2();
    let root = hierarchy(v2);
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .ok()?
        .lines()
        .find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (id, ctl, path) = (f.next()?, f.next()?, f.next()?);
            let ours = if v2 {
                id == "0" && ctl.is_empty()
            } else {
                ctl.split(',').any(|c| c == "blkio")
            };
            ours.then(|| root.join(path.trim_start_matches('/')))
        })
}

/// `MAJ:MIN` of the whole disk that holds `path` (throttling rules name disks, not
/// partitions).
pub fn whole_disk(path: &Path) -> Result<String, Error> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(path)
        .map_err(|e| Error::Device(path.to_path_buf(), e))?
        .dev();
    let (maj, min) = (libc::major(dev), libc::minor(dev));
    let sys = PathBuf::from(format!("/sys/dev/block/{maj}:{min}"));
    if !sys.exists() {
        return Err(Error::NotBlock {
            path: path.to_path_buf(),
            maj,
            min,
        });
    }
    if sys.join("partition").exists() {
        let parent = std::fs::read_to_string(sys.join("../dev"))
            .map_err(|e| Error::Device(path.to_path_buf(), e))?;
        return Ok(parent.trim().to_string());
    }
    Ok(format!("{maj}:{min}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_throttled_device_is_the_whole_disk() {
        // /proc is not on a block device: refused with the reason.
        let e = whole_disk(Path::new("/proc/self")).unwrap_err().to_string();
        assert!(e.contains("not a block device"), "{e}");
    }

    #[test]
    fn a_process_group_is_found_under_the_hierarchy_in_use() {
        let g = group_of(std::process::id()).expect("this process's block-I/O group");
        assert!(g.starts_with(hierarchy(io_v2())), "{}", g.display());
        assert!(g.join("cgroup.procs").exists(), "{}", g.display());
    }
}
