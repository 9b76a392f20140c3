//! A VM's persistent record (`vms/NAME/vm.json`): what the daemon needs to show
//! status and to re-attach to the QEMU process after a daemon restart.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use rebound_api::{Accel, PortForward, VmState, VmcoreinfoAddr};
use rebound_api::{VmSpec, VmStatus};

/// Errors saving or loading a record.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("cannot write VM record {0}")]
    Write(PathBuf, #[source] std::io::Error),
    #[error("cannot read VM record {0}")]
    Read(PathBuf, #[source] std::io::Error),
    #[error("VM record {0} is malformed: {1}")]
    Malformed(PathBuf, String),
    #[error("VM record {0} has unsupported version {1} (expected {RECORD_VERSION})")]
    Version(PathBuf, u32),
    #[error("VM record {0} is larger than {MAX_RECORD} bytes")]
    TooLarge(PathBuf),
}

/// Format version of `vm.json`.
pub const RECORD_VERSION: u32 = 1;
const MAX_RECORD: u64 = 1 << 20;

/// Everything persisted about one VM.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VmRecord {
    pub version: u32,
    pub spec: VmSpec,
    pub state: VmState,
    pub ready: bool,
    pub accel: Accel,
    pub accel_reason: Option<String>,
    pub qemu_pid: Option<u32>,
    pub run_dir: PathBuf,
    pub ram_file: PathBuf,
    pub forwards: Vec<PortForward>,
    pub started_at: Option<String>,
    /// CLOCK_MONOTONIC ns at spawn, to time readiness across daemon restarts.
    pub started_mono_ns: Option<u64>,
    pub ready_after_ms: Option<u64>,
    pub kernel_release: Option<String>,
    pub vmcoreinfo: Option<VmcoreinfoAddr>,
    pub service_port: Option<u16>,
    /// `ram_file` is a snapshot image QEMU maps private (a restored guest that has
    /// not settled onto shared RAM): it must not be punched, dumped as a file or
    /// deleted with the run dir.
    #[serde(default)]
    pub ram_private: bool,
    /// The files QEMU's disks are, in device order: the VM's own overlay and user
    /// disks, or a restore's overlays of its snapshot's disks. Empty in records of
    /// daemons that did not keep it.
    #[serde(default)]
    pub disk_files: Vec<PathBuf>,
    /// The VM's disk backend processes (`--disk-backend rebound`): they outlive a
    /// crashed QEMU and a daemon restart, and stop with the VM.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blk: Vec<BlkProcess>,
    /// The VM's memory allocation in MiB, guest plus exclusive host caches, as `vm
    /// memory` last set it; `None`: the memory it booted with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation_mib: Option<u64>,
}

/// A running disk backend.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BlkProcess {
    pub pid: u32,
    pub serve: crate::resolve::BlkServe,
}

impl VmRecord {
    /// The record of a VM about to start: no QEMU yet.
    pub fn new(spec: &VmSpec, run: &crate::paths::RunDir) -> VmRecord {
        VmRecord {
            version: RECORD_VERSION,
            spec: spec.clone(),
            state: VmState::Starting,
            ready: false,
            accel: Accel::Tcg,
            accel_reason: None,
            qemu_pid: None,
            run_dir: run.path().to_path_buf(),
            ram_file: run.ram(),
            forwards: Vec::new(),
            started_at: None,
            started_mono_ns: None,
            ready_after_ms: None,
            kernel_release: None,
            vmcoreinfo: None,
            service_port: None,
            ram_private: false,
            disk_files: Vec::new(),
            blk: Vec::new(),
            allocation_mib: None,
        }
    }

    /// Writes atomically (temp file + rename) so a crash never leaves half a record.
    pub fn save(&self, path: &Path) -> Result<(), RecordError> {
        let data = serde_json::to_vec_pretty(self).expect("record serializes");
        crate::private::write_atomic(path, &data)
            .map_err(|e| RecordError::Write(path.to_path_buf(), e))
    }

