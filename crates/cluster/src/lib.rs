//! Cluster restore planning (HotRestore, section 4): who talks to whom, the restore
//! dependency graph, and the restore line.
//!
//! - [`pcap`]: QEMU `filter-dump` files → frames (timestamp, MACs, IPv4, TCP flags).
//! - [`traffic`]: frames of every VM's dump → [`TrafficMatrix`] of dependency packets.
//! - [`rdg`]: matrix → [`Rdg`] (edges, rings, orphans), DOT and SVG.
//! - [`line`]: load figures + dependencies → [`RestoreLine`] by linear programming.
//! - [`line_plan`]: all of it in one call ([`plan()`]), serde-serializable for the daemon.
//! - [`disruption`]: start times + edges → each VM's backoff and disruption.
//! - [`inflight`]: the frames in flight at a consistent cut, from the dumps, and
//!   one VM's of them written to a pcap file to replay.
//! - [`replay`]: a replay file read back within QEMU's limits, framed for its
//!   `filter-redirector`.
//! - [`spec`]: `cluster.toml`, the VMs, their hosts and the network, checked.
//! - [`snapshot`]: a cluster snapshot directory: its manifest `cluster.json` (format,
//!   parser, writer), and the traffic and frames in flight read from its dumps.
//! - [`restore`]: a cluster snapshot's restore planned: its VMs checked against the
//!   cluster, their figures, each host's load rate, and per variant what each VM loads
//!   and when it starts.
//!
//! - [`certs`]: a CA and per-host certificates for a cluster store (test and small
//!   setups), named as the store's identities.
//!
//! Everything here is pure computation on files and numbers: no VM is touched.

pub mod certs;
pub mod disruption;
pub mod inflight;
pub mod line;
pub mod line_plan;
pub mod pcap;
pub mod rdg;
pub mod replay;
pub mod restore;
pub mod snapshot;
pub mod spec;
pub mod traffic;

pub use disruption::{disruption, Disruption, DisruptionError, VmDisruption};
pub use line::{Dependency, LineError, LineInput, RestoreLine, VmLoad, VmStart};
pub use line_plan::{plan, traffic_from_dumps, DumpFile, Plan, PlanConfig, PlanError};
pub use rdg::{Rdg, RdgEdge, RdgError};
pub use traffic::{Endpoints, TrafficBuilder, TrafficError, TrafficMatrix, TrafficStats};
