//! The VM's disk backends (`--disk-backend rebound`): one `rebound blk serve` process
//! per disk, started before QEMU. They live in their own process group, so they
//! outlive a crashed QEMU (the recovery VM reconnects to the same backend, its host
//! cache still warm) and a daemon restart (QEMU's `reconnect` covers a backend
//! restart); they stop with the VM. One that ends on its own is started again by the
//! thread that reaps it (QEMU reconnects and resends the requests in flight), and the
//! event log says so.

use std::path::Path;
use std::time::{Duration, Instant};

use rebound_vmm::record::BlkProcess;
use rebound_vmm::resolve::BlkServe;

use std::sync::Arc;

use super::owner::Owner;
use super::qemu_error::QemuError;
use super::VmHandle;
use crate::daemon::error::OpError;

/// How long a new backend gets to listen on its socket.
const LISTEN_WAIT: Duration = Duration::from_secs(10);

impl Owner {
    /// Starts the backends `want` that do not run yet (one that runs for the same
    /// socket and disk is kept); returns them all, for the VM record.
    pub(super) async fn ensure_backends(
        &mut self,
        want: &[BlkServe],
    ) -> Result<Vec<BlkProcess>, OpError> {
        let have = self.vm.record().blk;
        let mut out = Vec::new();
        for s in want {
            let kept = have.iter().find(|p| {
                p.serve.socket == s.socket
                    && p.serve.disk == s.disk
                    && rebound_vmm::process::is_ours(p.pid, &s.socket)
            });
            match kept {
                Some(p) => out.push(p.clone()),
                None => {
                    let (s, vm) = (s.clone(), self.vm.clone());
                    let p = tokio::task::spawn_blocking(move || spawn(&s, vm))
                        .await
                        .map_err(OpError::Task)??;
                    out.push(p);
                }
            }
        }
        // Backends the VM no longer has (its disks changed since) go, out of the
        // record first so that nothing starts them again.
        self.vm.update(|r| r.blk.retain(|p| out.contains(p)));
        for p in have.iter().filter(|p| !out.contains(p)) {
            kill(p);
        }
        Ok(out)
    }

    /// After a daemon restart: watches the backends an earlier daemon started (and
    /// starts again any that ended meanwhile, since QEMU waits to reconnect).
    pub(super) fn adopt_backends(&self) {
        for p in self.vm.record().blk {
            let (vm, s, pid) = (self.vm.clone(), p.serve.clone(), p.pid);
            std::thread::spawn(move || supervise_from(Waited::Adopted, pid, s, vm));
        }
    }

    /// Stops the VM's backends (the VM stopped for good).
    pub(super) fn stop_backends(&mut self) {
        self.vm.evict_stop("the VM stopped");
        let procs = self.vm.record().blk;
        if procs.is_empty() {
            return;
        }
        // Out of the record first: the reaper then knows the end was asked for.
        self.vm.update(|r| r.blk.clear());
        for p in &procs {
            kill(p);
        }
        let _ = std::fs::remove_dir_all(self.paths.blk_dir(&self.vm.name));
    }
}

fn kill(p: &BlkProcess) {
    if rebound_vmm::process::is_ours(p.pid, &p.serve.socket) {
        rebound_vmm::process::sigkill(p.pid);
    }
}

/// Starts one backend, waits until it listens, and leaves a thread that reaps it and
/// starts it again if it ends while the VM still has it.
fn spawn(s: &BlkServe, vm: Arc<VmHandle>) -> Result<BlkProcess, OpError> {
    let (child, pid) = start(s)?;
    let serve = s.clone();
    std::thread::spawn(move || supervise(child, pid, serve, vm));
    Ok(BlkProcess {
        pid,
        serve: s.clone(),
    })
}

/// Waits for the backend `pid`; while the VM's record still has it when it ends,
/// starts a new one in its place.
fn supervise(child: std::process::Child, pid: u32, s: BlkServe, vm: Arc<VmHandle>) {
    supervise_from(Waited::Child(child), pid, s, vm)
}

/// What the supervisor waits on: its own child, or (after a daemon restart) a
/// backend an earlier daemon started, which it can only poll.
enum Waited {
    Child(std::process::Child),
    Adopted,
}

impl Waited {
    fn wait(&mut self, pid: u32, socket: &Path) -> String {
        match self {
            Waited::Child(c) => match c.wait() {
                Ok(st) => st.to_string(),
                Err(e) => e.to_string(),
            },
            Waited::Adopted => {
                while rebound_vmm::process::is_ours(pid, socket) {
                    std::thread::sleep(Duration::from_millis(250));
                }
                "it went away while a previous daemon had started it".into()
            }
        }
    }
}

