//! The pure half of `bench cluster-scale`: the plan it restores, the figures of one
//! restore read from its report, and the goals over the sizes.

use rebound_coord::report::{Outcome, RestoreReport};
use rebound_coord::{Plan, PlanVm};
use serde::Serialize;

use crate::rounds::Stat;

/// The shape of the plan every size restores.
#[derive(Debug, Clone, Serialize)]
pub struct Shape {
    pub vms_per_host: usize,
    /// Waves of the restore line: a host's VM `j` starts in wave `j % waves`.
    pub waves: usize,
    /// The first wave's instant, seconds after the restore began.
    pub line_s: f64,
    /// Seconds between waves.
    pub wave_s: f64,
    /// On each host, VMs 1 to `chain - 1` each depend on the one before (0 for none).
    pub chain: usize,
}

impl Shape {
    /// One line for the text report.
    pub fn describe(&self) -> String {
        let chain = if self.chain > 1 {
            format!(
                "on each host VMs 1..{} each depend on the one before (a chain of {} per host)",
                self.chain - 1,
                self.chain
            )
        } else {
            "no dependencies".into()
        };
        format!(
            "{} VMs per host; a line of {} waves {:.0} ms apart from {:.2} s after the restore began (a host's VM j in wave j mod {}); {chain}",
            self.vms_per_host,
            self.waves,
            self.wave_s * 1e3,
            self.line_s,
            self.waves
        )
    }

    /// The instant VM `j` of its host is planned at, seconds after the beginning.
    fn at(&self, j: usize) -> f64 {
        self.line_s + (j % self.waves.max(1)) as f64 * self.wave_s
    }
}

pub fn host_name(i: usize) -> String {
    format!("h{i:03}")
}

fn vm_name(i: usize, j: usize) -> String {
    format!("h{i:03}-v{j:02}")
}

/// How many hosts `vms` VMs take.
pub fn hosts_for(vms: usize, per_host: usize) -> usize {
    vms.div_ceil(per_host.max(1))
}

/// `vms` VMs over [`hosts_for`] hosts, `vms_per_host` each (the last may have fewer).
pub fn plan(id: &str, vms: usize, s: &Shape) -> Plan {
    let per = s.vms_per_host.max(1);
    let vms = (0..vms)
        .map(|k| {
            let (i, j) = (k / per, k % per);
            PlanVm {
                vm: vm_name(i, j),
                host: host_name(i),
                ws_pages: 1000,
                args: serde_json::Value::Null,
                depends_on: if j > 0 && j < s.chain {
                    vec![vm_name(i, j - 1)]
                } else {
                    Vec::new()
                },
                start_at_s: Some(s.at(j)),
            }
        })
        .collect();
    Plan {
        restore_id: id.to_string(),
        vms,
    }
}

/// The nearest-rank percentile `p` (0 to 100) of `v`; `None` if empty.
pub fn percentile(v: &[f64], p: f64) -> Option<f64> {
    let mut v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    Some(v[rank.clamp(1, v.len()) - 1])
}

/// The figures of one restore without a failure.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RunFigures {
    pub restored: bool,
    /// From the submit to the last VM's start, and to the last VM's restore, in s.
    pub all_started_s: f64,
    pub all_restored_s: f64,
    /// |started − its instant| over the VMs, in ms.
    pub start_error_p50_ms: f64,
    pub start_error_p99_ms: f64,
    pub start_error_max_ms: f64,
    /// How far the coordinator's instants fell behind the planned line (a START
    /// written after its instant gets "now"), the worst VM, in ms.
    pub behind_line_max_ms: f64,
    /// Store requests during the restore (every host's handle and the submitter's)
    /// over the VMs.
    pub requests_per_vm: f64,
    /// VMs whose stand-in was started more than once (must be 0).
    pub double_starts: usize,
}

/// Reads [`RunFigures`] from a report; `planned` is the plan it ran.
pub fn figures(r: &RestoreReport, planned: &Plan, submit_unix_ns: i64) -> RunFigures {
    let t0 = r.began_unix_ns;
    let since_submit = |ns: i64| (ns - submit_unix_ns) as f64 / 1e9;
    let all_started = r
        .vms
        .iter()
        .map(|v| v.start_unix_ns)
        .collect::<Option<Vec<_>>>();
    let all_restored = r
        .vms
        .iter()
        .map(|v| v.restore_fin_s.map(|s| t0 + (s * 1e9) as i64))
        .collect::<Option<Vec<_>>>();
    let errors: Vec<f64> = r
        .vms
        .iter()
        .filter_map(|v| v.start_error_ms.map(f64::abs))
        .collect();
    let behind = r
        .vms
        .iter()
        .filter_map(|v| {
            let p = planned.vms.iter().find(|p| p.vm == v.vm)?;
            Some((v.start_at_s? - p.start_at_s?) * 1e3)
        })
        .fold(0.0, f64::max);
    RunFigures {
        restored: r.outcome == Outcome::Restored,
        all_started_s: all_started
            .and_then(|s| s.into_iter().max())
            .map_or(f64::NAN, since_submit),
        all_restored_s: all_restored
            .and_then(|s| s.into_iter().max())
            .map_or(f64::NAN, since_submit),
        start_error_p50_ms: percentile(&errors, 50.0).unwrap_or(f64::NAN),
        start_error_p99_ms: percentile(&errors, 99.0).unwrap_or(f64::NAN),
        start_error_max_ms: percentile(&errors, 100.0).unwrap_or(f64::NAN),
        behind_line_max_ms: behind,
        requests_per_vm: f64::NAN,
        double_starts: 0,
    }
}

