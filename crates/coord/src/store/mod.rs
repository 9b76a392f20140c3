//! The cluster restore protocol over a shared store ([`rebound_store::Store`]):
//! HotRestore's messages become transitions of records, written with
//! compare-and-set transactions, seen by watches.
//!
//! - [`layout`]: the keys.
//! - [`records`]: the records and their checks.
//! - [`checker`]: the coordinator's decisions, a pure function of the records.
//! - [`host_side`]: one host's decisions for its own VMs, also pure.
//! - [`run`]: the loops that read, decide and write, on any store.

pub mod checker;
pub mod host_side;
pub mod layout;
pub mod records;
pub mod report;
pub mod run;
pub mod standin;
pub mod submit;
pub mod view;
