//! Reboots: `POST /v1/vms/{name}/reboot`, cold or warm (the guest's file cache read
//! back after the boot from the host's block cache).

use serde::{Deserialize, Serialize};

/// `POST /v1/vms/{name}/reboot`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RebootRequest {
    /// List the guest's cached file pages before the reboot and read them back after.
    #[serde(default)]
    pub warm: bool,
    /// Reset the machine at once (QMP `system_reset`): no sync, writes in flight are
    /// lost as in a power cut. Without it the agent syncs and reboots (a guest without
    /// the agent is reset).
    #[serde(default)]
    pub hard: bool,
}

/// What a guest's prefetch read back after a warm reboot.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrefetchReport {
    /// Files read, and those in the list that are gone now.
    pub files: u64,
    pub missing: u64,
    pub pages: u64,
    pub bytes: u64,
    /// List lines the guest refused (bad paths).
    pub skipped: u64,
    /// Guest time the reading took.
    pub ms: u64,
}

/// The answer to a reboot.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RebootReport {
    pub name: String,
    /// A warm reboot was asked for.
    pub warm: bool,
    /// `agent` (sync and reboot in the guest), `reset` (QMP `system_reset`), or
    /// `agent+reset` (synced, but not back within 45 s of its reboot(2): reset).
    pub how: String,
    /// The guest's cached file pages listed before the reboot.
    pub cached_files: u64,
    pub cached_pages: u64,
    /// How long listing them took (the guest still serves meanwhile).
    #[serde(default)]
    pub list_ms: Option<u64>,
    /// From the request to the rebooted guest's agent being up again; absent for a
    /// guest without the agent (its readiness probe says when it is back).
    #[serde(default)]
    pub reboot_ms: Option<u64>,
    /// What was read back (warm reboots whose list could be used).
    #[serde(default)]
    pub prefetch: Option<PrefetchReport>,
    /// Why a warm reboot went cold (no agent, the list missing or damaged, ...).
    #[serde(default)]
    pub cold_reason: Option<String>,
}
