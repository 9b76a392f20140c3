//! The text and JSON reports of `rebound bench hcache`.

use serde_json::{json, Value};

use super::alloc::AllocOutcome;
use super::validate::{self, Worst};
use super::{HcacheArgs, Results, Run};

/// Why the report could not be printed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot encode the results as JSON")]
    Json(#[source] serde_json::Error),
}

/// Disk reads per request of `pattern` with the whole allocation in the guest.
fn base(runs: &[Run], pattern: &str, allocation: u64) -> Option<f64> {
    runs.iter()
        .find(|r| r.pattern == pattern && r.setting == 0.0 && r.guest_mib == allocation)
        .map(|r| r.disk_reads_per_request)
}

/// The worst ratio of disk reads per request, host cache against all in the guest.
fn io_ratio(runs: &[Run], allocation: u64) -> f64 {
    runs.iter()
        .filter(|r| r.setting > 0.0)
        .filter_map(|r| {
            Some(r.disk_reads_per_request / base(runs, &r.pattern, allocation)?.max(1e-9))
        })
        .fold(0.0, f64::max)
}

fn at(w: &Option<(String, u64)>) -> String {
    w.as_ref()
        .map(|(p, m)| format!("{p} at {m} MiB"))
        .unwrap_or_default()
}

pub(super) fn print(args: &HcacheArgs, meta: &Value, res: &Results) -> Result<(), Error> {
    let io_ratio = io_ratio(&res.runs, args.allocation);
    let mrc_mae = res
        .checks
        .iter()
        .map(|c| c.mae_exact.max(c.mae_sampled))
        .reduce(f64::max);
    let worst: Option<Worst> =
        (!res.validation.is_empty()).then(|| validate::worst(&res.validation));
    if args.out.json {
        let curves: serde_json::Map<String, Value> = res
            .curves
            .iter()
            .map(|(p, (s, c))| (p.clone(), json!({"setting": s, "curve": c})))
            .collect();
        let v = json!({"meta": meta, "io_ratio": io_ratio,
            "mrc_mae": mrc_mae, "mrc_checks": res.checks,
            "prediction_error_max": worst.as_ref().map(|w| w.relative),
            "prediction_error": worst,
            "bound_violations": res.alloc.as_ref().map(|a| a.bound_violations),
            "bound_violations_beyond_noise": res.alloc.as_ref().map(|a| a.bound_violations_beyond_noise),
            "allocation": res.alloc,
            "runs": res.runs, "validation": res.validation, "curves": curves});
        println!("{}", serde_json::to_string_pretty(&v).map_err(Error::Json)?);
        return Ok(());
    }
    println!(
        "rebound bench hcache: allocation {} MiB, {} files of 1 MiB, {} requests per run, write ratio {}; web: {} files of {} KiB, {} requests; accel {}; {}; {:.0} s",
        args.allocation, args.files, args.requests, args.write_ratio, args.web_files,
        args.web_file_size >> 10, args.web_requests, meta["accel"].as_str().unwrap_or(""),
        meta["date"].as_str().unwrap_or(""), meta["seconds"].as_f64().unwrap_or(0.0)
    );
    println!(
        "{:<7} {:>6} {:>6} {:>6} {:>10} {:>8} {:>9} {:>8}  refused",
        "pattern", "cache%", "guest", "cache", "reads/req", "vs 0%", "req/s", "cpu ms"
    );
    for r in &res.runs {
        println!(
            "{:<7} {:>6} {:>6} {:>6} {:>10.1} {:>8} {:>9.2} {:>8.2}  {:?}",
            r.pattern,
            r.setting,
            r.guest_mib,
            r.host_cache_mib,
            r.disk_reads_per_request,
            base(&res.runs, &r.pattern, args.allocation)
                .filter(|_| r.guest_mib + r.host_cache_mib == args.allocation)
                .map(|b| format!("{:.3}", r.disk_reads_per_request / b.max(1e-9)))
                .unwrap_or_else(|| "-".into()),
            r.requests_per_s,
            r.backend_cpu_ms_per_request,
            r.notices_refused
        );
    }
    println!("io_ratio (worst, host cache against all in the guest): {io_ratio:.3}");
    if !res.validation.is_empty() {
        println!("curve against guests of each size, all memory their own:");
        println!(
            "{:<7} {:>6} {:>12} {:>10} {:>8} {:>11}",
            "pattern", "guest", "predicted", "measured", "error", "miss ratio"
        );
    }
    for v in &res.validation {
        println!(
            "{:<7} {:>6} {:>12.0} {:>10} {:>7.1}% {:>11.4}{}",
            v.pattern,
            v.guest_mib,
            v.predicted_disk_reads,
            v.measured_disk_reads,
            v.relative_error * 100.0,
            v.miss_ratio_error,
            if v.curve_start {
                "  (curve's start)"
            } else {
                ""
            }
        );
    }
    if let Some(w) = &worst {
        println!(
            "prediction_error_max (relative, every pattern and size): {:.1}% ({}); largest miss-ratio error {:.4} ({})",
            w.relative * 100.0,
            at(&w.relative_at),
            w.miss_ratio,
            at(&w.miss_ratio_at)
        );
    }
    if let Some(a) = &res.alloc {
        for line in alloc_lines(a) {
            println!("{line}");
        }
    }
    for c in &res.checks {
        println!(
            "curve algorithm against a simulated exclusive LRU, {}: {} events, {} sizes up to {} blocks: mean absolute error exact {:.4}, sampled at {} {:.4}",
            c.pattern, c.events, c.sizes, c.max_blocks, c.mae_exact, c.sampled_rate, c.mae_sampled
        );
    }
    if let Some(m) = mrc_mae {
        println!("mrc_mae (worst pattern, exact or sampled): {m:.4}");
    }
    Ok(())
}

