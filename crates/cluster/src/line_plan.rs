//! The whole planning pipeline in one call: traffic matrix → restore
//! dependency graph → restore line, with a result the daemon can send as JSON.
//!
//! Why: the coordinator of a cluster restore (HotRestore §4.3) needs the graph
//! (to know which VMs a VM waits for) and the line (the working set each VM
//! loads and the order they start in), computed from the same inputs.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::line::{self, Dependency, LineError, LineInput, RestoreLine, VmLoad};
use crate::pcap::PcapOptions;
use crate::rdg::Rdg;
use crate::traffic::{Endpoints, TrafficBuilder, TrafficError, TrafficMatrix, TrafficStats};

/// Errors planning a cluster restore.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("VM {0} appears in the traffic but has no load figures.")]
    MissingLoad(String),
    #[error("The traffic could not be read.")]
    Traffic(#[from] TrafficError),
    #[error("No restore line could be computed.")]
    Line(#[from] LineError),
}

/// Planning knobs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlanConfig {
    /// A pair that exchanged fewer dependency packets is no RDG edge.
    pub min_packets: u64,
    /// Seconds a receiver must be up before a VM that sends to it.
    pub margin_s: f64,
}

impl Default for PlanConfig {
    fn default() -> Self {
        PlanConfig {
            min_packets: 1,
            margin_s: 0.05,
        }
    }
}

/// A cluster restore plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub config: PlanConfig,
    pub traffic: TrafficMatrix,
    pub rdg: Rdg,
    pub line: RestoreLine,
}

/// Plans a restore from a traffic matrix and every VM's load figures. VMs with
/// load figures but no traffic are orphans; a VM in the traffic without load
/// figures is an error.
pub fn plan(
    traffic: &TrafficMatrix,
    loads: &[VmLoad],
    config: &PlanConfig,
) -> Result<Plan, PlanError> {
    let mut traffic = traffic.clone();
    for vm in &traffic.vms {
        if !loads.iter().any(|l| &l.name == vm) {
            return Err(PlanError::MissingLoad(vm.clone()));
        }
    }
    traffic.vms.extend(loads.iter().map(|l| l.name.clone()));
    let rdg = Rdg::from_matrix(&traffic, config.min_packets);
    let input = LineInput {
        vms: loads.to_vec(),
        dependencies: rdg
            .edges
            .iter()
            .map(|e| Dependency {
                sender: e.sender.clone(),
                receiver: e.receiver.clone(),
                margin_s: config.margin_s,
            })
            .collect(),
        may_wait: true,
        keep_working_sets: false,
    };
    let line = line::solve(&input)?;
    Ok(Plan {
        config: config.clone(),
        traffic,
        rdg,
        line,
    })
}

/// One VM's packet dump.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DumpFile {
    pub vm: String,
    pub path: PathBuf,
}

/// Reads every dump into a traffic matrix (frames from `since_us` on, if set).
pub fn traffic_from_dumps(
    endpoints: Endpoints,
    dumps: &[DumpFile],
    options: PcapOptions,
    since_us: Option<u64>,
) -> Result<(TrafficMatrix, TrafficStats), TrafficError> {
    let mut builder = TrafficBuilder::new(endpoints);
    if let Some(t) = since_us {
        builder = builder.since(t);
    }
    for d in dumps {
        builder.add_dump_file(&d.vm, &d.path, options)?;
    }
    Ok(builder.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pcap::tests::{mac, tcp_frame, udp_frame, DumpBuilder};
    use crate::pcap::TcpFlags;

    fn load(name: &str, ws: u64) -> VmLoad {
        VmLoad {
            name: name.into(),
            working_set_pages: ws,
            total_pages: 100_000,
            load_rate_pages_per_s: 10_000.0,
        }
    }

    /// lb (1) → web (2) ⇄ db (3); batch (4) silent. Every VM dumps the frames
    /// it sees, as QEMU would, into a file.
    #[test]
    fn dumps_to_plan_to_json() {
        let dir = std::env::temp_dir().join(format!("rebound-cluster-plan-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut endpoints = Endpoints::new();
        for (i, vm) in ["lb", "web", "db", "batch"].iter().enumerate() {
            endpoints.add_mac(mac(i as u8 + 1), vm).unwrap();
        }
        let psh = TcpFlags::PSH | TcpFlags::ACK;
        let mut lb = DumpBuilder::new();
        let mut web = DumpBuilder::new();
        let mut db = DumpBuilder::new();
        for t in 0..3 {
            let req = tcp_frame(1, 2, psh, 300);
            lb.record(t * 10, &req);
            web.record(t * 10, &req);
            let ack = tcp_frame(2, 1, TcpFlags::ACK, 0);
            lb.record(t * 10 + 1, &ack);
            web.record(t * 10 + 1, &ack);
            let query = udp_frame(2, 3, 80);
            web.record(t * 10 + 2, &query);
            db.record(t * 10 + 2, &query);
            let rows = udp_frame(3, 2, 1200);
            web.record(t * 10 + 3, &rows);
            db.record(t * 10 + 3, &rows);
        }
        let mut dumps = Vec::new();
        for (vm, b) in [("lb", &lb), ("web", &web), ("db", &db)] {
            let path = dir.join(format!("{vm}.pcap"));
            std::fs::write(&path, &b.bytes).unwrap();
            dumps.push(DumpFile {
                vm: vm.into(),
                path,
            });
        }
        let (traffic, stats) =
            traffic_from_dumps(endpoints, &dumps, PcapOptions::default(), Some(0)).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(stats.dumps.len(), 3);
        assert_eq!(traffic.count("lb", "web"), 3);
        assert_eq!(traffic.count("web", "lb"), 0, "acks are no dependency");
        assert_eq!(
            (traffic.count("web", "db"), traffic.count("db", "web")),
            (3, 3)
        );

        // The load balancer's working set is small, so it would start first.
        let loads = [
            load("lb", 1_000),
            load("web", 40_000),
            load("db", 20_000),
            load("batch", 5_000),
        ];
        let p = plan(&traffic, &loads, &PlanConfig::default()).unwrap();
        assert_eq!(p.rdg.rings, vec![vec!["db", "web"]]);
        assert_eq!(p.rdg.orphans, vec!["batch"]);
        let start = |vm: &str| {
            p.line
                .vms
                .iter()
                .find(|v| v.name == vm)
                .unwrap()
                .revised_start_s
        };
        assert_eq!(start("web"), start("db"));
        assert!(start("lb") >= start("web") + PlanConfig::default().margin_s - 1e-6);
        let pos = |vm: &str| p.line.order.iter().position(|n| n == vm).unwrap();
        assert!(pos("lb") > pos("web") && pos("lb") > pos("db"));

        let json = serde_json::to_string(&p).unwrap();
        let back: Plan = serde_json::from_str(&json).unwrap();
        // Exact with serde_json's float_roundtrip; without it a start may
        // come back one ulp off, which matters to no restore.
        assert_eq!(back, p);
    }

    #[test]
    fn a_talking_vm_without_load_figures_is_an_error() {
        let mut traffic = TrafficMatrix::default();
        traffic.vms.insert("a".into());
        traffic.vms.insert("b".into());
        traffic
            .counts
            .entry("a".into())
            .or_default()
            .insert("b".into(), 2);
        let err = plan(&traffic, &[load("a", 10)], &PlanConfig::default()).unwrap_err();
        assert!(err.to_string().contains('b'), "{err}");
    }
}
