//! What `rebound bench restore` prints: the table of cells (medians over the rounds
//! that succeeded, how many did), every failure with its error chain, and the SVG.

use super::cells::{Cell, Failure};
use super::{Meta, Ratio, Snap, MIB};
use crate::slowdisk::DiskCheck;

pub(super) fn print_text(
    meta: &Meta,
    snaps: &[Snap],
    checks: &[DiskCheck],
    cells: &[Cell],
    ratios: &[Ratio],
    failures: &[Failure],
) {
    println!(
        "rebound bench restore: {} MiB guest, memfill/mixed touch {} MiB, kv holds {} MiB and its client reads {}% of the keys, 1 vCPU; accel {}; host {} CPUs, kernel {}; {}",
        meta.memory_mib, meta.touch_mib, meta.kv_data_mib, meta.kv_hot_percent, meta.accel, meta.host_cpus, meta.host_kernel, meta.date
    );
    println!(
        "cold restores (snapshot files dropped from the page cache before each); watch {} s; trace {} s; load {} -> {}",
        meta.watch_s, meta.trace_s, meta.load_before, meta.load_after
    );
    for s in snaps {
        let stock = s
            .stock
            .as_ref()
            .map(|x| {
                format!(
                    "; QEMU stock save {:.1} MiB: {:.2} s at the default cap, {:.2} s raised",
                    x.bytes as f64 / MIB,
                    x.default_cap_s,
                    x.raised_cap_s
                )
            })
            .unwrap_or_default();
        println!(
            "snapshot {}: pause {:.0} ms, {:.2} s, {:.1} MiB RAM data, trace {} pages{stock}",
            s.workload,
            s.pause_ms,
            s.seconds,
            s.ram_data_bytes as f64 / MIB,
            s.trace_pages
        );
    }
    for c in checks {
        println!(
            "emulated disk: reads on {} limited to {} MB/s (blkio); dd O_DIRECT in the group read {:.1} MiB at {:.1} MB/s",
            c.device,
            c.limit_mbps,
            c.dd_bytes as f64 / MIB,
            c.dd_mbps
        );
    }
    println!("medians over the restores of each row that succeeded (ok: of those tried); min-max of the times beside them");
    println!(
        "{:<8} {:<9} {:<13} {:>5} {:>8} {:>11} {:>8} {:>11} {:>9} {:>9} {:>9} {:>10} {:>6} {:>6} {:>8} {:>8} {:>8}",
        "workload",
        "disk",
        "mode",
        "ok",
        "running",
        "min-max",
        "respond",
        "min-max",
        "pre MiB",
        "faults",
        "read MiB",
        "ws pages",
        "hit",
        "acc",
        "run/eag",
        "rsp/eag",
        "flt/lazy"
    );
    let o2 = |v: Option<f64>| v.map(|x| format!("{x:.2}")).unwrap_or_else(|| "-".into());
    let o3 = |v: Option<f64>| v.map(|x| format!("{x:.3}")).unwrap_or_else(|| "-".into());
    let range = |lo: Option<f64>, hi: Option<f64>| match (lo, hi) {
        (Some(a), Some(b)) => format!("{a:.2}-{b:.2}"),
        _ => "-".into(),
    };
    for c in cells {
        let sp = &c.spread;
        let ok = format!("{}/{}", sp.runs, sp.runs + sp.failed);
        let Some(r) = &c.median else {
            println!(
                "{:<8} {:<9} {:<13} {ok:>5} FAILED: every restore of this row failed (errors below)",
                c.workload, c.disk, c.mode
            );
            continue;
        };
        let q = ratios
            .iter()
            .find(|q| q.workload == r.workload && q.disk == r.disk && q.mode == r.mode);
        let q = |f: fn(&Ratio) -> Option<f64>| q.and_then(f);
        println!(
            "{:<8} {:<9} {:<13} {ok:>5} {:>8} {:>11} {:>8} {:>11} {:>9.1} {:>9} {:>9} {:>10} {:>6} {:>6} {:>8} {:>8} {:>8}",
            r.workload,
            r.disk,
            r.mode,
            o2(r.time_to_running_s),
            range(sp.running_min_s, sp.running_max_s),
            o2(r.time_to_responsive_s),
            range(sp.responsive_min_s, sp.responsive_max_s),
            r.bytes_loaded_before_start as f64 / MIB,
            r.major_faults_after_start
                .map(|v| v.to_string())
                .unwrap_or_else(|| "-".into()),
            r.bytes_read_after_start
                .map(|v| format!("{:.1}", v as f64 / MIB))
                .unwrap_or_else(|| "-".into()),
            r.working_set_pages,
            o3(r.hit_rate),
            o3(r.accuracy),
            o3(q(|q| q.running_vs_eager)),
            o3(q(|q| q.responsive_vs_eager)),
            o3(q(|q| q.faults_vs_lazy))
        );
    }
    println!("run/eag, rsp/eag: against the faster of stock and eager to running on the same disk; flt/lazy: major faults after the start against lazy (ps- rows: the page server's own eager and lazy; their faults are page requests)");
    for r in cells.iter().filter_map(|c| c.median.as_ref()) {
        if r.mode.starts_with("ps-") {
            println!(
                "{}/{}/{}: page server: {} requests after the start, service p50 {} µs, p99 {} µs; all memory in place after {} s",
                r.workload,
                r.disk,
                r.mode,
                r.page_requests_after_start.map_or("-".into(), |v| v.to_string()),
                r.request_service_p50_us.map_or("-".into(), |v| format!("{v:.0}")),
                r.request_service_p99_us.map_or("-".into(), |v| format!("{v:.0}")),
                o2(r.memory_loaded_s)
            );
        }
        if let (Some(e), Some(p), Some(o)) = (
            r.exact_trace_pages,
            r.pagemap_trace_pages,
            r.exact_in_pagemap,
        ) {
            println!(
                "{}/{}/{}: exact trace {e} pages against the snapshot's pagemap trace of {p}; {:.1}% of the exact pages are in the pagemap trace",
                r.workload,
                r.disk,
                r.mode,
                o * 100.0
            );
        }
    }
    println!("ps-working-set, ps-elastic hit/acc: the set each sent ahead against the first touches of the next ps-lazy restore of the same snapshot (a touch of a page already sent makes no request)");
    for r in cells.iter().filter_map(|c| c.median.as_ref()) {
        if let Some(a) = r.client_answers {
            println!(
                "{}/{}/{}: the kv client got {a} answers (median) in the {} s after the restore request",
                r.workload, r.disk, r.mode, meta.watch_s
            );
        }
        for n in &r.notes {
            println!("{}/{}/{}: note: {n}", r.workload, r.disk, r.mode);
        }
    }
    for f in failures {
        println!("FAILED {}: {}", f.place(), f.error);
    }
    if let Some(i) = super::Incomplete::of(failures, cells.iter().map(|c| c.spread.runs).sum()) {
        println!("{i}");
    }
}

