//! The cluster restore protocol (HotRestore, section 4.3): a coordinator and one
//! cohort per host exchange LOAD, LOAD_FIN, START, START_FIN and RESTORE_FIN.
//!
//! - [`token`]: the shared cluster token, read from a private file.
//! - [`wire`]: the authenticated TCP connection (handshake, MACed numbered frames);
//!   its module doc is the wire format.
//! - [`msg`]: the messages inside the frames.
//! - [`cohort`]: the server each host's daemon runs; it drives the host's VMs through
//!   the [`cohort::CohortVms`] trait and aborts held VMs after `hold_timeout`.
//! - [`relay`]: one call of a cohort host's own API over the same authenticated
//!   connection ([`relay::call`]), served through [`relay::CohortApi`].
//! - [`coordinator`]: runs one restore of a [`restore_plan::Plan`] across the cohorts (the
//!   paper's Checker) and returns a [`report::RestoreReport`].
//!
//! A daemon embeds a cohort with [`cohort::spawn_cohort`] on a listener it bound when
//! told to, and runs a restore with [`coordinator::restore`].

pub mod cohort;
pub mod coordinator;
pub mod msg;
pub mod relay;
pub mod report;
pub mod restore_plan;
pub mod store;
pub mod token;
pub mod wire;

mod tasks;

pub use cohort::{
    spawn_cohort, spawn_cohort_with_api, CohortConfig, CohortHandle, CohortVms, LoadInfo,
    StartInfo, VmError,
};
pub use coordinator::{restore, CoordinatorConfig};
pub use relay::{ApiAnswer, CohortApi, RelayConfig, RelayError};
pub use report::RestoreReport;
pub use restore_plan::{Plan, PlanVm};
pub use token::ClusterToken;
