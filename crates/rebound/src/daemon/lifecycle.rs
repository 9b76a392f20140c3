//! Starting, re-attaching, stopping and killing VMs.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::boot;
use super::error::OpError;
use super::state::{Daemon, VmHandle, VmStatus};
use super::supervisor;
use crate::spec::{BootSource, ReadySpec, VmSpec};
use crate::vm::agent::AgentLink;
use crate::vm::argv;
use crate::vm::events::{mono_ns, wall_now};
use crate::vm::process;
use crate::vm::qmp::{Qmp, QmpSession};
use crate::vm::record::{VmRecord, VmState, RECORD_VERSION};

/// How long a guest gets to power off before QEMU is told to quit.
const GRACE: Duration = Duration::from_secs(10);
/// How long QEMU gets to create its QMP socket.
const QMP_WAIT: Duration = Duration::from_secs(15);

/// Starts a VM: returns once QEMU runs and QMP answers; readiness comes later.
pub async fn start(d: &Arc<Daemon>, spec: VmSpec) -> Result<VmStatus, OpError> {
    let (boot, ready) = spec.validate()?;
    // Reserve the name before any slow work so concurrent starts cannot collide.
    let (placeholder, previous) = {
        let mut vms = d.vms.lock().expect("vms lock");
        let previous = vms.get(&spec.name).cloned();
        if let Some(v) = &previous {
            let st = v.record().state;
            if st != VmState::Stopped {
                return Err(OpError::NameInUse(spec.name.clone(), st));
            }
        }
        let h = VmHandle::new(&d.paths, new_record(d, &spec));
        vms.insert(spec.name.clone(), h.clone());
        (h, previous)
    };
    let result = spawn(d, &placeholder, spec, boot, ready).await;
    if result.is_err() {
        let mut vms = d.vms.lock().expect("vms lock");
        match previous {
            // A stopped VM of that name stays as it was.
            Some(old) => {
                if let Err(e) = old.record().save(&old.dir.record()) {
                    eprintln!("vm {}: {e}", old.name);
                }
                vms.insert(old.name.clone(), old);
            }
            // Nothing of this VM existed before: leave nothing behind.
            None => {
                vms.remove(&placeholder.name);
                let _ = std::fs::remove_dir_all(placeholder.dir.path());
            }
        }
    }
    result
}

fn new_record(d: &Daemon, spec: &VmSpec) -> VmRecord {
    let run = d.paths.run_dir(&spec.name);
    VmRecord {
        version: RECORD_VERSION,
        spec: spec.clone(),
        state: VmState::Starting,
        ready: false,
        accel: crate::vm::accel::Accel::Tcg,
        accel_reason: None,
        qemu_pid: None,
        run_dir: run.path().to_path_buf(),
        ram_file: run.ram(),
        forwards: Vec::new(),
        started_at: None,
        started_mono_ns: None,
        ready_after_ms: None,
        kernel_release: None,
        vmcoreinfo: None,
        service_port: None,
    }
}

async fn spawn(
    d: &Arc<Daemon>,
    vm: &Arc<VmHandle>,
    spec: VmSpec,
    boot: BootSource,
    ready: ReadySpec,
) -> Result<VmStatus, OpError> {
    let paths = d.paths.clone();
    let host = d.host.clone();
    let spec2 = spec.clone();
    let res =
        tokio::task::spawn_blocking(move || boot::resolve(&paths, &host, &spec2, boot, ready))
            .await
            .map_err(|e| OpError::Io(e.to_string()))??;

    let run = vm.run.clone();
    let _ = std::fs::remove_dir_all(run.path());
    std::fs::create_dir_all(run.path())
        .map_err(|e| OpError::Io(format!("cannot create {}: {e}", run.path().display())))?;
    let args = argv::build(&res.config);
    let child = process::spawn_qemu(&res.qemu, &args, &run.qemu_log())
        .map_err(|e| OpError::QemuFailed(e.to_string()))?;
    let pid = child.id().unwrap_or(0);
    let t0 = mono_ns();
    let started_at = wall_now();
    vm.stopping.store(false, Ordering::Relaxed);
    vm.update(|r| {
        *r = new_record(d, &spec);
        r.accel = res.accel.accel;
        r.accel_reason = res.accel.reason.clone();
        r.qemu_pid = Some(pid);
        r.forwards = res.forwards.clone();
        r.started_at = Some(started_at);
        r.started_mono_ns = Some(t0);
        r.service_port = spec.service_port();
    });
    vm.event(
        "started",
        Some(json!({"pid": pid, "accel": res.accel.accel.as_str(), "accel_reason": res.accel.reason, "qemu": res.qemu, "argv": args})),
    );

    let qmp = match connect_qmp(vm, pid).await {
        Ok(q) => q,
        Err(msg) => {
            process::sigkill(pid);
            let mut child = child;
            let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
            cleanup_run_dir(vm);
            vm.event("exited", Some(json!({"error": msg})));
            return Err(OpError::QemuFailed(msg));
        }
    };
    let (qmp, qmp_events) = qmp;
    let state = qmp
        .run_state()
        .await
        .map(|s| map_run_state(&s, VmState::Running))
        .unwrap_or(VmState::Running);
    vm.update(|r| r.state = state);
    attach(vm, qmp, qmp_events, res.ready, Some(child));
    Ok(vm.status())
}

