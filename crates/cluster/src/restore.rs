//! Planning the restore of a cluster snapshot into a cluster (HotRestore section 4):
//! which snapshot each VM comes from, each VM's figures, each host's load rate, and
//! per VM what it loads and when it starts, by variant. The caller opens the
//! snapshots, probes the disks and talks to the daemons; everything decided from what
//! they found is here.
//!
//! 1. The cluster manifest and every VM's snapshot are checked against the cluster
//!    (same VMs, each snapshot of that VM with that NIC): a mismatch stops the
//!    restore before anything is touched ([`figures`]).
//! 2. Each VM's figures: its working-set trace, its default elastic working set (half
//!    the paper's estimate) and its RAM; each host's load rate in pages per second,
//!    from the last restore of this cluster (`load-rates.json` in the cluster's state,
//!    [`Rates`]) or, the first time, probed by reading working-set pages of that
//!    host's snapshots.
//! 3. The plan, by [`Variant`]: `working-set` (each VM loads its whole traced working
//!    set and starts when loaded), `elastic` (its default elastic working set, starts
//!    when loaded), `line` (the restore dependency graph from the frames recorded
//!    after the snapshot point, the restore line by LP, each VM's working set revised
//!    to its point on the line; it starts at that point once the VMs it sends to have
//!    started, rings together), `line-keep` (the same, with no VM started before its
//!    elastic working set is loaded: the line only delays) ([`plan`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::line::{self, Dependency, LineError, LineInput, RestoreLine, VmLoad};
use crate::rdg::RdgEdge;
use crate::snapshot::{Manifest, ManifestVm};
use crate::spec::{ClusterSpec, VmSpec as ClusterVm};

/// Errors planning a cluster restore.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("--margin-s must be 0 or more seconds (and under 60)")]
    Margin,
    #[error("the cluster snapshot holds VM {vm:?}, which cluster {cluster} does not have")]
    NotInCluster { vm: String, cluster: String },
    #[error("VM {vm:?} of cluster {cluster} is not in the cluster snapshot {}", from.display())]
    NotInSnapshot {
        vm: String,
        cluster: String,
        from: PathBuf,
    },
    #[error(
        "VM {vm:?} had address {was} in the cluster snapshot but has {now} in cluster {cluster}"
    )]
    Address {
        vm: String,
        was: std::net::Ipv4Addr,
        now: std::net::Ipv4Addr,
        cluster: String,
    },
    #[error("{} is a snapshot of VM {of:?} (NIC {nic:?}), not of VM {vm:?} with MAC {mac}", dir.display())]
    OtherVm {
        dir: PathBuf,
        of: String,
        nic: String,
        vm: String,
        mac: String,
    },
    #[error("the snapshot of VM {0:?} has no working-set trace: it cannot be restored on a line")]
    NoTrace(String),
    #[error("the load rate must be a positive number of pages per second, got {0}")]
    Rate(f64),
    #[error("a VM on the line")]
    NotOnLine(String),
    #[error(transparent)]
    Line(#[from] LineError),
}

/// How the VMs are restored (HotRestore section 6.2's three mechanisms).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum Variant {
    /// Each VM loads its whole working set and starts when loaded.
    WorkingSet,
    /// Each VM loads its elastic working set and starts when loaded.
    Elastic,
    /// Elastic working sets revised to the restore line; started on it.
    Line,
    /// The same line with no VM started before its elastic working set is loaded:
    /// starts only move later and working sets only grow.
    LineKeep,
}

impl Variant {
    pub fn as_str(self) -> &'static str {
        match self {
            Variant::WorkingSet => "working-set",
            Variant::Elastic => "elastic",
            Variant::Line => "line",
            Variant::LineKeep => "line-keep",
        }
    }

    /// The restore mode each VM's daemon restores it in.
    pub fn vm_mode(self) -> &'static str {
        match self {
            Variant::WorkingSet => "working-set",
            _ => "elastic",
        }
    }
}

/// What the plan of one restore depends on besides the VMs' figures.
#[derive(Clone, Copy, Debug)]
pub struct PlanOpts {
    pub variant: Variant,
    /// Seconds a receiver is up before a VM that sends to it.
    pub margin_s: f64,
    /// No VM waits after its whole RAM is loaded (the paper's model; a line may then
    /// not exist).
    pub no_wait: bool,
}

impl PlanOpts {
    /// Refuses a margin no restore can keep, before anything is read.
    pub fn check(&self) -> Result<(), RestoreError> {
        if !(self.margin_s >= 0.0 && self.margin_s < 60.0) {
            return Err(RestoreError::Margin);
        }
        Ok(())
    }
}

