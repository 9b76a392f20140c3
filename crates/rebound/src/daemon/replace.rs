//! A start or restore over a stopped VM's name, and what a daemon that dies
//! meanwhile leaves behind.
//!
//! The stopped VM's record and disk copies are moved aside (`NAME.prev`, renames
//! in its directory) before anything of the new VM is made, and are dropped only
//! once the new VM runs; a start that fails puts them back, and so does the next
//! daemon when it finds them next to a record whose start never answered. Its
//! crash reports and dumps stay where they are, whichever VM wins.
//!
//! And QEMUs nobody records: every QEMU is started with its vCPUs stopped and its
//! `-pidfile` in its run directory (`qemu.pid`, and `settle/qemu.pid` for the one a
//! settle starts), so at start-up the daemon finds every QEMU of ours by its command
//! line and kills those no record owns, before any of them ran guest code unseen.

use std::path::{Path, PathBuf};

use rebound_vmm::paths::{Paths, VmDir};
use rebound_vmm::process;

/// Suffix of the files of a stopped VM that a new start over its name set aside.
const PREV: &str = ".prev";

/// Errors setting a stopped VM's files aside.
#[derive(Debug, thiserror::Error)]
pub enum ReplaceError {
    #[error("cannot set {0} aside for the new VM")]
    SetAside(PathBuf, #[source] std::io::Error),
}

/// The files a new VM of the same name would replace: its record, its restore
/// report and its own disk copies.
fn replaced(dir: &VmDir) -> Vec<PathBuf> {
    let mut v = vec![dir.record(), dir.path().join("restore.json")];
    if let Ok(rd) = std::fs::read_dir(dir.path()) {
        for e in rd.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            let disk = n.starts_with("disk") && (n.ends_with(".qcow2") || n.ends_with(".img"));
            if disk {
                v.push(e.path());
            }
        }
    }
    v
}

fn prev(p: &Path) -> PathBuf {
    let mut s = p.as_os_str().to_owned();
    s.push(PREV);
    PathBuf::from(s)
}

fn aside(dir: &VmDir) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir.path()) else {
        return Vec::new();
    };
    rd.flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(PREV))
        .collect()
}

/// Moves the stopped VM's replaceable files aside (see the module doc).
pub fn set_aside(dir: &VmDir) -> Result<(), ReplaceError> {
    for f in replaced(dir) {
        match std::fs::rename(&f, prev(&f)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                put_back(dir);
                return Err(ReplaceError::SetAside(f, e));
            }
        }
    }
    Ok(())
}

/// Whether a start over this VM's name was under way (files are set aside).
pub fn pending(dir: &VmDir) -> bool {
    !aside(dir).is_empty()
}

/// The new VM did not come up: whatever it made goes, the stopped VM's files
/// come back.
pub fn put_back(dir: &VmDir) {
    let kept = aside(dir);
    if kept.is_empty() {
        return;
    }
    for f in replaced(dir) {
        let _ = std::fs::remove_file(f);
    }
    for p in kept {
        let s = p.to_string_lossy();
        let to = PathBuf::from(&s[..s.len() - PREV.len()]);
        if let Err(e) = std::fs::rename(&p, &to) {
            tracing::error!("cannot put {} back: {e}", p.display());
        }
    }
}

/// The new VM runs: the stopped VM it replaced is gone for good.
pub fn drop_aside(dir: &VmDir) {
    for p in aside(dir) {
        let _ = std::fs::remove_file(p);
    }
}

/// Kills every live QEMU of ours that is not in `owned` (the pids the VM records
/// hold); returns what it killed, as (run dir, pid). A QEMU is ours when its
/// `-pidfile` is in a run directory under `paths.run` (`NAME/qemu.pid`, or a
/// settle's `NAME/settle/qemu.pid`): its command line says so from its exec on,
/// before it has written that file. A settle's side directory goes with its QEMU.
pub async fn kill_unowned(paths: &Paths, owned: &[u32]) -> Vec<(PathBuf, u32)> {
    let mut killed = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return killed;
    };
    for e in rd.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if owned.contains(&pid) {
            continue;
        }
        let Some(pidfile) = our_pidfile(pid, &paths.run) else {
            continue;
        };
        let Some(dir) = pidfile.parent() else {
            continue;
        };
        let settle = dir.ends_with("settle");
        let run = if settle {
            dir.parent().unwrap_or(dir)
        } else {
            dir
        };
        tracing::warn!(
            "QEMU pid {pid} of {} is in no VM record (its daemon stopped before recording it): killed",
            run.display()
        );
        process::sigkill(pid);
        process::wait_gone(pid, std::time::Duration::from_secs(10)).await;
        if settle {
            let _ = std::fs::remove_dir_all(dir);
        }
        killed.push((run.to_path_buf(), pid));
    }
    killed
}

/// The `-pidfile` of process `pid` if it is a QEMU whose pidfile is in a run
/// directory under `run` (`run/NAME/qemu.pid` or `run/NAME/settle/qemu.pid`).
fn our_pidfile(pid: u32, run: &Path) -> Option<PathBuf> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    // Whatever the binary is called (`REBOUND_QEMU`): the pidfile in our run dir
    // is what only the QEMUs Rebound starts have.
    let mut args = cmdline.split(|b| *b == 0).skip_while(|a| *a != b"-pidfile");
    args.next()?;
    let p = PathBuf::from(String::from_utf8_lossy(args.next()?).into_owned());
    let rel = p.strip_prefix(run).ok()?;
    let parts: Vec<_> = rel.components().collect();
    let ok = match parts.len() {
        2 => true,
        3 => parts[1].as_os_str() == "settle",
        _ => false,
    };
    (ok && p.file_name()? == "qemu.pid").then_some(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_aside_then_put_back_or_drop() {
        let d = tempfile::tempdir().unwrap();
        let dir = VmDir(d.path().to_path_buf());
        std::fs::write(dir.record(), b"old record").unwrap();
        std::fs::write(dir.disk_overlay(0), b"old disk").unwrap();
        std::fs::write(dir.path().join("events.jsonl"), b"log").unwrap();
        set_aside(&dir).unwrap();
        assert!(pending(&dir));
        assert!(!dir.record().exists() && !dir.disk_overlay(0).exists());
        // The new VM made its own files, then failed.
        std::fs::write(dir.record(), b"new record").unwrap();
        std::fs::write(dir.disk_overlay(0), b"new disk").unwrap();
        std::fs::write(dir.disk_raw(1), b"new raw").unwrap();
        put_back(&dir);
        assert!(!pending(&dir));
        assert_eq!(std::fs::read(dir.record()).unwrap(), b"old record");
        assert_eq!(std::fs::read(dir.disk_overlay(0)).unwrap(), b"old disk");
        assert!(!dir.disk_raw(1).exists());
        assert_eq!(
            std::fs::read(dir.path().join("events.jsonl")).unwrap(),
            b"log"
        );
        // This time the new VM runs.
        set_aside(&dir).unwrap();
        std::fs::write(dir.disk_overlay(0), b"new disk").unwrap();
        drop_aside(&dir);
        assert!(!pending(&dir));
        assert_eq!(std::fs::read(dir.disk_overlay(0)).unwrap(), b"new disk");
    }
}