    /// The API's view of this VM; `job` is what its owner is doing now.
    pub fn status(&self, job: Option<&str>) -> VmStatus {
        VmStatus {
            name: self.spec.name.clone(),
            state: self.state,
            ready: self.ready,
            qemu_pid: self.qemu_pid,
            accel: self.accel,
            accel_reason: self.accel_reason.clone(),
            memory_mib: self.spec.memory_mib,
            cpus: self.spec.cpus,
            ram_file: self.ram_file.display().to_string(),
            run_dir: self.run_dir.display().to_string(),
            kernel_release: self.kernel_release.clone(),
            vmcoreinfo_paddr: self.vmcoreinfo.map(|v| v.paddr),
            workload: self.spec.workload,
            started_at: self.started_at.clone(),
            ready_after_ms: self.ready_after_ms,
            forwards: self.forwards.clone(),
            job: job.map(str::to_string),
            progress: None,
        }
    }

    /// Reads and checks a record.
    pub fn load(path: &Path) -> Result<VmRecord, RecordError> {
        let meta = std::fs::metadata(path).map_err(|e| RecordError::Read(path.to_path_buf(), e))?;
        if meta.len() > MAX_RECORD {
            return Err(RecordError::TooLarge(path.to_path_buf()));
        }
        let data = std::fs::read(path).map_err(|e| RecordError::Read(path.to_path_buf(), e))?;
        let v: serde_json::Value = serde_json::from_slice(&data)
            .map_err(|e| RecordError::Malformed(path.to_path_buf(), e.to_string()))?;
        let version = v.get("version").and_then(|x| x.as_u64()).unwrap_or(0) as u32;
        if version != RECORD_VERSION {
            return Err(RecordError::Version(path.to_path_buf(), version));
        }
        serde_json::from_value(v)
            .map_err(|e| RecordError::Malformed(path.to_path_buf(), e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec() -> VmRecord {
        VmRecord {
            version: RECORD_VERSION,
            spec: VmSpec::new("a"),
            state: VmState::Running,
            ready: false,
            accel: Accel::Tcg,
            accel_reason: None,
            qemu_pid: Some(42),
            run_dir: "/run/a".into(),
            ram_file: "/run/a/ram".into(),
            forwards: vec![PortForward {
                host: 1,
                guest: 2,
                service: Some("web".into()),
            }],
            started_at: None,
            started_mono_ns: Some(5),
            ready_after_ms: None,
            kernel_release: None,
            vmcoreinfo: None,
            service_port: None,
            ram_private: false,
            disk_files: vec!["/vms/a/disk0.qcow2".into()],
            blk: Vec::new(),
            allocation_mib: None,
        }
    }

    #[test]
    fn round_trip() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("vm.json");
        rec().save(&p).unwrap();
        assert_eq!(VmRecord::load(&p).unwrap(), rec());
    }

    #[test]
    fn refuses_bad_records() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("vm.json");
        std::fs::write(&p, b"{\"version\":1,\"spec\":").unwrap();
        assert!(matches!(
            VmRecord::load(&p),
            Err(RecordError::Malformed(..))
        ));
        let mut v = serde_json::to_value(rec()).unwrap();
        v["version"] = 9.into();
        std::fs::write(&p, v.to_string()).unwrap();
        assert!(matches!(
            VmRecord::load(&p),
            Err(RecordError::Version(_, 9))
        ));
        std::fs::write(&p, vec![b' '; (MAX_RECORD + 1) as usize]).unwrap();
        assert!(matches!(VmRecord::load(&p), Err(RecordError::TooLarge(_))));
        v["version"] = 1.into();
        v["state"] = "exploded".into();
        std::fs::write(&p, v.to_string()).unwrap();
        assert!(matches!(
            VmRecord::load(&p),
            Err(RecordError::Malformed(..))
        ));
        assert!(matches!(
            VmRecord::load(&d.path().join("none")),
            Err(RecordError::Read(..))
        ));
    }
}
