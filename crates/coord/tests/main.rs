//! Every integration test of this crate in one binary; each file below is a module,
//! run one with `cargo test -p rebound-coord --test integration <file>::`.
//!
//! They run the protocol over the in-memory store with stand-in VMs; tests with
//! real VMs and a real etcd come with the daemon's integration.

mod over_store;
