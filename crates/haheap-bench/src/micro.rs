//! The talk's microbenchmark: N transactions on a 10 MB heap, each writing `ppt` distinct
//! random pages with `wpp` 8-byte stores per page, for every engine, with and without a
//! backup (the full pipeline: find written pages, diff, ship, wait for the ack).

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use haheap::{BackupFailure, EngineKind, Heap, HeapConfig, ReplMode, Spin};
use haheap_ds::SplitMix64;
use serde::Serialize;

use crate::backup::{Backup, BackupKind};
use crate::report::{ratio, verdict};

#[derive(Debug, Clone)]
pub struct MicroArgs {
    pub txs: usize,
    pub heap_mb: usize,
    pub ppts: Vec<usize>,
    pub wpps: Vec<usize>,
    pub engines: Vec<EngineKind>,
    pub backup: Vec<bool>,
    pub seed: u64,
    /// Runs per cell; the median time is reported.
    pub repeat: usize,
    /// How the client and the backup wait, one configuration after another (interleaved).
    pub spins: Vec<Spin>,
}

/// One measured cell.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    pub engine: String,
    /// The `--spin-us` configuration: "auto", "0" or µs.
    pub spin: String,
    pub backup: bool,
    pub ppt: usize,
    pub wpp: usize,
    pub txs: usize,
    pub us_per_tx: f64,
    /// mprotect's time / this engine's time for the same cell.
    pub speedup_vs_mprotect: f64,
    pub pages_per_tx: f64,
    pub written_bytes_per_tx: f64,
    /// Payload bytes without a backup; frame bytes sent with one.
    pub shipped_bytes_per_tx: f64,
    pub shipped_over_written: f64,
    /// Times of all repeats, µs per transaction.
    pub runs_us: Vec<f64>,
    /// Where tend's time went, µs per transaction: the engine's collection of written
    /// pages, the byte diff, shipping and waiting for the backup's ack. The rest of
    /// `us_per_tx` is the stores themselves, with their write faults.
    pub collect_us: f64,
    pub diff_us: f64,
    pub ship_us: f64,
    /// CPU time per transaction of this process (every thread: the stores, tend, a
    /// busy-polling wait, the uffd handler, a backup thread) and of a backup process.
    pub cpu_us: f64,
    pub backup_cpu_us: Option<f64>,
}

/// CPU time of every thread of process `pid` so far, in ns (the scheduler's own account,
/// `/proc/PID/task/*/schedstat`), or `None` when it cannot be read.
fn cpu_ns(pid: u32) -> Option<u64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut sum = 0;
    for t in tasks {
        let stat = std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok()?;
        sum += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(sum)
}

/// The run with the median time, carrying all runs' times.
fn median_run(mut runs: Vec<Cell>) -> Cell {
    runs.sort_by(|a, b| a.us_per_tx.total_cmp(&b.us_per_tx));
    let times: Vec<f64> = runs.iter().map(|c| c.us_per_tx).collect();
    let mut c = runs.swap_remove(runs.len() / 2);
    c.runs_us = times;
    c
}

