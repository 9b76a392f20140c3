//! `rebound memory plan`: divide the memory the VMs hold by their miss-ratio curves.

use clap::Subcommand;
use hyper::Method;
use rebound_api::{MemoryPlan, PlanRequest};
use rebound_vmm::paths::Paths;

use super::{connect, parse_bytes};

#[derive(Subcommand, Debug)]
pub enum MemoryCmd {
    /// Divide the memory the VMs hold now among them from their miss-ratio curves
    /// (`vm mrc`): isolated sharing (least geometric mean of miss ratios, no VM's
    /// predicted misses more than --bound less --margin over its own now) or the
    /// VMware ESX idle memory tax. `--apply` changes each VM's allocation to its share.
    Plan {
        /// isolated-sharing or esx-idle-tax.
        #[arg(long, default_value = "isolated-sharing", value_parser = ["isolated-sharing", "esx-idle-tax"])]
        policy: String,
        /// Isolated sharing: the largest increase of a VM's misses (e.g. 5% or 0.05).
        #[arg(long, value_parser = parse_fraction)]
        bound: Option<f64>,
        /// Isolated sharing: how far under --bound the plan stays, for the curves'
        /// prediction error (default 3%: they were within 2.7% in `bench hcache`).
        #[arg(long, value_parser = parse_fraction)]
        margin: Option<f64>,
        /// ESX: the idle memory tax rate (e.g. 75%).
        #[arg(long, value_parser = parse_fraction)]
        tax_rate: Option<f64>,
        /// Allocations are whole multiples of this (default 4M).
        #[arg(long, value_parser = parse_bytes)]
        unit: Option<u64>,
        /// Plan for these VMs only (repeat; default: every VM with an exclusive host cache).
        #[arg(long = "vm")]
        vms: Vec<String>,
        /// Change each VM's allocation to its share.
        #[arg(long)]
        apply: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// `5%` or `0.05`.
fn parse_fraction(s: &str) -> Result<f64, String> {
    let v = match s.strip_suffix('%') {
        Some(p) => p.trim().parse::<f64>().map(|p| p / 100.0),
        None => s.trim().parse::<f64>(),
    }
    .map_err(|_| format!("{s:?} is not a fraction (5% or 0.05)"))?;
    if v.is_finite() && v >= 0.0 {
        Ok(v)
    } else {
        Err(format!("{s:?} is not a fraction of at least 0"))
    }
}

pub async fn run(paths: &Paths, c: MemoryCmd) -> anyhow::Result<()> {
    let MemoryCmd::Plan {
        policy,
        bound,
        margin,
        tax_rate,
        unit,
        vms,
        apply,
        json,
    } = c;
    let req = PlanRequest {
        policy,
        bound,
        margin,
        unit_bytes: unit,
        tax_rate,
        vms: (!vms.is_empty()).then_some(vms),
        apply,
    };
    let c = connect(paths).await?;
    let p: MemoryPlan = c
        .call(
            Method::POST,
            "/v1/memory/plan",
            Some(&serde_json::to_value(&req)?),
        )
        .await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&p)?);
    } else {
        print_plan(&p);
    }
    if p.vms
        .iter()
        .any(|v| v.applied.as_ref().is_some_and(|a| a.error.is_some()))
    {
        anyhow::bail!("the plan was applied only in part (see above)");
    }
    Ok(())
}

fn print_plan(p: &MemoryPlan) {
    let mib = |b: u64| b >> 20;
    println!(
        "{} over {} MiB (bound {:.0}%, planned within {:.0}%): geometric mean of misses vs now {:.3}",
        p.policy,
        mib(p.total_bytes),
        p.bound * 100.0,
        (p.bound - p.margin).max(0.0) * 100.0,
        p.geo_mean_relative
    );
    println!(
        "{:<16} {:>8} {:>8} {:>10} {:>9}  applied",
        "vm", "now MiB", "plan MiB", "misses", "vs now"
    );
    for v in &p.vms {
        let applied = match &v.applied {
            None => "-".to_string(),
            Some(a) => match (&a.allocation_bytes, &a.error) {
                (_, Some(e)) => format!("failed: {e}"),
                (Some(b), None) => format!("{} MiB", mib(*b)),
                (None, None) => "?".into(),
            },
        };
        println!(
            "{:<16} {:>8} {:>8} {:>10.0} {:>9.3}{} {}",
            v.name,
            mib(v.baseline_bytes),
            mib(v.planned_bytes),
            v.predicted_misses,
            v.relative,
            if v.within_bound { " " } else { "!" },
            applied
        );
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn fractions() {
        assert_eq!(super::parse_fraction("5%"), Ok(0.05));
        assert_eq!(super::parse_fraction("0.25"), Ok(0.25));
        assert!(super::parse_fraction("-1").is_err());
        assert!(super::parse_fraction("x%").is_err());
    }
}
