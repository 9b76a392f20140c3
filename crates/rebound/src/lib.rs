//! Rebound's daemon and CLI, on top of the VM runtime (`rebound-vmm`) and the API
//! types (`rebound-api`).
//!
//! - [`daemon`]: owns QEMU processes (one owner task per VM) and serves the HTTP API.
//! - [`client`]: the HTTP client the CLI uses to talk to the daemon.
//! - [`cli`]: the `rebound` command line.

pub mod cli;
pub mod client;
pub mod daemon;

/// Version reported by `/v1/health`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