fn supervise_from(mut child: Waited, mut pid: u32, s: BlkServe, vm: Arc<VmHandle>) {
    loop {
        let reason = child.wait(pid, &s.socket);
        let ours = |pid: u32| vm.record().blk.iter().any(|p| p.pid == pid);
        if !ours(pid) {
            return;
        }
        tracing::warn!(vm = %vm.name, "the disk backend for {} ended ({reason}): starting a new one", s.disk.display());
        let mut tries = 0;
        let (next, next_pid) = loop {
            match start(&s) {
                Ok(c) => break c,
                Err(e) if tries < 20 => {
                    tries += 1;
                    tracing::warn!(vm = %vm.name, "{}", rebound_errors::chain(&e));
                    std::thread::sleep(Duration::from_millis(500));
                }
                Err(e) => {
                    tracing::error!(vm = %vm.name, "giving up on the disk backend for {}: {}", s.disk.display(), rebound_errors::chain(&e));
                    return;
                }
            }
            if !ours(pid) {
                return;
            }
        };
        let replaced = vm.update(|r| match r.blk.iter_mut().find(|p| p.pid == pid) {
            Some(p) => {
                p.pid = next_pid;
                true
            }
            None => false,
        });
        if !replaced {
            // The VM stopped meanwhile.
            let mut next = next;
            let _ = next.kill();
            let _ = next.wait();
            return;
        }
        let _ = vm
            .events
            .append(rebound_api::EventData::DiskBackendRestarted {
                disk: s.disk.display().to_string(),
                pid: next_pid,
                reason,
            });
        (child, pid) = (Waited::Child(next), next_pid);
    }
}

/// Starts one backend process and waits until it listens.
fn start(s: &BlkServe) -> Result<(std::process::Child, u32), OpError> {
    use std::os::unix::process::CommandExt;
    let io = |what: &str, e| {
        OpError::Io(
            format!("{what} for the disk backend of {}", s.disk.display()),
            e,
        )
    };
    if let Some(dir) = s.socket.parent() {
        rebound_vmm::private::create_dir_all(dir)
            .map_err(|e| io("cannot create the socket directory", e))?;
    }
    let _ = std::fs::remove_file(&s.socket);
    // A test build of the backend (`rebound-blk-faulty`, correctness checks that can
    // be turned off) when REBOUND_BLK_EXE names one; this program otherwise.
    let exe = match std::env::var_os("REBOUND_BLK_EXE") {
        Some(e) => std::path::PathBuf::from(e),
        None => std::env::current_exe().map_err(|e| io("cannot find this program", e))?,
    };
    let log = std::fs::File::create(&s.log).map_err(|e| io("cannot create the log", e))?;
    let err = log
        .try_clone()
        .map_err(|e| io("cannot create the log", e))?;
    let mut child = std::process::Command::new(exe)
        .arg("blk")
        .arg("serve")
        .arg("--disk")
        .arg(&s.disk)
        .arg("--socket")
        .arg(&s.socket)
        .arg("--control")
        .arg(&s.control)
        .arg("--cache")
        .arg(s.cache_bytes.to_string())
        .arg("--queues")
        .arg(s.queues.to_string())
        .arg("--serial")
        .arg(&s.serial)
        .args(s.exclusive.then_some("--exclusive"))
        .stdin(std::process::Stdio::null())
        .stdout(log)
        .stderr(err)
        // Its own group: signals to the daemon's group do not reach it.
        .process_group(0)
        .spawn()
        .map_err(|e| io("cannot start", e))?;
    let pid = child.id();
    let end = Instant::now() + LISTEN_WAIT;
    loop {
        if let Ok(Some(st)) = child.try_wait() {
            return Err(OpError::QemuFailed(QemuError::BackendExited {
                disk: s.disk.clone(),
                status: st,
                last: last_line(&s.log),
            }));
        }
        if s.socket.exists() {
            break;
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            return Err(OpError::QemuFailed(QemuError::BackendSilent {
                disk: s.disk.clone(),
                socket: s.socket.clone(),
                secs: LISTEN_WAIT.as_secs(),
            }));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok((child, pid))
}

fn last_line(log: &Path) -> String {
    std::fs::read_to_string(log)
        .ok()
        .and_then(|t| t.lines().last().map(str::to_string))
        .unwrap_or_else(|| "no output".into())
}
