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
    /// The VM's allocation: the guest's memory plus its exclusive host caches.
    pub allocation_mib: u64,
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

/// `GET /v1/vms/{name}/mrc`: the guest's miss-ratio curve, traced below its memory by
/// the exclusive host cache of each Rebound-served disk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MrcReport {
    /// The guest's memory now (X): the spec's memory less the host caches.
    pub guest_bytes: u64,
    /// The VM's allocation X + Y: guest memory plus its exclusive host caches.
    pub allocation_bytes: u64,
    pub disks: Vec<DiskMrc>,
}

/// One disk's part of [`MrcReport`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DiskMrc {
    pub id: String,
    pub host_cache_bytes: u64,
    /// Fraction of the disk's blocks traced (1: exact; below: SHARDS sampling).
    pub rate: f64,
    /// Reads that missed the guest since tracing began (host-cache hits and disk reads).
    pub misses: u64,
    /// Blocks the guest evicted and has not read back.
    pub evicted_blocks: u64,
    /// Blocks reported evicted twice without a read between (lost or reordered
    /// notices: the curve is then approximate).
    pub inconsistent_blocks: u64,
    /// The guest's misses at each memory size from X up; empty before the first miss.
    pub points: Vec<MrcPoint>,
    /// Why there is no curve, when there is none.
    pub detail: Option<String>,
}

/// A point of a miss-ratio curve.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MrcPoint {
    /// Guest memory size.
    pub bytes: u64,
    /// Reads that would have missed a guest of this size.
    pub misses: f64,
    /// `misses` over the misses at the VM's allocation X + Y (the paper's figure 11
    /// ratio); `None` when there were none there.
    pub vs_allocation: Option<f64>,
}

/// `POST /v1/memory/plan`: how to divide the memory the VMs hold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanRequest {
    /// `isolated-sharing` or `esx-idle-tax`.
    #[serde(default = "default_policy")]
    pub policy: String,
    /// Isolated sharing: the largest increase of a VM's predicted misses over those
    /// at its allocation now, as a fraction (default 0.05).
    #[serde(default)]
    pub bound: Option<f64>,
    /// Isolated sharing: how far under the bound the plan stays, for the curves'
    /// prediction error, as a fraction (default 0.03, `rebound_mrc::alloc::DEFAULT_MARGIN`):
    /// no VM's predicted increase is more than `bound - margin`.
    #[serde(default)]
    pub margin: Option<f64>,
    /// Allocations are whole multiples of this (default 4 MiB, as the paper).
    #[serde(default)]
    pub unit_bytes: Option<u64>,
    /// ESX: the idle memory tax rate (default 0.75, ESX's).
    #[serde(default)]
    pub tax_rate: Option<f64>,
    /// The VMs to plan for (default: every VM with an exclusive host cache).
    #[serde(default)]
    pub vms: Option<Vec<String>>,
    /// Change each VM's allocation to its share.
    #[serde(default)]
    pub apply: bool,
}

fn default_policy() -> String {
    "isolated-sharing".into()
}

/// The answer to [`PlanRequest`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryPlan {
    pub policy: String,
    pub bound: f64,
    /// The plan kept every VM's predicted increase within `bound - margin`.
    pub margin: f64,
    pub unit_bytes: u64,
    /// What is divided: the VMs' allocations now, in whole units.
    pub total_bytes: u64,
    /// The VMs' allocations now, in all.
    pub held_bytes: u64,
    /// Geometric mean of the VMs' predicted misses relative to those at their
    /// allocation now (the paper's table 2).
    pub geo_mean_relative: f64,
    pub geo_mean_miss_ratio: f64,
    pub vms: Vec<PlannedVm>,
}

/// One VM of a [`MemoryPlan`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlannedVm {
    pub name: String,
    /// Its allocation now.
    pub baseline_bytes: u64,
    pub planned_bytes: u64,
    /// Where its curve starts (its guest's memory now): the plan goes no lower.
    pub curve_from_bytes: u64,
    pub predicted_misses: f64,
    pub baseline_misses: f64,
    /// `predicted_misses / baseline_misses` (floored at half a miss).
    pub relative: f64,
    pub within_bound: bool,
    /// Predicted within `bound - margin` too (always, under isolated sharing).
    pub within_margin: bool,
    /// ESX: the memory its curve says it uses.
    pub active_bytes: Option<u64>,
    /// With `apply`: what its allocation became, or why it did not change.
    pub applied: Option<Applied>,
}

/// The outcome of applying one VM's share.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Applied {
    pub allocation_bytes: Option<u64>,
    pub error: Option<String>,
}