/// Runs `txs` transactions of `ppt` x `wpp` stores on `heap`; returns the cell (without
/// the speedup, filled in later).
fn run_cell(
    heap: &mut Heap,
    (ppt, wpp, txs): (usize, usize, usize),
    seed: u64,
    backup_pid: Option<u32>,
) -> Result<Cell> {
    let page = heap.page_size();
    let pages = heap.len() / page;
    let log = !heap.engine().is_page_level();
    let mut rng = SplitMix64::new(seed);
    let mut plan: Vec<(usize, u64)> = Vec::with_capacity(ppt * wpp);
    let mut chosen: Vec<usize> = Vec::with_capacity(ppt);
    let (mut total, mut pages_sum, mut shipped, mut written) = (Duration::ZERO, 0usize, 0u64, 0u64);
    let before = heap.counters();
    let me = std::process::id();
    let cpu_before = (cpu_ns(me), backup_pid.and_then(cpu_ns));
    for _ in 0..txs {
        // Plan outside the timed part: distinct pages, random aligned offsets, new values.
        chosen.clear();
        while chosen.len() < ppt {
            let p = rng.below(pages as u64) as usize;
            if !chosen.contains(&p) {
                chosen.push(p);
            }
        }
        plan.clear();
        for &p in &chosen {
            for _ in 0..wpp {
                let off = p * page + rng.below((page / 8) as u64) as usize * 8;
                plan.push((off, rng.next_u64() | 1));
            }
        }
        let t0 = Instant::now();
        heap.tstart()?;
        if log {
            for &(off, v) in &plan {
                heap.write(off, &v.to_le_bytes())?;
            }
        } else {
            let base = heap.as_mut_ptr();
            for &(off, v) in &plan {
                // SAFETY: off + 8 <= heap.len() by construction (page < pages, offset
                // within the page, 8-byte aligned); the mapping lives as long as `heap`.
                unsafe { (base.add(off) as *mut u64).write_volatile(v) };
            }
        }
        let st = heap.tend()?;
        total += t0.elapsed();
        pages_sum += st.pages;
        shipped += st.bytes_shipped as u64;
        written += (plan.len() * 8) as u64;
    }
    let n = txs as f64;
    let cpu_after = (cpu_ns(me), backup_pid.and_then(cpu_ns));
    let cpu = |a: Option<u64>, b: Option<u64>| Some((a? - b?) as f64 / 1e3 / n);
    let after = heap.counters();
    let per_tx = |a: u64, b: u64| (a - b) as f64 / 1e3 / n;
    Ok(Cell {
        engine: heap.engine().to_string(),
        spin: String::new(),
        backup: false,
        ppt,
        wpp,
        txs,
        us_per_tx: total.as_secs_f64() * 1e6 / n,
        speedup_vs_mprotect: 0.0,
        pages_per_tx: pages_sum as f64 / n,
        written_bytes_per_tx: written as f64 / n,
        shipped_bytes_per_tx: shipped as f64 / n,
        shipped_over_written: ratio(shipped as f64, written as f64),
        runs_us: Vec::new(),
        collect_us: per_tx(after.collect_ns, before.collect_ns),
        diff_us: per_tx(after.diff_ns, before.diff_ns),
        ship_us: per_tx(after.ship_ns, before.ship_ns),
        cpu_us: cpu(cpu_after.0, cpu_before.0).unwrap_or(f64::NAN),
        backup_cpu_us: cpu(cpu_after.1, cpu_before.1),
    })
}

/// Touches every page once in one (untimed) transaction so that first-touch faults and
/// the initial image transfer are not measured.
fn warm_up(heap: &mut Heap) -> Result<()> {
    let page = heap.page_size();
    heap.tstart()?;
    for p in 0..heap.len() / page {
        heap.write(p * page, &[1])?;
    }
    heap.tend()?;
    Ok(())
}

