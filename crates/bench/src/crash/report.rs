//! What `rebound bench crash` prints and draws.

use serde::Serialize;

use super::case::{Case, Outcome, MB, MIB};
use super::sizes::{print_sizes, Sizes};

#[derive(Debug, Serialize)]
pub(super) struct Meta {
    pub(super) date: String,
    pub(super) accel: String,
    pub(super) accel_reason: String,
    pub(super) host_cpus: usize,
    pub(super) host_kernel: String,
    pub(super) memory_mib: u64,
    pub(super) fill_mib: u64,
    pub(super) disk_mbps: u32,
    pub(super) chunk_mib: u64,
    pub(super) min_memory_mib: u64,
    pub(super) runs: usize,
    pub(super) load_before: String,
    pub(super) load_after: String,
    /// The post-boot snapshot the `r` cases recovered from.
    pub(super) snapshot: Option<rebound_api::SnapshotResult>,
}

/// The stock baseline a case is compared with: `a` at the emulated disk's rate
/// (scaled) for throttled cases, `a` as measured on the real disk otherwise.
pub(super) fn baseline(case: &Case, a: Option<&Outcome>) -> Option<f64> {
    let a = a?;
    if case.throttled {
        a.scaled_downtime_s
    } else {
        Some(a.downtime_s)
    }
}

pub(super) fn print_text(meta: &Meta, cases: &[Case], med: &[Outcome], sizes: &[Sizes]) {
    println!(
        "rebound bench crash: {} MiB guest, {} MiB filled (memfill) + web, 1 vCPU; accel {} ({}); host {} CPUs, kernel {}; {}",
        meta.memory_mib, meta.fill_mib, meta.accel, meta.accel_reason, meta.host_cpus, meta.host_kernel, meta.date
    );
    println!(
        "dump held to {} MB/s by the dump writer's token bucket in @{} cases (@disk: unthrottled, real disk); chunk {} MiB, min-memory {} MiB, budget memory + min-memory; {} run(s), medians; load {} -> {}",
        meta.disk_mbps, meta.disk_mbps, meta.chunk_mib, meta.min_memory_mib, meta.runs, meta.load_before, meta.load_after
    );
    let guest = (meta.memory_mib << 20) as f64;
    let a = cases.iter().position(|c| c.id == "a").map(|i| &med[i]);
    // With `--variants s` alone there are only the same-memory dumps.
    if !cases.is_empty() {
        println!(
            "{:<22} {:>9} {:>9} {:>8} {:>8} {:>10} {:>10} {:>9} {:>9} {:>7}",
            "case",
            "downtime",
            "daemon",
            "gap",
            "dump_s",
            "covered/s",
            "dump MiB",
            "io MiB",
            "io MB/s",
            "vs a"
        );
    }
    let opt = |v: Option<f64>| v.map(|x| format!("{x:.2}")).unwrap_or_else(|| "-".into());
    for (case, o) in cases.iter().zip(med) {
        let ratio = baseline(case, a)
            .map(|b| format!("{:.2}x", o.downtime_s / b))
            .unwrap_or_default();
        let ratio = if case.id == "a" { String::new() } else { ratio };
        println!(
            "{:<22} {:>9.2} {:>9} {:>8.2} {:>8.2} {:>10.0} {:>10.1} {:>9.1} {:>9.1} {:>7}",
            case.id,
            o.downtime_s,
            opt(o.daemon_downtime_s),
            o.longest_gap_s,
            o.dump_s,
            guest / o.dump_s / MIB,
            o.dump_bytes as f64 / MIB,
            o.dump_io_bytes as f64 / MIB,
            o.dump_io_bytes as f64 / o.dump_s / MB,
            ratio
        );
    }
    if let Some(a) = a {
        println!(
            "a at {} MB/s (QEMU cannot be throttled: its dump time there is bytes / rate): dump {} s, downtime {} s; reboot alone (no dump) {} s",
            meta.disk_mbps,
            opt(a.scaled_dump_s),
            opt(a.scaled_downtime_s),
            opt(a.reboot_only_s)
        );
        if let Some(reboot) = a.reboot_only_s {
            for (case, o) in cases.iter().zip(med).filter(|(c, _)| c.id != "a") {
                println!(
                    "  {:<20} downtime / reboot alone {:.2}x",
                    case.id,
                    o.downtime_s / reboot
                );
            }
        }
    }
    if let Some(snap) = &meta.snapshot {
        println!(
            "r: post-boot snapshot taken when the service first answered: guest paused {:.0} ms, {:.1} MiB of RAM, {} trace pages; restored cold (page cache dropped) at each crash",
            snap.pause_ms,
            snap.ram_data_bytes as f64 / MIB,
            snap.trace_pages
        );
    }
    for (case, o) in cases.iter().zip(med).filter(|(c, _)| c.recover_from) {
        // The booting recovery on the same disk setting: `c@X` for `r@X`.
        let boot = cases
            .iter()
            .zip(med)
            .find(|(b, _)| b.id == case.id.replacen('r', "c", 1));
        let vs = boot
            .map(|(b, bo)| {
                format!(
                    "; downtime / {}'s (booted) {:.2}x, recovery VM spawn to ready {} s against {} s",
                    b.id,
                    o.downtime_s / bo.downtime_s,
                    opt(o.recovery_s),
                    opt(bo.recovery_s)
                )
            })
            .unwrap_or_default();
        println!(
            "{}: restore to running {} s with {} working-set pages read first{vs}",
            case.id,
            opt(o.restore_running_s),
            o.restore_pages_before_start.unwrap_or(0),
        );
    }
    for (case, o) in cases.iter().zip(med) {
        if !o.pages_skipped.is_empty() {
            println!(
                "{}: {} pages written, skipped {:?}",
                case.id, o.pages_written, o.pages_skipped
            );
        }
        for n in &o.notes {
            println!("{}: note: {n}", case.id);
        }
    }
    for s in sizes {
        print_sizes(s);
    }
}

