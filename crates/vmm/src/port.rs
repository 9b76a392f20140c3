//! The runtime port: the operations a capability's actions go through to reach a
//! VM's runtime. The daemon's per-VM owner implements [`Runtime`] over QEMU and QMP;
//! another runtime (libvirt, say) can implement it later. No method has a default:
//! a runtime that cannot do something says so in its own error.

use std::future::Future;

use serde_json::Value;

use crate::api::spec::VmSpec;
use crate::cgroup::Group;
use crate::qmp::{Qmp, QmpError};
use crate::resolve::Resolved;

/// A QEMU monitor: a QMP command sent, its answer back.
pub trait Monitor: Sync {
    /// Runs `command` with `args`; its `return` value.
    fn qmp(
        &self,
        command: &str,
        args: Option<Value>,
    ) -> impl Future<Output = Result<Value, QmpError>> + Send;
}

impl Monitor for Qmp {
    fn qmp(
        &self,
        command: &str,
        args: Option<Value>,
    ) -> impl Future<Output = Result<Value, QmpError>> + Send {
        self.execute(command, args)
    }
}

/// How a VM's QEMU is spawned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spawn {
    /// A crashed VM's recovery VM: its state moves by the crash's transitions and
    /// it runs in the crash's memory group.
    pub recovering: bool,
    /// Apply QEMU's run state at once (a restore moves its state itself).
    pub query_state: bool,
}

/// What a capability's actions need of one VM's runtime.
pub trait Runtime {
    type Error: std::error::Error + Send + Sync + 'static;

    /// Spawns the VM's QEMU from a resolved spec (its vCPUs stopped until its pid is
    /// recorded), records it and connects to it; the new QEMU's pid.
    fn spawn(
        &mut self,
        spec: &VmSpec,
        resolved: Resolved,
        how: Spawn,
    ) -> impl Future<Output = Result<u32, Self::Error>> + Send;

    /// Sends a QMP command to the VM's QEMU; its answer.
    fn command(
        &self,
        command: &str,
        args: Option<Value>,
    ) -> impl Future<Output = Result<Value, Self::Error>> + Send;

    /// Limits the VM's disk `disk` (its device id) to `bytes_per_s` (0: no limit).
    fn throttle_disk(
        &self,
        disk: &str,
        bytes_per_s: u64,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Moves process `pid` into memory group `group`.
    fn put_in_group(&self, pid: u32, group: &Group) -> Result<(), Self::Error>;

    /// Sets the VM's hot-pluggable memory (virtio-mem `vmem0`) to `bytes`.
    fn plug_memory(&self, bytes: u64) -> impl Future<Output = Result<(), Self::Error>> + Send;
}