pub fn run(a: &MicroArgs, backup_kind: &BackupKind) -> Result<Vec<Cell>> {
    let mut cells = Vec::new();
    for &with_backup in &a.backup {
        for &ppt in &a.ppts {
            for &wpp in &a.wpps {
                // Repeats interleave the spin configurations and engines so that load
                // from other work on the machine falls on all of them alike; each keeps
                // its median run.
                let configs: Vec<(Spin, EngineKind)> = a
                    .spins
                    .iter()
                    .flat_map(|&s| a.engines.iter().map(move |&e| (s, e)))
                    .collect();
                let mut runs: Vec<Vec<Cell>> = vec![Vec::new(); configs.len()];
                for (ei, &(spin, engine)) in (0..a.repeat).flat_map(|_| configs.iter().enumerate())
                {
                    // A fresh backup per run: the heap announces itself as new.
                    let dir = tempfile::tempdir().context("temp dir for the backup")?;
                    let backup = match with_backup {
                        true => Some(Backup::start_spinning(backup_kind, dir.path(), spin)?),
                        false => None,
                    };
                    let cfg = HeapConfig {
                        size: a.heap_mb << 20,
                        engine,
                        backup: backup.as_ref().map(|b| b.endpoint().to_string()),
                        mode: ReplMode::Sync,
                        on_backup_failure: BackupFailure::Fail,
                        spin,
                    };
                    let mut heap =
                        Heap::create(cfg).with_context(|| format!("creating a {engine} heap"))?;
                    warm_up(&mut heap)?;
                    let seed = a.seed ^ ((ppt as u64) << 32) ^ ((wpp as u64) << 16);
                    let pid = backup.as_ref().and_then(Backup::pid);
                    let mut c = run_cell(&mut heap, (ppt, wpp, a.txs), seed, pid)
                        .with_context(|| format!("{engine} ppt {ppt} wpp {wpp}"))?;
                    c.backup = with_backup;
                    c.spin = crate::spin_name(spin);
                    drop(heap);
                    drop(backup);
                    eprintln!(
                        "  micro {:<8} spin={:<6} backup={:<5} ppt={:<2} wpp={:<2} {:>9.2} us/tx",
                        c.engine, c.spin, with_backup, ppt, wpp, c.us_per_tx
                    );
                    runs[ei].push(c);
                }
                let mut row: Vec<Cell> = runs.into_iter().map(median_run).collect();
                let bases: Vec<(String, f64)> = row
                    .iter()
                    .filter(|c| c.engine == "mprotect")
                    .map(|c| (c.spin.clone(), c.us_per_tx))
                    .collect();
                for c in &mut row {
                    let base = bases.iter().find(|(s, _)| *s == c.spin).map(|b| b.1);
                    c.speedup_vs_mprotect = base.map_or(0.0, |b| ratio(b, c.us_per_tx));
                }
                cells.extend(row);
            }
        }
    }
    Ok(cells)
}

pub fn table(cells: &[Cell]) -> String {
    let mut s = format!(
        "{:<7}{:>7}{:>4}{:>4}  {:<9}{:>10}{:>9}{:>9}{:>11}{:>11}{:>8}{:>9}{:>8}{:>8}{:>9}{:>9}\n",
        "backup",
        "spin",
        "ppt",
        "wpp",
        "engine",
        "us/tx",
        "x mprot",
        "pages",
        "written B",
        "shipped B",
        "ship/wr",
        "collect",
        "diff",
        "ship",
        "cpu",
        "bk cpu"
    );
    for c in cells {
        let bk = c.backup_cpu_us.map_or("-".into(), |v| format!("{v:.2}"));
        s += &format!(
            "{:<7}{:>7}{:>4}{:>4}  {:<9}{:>10.2}{:>9.2}{:>9.2}{:>11.0}{:>11.0}{:>8.2}{:>9.2}{:>8.2}{:>8.2}{:>9.2}{:>9}\n",
            if c.backup { "yes" } else { "no" },
            c.spin,
            c.ppt,
            c.wpp,
            c.engine,
            c.us_per_tx,
            c.speedup_vs_mprotect,
            c.pages_per_tx,
            c.written_bytes_per_tx,
            c.shipped_bytes_per_tx,
            c.shipped_over_written,
            c.collect_us,
            c.diff_us,
            c.ship_us,
            c.cpu_us,
            bk
        );
    }
    s
}

