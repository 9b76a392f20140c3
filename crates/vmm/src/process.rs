//! The QEMU process: finding the binary, spawning it in its own session (so it
//! outlives the daemon), checking that a recorded pid is still our QEMU, and
//! reading its memory use.

use std::os::unix::io::AsRawFd;
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
    #[error("cannot start QEMU {0}")]
    Spawn(PathBuf, #[source] std::io::Error),
    #[error("cannot open QEMU's log {0}")]
    Log(PathBuf, #[source] std::io::Error),
    #[error("cannot find a free host port")]
    Port(#[source] std::io::Error),
    #[error("cannot put QEMU in its memory group")]
    Cgroup(#[source] crate::cgroup::CgroupError),
}

/// Finds the QEMU binary: `$REBOUND_QEMU`, else `qemu-system-x86_64` on `PATH`.
pub fn find_qemu() -> Result<PathBuf, ProcessError> {
    find_qemu_in(
        std::env::var_os("REBOUND_QEMU"),
        std::env::var_os("PATH").unwrap_or_default(),
    )
}

/// [`find_qemu`] with the two variables given.
pub fn find_qemu_in(
    rebound_qemu: Option<std::ffi::OsString>,
    path: std::ffi::OsString,
) -> Result<PathBuf, ProcessError> {
    if let Some(p) = rebound_qemu.filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return if is_executable(&p) {
            Ok(p)
        } else {
            Err(ProcessError::NotAt(p))
        };
    }
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

/// Makes `cmd` start in its own session (so it survives us and our terminal) with
/// umask 077 (so whatever it creates is private, whatever our caller's umask was).
pub fn new_session(cmd: &mut Command) {
    // SAFETY: the closure runs in the forked child before exec and only calls
    // setsid(2) and umask(2), which are async-signal-safe and touch no memory of the
    // parent.
    unsafe {
        cmd.pre_exec(|| {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            libc::umask(crate::private::UMASK as libc::mode_t);
            Ok(())
        });
    }
}

/// The command that starts QEMU in a new session, private umask, with stdout and
/// stderr appended to `log` (created 0600). Tests spawn it as is; the daemon through
/// [`spawn_qemu`].
pub fn qemu_command(qemu: &Path, args: &[String], log: &Path) -> Result<Command, ProcessError> {
    let out = crate::private::create_file(log, true)
        .map_err(|e| ProcessError::Log(log.to_path_buf(), e))?;
    let err = out
        .try_clone()
        .map_err(|e| ProcessError::Log(log.to_path_buf(), e))?;
    let mut cmd = Command::new(qemu);
    cmd.args(args).stdin(Stdio::null()).stdout(out).stderr(err);
    new_session(&mut cmd);
    Ok(cmd)
}

/// Starts QEMU (see [`qemu_command`]) as a tokio child that is not killed on drop:
/// the guest outlives the daemon. With `group`, QEMU joins that memory group before
/// it runs, so everything it ever touches is charged there. The caller owns the
/// child (and should reap it).
pub fn spawn_qemu(
    qemu: &Path,
    args: &[String],
    log: &Path,
    group: Option<&crate::cgroup::Group>,
) -> Result<tokio::process::Child, ProcessError> {
    let mut cmd = qemu_command(qemu, args, log)?;
    let procs = group
        .map(|g| g.procs_file())
        .transpose()
        .map_err(ProcessError::Cgroup)?;
    if let Some(f) = &procs {
        let fd = f.as_raw_fd();
        // SAFETY: runs in the forked child before exec; write(2) is async-signal-safe,
        // `fd` stays open in the parent until `spawn` returns (it is closed on exec),
        // and the buffer is a static string. "0" means the writing process.
        unsafe {
            cmd.pre_exec(move || {
                if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let mut cmd = tokio::process::Command::from(cmd);
    cmd.kill_on_drop(false);
    let child = cmd
        .spawn()
        .map_err(|e| ProcessError::Spawn(qemu.to_path_buf(), e));
    drop(procs);
    child
}

/// Whether `pid` is alive and names `dir` or a file under it in its arguments: a
/// process of ours that uses that directory, such as the QEMU of a run dir or a
/// page server of its `pagesrv` (guards against pid reuse).
pub fn is_ours(pid: u32, dir: &Path) -> bool {
    if kill(Pid::from_raw(pid as i32), None).is_err() {
        return false;
    }
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    // Zombies have an empty cmdline: they are gone for our purposes.
    !cmdline.is_empty() && names_path(&cmdline, dir.as_os_str().as_encoded_bytes())
}

/// Whether one of the NUL-separated arguments `cmdline` names `path` or a file under
/// it: as a whole argument or a `key=value` option's value, followed by its end, a
/// `/` or the next option's `,` (so `/run/a` is not found in `/run/ab/qmp.sock`).
fn names_path(cmdline: &[u8], path: &[u8]) -> bool {
    if path.is_empty() {
        return false;
    }
    cmdline.split(|&b| b == 0).any(|arg| {
        (0..arg.len().saturating_sub(path.len() - 1)).any(|i| {
            arg[i..].starts_with(path)
                && (i == 0 || matches!(arg[i - 1], b'=' | b','))
                && matches!(arg.get(i + path.len()), None | Some(b'/') | Some(b','))
        })
    })
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
        let d = tempfile::tempdir().unwrap();
        let fake = d.path().join("qemu-system-x86_64");
        std::fs::write(&fake, b"#!/bin/sh\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = d.path().as_os_str().to_owned();
        assert!(matches!(
            find_qemu_in(Some("/nonexistent/qemu".into()), path.clone()),
            Err(ProcessError::NotAt(_))
        ));
        assert_eq!(
            find_qemu_in(Some(fake.clone().into()), "".into()).unwrap(),
            fake
        );
        assert_eq!(find_qemu_in(None, path.clone()).unwrap(), fake);
        assert_eq!(find_qemu_in(Some("".into()), path).unwrap(), fake);
        assert!(matches!(
            find_qemu_in(None, "/nonexistent".into()),
            Err(ProcessError::NotOnPath)
        ));
    }

    #[test]
    fn a_run_dir_is_found_only_as_a_whole_path() {
        let cmd = b"qemu\0-chardev\0socket,id=qmp,path=/r/ab/qmp.sock,server=on\0-pidfile\0/r/ab/qemu.pid\0";
        assert!(names_path(cmd, b"/r/ab"));
        assert!(!names_path(cmd, b"/r/a"), "a prefix of another VM's name");
        assert!(!names_path(cmd, b"/r/ab/q"));
        assert!(!names_path(b"qemu\0/r/ab@blk/s.sock\0", b"/r/ab"));
        assert!(names_path(
            b"x\0--socket=/r/ab@blk/s.sock\0",
            b"/r/ab@blk/s.sock"
        ));
        assert!(!names_path(b"x\0/x/r/ab\0", b"/r/ab"));
        assert!(!names_path(cmd, b""));
    }

    #[test]
    fn self_is_alive_and_measurable() {
        let me = std::process::id();
        assert!(is_alive(me));
        assert!(rss_bytes(me).unwrap() > 0);
        assert!(!is_ours(me, Path::new("/definitely/not/in/cmdline")));
        assert!(free_port().unwrap() > 0);
    }
}
