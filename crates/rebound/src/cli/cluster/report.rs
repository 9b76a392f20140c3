//! A cluster restore's report: printed as a table, and whether the command
//! succeeded.

use rebound_coord::report::{Outcome, RestoreReport};

/// Fails unless every VM was restored.
pub(super) fn outcome(report: &RestoreReport) -> anyhow::Result<()> {
    match &report.outcome {
        Outcome::Restored => Ok(()),
        Outcome::Aborted { reason } => {
            anyhow::bail!("cluster restore {} aborted: {reason}", report.restore_id)
        }
        Outcome::Running { status } => {
            anyhow::bail!(
                "cluster restore {} has not ended: {status}",
                report.restore_id
            )
        }
    }
}

pub fn print_report(r: &RestoreReport) {
    let opt = |v: Option<f64>| v.map_or("-".to_string(), |s| format!("{s:.3}"));
    println!(
        "cluster restore {}: {} in {:.2} s, coordinated by {}",
        r.restore_id,
        match &r.outcome {
            Outcome::Restored => "restored".to_string(),
            Outcome::Aborted { reason } => format!("aborted ({reason})"),
            Outcome::Running { status } => format!("running ({status})"),
        },
        r.duration_s,
        r.coordinators.join(" then ")
    );
    println!(
        "{:<20} {:<14} {:<14} {:>9} {:>9} {:>9} {:>9} {:>10}",
        "VM", "HOST", "STATE", "LOADED_S", "AT_S", "START_S", "ERROR_MS", "RESTORED_S"
    );
    for v in &r.vms {
        println!(
            "{:<20} {:<14} {:<14} {:>9} {:>9} {:>9} {:>9} {:>10}",
            v.vm,
            v.host,
            serde_json::to_value(v.state)
                .ok()
                .and_then(|s| s.as_str().map(str::to_string))
                .unwrap_or_default(),
            opt(v.load_fin_s),
            opt(v.start_at_s),
            opt(v.start_s),
            v.start_error_ms.map_or("-".into(), |e| format!("{e:.1}")),
            opt(v.restore_fin_s)
        );
        if let Some(e) = &v.error {
            println!("  {e}");
        }
    }
    for h in r.hosts.iter().filter(|h| !h.live) {
        println!("host {} has failed (its lease expired)", h.host);
    }
}
