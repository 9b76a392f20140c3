//! A cluster snapshot directory: each VM's snapshot in `DIR/<vm>`, the manifest
//! `DIR/cluster.json` that ties them together, the frames each VM's bridge NIC
//! recorded after the snapshot point (`DIR/<vm>/net1-{rx,tx}.pcap`), and the frames in
//! flight to each VM at the cut (`DIR/<vm>/inflight-rx.pcap`).
//!
//! `cluster.json` is JSON: `format` = `"rebound-cluster-snapshot"`, `version` = 1, the
//! cluster's spec, the instant every VM was asked to stop at and how far apart they
//! stopped, and per VM its host, address, MAC, directory (one name inside the
//! snapshot), the daemon's answer to its snapshot and its frames in flight. It is
//! written whole and renamed into place (a directory without it is no cluster
//! snapshot), read back with a size cap of 16 MiB, and refused when its format or
//! version is another, when it lists no VM or one twice, or when a VM's directory
//! is not a plain name inside the snapshot.

use std::collections::{BTreeMap, HashSet};
use std::io::Read;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::inflight::InFlight;
use crate::line_plan::DumpFile;
use crate::pcap::PcapOptions;
use crate::spec::ClusterSpec;
use crate::traffic::{Endpoints, TrafficBuilder, TrafficError};
use crate::Rdg;

/// The cluster manifest written next to the VMs' snapshots.
pub const MANIFEST: &str = "cluster.json";
/// The in-flight frames file of a VM of a cluster snapshot.
pub const INFLIGHT: &str = "inflight-rx.pcap";
const FORMAT: &str = "rebound-cluster-snapshot";
const VERSION: u32 = 1;
/// The largest manifest read back (a cluster of the most VMs is far smaller).
const MANIFEST_MAX: u64 = 16 << 20;
/// Seconds past the working-set sample at which every VM of a snapshot stops.
const STOP_MARGIN_S: f64 = 1.5;