/// One VM's figures.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct VmFigures {
    pub vm: String,
    pub host: String,
    pub dir: PathBuf,
    pub trace_pages: u64,
    pub elastic_pages: u64,
    pub total_pages: u64,
    pub load_rate: f64,
}

/// Checks the cluster snapshot `from` (manifest `m`) against the cluster `spec` and
/// reads each VM's figures from its snapshot's manifest, which `open` reads from the
/// VM's snapshot directory (rates not yet known: 0).
pub fn figures<E: From<RestoreError>>(
    spec: &ClusterSpec,
    m: &Manifest,
    from: &Path,
    mut open: impl FnMut(&ClusterVm, &Path) -> Result<rebound_snapshot::Manifest, E>,
) -> Result<Vec<VmFigures>, E> {
    let by_name: BTreeMap<&str, &ManifestVm> = m.vms.iter().map(|v| (v.vm.as_str(), v)).collect();
    if let Some(v) = m.vms.iter().find(|v| spec.vm(&v.vm).is_none()) {
        return Err(RestoreError::NotInCluster {
            vm: v.vm.clone(),
            cluster: spec.name.clone(),
        }
        .into());
    }
    let mut out = Vec::new();
    for cv in &spec.vms {
        let Some(mv) = by_name.get(cv.name.as_str()) else {
            return Err(RestoreError::NotInSnapshot {
                vm: cv.name.clone(),
                cluster: spec.name.clone(),
                from: from.to_path_buf(),
            }
            .into());
        };
        if mv.ip != cv.ip {
            return Err(RestoreError::Address {
                vm: cv.name.clone(),
                was: mv.ip,
                now: cv.ip,
                cluster: spec.name.clone(),
            }
            .into());
        }
        let dir = from.join(&mv.dir);
        let man = open(cv, &dir)?;
        out.push(vm_figures(cv, mv, dir, &man)?);
    }
    Ok(out)
}

/// One VM's figures, once its snapshot is known to be of that VM with that NIC.
fn vm_figures(
    cv: &ClusterVm,
    mv: &ManifestVm,
    dir: PathBuf,
    man: &rebound_snapshot::Manifest,
) -> Result<VmFigures, RestoreError> {
    let nic0 = man.spec["nics"][0].as_str().unwrap_or_default();
    if man.vm != cv.name || !nic0.contains(&format!("mac={}", mv.mac)) {
        return Err(RestoreError::OtherVm {
            dir,
            of: man.vm.clone(),
            nic: nic0.to_string(),
            vm: cv.name.clone(),
            mac: mv.mac.clone(),
        });
    }
    let Some(info) = &man.trace else {
        return Err(RestoreError::NoTrace(cv.name.clone()));
    };
    Ok(VmFigures {
        vm: cv.name.clone(),
        host: cv.host.clone(),
        dir,
        trace_pages: info.pages,
        elastic_pages: info.default_elastic_pages().min(info.pages),
        total_pages: man.ram_blocks.iter().map(|b| b.size / 4096).sum(),
        load_rate: 0.0,
    })
}

/// `load-rates.json` in a cluster's state: each host's load rate as the last restore
/// that measured it found.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Rates {
    /// Host → (pages per second, the restore that measured it).
    hosts: BTreeMap<String, (f64, String)>,
}

impl Rates {
    /// The file's name in the cluster's state directory.
    pub const FILE: &'static str = "load-rates.json";

    /// The rates in a file's text; none if it is missing (`None`) or unreadable: they
    /// are probed again.
    pub fn parse(text: Option<&[u8]>) -> Rates {
        text.and_then(|b| serde_json::from_slice(b).ok())
            .unwrap_or_default()
    }