/// The goals, as PASS/FAIL lines (benchmark verdicts, not tests).
pub fn goals(cells: &[Cell]) -> Vec<String> {
    let mut out = Vec::new();
    let mut wpps: Vec<usize> = cells.iter().map(|c| c.wpp).collect();
    wpps.sort_unstable();
    wpps.dedup();
    let mut spins: Vec<&str> = cells.iter().map(|c| c.spin.as_str()).collect();
    spins.dedup();
    spins.sort_unstable();
    spins.dedup();
    for (spin, wpp) in spins
        .iter()
        .flat_map(|s| wpps.iter().map(move |w| (*s, *w)))
    {
        let at = |e: &str| {
            cells
                .iter()
                .find(|c| {
                    c.backup && c.ppt == 32 && c.wpp == wpp && c.engine == e && c.spin == spin
                })
                .map(|c| c.us_per_tx)
        };
        let Some(mp) = at("mprotect") else { continue };
        let best = ["uffd", "scan"]
            .into_iter()
            .filter_map(|e| at(e).map(|t| (e, t)))
            .min_by(|a, b| a.1.total_cmp(&b.1));
        if let Some((e, t)) = best {
            let x = ratio(mp, t);
            out.push(verdict(
                x >= 5.0,
                &format!(
                    "32 pages/tx, {wpp} writes/page, with backup, spin {spin}: best page-level engine {e} {t:.1} us vs mprotect {mp:.1} us = {x:.2}x (goal >= 5x)"
                ),
            ));
        }
    }
    out.extend(default_vs_poll(cells));
    let mut engines: Vec<&str> = cells.iter().map(|c| c.engine.as_str()).collect();
    engines.sort_unstable();
    engines.dedup();
    for e in engines {
        let with: Vec<&Cell> = cells.iter().filter(|c| c.backup && c.engine == e).collect();
        if with.is_empty() {
            continue;
        }
        let shipped: f64 = with.iter().map(|c| c.shipped_bytes_per_tx).sum();
        let written: f64 = with.iter().map(|c| c.written_bytes_per_tx).sum();
        let worst = with
            .iter()
            .max_by(|a, b| a.shipped_over_written.total_cmp(&b.shipped_over_written))
            .expect("non-empty");
        let all = ratio(shipped, written);
        out.push(verdict(
            all <= 2.0,
            &format!("{e}: bytes shipped / bytes written = {all:.2} summed over all cells with a backup (goal <= 2)"),
        ));
        out.push(verdict(
            worst.shipped_over_written <= 2.0,
            &format!(
                "{e}: worst cell {:.2} at {} pages x {} writes of 8 bytes (goal <= 2 in every cell)",
                worst.shipped_over_written, worst.ppt, worst.wpp
            ),
        ));
    }
    out
}

/// The default ("auto") against the longest busy-poll of the same run, for every engine
/// at 32 pages/tx with the backup: the default's time and its speedup over mprotect
/// within 20% of the busy-poll ones (issue 9).
fn default_vs_poll(cells: &[Cell]) -> Vec<String> {
    let poll = cells
        .iter()
        .filter_map(|c| c.spin.parse::<u64>().ok())
        .max()
        .filter(|&us| us > 0)
        .map(|us| us.to_string());
    let Some(poll) = poll else { return Vec::new() };
    let mut out = Vec::new();
    for d in cells
        .iter()
        .filter(|c| c.backup && c.ppt == 32 && c.spin == "auto")
    {
        let Some(p) = cells.iter().find(|c| {
            (c.backup, c.ppt, c.wpp, c.engine.as_str(), c.spin.as_str())
                == (true, 32, d.wpp, d.engine.as_str(), poll.as_str())
        }) else {
            continue;
        };
        let slower = d.us_per_tx / p.us_per_tx - 1.0;
        out.push(verdict(
            slower <= 0.2,
            &format!(
                "32 pages/tx, {} writes/page, {}: default {:.1} us ({:.1} us CPU) vs busy-poll {poll} us {:.1} us ({:.1} us CPU): {:+.0}% (goal <= +20%)",
                d.wpp, d.engine, d.us_per_tx, d.cpu_us, p.us_per_tx, p.cpu_us, slower * 100.0
            ),
        ));
        if d.engine != "mprotect" && p.speedup_vs_mprotect > 0.0 {
            let lost = 1.0 - d.speedup_vs_mprotect / p.speedup_vs_mprotect;
            out.push(verdict(
                lost <= 0.2,
                &format!(
                    "32 pages/tx, {} writes/page, {} vs mprotect: default {:.2}x vs busy-poll {:.2}x ({:.0}% lower; goal <= 20%)",
                    d.wpp, d.engine, d.speedup_vs_mprotect, p.speedup_vs_mprotect, lost * 100.0
                ),
            ));
        }
    }
    out
}