/// Waits for QEMU's QMP socket and connects; on failure explains why (QEMU's last log line).
async fn connect_qmp(vm: &VmHandle, pid: u32) -> Result<QmpSession, String> {
    let deadline = tokio::time::Instant::now() + QMP_WAIT;
    let sock = vm.run.qmp();
    loop {
        if sock.exists() {
            if let Ok(q) = Qmp::connect(&sock).await {
                return Ok(q);
            }
        }
        if !process::is_alive(pid) || tokio::time::Instant::now() >= deadline {
            let why = process::last_log_line(&vm.run.qemu_log())
                .unwrap_or_else(|| "no QMP socket appeared".into());
            return Err(if process::is_alive(pid) {
                format!("QMP did not answer: {why}")
            } else {
                format!("QEMU exited: {why}")
            });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Maps QEMU's `query-status` to our state; `prev` keeps a known panic.
pub fn map_run_state(s: &str, prev: VmState) -> VmState {
    match s {
        "running" => VmState::Running,
        "guest-panicked" => VmState::Panicked,
        "shutdown" | "paused" | "watchdog" | "debug" | "io-error" | "internal-error"
        | "suspended" | "postmigrate" => {
            if prev == VmState::Panicked {
                VmState::Panicked
            } else {
                VmState::Paused
            }
        }
        _ => prev,
    }
}

/// Connects the agent link and starts the supervisor for a VM whose QMP is up.
fn attach(
    vm: &Arc<VmHandle>,
    qmp: Arc<Qmp>,
    qmp_events: tokio::sync::mpsc::UnboundedReceiver<crate::vm::qmp::QmpEvent>,
    ready: ReadySpec,
    child: Option<tokio::process::Child>,
) {
    let (atx, arx) = tokio::sync::mpsc::unbounded_channel();
    let agent = if matches!(ready, ReadySpec::Agent) || vm.record().spec.kernel.is_none() {
        Some(Arc::new(AgentLink::start(&vm.run.agent(), atx)))
    } else {
        drop(atx);
        None
    };
    *vm.qmp.lock().expect("qmp lock") = Some(qmp);
    *vm.agent.lock().expect("agent lock") = agent;
    let task = tokio::spawn(supervisor::run(vm.clone(), qmp_events, arx, ready, child));
    *vm.supervisor.lock().expect("supervisor lock") = Some(task);
}

/// Loads every VM record; re-attaches to live QEMUs, marks the rest stopped.
pub async fn reattach_all(d: &Arc<Daemon>) {
    let Ok(entries) = std::fs::read_dir(d.paths.vms_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let dir = d.paths.vm(&name);
        let rec = match VmRecord::load(&dir.record()) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("skipping VM {name}: {e}");
                continue;
            }
        };
        let vm = VmHandle::new(&d.paths, rec.clone());
        d.vms
            .lock()
            .expect("vms lock")
            .insert(name.clone(), vm.clone());
        if rec.state == VmState::Stopped {
            continue;
        }
        if let Err(why) = reattach(&vm, &rec).await {
            cleanup_run_dir(&vm);
            vm.update(|r| {
                r.state = VmState::Stopped;
                r.ready = false;
                r.qemu_pid = None;
            });
            vm.event("stopped", Some(json!({"reason": why})));
        }
    }
}

async fn reattach(vm: &Arc<VmHandle>, rec: &VmRecord) -> Result<(), String> {
    let pid = rec.qemu_pid.ok_or("no QEMU pid recorded")?;
    if !process::is_our_qemu(pid, &rec.run_dir) {
        return Err(format!("QEMU (pid {pid}) is gone"));
    }
    let (qmp, events) = tokio::time::timeout(Duration::from_secs(5), Qmp::connect(&vm.run.qmp()))
        .await
        .map_err(|_| "QMP did not answer".to_string())?
        .map_err(|e| e.to_string())?;
    let st = qmp.run_state().await.map_err(|e| e.to_string())?;
    let state = map_run_state(&st, rec.state);
    vm.update(|r| r.state = state);
    vm.event("reattached", Some(json!({"pid": pid, "qemu_status": st})));
    let ready: ReadySpec = match &rec.spec.ready {
        Some(r) => r
            .parse()
            .map_err(|e: crate::spec::SpecError| e.to_string())?,
        None => ReadySpec::Agent,
    };
    attach(vm, qmp, events, ready, None);
    Ok(())
}

/// Keeps the serial log with the VM's record, then removes the run dir (RAM, sockets).
pub fn cleanup_run_dir(vm: &VmHandle) {
    let _ = std::fs::copy(vm.run.serial_log(), vm.dir.serial_log());
    let _ = std::fs::remove_dir_all(vm.run.path());
}

/// Like [`finish_record`], after letting the supervisor reap QEMU (no zombie stays).
async fn finish(vm: &VmHandle, kind: &str, detail: serde_json::Value) {
    let task = vm.supervisor.lock().expect("supervisor lock").take();
    if let Some(mut t) = task {
        if tokio::time::timeout(Duration::from_secs(5), &mut t)
            .await
            .is_err()
        {
            t.abort();
        }
    }
    finish_record(vm, kind, detail);
}

/// Drops the connections, removes the run dir, marks the VM stopped.
fn finish_record(vm: &VmHandle, kind: &str, detail: serde_json::Value) {
    *vm.qmp.lock().expect("qmp lock") = None;
    *vm.agent.lock().expect("agent lock") = None;
    cleanup_run_dir(vm);
    vm.update(|r| {
        r.state = VmState::Stopped;
        r.ready = false;
        r.qemu_pid = None;
    });
    vm.event(kind, Some(detail));
}

/// Graceful stop: guest poweroff (agent and ACPI), then `quit`, then SIGKILL.
pub async fn stop(d: &Arc<Daemon>, name: &str) -> Result<VmStatus, OpError> {
    let vm = d.find(name)?;
    let _op = vm.op.lock().await;
    let rec = vm.record();
    let Some(pid) = rec.qemu_pid.filter(|_| rec.state != VmState::Stopped) else {
        return Ok(vm.status());
    };
    vm.stopping.store(true, Ordering::Relaxed);
    let mut how = "guest poweroff";
    let mut gone = !process::is_alive(pid);
    if !gone && rec.state == VmState::Running {
        if let Some(q) = vm.qmp() {
            let _ = q.execute("system_powerdown", None).await;
        }
        gone = poweroff_by_agent(&vm, pid).await;
    }
    if !gone {
        how = "quit";
        if let Some(q) = vm.qmp() {
            let _ = q.execute("quit", None).await;
        }
        gone = process::wait_gone(pid, Duration::from_secs(5)).await;
    }
    if !gone {
        how = "sigkill";
        process::sigkill(pid);
        process::wait_gone(pid, Duration::from_secs(5)).await;
    }
    finish(&vm, "stopped", json!({"how": how})).await;
    Ok(vm.status())
}

/// Asks the agent to power the guest off until QEMU is gone or [`GRACE`] runs out.
/// The request is repeated every second: a daemon that has just re-attached may not
/// have its agent link back yet, and a link that drops loses what it was sending.
async fn poweroff_by_agent(vm: &VmHandle, pid: u32) -> bool {
    let deadline = tokio::time::Instant::now() + GRACE;
    loop {
        if let Some(a) = vm.agent() {
            let _ = a.poweroff();
        }
        let next = (tokio::time::Instant::now() + Duration::from_secs(1)).min(deadline);
        if process::wait_gone(
            pid,
            next.saturating_duration_since(tokio::time::Instant::now()),
        )
        .await
        {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
    }
}

/// SIGKILL at once.
pub async fn kill(d: &Arc<Daemon>, name: &str) -> Result<VmStatus, OpError> {
    let vm = d.find(name)?;
    let _op = vm.op.lock().await;
    let rec = vm.record();
    if let Some(pid) = rec.qemu_pid.filter(|_| rec.state != VmState::Stopped) {
        vm.stopping.store(true, Ordering::Relaxed);
        process::sigkill(pid);
        process::wait_gone(pid, Duration::from_secs(5)).await;
        finish(&vm, "killed", json!({"pid": pid})).await;
    }
    Ok(vm.status())
}

/// Forgets a stopped VM: its record, logs and disk copy.
pub async fn remove(d: &Arc<Daemon>, name: &str) -> Result<VmStatus, OpError> {
    let vm = d.find(name)?;
    let _op = vm.op.lock().await;
    let status = vm.status();
    if status.state != VmState::Stopped {
        return Err(OpError::WrongState(
            name.to_string(),
            status.state,
            "stop or kill it before removing it",
        ));
    }
    d.vms.lock().expect("vms lock").remove(name);
    std::fs::remove_dir_all(vm.dir.path())
        .map_err(|e| OpError::Io(format!("cannot remove {}: {e}", vm.dir.path().display())))?;
    Ok(status)
}

/// Called by the supervisor when QEMU went away on its own.
pub fn exited(vm: &VmHandle, detail: serde_json::Value) {
    if vm.stopping.load(Ordering::Relaxed) {
        return;
    }
    // Called from the supervisor itself: forget its handle, do not wait on it.
    drop(vm.supervisor.lock().expect("supervisor lock").take());
    finish_record(vm, "exited", detail);
}

/// What `wait` can wait for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitFor {
    Ready,
    Panicked,
    Paused,
    Stopped,
}

impl std::str::FromStr for WaitFor {
    type Err = OpError;
    fn from_str(s: &str) -> Result<Self, OpError> {
        Ok(match s {
            "ready" => WaitFor::Ready,
            "panicked" => WaitFor::Panicked,
            "paused" => WaitFor::Paused,
            "stopped" => WaitFor::Stopped,
            _ => {
                return Err(OpError::BadRequest(format!(
                    "cannot wait for {s:?}: expected ready, panicked, paused or stopped"
                )))
            }
        })
    }
}

/// Whether `s` satisfies `w`: `Some(true)` reached, `Some(false)` never will, `None` not yet.
fn reached(w: WaitFor, s: &VmStatus) -> Option<bool> {
    let st = s.state;
    match w {
        WaitFor::Ready if s.ready && st == VmState::Running => Some(true),
        WaitFor::Panicked if st == VmState::Panicked => Some(true),
        WaitFor::Paused if matches!(st, VmState::Paused | VmState::Panicked) => Some(true),
        WaitFor::Stopped if st == VmState::Stopped => Some(true),
        _ if st == VmState::Stopped => Some(false),
        WaitFor::Ready if st == VmState::Panicked => Some(false),
        _ => None,
    }
}

/// Blocks until the VM reaches `w`, cannot anymore, or `timeout` passes.
pub async fn wait(
    d: &Arc<Daemon>,
    name: &str,
    w: WaitFor,
    timeout: Duration,
) -> Result<VmStatus, OpError> {
    let vm = d.find(name)?;
    let mut rx = vm.subscribe();
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let s = vm.status();
        match reached(w, &s) {
            Some(true) => return Ok(s),
            Some(false) => {
                return Err(OpError::Unreachable(
                    name.to_string(),
                    format!("{w:?}").to_lowercase(),
                    s.state,
                ))
            }
            None => {}
        }
        match tokio::time::timeout_at(deadline, rx.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(OpError::Io("VM handle closed".into())),
            Err(_) => {
                return Err(OpError::Timeout(
                    timeout.as_millis() as u64,
                    format!("{name} to be {}", format!("{w:?}").to_lowercase()),
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_states() {
        assert_eq!(
            map_run_state("running", VmState::Starting),
            VmState::Running
        );
        assert_eq!(
            map_run_state("guest-panicked", VmState::Running),
            VmState::Panicked
        );
        assert_eq!(
            map_run_state("paused", VmState::Panicked),
            VmState::Panicked
        );
        assert_eq!(map_run_state("paused", VmState::Running), VmState::Paused);
        assert_eq!(map_run_state("what", VmState::Running), VmState::Running);
    }
}