    /// The file's text.
    pub fn to_vec(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).unwrap_or_default()
    }

    /// Sets each VM's load rate, one per host: `given` (`--load-rate`) if set, else
    /// the one recorded, else what `probe` measures on the snapshot of the host's
    /// first VM. Returns where each host's rate came from.
    pub fn assign<E: From<RestoreError>>(
        &self,
        figs: &mut [VmFigures],
        given: Option<f64>,
        mut probe: impl FnMut(&Path) -> Result<f64, E>,
    ) -> Result<BTreeMap<String, String>, E> {
        let mut source = BTreeMap::new();
        let mut per_host: BTreeMap<String, f64> = BTreeMap::new();
        for f in figs.iter() {
            if per_host.contains_key(&f.host) {
                continue;
            }
            let (rate, from) = match (given, self.hosts.get(&f.host)) {
                (Some(r), _) => (r, "--load-rate".to_string()),
                (None, Some((r, by))) if r.is_finite() && *r > 0.0 => {
                    (*r, format!("measured by {by}"))
                }
                _ => (
                    probe(&f.dir)?,
                    format!("probed on the snapshot of {}", f.vm),
                ),
            };
            if !(rate.is_finite() && rate > 0.0) {
                return Err(RestoreError::Rate(rate).into());
            }
            per_host.insert(f.host.clone(), rate);
            source.insert(f.host.clone(), from);
        }
        for f in figs.iter_mut() {
            f.load_rate = per_host[&f.host];
        }
        Ok(source)
    }

    /// Records each host's load rate as restore `restore_id` measured it: pages over
    /// load time (QEMU's start included), summed over the host's VMs, from each VM's
    /// `(name, pages, load seconds)`.
    pub fn record<'a>(
        &mut self,
        figs: &[VmFigures],
        restore_id: &str,
        loads: impl IntoIterator<Item = (&'a str, Option<u64>, Option<f64>)>,
    ) {
        let mut sums: BTreeMap<&str, (u64, f64)> = BTreeMap::new();
        for (vm, pages, load_s) in loads {
            let (Some(p), Some(s), Some(f)) = (pages, load_s, figs.iter().find(|f| f.vm == vm))
            else {
                continue;
            };
            let e = sums.entry(f.host.as_str()).or_default();
            e.0 += p;
            e.1 += s;
        }
        for (h, (p, s)) in sums {
            if p > 0 && s > 0.0 {
                self.hosts.insert(
                    h.to_string(),
                    (p as f64 / s, format!("restore {restore_id}")),
                );
            }
        }
    }
}

/// What one VM of a restore loads and when it starts.
#[derive(Clone, Debug, PartialEq)]
pub struct VmPlan {
    pub vm: String,
    /// Pages loaded before it starts; never 0 (which the daemons read as "their
    /// default"): a VM on the line at 0 s loads one page.
    pub ws_pages: u64,
    /// The VMs that start before it (those it sends to).
    pub depends_on: Vec<String>,
    /// Seconds after the coordinator's LOAD it starts at (the line's), if on a line.
    pub start_at_s: Option<f64>,
}

/// Each VM's plan (in the order of `figs`) and, for the line variants, the restore
/// line, from the figures and the restore dependency graph's edges.
pub fn plan(
    figs: &[VmFigures],
    edges: &[RdgEdge],
    opts: &PlanOpts,
) -> Result<(Vec<VmPlan>, Option<RestoreLine>), RestoreError> {
    let line = match opts.variant {
        Variant::Line | Variant::LineKeep => {
            let input = LineInput {
                vms: figs
                    .iter()
                    .map(|f| VmLoad {
                        name: f.vm.clone(),
                        working_set_pages: f.elastic_pages,
                        total_pages: f.total_pages,
                        load_rate_pages_per_s: f.load_rate,
                    })
                    .collect(),
                dependencies: edges
                    .iter()
                    .map(|e| Dependency {
                        sender: e.sender.clone(),
                        receiver: e.receiver.clone(),
                        margin_s: opts.margin_s,
                    })
                    .collect(),
                may_wait: !opts.no_wait,
                keep_working_sets: opts.variant == Variant::LineKeep,
            };
            Some(line::solve(&input)?)
        }
        _ => None,
    };
    let mut vms = Vec::new();
    for f in figs {
        let (ws, deps, at) = match (&line, opts.variant) {
            (Some(l), _) => {
                let s = l
                    .vms
                    .iter()
                    .find(|v| v.name == f.vm)
                    .ok_or_else(|| RestoreError::NotOnLine(f.vm.clone()))?;
                let deps = edges
                    .iter()
                    .filter(|e| e.sender == f.vm)
                    .map(|e| e.receiver.clone())
                    .collect();
                (s.revised_working_set_pages, deps, Some(s.revised_start_s))
            }
            (None, Variant::WorkingSet) => (f.trace_pages, Vec::new(), None),
            (None, _) => (f.elastic_pages, Vec::new(), None),
        };
        vms.push(VmPlan {
            vm: f.vm.clone(),
            ws_pages: ws.clamp(1, f.trace_pages.max(1)),
            depends_on: deps,
            start_at_s: at,
        });
    }
    Ok((vms, line))
}

#[cfg(test)]
mod tests;
