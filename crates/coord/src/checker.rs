//! The coordinator's decisions (HotRestore's Checker), as a pure function of what
//! the store holds: [`decide`] takes one consistent view of a restore and returns
//! the transitions to write and when to look again. It keeps no state of its own,
//! so a coordinator elected after another died decides from the same records and
//! carries on where the first stopped: a VM whose START is recorded is never
//! started again, and nothing is loaded twice.
//!
//! Rules, in order:
//! 1. No state yet: begin (the state and every VM's LOAD), unless a host the plan
//!    names has no live lease: then the restore is refused (aborted at once).
//! 2. A final state: nothing to do.
//! 3. Active: a failed VM, a VM not yet finished whose host's lease expired, or a
//!    phase timeout aborts the restore. Every VM restored ends it. Otherwise a start
//!    group (a VM, or a ring) gets its START once every member is loaded and every
//!    VM outside it that a member depends on has started; its instant is the line's
//!    (`began + start_at_s`, the group's latest) or now if that has passed. STARTs
//!    are written up to `lead` before their instant; the host starts the VM on the
//!    instant by its own clock.
//! 4. Aborting: the restore ends (aborted) once every VM is settled: final, running
//!    (a started VM is never stopped), or on a host whose lease expired; or when
//!    `abort_wait` has passed since the abort.

use std::collections::{BTreeSet, HashMap};

use crate::records::{PhaseRecord, PlanRecord, StateRecord, Status};
use crate::restore_plan::Groups;
use rebound_store::Revision;

/// What [`decide`] sees: one restore as read at one revision.
pub struct View<'a> {
    pub plan: &'a PlanRecord,
    pub groups: &'a Groups,
    pub state: Option<(&'a StateRecord, Revision)>,
    /// Each VM's phase record and its `mod_revision`, by VM name.
    pub phases: &'a HashMap<String, (PhaseRecord, Revision)>,
    /// Hosts with a live lease.
    pub live: &'a BTreeSet<String>,
    pub now_unix_ns: i64,
}

/// The coordinator's tunables.
#[derive(Debug, Clone)]
pub struct Tunables {
    /// STARTs are written this long before their instant. Default 500 ms.
    pub lead_ns: i64,
    /// How long an aborting restore waits for hosts to confirm. Default 10 s.
    pub abort_wait_ns: i64,
}

impl Default for Tunables {
    fn default() -> Self {
        Tunables {
            lead_ns: 500_000_000,
            abort_wait_ns: 10_000_000_000,
        }
    }
}

/// One transition to write.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Create the state (active, the line's origin now) and every VM's LOAD that
    /// is missing.
    Begin,
    /// The plan cannot begin: write the state as aborted with this reason.
    Refuse {
        reason: String,
    },
    /// Write START for these VMs (one group, or several due together), each with
    /// its instant.
    Start {
        vms: Vec<(String, i64)>,
    },
    Abort {
        reason: String,
    },
    Finish {
        status: Status,
    },
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Decision {
    pub actions: Vec<Action>,
    /// Decide again at this wall-clock instant even if nothing changes.
    pub wake_unix_ns: Option<i64>,
}

fn secs(s: f64) -> i64 {
    (s * 1e9) as i64
}

/// See the module doc.
pub fn decide(v: &View<'_>, t: &Tunables) -> Decision {
    let plan = &v.plan.plan;
    let mut d = Decision::default();
    let Some((state, _)) = v.state else {
        let dead: Vec<&str> = plan
            .vms
            .iter()
            .map(|p| p.host.as_str())
            .filter(|h| !v.live.contains(*h))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        d.actions.push(if dead.is_empty() {
            Action::Begin
        } else {
            Action::Refuse {
                reason: format!(
                    "host {} is not in the cluster (no live lease)",
                    dead.join(", ")
                ),
            }
        });
        return d;
    };
    match state.status {
        Status::Restored | Status::Aborted => d,
        Status::Aborting => {
            let deadline = state.updated_unix_ns.saturating_add(t.abort_wait_ns);
            let settled = plan.vms.iter().all(|p| match v.phases.get(&p.vm) {
                Some((r, _)) => r.phase.is_final() || r.phase.ran() || !v.live.contains(&p.host),
                None => true,
            });
            if settled || v.now_unix_ns >= deadline {
                d.actions.push(Action::Finish {
                    status: Status::Aborted,
                });
            } else {
                d.wake_unix_ns = Some(deadline);
            }
            d
        }
        Status::Active => active(v, state, t),
    }
}

