//! Every integration test of this crate in one binary (one link instead of one per
//! file); each file below is a module, run one with `cargo test -p <crate> --test
//! integration <file>::`.

mod common;
#[path = "common/crashed.rs"]
mod crashed;

mod backtrace;
mod crashed_guest;
mod inspect_malformed;
mod resume;
mod synthetic;
