//! A coordinator's report of a cluster restore: printed as a table, and whether the
//! command succeeded.

use rebound_coord::report::{Outcome, RestoreReport};

/// Fails unless every VM was restored.
pub(super) fn outcome(report: &RestoreReport) -> anyhow::Result<()> {
    match &report.outcome {
        Outcome::Restored => Ok(()),
        Outcome::Aborted { reason } => {
            anyhow::bail!("cluster restore {} aborted: {reason}", report.restore_id)
        }
    }
}

pub fn print_report(r: &RestoreReport) {
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
