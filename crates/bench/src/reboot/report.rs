//! The report of `bench reboot`: each variant's level after the reboot against the best
//! level before it of all variants in the same run, the figures over the runs (median,
//! min, max), and the text tables.

use serde::Serialize;

use super::Variant;
use crate::webload;

pub use crate::rounds::Stat;

/// Median (of the middle two for an even count), min and max; None for no values.
pub fn stat(values: impl IntoIterator<Item = f64>) -> Option<Stat> {
    Stat::of(values)
}

/// Sets every variant's `drop_vs_best_pct`: its first 10 s after the reboot against
/// the best level before the reboot of all variants of one run.
pub fn against_best(run: &mut [Variant]) {
    let best = run.iter().map(|r| r.before_mb_s).fold(0.0, f64::max);
    for r in run {
        r.best_before_mb_s = best;
        r.drop_vs_best_pct = if best > 0.0 {
            100.0 * (1.0 - r.first10_mb_s / best)
        } else {
            0.0
        };
    }
}

/// A figure of one run of a variant.
type Figure = fn(&Variant) -> Option<f64>;

/// The figures summarized over the runs, by name (the JSON's and the tables' keys).
const FIGURES: [(&str, Figure); 19] = [
    ("first_read_before_s", |r| Some(r.reads_before_s[0])),
    ("first_read_after_s", |r| Some(r.reads_after_s[0])),
    ("before_mb_s", |r| Some(r.before_mb_s)),
    ("first10_mb_s", |r| Some(r.first10_mb_s)),
    ("drop_pct", |r| Some(r.drop_pct)),
    ("drop_vs_best_pct", |r| Some(r.drop_vs_best_pct)),
    ("reboot_s", |r| Some(r.reboot_s)),
    ("outage_s", |r| Some(r.outage_s)),
    ("recovery_s", |r| r.recovery_s),
    ("steady_latency_ms", |r| Some(r.steady.latency_ms)),
    // The vCPU's share of the window running the guest, and waiting for a CPU.
    ("vcpu_run_pct", |r| {
        let s = &r.steady;
        (s.window_s > 0.0).then(|| 100.0 * s.qemu_vcpu_s / s.window_s)
    }),
    ("vcpu_wait_pct", |r| {
        let s = &r.steady;
        (s.window_s > 0.0).then(|| 100.0 * s.qemu_vcpu_wait_s / s.window_s)
    }),
    ("qemu_vcpu_ms_per_mb", |r| {
        Some(r.steady.ms_per_mb(r.steady.qemu_vcpu_s))
    }),
    ("qemu_other_ms_per_mb", |r| {
        Some(r.steady.ms_per_mb(r.steady.qemu_other_s))
    }),
    ("backend_ms_per_mb", |r| {
        Some(r.steady.ms_per_mb(r.steady.backend_s))
    }),
    ("daemon_ms_per_mb", |r| {
        Some(r.steady.ms_per_mb(r.steady.daemon_s))
    }),
    ("loadgen_ms_per_mb", |r| {
        Some(r.steady.ms_per_mb(r.steady.loadgen_s))
    }),
    ("rest_ms_per_mb", |r| {
        Some(r.steady.ms_per_mb(r.steady.rest_s))
    }),
    ("host_idle_pct", |r| {
        let s = &r.steady;
        let all = s.window_s * s.host_cpus as f64;
        (all > 0.0).then(|| 100.0 * (1.0 - s.host_busy_s / all))
    }),
];

/// One variant over the runs.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub variant: String,
    pub runs: usize,
    pub figures: std::collections::BTreeMap<&'static str, Stat>,
}

impl Summary {
    fn get(&self, k: &str) -> Option<Stat> {
        self.figures.get(k).copied()
    }
}

/// Every variant's figures over its runs, in the order the variants ran.
pub fn summarize(rows: &[Variant]) -> Vec<Summary> {
    variant_names(rows)
        .iter()
        .map(|&v| {
            let runs: Vec<&Variant> = rows.iter().filter(|r| r.variant == v).collect();
            let figures = FIGURES
                .iter()
                .filter_map(|(k, f)| Some((*k, stat(runs.iter().filter_map(|r| f(r)))?)))
                .collect();
            Summary {
                variant: v.to_string(),
                runs: runs.len(),
                figures,
            }
        })
        .collect()
}

