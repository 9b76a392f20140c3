//! Every integration test of this crate in one binary (one link instead of one per
//! file); each file below is a module, run one with `cargo test -p <crate> --test
//! integration <file>::`.

mod common;

mod access;
mod backup_faults;
mod checkpoint_kills;
mod malformed;
mod spin;
mod streamed;
mod takeover;
