//! What `rebound bench crash` prints and draws.

use rebound_api::OnCrash;
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
    /// What the emulated slow disk gave a plain write and read.
    pub(super) slow_disk: Option<crate::throttledfs::FsCheck>,
}

/// The stock case a case is compared with: `a` on the same disk (the emulated one
/// or the real one).
pub(super) fn baseline<'a>(case: &Case, cases: &[Case], med: &'a [Outcome]) -> Option<&'a Outcome> {
    cases
        .iter()
        .position(|c| c.on_crash == OnCrash::None && c.throttled == case.throttled)
        .map(|i| &med[i])
}

pub(super) fn print_text(meta: &Meta, cases: &[Case], med: &[Outcome], sizes: &[Sizes]) {
    println!(
        "rebound bench crash: {} MiB guest, {} MiB filled (memfill) + web, 1 vCPU; accel {} ({}); host {} CPUs, kernel {}; {}",
        meta.memory_mib, meta.fill_mib, meta.accel, meta.accel_reason, meta.host_cpus, meta.host_kernel, meta.date
    );
    match &meta.slow_disk {
        Some(d) => println!(
            "@{}: dump, guest disk and snapshot on one emulated disk, {} MB/s for reads and writes together (a plain write gave {:.0} MB/s, a read {:.0}); @disk: the real disk",
            meta.disk_mbps, meta.disk_mbps, d.write_mbps, d.read_mbps
        ),
        None => println!("the real disk only"),
    }
    println!(
        "chunk {} MiB, min-memory {} MiB, budget memory + min-memory, I/O policy the default unless named; {} run(s), medians; load {} -> {}",
        meta.chunk_mib, meta.min_memory_mib, meta.runs, meta.load_before, meta.load_after
    );
    let guest = (meta.memory_mib << 20) as f64;
    // With `--variants s` alone there are only the same-memory dumps.
    if !cases.is_empty() {
        println!(
            "{:<24} {:>9} {:>9} {:>8} {:>8} {:>10} {:>10} {:>9} {:>9} {:>7} {:>8} {:>8} {:>6}",
            "case",
            "downtime",
            "daemon",
            "gap",
            "dump_s",
            "covered/s",
            "dump MiB",
            "io MiB",
            "io MB/s",
            "vs a",
            "rps pre",
            "rps dump",
            "ratio"
        );
    }
    let opt = |v: Option<f64>| v.map(|x| format!("{x:.2}")).unwrap_or_else(|| "-".into());
    let opt1 = |v: Option<f64>| v.map(|x| format!("{x:.1}")).unwrap_or_else(|| "-".into());
    for (case, o) in cases.iter().zip(med) {
        let ratio = match baseline(case, cases, med) {
            Some(a) if case.on_crash != OnCrash::None => {
                format!("{:.2}x", o.downtime_s / a.downtime_s)
            }
            _ => String::new(),
        };
        println!(
            "{:<24} {:>9.2} {:>9} {:>8.2} {:>8.2} {:>10.0} {:>10.1} {:>9.1} {:>9.1} {:>7} {:>8} {:>8} {:>6}",
            case.id,
            o.downtime_s,
            opt(o.daemon_downtime_s),
            o.longest_gap_s,
            o.dump_s,
            guest / o.dump_s / MIB,
            o.dump_bytes as f64 / MIB,
            o.dump_io_bytes as f64 / MIB,
            o.dump_io_bytes as f64 / o.dump_s / MB,
            ratio,
            opt1(o.capacity.before_rps),
            opt1(o.capacity.during_dump_rps),
            opt(o.capacity.ratio())
        );
    }
    println!(
        "rps: requests a second {} clients got back to back, in the {} s before the crash and from the service's first answer until the dump ended (-: the dump ended first, or less than 1 s after)",
        super::capacity::CLIENTS,
        super::capacity::BEFORE.as_secs()
    );
    for (case, a) in cases
        .iter()
        .zip(med)
        .filter(|(c, _)| c.on_crash == OnCrash::None)
    {
        if let Some(reboot) = a.reboot_only_s {
            println!("{}: reboot alone (no dump) {reboot:.2} s", case.id);
            for (c, o) in cases
                .iter()
                .zip(med)
                .filter(|(c, _)| c.on_crash != OnCrash::None && c.throttled == case.throttled)
            {
                println!(
                    "  {:<22} downtime / reboot alone {:.2}x",
                    c.id,
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
        .flat_map(|o| [o.downtime_s, o.longest_gap_s])
        .fold(1.0, f64::max);
    let x = |v: f64| left + v / max * (w - left - 30.0);
    let mut s = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">
<text x="10" y="18" font-size="14">Crash to service answering: {} MiB guest, {} MiB filled, accel {}, {}</text>
<text x="10" y="36" fill="#555">bar: downtime seen by a client probing every 100 ms; black tick: its longest gap; @{}: on one emulated {} MB/s disk</text>
"##,
        meta.memory_mib, meta.fill_mib, meta.accel, meta.date, meta.disk_mbps, meta.disk_mbps
    );
    for (i, o) in med.iter().enumerate() {
        let y = top + row * i as f64;
        let color = if o.case.starts_with("a@") {
            "#c44"
        } else {
            "#48c"
        };
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
    }
    s += &format!(
        "<text x=\"{left}\" y=\"{:.0}\" fill=\"#555\">0 to {max:.1} s</text>\n</svg>\n",
        h - 12.0
    );
    s
}
