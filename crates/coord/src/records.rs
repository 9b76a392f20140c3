//! The records kept in the cluster store (JSON, format 1), and their checks.
//!
//! Every record comes from another host (or from whoever could write the key), so
//! [`decode`] refuses, with a reason naming the key: a value over its size cap,
//! bytes that are not the record's JSON (unknown fields included), a format other
//! than [`FORMAT`], names that differ from the key's, and values out of range. A
//! refused record is never acted on.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::layout::{self, NameError};
use crate::restore_plan::{Plan, PlanError};

/// The records' format; any incompatible change makes a new one (and a new
/// [`layout::ROOT`]).
pub const FORMAT: u32 = 1;

/// Most VMs one plan may hold.
pub const MAX_PLAN_VMS: usize = 100_000;
/// Largest working set a plan may ask for, in pages (4 PiB of 4 KiB pages).
pub const MAX_WS_PAGES: u64 = 1 << 40;
/// Latest a line may start a VM, in seconds after the restore began.
pub const MAX_START_AT_S: f64 = 86_400.0;

/// Why a record was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RecordError {
    #[error("record {key} is {len} bytes, over its {cap}-byte cap")]
    TooLarge { key: String, len: usize, cap: usize },
    #[error("record {key} is not a valid {what}: {reason}")]
    Malformed {
        key: String,
        what: &'static str,
        reason: String,
    },
    #[error("record {key} has format {found}; this build reads format {FORMAT}")]
    Format { key: String, found: u32 },
    #[error("record {key} names {field} {found:?}, but its key says {expected:?}")]
    Mismatch {
        key: String,
        field: &'static str,
        found: String,
        expected: String,
    },
    #[error("record {key} holds a name that cannot be used")]
    Name {
        key: String,
        #[source]
        source: NameError,
    },
    #[error("record {key} holds a plan that cannot run")]
    Plan {
        key: String,
        #[source]
        source: PlanError,
    },
    #[error("record {key}: {reason}")]
    Range { key: String, reason: String },
}

/// A record type: its size cap, its name in errors, and its own checks.
pub trait Record: Serialize + DeserializeOwned {
    const WHAT: &'static str;
    const CAP: usize;
    fn format(&self) -> u32;
    /// Checks beyond the JSON shape, given the key it was read from.
    fn check(&self, key: &str) -> Result<(), RecordError>;
}

/// Reads one record from the store's bytes; see the module doc for what is refused.
pub fn decode<T: Record>(key: &str, bytes: &[u8]) -> Result<T, RecordError> {
    if bytes.len() > T::CAP {
        return Err(RecordError::TooLarge {
            key: key.to_string(),
            len: bytes.len(),
            cap: T::CAP,
        });
    }
    // The format is read first so a newer record says "format 2", not "unknown field".
    #[derive(Deserialize)]
    struct Probe {
        format: u32,
    }
    if let Ok(p) = serde_json::from_slice::<Probe>(bytes) {
        if p.format != FORMAT {
            return Err(RecordError::Format {
                key: key.to_string(),
                found: p.format,
            });
        }
    }
    let r: T = serde_json::from_slice(bytes).map_err(|e| RecordError::Malformed {
        key: key.to_string(),
        what: T::WHAT,
        reason: e.to_string(),
    })?;
    if r.format() != FORMAT {
        return Err(RecordError::Format {
            key: key.to_string(),
            found: r.format(),
        });
    }
    r.check(key)?;
    Ok(r)
}

/// The bytes of a record to write.
pub fn encode<T: Record>(r: &T) -> Vec<u8> {
    serde_json::to_vec(r).expect("records serialize")
}

fn same(key: &str, field: &'static str, found: &str, expected: &str) -> Result<(), RecordError> {
    if found == expected {
        Ok(())
    } else {
        Err(RecordError::Mismatch {
            key: key.to_string(),
            field,
            found: found.to_string(),
            expected: expected.to_string(),
        })
    }
}