/// Errors reading, checking and writing a cluster snapshot.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("{} is not a cluster snapshot (no {MANIFEST})", .0.display())]
    NoManifest(PathBuf, #[source] std::io::Error),
    #[error("{} is larger than {} MiB: not a cluster manifest", .0.display(), MANIFEST_MAX >> 20)]
    TooLarge(PathBuf),
    #[error("{} is not valid JSON", .0.display())]
    Json(PathBuf, #[source] serde_json::Error),
    #[error("{} is not a cluster snapshot manifest", .0.display())]
    Format(PathBuf),
    #[error("{} has version {version}; this build reads version {VERSION}", path.display())]
    Version { path: PathBuf, version: Value },
    #[error("{}", .0.display())]
    Fields(PathBuf, #[source] serde_json::Error),
    #[error("{} lists no VMs", .0.display())]
    NoVms(PathBuf),
    #[error("{}: VM {vm:?} is listed twice", path.display())]
    Twice { path: PathBuf, vm: String },
    #[error("{}: VM directory {dir:?} is not inside the snapshot", path.display())]
    Outside { path: PathBuf, dir: String },
    #[error("{}", .0.display())]
    Dump(PathBuf, #[source] TrafficError),
    #[error("cannot write {}", .0.display())]
    WriteReplay(PathBuf, #[source] std::io::Error),
    #[error(transparent)]
    Traffic(#[from] TrafficError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// `cluster.json`: the cluster as it was, and where each VM's snapshot is.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub version: u32,
    pub cluster: ClusterSpec,
    pub peer_port: u16,
    /// Seconds from the request until every VM was saved and held.
    pub all_held_after_s: f64,
    /// Seconds between the first and the last VM's stop (the pause instants the
    /// daemons report on their wall clocks).
    #[serde(default)]
    pub pause_spread_s: f64,
    /// The instant every VM was asked to stop at (Unix ns, the coordinator's clock).
    #[serde(default)]
    pub stop_at_unix_ns: i64,
    pub vms: Vec<ManifestVm>,
}

/// One VM of a cluster snapshot.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ManifestVm {
    pub vm: String,
    pub host: String,
    pub ip: Ipv4Addr,
    pub mac: String,
    /// Its snapshot directory, relative to the cluster snapshot's.
    pub dir: String,
    /// The daemon's answer to its snapshot.
    pub snapshot: Value,
    /// Frames in flight to it at the cut, kept in `DIR/<dir>/inflight-rx.pcap` and
    /// replayed into it at a restore.
    #[serde(default)]
    pub in_flight: u64,
}

/// The instant (Unix ns) every VM of a snapshot asked at `now_ns` stops at: after its
/// working-set sample (`trace_s`) and a margin for arming it on a busy host. Stopped
/// one by one as each sample ended, they stopped up to a second apart, and a guest
/// still running declared its stopped peers dead before its own snapshot point, where
/// the restores inherit it. Hosts' clocks are assumed synchronized (NTP: milliseconds);
/// the manifest says how far apart the stops were.
pub fn stop_at(now_ns: i64, trace_s: f64) -> i64 {
    now_ns + ((trace_s.max(0.0) + STOP_MARGIN_S) * 1e9) as i64
}

impl Manifest {
    /// A manifest of this format and version; the VMs' stops (`paused_unix_ns` in
    /// each daemon's answer) give the spread.
    pub fn new(
        cluster: ClusterSpec,
        peer_port: u16,
        all_held_after_s: f64,
        stop_at_unix_ns: i64,
        vms: Vec<ManifestVm>,
    ) -> Manifest {
        let stops: Vec<i64> = vms
            .iter()
            .filter_map(|v| v.snapshot["paused_unix_ns"].as_i64())
            .collect();
        let pause_spread_s = match (stops.iter().min(), stops.iter().max()) {
            (Some(a), Some(b)) => (b - a) as f64 / 1e9,
            _ => 0.0,
        };
        Manifest {
            format: FORMAT.into(),
            version: VERSION,
            cluster,
            peer_port,
            all_held_after_s,
            pause_spread_s,
            stop_at_unix_ns,
            vms,
        }
    }

    /// Reads and checks `DIR/cluster.json`.
    pub fn read(dir: &Path) -> Result<Manifest, SnapshotError> {
        let path = dir.join(MANIFEST);
        let f = std::fs::File::open(&path)
            .map_err(|e| SnapshotError::NoManifest(dir.to_path_buf(), e))?;
        let mut text = Vec::new();
        f.take(MANIFEST_MAX + 1).read_to_end(&mut text)?;
        Manifest::parse(&path, &text)
    }

    /// Checks the text of the manifest at `path` (named in the errors).
    pub fn parse(path: &Path, text: &[u8]) -> Result<Manifest, SnapshotError> {
        let p = || path.to_path_buf();
        if text.len() as u64 > MANIFEST_MAX {
            return Err(SnapshotError::TooLarge(p()));
        }
        let head: Value = serde_json::from_slice(text).map_err(|e| SnapshotError::Json(p(), e))?;
        if head["format"] != FORMAT {
            return Err(SnapshotError::Format(p()));
        }
        if head["version"] != VERSION {
            return Err(SnapshotError::Version {
                path: p(),
                version: head["version"].clone(),
            });
        }
        let m: Manifest =
            serde_json::from_value(head).map_err(|e| SnapshotError::Fields(p(), e))?;
        if m.vms.is_empty() {
            return Err(SnapshotError::NoVms(p()));
        }
        let mut seen = HashSet::new();
        for v in &m.vms {
            if !seen.insert(&v.vm) {
                return Err(SnapshotError::Twice {
                    path: p(),
                    vm: v.vm.clone(),
                });
            }
            if v.dir.is_empty() || v.dir.contains('/') || v.dir == ".." || v.dir == "." {
                return Err(SnapshotError::Outside {
                    path: p(),
                    dir: v.dir.clone(),
                });
            }
        }
        Ok(m)
    }

    /// Writes `DIR/cluster.json` whole, then renames it into place: a cluster snapshot
    /// without its manifest is not one.
    pub fn write(&self, dir: &Path) -> Result<(), SnapshotError> {
        let tmp = dir.join(format!("{MANIFEST}.tmp"));
        std::fs::write(
            &tmp,
            serde_json::to_vec_pretty(self).map_err(std::io::Error::from)?,
        )?;
        std::fs::rename(&tmp, dir.join(MANIFEST))?;
        Ok(())
    }

    /// Each VM's in-flight frames file, for the VMs that have frames to replay.
    pub fn replay_files(&self, dir: &Path) -> BTreeMap<String, PathBuf> {
        self.vms
            .iter()
            .filter(|v| v.in_flight > 0)
            .map(|v| (v.vm.clone(), dir.join(&v.dir).join(INFLIGHT)))
            .collect()
    }

    /// Frames in flight at the cut, over every VM.
    pub fn in_flight(&self) -> u64 {
        self.vms.iter().map(|v| v.in_flight).sum()
    }

    /// Keeps the frames in flight at the cut per receiver in the snapshot `dir`, for
    /// a restore to replay; a VM nothing was in flight to keeps no file.
    pub fn keep_in_flight(
        &mut self,
        dir: &Path,
        in_flight: &[InFlight],
    ) -> Result<(), SnapshotError> {
        for v in &mut self.vms {
            let path = dir.join(&v.dir).join(INFLIGHT);
            v.in_flight = crate::inflight::write_replay(in_flight, &v.vm, &path)
                .map_err(|e| SnapshotError::WriteReplay(path.clone(), e))?;
            if v.in_flight == 0 {
                let _ = std::fs::remove_file(&path);
            }
        }
        Ok(())
    }
}

/// A cluster snapshot's traffic after the snapshot point, its graph and the frames in
/// flight at the cut.
pub struct Traffic {
    pub rdg: Rdg,
    pub in_flight: Vec<InFlight>,
}

/// Reads a cluster snapshot's manifest and dumps.
pub fn traffic(dir: &Path, min_packets: u64) -> Result<(Manifest, Traffic), SnapshotError> {
    let m = Manifest::read(dir)?;
    let t = traffic_of(dir, &m, min_packets)?;
    Ok((m, t))
}

/// The dumps of the cluster snapshot in `dir` whose manifest is `m`.
pub fn traffic_of(dir: &Path, m: &Manifest, min_packets: u64) -> Result<Traffic, SnapshotError> {
    let mut ep = Endpoints::new();
    let (mut rx, mut tx) = (Vec::new(), Vec::new());
    for v in &m.vms {
        ep.add_ipv4(v.ip, &v.vm)?;
        for (q, list) in [("rx", &mut rx), ("tx", &mut tx)] {
            list.push(DumpFile {
                vm: v.vm.clone(),
                path: dir.join(&v.dir).join(format!("net1-{q}.pcap")),
            });
        }
    }
    let opts = PcapOptions::default();
    let mut b = TrafficBuilder::new(ep.clone());
    for d in tx.iter().chain(&rx) {
        b.add_dump_file(&d.vm, &d.path, opts)
            .map_err(|e| SnapshotError::Dump(d.path.clone(), e))?;
    }
    let (matrix, _) = b.finish();
    let rdg = Rdg::from_matrix(&matrix, min_packets);
    let in_flight = crate::inflight::in_flight(&ep, &rx, &tx, opts)?;
    Ok(Traffic { rdg, in_flight })
}

#[cfg(test)]
pub(crate) mod tests;
