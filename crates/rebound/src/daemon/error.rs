//! Failures of VM operations, each with the HTTP status the API answers with.

use axum::http::StatusCode;

use super::boot::BootError;
use crate::spec::SpecError;
use crate::vm::agent::AgentError;
use crate::vm::qmp::QmpError;
use crate::vm::record::VmState;

/// Why a VM operation failed.
#[derive(Debug, thiserror::Error)]
pub enum OpError {
    #[error("unknown VM {0:?}")]
    UnknownVm(String),
    #[error("VM name {0:?} is already in use (state {1})")]
    NameInUse(String, VmState),
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error(transparent)]
    Boot(#[from] BootError),
    #[error("QEMU failed to start: {0}")]
    QemuFailed(String),
    #[error("VM {0:?} is {1}: {2}")]
    WrongState(String, VmState, &'static str),
    #[error("timed out after {0} ms waiting for {1}")]
    Timeout(u64, String),
    #[error("VM {0:?} can no longer become {1}: it is {2}")]
    Unreachable(String, String, VmState),
    #[error(transparent)]
    Agent(#[from] AgentError),
    #[error(transparent)]
    Qmp(#[from] QmpError),
    #[error("bad request: {0}")]
    BadRequest(String),
    #[error("VMCOREINFO unavailable: {0}")]
    Vmcoreinfo(String),
    #[error("{0}")]
    Io(String),
}

impl OpError {
    pub fn status(&self) -> StatusCode {
        match self {
            OpError::UnknownVm(_) => StatusCode::NOT_FOUND,
            OpError::NameInUse(..) | OpError::WrongState(..) | OpError::Unreachable(..) => {
                StatusCode::CONFLICT
            }
            OpError::Agent(_) | OpError::Vmcoreinfo(_) => StatusCode::CONFLICT,
            OpError::Spec(_) | OpError::BadRequest(_) => StatusCode::BAD_REQUEST,
            OpError::Boot(b) if b.is_user_error() => StatusCode::BAD_REQUEST,
            OpError::Timeout(..) => StatusCode::REQUEST_TIMEOUT,
            OpError::Boot(_) | OpError::QemuFailed(_) | OpError::Qmp(_) | OpError::Io(_) => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        }
    }
}