fn named(key: &str, r: Result<(), NameError>) -> Result<(), RecordError> {
    r.map_err(|source| RecordError::Name {
        key: key.to_string(),
        source,
    })
}

fn range(key: &str, ok: bool, reason: impl FnOnce() -> String) -> Result<(), RecordError> {
    if ok {
        Ok(())
    } else {
        Err(RecordError::Range {
            key: key.to_string(),
            reason: reason(),
        })
    }
}

/// `hosts/<host>/info`: a live host (the key is on the host's lease).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostRecord {
    pub format: u32,
    pub host: String,
    /// Rebound's version on the host.
    pub version: String,
    /// The host's wall clock when its daemon joined.
    pub joined_unix_ns: i64,
    /// The lease's TTL: the host is declared failed this long after its last
    /// renewal.
    pub ttl_s: f64,
}

impl Record for HostRecord {
    const WHAT: &'static str = "host record";
    const CAP: usize = 4096;
    fn format(&self) -> u32 {
        self.format
    }
    fn check(&self, key: &str) -> Result<(), RecordError> {
        named(key, layout::check_host(&self.host))?;
        if let layout::Key::HostInfo { host } = layout::parse(key) {
            same(key, "host", &self.host, host)?;
        }
        range(key, self.ttl_s.is_finite() && self.ttl_s > 0.0, || {
            format!("ttl_s {} is not a positive number", self.ttl_s)
        })
    }
}

/// `hosts/<host>/vms/<vm>`: one VM as its host's daemon last published it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmRecord {
    pub format: u32,
    pub vm: String,
    /// The daemon's state name for the VM (`running`, `paused`, `crashed`, ...).
    pub state: String,
    /// The guest answered its readiness check.
    pub ready: bool,
    pub memory_mib: u64,
    pub updated_unix_ns: i64,
}

impl Record for VmRecord {
    const WHAT: &'static str = "VM record";
    const CAP: usize = 16 * 1024;
    fn format(&self) -> u32 {
        self.format
    }
    fn check(&self, key: &str) -> Result<(), RecordError> {
        named(key, layout::check_vm(&self.vm))?;
        if let layout::Key::HostVm { vm, .. } = layout::parse(key) {
            same(key, "vm", &self.vm, vm)?;
        }
        range(key, self.state.len() <= 64, || "state name too long".into())
    }
}

/// Most snapshot directories one host lists.
pub const MAX_SNAPSHOTS: usize = 4096;

/// `hosts/<host>/snapshots`: the snapshot catalog, the snapshot directories this
/// host's daemon holds (restorable there by a cluster plan).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotsRecord {
    pub format: u32,
    pub dirs: Vec<String>,
    pub updated_unix_ns: i64,
}

impl Record for SnapshotsRecord {
    const WHAT: &'static str = "snapshot catalog";
    const CAP: usize = 4 << 20;
    fn format(&self) -> u32 {
        self.format
    }
    fn check(&self, key: &str) -> Result<(), RecordError> {
        range(key, self.dirs.len() <= MAX_SNAPSHOTS, || {
            format!(
                "{} snapshot directories, over {MAX_SNAPSHOTS}",
                self.dirs.len()
            )
        })
    }
}

/// `clusters/<name>`: a cluster's definition, its `cluster.toml` as the operator
/// wrote it (the operator's to write; hosts read it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterRecord {
    pub format: u32,
    pub name: String,
    pub toml: String,
    pub updated_unix_ns: i64,
}

impl Record for ClusterRecord {
    const WHAT: &'static str = "cluster definition";
    const CAP: usize = 1 << 20;
    fn format(&self) -> u32 {
        self.format
    }
    fn check(&self, key: &str) -> Result<(), RecordError> {
        if let layout::Key::Cluster { name } = layout::parse(key) {
            same(key, "name", &self.name, name)?;
        }
        Ok(())
    }
}

