//! What `rebound bench cluster` needs of the `rebound cluster` commands. Those make,
//! snapshot and restore clusters and belong to the product, so the `rebound` binary
//! implements this port and hands it to [`crate::run`]: the benchmark drives clusters
//! without this crate depending on the product's code.

use std::fmt::Debug;
use std::path::Path;

use hyper::Method;
use rebound_cluster::spec::ClusterSpec;
use rebound_cluster::{Disruption, Rdg};
use serde::Serialize;
use serde_json::Value;

/// An error of the product's cluster commands, with its sources: printed by the
/// benchmark's caller as a chain.
pub type PortError = Box<dyn std::error::Error + Send + Sync>;

/// The cluster commands as the benchmark drives them.
#[async_trait::async_trait]
pub trait Clusters: Sync {
    /// A cluster made by [`Clusters::create`].
    type Cluster: Send + Sync;
    /// How a restore is done, as `rebound cluster restore --variant` names it.
    type Variant: clap::ValueEnum + Serialize + Debug + Copy + PartialEq + Send + Sync;
    /// What one restore did, as `rebound cluster restore --json` reports it.
    type Outcome: Serialize + Debug + Send;

    /// The cluster's checked spec.
    fn spec(c: &Self::Cluster) -> &ClusterSpec;
    /// The cluster's state directory (its hosts' homes are under `hosts/`).
    fn dir(c: &Self::Cluster) -> &Path;
    /// The variant's name.
    fn variant_name(v: Self::Variant) -> &'static str;
    /// When the restore began, in ns since the epoch.
    fn began_unix_ns(o: &Self::Outcome) -> i64;
    /// Each VM's start, backoff and disruption; `None` unless every VM started.
    fn disruption(o: &Self::Outcome) -> Option<&Disruption>;
    /// The plan the restore followed.
    fn plan(o: &Self::Outcome) -> &rebound_coord::Plan;

    /// `rebound cluster create NAME` from a cluster file's text, in the installation
    /// the benchmark runs in.
    async fn create(&self, name: &str, file: &str) -> Result<Self::Cluster, PortError>;
    /// `rebound cluster start`: the hosts and every VM, waiting for readiness.
    async fn start_vms(&self, c: &Self::Cluster) -> Result<(), PortError>;
    /// One API request to the daemon of one of the cluster's hosts.
    async fn call(
        &self,
        c: &Self::Cluster,
        host: &str,
        method: Method,
        path: &str,
    ) -> Result<Value, PortError>;
    /// Kills and removes one VM on its host; whether it existed.
    async fn remove_vm(&self, c: &Self::Cluster, host: &str, vm: &str) -> Result<bool, PortError>;
    /// `rebound cluster snapshot` into the new directory `out`, recording `trace_s`
    /// seconds after the snapshot point; the seconds between the first and the last
    /// VM's stop.
    async fn snapshot(&self, c: &Self::Cluster, out: &Path, trace_s: f64)
        -> Result<f64, PortError>;
    /// The restore dependency graph of a cluster snapshot's recorded traffic.
    fn traffic(&self, snap: &Path) -> Result<Rdg, PortError>;
    /// `rebound cluster restore --replace` from `snap`: load rates measured, a VM up
    /// `margin_s` before the VMs that send to it.
    async fn restore(
        &self,
        c: &Self::Cluster,
        snap: &Path,
        variant: Self::Variant,
        margin_s: f64,
    ) -> Result<Self::Outcome, PortError>;
    /// Each of `samples` writes' time from the request to a watch of the cluster's
    /// store delivering it, in seconds (the store's watch latency).
    async fn watch_latency(&self, c: &Self::Cluster, samples: usize)
        -> Result<Vec<f64>, PortError>;
    /// `rebound cluster rm`: its VMs, hosts and state.
    async fn rm(&self, c: &Self::Cluster) -> Result<(), PortError>;
}
