//! The daemon's table of VMs and what each reports as its status.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use serde::Serialize;
use tokio::sync::watch;

use crate::paths::{Paths, RunDir, VmDir};
use crate::vm::accel::HostFacts;
use crate::vm::agent::AgentLink;
use crate::vm::events::{Event, EventLog};
use crate::vm::qmp::Qmp;
use crate::vm::record::{PortForward, VmRecord, VmState};

/// The API's `VmStatus`.
#[derive(Debug, Clone, Serialize)]
pub struct VmStatus {
    pub name: String,
    pub state: VmState,
    pub ready: bool,
    pub qemu_pid: Option<u32>,
    pub accel: &'static str,
    pub accel_reason: Option<String>,
    pub memory_mib: u64,
    pub cpus: u32,
    pub ram_file: String,
    pub run_dir: String,
    pub kernel_release: Option<String>,
    pub vmcoreinfo_paddr: Option<u64>,
    pub workload: Option<&'static str>,
    pub started_at: Option<String>,
    pub ready_after_ms: Option<u64>,
    pub forwards: Vec<PortForward>,
}

impl VmStatus {
    pub fn of(rec: &VmRecord) -> VmStatus {
        VmStatus {
            name: rec.spec.name.clone(),
            state: rec.state,
            ready: rec.ready,
            qemu_pid: rec.qemu_pid,
            accel: rec.accel.as_str(),
            accel_reason: rec.accel_reason.clone(),
            memory_mib: rec.spec.memory_mib,
            cpus: rec.spec.cpus,
            ram_file: rec.ram_file.display().to_string(),
            run_dir: rec.run_dir.display().to_string(),
            kernel_release: rec.kernel_release.clone(),
            vmcoreinfo_paddr: rec.vmcoreinfo.map(|v| v.paddr),
            workload: rec.spec.workload.map(|w| w.as_str()),
            started_at: rec.started_at.clone(),
            ready_after_ms: rec.ready_after_ms,
            forwards: rec.forwards.clone(),
        }
    }
}

/// One VM the daemon knows.
pub struct VmHandle {
    pub name: String,
    pub dir: VmDir,
    pub run: RunDir,
    pub events: EventLog,
    rec: Mutex<VmRecord>,
    pub qmp: Mutex<Option<Arc<Qmp>>>,
    pub agent: Mutex<Option<Arc<AgentLink>>>,
    /// Bumped on every record change; waiters watch it.
    changed: watch::Sender<u64>,
    /// Set while stop/kill tear the VM down, so the supervisor leaves cleanup to them.
    pub stopping: AtomicBool,
    /// Serializes lifecycle operations on this VM.
    pub op: tokio::sync::Mutex<()>,
    pub supervisor: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl VmHandle {
    pub fn new(paths: &Paths, rec: VmRecord) -> Arc<VmHandle> {
        let name = rec.spec.name.clone();
        let dir = paths.vm(&name);
        Arc::new(VmHandle {
            events: EventLog::new(&dir.events()),
            run: paths.run_dir(&name),
            dir,
            name,
            rec: Mutex::new(rec),
            qmp: Mutex::new(None),
            agent: Mutex::new(None),
            changed: watch::channel(0).0,
            stopping: AtomicBool::new(false),
            op: tokio::sync::Mutex::new(()),
            supervisor: Mutex::new(None),
        })
    }

    /// A copy of the record.
    pub fn record(&self) -> VmRecord {
        self.rec.lock().expect("record lock").clone()
    }

    pub fn status(&self) -> VmStatus {
        VmStatus::of(&self.rec.lock().expect("record lock"))
    }

    /// Changes the record, persists it and wakes waiters.
    pub fn update<R>(&self, f: impl FnOnce(&mut VmRecord) -> R) -> R {
        let (r, snapshot) = {
            let mut rec = self.rec.lock().expect("record lock");
            let r = f(&mut rec);
            (r, rec.clone())
        };
        if let Err(e) = snapshot.save(&self.dir.record()) {
            eprintln!("vm {}: {e}", self.name);
        }
        self.changed.send_modify(|v| *v += 1);
        r
    }

    /// Appends to the event log; a failure is reported, not fatal.
    pub fn event(&self, kind: &str, detail: Option<serde_json::Value>) -> Option<Event> {
        match self.events.append(kind, detail) {
            Ok(e) => Some(e),
            Err(e) => {
                eprintln!("vm {}: {e}", self.name);
                None
            }
        }
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    pub fn qmp(&self) -> Option<Arc<Qmp>> {
        self.qmp.lock().expect("qmp lock").clone()
    }

    pub fn agent(&self) -> Option<Arc<AgentLink>> {
        self.agent.lock().expect("agent lock").clone()
    }
}

/// Everything the daemon holds.
pub struct Daemon {
    pub paths: Paths,
    pub socket: std::path::PathBuf,
    pub host: HostFacts,
    pub vms: Mutex<HashMap<String, Arc<VmHandle>>>,
    pub shutdown: tokio::sync::Notify,
}

impl Daemon {
    pub fn get(&self, name: &str) -> Option<Arc<VmHandle>> {
        self.vms.lock().expect("vms lock").get(name).cloned()
    }

    /// The VM, or the API's "unknown VM" error.
    pub fn find(&self, name: &str) -> Result<Arc<VmHandle>, super::error::OpError> {
        self.get(name)
            .ok_or_else(|| super::error::OpError::UnknownVm(name.to_string()))
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
}
