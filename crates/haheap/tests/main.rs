//! Every integration test of this crate in one binary (one link instead of one per
//! file); each file below is a module, run one with `cargo test -p <crate> --test
//! integration <file>::`.

mod common;

mod backup_restart;
mod c_failover;
mod deps;
mod engines;
mod examples;
mod ffi;
mod header;
mod replication;
