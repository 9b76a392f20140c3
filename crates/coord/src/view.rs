//! What one daemon knows of the cluster store: every restore's plan and state, the
//! phases it follows (its own VMs', or a whole restore's when it coordinates it) and
//! the live hosts, read once and then kept current from watches
//! ([`ClusterView::apply`]). Records are checked as they arrive; a refused one is
//! kept as its error, so the restore it belongs to is reported as refused instead
//! of being acted on.
//!
//! The records come through several watches (one per prefix), each in revision
//! order but not in order with each other, and a watch replaced by a wider one can
//! deliver a change the new one's read already holds: a record is never replaced
//! by an older revision of itself.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use rebound_store::{Event, KeyValue, Revision};

use crate::layout::{self, Key};
use crate::records::{decode, HostRecord, PhaseRecord, PlanRecord, RecordError, StateRecord};
use crate::restore_plan::{Groups, PlanVm};

/// A checked plan, its start groups and each host's VMs (indices into the plan).
pub struct CheckedPlan {
    pub record: PlanRecord,
    pub groups: Groups,
    pub by_host: HashMap<String, Vec<usize>>,
}

impl CheckedPlan {
    pub fn new(record: PlanRecord, groups: Groups) -> CheckedPlan {
        let mut by_host: HashMap<String, Vec<usize>> = HashMap::new();
        for (i, v) in record.plan.vms.iter().enumerate() {
            by_host.entry(v.host.clone()).or_default().push(i);
        }
        CheckedPlan {
            record,
            groups,
            by_host,
        }
    }

    /// Host `h`'s VMs in the plan.
    pub fn vms_of<'a>(&'a self, h: &str) -> impl Iterator<Item = &'a PlanVm> + 'a {
        let idx = self.by_host.get(h).map(Vec::as_slice).unwrap_or_default();
        idx.iter().map(|&i| &self.record.plan.vms[i])
    }
}

/// One restore's records.
#[derive(Default)]
pub struct RestoreView {
    pub plan: Option<Result<Arc<CheckedPlan>, RecordError>>,
    pub state: Option<Result<(StateRecord, Revision), RecordError>>,
    /// The revision of the state as read, kept for a refused one too.
    state_rev: Revision,
    pub phases: HashMap<String, (PhaseRecord, Revision)>,
    /// Phase records refused, by VM, with their revision.
    pub bad_phases: BTreeMap<String, (RecordError, Revision)>,
    /// The highest revision of this restore's phases seen (read or watched).
    pub phases_rev: Revision,
}

impl RestoreView {
    /// The plan, if it was read and passed its checks.
    pub fn plan(&self) -> Option<&Arc<CheckedPlan>> {
        self.plan.as_ref()?.as_ref().ok()
    }

    pub fn state(&self) -> Option<(&StateRecord, Revision)> {
        match &self.state {
            Some(Ok((s, r))) => Some((s, *r)),
            _ => None,
        }
    }

    /// Why this restore cannot be acted on, if a record of it was refused.
    pub fn refused(&self) -> Option<&RecordError> {
        match (&self.plan, &self.state) {
            (Some(Err(e)), _) | (_, Some(Err(e))) => Some(e),
            _ => self.bad_phases.values().next().map(|(e, _)| e),
        }
    }

    /// The revision `vm`'s phase record was last seen at (refused or not), 0 if none.
    fn phase_rev(&self, vm: &str) -> Revision {
        self.phases
            .get(vm)
            .map(|(_, r)| *r)
            .or_else(|| self.bad_phases.get(vm).map(|(_, r)| *r))
            .unwrap_or(0)
    }
}

/// The store's contents that matter to restores.
#[derive(Default)]
pub struct ClusterView {
    /// The highest revision of a plan, state or election seen: how far the
    /// `restores/` watch has come.
    pub revision: Revision,
    pub restores: BTreeMap<String, RestoreView>,
    /// Hosts whose info key exists (it lives on the host's lease); a refused record
    /// keeps its error (the host is not counted live).
    pub hosts: BTreeMap<String, Result<HostRecord, RecordError>>,
}

