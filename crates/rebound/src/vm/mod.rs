//! One VM's life on the host: choosing the accelerator, building QEMU's command line,
//! preparing disks, spawning and watching the process, and talking to QEMU (QMP) and
//! to the guest agent.

pub mod accel;
pub mod agent;
pub mod argv;
pub mod disks;
pub mod events;
pub mod process;
pub mod qmp;
pub mod readiness;
pub mod record;
