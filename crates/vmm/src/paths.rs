//! Where Rebound keeps its state.
//!
//! Persistent state (images, VM records, event logs, serial and QEMU logs, the daemon
//! socket and log) lives under `$REBOUND_HOME`. Per-VM runtime files (guest RAM, QEMU
//! sockets) live on tmpfs under `$REBOUND_RUN`, so guest RAM never touches a disk and
//! nothing a guest writes grows on the tmpfs that holds every VM's RAM.

use std::path::{Path, PathBuf};

/// Errors finding the state directories.
#[derive(Debug, thiserror::Error)]
pub enum PathsError {
    #[error("cannot find a home directory: set REBOUND_HOME or HOME")]
    NoHome,
    #[error("{0:?} must be a plain relative path or lie inside {1}")]
    Outside(String, PathBuf),
}

/// Root directories of one Rebound installation.
#[derive(Debug, Clone)]
pub struct Paths {
    /// Persistent state: `$REBOUND_HOME`.
    pub home: PathBuf,
    /// Runtime state on tmpfs: `$REBOUND_RUN`.
    pub run: PathBuf,
}

impl Paths {
    /// Reads `REBOUND_HOME` / `REBOUND_RUN` with their documented defaults.
    pub fn from_env() -> Result<Self, PathsError> {
        let home = match std::env::var_os("REBOUND_HOME") {
            Some(h) if !h.is_empty() => PathBuf::from(h),
            _ => match std::env::var_os("XDG_DATA_HOME") {
                Some(x) if !x.is_empty() => PathBuf::from(x).join("rebound"),
                _ => {
                    let h = std::env::var_os("HOME").ok_or(PathsError::NoHome)?;
                    PathBuf::from(h).join(".local/share/rebound")
                }
            },
        };
        let run = match std::env::var_os("REBOUND_RUN") {
            Some(r) if !r.is_empty() => PathBuf::from(r),
            _ => PathBuf::from(format!("/dev/shm/rebound-{}", nix::unistd::getuid())),
        };
        Ok(Self { home, run })
    }

    /// The daemon's default socket.
    pub fn socket(&self) -> PathBuf {
        self.home.join("reboundd.sock")
    }

    /// Lock file held by the running daemon.
    pub fn daemon_lock(&self) -> PathBuf {
        self.home.join("reboundd.lock")
    }

    /// Log of a daemon started in the background by the CLI.
    pub fn daemon_log(&self) -> PathBuf {
        self.home.join("reboundd.log")
    }

    /// Snapshots made or restored on behalf of someone other than the daemon's user
    /// (a cluster peer): their paths are confined here ([`inside`]).
    pub fn snapshot_store(&self) -> PathBuf {
        self.home.join("snapshots")
    }

    /// The snapshots this daemon wrote (`rebound_snapshot::Catalog`).
    pub fn snapshot_catalog(&self) -> PathBuf {
        self.home.join("snapshots.list")
    }

    /// Directory holding one directory per VM record.
    pub fn vms_dir(&self) -> PathBuf {
        self.home.join("vms")
    }

    /// Persistent files of one VM.
    pub fn vm(&self, name: &str) -> VmDir {
        VmDir(self.vms_dir().join(name))
    }

    /// A crashed VM's RAM, moved out of its run directory until it is dumped (the
    /// same tmpfs, so the move is a rename). Paths derived from a VM's name carry
    /// `@`, which no VM name may hold, so no VM's run directory is ever one of them.
    pub fn crashed_ram(&self, name: &str, id: &str) -> PathBuf {
        self.run.join(format!("{name}@crash-{id}.ram"))
    }

    /// Sockets of a VM's disk backends: outside its run directory, which a crash
    /// clears, because the backends outlive the crashed QEMU and serve the recovery VM.
    pub fn blk_dir(&self, name: &str) -> PathBuf {
        self.run.join(format!("{name}@blk"))
    }

    /// Runtime files of one VM.
    pub fn run_dir(&self, name: &str) -> RunDir {
        RunDir(self.run.join(name))
    }
}

