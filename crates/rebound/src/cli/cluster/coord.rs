//! `rebound cluster restore`: a cluster snapshot restored into a cluster, or a plan
//! restored through a cluster store (`--etcd`, as the operator) or through this
//! host's daemon (its in-memory store: every VM on this host).

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use rebound_coord::report::RestoreReport;
use rebound_vmm::paths::Paths;

use super::report::{outcome, print_report};
use crate::client::Client;

#[derive(Args, Debug)]
pub struct RestoreArgs {
    /// The cluster to restore into (with --from): its VMs must be those of the
    /// snapshot, on the hosts its file names now.
    #[arg(required_unless_present = "plan", requires = "from")]
    pub name: Option<String>,
    /// A cluster snapshot directory (`rebound cluster snapshot --out`).
    #[arg(long, conflicts_with = "plan")]
    pub from: Option<PathBuf>,
    /// working-set: each VM loads its traced working set and starts when loaded;
    /// elastic: its elastic working set, starts when loaded; line: elastic working
    /// sets revised to the restore line, started on it in dependency order; line-keep:
    /// the same line, but no VM starts before its elastic working set is loaded.
    #[arg(long, value_enum, default_value = "line")]
    pub variant: super::restore::Variant,
    /// Pages per second every host loads at (default: as the last restore of this
    /// cluster measured, or probed on the snapshots the first time).
    #[arg(long)]
    pub load_rate: Option<f64>,
    /// Seconds a VM is up before any VM that sends to it starts (the line's margin).
    #[arg(long, default_value_t = 0.05)]
    pub margin_s: f64,
    /// Kill and remove the cluster's VMs that exist before restoring.
    #[arg(long)]
    pub replace: bool,
    /// No VM may start later than its whole RAM takes to load (HotRestore's model):
    /// margins longer than a small VM's load time then leave no restore line. By
    /// default such a VM loads everything and waits, paused, for its start.
    #[arg(long)]
    pub no_wait: bool,
    /// How each VM's pages reach its guest (as `vm restore --path`).
    #[arg(long, default_value = "auto")]
    pub path: rebound_api::LoadPath,
    /// Restore this plan instead: a JSON file `{"plan": {"restore_id", "vms":
    /// [...]}, "timeouts": {...}}`, or the plan alone. With --etcd it is submitted to
    /// that store (the certificate must be the operator's, which also grants the
    /// plan's hosts its records); else to this machine's daemon.
    #[arg(long)]
    pub plan: Option<PathBuf>,
    #[command(flatten)]
    pub store: super::store::StoreArgs,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// `rebound cluster restore NAME --from DIR` or `rebound cluster restore --plan FILE`.
pub async fn restore(paths: &Paths, a: RestoreArgs) -> anyhow::Result<()> {
    if let (Some(name), Some(from)) = (&a.name, &a.from) {
        let c = super::Cluster::open(paths, name)?;
        let from = crate::cli::common::absolute(from)?;
        let opts = super::restore::RestoreOpts {
            variant: a.variant,
            load_rate: a.load_rate,
            margin_s: a.margin_s,
            replace: a.replace,
            no_wait: a.no_wait,
            path: a.path,
        };
        let o = super::restore::restore(&c, &from, &opts).await?;
        if a.json {
            println!(
                "{}",
                serde_json::to_string_pretty(&super::restore::to_json(&o))?
            );
        } else {
            super::restore::print(&o);
        }
        return outcome(&o.report);
    }
    let Some(plan) = a.plan else {
        anyhow::bail!("give a cluster and --from DIR, or --plan FILE");
    };
    let text = std::fs::read_to_string(&plan)
        .with_context(|| format!("cannot read {}", plan.display()))?;
    let mut body: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", plan.display()))?;
    if body.get("plan").is_none() {
        body = serde_json::json!({ "plan": body });
    }
    let report: RestoreReport = match a.store.connect().await? {
        Some(store) => {
            let req: crate::daemon::cluster::ClusterRestoreRequest =
                serde_json::from_value(body)
                    .with_context(|| format!("{} is not a restore plan", plan.display()))?;
            let mut access =
                rebound_store::access::connect(&a.store.etcd, &a.store.operator_tls()?).await?;
            super::store::submit_and_wait(&store, &mut access, req.plan, req.timeouts).await?
        }
        None => {
            let c = Client::new(&paths.socket());
            c.call(hyper::Method::POST, "/v1/cluster/restore", Some(&body))
                .await?
        }
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_report(&report);
    }
    outcome(&report)
}