/// `median [min–max]`, or the median alone for one run; `-` for none.
fn cell(s: Option<Stat>, decimals: usize) -> String {
    match s {
        None => "-".into(),
        Some(s) if s.min == s.max => format!("{:.*}", decimals, s.median),
        Some(s) => format!(
            "{:.*} [{:.*}–{:.*}]",
            decimals, s.median, decimals, s.min, decimals, s.max
        ),
    }
}

/// One row per variant, a column per figure (heading, key, decimals); a figure some
/// runs lack says in how many it was.
fn table(summary: &[Summary], cols: &[(&str, &str, usize)]) {
    let rows: Vec<Vec<String>> = summary
        .iter()
        .map(|s| {
            let mut row = vec![s.variant.clone()];
            row.extend(cols.iter().map(|&(_, k, d)| match s.get(k) {
                Some(x) if x.n < s.runs => {
                    format!("{} ({}/{} runs)", cell(Some(x), d), x.n, s.runs)
                }
                x => cell(x, d),
            }));
            row
        })
        .collect();
    let head: Vec<&str> = std::iter::once("variant")
        .chain(cols.iter().map(|c| c.0))
        .collect();
    let width = |i: usize| {
        rows.iter()
            .map(|r| r[i].chars().count())
            .chain([head[i].chars().count()])
            .max()
            .unwrap_or(0)
    };
    let widths: Vec<usize> = (0..head.len()).map(width).collect();
    let line = |cells: Vec<&str>| {
        let mut l = format!("{:<w$}", cells[0], w = widths[0]);
        for (c, w) in cells.iter().zip(&widths).skip(1) {
            l += &format!("  {c:>w$}");
        }
        println!("{l}");
    };
    line(head.clone());
    for r in &rows {
        line(r.iter().map(String::as_str).collect());
    }
}

/// The variants in the order they first ran.
pub fn variant_names(rows: &[Variant]) -> Vec<&str> {
    let mut names: Vec<&str> = Vec::new();
    for r in rows {
        if !names.contains(&r.variant.as_str()) {
            names.push(&r.variant);
        }
    }
    names
}

