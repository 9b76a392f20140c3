//! One host's decisions for its own VMs in a restore, a pure function of the
//! records and of what this host is doing right now ([`Busy`]).
//!
//! Per VM of this host:
//! - `load` while the restore is active: load it (once; the result is written as
//!   `loaded` or `load_failed`).
//! - `start`: take it (`starting`, written only if neither the VM's record nor the
//!   restore's state changed since read, so an abort that got in first wins and a
//!   START is taken once), then start the VM on its instant; `started` or
//!   `start_failed` follows, then `restored` or `restore_failed`.
//! - `starting` or `started` that this host is not working on (its daemon
//!   restarted): carry on from there (the start is asked again of the VM, which
//!   answers for a VM already running; the restore is awaited again).
//! - The restore aborting: a VM loaded, held or not yet taken is dropped and
//!   written `aborted`; one being loaded is dropped when its load ends; a VM taken
//!   or running is never stopped.

use std::collections::{HashMap, HashSet};

use crate::records::{Phase, PhaseRecord, StateRecord, Status};
use crate::restore_plan::PlanVm;
use rebound_store::Revision;

/// What this host is doing for the restore's VMs right now.
#[derive(Debug, Default, Clone)]
pub struct Busy {
    pub loading: HashSet<String>,
    /// Taken, being started or awaiting the rest of memory.
    pub running: HashSet<String>,
    /// What each VM was last acted on at.
    pub acted: HashMap<String, Acted>,
}

/// The revisions a VM was last acted on at. A VM is not acted on again until its
/// record or the restore's state changed (a START not taken because an abort got
/// in first is decided again, and dropped, once the abort is seen), nor while its
/// record is older than this host's own last write of it (the record and the
/// state come through different watches: a newer state beside a record this host
/// has already moved on from would repeat a step).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Acted {
    pub record: Revision,
    pub state: Revision,
    pub wrote: Revision,
}