/// The allocation's lines: the verdicts, then each VM's change beside its noise.
pub(super) fn alloc_lines(a: &AllocOutcome) -> Vec<String> {
    let mut out = vec![format!(
        "allocation ({}, bound {}, planned within {:.3}): {} of {} VMs measured over the bound, {} of them beyond the noise ({} moved; {} baseline and {} outcome rounds of {} requests)",
        a.policy,
        a.bound,
        (a.bound - a.margin).max(0.0),
        a.bound_violations,
        a.vms.len(),
        a.bound_violations_beyond_noise,
        a.vms_moved,
        a.rounds,
        a.rounds,
        a.requests_per_round
    )];
    for v in &a.vms {
        let verdict = match (v.within_bound, v.over_beyond_noise) {
            (true, _) => "",
            (false, false) => ", OVER THE BOUND (within the noise)",
            (false, true) => ", OVER THE BOUND (beyond the noise)",
        };
        out.push(format!(
            "  {:<8} {:<6} {:>4} -> {:>4} MiB: reads/request {:.1} -> {:.1}; x{:.3} predicted (baseline rounds x{}), x{:.3} ± {:.3} measured (medians x{:.3}; a baseline round ±{:.1}%, its later half over its earlier x{:.3}){}{}",
            v.role,
            v.pattern,
            v.baseline_mib,
            v.applied_mib.unwrap_or(v.baseline_mib),
            v.baseline_reads_per_request,
            v.outcome_reads_per_request,
            v.predicted_relative,
            v.window_predicted_relative
                .map(|w| format!("{w:.3}"))
                .unwrap_or_else(|| "-".into()),
            v.measured_relative,
            v.noise,
            v.median_relative,
            v.baseline_round_spread * 100.0,
            v.baseline_round_ratio,
            verdict,
            v.error.as_ref().map(|e| format!(" ({e})")).unwrap_or_default()
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn run(pattern: &str, setting: f64, guest: u64, cache: u64, per_request: f64) -> Run {
        Run {
            pattern: pattern.into(),
            setting,
            guest_mib: guest,
            host_cache_mib: cache,
            requests: 100,
            seconds: 1.0,
            requests_per_s: 100.0,
            disk_reads_per_request: per_request,
            disk_reads: (per_request * 100.0) as u64,
            blocks_read: 25_600,
            host_cache_hits: 0,
            backend_cpu_ms_per_request: 0.0,
            notices_admitted: 0,
            notices_refused: BTreeMap::new(),
            notices_lost: 0,
            ring_polls: 0,
            errors: 0,
        }
    }

    #[test]
    fn io_ratio_is_the_worst_setting_against_its_own_patterns_base() {
        let runs = [
            run("seq", 0.0, 512, 0, 200.0),
            run("seq", 50.0, 256, 256, 202.0),
            run("zipf", 0.0, 512, 0, 50.0),
            run("zipf", 75.0, 128, 384, 51.5),
            // A validation run of a smaller guest is not a setting.
            run("zipf", 0.0, 128, 0, 120.0),
        ];
        assert!((io_ratio(&runs, 512) - 1.03).abs() < 1e-9);
        assert_eq!(base(&runs, "zipf", 512), Some(50.0));
        assert_eq!(base(&runs, "web", 512), None);
    }
}