/// Per-phase timeouts of a restore, in seconds (the plan's submitter chooses).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Timeouts {
    /// From the restore's beginning to each VM's LOAD_FIN.
    pub load_s: f64,
    /// From START to START_FIN.
    pub start_s: f64,
    /// From START_FIN to RESTORE_FIN.
    pub restore_s: f64,
}

impl Timeouts {
    /// The longest a restore can run: every phase's limit, and a minute for the
    /// hosts to settle an abort.
    pub fn limit(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64(self.load_s + self.start_s + self.restore_s + 60.0)
    }
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            load_s: 300.0,
            start_s: 30.0,
            restore_s: 600.0,
        }
    }
}

/// `restores/<id>/plan`: what to restore, written once (create-only) by whoever
/// submits the restore.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanRecord {
    pub format: u32,
    pub plan: Plan,
    pub submitted_unix_ns: i64,
    #[serde(default)]
    pub timeouts: Timeouts,
}

impl Record for PlanRecord {
    const WHAT: &'static str = "restore plan";
    const CAP: usize = 64 << 20;
    fn format(&self) -> u32 {
        self.format
    }
    fn check(&self, key: &str) -> Result<(), RecordError> {
        named(key, layout::check_restore(&self.plan.restore_id))?;
        if let layout::Key::Plan { restore } = layout::parse(key) {
            same(key, "restore_id", &self.plan.restore_id, restore)?;
        }
        range(key, self.plan.vms.len() <= MAX_PLAN_VMS, || {
            format!("{} VMs, over {MAX_PLAN_VMS}", self.plan.vms.len())
        })?;
        for v in &self.plan.vms {
            named(key, layout::check_vm(&v.vm))?;
            named(key, layout::check_host(&v.host))?;
            range(key, v.ws_pages <= MAX_WS_PAGES, || {
                format!("VM {} asks for {} working-set pages", v.vm, v.ws_pages)
            })?;
            range(
                key,
                v.start_at_s.is_none_or(|s| s <= MAX_START_AT_S),
                || format!("VM {} starts later than {MAX_START_AT_S} s", v.vm),
            )?;
        }
        let t = &self.timeouts;
        range(
            key,
            [t.load_s, t.start_s, t.restore_s]
                .iter()
                .all(|s| s.is_finite() && *s > 0.0 && *s <= 7.0 * 86_400.0),
            || "a timeout is not between 0 and 7 days".into(),
        )?;
        self.plan
            .groups()
            .map(|_| ())
            .map_err(|source| RecordError::Plan {
                key: key.to_string(),
                source,
            })
    }
}

/// The restore's status, in `restores/<id>/state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// VMs load and start.
    Active,
    /// No VM starts any more; held VMs are dropped; `reason` says why.
    Aborting,
    /// Every VM restored (final).
    Restored,
    /// Aborted, and every VM's end is recorded or its host is gone (final).
    Aborted,
}

impl Status {
    pub fn is_final(self) -> bool {
        matches!(self, Status::Restored | Status::Aborted)
    }
}

/// `restores/<id>/state`: created by the first coordinator with every VM's LOAD.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateRecord {
    pub format: u32,
    pub restore_id: String,
    pub status: Status,
    /// The restore line's origin: VM `v` starts at `origin + v.start_at_s`.
    pub began_unix_ns: i64,
    /// The host whose daemon last changed the status.
    pub by: String,
    /// Each host that coordinated, in order (a failover appends one).
    #[serde(default)]
    pub coordinators: Vec<String>,
    #[serde(default)]
    pub reason: Option<String>,
    pub updated_unix_ns: i64,
}

impl Record for StateRecord {
    const WHAT: &'static str = "restore state";
    const CAP: usize = 64 * 1024;
    fn format(&self) -> u32 {
        self.format
    }
    fn check(&self, key: &str) -> Result<(), RecordError> {
        if let layout::Key::State { restore } = layout::parse(key) {
            same(key, "restore_id", &self.restore_id, restore)?;
        }
        range(key, self.coordinators.len() <= 1024, || {
            "too many coordinators".into()
        })?;
        range(
            key,
            matches!(self.status, Status::Active | Status::Restored) || self.reason.is_some(),
            || "an aborted restore without a reason".into(),
        )
    }
}