impl Acted {
    fn skip(&self, record: Revision, state: Revision) -> bool {
        record < self.wrote || (record <= self.record && state <= self.state)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum HostAction {
    Load {
        vm: String,
        rev: Revision,
    },
    /// Take the START (compare the VM's and the state's revisions).
    Take {
        vm: String,
        rev: Revision,
        at_unix_ns: i64,
    },
    /// Carry on with a VM this host took before (after a restart).
    Resume {
        vm: String,
        phase: Phase,
        at_unix_ns: i64,
    },
    /// Drop a held or never-loaded VM and write `aborted`.
    Drop {
        vm: String,
        rev: Revision,
        loaded: bool,
    },
}

impl HostAction {
    pub fn vm(&self) -> &str {
        match self {
            HostAction::Load { vm, .. }
            | HostAction::Take { vm, .. }
            | HostAction::Resume { vm, .. }
            | HostAction::Drop { vm, .. } => vm,
        }
    }
}

/// See the module doc. `vms` are the plan's VMs to look at: this host's (others
/// are passed over), so a host's work per change does not grow with the cluster.
pub fn decide<'p>(
    me: &str,
    vms: impl IntoIterator<Item = &'p PlanVm>,
    state: Option<(&StateRecord, Revision)>,
    phases: &HashMap<String, (PhaseRecord, Revision)>,
    busy: &Busy,
) -> Vec<HostAction> {
    let Some((state, state_rev)) = state else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for p in vms.into_iter().filter(|p| p.host == me) {
        let Some((r, rev)) = phases.get(&p.vm) else {
            continue;
        };
        if r.host != me {
            // A record that moved the VM to another host: not ours to act on.
            continue;
        }
        if busy
            .acted
            .get(&p.vm)
            .is_some_and(|a| a.skip(*rev, state_rev))
        {
            continue;
        }
        let (vm, rev) = (p.vm.clone(), *rev);
        let at = r.start_at_unix_ns.unwrap_or(0);
        match (state.status, r.phase) {
            (_, Phase::Starting | Phase::Started) if !busy.running.contains(&vm) => {
                out.push(HostAction::Resume {
                    vm,
                    phase: r.phase,
                    at_unix_ns: at,
                })
            }
            (Status::Active, Phase::Load) if !busy.loading.contains(&vm) => {
                out.push(HostAction::Load { vm, rev })
            }
            (Status::Active, Phase::Start) if !busy.running.contains(&vm) => {
                out.push(HostAction::Take {
                    vm,
                    rev,
                    at_unix_ns: at,
                })
            }
            (Status::Aborting | Status::Aborted, Phase::Load | Phase::Loaded | Phase::Start)
                if !busy.loading.contains(&vm) =>
            {
                out.push(HostAction::Drop {
                    vm,
                    rev,
                    loaded: r.phase != Phase::Load,
                })
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::{PlanRecord, Timeouts, FORMAT};
    use crate::restore_plan::{Plan, PlanVm};

    fn setup() -> (
        PlanRecord,
        StateRecord,
        HashMap<String, (PhaseRecord, Revision)>,
    ) {
        let vms: Vec<PlanVm> = [("a", "h1"), ("b", "h1"), ("c", "h2")]
            .iter()
            .map(|(v, h)| PlanVm {
                vm: v.to_string(),
                host: h.to_string(),
                ws_pages: 1,
                args: serde_json::Value::Null,
                depends_on: vec![],
                start_at_s: None,
            })
            .collect();
        let phases = vms
            .iter()
            .map(|v| (v.vm.clone(), (PhaseRecord::new(&v.vm, &v.host), 7)))
            .collect();
        let plan = PlanRecord {
            format: FORMAT,
            plan: Plan {
                restore_id: "r".into(),
                vms,
            },
            submitted_unix_ns: 0,
            timeouts: Timeouts::default(),
        };
        let state = StateRecord {
            format: FORMAT,
            restore_id: "r".into(),
            status: Status::Active,
            began_unix_ns: 0,
            by: "h2".into(),
            coordinators: vec![],
            reason: None,
            updated_unix_ns: 0,
        };
        (plan, state, phases)
    }

    #[test]
    fn loads_its_own_vms_once() {
        let (plan, state, phases) = setup();
        let mut busy = Busy::default();
        let a = decide("h1", &plan.plan.vms, Some((&state, 1)), &phases, &busy);
        assert_eq!(
            a,
            vec![
                HostAction::Load {
                    vm: "a".into(),
                    rev: 7
                },
                HostAction::Load {
                    vm: "b".into(),
                    rev: 7
                }
            ]
        );
        busy.loading.insert("a".into());
        busy.loading.insert("b".into());
        assert!(decide("h1", &plan.plan.vms, Some((&state, 1)), &phases, &busy).is_empty());
        assert!(decide("h1", &plan.plan.vms, None, &phases, &busy).is_empty());
    }

    #[test]
    fn takes_starts_and_drops_on_abort_but_never_stops_a_taken_vm() {
        let (plan, mut state, mut phases) = setup();
        let busy = Busy::default();
        phases.get_mut("a").unwrap().0.phase = Phase::Start;
        phases.get_mut("a").unwrap().0.start_at_unix_ns = Some(42);
        phases.get_mut("b").unwrap().0.phase = Phase::Starting;
        phases.get_mut("b").unwrap().0.start_at_unix_ns = Some(40);
        let a = decide("h1", &plan.plan.vms, Some((&state, 1)), &phases, &busy);
        assert_eq!(
            a,
            vec![
                HostAction::Take {
                    vm: "a".into(),
                    rev: 7,
                    at_unix_ns: 42
                },
                HostAction::Resume {
                    vm: "b".into(),
                    phase: Phase::Starting,
                    at_unix_ns: 40
                }
            ]
        );
        // Taken with the state at 1, but the take's compare failed: an abort got in
        // first. Nothing is done again until the abort is seen; then "a" is dropped.
        let mut busy = busy;
        let taken = Acted {
            record: 7,
            state: 1,
            wrote: 0,
        };
        busy.acted.insert("a".into(), taken);
        busy.running.insert("b".into());
        assert!(decide("h1", &plan.plan.vms, Some((&state, 1)), &phases, &busy).is_empty());
        busy.running.clear();
        state.status = Status::Aborting;
        // Had this host written the record since (at 9), the older one beside the
        // new state is not acted on.
        busy.acted.insert("a".into(), Acted { wrote: 9, ..taken });
        busy.acted.insert("b".into(), Acted { wrote: 9, ..taken });
        assert!(decide("h1", &plan.plan.vms, Some((&state, 2)), &phases, &busy).is_empty());
        busy.acted.clear();
        busy.acted.insert("a".into(), taken);
        let a = decide("h1", &plan.plan.vms, Some((&state, 2)), &phases, &busy);
        assert_eq!(
            a,
            vec![
                HostAction::Drop {
                    vm: "a".into(),
                    rev: 7,
                    loaded: true
                },
                HostAction::Resume {
                    vm: "b".into(),
                    phase: Phase::Starting,
                    at_unix_ns: 40
                }
            ]
        );
    }
}
