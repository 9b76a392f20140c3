//! The daemon's table of VMs: starting one (a new owner), re-attaching to the VMs of
//! a previous daemon, removing a stopped one, and waiting for a state.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rebound_api::{VmSpec, VmState, VmStatus};
use rebound_vmm::accel::HostFacts;
use rebound_vmm::paths::Paths;
use rebound_vmm::record::VmRecord;

use super::error::OpError;
use super::metrics::Metrics;
use super::vm::{start_owner, Init, StartJob, VmHandle};

mod restore;

pub use super::vm::context::LogCaps;
use super::vm::context::OwnerContext;

/// Everything the daemon holds.
pub struct Daemon {
    pub paths: Paths,
    pub socket: std::path::PathBuf,
    pub host: HostFacts,
    pub metrics: Arc<Metrics>,
    /// Where VMs' memory groups go, or why there are none (budgets then are only
    /// accounted).
    pub cgroups: Result<
        rebound_vmm::cgroup::MemoryCgroups,
        std::sync::Arc<rebound_vmm::cgroup::CgroupError>,
    >,
    vms: Mutex<HashMap<String, Arc<VmHandle>>>,
    pub shutdown: tokio::sync::Notify,
    /// The cluster side: this host's part in the cluster store's restores.
    pub cluster: std::sync::OnceLock<super::cluster::side::Cluster>,
    pub logs: LogCaps,
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

impl Daemon {
    pub fn new(paths: Paths, socket: std::path::PathBuf) -> Daemon {
        let cgroups = rebound_vmm::cgroup::MemoryCgroups::detect(&paths.home).map_err(Arc::new);
        Daemon {
            paths,
            socket,
            host: HostFacts::probe(),
            metrics: Arc::new(Metrics::new()),
            cgroups,
            vms: Mutex::new(HashMap::new()),
            shutdown: tokio::sync::Notify::new(),
            cluster: std::sync::OnceLock::new(),
            logs: LogCaps::default(),
        }
    }

    /// What each VM's owner takes from the daemon.
    fn owner_context(&self) -> OwnerContext {
        OwnerContext {
            paths: self.paths.clone(),
            host: self.host.clone(),
            metrics: self.metrics.clone(),
            cgroups: self.cgroups.clone(),
            logs: self.logs,
        }
    }

    pub fn with_log_caps(mut self, logs: LogCaps) -> Daemon {
        self.logs = logs;
        self
    }

    pub fn get(&self, name: &str) -> Option<Arc<VmHandle>> {
        self.vms.lock().expect("vms lock").get(name).cloned()
    }

    /// The VM, or the API's "unknown VM" error.
    pub fn find(&self, name: &str) -> Result<Arc<VmHandle>, OpError> {
        self.get(name)
            .ok_or_else(|| OpError::UnknownVm(name.to_string()))
    }

