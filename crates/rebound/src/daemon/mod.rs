//! The daemon (`rebound daemon`): owns QEMU processes and their QMP and agent
//! connections, keeps each VM's record and event log, re-attaches to running VMs
//! after a restart, and serves the HTTP API of `api/openapi.yaml` on a unix socket.
//!
//! - [`server`]: single-instance guard, socket, serving, shutdown.
//! - [`state`]: the daemon's VM table and the status each VM reports.
//! - [`boot`]: resolving a spec into a QEMU configuration (image or user kernel).
//! - [`lifecycle`]: start, re-attach, stop, kill.
//! - [`supervisor`]: per-VM task turning QMP events and agent messages into state.
//! - [`guest`]: operations inside the guest: crash, marker, VMCOREINFO.
//! - [`error`]: what a VM operation can fail with, and its HTTP status.
//! - [`api`]: HTTP routes.

pub mod api;
pub mod boot;
pub mod error;
pub mod guest;
pub mod lifecycle;
pub mod server;
pub mod state;
pub mod supervisor;

pub use server::{run, ServerError};