/// A VM's phase in a restore (HotRestore's messages become these transitions).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// LOAD: the coordinator asks the host to load the VM's working set.
    Load,
    /// LOAD_FIN: loaded and held paused.
    Loaded,
    /// START: the coordinator says start at `start_at_unix_ns`.
    Start,
    /// The host took the START (no abort can stop it now) and is starting the VM.
    Starting,
    /// START_FIN: running since `started_unix_ns`.
    Started,
    /// RESTORE_FIN: the rest of memory is in.
    Restored,
    LoadFailed,
    StartFailed,
    RestoreFailed,
    /// Dropped before it ever started (ABORT_ACK).
    Aborted,
}

impl Phase {
    /// No later transition.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            Phase::Restored
                | Phase::LoadFailed
                | Phase::StartFailed
                | Phase::RestoreFailed
                | Phase::Aborted
        )
    }
    /// The VM runs (or is being started and will).
    pub fn ran(self) -> bool {
        matches!(
            self,
            Phase::Starting | Phase::Started | Phase::Restored | Phase::RestoreFailed
        )
    }
    pub fn name(self) -> &'static str {
        match self {
            Phase::Load => "load",
            Phase::Loaded => "loaded",
            Phase::Start => "start",
            Phase::Starting => "starting",
            Phase::Started => "started",
            Phase::Restored => "restored",
            Phase::LoadFailed => "load_failed",
            Phase::StartFailed => "start_failed",
            Phase::RestoreFailed => "restore_failed",
            Phase::Aborted => "aborted",
        }
    }
}

/// `restores/<id>/vms/<vm>`: one VM's phase and what each transition recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PhaseRecord {
    pub format: u32,
    pub vm: String,
    pub host: String,
    pub phase: Phase,
    #[serde(default)]
    pub loaded_unix_ns: Option<i64>,
    #[serde(default)]
    pub pages: Option<u64>,
    #[serde(default)]
    pub load_s: Option<f64>,
    /// When the coordinator wrote START.
    #[serde(default)]
    pub start_sent_unix_ns: Option<i64>,
    /// The instant the VM is to start (the line's, or "now" for a VM that waited
    /// on others).
    #[serde(default)]
    pub start_at_unix_ns: Option<i64>,
    #[serde(default)]
    pub started_unix_ns: Option<i64>,
    #[serde(default)]
    pub restored_unix_ns: Option<i64>,
    #[serde(default)]
    pub error: Option<String>,
}

impl PhaseRecord {
    pub fn new(vm: &str, host: &str) -> PhaseRecord {
        PhaseRecord {
            format: FORMAT,
            vm: vm.to_string(),
            host: host.to_string(),
            phase: Phase::Load,
            loaded_unix_ns: None,
            pages: None,
            load_s: None,
            start_sent_unix_ns: None,
            start_at_unix_ns: None,
            started_unix_ns: None,
            restored_unix_ns: None,
            error: None,
        }
    }
}

