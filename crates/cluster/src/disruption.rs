//! What a cluster restore cost each VM (HotRestore section 6.2): its restore
//! latency, its backoff and their sum, the disruption.
//!
//! The paper approximates a VM's TCP backoff by start-time differences: a VM that
//! starts before a VM it sends to waits for it, so its backoff is the largest
//! `start(receiver) − start(sender)` over its receivers, 0 if every receiver started
//! first. The cluster's backoff figures are taken over communicating pairs (every
//! edge of the restore dependency graph): their maximum and average. A VM's
//! disruption is its restore latency (its start time after the restore began) plus
//! its backoff.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::rdg::RdgEdge;

/// One VM's cost.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VmDisruption {
    pub vm: String,
    /// Seconds from the restore's beginning to its start.
    pub start_s: f64,
    /// The longest wait for a receiver that started after it, seconds.
    pub backoff_s: f64,
    /// `start_s + backoff_s`.
    pub disruption_s: f64,
}

/// The whole restore's cost.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Disruption {
    pub vms: Vec<VmDisruption>,
    /// Over the graph's edges (pairs), seconds; 0 without edges.
    pub max_backoff_s: f64,
    pub avg_backoff_s: f64,
    /// Over the VMs, seconds.
    pub avg_disruption_s: f64,
    pub max_disruption_s: f64,
    /// Largest minus smallest start time, seconds.
    pub start_spread_s: f64,
}

/// Errors: a VM of the graph without a start time.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum DisruptionError {
    #[error("VM {0} is in the restore dependency graph but has no start time")]
    NoStart(String),
    #[error("no VM has a start time")]
    Empty,
}

/// The cost of a restore whose VMs started at `starts` (seconds after its
/// beginning), given who sends to whom.
pub fn disruption(
    starts: &BTreeMap<String, f64>,
    edges: &[RdgEdge],
) -> Result<Disruption, DisruptionError> {
    if starts.is_empty() {
        return Err(DisruptionError::Empty);
    }
    let start = |vm: &str| {
        starts
            .get(vm)
            .copied()
            .ok_or_else(|| DisruptionError::NoStart(vm.to_owned()))
    };
    let mut backoff: BTreeMap<&str, f64> = starts.keys().map(|k| (k.as_str(), 0.0)).collect();
    let (mut max_b, mut sum_b) = (0.0f64, 0.0f64);
    for e in edges {
        let b = (start(&e.receiver)? - start(&e.sender)?).max(0.0);
        let slot = backoff.entry(e.sender.as_str()).or_default();
        *slot = slot.max(b);
        max_b = max_b.max(b);
        sum_b += b;
    }
    let vms: Vec<VmDisruption> = starts
        .iter()
        .map(|(vm, &s)| {
            let b = backoff[vm.as_str()];
            VmDisruption {
                vm: vm.clone(),
                start_s: s,
                backoff_s: b,
                disruption_s: s + b,
            }
        })
        .collect();
    let n = vms.len() as f64;
    let lo = starts.values().copied().fold(f64::INFINITY, f64::min);
    let hi = starts.values().copied().fold(f64::NEG_INFINITY, f64::max);
    Ok(Disruption {
        max_backoff_s: max_b,
        avg_backoff_s: if edges.is_empty() {
            0.0
        } else {
            sum_b / edges.len() as f64
        },
        avg_disruption_s: vms.iter().map(|v| v.disruption_s).sum::<f64>() / n,
        max_disruption_s: vms.iter().map(|v| v.disruption_s).fold(0.0, f64::max),
        start_spread_s: hi - lo,
        vms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edge(s: &str, r: &str) -> RdgEdge {
        RdgEdge {
            sender: s.into(),
            receiver: r.into(),
            packets: 1,
        }
    }

    /// The paper's example: VM2 depends on VM6 (sends to it), started at 5.21 s
    /// and 6.13 s: VM2's backoff is 0.92 s.
    #[test]
    fn a_sender_started_first_waits_for_its_receiver() {
        let starts = BTreeMap::from([
            ("vm2".to_string(), 5.21),
            ("vm6".to_string(), 6.13),
            ("vm1".to_string(), 1.0),
        ]);
        let d = disruption(&starts, &[edge("vm2", "vm6"), edge("vm6", "vm1")]).unwrap();
        let vm = |n: &str| d.vms.iter().find(|v| v.vm == n).unwrap().clone();
        assert!((vm("vm2").backoff_s - 0.92).abs() < 1e-9);
        assert!((vm("vm2").disruption_s - 6.13).abs() < 1e-9);
        assert_eq!(vm("vm6").backoff_s, 0.0, "its receiver started first");
        assert_eq!(vm("vm1").backoff_s, 0.0, "it sends to nobody");
        assert!((d.max_backoff_s - 0.92).abs() < 1e-9);
        assert!((d.avg_backoff_s - 0.46).abs() < 1e-9);
        assert!((d.start_spread_s - 5.13).abs() < 1e-9);
        assert!((d.avg_disruption_s - (6.13 + 6.13 + 1.0) / 3.0).abs() < 1e-9);
    }

    #[test]
    fn a_vm_of_the_graph_without_a_start_is_an_error() {
        let starts = BTreeMap::from([("a".to_string(), 1.0)]);
        assert_eq!(
            disruption(&starts, &[edge("a", "b")]).unwrap_err(),
            DisruptionError::NoStart("b".into())
        );
        assert_eq!(
            disruption(&BTreeMap::new(), &[]).unwrap_err(),
            DisruptionError::Empty
        );
    }
}
