//! The API's smaller answers.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `GET /v1/health`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Health {
    pub pid: u32,
    pub version: String,
    pub socket: String,
}

/// Every error answer: one line naming the problem.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
}

/// `POST /v1/vms/{name}/marker`: where the agent placed the marker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MarkerReply {
    pub paddr: u64,
    pub len: u64,
}

/// `GET /v1/vms/{name}/vmcoreinfo`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VmcoreinfoReply {
    pub paddr: u64,
    /// How the note was found: `agent` (address from the guest) or `scan` (searched in RAM).
    pub source: String,
    pub osrelease: String,
    pub entries: BTreeMap<String, String>,
}

/// `POST /v1/vms/{name}/memory`: what moved between the guest and its host caches.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostCacheReport {
    pub guest_mib_before: u64,
    /// The guest's memory now (its balloon's size).
    pub guest_mib: u64,
    /// Host cache of the VM's Rebound-served disks, in all.
    pub host_cache_bytes: u64,
    pub per_disk_bytes: u64,
    pub disks: u64,
    /// The caches hold only what the guest evicts.
    pub exclusive: bool,
    /// Seconds until the guest had given (or taken back) the memory.
    pub balloon_s: f64,
    pub notes: Vec<String>,
}
