//! `rebound bench`: Rebound measured against stock QEMU, each benchmark a driver that
//! runs guests through a live daemon (started if none answers) and prints text, JSON
//! or an SVG. The `rebound` binary embeds [`BenchCmd`] as its `bench` subcommand and
//! calls [`run`]; nothing in the product depends on this crate's code otherwise.
//!
//! This module is the dispatcher, the only one that knows the drivers. Drivers share
//! leaf modules only: [`out`] (their common options), `host` (machine facts, the page
//! cache), `guest` (starting and removing guests), `webload` and `slowdisk`.

use clap::Subcommand;
use rebound_vmm::paths::Paths;

mod boot;
mod cluster;
mod clusters;
mod crash;
mod disk;
mod guest;
mod ha;
mod hcache;
mod host;
pub mod out;
mod reboot;
mod restore;
mod rounds;
mod scale;
mod slowdisk;
mod throttledfs;
mod webload;

pub use clusters::{Clusters, PortError};

/// Why a benchmark failed: each driver's own error, whose text says what failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Boot(#[from] boot::Error),
    #[error(transparent)]
    Crash(#[from] crash::Error),
    #[error(transparent)]
    Restore(#[from] restore::Error),
    #[error(transparent)]
    Disk(#[from] disk::Error),
    #[error(transparent)]
    Hcache(#[from] hcache::Error),
    #[error(transparent)]
    Reboot(#[from] reboot::Error),
    #[error(transparent)]
    Cluster(#[from] cluster::Error),
    #[error(transparent)]
    Ha(#[from] ha::Error),
    #[error(transparent)]
    Scale(#[from] scale::Error),
}

#[derive(Subcommand, Debug)]
pub enum BenchCmd {
    /// Boot the default image N times (one after another unless --parallel):
    /// spawn→agent-ready and idle memory.
    Boot {
        /// Boots to measure.
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Guest memory, e.g. 256M, 1G (a bare number is MiB).
        #[arg(long, default_value = "256M", value_parser = rebound_api::spec::parse_memory_mib)]
        memory: u64,
        /// Seconds to let the guests settle before measuring memory.
        #[arg(long, default_value_t = 5)]
        settle: u64,
        /// Boot all guests at once (measures contention on small hosts).
        #[arg(long)]
        parallel: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// A guest crash handled the stock way (QEMU's dump, reboot) and by each crash
    /// policy, side by side: downtime, the client's longest gap, dump time and size.
    Crash(crash::CrashArgs),
    /// One snapshot per workload restored every way (QEMU's stock stream, eager,
    /// lazy, working-set, elastic), cold, on the real disk and an emulated slow one:
    /// time to running and to responsive, faults and bytes read after the start.
    Restore(restore::RestoreArgs),
    /// Guest disk I/O through Rebound's block backend against QEMU's virtio-blk on
    /// the same file (cache=none and writeback), and host-cache hits against misses.
    Disk(disk::DiskArgs),
    /// The exclusive host cache against all memory in the guest for each access
    /// pattern (disk reads per request, throughput, CPU, refused notices), and the
    /// miss-ratio curve against guests of other sizes (Hcache 6.3, 6.4).
    Hcache(hcache::HcacheArgs),
    /// A web service across a reboot: normal, normal with the host page cache warm,
    /// and warm (`vm reboot --warm`): reads of the file set before and after, and
    /// throughput per second across a reboot under load (CacheMind figures 3-5).
    Reboot(reboot::RebootArgs),
    /// A cluster of `peer` guests on simulated hosts, under each topology, snapshotted
    /// and restored three ways side by side (working set, elastic without and with
    /// the restore line): restore latency, backoff, disruption, retransmissions,
    /// heartbeat false alarms and a host client's worst request (HotRestore 6.2).
    Cluster(cluster::ClusterArgs),
    /// The cluster restore protocol over a real etcd (started by the bench) at 100
    /// to 1,000 stand-in VMs on simulated hosts: time to every VM started, start
    /// precision against the line, etcd requests per VM, coordinator failover.
    ClusterScale(scale::ScaleArgs),
    /// The HA heap benchmarks: runs `rebound-ha-bench` (installed next to `rebound`)
    /// with the remaining arguments, e.g. `rebound bench ha micro`.
    Ha {
        /// Arguments for `rebound-ha-bench` (see `rebound bench ha --help`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

/// Runs one benchmark; `clusters` makes and restores the clusters of `bench cluster`
/// (the `rebound cluster` commands, which live in the product).
pub async fn run<C: Clusters>(paths: &Paths, cmd: BenchCmd, clusters: &C) -> Result<(), Error> {
    match cmd {
        BenchCmd::Ha { args } => Ok(ha::run(&args)?),
        BenchCmd::Crash(args) => Ok(crash::run(paths, args).await?),
        BenchCmd::Restore(args) => Ok(restore::run(paths, args).await?),
        BenchCmd::Disk(args) => Ok(disk::run(paths, args).await?),
        BenchCmd::Hcache(args) => Ok(hcache::run(paths, args).await?),
        BenchCmd::Reboot(args) => Ok(reboot::run(paths, args).await?),
        BenchCmd::Cluster(args) => Ok(cluster::run(paths, args, clusters).await?),
        BenchCmd::ClusterScale(args) => Ok(scale::run(args).await?),
        BenchCmd::Boot {
            runs,
            memory,
            settle,
            parallel,
            json,
        } => Ok(boot::run(paths, runs, memory, settle, parallel, json).await?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_bench_prints_what_failed_and_why_once() {
        let daemon = rebound_client::ClientError::Api {
            status: 404,
            message: "no image named default".into(),
        };
        let e = Error::from(disk::Error::Pass {
            variant: "rebound".into(),
            round: 1,
            pass: "seqread".into(),
            source: Box::new(disk::Error::Guest {
                name: "bd7-rebound-0-1".into(),
                source: guest::Error::Post {
                    path: "/v1/vms".into(),
                    source: daemon,
                },
            }),
        });
        assert_eq!(
            rebound_errors::chain(&e),
            "variant rebound, round 1, pass \"seqread\": bd7-rebound-0-1: the guest did not run its pass: the daemon refused POST /v1/vms: no image named default"
        );
    }
}
