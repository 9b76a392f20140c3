//! Every integration test of this crate in one binary (one link instead of one per
//! file); each file below is a module, run one with `cargo test -p <crate> --test
//! integration <file>::`.

mod common;

mod agent_marker;
mod boot_guest;
mod classify;
mod qemu_process;
mod ram_file;
