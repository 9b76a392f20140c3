//! Rebound's VM runtime, daemon and CLI.
//!
//! Layers, bottom up:
//! - [`paths`]: where state lives (`$REBOUND_HOME`, the tmpfs run dir).
//! - [`spec`]: what the user asked for ([`spec::VmSpec`]), sizes and names.
//! - [`vm`]: turning a spec into a running QEMU: accelerator choice, argv, disks,
//!   process handling, QMP client, guest agent link, readiness, event log, records.
//! - [`images`]: the bridge to the image builder.
//! - [`daemon`]: the supervisor that owns QEMU processes and serves the HTTP API.
//! - [`client`]: the HTTP client the CLI uses to talk to the daemon.
//! - [`cli`]: the `rebound` command line.

pub mod cli;
pub mod client;
pub mod daemon;
pub mod images;
pub mod paths;
pub mod spec;
pub mod vm;

/// Version reported by `/v1/health`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
