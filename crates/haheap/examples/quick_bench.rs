//! Quick cost check: µs per transaction for 0, 1, 8 and 32 pages per transaction on a
//! 10 MB heap, 4 writes of 8 bytes per page through `Heap::write`, every engine, diff
//! included, no backup (with `--backup`: shipped to an in-process backup over a unix
//! socket, synchronously). Each cell is the median of 5 batches (the machine is shared).
//!
//! `cargo run --release -p haheap --example quick_bench [-- --txs N] [--backup]`
//! The full benchmark (the talk's suite, with a backup) is in crates/haheap-bench.

use std::time::Instant;

use haheap::{BackupFailure, EngineKind, Heap, HeapConfig, ReplMode};

const HEAP: usize = 10 << 20;
const PAGE: usize = 4096;
const WPP: usize = 4;
const BATCHES: usize = 5;
const PPTS: [usize; 4] = [0, 1, 8, 32];

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let txs: usize = match args.iter().position(|a| a == "--txs") {
        Some(i) => args
            .get(i + 1)
            .ok_or_else(|| anyhow::anyhow!("--txs needs a number"))?
            .parse()?,
        None => 4000,
    };
    let with_backup = args.iter().any(|a| a == "--backup");
    let auto = Heap::create(HeapConfig::local(PAGE, EngineKind::Auto))?;
    println!("auto picks {}: {}", auto.engine(), auto.engine_reason());
    println!(
        "{txs} transactions per cell, 10 MB heap, {WPP} writes/page, {}; µs per transaction",
        if with_backup {
            "sync backup over a unix socket"
        } else {
            "no backup"
        }
    );
    println!(
        "{:<9} {:>8} {:>8} {:>8} {:>8}   at 32 pages: {:>8} {:>8} {:>8} {:>9}",
        "engine", "0 pages", "1 page", "8 pages", "32 pages", "collect", "diff", "ship", "bytes/tx"
    );
    let mut at32 = Vec::new();
    for engine in EngineKind::CONCRETE {
        // A fresh backup per engine: a replica serves one fresh heap.
        let dir = tempfile::tempdir()?;
        let backup = if with_backup {
            let ep = format!("unix:{}", dir.path().join("b.sock").display()).parse()?;
            let cfg = hareplica::BackupConfig::new(ep, &dir.path().join("replica"));
            Some(hareplica::BackupServer::bind(cfg)?.0.spawn())
        } else {
            None
        };
        let cfg = HeapConfig {
            size: HEAP,
            engine,
            backup: backup.as_ref().map(|b| b.endpoint().to_string()),
            mode: ReplMode::Sync,
            on_backup_failure: BackupFailure::Fail,
            spin: haheap::Spin::PRIMARY,
        };
        let mut h = match Heap::create(cfg) {
            Ok(h) => h,
            Err(e) => {
                println!("{engine:<9} unavailable: {e}");
                continue;
            }
        };
        touch_all(&mut h)?;
        let mut row = Vec::new();
        let mut breakdown = (0.0, 0.0, 0.0, 0.0);
        for ppt in PPTS {
            let before = h.counters();
            let mut batches: Vec<f64> = (0..BATCHES)
                .map(|b| run(&mut h, ppt, txs / BATCHES, (ppt * 10 + b) as u64))
                .collect::<anyhow::Result<_>>()?;
            batches.sort_by(f64::total_cmp);
            row.push(batches[BATCHES / 2]);
            let c = h.counters();
            let n = (c.commits - before.commits) as f64;
            breakdown = (
                (c.collect_ns - before.collect_ns) as f64 / n / 1e3,
                (c.diff_ns - before.diff_ns) as f64 / n / 1e3,
                (c.ship_ns - before.ship_ns) as f64 / n / 1e3,
                (c.bytes_shipped - before.bytes_shipped) as f64 / n,
            );
        }
        at32.push((engine, row[3]));
        println!(
            "{:<9} {:>8.2} {:>8.2} {:>8.2} {:>8.2}   at 32 pages: {:>8.2} {:>8.2} {:>8.2} {:>9.0}",
            engine.name(),
            row[0],
            row[1],
            row[2],
            row[3],
            breakdown.0,
            breakdown.1,
            breakdown.2,
            breakdown.3
        );
    }
    if let Some(&(_, mp)) = at32.iter().find(|(e, _)| *e == EngineKind::Mprotect) {
        let ratios: Vec<String> = at32
            .iter()
            .map(|(e, us)| format!("{e} {:.1}x", mp / us))
            .collect();
        println!(
            "speed-up over mprotect at 32 pages/tx: {}",
            ratios.join(", ")
        );
    }
    Ok(())
}

/// One transaction writing every page, so first-touch faults are not measured.
fn touch_all(h: &mut Heap) -> anyhow::Result<()> {
    h.tstart()?;
    for p in 0..h.len() / PAGE {
        h.write(p * PAGE, &[1])?;
    }
    h.tend()?;
    Ok(())
}

/// Mean µs per transaction over `txs` transactions of `ppt` distinct random pages.
fn run(h: &mut Heap, ppt: usize, txs: usize, seed: u64) -> anyhow::Result<f64> {
    let pages = h.len() / PAGE;
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut chosen = Vec::with_capacity(ppt);
    let start = Instant::now();
    for _ in 0..txs {
        chosen.clear();
        while chosen.len() < ppt {
            let p = rng.usize(0..pages);
            if !chosen.contains(&p) {
                chosen.push(p);
            }
        }
        h.tstart()?;
        for &p in &chosen {
            for _ in 0..WPP {
                let off = p * PAGE + rng.usize(0..PAGE / 8) * 8;
                h.write(off, &rng.u64(..).to_le_bytes())?;
            }
        }
        h.tend()?;
    }
    Ok(start.elapsed().as_secs_f64() * 1e6 / txs as f64)
}