/// `given` as a path inside `root`: a relative path of plain components is taken
/// under `root`; an absolute one must already lie inside it. `..` and `.` are refused
/// either way, so the answer is lexically inside `root` (a symbolic link inside
/// `root` can still point out: callers that open existing paths also compare
/// canonical paths).
pub fn inside(root: &Path, given: &str) -> Result<PathBuf, PathsError> {
    use std::path::Component;
    let p = Path::new(given);
    let outside = || PathsError::Outside(given.to_string(), root.to_path_buf());
    let plain = |q: &Path| q.components().all(|c| matches!(c, Component::Normal(_)));
    if given.is_empty() {
        return Err(outside());
    }
    if p.is_absolute() {
        let rest = p.strip_prefix(root).map_err(|_| outside())?;
        if rest.as_os_str().is_empty() || !plain(rest) {
            return Err(outside());
        }
        return Ok(p.to_path_buf());
    }
    if !plain(p) {
        return Err(outside());
    }
    Ok(root.join(p))
}

/// A VM's persistent directory: `$REBOUND_HOME/vms/NAME`.
#[derive(Debug, Clone)]
pub struct VmDir(pub PathBuf);

impl VmDir {
    pub fn path(&self) -> &Path {
        &self.0
    }
    pub fn record(&self) -> PathBuf {
        self.0.join("vm.json")
    }
    pub fn events(&self) -> PathBuf {
        self.0.join("events.jsonl")
    }
    /// The VM's own writable copy of image disk `i`.
    pub fn disk_overlay(&self, i: usize) -> PathBuf {
        self.0.join(format!("disk{i}.qcow2"))
    }
    /// The VM's own raw copy of image disk `i` (served by Rebound's backend).
    pub fn disk_raw(&self, i: usize) -> PathBuf {
        self.0.join(format!("disk{i}.img"))
    }
    /// One crash's directory: its record and, by default, its dump.
    pub fn crash_dir(&self, id: &str) -> PathBuf {
        self.0.join("crashes").join(id)
    }
    /// The guest's cached file pages, listed before a warm reboot (`warm` module).
    pub fn warm_cache_list(&self) -> PathBuf {
        self.0.join("warm-cache.list")
    }
    /// The serial console log, capped (`logcap`); the previous generation is
    /// `serial.log.1`.
    pub fn serial_log(&self) -> PathBuf {
        self.0.join("serial.log")
    }
    /// QEMU's own stdout/stderr, capped the same way.
    pub fn qemu_log(&self) -> PathBuf {
        self.0.join("qemu.log")
    }
}

/// A VM's runtime directory on tmpfs: `$REBOUND_RUN/NAME`.
#[derive(Debug, Clone)]
pub struct RunDir(pub PathBuf);

impl RunDir {
    pub fn path(&self) -> &Path {
        &self.0
    }
    pub fn ram(&self) -> PathBuf {
        self.0.join("ram")
    }
    /// Memory a recovery VM gets plugged in (virtio-mem).
    pub fn vmem(&self) -> PathBuf {
        self.0.join("vmem")
    }
    pub fn qmp(&self) -> PathBuf {
        self.0.join("qmp.sock")
    }
    pub fn agent(&self) -> PathBuf {
        self.0.join("agent.sock")
    }
    pub fn serial_sock(&self) -> PathBuf {
        self.0.join("serial.sock")
    }
    /// Where a terminal attaches to the console (served by the daemon's link).
    pub fn console_sock(&self) -> PathBuf {
        self.0.join("console.sock")
    }
    pub fn pidfile(&self) -> PathBuf {
        self.0.join("qemu.pid")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_run_paths_are_no_vm_name() {
        let p = Paths {
            home: "/h".into(),
            run: "/r".into(),
        };
        for derived in [p.blk_dir("x"), p.crashed_ram("x", "1")] {
            let name = derived.file_name().unwrap().to_str().unwrap();
            assert!(
                rebound_api::spec::validate_name(name).is_err(),
                "VM {name:?} would collide with a derived path"
            );
        }
    }

    #[test]
    fn inside_takes_plain_relative_paths_and_absolute_ones_under_the_root() {
        let root = Path::new("/home/r/snapshots");
        assert_eq!(inside(root, "c1/vm").unwrap(), root.join("c1/vm"));
        assert_eq!(
            inside(root, "/home/r/snapshots/c1").unwrap(),
            root.join("c1")
        );
        for bad in [
            "",
            "/tmp/x",
            "../x",
            "c1/../../x",
            "./c1",
            "/home/r/snapshots",
            "/home/r/snapshots/../vms",
            "/home/r/snapshotsX/y",
        ] {
            assert!(inside(root, bad).is_err(), "{bad:?} accepted");
        }
    }
}