/// Downtime (bar) and the longest client gap (tick) per case, as an SVG.
pub(super) fn draw(meta: &Meta, med: &[Outcome]) -> String {
    let w = 760.0;
    let left = 170.0;
    let row = 26.0;
    let top = 50.0;
    let h = top + row * med.len() as f64 + 40.0;
    let max = med
        .iter()
        .flat_map(|o| {
            [
                o.downtime_s,
                o.longest_gap_s,
                o.scaled_downtime_s.unwrap_or(0.0),
            ]
        })
        .fold(1.0, f64::max);
    let x = |v: f64| left + v / max * (w - left - 30.0);
    let mut s = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">
<text x="10" y="18" font-size="14">Crash to service answering: {} MiB guest, {} MiB filled, accel {}, {}</text>
<text x="10" y="36" fill="#555">bar: downtime seen by a client probing every 100 ms; black tick: its longest gap; dump held to {} MB/s in @{} cases</text>
"##,
        meta.memory_mib, meta.fill_mib, meta.accel, meta.date, meta.disk_mbps, meta.disk_mbps
    );
    for (i, o) in med.iter().enumerate() {
        let y = top + row * i as f64;
        let color = if o.case == "a" { "#c44" } else { "#48c" };
        s += &format!(
            "<text x=\"10\" y=\"{:.0}\">{}</text><rect x=\"{left}\" y=\"{y:.0}\" width=\"{:.1}\" height=\"18\" fill=\"{color}\"/><text x=\"{:.1}\" y=\"{:.0}\">{:.2} s</text><line x1=\"{:.1}\" x2=\"{:.1}\" y1=\"{:.0}\" y2=\"{:.0}\" stroke=\"black\" stroke-width=\"2\"/>\n",
            y + 13.0,
            o.case,
            x(o.downtime_s) - left,
            x(o.downtime_s) + 4.0,
            y + 13.0,
            o.downtime_s,
            x(o.longest_gap_s),
            x(o.longest_gap_s),
            y - 2.0,
            y + 20.0
        );
        if let Some(sc) = o.scaled_downtime_s {
            s += &format!(
                "<rect x=\"{left}\" y=\"{:.0}\" width=\"{:.1}\" height=\"4\" fill=\"#e99\"/>\n",
                y + 18.0,
                x(sc) - left
            );
        }
    }
    s += &format!(
        "<text x=\"{left}\" y=\"{:.0}\" fill=\"#555\">0 to {max:.1} s (thin red: a's downtime at {} MB/s, scaled)</text>\n</svg>\n",
        h - 12.0,
        meta.disk_mbps
    );
    s
}