/// One goal and whether it was met.
#[derive(Debug, Clone, Serialize)]
pub struct Goal {
    pub goal: String,
    pub seen: String,
    pub met: bool,
}

/// Requests per VM count as constant when the largest median is within this
/// factor of the smallest.
pub const CONSTANT_WITHIN: f64 = 1.25;

/// One size's medians for the goals: (VMs, p99 start error, failover s, requests
/// per VM), `None` where no run measured it.
pub type GoalRow = (usize, Option<Stat>, Option<Stat>, Option<Stat>);

/// The goals over every size's medians.
pub fn goals(rows: &[GoalRow], ttl_s: f64) -> Vec<Goal> {
    let mut out = Vec::new();
    let worst = |f: &dyn Fn(&GoalRow) -> Option<Stat>| {
        rows.iter()
            .filter_map(|r| f(r).map(|s| (r.0, s.median)))
            .max_by(|a, b| a.1.total_cmp(&b.1))
    };
    let p99 = worst(&|r| r.1);
    out.push(Goal {
        goal: "p99 start error <= 50 ms (median of the runs, every size)".into(),
        seen: p99.map_or("not measured".into(), |(n, v)| {
            format!("worst {v:.1} ms at {n} VMs")
        }),
        met: p99.is_some_and(|(_, v)| v <= 50.0),
    });
    let fo = worst(&|r| r.2);
    out.push(Goal {
        goal: format!("failover <= lease TTL + 1 s = {:.1} s", ttl_s + 1.0),
        seen: fo.map_or("not measured".into(), |(n, v)| {
            format!("worst {v:.2} s at {n} VMs")
        }),
        met: fo.is_some_and(|(_, v)| v <= ttl_s + 1.0),
    });
    let req: Vec<(usize, f64)> = rows
        .iter()
        .filter_map(|r| r.3.map(|s| (r.0, s.median)))
        .collect();
    let lo = req.iter().map(|r| r.1).fold(f64::INFINITY, f64::min);
    let hi = req.iter().map(|r| r.1).fold(0.0, f64::max);
    out.push(Goal {
        goal: format!(
            "etcd requests per VM constant as the cluster grows (largest within {CONSTANT_WITHIN}x of smallest)"
        ),
        seen: if req.len() < 2 {
            "needs two sizes".into()
        } else {
            req.iter()
                .map(|(n, v)| format!("{v:.2} at {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        },
        met: req.len() >= 2 && hi <= lo * CONSTANT_WITHIN,
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> Shape {
        Shape {
            vms_per_host: 10,
            waves: 10,
            line_s: 1.0,
            wave_s: 0.1,
            chain: 5,
        }
    }

    #[test]
    fn the_plan_spreads_vms_over_hosts_waves_and_chains() {
        let p = plan("r", 25, &shape());
        assert_eq!(p.vms.len(), 25);
        assert_eq!(hosts_for(25, 10), 3);
        let hosts: std::collections::BTreeSet<_> = p.vms.iter().map(|v| v.host.clone()).collect();
        assert_eq!(hosts.len(), 3);
        // Host 1's VM 3: wave 3, after its VM 2.
        let v = p.vms.iter().find(|v| v.vm == "h001-v03").unwrap();
        assert_eq!(v.host, "h001");
        assert!((v.start_at_s.unwrap() - 1.3).abs() < 1e-9);
        assert_eq!(v.depends_on, vec!["h001-v02".to_string()]);
        // Outside the chain, and its head: no dependency.
        for free in ["h001-v00", "h001-v05", "h002-v00"] {
            let v = p.vms.iter().find(|v| v.vm == free).unwrap();
            assert!(v.depends_on.is_empty(), "{free}");
        }
        assert!(p.groups().is_ok(), "the plan is valid");
        // Every wave has one VM of each full host.
        let wave9 = p
            .vms
            .iter()
            .filter(|v| (v.start_at_s.unwrap() - 1.9).abs() < 1e-9);
        assert_eq!(wave9.count(), 2);
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(50.0));
        assert_eq!(percentile(&v, 99.0), Some(99.0));
        assert_eq!(percentile(&v, 100.0), Some(100.0));
        assert_eq!(percentile(&[3.0, 1.0, 2.0], 50.0), Some(2.0));
        assert_eq!(percentile(&[7.0], 99.0), Some(7.0));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn goals_are_met_only_by_every_size() {
        let s = |v: f64| Stat::of([v]);
        let rows = [
            (100, s(3.0), s(5.6), s(5.0)),
            (1000, s(12.0), s(5.9), s(5.5)),
        ];
        let g = goals(&rows, 5.0);
        assert!(g.iter().all(|g| g.met), "{g:?}");
        assert_eq!(g[0].seen, "worst 12.0 ms at 1000 VMs");
        let rows = [
            (100, s(3.0), s(5.6), s(5.0)),
            (1000, s(60.0), s(6.2), s(9.0)),
        ];
        let g = goals(&rows, 5.0);
        assert!(g.iter().all(|g| !g.met), "{g:?}");
        // One size cannot show that requests stay constant; nothing measured is not met.
        let g = goals(&[(100, None, None, s(5.0))], 5.0);
        assert!(g.iter().all(|g| !g.met), "{g:?}");
    }
}
