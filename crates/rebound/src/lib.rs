//! Rebound's daemon and CLI, on top of the VM runtime (`rebound-vmm`) and the API
//! types (`rebound-api`).
//!
//! - [`daemon`]: owns QEMU processes (one owner task per VM) and serves the HTTP API.
//! - [`client`]: the HTTP client the CLI uses to talk to the daemon (the
//!   `rebound-client` crate, which the benchmarks share).
//! - [`cli`]: the `rebound` command line.

pub mod cli;
pub use rebound_client as client;
pub mod daemon;

/// Version reported by `/v1/health`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
