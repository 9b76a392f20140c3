//! Every integration test of this crate in one binary; each file below is a module,
//! run one with `cargo test -p rebound-coord --test integration <file>::`.
//!
//! All of them run real TCP on 127.0.0.1 against [`common::StandInVms`], a stand-in
//! for the daemon's VMs that sleeps and records calls; tests with real VMs come with
//! the daemon's integration.

mod common;

mod auth;
mod faults;
mod over_store;
mod relay;
mod restore;