impl Record for PhaseRecord {
    const WHAT: &'static str = "VM phase";
    const CAP: usize = 64 * 1024;
    fn format(&self) -> u32 {
        self.format
    }
    fn check(&self, key: &str) -> Result<(), RecordError> {
        named(key, layout::check_host(&self.host))?;
        if let layout::Key::Phase { vm, host, .. } = layout::parse(key) {
            same(key, "vm", &self.vm, vm)?;
            same(key, "host", &self.host, host)?;
        }
        let needs = match self.phase {
            Phase::Start | Phase::Starting => self.start_at_unix_ns.is_some(),
            Phase::Started | Phase::Restored => self.started_unix_ns.is_some(),
            Phase::LoadFailed | Phase::StartFailed | Phase::RestoreFailed => self.error.is_some(),
            _ => true,
        };
        range(key, needs, || {
            format!("phase {} lacks the field it needs", self.phase.name())
        })?;
        range(
            key,
            self.error.as_ref().is_none_or(|e| e.len() <= 8192),
            || "error text over 8 KiB".into(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::restore_plan::PlanVm;

    fn plan() -> PlanRecord {
        PlanRecord {
            format: FORMAT,
            plan: Plan {
                restore_id: "r1".into(),
                vms: vec![PlanVm {
                    vm: "a".into(),
                    host: "h1".into(),
                    ws_pages: 10,
                    args: serde_json::Value::Null,
                    depends_on: vec![],
                    start_at_s: Some(0.5),
                }],
            },
            submitted_unix_ns: 1,
            timeouts: Timeouts::default(),
        }
    }

    fn refused(key: &str, bytes: &[u8]) -> String {
        rebound_errors::chain(&decode::<PlanRecord>(key, bytes).unwrap_err())
    }

    #[test]
    fn malformed_plans_are_refused_with_a_reason() {
        let key = layout::plan("r1");
        let good = encode(&plan());
        assert_eq!(decode::<PlanRecord>(&key, &good).unwrap(), plan());
        // Truncated.
        assert!(refused(&key, &good[..good.len() / 2]).contains("not a valid restore plan"));
        // Not JSON at all.
        assert!(refused(&key, b"\x00\x01garbage").contains("not a valid restore plan"));
        // Another format.
        let v2 = String::from_utf8(good.clone())
            .unwrap()
            .replace("\"format\":1", "\"format\":2");
        assert!(refused(&key, v2.as_bytes()).contains("format 2"));
        // An unknown field.
        let extra = String::from_utf8(good.clone())
            .unwrap()
            .replacen('{', "{\"surprise\":1,", 1);
        assert!(refused(&key, extra.as_bytes()).contains("unknown field"));
        // Oversized.
        let huge = vec![b' '; PlanRecord::CAP + 1];
        assert!(refused(&key, &huge).contains("over its"));
        // Under another restore's key.
        assert!(refused(&layout::plan("r2"), &good).contains("its key says"));
        // Out-of-range fields.
        let mut p = plan();
        p.plan.vms[0].ws_pages = MAX_WS_PAGES + 1;
        assert!(refused(&key, &encode(&p)).contains("working-set pages"));
        let mut p = plan();
        p.plan.vms[0].host = "../h2".into();
        assert!(refused(&key, &encode(&p)).contains("host name"));
        let mut p = plan();
        p.plan.vms[0].depends_on = vec!["nobody".into()];
        assert!(refused(&key, &encode(&p)).contains("cannot run"));
        let mut p = plan();
        p.timeouts.start_s = f64::INFINITY;
        // JSON has no infinity: serde writes null, which is refused as malformed.
        assert!(decode::<PlanRecord>(&key, &encode(&p)).is_err());
    }

    #[test]
    fn phases_need_their_fields() {
        let key = layout::phase("r1", "h1", "a");
        let mut r = PhaseRecord::new("a", "h1");
        assert!(decode::<PhaseRecord>(&key, &encode(&r)).is_ok());
        r.phase = Phase::Start;
        let e = decode::<PhaseRecord>(&key, &encode(&r)).unwrap_err();
        assert!(e.to_string().contains("phase start lacks"), "{e}");
        r.start_at_unix_ns = Some(5);
        assert!(decode::<PhaseRecord>(&key, &encode(&r)).is_ok());
        assert!(decode::<PhaseRecord>(&layout::phase("r1", "h1", "b"), &encode(&r)).is_err());
        // A record whose host is not its key's cannot act for another host.
        let e = decode::<PhaseRecord>(&layout::phase("r1", "h2", "a"), &encode(&r)).unwrap_err();
        assert!(e.to_string().contains("host"), "{e}");
        r.phase = Phase::LoadFailed;
        assert!(decode::<PhaseRecord>(&key, &encode(&r)).is_err());
    }
}
