//! The daemon (`rebound daemon`): one owner task per VM holds its QEMU process, QMP
//! session and agent link and runs its jobs; the daemon keeps the table of VMs,
//! re-attaches to running VMs after a restart, and serves the HTTP API of
//! `api/openapi.yaml` and `/metrics` on a unix socket.
//!
//! - [`server`]: single-instance guard, private state, socket, serving, shutdown.
//! - [`state`]: the table of VMs: start, re-attach, remove, wait.
//! - [`vm`]: one VM: its handle, its owner task and its state machine.
//! - [`guest`]: reading the guest from the host (VMCOREINFO).
//! - [`crashes`]: crash reports read back from disk.
//! - [`metrics`]: counters and gauges for operators.
//! - [`backend_control`]: asking a disk backend over its control socket.
//! - [`replace`]: a start over a stopped VM's name; QEMUs no record owns.
//! - [`error`]: what a VM operation can fail with, and its HTTP status.
//! - [`fault`]: `REBOUND_FAULT`, the daemon killing itself at a named step (tests).
//! - [`cluster`]: cluster restores across hosts through the cluster store
//!   (`rebound-coord` over `rebound-store`): this host's part, the coordinator when
//!   elected, the VMs and snapshots it publishes.
//! - [`api`]: HTTP routes.

pub mod api;
pub mod backend_control;
pub mod cluster;
pub mod crashes;
pub mod error;
pub mod fault;
pub mod guest;
pub mod memory_plan;
pub mod metrics;
pub mod mrc;
pub mod replace;
pub mod server;
pub mod state;
pub mod vm;

pub use cluster::ClusterOptions;
pub use server::{run, ServeOptions, ServerError};
pub use state::LogCaps;
