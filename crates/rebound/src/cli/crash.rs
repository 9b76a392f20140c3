//! `rebound crash ...`: crash reports, as text, JSON or a figure.

use std::path::Path;

use hyper::Method;
use rebound_api::{CrashReport, VmStatus};
use rebound_vmm::paths::Paths;

use super::{connect, CrashCmd};

pub async fn run(paths: &Paths, cmd: CrashCmd) -> anyhow::Result<()> {
    let c = connect(paths).await?;
    match cmd {
        CrashCmd::List { name, json } => {
            let names: Vec<String> = match name {
                Some(n) => vec![n],
                None => {
                    let vms: Vec<VmStatus> = c.call(Method::GET, "/v1/vms", None).await?;
                    vms.into_iter().map(|v| v.name).collect()
                }
            };
            let mut all: Vec<CrashReport> = Vec::new();
            for n in names {
                let r: Vec<CrashReport> = c
                    .call(Method::GET, &format!("/v1/vms/{n}/crashes"), None)
                    .await?;
                all.extend(r);
            }
            if json {
                println!("{}", serde_json::to_string_pretty(&all)?);
                return Ok(());
            }
            println!(
                "{:<16} {:<25} {:<9} {:<18} {:<10} {:>10} {:>8}",
                "VM", "ID", "CAUSE", "POLICY", "PHASE", "DOWNTIME", "DUMP"
            );
            for r in &all {
                println!(
                    "{:<16} {:<25} {:<9} {:<18} {:<10} {:>10} {:>8}",
                    r.vm,
                    r.id,
                    r.cause,
                    serde_json::to_value(r.policy.on_crash)?
                        .as_str()
                        .unwrap_or("?"),
                    serde_json::to_value(r.phase)?.as_str().unwrap_or("?"),
                    secs(r.downtime_s),
                    secs(r.dump_s)
                );
            }
            Ok(())
        }
        CrashCmd::Report {
            name,
            id,
            json,
            plot,
        } => {
            let id = id.unwrap_or_else(|| "latest".into());
            let r: CrashReport = c
                .call(Method::GET, &format!("/v1/vms/{name}/crashes/{id}"), None)
                .await?;
            if let Some(p) = &plot {
                rebound_plot::crash_timeline(&r, p)?;
            }
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                print!("{}", text(&r, plot.as_deref()));
            }
            Ok(())
        }
    }
}

fn secs(s: Option<f64>) -> String {
    s.map(|s| format!("{s:.2} s")).unwrap_or_else(|| "-".into())
}

fn text(r: &CrashReport, plot: Option<&Path>) -> String {
    let mut out = String::new();
    let mut row = |k: &str, v: String| out.push_str(&format!("{k:<15} {v}\n"));
    row("vm", r.vm.clone());
    row(
        "crash",
        format!("{} ({}) at {}", r.id, r.cause, r.crashed_at),
    );
    row(
        "policy",
        format!(
            "{} ({} I/O)",
            serde_json::to_value(r.policy.on_crash)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default(),
            r.io_policy
        ),
    );
    row(
        "phase",
        serde_json::to_value(r.phase)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default(),
    );
    row("downtime", secs(r.downtime_s));
    row("recovery", secs(r.recovery_s));
    row("dump", secs(r.dump_s));
    row(
        "dump file",
        match (&r.dump_path, r.dump_bytes) {
            (Some(p), Some(b)) => format!("{p} ({} MiB)", b >> 20),
            (Some(p), None) => format!("{p} (not complete)"),
            _ => "-".into(),
        },
    );
    if let Some(w) = r.pages_written {
        row("pages written", w.to_string());
    }
    if let Some(m) = &r.memory_limit {
        let mib = |b: u64| format!("{} MiB", b >> 20);
        row(
            "memory budget",
            match (m.limit_bytes, &m.group) {
                (Some(l), Some(g)) => format!(
                    "{}, held by {} (limit {} with the recovery QEMU's own memory, peak {}; group {g})",
                    mib(m.budget_bytes),
                    m.enforced_by,
                    mib(l),
                    m.peak_bytes.map_or_else(|| "-".into(), mib),
                ),
                _ => format!(
                    "{}, accounted only ({})",
                    mib(m.budget_bytes),
                    m.why_not.as_deref().unwrap_or("no memory group")
                ),
            },
        );
    }
    for (k, v) in &r.pages_skipped {
        row(&format!("skipped {k}"), v.to_string());
    }
    for n in &r.notes {
        row("note", n.clone());
    }
    if let Some(p) = plot {
        row("plot", p.display().to_string());
    }
    out
}
