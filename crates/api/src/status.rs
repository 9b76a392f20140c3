//! What a VM reports: its state and the facts the daemon and the guest agent know.

use serde::{Deserialize, Serialize};

use crate::spec::Workload;

/// A VM's state. The daemon's per-VM state machine (`crates/rebound/src/daemon/vm`)
/// owns every transition; later capabilities add their states here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VmState {
    /// QEMU is being spawned, or runs but the guest is not yet known to be up.
    Starting,
    /// The vCPUs run.
    Running,
    /// The vCPUs are stopped (by a user, the watchdog or a QEMU error).
    Paused,
    /// The guest kernel panicked or its watchdog expired; QEMU keeps it paused with
    /// its RAM intact.
    Panicked,
    /// The crashed guest's QEMU is gone and its memory is being dumped; no recovery
    /// VM runs yet.
    Dumping,
    /// A recovery VM boots on the crashed VM's disks (a dump may run meanwhile).
    Recovering,
    /// A snapshot is being restored into this VM: QEMU waits for its device state
    /// while the chosen part of guest memory is read.
    Restoring,
    /// A stop or kill is tearing QEMU down.
    Stopping,
    /// No QEMU runs for this VM.
    Stopped,
}

impl VmState {
    /// Every state, in the order status tables and metrics list them.
    pub const ALL: [VmState; 9] = [
        VmState::Starting,
        VmState::Running,
        VmState::Paused,
        VmState::Panicked,
        VmState::Dumping,
        VmState::Recovering,
        VmState::Restoring,
        VmState::Stopping,
        VmState::Stopped,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            VmState::Starting => "starting",
            VmState::Running => "running",
            VmState::Paused => "paused",
            VmState::Panicked => "panicked",
            VmState::Dumping => "dumping",
            VmState::Recovering => "recovering",
            VmState::Restoring => "restoring",
            VmState::Stopping => "stopping",
            VmState::Stopped => "stopped",
        }
    }

    /// Whether a QEMU process belongs to a VM in this state.
    pub fn has_qemu(self) -> bool {
        !matches!(self, VmState::Stopped)
    }
}

impl std::fmt::Display for VmState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The accelerator QEMU runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Accel {
    Kvm,
    Tcg,
}

impl Accel {
    pub fn as_str(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }
}

/// A forwarded port with the service behind it, if known.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortForward {
    pub host: u16,
    pub guest: u16,
    pub service: Option<String>,
}

/// Where the guest's VMCOREINFO note is, as the agent read it from /sys/kernel/vmcoreinfo.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmcoreinfoAddr {
    pub paddr: u64,
    pub size: u64,
}

/// Where the guest's eviction-notice ring is (module `rebound_evict`, `guest/evict`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvictRingAddr {
    pub gpa: u64,
    pub bytes: u64,
}

/// Facts the guest agent reports once the workload serves (`docs/agent-protocol.md`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReadyInfo {
    pub agent_version: u32,
    pub kernel_release: String,
    #[serde(default)]
    pub mem_total_kib: u64,
    #[serde(default)]
    pub vmcoreinfo: Option<VmcoreinfoAddr>,
    /// The eviction-notice ring; none when the guest has no such module (an older
    /// agent does not say: also none).
    #[serde(default)]
    pub evict_ring: Option<EvictRingAddr>,
    #[serde(default)]
    pub workload: Option<String>,
    #[serde(default)]
    pub service_port: Option<u16>,
    #[serde(default)]
    pub uptime_ms: u64,
}

/// The API's `VmStatus`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VmStatus {
    pub name: String,
    pub state: VmState,
    pub ready: bool,
    pub qemu_pid: Option<u32>,
    pub accel: Accel,
    pub accel_reason: Option<String>,
    pub memory_mib: u64,
    pub cpus: u32,
    pub ram_file: String,
    pub run_dir: String,
    pub kernel_release: Option<String>,
    pub vmcoreinfo_paddr: Option<u64>,
    pub workload: Option<Workload>,
    pub started_at: Option<String>,
    pub ready_after_ms: Option<u64>,
    pub forwards: Vec<PortForward>,
    /// The job the VM's owner is running (`start`, `stop`, `kill`, `crash`, ...), if any.
    #[serde(default)]
    pub job: Option<String>,
    /// How far that job is, where it can tell.
    #[serde(default)]
    pub progress: Option<JobProgress>,
}

/// How far a job is, in its own units (bytes of guest memory for a dump).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobProgress {
    pub done: u64,
    pub total: u64,
}

impl VmStatus {
    /// The host port forwarded to `guest`, if any.
    pub fn host_port(&self, guest: u16) -> Option<u16> {
        self.forwards
            .iter()
            .find(|f| f.guest == guest)
            .map(|f| f.host)
    }
}
