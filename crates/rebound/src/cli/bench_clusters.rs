//! `rebound bench cluster` drives clusters through the `rebound cluster` commands:
//! this is the port it does that through (see `rebound_bench::Clusters`).

use std::path::Path;

use hyper::Method;
use rebound_api::LoadPath;
use rebound_bench::PortError;
use rebound_cluster::spec::ClusterSpec;
use rebound_cluster::{Disruption, Rdg};
use rebound_vmm::paths::Paths;
use serde_json::Value;

use super::cluster::restore::{self, Outcome, RestoreOpts, Variant};
use super::cluster::{self as commands, snapshot, Cluster};

/// A cluster restore's variant on one of the two paths a VM's pages take: the page
/// cache's (`line`...) or the page server's (`ps-line`...).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum BenchVariant {
    WorkingSet,
    Elastic,
    Line,
    LineKeep,
    PsWorkingSet,
    PsElastic,
    PsLine,
    PsLineKeep,
}

impl BenchVariant {
    fn parts(self) -> (Variant, LoadPath) {
        use BenchVariant as B;
        match self {
            B::WorkingSet => (Variant::WorkingSet, LoadPath::PageCache),
            B::Elastic => (Variant::Elastic, LoadPath::PageCache),
            B::Line => (Variant::Line, LoadPath::PageCache),
            B::LineKeep => (Variant::LineKeep, LoadPath::PageCache),
            B::PsWorkingSet => (Variant::WorkingSet, LoadPath::PageServer),
            B::PsElastic => (Variant::Elastic, LoadPath::PageServer),
            B::PsLine => (Variant::Line, LoadPath::PageServer),
            B::PsLineKeep => (Variant::LineKeep, LoadPath::PageServer),
        }
    }

    fn as_str(self) -> &'static str {
        use BenchVariant as B;
        match self {
            B::PsWorkingSet => "ps-working-set",
            B::PsElastic => "ps-elastic",
            B::PsLine => "ps-line",
            B::PsLineKeep => "ps-line-keep",
            other => other.parts().0.as_str(),
        }
    }
}

/// The cluster commands of this binary, in one installation.
pub(crate) struct CliClusters(pub(crate) Paths);

#[async_trait::async_trait]
impl rebound_bench::Clusters for CliClusters {
    type Cluster = Cluster;
    type Variant = BenchVariant;
    type Outcome = Outcome;

    fn spec(c: &Cluster) -> &ClusterSpec {
        &c.spec
    }

    fn dir(c: &Cluster) -> &Path {
        &c.dir
    }

    fn variant_name(v: BenchVariant) -> &'static str {
        v.as_str()
    }

    fn began_unix_ns(o: &Outcome) -> i64 {
        o.report.began_unix_ns
    }

    fn disruption(o: &Outcome) -> Option<&Disruption> {
        o.disruption.as_ref()
    }

    fn plan(o: &Outcome) -> &rebound_coord::Plan {
        &o.plan
    }

    async fn create(&self, name: &str, file: &str) -> Result<Cluster, PortError> {
        Ok(commands::create_cluster(&self.0, name, file).await?)
    }

    async fn start_vms(&self, c: &Cluster) -> Result<(), PortError> {
        Ok(commands::start_vms(c).await?)
    }

    async fn call(
        &self,
        c: &Cluster,
        host: &str,
        method: Method,
        path: &str,
    ) -> Result<Value, PortError> {
        Ok(c.link(host)?.call(method, path, None).await?)
    }

    async fn remove_vm(&self, c: &Cluster, host: &str, vm: &str) -> Result<bool, PortError> {
        Ok(restore::remove_vm(&c.link(host)?, vm).await?)
    }

    async fn snapshot(&self, c: &Cluster, out: &Path, trace_s: f64) -> Result<f64, PortError> {
        Ok(snapshot::take(c, out, trace_s).await?.pause_spread_s)
    }

    fn traffic(&self, snap: &Path) -> Result<Rdg, PortError> {
        Ok(snapshot::traffic(snap, 1)?.1.rdg)
    }

    async fn restore(
        &self,
        c: &Cluster,
        snap: &Path,
        variant: BenchVariant,
        margin_s: f64,
    ) -> Result<Outcome, PortError> {
        let (variant, path) = variant.parts();
        let opts = RestoreOpts {
            variant,
            load_rate: None,
            margin_s,
            replace: true,
            no_wait: false,
            path,
        };
        Ok(restore::restore(c, snap, &opts).await?)
    }

    async fn watch_latency(&self, c: &Cluster, samples: usize) -> Result<Vec<f64>, PortError> {
        let store = c.admin_store().await?;
        // Outside the layout: no daemon watches it.
        let l = rebound_store::probe::watch_latency(&store, "/rebound-probe/", samples).await?;
        Ok(l.iter().map(|d| d.as_secs_f64()).collect())
    }

    async fn rm(&self, c: &Cluster) -> Result<(), PortError> {
        Ok(commands::rm_cluster(c).await?)
    }
}
