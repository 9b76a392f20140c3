//! `rebound cluster token|restore|call`: the cluster token, a cluster restore
//! coordinated by the local daemon, and one relayed API call to another host's
//! daemon (`rebound-coord`).

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use rebound_coord::report::{Outcome, RestoreReport};
use rebound_coord::ClusterToken;
use rebound_vmm::paths::Paths;

use crate::client::Client;

#[derive(Args, Debug)]
pub struct TokenArgs {
    /// The file to create (an existing file is not overwritten).
    pub file: PathBuf,
}

#[derive(Args, Debug)]
pub struct RestoreArgs {
    /// A JSON file: `{"plan": {"restore_id", "vms": [...]}, "config": {...}}`, or
    /// the plan alone.
    pub plan: PathBuf,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct CallArgs {
    /// The daemon's cohort address, HOST:PORT (its `--listen`).
    pub addr: String,
    /// GET, POST, PUT, PATCH or DELETE.
    pub method: String,
    /// The API path, e.g. /v1/vms.
    pub path: String,
    /// A JSON request body.
    #[arg(long)]
    pub body: Option<String>,
    /// The cluster token file.
    #[arg(long)]
    pub token: PathBuf,
}

/// `rebound cluster token FILE`.
pub fn token(a: TokenArgs) -> anyhow::Result<()> {
    ClusterToken::create_file(&a.file)?;
    println!("made cluster token {}", a.file.display());
    Ok(())
}

/// `rebound cluster restore PLAN`.
pub async fn restore(paths: &Paths, a: RestoreArgs) -> anyhow::Result<()> {
    let RestoreArgs { plan, json } = a;
    {
        {
            let text = std::fs::read_to_string(&plan)
                .with_context(|| format!("cannot read {}", plan.display()))?;
            let mut body: serde_json::Value = serde_json::from_str(&text)
                .with_context(|| format!("{} is not JSON", plan.display()))?;
            if body.get("plan").is_none() {
                body = serde_json::json!({ "plan": body });
            }
            let c = Client::new(&paths.socket());
            let report: RestoreReport = c
                .call(hyper::Method::POST, "/v1/cluster/restore", Some(&body))
                .await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print_report(&report);
            }
            match &report.outcome {
                Outcome::Restored => Ok(()),
                Outcome::Aborted { reason } => {
                    anyhow::bail!("cluster restore {} aborted: {reason}", report.restore_id)
                }
            }
        }
    }
}

/// `rebound cluster call ADDR METHOD PATH`.
pub async fn call(a: CallArgs) -> anyhow::Result<()> {
    let CallArgs {
        addr,
        method,
        path,
        body,
        token,
    } = a;
    {
        {
            let token = ClusterToken::from_file(&token)?;
            let body = match body {
                Some(b) => Some(serde_json::from_str(&b).context("--body is not JSON")?),
                None => None,
            };
            let a =
                rebound_coord::relay::call(&addr, &token, &method, &path, body.as_ref()).await?;
            if !(200..300).contains(&a.status) {
                let msg = a.body["error"]
                    .as_str()
                    .map_or_else(|| a.body.to_string(), str::to_string);
                anyhow::bail!("{addr} answered {}: {msg}", a.status);
            }
            match &a.body {
                serde_json::Value::String(s) => print!("{s}"),
                v => println!("{}", serde_json::to_string_pretty(v)?),
            }
            Ok(())
        }
    }
}

fn print_report(r: &RestoreReport) {
    let opt = |v: Option<f64>| v.map_or("-".to_string(), |s| format!("{s:.3}"));
    println!(
        "cluster restore {}: {} in {:.2} s",
        r.restore_id,
        match &r.outcome {
            Outcome::Restored => "restored".to_string(),
            Outcome::Aborted { reason } => format!("aborted ({reason})"),
        },
        r.duration_s
    );
    println!(
        "{:<20} {:<22} {:<14} {:>9} {:>9} {:>9}",
        "VM", "COHORT", "STATE", "LOADED_S", "START_S", "RESTORED_S"
    );
    for v in &r.vms {
        println!(
            "{:<20} {:<22} {:<14} {:>9} {:>9} {:>9}",
            v.vm,
            v.cohort,
            serde_json::to_value(v.state)
                .ok()
                .and_then(|s| s.as_str().map(str::to_string))
                .unwrap_or_default(),
            opt(v.load_fin_s),
            opt(v.start_s),
            opt(v.restore_fin_s)
        );
        if let Some(e) = &v.error {
            println!("  {e}");
        }
    }
}
