//! What one restore did, as the daemon returns it (JSON).
//!
//! Times named `*_s` are seconds after the coordinator sent the first LOAD (its
//! monotonic clock); `*_unix_ns` are on the coordinator's wall clock. A cohort's
//! start instant is moved onto the coordinator's clock with the offset estimated
//! NTP-style from the PING/PONG round trips (the sample with the smallest round
//! trip wins): `offset = ((t2 - t1) + (t3 - t4)) / 2`, `start on coordinator clock
//! = started_unix_ns - offset`.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RestoreReport {
    pub restore_id: String,
    pub outcome: Outcome,
    /// The coordinator's wall clock when it sent the first LOAD.
    pub began_unix_ns: i64,
    /// From the first LOAD to the report.
    pub duration_s: f64,
    pub vms: Vec<VmReport>,
    pub rings: Vec<RingReport>,
    pub cohorts: Vec<CohortReport>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "result")]
pub enum Outcome {
    /// Every VM started and sent RESTORE_FIN.
    Restored,
    /// The restore stopped early: the coordinator sent ABORT to every cohort it could
    /// reach. Each VM's `state` says where it ended.
    Aborted { reason: String },
}

/// Where a VM ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VmState {
    /// Started, and the rest of its memory is loaded (RESTORE_FIN).
    Restored,
    /// Started and running, but no RESTORE_FIN came before the report (the restore
    /// was aborted, or `restore` timed out).
    Started,
    /// Never started; its cohort confirmed it dropped the VM (ABORT_ACK). `held`
    /// in the report says whether it had loaded (LOAD_FIN) and was held paused.
    Aborted,
    /// Its cohort reported LOAD_FAILED (`error` says why).
    LoadFailed,
    /// Its cohort reported START_FAILED.
    StartFailed,
    /// Started, but loading the rest of memory failed (RESTORE_FAILED).
    RestoreFailed,
    /// Never confirmed started, and its cohort was unreachable or did not confirm
    /// the abort: its fate is unknown here. If the cohort is alive it aborts the VM
    /// after its `hold_timeout` unless the VM had started.
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VmReport {
    pub vm: String,
    pub cohort: String,
    pub state: VmState,
    pub ws_pages: u64,
    /// Whether LOAD_FIN came (the VM was loaded and, until START, held).
    pub held: bool,
    /// Pages the cohort loaded and how long it took, from LOAD_FIN.
    pub pages: Option<u64>,
    pub load_s: Option<f64>,
    /// When LOAD_FIN arrived.
    pub load_fin_s: Option<f64>,
    /// When the coordinator sent START (the first time).
    pub start_sent_s: Option<f64>,
    /// The cohort's start instant on the coordinator's clock.
    pub start_unix_ns: Option<i64>,
    /// The same, in seconds after the first LOAD.
    pub start_s: Option<f64>,
    /// From sending START to receiving START_FIN.
    pub start_fin_latency_s: Option<f64>,
    /// When RESTORE_FIN arrived.
    pub restore_fin_s: Option<f64>,
    /// The cohort's estimated clock offset used for `start_unix_ns`.
    pub clock_offset_ns: Option<i64>,
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RingReport {
    pub vms: Vec<String>,
    /// Latest minus earliest start instant of the members (coordinator's clock);
    /// `None` unless every member started.
    pub spread_s: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CohortReport {
    pub addr: String,
    pub vms: Vec<String>,
    /// False once the coordinator gave up on it (no frame for the `peer` timeout,
    /// or it failed authentication).
    pub reachable: bool,
    pub error: Option<String>,
    /// Cohort clock minus coordinator clock, from the best PING/PONG.
    pub clock_offset_ns: Option<i64>,
    /// Half that sample's round trip (less the cohort's turnaround).
    pub one_way_delay_ns: Option<i64>,
    /// Connections opened after the first.
    pub reconnects: u32,
}