fn active(v: &View<'_>, state: &StateRecord, t: &Tunables) -> Decision {
    use crate::records::Phase::*;
    let plan = &v.plan.plan;
    let to = &v.plan.timeouts;
    let mut d = Decision::default();
    if plan.vms.iter().any(|p| !v.phases.contains_key(&p.vm)) {
        // A coordinator died between the state and the LOADs: write the rest.
        d.actions.push(Action::Begin);
        return d;
    }
    let phase = |i: usize| &v.phases[&plan.vms[i].vm].0;
    let mut wake = Vec::new();
    let mut abort = None;
    let mut restored = 0;
    for (i, p) in plan.vms.iter().enumerate() {
        let r = phase(i);
        let deadline = match r.phase {
            LoadFailed | StartFailed | RestoreFailed => {
                let what = match r.phase {
                    LoadFailed => "load",
                    StartFailed => "start",
                    _ => "restore",
                };
                abort.get_or_insert(format!(
                    "VM {}: {what} failed on host {}: {}",
                    p.vm,
                    p.host,
                    r.error.as_deref().unwrap_or("no reason given")
                ));
                continue;
            }
            Restored => {
                restored += 1;
                continue;
            }
            Aborted => {
                abort.get_or_insert(format!("VM {} was dropped by host {}", p.vm, p.host));
                continue;
            }
            Load => Some((state.began_unix_ns, to.load_s, "load")),
            Loaded => None,
            Start | Starting => r.start_sent_unix_ns.map(|s| (s, to.start_s, "start")),
            Started => r.started_unix_ns.map(|s| (s, to.restore_s, "restore")),
        };
        if !v.live.contains(&p.host) {
            abort.get_or_insert(format!(
                "host {}'s lease expired (no word from it for its TTL) while VM {} was {}",
                p.host,
                p.vm,
                r.phase.name()
            ));
            continue;
        }
        if let Some((from, limit, what)) = deadline {
            let at = from.saturating_add(secs(limit));
            if v.now_unix_ns >= at {
                abort.get_or_insert(format!(
                    "VM {} did not {what} within {limit} s (host {})",
                    p.vm, p.host
                ));
            } else {
                wake.push(at);
            }
        }
    }
    if let Some(reason) = abort {
        d.actions.push(Action::Abort { reason });
        return d;
    }
    if restored == plan.vms.len() {
        d.actions.push(Action::Finish {
            status: Status::Restored,
        });
        return d;
    }
    let mut due = Vec::new();
    for (g, members) in v.groups.groups.iter().enumerate() {
        if !members.iter().all(|&m| phase(m).phase == Loaded) {
            continue;
        }
        let ready = v.groups.needs[g]
            .iter()
            .all(|&n| matches!(phase(n).phase, Started | Restored));
        if !ready {
            continue;
        }
        let line = members
            .iter()
            .filter_map(|&m| plan.vms[m].start_at_s)
            .fold(None, |a: Option<f64>, s| Some(a.map_or(s, |a| a.max(s))));
        let at = match line {
            Some(s) => state
                .began_unix_ns
                .saturating_add(secs(s))
                .max(v.now_unix_ns),
            None => v.now_unix_ns,
        };
        if at - t.lead_ns <= v.now_unix_ns {
            due.extend(members.iter().map(|&m| (plan.vms[m].vm.clone(), at)));
        } else {
            wake.push(at - t.lead_ns);
        }
    }
    if !due.is_empty() {
        d.actions.push(Action::Start { vms: due });
    }
    d.wake_unix_ns = wake.into_iter().min();
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::{Phase, Timeouts, FORMAT};
    use crate::restore_plan::{Plan, PlanVm};

    const S: i64 = 1_000_000_000;

    fn vm(name: &str, host: &str, deps: &[&str], at: Option<f64>) -> PlanVm {
        PlanVm {
            vm: name.into(),
            host: host.into(),
            ws_pages: 1,
            args: serde_json::Value::Null,
            depends_on: deps.iter().map(|d| d.to_string()).collect(),
            start_at_s: at,
        }
    }

    struct Case {
        plan: PlanRecord,
        groups: Groups,
        state: Option<StateRecord>,
        phases: HashMap<String, (PhaseRecord, Revision)>,
        live: BTreeSet<String>,
    }

    impl Case {
        fn new(vms: Vec<PlanVm>) -> Case {
            let plan = PlanRecord {
                format: FORMAT,
                plan: Plan {
                    restore_id: "r".into(),
                    vms,
                },
                submitted_unix_ns: 0,
                timeouts: Timeouts::default(),
            };
            let groups = plan.plan.groups().unwrap();
            let live = plan.plan.vms.iter().map(|v| v.host.clone()).collect();
            Case {
                plan,
                groups,
                state: None,
                phases: HashMap::new(),
                live,
            }
        }
        fn begun(mut self) -> Case {
            self.state = Some(StateRecord {
                format: FORMAT,
                restore_id: "r".into(),
                status: Status::Active,
                began_unix_ns: 100 * S,
                by: "h1".into(),
                coordinators: vec!["h1".into()],
                reason: None,
                updated_unix_ns: 100 * S,
            });
            for v in &self.plan.plan.vms {
                self.phases
                    .insert(v.vm.clone(), (PhaseRecord::new(&v.vm, &v.host), 1));
            }
            self
        }
        fn set(&mut self, vm: &str, phase: Phase) -> &mut PhaseRecord {
            let r = &mut self.phases.get_mut(vm).unwrap().0;
            r.phase = phase;
            if phase.ran() || phase == Phase::Start {
                r.start_sent_unix_ns = Some(100 * S);
                r.start_at_unix_ns = Some(100 * S);
            }
            if matches!(phase, Phase::Started | Phase::Restored) {
                r.started_unix_ns = Some(100 * S);
            }
            r
        }
        fn decide(&self, now: i64) -> Decision {
            decide(
                &View {
                    plan: &self.plan,
                    groups: &self.groups,
                    state: self.state.as_ref().map(|s| (s, 1)),
                    phases: &self.phases,
                    live: &self.live,
                    now_unix_ns: now,
                },
                &Tunables::default(),
            )
        }
    }

    #[test]
    fn begins_or_refuses_a_plan_with_a_dead_host() {
        let mut c = Case::new(vec![vm("a", "h1", &[], None), vm("b", "h2", &[], None)]);
        assert_eq!(c.decide(0).actions, vec![Action::Begin]);
        c.live.remove("h2");
        assert_eq!(
            c.decide(0).actions,
            vec![Action::Refuse {
                reason: "host h2 is not in the cluster (no live lease)".into()
            }]
        );
    }

    #[test]
    fn dependencies_and_the_line_order_the_starts() {
        // b sends to a (b depends on a); c starts 2 s into the line.
        let mut c = Case::new(vec![
            vm("a", "h1", &[], None),
            vm("b", "h2", &["a"], None),
            vm("c", "h2", &[], Some(2.0)),
        ])
        .begun();
        assert!(c.decide(101 * S).actions.is_empty());
        c.set("a", Phase::Loaded);
        c.set("b", Phase::Loaded);
        c.set("c", Phase::Loaded);
        let d = c.decide(101 * S);
        assert_eq!(
            d.actions,
            vec![Action::Start {
                vms: vec![("a".into(), 101 * S)]
            }]
        );
        // c's instant is 102 s; its START goes out `lead` before.
        assert_eq!(d.wake_unix_ns, Some(102 * S - 500_000_000));
        c.set("a", Phase::Start);
        assert_eq!(
            c.decide(102 * S - 400_000_000).actions,
            vec![Action::Start {
                vms: vec![("c".into(), 102 * S)]
            }]
        );
        c.set("c", Phase::Start);
        assert!(
            c.decide(102 * S).actions.is_empty(),
            "b waits for a to start"
        );
        c.set("a", Phase::Started);
        assert_eq!(
            c.decide(103 * S).actions,
            vec![Action::Start {
                vms: vec![("b".into(), 103 * S)]
            }]
        );
        for v in ["a", "b", "c"] {
            c.set(v, Phase::Restored);
        }
        assert_eq!(
            c.decide(104 * S).actions,
            vec![Action::Finish {
                status: Status::Restored
            }]
        );
    }

    #[test]
    fn a_ring_starts_together_once_all_are_loaded() {
        let mut c = Case::new(vec![
            vm("a", "h1", &["b"], None),
            vm("b", "h2", &["a"], None),
        ])
        .begun();
        c.set("a", Phase::Loaded);
        assert!(c.decide(101 * S).actions.is_empty());
        c.set("b", Phase::Loaded);
        assert_eq!(
            c.decide(101 * S).actions,
            vec![Action::Start {
                vms: vec![("a".into(), 101 * S), ("b".into(), 101 * S)]
            }]
        );
    }

    #[test]
    fn failures_dead_hosts_and_timeouts_abort() {
        let mut c = Case::new(vec![vm("a", "h1", &[], None), vm("b", "h2", &[], None)]).begun();
        c.set("a", Phase::LoadFailed).error = Some("no snapshot".into());
        let d = c.decide(101 * S);
        assert!(
            matches!(&d.actions[..], [Action::Abort { reason }] if reason.contains("VM a: load failed on host h1: no snapshot")),
            "{d:?}"
        );
        let mut c = Case::new(vec![vm("a", "h1", &[], None), vm("b", "h2", &[], None)]).begun();
        c.live.remove("h2");
        let d = c.decide(101 * S);
        assert!(
            matches!(&d.actions[..], [Action::Abort { reason }] if reason.contains("host h2's lease expired")),
            "{d:?}"
        );
        let mut c = Case::new(vec![vm("a", "h1", &[], None)]).begun();
        assert_eq!(c.decide(101 * S).wake_unix_ns, Some(400 * S));
        let d = c.decide(400 * S);
        assert!(
            matches!(&d.actions[..], [Action::Abort { reason }] if reason.contains("did not load within 300 s")),
            "{d:?}"
        );
        // A restored VM on a dead host is done: no abort.
        c.set("a", Phase::Restored);
        c.live.clear();
        assert_eq!(
            c.decide(101 * S).actions,
            vec![Action::Finish {
                status: Status::Restored
            }]
        );
    }

    #[test]
    fn an_abort_ends_once_every_vm_is_settled() {
        let mut c = Case::new(vec![
            vm("a", "h1", &[], None),
            vm("b", "h2", &[], None),
            vm("c", "h3", &[], None),
        ])
        .begun();
        {
            let s = c.state.as_mut().unwrap();
            s.status = Status::Aborting;
            s.reason = Some("x".into());
        }
        c.set("a", Phase::Started);
        c.set("b", Phase::Loaded);
        c.set("c", Phase::Loaded);
        let d = c.decide(101 * S);
        assert!(d.actions.is_empty());
        assert_eq!(d.wake_unix_ns, Some(110 * S));
        c.set("b", Phase::Aborted);
        c.live.remove("h3");
        assert_eq!(
            c.decide(101 * S).actions,
            vec![Action::Finish {
                status: Status::Aborted
            }]
        );
    }

    #[test]
    fn missing_loads_are_written_after_a_coordinator_died_mid_begin() {
        let mut c = Case::new(vec![vm("a", "h1", &[], None), vm("b", "h2", &[], None)]).begun();
        c.phases.remove("b");
        assert_eq!(c.decide(101 * S).actions, vec![Action::Begin]);
    }
}
