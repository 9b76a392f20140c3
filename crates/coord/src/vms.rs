//! The host's VMs as the restore protocol drives them: the daemon implements
//! [`CohortVms`] on its real VMs, the protocol's tests and the scale benchmark on
//! stand-ins ([`crate::standin`]).

use serde::{Deserialize, Serialize};

/// What a VM's working-set load reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoadInfo {
    /// Pages actually loaded.
    pub pages: u64,
    /// Seconds the load took.
    pub load_s: f64,
}

/// What a VM's start reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StartInfo {
    /// This host's wall clock (ns since the Unix epoch) when the VM began running.
    pub started_unix_ns: i64,
}

/// Why one of [`CohortVms`]' operations failed: the implementation's own error with its
/// sources; the host prints the whole chain once, into the VM's phase record.
pub type VmError = Box<dyn std::error::Error + Send + Sync>;

/// The host's VMs as the protocol sees them; the daemon implements it on its real VMs.
///
/// The host calls each method once per restore and VM, except that a restarted daemon
/// may ask `start` and `restored` again of a VM it started before: `load`, then either
/// `abort` (a held VM dropped) or `start` followed by `restored`.
#[async_trait::async_trait]
pub trait CohortVms: Send + Sync + 'static {
    /// Prepares `vm` from its snapshot and loads its working set of `ws_pages` pages,
    /// leaving it paused (held). `args` are the coordinator's opaque restore args.
    async fn load(
        &self,
        restore_id: &str,
        vm: &str,
        ws_pages: u64,
        args: &serde_json::Value,
    ) -> Result<LoadInfo, VmError>;
    /// Starts a held VM (the rest of memory loads on demand and in the background).
    async fn start(&self, restore_id: &str, vm: &str) -> Result<StartInfo, VmError>;
    /// Resolves when the rest of a started VM's memory is loaded.
    async fn restored(&self, restore_id: &str, vm: &str) -> Result<(), VmError>;
    /// Drops a held (loaded, never started) VM.
    async fn abort(&self, restore_id: &str, vm: &str);
}