/// Time to running (bar) and to responsive (thin bar) per restore, as an SVG; a
/// row with failed restores is marked in red, and what failed before any restore
/// (a snapshot, an emulated disk) is listed under the rows.
pub(super) fn draw(meta: &Meta, cells: &[Cell], failures: &[Failure]) -> String {
    let (w, left, row, top) = (900.0, 240.0, 24.0, 66.0);
    let setups: Vec<&Failure> = failures.iter().filter(|f| !f.is_restore()).collect();
    let h = top + row * (cells.len() + setups.len()) as f64 + 40.0;
    let max = cells
        .iter()
        .flat_map(|c| [c.spread.running_max_s, c.spread.responsive_max_s])
        .flatten()
        .fold(1.0, f64::max);
    let tried = cells
        .iter()
        .map(|c| c.spread.runs + c.spread.failed)
        .max()
        .unwrap_or(0);
    let x = |v: f64| v / max * (820.0 - left - 60.0);
    let mut s = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">
<text x="10" y="18" font-size="14">Restore: {} MiB guest, {} MiB touched, accel {}, {}</text>
<text x="10" y="36" fill="#555">medians of the runs that succeeded ({tried} tried per row; in red: runs that failed, their errors are in the text and JSON)</text>
<text x="10" y="52" fill="#555">bar: time to running; thin bar: time to responsive; whisker: min to max; cold page cache; emulated disk {} MB/s</text>
"##,
        meta.memory_mib, meta.touch_mib, meta.accel, meta.date, meta.disk_mbps
    );
    for (i, c) in cells.iter().enumerate() {
        let y = top + row * i as f64;
        s += &format!(
            "<text x=\"10\" y=\"{:.0}\">{} {} {}</text>\n",
            y + 11.0,
            c.workload,
            c.disk,
            c.mode
        );
        let failed = c.spread.failed;
        let n = c.spread.runs + failed;
        let Some(r) = &c.median else {
            s += &format!(
                "<text x=\"{left}\" y=\"{:.0}\" fill=\"#c00\">failed: all {n} runs (no figures)</text>\n",
                y + 11.0
            );
            continue;
        };
        let color = match r.mode.as_str() {
            "stock" | "eager" => "#c44",
            "lazy" => "#999",
            _ => "#48c",
        };
        let run = r.time_to_running_s.unwrap_or(0.0);
        s += &format!(
            "<rect x=\"{left}\" y=\"{y:.0}\" width=\"{:.1}\" height=\"12\" fill=\"{color}\"/>\n",
            x(run)
        );
        for (lo, hi, at) in [
            (c.spread.running_min_s, c.spread.running_max_s, y + 6.0),
            (
                c.spread.responsive_min_s,
                c.spread.responsive_max_s,
                y + 16.0,
            ),
        ] {
            if let (Some(lo), Some(hi)) = (lo, hi) {
                s += &format!(
                    "<line x1=\"{:.1}\" x2=\"{:.1}\" y1=\"{at:.0}\" y2=\"{at:.0}\" stroke=\"#000\"/>\n",
                    left + x(lo),
                    left + x(hi)
                );
            }
        }
        let end = [c.spread.running_max_s, c.spread.responsive_max_s]
            .into_iter()
            .flatten()
            .fold(run.max(r.time_to_responsive_s.unwrap_or(0.0)), f64::max);
        let mut label = String::new();
        if let Some(t) = r.time_to_responsive_s {
            s += &format!(
                "<rect x=\"{left}\" y=\"{:.0}\" width=\"{:.1}\" height=\"4\" fill=\"#333\"/>\n",
                y + 14.0,
                x(t)
            );
            label = format!("{run:.2} / {t:.2} s");
        }
        if failed > 0 {
            label += &format!(" <tspan fill=\"#c00\">{failed} of {n} failed</tspan>");
        }
        if !label.is_empty() {
            s += &format!(
                "<text x=\"{:.1}\" y=\"{:.0}\">{label}</text>\n",
                left + x(end) + 4.0,
                y + 11.0
            );
        }
    }
    for (i, f) in setups.iter().enumerate() {
        let y = top + row * (cells.len() + i) as f64;
        s += &format!(
            "<text x=\"10\" y=\"{:.0}\" fill=\"#c00\">{} failed: its restores were not tried</text>\n",
            y + 11.0,
            f.place()
        );
    }
    s += &format!(
        "<text x=\"{left}\" y=\"{:.0}\" fill=\"#555\">0 to {max:.1} s</text>\n</svg>\n",
        h - 12.0
    );
    s
}
