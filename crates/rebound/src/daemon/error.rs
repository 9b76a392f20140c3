//! Failures of VM operations, each with the HTTP status the API answers with.
//! Errors keep their sources; `rebound_errors::chain` prints a whole chain on one line,
//! once, at the edge (the API's answer, the daemon's log).

use axum::http::StatusCode;

use rebound_api::{SpecError, VmState};
use rebound_vmm::agent::AgentError;
use rebound_vmm::qemu::QemuCmdError;
use rebound_vmm::qmp::QmpError;
use rebound_vmm::resolve::BootError;

/// Why a VM operation failed.
#[derive(Debug, thiserror::Error)]
pub enum OpError {
    #[error("unknown VM {0:?}")]
    UnknownVm(String),
    #[error("VM name {0:?} is already in use (state {1})")]
    NameInUse(String, VmState),
    #[error("invalid VM spec")]
    Spec(#[from] SpecError),
    #[error("cannot prepare the VM")]
    Boot(#[from] BootError),
    #[error("invalid QEMU configuration")]
    Qemu(#[from] QemuCmdError),
    #[error("QEMU failed to start")]
    QemuFailed(#[source] crate::daemon::vm::qemu_error::QemuError),
    #[error("VM {0:?} is {1}: {2}")]
    WrongState(String, VmState, &'static str),
    #[error("timed out after {0} ms waiting for {1}")]
    Timeout(u64, String),
    #[error("VM {0:?} can no longer become {1}: it is {2}")]
    Unreachable(String, String, VmState),
    #[error("guest agent")]
    Agent(#[from] AgentError),
    #[error("QMP")]
    Qmp(#[from] QmpError),
    #[error("no QMP connection to QEMU")]
    NoQmp,
    #[error("a worker thread of the daemon failed")]
    Task(#[from] tokio::task::JoinError),
    #[error("bad request: {0}")]
    BadRequest(String),
    #[error("bad request")]
    BadInput(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("VMCOREINFO unavailable")]
    Vmcoreinfo(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("the owner of VM {0:?} is gone (the daemon is shutting down?)")]
    OwnerGone(String),
    #[error("{0}")]
    Io(String, #[source] std::io::Error),
    #[error("internal error: {0}")]
    Internal(String),
    /// The page server ended before the destination held the devices: its own
    /// account (a damaged page of the snapshot, a refused stream).
    #[error("{0}")]
    PageServer(String),
    #[error("internal error")]
    Broken(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("bad request: {0}")]
    Backend(
        String,
        #[source] crate::daemon::backend_control::ControlError,
    ),
    /// A host-cache move undone: the backend's refusal (whole, in the parentheses),
    /// then what was put back.
    #[error("internal error: a disk backend refused its cache ({}): {then}", rebound_errors::Chain(.refusal))]
    CacheRefused {
        #[source]
        refusal: crate::daemon::backend_control::ControlError,
        then: String,
    },
    #[error("internal error: replaying frames on net{nic}")]
    Replay {
        nic: u32,
        #[source]
        source: crate::daemon::vm::replay::ReplayError,
    },
    #[error("the dump failed")]
    DumpFailed(#[source] crate::daemon::vm::dump::error::DumpError),
    #[error("crash report")]
    Report(#[from] super::crashes::ReportError),
    #[error("this daemon's cohort never heard of cluster restore {0:?}")]
    UnknownClusterRestore(String),
    #[error("the snapshot cannot be restored")]
    Restore(#[from] crate::daemon::vm::restore::error::InputError),
    #[error("the snapshot failed")]
    Save(#[from] crate::daemon::vm::snapshot::error::SaveError),
    #[error("memory group")]
    Cgroup(#[from] rebound_vmm::cgroup::CgroupError),
    #[error("the VM's host ports could not be moved")]
    Ports(#[from] rebound_vmm::usernet::UsernetError),
}

impl From<rebound_vmm::migration::MigrationError> for OpError {
    /// QMP's own failures stay QMP errors; a migration that failed fails the snapshot.
    fn from(e: rebound_vmm::migration::MigrationError) -> OpError {
        match e {
            rebound_vmm::migration::MigrationError::Qmp(q) => OpError::Qmp(q),
            e => OpError::Save(crate::daemon::vm::snapshot::error::SaveError::Migration(e)),
        }
    }
}

impl OpError {
    pub fn status(&self) -> StatusCode {
        match self {
            OpError::UnknownVm(_) | OpError::UnknownClusterRestore(_) => StatusCode::NOT_FOUND,
            OpError::Report(super::crashes::ReportError::Unknown(_)) => StatusCode::NOT_FOUND,
            OpError::Report(_) => StatusCode::INTERNAL_SERVER_ERROR,
            OpError::NameInUse(..) | OpError::WrongState(..) | OpError::Unreachable(..) => {
                StatusCode::CONFLICT
            }
            OpError::Agent(_) | OpError::Vmcoreinfo(_) => StatusCode::CONFLICT,
            OpError::Spec(_)
            | OpError::BadRequest(_)
            | OpError::BadInput(_)
            | OpError::Qemu(_)
            | OpError::Backend(..)
            | OpError::Restore(_) => StatusCode::BAD_REQUEST,
            OpError::Boot(b) if b.is_user_error() => StatusCode::BAD_REQUEST,
            OpError::Timeout(..) => StatusCode::REQUEST_TIMEOUT,
            OpError::Boot(_)
            | OpError::QemuFailed(_)
            | OpError::Qmp(_)
            | OpError::NoQmp
            | OpError::Task(_)
            | OpError::OwnerGone(_)
            | OpError::Io(..)
            | OpError::Internal(_)
            | OpError::PageServer(_)
            | OpError::Broken(_)
            | OpError::Replay { .. }
            | OpError::CacheRefused { .. }
            | OpError::DumpFailed(_)
            | OpError::Save(_)
            | OpError::Cgroup(_)
            | OpError::Ports(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rebound_errors::chain;

    #[test]
    fn chains_print_every_source_once() {
        let e = OpError::Io(
            "cannot remove /x".into(),
            std::io::Error::from_raw_os_error(13),
        );
        assert_eq!(
            chain(&e),
            "cannot remove /x: Permission denied (os error 13)"
        );
        let e = OpError::Spec(SpecError::Cpus(99));
        assert_eq!(
            chain(&e),
            "invalid VM spec: cpus must be between 1 and 64, got 99"
        );
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
    }

    #[test]
    fn restore_and_save_errors_read_as_they_did_when_they_were_strings() {
        use rebound_snapshot::restore_plan::PlanError;
        use rebound_vmm::migration::MigrationError;
        let e = OpError::from(crate::daemon::vm::restore::error::InputError::Plan(
            PlanError::NoStockStream,
        ));
        assert_eq!(
            chain(&e),
            "the snapshot cannot be restored: the snapshot has no stock migration stream (stock.mig): take it with `rebound vm snapshot --stock`"
        );
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        let e = OpError::from(crate::daemon::vm::restore::error::InputError::Trust(
            "/s/ram-ram.img".into(),
            std::io::Error::from_raw_os_error(13),
        ));
        assert_eq!(
            chain(&e),
            "the snapshot cannot be restored: cannot look at /s/ram-ram.img: Permission denied (os error 13)"
        );
        let e = OpError::from(MigrationError::Failed {
            what: "loading the device state".into(),
            why: "no space".into(),
        });
        assert_eq!(
            chain(&e),
            "the snapshot failed: loading the device state failed: no space"
        );
        assert_eq!(e.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let e = OpError::from(MigrationError::Qmp(QmpError::Closed));
        assert_eq!(chain(&e), "QMP: QMP connection lost");
    }

    #[test]
    fn kept_sources_read_as_the_strings_they_replace() {
        use crate::daemon::backend_control::ControlError;
        use crate::daemon::vm::qemu_error::QemuError;
        use crate::daemon::vm::restore::error::InputError;
        let e = OpError::QemuFailed(QemuError::Exited("qemu: -m 0: bad size".into()));
        assert_eq!(
            chain(&e),
            "QEMU failed to start: QEMU exited: qemu: -m 0: bad size"
        );
        assert_eq!(e.status(), StatusCode::INTERNAL_SERVER_ERROR);

        let recover = |inner: InputError| {
            OpError::from(InputError::RecoverFrom {
                dir: "/s/post-boot".into(),
                source: Box::new(inner),
            })
        };
        let e = recover(InputError::Mismatch {
            what: "memory",
            theirs: "256 MiB".into(),
            ours: "192 MiB".into(),
        });
        assert_eq!(
            chain(&e),
            "the snapshot cannot be restored: --recover-from /s/post-boot: its VM has memory 256 MiB, this VM 192 MiB: a recovery VM must be the same guest"
        );
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        let missing = std::path::Path::new("/nonexistent/rebound-snapshot");
        let m = rebound_snapshot::Snapshot::open(missing).unwrap_err();
        let want = format!(
            "the snapshot cannot be restored: --recover-from /s/post-boot: {}",
            chain(&m)
        );
        assert!(want.contains("no manifest.json"), "{want}");
        assert_eq!(chain(&recover(m.into())), want);

        let io = || ControlError::Io("/r/c.sock".into(), std::io::Error::from_raw_os_error(111));
        let e = OpError::Backend("VM \"a\": its disk's backend".into(), io());
        assert_eq!(
            chain(&e),
            "bad request: VM \"a\": its disk's backend: /r/c.sock: Connection refused (os error 111)"
        );
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        let e = OpError::CacheRefused {
            refusal: io(),
            then: "nothing was moved".into(),
        };
        assert_eq!(
            chain(&e),
            "internal error: a disk backend refused its cache (/r/c.sock: Connection refused (os error 111)): nothing was moved"
        );
        assert_eq!(e.status(), StatusCode::INTERNAL_SERVER_ERROR);

        use crate::daemon::vm::replay::ReplayError;
        let e = OpError::Replay {
            nic: 2,
            source: ReplayError::Qmp("chardev-add", QmpError::Closed),
        };
        assert_eq!(
            chain(&e),
            "internal error: replaying frames on net2: chardev-add: QMP connection lost"
        );

        let e = OpError::Broken(Box::new(std::io::Error::from_raw_os_error(28)));
        assert_eq!(
            chain(&e),
            "internal error: No space left on device (os error 28)"
        );
        let e = OpError::BadInput(Box::new(std::io::Error::from_raw_os_error(17)));
        assert_eq!(chain(&e), "bad request: File exists (os error 17)");
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
    }
}
