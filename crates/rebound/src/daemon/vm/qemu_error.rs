//! Why a QEMU (or a disk backend it is given) did not come up, or a running one could
//! not be taken over by a restarted daemon, with the cause kept.

use std::path::PathBuf;

/// Why a QEMU, or a disk backend it needs, did not come up, or why a running QEMU
/// could not be taken over.
#[derive(Debug, thiserror::Error)]
pub enum QemuError {
    #[error(transparent)]
    Spawn(#[from] rebound_vmm::process::ProcessError),
    /// QEMU runs but its QMP socket never answered (`why`: its last log line).
    #[error("QMP did not answer: {0}")]
    NoQmp(String),
    /// QEMU exited before its QMP socket answered (`why`: its last log line).
    #[error("QEMU exited: {0}")]
    Exited(String),
    #[error("the QEMU to settle onto did not come up")]
    SettleTarget(#[source] Box<QemuError>),
    #[error("QEMU did not start its vCPUs")]
    Cont(#[source] rebound_vmm::qmp::QmpError),
    #[error("the disk backend for {} exited ({status}): {last}", .disk.display())]
    BackendExited {
        disk: PathBuf,
        status: std::process::ExitStatus,
        last: String,
    },
    #[error("the disk backend for {} did not listen on {} within {secs} s", .disk.display(), .socket.display())]
    BackendSilent {
        disk: PathBuf,
        socket: PathBuf,
        secs: u64,
    },
    #[error("no QEMU pid recorded")]
    NoPid,
    #[error("QEMU (pid {0}) is gone")]
    Gone(u32),
    #[error("QMP did not answer")]
    Silent,
    #[error(transparent)]
    Qmp(#[from] rebound_vmm::qmp::QmpError),
    #[error(transparent)]
    Ready(#[from] rebound_api::SpecError),
}

#[cfg(test)]
mod tests {
    use super::*;
    use rebound_errors::chain;

    #[test]
    fn each_failure_reads_as_it_did_when_it_was_a_string() {
        let e = QemuError::SettleTarget(Box::new(QemuError::Exited("oom".into())));
        assert_eq!(
            chain(&e),
            "the QEMU to settle onto did not come up: QEMU exited: oom"
        );
        let e = QemuError::Cont(rebound_vmm::qmp::QmpError::Closed);
        assert_eq!(
            chain(&e),
            "QEMU did not start its vCPUs: QMP connection lost"
        );
        let e = QemuError::BackendSilent {
            disk: "/d.img".into(),
            socket: "/s.sock".into(),
            secs: 5,
        };
        assert_eq!(
            chain(&e),
            "the disk backend for /d.img did not listen on /s.sock within 5 s"
        );
    }
}