    pub fn list(&self) -> Vec<Arc<VmHandle>> {
        let mut v: Vec<_> = self
            .vms
            .lock()
            .expect("vms lock")
            .values()
            .cloned()
            .collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    /// The metrics text, with VMs counted by state now.
    pub fn metrics_text(&self) -> String {
        let states: Vec<VmState> = self.list().iter().map(|v| v.status().state).collect();
        self.metrics.render(states)
    }

    /// Starts a VM: returns once QEMU runs and QMP answers; readiness comes later.
    pub async fn start(self: &Arc<Self>, mut spec: VmSpec) -> Result<VmStatus, OpError> {
        spec.fill_macs()?;
        let (boot, ready) = spec.validate()?;
        if spec.crash.recover_from.is_some() {
            let s = spec.clone();
            tokio::task::spawn_blocking(move || super::vm::check_recover_from(&s))
                .await
                .map_err(OpError::Task)??;
        }
        self.launch(&spec.clone(), |tx| {
            Init::Start(Box::new(StartJob {
                spec,
                boot,
                ready,
                reply: tx,
            }))
        })
        .await
    }

    /// Reserves `name` (a stopped VM of that name may be replaced), starts its
    /// owner with `init` and waits for its answer; on failure, what was there before
    /// stays and nothing new is left behind.
    async fn launch<T>(
        self: &Arc<Self>,
        spec: &VmSpec,
        init: impl FnOnce(tokio::sync::oneshot::Sender<Result<T, OpError>>) -> Init,
    ) -> Result<T, OpError> {
        // Reserve the name before any slow work so concurrent starts cannot collide.
        let name = spec.name.as_str();
        let (vm, jobs, previous) = {
            let mut vms = self.vms.lock().expect("vms lock");
            let previous = vms.get(name).cloned();
            if let Some(v) = &previous {
                let st = v.status().state;
                if st != VmState::Stopped {
                    return Err(OpError::NameInUse(name.to_string(), st));
                }
            }
            let rec = VmRecord::new(spec, &self.paths.run_dir(name));
            let (h, jobs) = VmHandle::new(&self.paths, rec, self.logs.events);
            vms.insert(name.to_string(), h.clone());
            (h, jobs, previous)
        };
        // A stopped VM of that name keeps its record and disks until the new one
        // runs (`replace`).
        if previous.is_some() {
            if let Err(e) = super::replace::set_aside(&vm.dir) {
                let mut vms = self.vms.lock().expect("vms lock");
                if let Some(old) = previous {
                    vms.insert(old.name.clone(), old);
                }
                return Err(OpError::Broken(Box::new(e)));
            }
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        start_owner(self.owner_context(), vm.clone(), jobs, init(tx));
        let result = rx
            .await
            .unwrap_or_else(|_| Err(OpError::OwnerGone(vm.name.clone())));
        if result.is_ok() {
            super::replace::drop_aside(&vm.dir);
        } else {
            let mut vms = self.vms.lock().expect("vms lock");
            match previous {
                // A stopped VM of that name stays as it was.
                Some(old) => {
                    super::replace::put_back(&old.dir);
                    if let Err(e) = old.record().save(&old.dir.record()) {
                        tracing::error!(vm = %old.name, "{}", rebound_errors::chain(&e));
                    }
                    vms.insert(old.name.clone(), old);
                }
                // Nothing of this VM existed before: leave nothing behind.
                None => {
                    vms.remove(&vm.name);
                    let _ = std::fs::remove_dir_all(vm.dir.path());
                }
            }
        }
        result
    }

    /// Loads every VM record; re-attaches to live QEMUs, marks the rest stopped.
    pub async fn reattach_all(self: &Arc<Self>) {
        let Ok(entries) = std::fs::read_dir(self.paths.vms_dir()) else {
            return;
        };
        let mut records = Vec::new();
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            let dir = self.paths.vm(&name);
            let mut rec = VmRecord::load(&dir.record());
            if super::replace::pending(&dir) {
                // A start over a stopped VM's name was under way: if it never
                // answered, its QEMU (killed below, owned by no record) and files
                // go and the stopped VM comes back; if it did, the old files go.
                let unfinished = rec.as_ref().map_or(true, |r| {
                    matches!(r.state, VmState::Starting | VmState::Restoring)
                });
                if unfinished {
                    super::replace::put_back(&dir);
                    rec = VmRecord::load(&dir.record());
                } else {
                    super::replace::drop_aside(&dir);
                }
            }
            match rec {
                Ok(r) => records.push((name, r)),
                Err(e) => tracing::warn!(vm = %name, "skipping VM: {}", rebound_errors::chain(&e)),
            }
        }
        // QEMUs that no record owns: started by a daemon that died before it
        // recorded them (they never ran guest code), or a settle's second QEMU.
        let owned: Vec<u32> = records
            .iter()
            .filter(|(_, r)| r.state.has_qemu())
            .filter_map(|(_, r)| r.qemu_pid)
            .collect();
        for (run, _) in super::replace::kill_unowned(&self.paths, &owned).await {
            // The run dir of a VM that runs no QEMU any more holds only that QEMU's
            // RAM and sockets.
            let live = records
                .iter()
                .any(|(n, r)| r.state.has_qemu() && run == self.paths.run_dir(n).path());
            if !live {
                let _ = std::fs::remove_dir_all(&run);
            }
        }
        let mut pending = Vec::new();
        for (name, rec) in records {
            let live = rec.state.has_qemu();
            let (vm, jobs) = VmHandle::new(&self.paths, rec, self.logs.events);
            self.vms.lock().expect("vms lock").insert(name, vm.clone());
            if live {
                let (done, settled) = tokio::sync::oneshot::channel();
                start_owner(self.owner_context(), vm, jobs, Init::Reattach { done });
                pending.push(settled);
            } else {
                // A stopped VM's owner only waits for jobs (stop and kill are no-ops).
                start_owner(self.owner_context(), vm, jobs, Init::Idle);
            }
        }
        // Owners re-attach in parallel; the daemon serves once every VM is settled.
        for settled in pending {
            let _ = settled.await;
        }
    }

    /// Forgets a stopped VM: its record, logs and disk copy.
    pub fn remove(&self, name: &str) -> Result<VmStatus, OpError> {
        let mut vms = self.vms.lock().expect("vms lock");
        let vm = vms
            .get(name)
            .cloned()
            .ok_or_else(|| OpError::UnknownVm(name.to_string()))?;
        let status = vm.status();
        if status.state != VmState::Stopped || status.job.is_some() {
            return Err(OpError::WrongState(
                name.to_string(),
                status.state,
                "stop or kill it before removing it",
            ));
        }
        // Dropping the handle ends its owner.
        vms.remove(name);
        if let Ok(cg) = &self.cgroups {
            cg.remove_vm(name);
        }
        // Its QEMU has exited by now; a tap it held a moment ago is free.
        rebound_vmm::net::unplug_all(name, vm.record().spec.nics.len());
        std::fs::remove_dir_all(vm.dir.path())
            .map_err(|e| OpError::Io(format!("cannot remove {}", vm.dir.path().display()), e))?;
        Ok(status)
    }

    /// Blocks until the VM reaches `w`, cannot anymore, or `timeout` passes.
    pub async fn wait(
        &self,
        name: &str,
        w: WaitFor,
        timeout: Duration,
    ) -> Result<VmStatus, OpError> {
        let vm = self.find(name)?;
        let mut rx = vm.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        let what = format!("{w:?}").to_lowercase();
        loop {
            let s = vm.status();
            match reached(w, &s) {
                Some(true) => return Ok(s),
                Some(false) => return Err(OpError::Unreachable(name.to_string(), what, s.state)),
                None => {}
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err(OpError::OwnerGone(name.to_string())),
                Err(_) => {
                    return Err(OpError::Timeout(
                        timeout.as_millis() as u64,
                        format!("{name} to be {what}"),
                    ))
                }
            }
        }
    }
}
