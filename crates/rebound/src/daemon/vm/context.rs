//! What a VM's owner takes from the daemon when it starts: its own module, so the
//! owner depends on these values and not on the daemon's table of VMs.

use std::sync::Arc;

use rebound_vmm::accel::HostFacts;
use rebound_vmm::paths::Paths;

use crate::daemon::metrics::Metrics;

/// Caps, in bytes on disk, of each VM's logs that its guest can fill (each log
/// and its previous generation together).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogCaps {
    pub serial: u64,
    pub qemu: u64,
    pub events: u64,
}

impl Default for LogCaps {
    fn default() -> Self {
        LogCaps {
            serial: rebound_vmm::console::DEFAULT_CAP,
            qemu: rebound_vmm::console::DEFAULT_CAP,
            events: rebound_vmm::events::DEFAULT_CAP,
        }
    }
}

/// The daemon's shared parts an owner keeps.
pub struct OwnerContext {
    pub paths: Paths,
    pub host: HostFacts,
    pub metrics: Arc<Metrics>,
    pub cgroups: Result<
        rebound_vmm::cgroup::MemoryCgroups,
        std::sync::Arc<rebound_vmm::cgroup::CgroupError>,
    >,
    pub logs: LogCaps,
}
