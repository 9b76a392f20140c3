//! What a cluster restore restores: per VM its host, working set size, the daemon's
//! restore args, and the restore dependency graph's edges (HotRestore 4.1).
//!
//! `depends_on` lists the VMs that must start before this one (the VMs it sends to).
//! A ring (VMs that depend on each other, directly or through others) is a strongly
//! connected component of that graph; its members start together once all of them
//! are loaded and every VM outside the ring that one of them depends on has started.

use std::collections::{BTreeSet, HashMap};

use serde::{Deserialize, Serialize};

/// One restore of a cluster.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// Names the restore's records in the store; a used id is refused, so a
    /// new restore needs a new id.
    pub restore_id: String,
    pub vms: Vec<PlanVm>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanVm {
    pub vm: String,
    /// The host whose daemon restores this VM.
    #[serde(alias = "cohort")]
    pub host: String,
    /// The working set to load before start (the restore line's revised size).
    pub ws_pages: u64,
    /// Passed untouched to the host's [`crate::CohortVms::load`].
    #[serde(default)]
    pub args: serde_json::Value,
    /// VMs that must start before this one.
    #[serde(default)]
    pub depends_on: Vec<String>,
    /// Start this many seconds after the restore began (the restore line), or as
    /// soon as the Checker allows if that is later; `None` starts as soon as it allows.
    #[serde(default)]
    pub start_at_s: Option<f64>,
}

#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum PlanError {
    #[error("the plan has no VM")]
    Empty,
    #[error("the plan has an empty restore id")]
    EmptyRestoreId,
    #[error("VM {0} appears twice in the plan")]
    DuplicateVm(String),
    #[error("VM {vm} depends on {dep}, which is not in the plan")]
    UnknownDependency { vm: String, dep: String },
    #[error("VM {0} depends on itself")]
    SelfDependency(String),
    #[error("VM {0} has a start_at_s that is negative or not a number")]
    BadStartAt(String),
}

/// The plan's start groups: rings, and single VMs, in indices into `Plan::vms`.
#[derive(Debug)]
pub struct Groups {
    /// Each group's members; a group of more than one VM is a ring.
    pub groups: Vec<Vec<usize>>,
    /// Per group, the VMs outside it that its members depend on.
    pub needs: Vec<BTreeSet<usize>>,
}

impl Plan {
    /// Checks names and edges and finds the start groups.
    pub fn groups(&self) -> Result<Groups, PlanError> {
        if self.vms.is_empty() {
            return Err(PlanError::Empty);
        }
        if self.restore_id.is_empty() {
            return Err(PlanError::EmptyRestoreId);
        }
        let mut index = HashMap::new();
        for (i, v) in self.vms.iter().enumerate() {
            if index.insert(v.vm.as_str(), i).is_some() {
                return Err(PlanError::DuplicateVm(v.vm.clone()));
            }
            if v.start_at_s.is_some_and(|s| !(s >= 0.0 && s.is_finite())) {
                return Err(PlanError::BadStartAt(v.vm.clone()));
            }
        }
        let mut edges = vec![Vec::new(); self.vms.len()];
        for (i, v) in self.vms.iter().enumerate() {
            for d in &v.depends_on {
                let Some(&j) = index.get(d.as_str()) else {
                    return Err(PlanError::UnknownDependency {
                        vm: v.vm.clone(),
                        dep: d.clone(),
                    });
                };
                if i == j {
                    return Err(PlanError::SelfDependency(v.vm.clone()));
                }
                edges[i].push(j);
            }
        }
        let groups = strongly_connected(&edges);
        let mut group_of = vec![0; self.vms.len()];
        for (g, members) in groups.iter().enumerate() {
            for &m in members {
                group_of[m] = g;
            }
        }
        let needs = groups
            .iter()
            .enumerate()
            .map(|(g, members)| {
                members
                    .iter()
                    .flat_map(|&m| edges[m].iter().copied())
                    .filter(|&d| group_of[d] != g)
                    .collect()
            })
            .collect();
        Ok(Groups { groups, needs })
    }

    /// The plan's rings (VMs that start together), by name; checks the plan.
    pub fn rings(&self) -> Result<Vec<Vec<String>>, PlanError> {
        let g = self.groups()?;
        Ok(g.groups
            .iter()
            .filter(|m| m.len() > 1)
            .map(|m| m.iter().map(|&i| self.vms[i].vm.clone()).collect())
            .collect())
    }
}

/// Tarjan's algorithm; each component's members in ascending order.
fn strongly_connected(edges: &[Vec<usize>]) -> Vec<Vec<usize>> {
    struct State<'a> {
        edges: &'a [Vec<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        out: Vec<Vec<usize>>,
    }
    fn visit(s: &mut State<'_>, v: usize) {
        s.index[v] = Some(s.next);
        s.low[v] = s.next;
        s.next += 1;
        s.stack.push(v);
        s.on_stack[v] = true;
        for k in 0..s.edges[v].len() {
            let w = s.edges[v][k];
            match s.index[w] {
                None => {
                    visit(s, w);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(iw) if s.on_stack[w] => s.low[v] = s.low[v].min(iw),
                Some(_) => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack[w] = false;
                comp.push(w);
                if w == v {
                    break;
                }
            }
            comp.sort_unstable();
            s.out.push(comp);
        }
    }
    let n = edges.len();
    let mut s = State {
        edges,
        index: vec![None; n],
        low: vec![0; n],
        on_stack: vec![false; n],
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in 0..n {
        if s.index[v].is_none() {
            visit(&mut s, v);
        }
    }
    s.out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vm(name: &str, deps: &[&str]) -> PlanVm {
        PlanVm {
            vm: name.into(),
            host: "h1".into(),
            ws_pages: 1,
            args: serde_json::Value::Null,
            depends_on: deps.iter().map(|d| d.to_string()).collect(),
            start_at_s: None,
        }
    }

    #[test]
    fn rings_are_the_cycles_of_the_graph() {
        // The paper's Figure 3: VM1 -> VM2 -> VM3 -> VM1 is a ring, VM4 -> VM3,
        // VM2 -> VM3, VM5 is an orphan.
        let plan = Plan {
            restore_id: "r".into(),
            vms: vec![
                vm("vm1", &["vm2"]),
                vm("vm2", &["vm3"]),
                vm("vm3", &["vm1"]),
                vm("vm4", &["vm3"]),
                vm("vm5", &[]),
            ],
        };
        assert_eq!(plan.rings().unwrap(), vec![vec!["vm1", "vm2", "vm3"]]);
        let g = plan.groups().unwrap();
        let group_of = |vm: usize| g.groups.iter().position(|m| m.contains(&vm)).unwrap();
        assert_eq!(g.needs[group_of(3)], BTreeSet::from([2]));
        assert!(g.needs[group_of(0)].is_empty());
    }

    #[test]
    fn bad_plans_are_refused() {
        let mut plan = Plan {
            restore_id: "r".into(),
            vms: vec![vm("a", &["b"])],
        };
        assert!(matches!(
            plan.groups(),
            Err(PlanError::UnknownDependency { .. })
        ));
        plan.vms = vec![vm("a", &["a"])];
        assert_eq!(
            plan.groups().unwrap_err(),
            PlanError::SelfDependency("a".into())
        );
        plan.vms = vec![vm("a", &[]), vm("a", &[])];
        assert_eq!(
            plan.groups().unwrap_err(),
            PlanError::DuplicateVm("a".into())
        );
        plan.vms = vec![];
        assert_eq!(plan.groups().unwrap_err(), PlanError::Empty);
    }
}