impl ClusterView {
    /// Builds the view from a read of the whole layout at `revision`.
    pub fn from_kvs<'a>(kvs: impl IntoIterator<Item = &'a KeyValue>, revision: Revision) -> Self {
        let mut v = ClusterView::default();
        v.put_all(kvs);
        v.revision = revision;
        for r in v.restores.values_mut() {
            r.phases_rev = revision;
        }
        v
    }

    /// Adds the records of a read of one prefix; the caller says how far it is
    /// known ([`ClusterView::revision`], [`ClusterView::phases_read`]).
    pub fn put_all<'a>(&mut self, kvs: impl IntoIterator<Item = &'a KeyValue>) {
        for kv in kvs {
            self.put(kv);
        }
    }

    /// Notes that restore `id`'s phases were read at `revision` (a read that found
    /// none still says how far they are known).
    pub fn phases_read(&mut self, id: &str, revision: Revision) {
        let r = self.restores.entry(id.to_string()).or_default();
        r.phases_rev = r.phases_rev.max(revision);
    }

    /// Hosts with a live lease and a valid record.
    pub fn live(&self) -> BTreeSet<String> {
        self.hosts
            .iter()
            .filter(|(_, r)| r.is_ok())
            .map(|(h, _)| h.clone())
            .collect()
    }

    /// Applies one watched change.
    pub fn apply(&mut self, ev: &Event) {
        let rev = ev.mod_revision();
        match ev {
            Event::Put(kv) => self.put(kv),
            Event::Delete { key, .. } => self.delete(key, rev),
        }
        match layout::parse(ev.key()) {
            Key::Plan { .. } | Key::State { .. } | Key::Election { .. } => {
                self.revision = self.revision.max(rev)
            }
            Key::Phase { restore, .. } => {
                if let Some(r) = self.restores.get_mut(restore) {
                    r.phases_rev = r.phases_rev.max(rev);
                }
            }
            _ => {}
        }
    }

    fn put(&mut self, kv: &KeyValue) {
        let (key, rev, b) = (kv.key.as_str(), kv.mod_revision, kv.value.as_slice());
        match layout::parse(key) {
            Key::HostInfo { host } => {
                self.hosts
                    .insert(host.to_string(), decode::<HostRecord>(key, b));
            }
            Key::Plan { restore } => {
                let plan = decode::<PlanRecord>(key, b).map(|record| {
                    let groups = record.plan.groups().expect("checked by decode");
                    Arc::new(CheckedPlan::new(record, groups))
                });
                self.restores.entry(restore.to_string()).or_default().plan = Some(plan);
            }
            Key::State { restore } => {
                let r = self.restores.entry(restore.to_string()).or_default();
                if rev >= r.state_rev {
                    r.state = Some(decode::<StateRecord>(key, b).map(|s| (s, rev)));
                    r.state_rev = rev;
                }
            }
            Key::Phase { restore, vm, .. } => {
                let r = self.restores.entry(restore.to_string()).or_default();
                if rev < r.phase_rev(vm) {
                    return;
                }
                match decode::<PhaseRecord>(key, b) {
                    Ok(p) => {
                        r.bad_phases.remove(vm);
                        r.phases.insert(vm.to_string(), (p, rev));
                    }
                    Err(e) => {
                        r.phases.remove(vm);
                        r.bad_phases.insert(vm.to_string(), (e, rev));
                    }
                }
            }
            Key::HostVm { .. }
            | Key::HostSnapshots { .. }
            | Key::Election { .. }
            | Key::Cluster { .. }
            | Key::Other => {}
        }
    }

    fn delete(&mut self, key: &str, rev: Revision) {
        match layout::parse(key) {
            Key::HostInfo { host } => {
                self.hosts.remove(host);
            }
            Key::Plan { restore } => {
                self.restores.remove(restore);
            }
            Key::State { restore } => {
                if let Some(r) = self.restores.get_mut(restore) {
                    if rev > r.state_rev {
                        r.state = None;
                        r.state_rev = rev;
                    }
                }
            }
            Key::Phase { restore, vm, .. } => {
                if let Some(r) = self.restores.get_mut(restore) {
                    if rev > r.phase_rev(vm) {
                        r.phases.remove(vm);
                        r.bad_phases.remove(vm);
                    }
                }
            }
            Key::HostVm { .. }
            | Key::HostSnapshots { .. }
            | Key::Election { .. }
            | Key::Cluster { .. }
            | Key::Other => {}
        }
    }
}
