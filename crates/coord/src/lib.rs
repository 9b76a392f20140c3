//! The cluster restore protocol (HotRestore, section 4.3) over a store the hosts
//! share ([`rebound_store::Store`]: etcd across hosts, memory on one host).
//! HotRestore's messages (LOAD, LOAD_FIN, START, START_FIN, RESTORE_FIN, abort)
//! become transitions of records, written with compare-and-set transactions and
//! seen by watches; the coordinator is elected and replaced when its host dies.
//!
//! - [`layout`]: the keys (`docs/cluster-store.md` describes them).
//! - [`records`]: the records and their checks.
//! - [`restore_plan`]: what to restore, and its start groups (rings).
//! - [`checker`]: the coordinator's decisions, a pure function of the records.
//! - [`host_side`]: one host's decisions for its own VMs, also pure.
//! - [`view`]: the records one daemon keeps current from its watch.
//! - [`run`]: [`run::Participant`], the loops that read, decide and write.
//! - [`submit`]: submitting a restore and following it to its report ([`report`]).
//! - [`vms`]: the host's VMs as the protocol drives them; [`standin`]: VMs that
//!   take each phase's time and boot nothing (tests, the scale benchmark).

pub mod checker;
pub mod host_side;
pub mod layout;
pub mod records;
pub mod report;
pub mod restore_plan;
pub mod run;
pub mod standin;
pub mod status;
pub mod submit;
pub mod view;
pub mod vms;

pub use report::RestoreReport;
pub use restore_plan::{Plan, PlanVm};
pub use vms::{CohortVms, LoadInfo, StartInfo, VmError};
