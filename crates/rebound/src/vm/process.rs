//! The QEMU process: finding the binary, spawning it in its own session (so it
//! outlives the daemon), checking that a recorded pid is still our QEMU, and
//! reading its memory use.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// Errors finding or starting QEMU.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("QEMU not found: qemu-system-x86_64 is not on PATH (install qemu-system-x86 or set REBOUND_QEMU)")]
    NotOnPath,
    #[error("QEMU not found at {0} (from REBOUND_QEMU)")]
    NotAt(PathBuf),
    #[error("cannot start QEMU {0}: {1}")]
    Spawn(PathBuf, std::io::Error),
    #[error("cannot open QEMU's log {0}: {1}")]
    Log(PathBuf, std::io::Error),
    #[error("cannot find a free host port: {0}")]
    Port(std::io::Error),
}

/// Finds the QEMU binary: `$REBOUND_QEMU`, else `qemu-system-x86_64` on `PATH`.
pub fn find_qemu() -> Result<PathBuf, ProcessError> {
    if let Some(p) = std::env::var_os("REBOUND_QEMU").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return if is_executable(&p) {
            Ok(p)
        } else {
            Err(ProcessError::NotAt(p))
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("qemu-system-x86_64"))
        .find(|p| is_executable(p))
        .ok_or(ProcessError::NotOnPath)
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Makes `cmd` start in its own session, so it survives us and our terminal.
pub fn new_session(cmd: &mut Command) {
    // SAFETY: the closure runs in the forked child before exec and only calls
    // setsid(2), which is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            Ok(())
        });
    }
}

/// Starts QEMU in a new session with stdout/stderr appended to `log`.
/// The caller owns the returned child (and should reap it).
pub fn spawn_qemu(
    qemu: &Path,
    args: &[String],
    log: &Path,
) -> Result<tokio::process::Child, ProcessError> {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| ProcessError::Log(log.to_path_buf(), e))?;
    let err = out
        .try_clone()
        .map_err(|e| ProcessError::Log(log.to_path_buf(), e))?;
    let mut cmd = Command::new(qemu);
    cmd.args(args).stdin(Stdio::null()).stdout(out).stderr(err);
    new_session(&mut cmd);
    let mut cmd = tokio::process::Command::from(cmd);
    cmd.kill_on_drop(false);
    cmd.spawn()
        .map_err(|e| ProcessError::Spawn(qemu.to_path_buf(), e))
}

/// Whether `pid` is alive and is the QEMU that uses `run_dir` (guards against pid reuse).
pub fn is_our_qemu(pid: u32, run_dir: &Path) -> bool {
    if kill(Pid::from_raw(pid as i32), None).is_err() {
        return false;
    }
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let needle = run_dir.to_string_lossy();
    // Zombies have an empty cmdline: they are gone for our purposes.
    !cmdline.is_empty() && String::from_utf8_lossy(&cmdline).contains(needle.as_ref())
}

/// Whether a process exists at all (zombies count as gone).
pub fn is_alive(pid: u32) -> bool {
    if kill(Pid::from_raw(pid as i32), None).is_err() {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // Field 3 is the state; after the ')' that ends the command name.
        Ok(s) => !matches!(
            s.rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().next()),
            Some("Z") | Some("X")
        ),
        Err(_) => false,
    }
}

/// Sends SIGKILL; an already gone process is fine.
pub fn sigkill(pid: u32) {
    let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
}

/// Waits until `pid` is gone, up to `timeout`; returns whether it is gone.
pub async fn wait_gone(pid: u32, timeout: std::time::Duration) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if !is_alive(pid) {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// A `/proc/PID/status` memory field (e.g. `VmRSS`, `RssAnon`, `RssShmem`) in bytes.
pub fn status_bytes(pid: u32, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.split(':').next() == Some(field))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Resident set size of a process in bytes (`VmRSS`).
pub fn rss_bytes(pid: u32) -> Option<u64> {
    status_bytes(pid, "VmRSS")
}

/// Bytes a file really occupies (allocated blocks, not its length).
pub fn allocated_bytes(path: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| m.blocks() * 512)
}

/// Picks a free TCP port on 127.0.0.1 (bind to port 0, read it, release it).
pub fn free_port() -> Result<u16, ProcessError> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(ProcessError::Port)?;
    Ok(l.local_addr().map_err(ProcessError::Port)?.port())
}

/// The last non-empty line of QEMU's log, to explain an early exit.
pub fn last_log_line(log: &Path) -> Option<String> {
    let s = std::fs::read_to_string(log).ok()?;
    s.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .map(|l| l.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rebound_qemu_override() {
        // Env is process-wide; this is the only test in this binary touching it.
        std::env::set_var("REBOUND_QEMU", "/nonexistent/qemu");
        assert!(matches!(find_qemu(), Err(ProcessError::NotAt(_))));
        std::env::remove_var("REBOUND_QEMU");
    }

    #[test]
    fn self_is_alive_and_measurable() {
        let me = std::process::id();
        assert!(is_alive(me));
        assert!(rss_bytes(me).unwrap() > 0);
        assert!(!is_our_qemu(me, Path::new("/definitely/not/in/cmdline")));
        assert!(free_port().unwrap() > 0);
    }
}
