//! Every integration test of this crate in one binary (one link instead of one per
//! file); each file below is a module, run one with `cargo test -p <crate> --test
//! integration <file>::`.

mod common;

mod api_tour;
mod bad_input;
mod bench_smoke;
mod blk_backend;
mod blk_socket;
mod byo_kernel;
mod cluster_net;
mod cluster_store;
mod cluster_store_access;
mod crash_recovery;
mod daemon_death;
mod evict;
mod files;
mod flood;
mod hcache_stress;
mod host_cache;
mod memory_plan;
mod privacy;
mod replay;
mod restore;
mod restore_faults;
mod warm_reboot;
mod web_crash_stop;
mod workloads_restart;
