//! Rebound's VM runtime: everything between a VM spec and a running, supervised QEMU.
//! The daemon, the benchmarks and every test that boots a guest go through it; no
//! QEMU command line is written anywhere else.
//!
//! Layers, bottom up:
//! - [`private`]: who may read what (0700/0600, umask 077), in one place;
//! - [`paths`]: where state lives (`$REBOUND_HOME`, the tmpfs run dir);
//! - [`qemu`]: one QEMU command line from typed parts (memory backend, incoming
//!   migration, networks and filters, block backends, devices);
//! - [`accel`], [`disks`], [`images`], [`resolve`]: a spec resolved on this host into a
//!   [`qemu::QemuCommand`] (accelerator, the VM's own disk copy, image files, ports);
//! - [`process`]: spawning QEMU in its own session and watching the process;
//! - [`cgroup`]: memory groups (v1 and v2) that hold a VM's QEMUs to a budget;
//! - [`qmp`], [`agent`], [`console`], [`readiness`]: talking to QEMU and to the guest;
//! - [`port`]: the runtime port a capability's actions go through (spawn, QMP,
//!   throttle, memory group, memory plug); [`migration`]: saves and loads through
//!   QEMU's migration; [`usernet`]: host ports handed between QEMUs;
//!   [`procfs`]: a QEMU process's counters;
//! - [`record`], [`events`], [`logcap`]: the VM's persistent record, its event log and
//!   the caps on every log a guest can fill;
//! - [`ratelimit`]: warnings about input a guest controls, rate-limited.

pub mod accel;
pub mod agent;
pub mod cgroup;
pub mod console;
pub mod disks;
pub mod events;
pub mod images;
pub mod logcap;
pub mod migration;
pub mod net;
pub mod paths;
pub mod port;
pub mod private;
pub mod process;
pub mod procfs;
pub mod qemu;
pub mod qmp;
pub mod ratelimit;
pub mod readiness;
pub mod record;
pub mod resolve;
pub mod usernet;
pub mod warm;

pub use rebound_api as api;