/// The text report: each run, the medians, the steady state, memory and reboots.
pub fn print(rows: &[Variant], summary: &[Summary]) {
    println!(
        "\nEach run ({}), reads in seconds (1st / 2nd / 3rd), MB/s; \"vs best\": the first 10 s after the reboot below the best level before it of the run's variants:",
        rows.iter().map(|r| r.run).max().unwrap_or(0)
    );
    println!(
        "{:<27} {:>3} {:>20} {:>20} {:>8} {:>8} {:>8} {:>8} {:>7} {:>8} {:>9}",
        "variant",
        "run",
        "reads before",
        "reads after",
        "reboot s",
        "outage s",
        "MB/s bef",
        "MB/s 10s",
        "drop %",
        "vs best%",
        "recovery s"
    );
    let three = |r: &[f64; 3]| format!("{:.1} / {:.1} / {:.1}", r[0], r[1], r[2]);
    for r in rows {
        println!(
            "{:<27} {:>3} {:>20} {:>20} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>7.1} {:>8.1} {:>9}",
            r.variant,
            r.run,
            three(&r.reads_before_s),
            three(&r.reads_after_s),
            r.reboot_s,
            r.outage_s,
            r.before_mb_s,
            r.first10_mb_s,
            r.drop_pct,
            r.drop_vs_best_pct,
            r.recovery_s
                .map(|s| format!("{s:.1}"))
                .unwrap_or_else(|| "-".into())
        );
    }
    println!("\nMedian [min–max] over the runs:");
    table(
        summary,
        &[
            ("1st read after s", "first_read_after_s", 1),
            ("MB/s before", "before_mb_s", 1),
            ("MB/s first 10 s", "first10_mb_s", 1),
            ("drop %", "drop_pct", 1),
            ("drop vs best %", "drop_vs_best_pct", 1),
            ("outage s", "outage_s", 2),
            ("recovery s", "recovery_s", 1),
        ],
    );
    println!(
        "\nSteady state before the reboot (median [min–max]): the vCPU's share of the window running and waiting for a CPU (the rest it was idle), and CPU ms per MB served by QEMU's vCPU threads (its busiest, one per vCPU), its other threads, the disk backends, the daemon, the load generator and the rest (other processes, interrupts):"
    );
    table(
        summary,
        &[
            ("latency ms", "steady_latency_ms", 1),
            ("vCPU run %", "vcpu_run_pct", 0),
            ("vCPU wait %", "vcpu_wait_pct", 1),
            ("vCPU ms/MB", "qemu_vcpu_ms_per_mb", 1),
            ("QEMU other", "qemu_other_ms_per_mb", 1),
            ("backend", "backend_ms_per_mb", 1),
            ("daemon", "daemon_ms_per_mb", 1),
            ("load gen", "loadgen_ms_per_mb", 1),
            ("rest", "rest_ms_per_mb", 1),
            ("host idle %", "host_idle_pct", 0),
        ],
    );
    println!("\nSteady windows, CPU seconds and work per run:");
    for r in rows {
        let s = &r.steady;
        println!(
            "{} run {}: {:.0} s, {:.1} MB in {} requests; CPU s: QEMU vCPU {:.1} (waited {:.1} for a CPU), QEMU other {:.1}, backend {:.2}, daemon {:.2}, load gen {:.1}, rest {:.1}, host busy {:.1} of {:.0}; backend {} hits, {} misses, {:.1} MB read; eviction forwarder {} polls, {} notices, {:.0} ms",
            r.variant,
            r.run,
            s.window_s,
            s.mb,
            s.requests,
            s.qemu_vcpu_s,
            s.qemu_vcpu_wait_s,
            s.qemu_other_s,
            s.backend_s,
            s.daemon_s,
            s.loadgen_s,
            s.rest_s,
            s.host_busy_s,
            s.window_s * s.host_cpus as f64,
            s.blk_hits,
            s.blk_misses,
            s.blk_read_mb,
            s.evict_polls,
            s.evicted,
            s.evict_forward_ms
        );
    }
    println!("\nHost memory at the end of each run:");
    for r in rows {
        let mut line = format!(
            "{} run {}: the image holds {} MiB of host page cache, the backends' caches {} MiB",
            r.variant,
            r.run,
            r.image_cached_bytes >> 20,
            r.blk_held_bytes >> 20
        );
        if let Some(m) = &r.equal_memory {
            line += &format!(
"; memory group {} limited to QEMU's footprint + the warm cache's {} MiB ({} MiB at the start, footprint {} MiB growing to {} MiB, the limit moved {} times): peak {} MiB, the image's page cache at most {} MiB, limit reached {} times: held",
                m.group.display(),
                m.cache_bytes >> 20,
                m.limit_bytes >> 20,
                m.footprint_bytes >> 20,
                m.footprint_max_bytes >> 20,
                m.limit_moves,
                m.peak_bytes >> 20,
                m.image_cached_max_bytes >> 20,
                m.limit_hits
            );
        }
        println!("{line}");
    }
    for r in rows.iter().filter(|r| r.read_retries > 0) {
        println!(
            "{} run {}: {} requests of the reads stalled past {} s and were sent again",
            r.variant,
            r.run,
            r.read_retries,
            webload::REQUEST_TIMEOUT_S
        );
    }
    for r in rows.iter().filter(|r| r.variant == "warm") {
        for (k, b) in r.reboots.iter().enumerate() {
            if let Some(p) = &b.prefetch {
                println!(
                    "warm run {} reboot {}: listed {:.1} MiB in {:.2} s, read back {:.1} MiB in {:.2} s ({:.2} s per 256 MiB)",
                    r.run,
                    k + 1,
                    b.cached_pages as f64 / 256.0,
                    b.list_ms.unwrap_or(0) as f64 / 1000.0,
                    p.bytes as f64 / 1048576.0,
                    p.ms as f64 / 1000.0,
                    if p.bytes > 0 {
                        p.ms as f64 / 1000.0 * (256.0 * 1048576.0) / p.bytes as f64
                    } else {
                        0.0
                    }
                );
            }
            if let Some(w) = &b.cold_reason {
                println!("warm run {} reboot {}: went cold: {w}", r.run, k + 1);
            }
        }
    }
    // A reboot the daemon had to finish with a reset took its grace periods: say so
    // beside the outage it explains.
    for r in rows {
        for (k, b) in r.reboots.iter().enumerate() {
            if b.how == "agent+reset" {
                println!(
                    "{} run {} reboot {}: the guest did not reset or come back by itself after its reboot(2); the daemon reset it",
                    r.variant,
                    r.run,
                    k + 1
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(variant: &str, run: u32, before: f64, first10: f64, recovery: Option<f64>) -> Variant {
        Variant {
            variant: variant.into(),
            run,
            reads_before_s: [1.0, 1.0, 1.0],
            reads_after_s: [2.0, 1.0, 1.0],
            read_retries: 0,
            reboot_s: 6.0,
            outage_s: 5.0,
            before_mb_s: before,
            first10_mb_s: first10,
            drop_pct: 100.0 * (1.0 - first10 / before),
            drop_vs_best_pct: 0.0,
            best_before_mb_s: 0.0,
            recovery_s: recovery,
            series: Vec::new(),
            reboot_at_s: 30.0,
            back_at_s: 36.0,
            reboots: Vec::new(),
            rounds: Vec::new(),
            steady: Default::default(),
            equal_memory: None,
            image_cached_bytes: 0,
            blk_held_bytes: 0,
        }
    }

    #[test]
    fn medians_min_and_max() {
        let s = stat([3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (2.0, 1.0, 3.0, 3));
        assert_eq!(stat([4.0, 1.0]).unwrap().median, 2.5);
        assert_eq!(stat(Vec::new()), None);
        assert_eq!(cell(stat([2.0, 1.0, 3.0]), 1), "2.0 [1.0–3.0]");
        assert_eq!(cell(stat([2.0]), 1), "2.0");
        assert_eq!(cell(None, 1), "-");
    }

    #[test]
    fn a_warm_level_after_is_held_against_the_best_level_before_of_the_run() {
        // Warm keeps its own level (0% drop) but that level is below normal's before.
        let mut run = vec![
            row("normal", 1, 37.8, 9.0, None),
            row("normal-hostcache", 1, 37.2, 30.0, Some(2.0)),
            row("warm", 1, 26.2, 26.2, Some(0.0)),
        ];
        against_best(&mut run);
        let w = &run[2];
        assert_eq!(w.drop_pct, 0.0);
        assert_eq!(w.best_before_mb_s, 37.8);
        assert!((w.drop_vs_best_pct - 100.0 * (1.0 - 26.2 / 37.8)).abs() < 1e-9);
        assert!(
            run[0].drop_vs_best_pct == run[0].drop_pct,
            "the best is its own"
        );
    }

    #[test]
    fn the_summary_is_per_variant_over_its_runs_and_counts_missing_recoveries() {
        let rows = vec![
            row("normal", 1, 10.0, 2.0, None),
            row("warm", 1, 10.0, 10.0, Some(0.5)),
            row("normal", 2, 12.0, 3.0, Some(20.0)),
            row("warm", 2, 11.0, 10.0, Some(1.5)),
            row("normal", 3, 11.0, 2.5, None),
            row("warm", 3, 9.0, 9.5, Some(1.0)),
        ];
        let s = summarize(&rows);
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].variant.as_str(), s[0].runs), ("normal", 3));
        let b = s[0].get("before_mb_s").unwrap();
        assert_eq!((b.median, b.min, b.max), (11.0, 10.0, 12.0));
        assert_eq!(s[0].get("recovery_s").unwrap().n, 1);
        assert_eq!(s[1].get("recovery_s").unwrap().median, 1.0);
        assert_eq!(s[1].get("first_read_after_s").unwrap().median, 2.0);
    }

    #[test]
    fn a_failed_run_is_absent_from_its_variants_figures() {
        // warm's second run failed: its row was never made, so its figures are over
        // two runs and say so, while normal keeps all three.
        let rows = vec![
            row("normal", 1, 10.0, 2.0, None),
            row("warm", 1, 10.0, 10.0, Some(0.5)),
            row("normal", 2, 12.0, 3.0, None),
            row("normal", 3, 11.0, 2.5, None),
            row("warm", 3, 9.0, 9.5, Some(1.0)),
        ];
        let s = summarize(&rows);
        assert_eq!((s[1].variant.as_str(), s[1].runs), ("warm", 2));
        let b = s[1].get("before_mb_s").unwrap();
        assert_eq!((b.median, b.n), (9.5, 2));
        assert_eq!(s[0].runs, 3);
    }
}
