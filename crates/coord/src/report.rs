//! What one restore did, read back from its records (JSON in the API and the CLI).
//!
//! Times named `*_s` are seconds after the restore began (the line's origin, on
//! the first coordinator's wall clock); `*_unix_ns` are wall-clock instants as
//! the host that wrote them saw them. Hosts' clocks are assumed in step (NTP):
//! a VM starts on its instant by its own host's clock.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::records::{Phase, Status};
use crate::view::RestoreView;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "result")]
pub enum Outcome {
    /// Every VM started and its memory is in (RESTORE_FIN).
    Restored,
    /// The restore stopped early; each VM's `state` says where it ended.
    Aborted { reason: String },
    /// Not ended yet (`aborting` while the hosts drop their held VMs).
    Running { status: String },
}

/// Where a VM ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VmState {
    /// Started, and the rest of its memory is loaded (RESTORE_FIN).
    Restored,
    /// Started and running, but not restored when the report was made (the restore
    /// was aborted, or is still running).
    Started,
    /// Never started; its host dropped it. `held` says whether it had loaded
    /// (LOAD_FIN) and was held paused.
    Aborted,
    /// Its host could not load it (`error` says why).
    LoadFailed,
    /// Its host could not start it.
    StartFailed,
    /// Started, but loading the rest of memory failed (RESTORE_FAILED).
    RestoreFailed,
    /// Not started and not dropped when the report was made: still loading or
    /// held, or its host failed before it confirmed the abort.
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RestoreReport {
    pub restore_id: String,
    pub outcome: Outcome,
    pub began_unix_ns: i64,
    /// From the beginning to the last change of the restore's state.
    pub duration_s: f64,
    /// The hosts that coordinated, in order (more than one after a failover).
    pub coordinators: Vec<String>,
    pub vms: Vec<VmReport>,
    pub rings: Vec<RingReport>,
    pub hosts: Vec<HostReport>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VmReport {
    pub vm: String,
    pub host: String,
    pub state: VmState,
    /// The VM's last recorded phase.
    pub phase: String,
    pub ws_pages: u64,
    /// Whether it loaded (LOAD_FIN) and so was held until START.
    pub held: bool,
    pub pages: Option<u64>,
    pub load_s: Option<f64>,
    pub load_fin_s: Option<f64>,
    /// When the coordinator wrote START.
    pub start_sent_s: Option<f64>,
    /// The instant it was to start (the restore line's).
    pub start_at_s: Option<f64>,
    /// When it started, by its host's clock.
    pub start_s: Option<f64>,
    pub start_unix_ns: Option<i64>,
    /// Started minus its instant, in milliseconds: the start's precision.
    pub start_error_ms: Option<f64>,
    pub restore_fin_s: Option<f64>,
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RingReport {
    pub vms: Vec<String>,
    /// Latest minus earliest start of the members; `None` unless all started.
    pub spread_s: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostReport {
    pub host: String,
    pub vms: Vec<String>,
    /// Whether its lease was alive when the report was made.
    pub live: bool,
}

/// The report of a restore whose plan was read; `None` before it began.
pub fn report(r: &RestoreView, live: &BTreeSet<String>) -> Option<RestoreReport> {
    let plan = &r.plan()?.record.plan;
    let groups = &r.plan()?.groups;
    let (state, _) = r.state()?;
    let t0 = state.began_unix_ns;
    let s = |ns: Option<i64>| ns.map(|ns| (ns - t0) as f64 / 1e9);
    let vms: Vec<VmReport> = plan
        .vms
        .iter()
        .map(|p| {
            let rec = r.phases.get(&p.vm).map(|(rec, _)| rec);
            let phase = rec.map(|r| r.phase);
            let state = match phase {
                Some(Phase::Restored) => VmState::Restored,
                Some(Phase::Started | Phase::Starting) => VmState::Started,
                Some(Phase::Aborted) => VmState::Aborted,
                Some(Phase::LoadFailed) => VmState::LoadFailed,
                Some(Phase::StartFailed) => VmState::StartFailed,
                Some(Phase::RestoreFailed) => VmState::RestoreFailed,
                Some(Phase::Load | Phase::Loaded | Phase::Start) | None => VmState::Unknown,
            };
            let started = rec.and_then(|r| r.started_unix_ns);
            let at = rec.and_then(|r| r.start_at_unix_ns);
            VmReport {
                vm: p.vm.clone(),
                host: p.host.clone(),
                state,
                phase: phase.map_or("none", Phase::name).to_string(),
                ws_pages: p.ws_pages,
                held: rec.is_some_and(|r| r.loaded_unix_ns.is_some()),
                pages: rec.and_then(|r| r.pages),
                load_s: rec.and_then(|r| r.load_s),
                load_fin_s: s(rec.and_then(|r| r.loaded_unix_ns)),
                start_sent_s: s(rec.and_then(|r| r.start_sent_unix_ns)),
                start_at_s: s(at),
                start_s: s(started),
                start_unix_ns: started,
                start_error_ms: started.zip(at).map(|(a, b)| (a - b) as f64 / 1e6),
                restore_fin_s: s(rec.and_then(|r| r.restored_unix_ns)),
                error: rec.and_then(|r| r.error.clone()),
            }
        })
        .collect();
    let rings = groups
        .groups
        .iter()
        .filter(|g| g.len() > 1)
        .map(|g| {
            let starts: Option<Vec<i64>> = g.iter().map(|&i| vms[i].start_unix_ns).collect();
            RingReport {
                vms: g.iter().map(|&i| vms[i].vm.clone()).collect(),
                spread_s: starts
                    .map(|st| (st.iter().max().unwrap() - st.iter().min().unwrap()) as f64 / 1e9),
            }
        })
        .collect();
    let hosts: BTreeSet<&str> = plan.vms.iter().map(|v| v.host.as_str()).collect();
    let hosts = hosts
        .into_iter()
        .map(|h| HostReport {
            host: h.to_string(),
            vms: plan
                .vms
                .iter()
                .filter(|v| v.host == h)
                .map(|v| v.vm.clone())
                .collect(),
            live: live.contains(h),
        })
        .collect();
    let outcome = match state.status {
        Status::Restored => Outcome::Restored,
        _ => Outcome::Aborted {
            reason: state
                .reason
                .clone()
                .unwrap_or_else(|| "not finished".into()),
        },
    };
    Some(RestoreReport {
        restore_id: plan.restore_id.clone(),
        outcome,
        began_unix_ns: t0,
        duration_s: (state.updated_unix_ns - t0) as f64 / 1e9,
        coordinators: state.coordinators.clone(),
        vms,
        rings,
        hosts,
    })
}
