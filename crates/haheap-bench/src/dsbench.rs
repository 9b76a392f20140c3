//! The talk's data-structure suite on a haheap heap: for each structure, `ops` inserts
//! then `ops` deletes, `opt` operations per transaction, every engine, with and without
//! a backup.

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use haheap::{BackupFailure, EngineKind, Heap, HeapConfig, ReplMode};
use haheap_ds::{stats::keys, Ds, Kind, SplitMix64};
use serde::Serialize;

use crate::backup::{Backup, BackupKind};
use crate::heapmem::HeapMem;
use crate::report::ratio;

#[derive(Debug, Clone)]
pub struct DsArgs {
    pub ops: usize,
    pub heap_mb: usize,
    pub opts: Vec<usize>,
    pub engines: Vec<EngineKind>,
    pub structures: Vec<Ds>,
    pub backup: Vec<bool>,
    pub seed: u64,
    /// Busy-poll before blocking, in the primary and the backup (zero: off).
    pub spin: haheap::Spin,
}

#[derive(Debug, Clone, Serialize)]
pub struct DsCell {
    pub structure: &'static str,
    pub op: &'static str,
    pub opt: usize,
    pub engine: String,
    pub backup: bool,
    pub txs: usize,
    pub us_per_tx: f64,
    pub speedup_vs_mprotect: f64,
    pub pages_per_tx: f64,
    pub writes_per_tx: f64,
    pub written_bytes_per_tx: f64,
    pub shipped_bytes_per_tx: f64,
}

/// Runs one operation batch as a transaction; returns (time, pages, writes, bytes, shipped).
fn tx(
    heap: &mut Heap,
    f: impl FnOnce(&mut HeapMem) -> Result<()>,
) -> Result<(Duration, usize, u64, u64, u64)> {
    let t0 = Instant::now();
    heap.tstart()?;
    let mut m = HeapMem::new(heap);
    f(&mut m)?;
    let (w, b, failed) = (m.writes, m.bytes, m.failed.take());
    if let Some(e) = failed {
        return Err(anyhow!(e).context("a structure store failed"));
    }
    let st = heap.tend()?;
    Ok((t0.elapsed(), st.pages, w, b, st.bytes_shipped as u64))
}

fn phase(heap: &mut Heap, ds: Ds, op: &'static str, batches: &[Vec<u64>]) -> Result<DsCell> {
    let (mut t, mut pages, mut writes, mut bytes, mut shipped) = (Duration::ZERO, 0, 0, 0, 0);
    for batch in batches {
        let r = tx(heap, |m| {
            for &k in batch {
                match op {
                    "insert" => {
                        (ds.insert)(m, k)?;
                    }
                    _ => {
                        if (ds.delete)(m, k)?.is_none() {
                            bail!("{}: delete of {k} found nothing", ds.name);
                        }
                    }
                }
            }
            Ok(())
        })?;
        t += r.0;
        pages += r.1;
        writes += r.2;
        bytes += r.3;
        shipped += r.4;
    }
    let n = batches.len() as f64;
    Ok(DsCell {
        structure: ds.name,
        op,
        opt: batches.first().map_or(0, |b| b.len()),
        engine: heap.engine().to_string(),
        backup: false,
        txs: batches.len(),
        us_per_tx: t.as_secs_f64() * 1e6 / n,
        speedup_vs_mprotect: 0.0,
        pages_per_tx: pages as f64 / n,
        writes_per_tx: writes as f64 / n,
        written_bytes_per_tx: bytes as f64 / n,
        shipped_bytes_per_tx: shipped as f64 / n,
    })
}

fn run_one(
    a: &DsArgs,
    ds: Ds,
    engine: EngineKind,
    opt: usize,
    backup: Option<&Backup>,
) -> Result<[DsCell; 2]> {
    let cfg = HeapConfig {
        size: a.heap_mb << 20,
        engine,
        backup: backup.map(|b| b.endpoint().to_string()),
        mode: ReplMode::Sync,
        on_backup_failure: BackupFailure::Fail,
        spin: a.spin,
    };
    let mut heap = Heap::create(cfg).with_context(|| format!("creating a {engine} heap"))?;
    tx(&mut heap, |m| Ok((ds.init)(m)?))?;
    let ks = keys(a.seed, a.ops);
    let mut order = ks.clone();
    let mut rng = SplitMix64::new(a.seed ^ 0xde1e7e);
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i as u64 + 1) as usize);
    }
    if ds.kind != Kind::Set {
        order.iter_mut().for_each(|k| *k = 0); // delete-min / dequeue
    }
    let ins: Vec<Vec<u64>> = ks.chunks(opt).map(<[u64]>::to_vec).collect();
    let del: Vec<Vec<u64>> = order.chunks(opt).map(<[u64]>::to_vec).collect();
    let mut c1 = phase(&mut heap, ds, "insert", &ins)?;
    let mut c2 = phase(&mut heap, ds, "delete", &del)?;
    let left = (ds.check)(&crate::heapmem::SliceMem(heap.as_slice()))
        .map_err(|e| anyhow!("{}: check after the run: {e}", ds.name))?;
    if !left.is_empty() {
        bail!("{}: {} keys left after deleting all", ds.name, left.len());
    }
    c1.backup = backup.is_some();
    c2.backup = backup.is_some();
    Ok([c1, c2])
}

pub fn run(a: &DsArgs, backup_kind: &BackupKind) -> Result<Vec<DsCell>> {
    let mut cells = Vec::new();
    for &ds in &a.structures {
        for &opt in &a.opts {
            for &with_backup in &a.backup {
                let mut group: Vec<DsCell> = Vec::new();
                for &engine in &a.engines {
                    let dir = tempfile::tempdir().context("temp dir for the backup")?;
                    let backup = match with_backup {
                        true => Some(Backup::start_spinning(backup_kind, dir.path(), a.spin)?),
                        false => None,
                    };
                    let r = run_one(a, ds, engine, opt, backup.as_ref())
                        .with_context(|| format!("{} opt {opt} {engine}", ds.name))?;
                    eprintln!(
                        "  ds {:<13} opt={} {:<8} backup={:<5} insert {:>8.2} us/tx, delete {:>8.2} us/tx",
                        ds.name, opt, r[0].engine, with_backup, r[0].us_per_tx, r[1].us_per_tx
                    );
                    group.extend(r);
                }
                for op in ["insert", "delete"] {
                    let base = group
                        .iter()
                        .find(|c| c.op == op && c.engine == "mprotect")
                        .map(|c| c.us_per_tx);
                    for c in group.iter_mut().filter(|c| c.op == op) {
                        c.speedup_vs_mprotect = base.map_or(0.0, |b| ratio(b, c.us_per_tx));
                    }
                }
                cells.extend(group);
            }
        }
    }
    Ok(cells)
}

pub fn table(cells: &[DsCell]) -> String {
    let mut s = format!(
        "{:<14}{:<7}{:>4} {:<7}{:<9}{:>10}{:>9}{:>8}{:>9}{:>11}{:>11}\n",
        "structure",
        "op",
        "opt",
        "backup",
        "engine",
        "us/tx",
        "x mprot",
        "pages",
        "writes",
        "written B",
        "shipped B"
    );
    for c in cells {
        s += &format!(
            "{:<14}{:<7}{:>4} {:<7}{:<9}{:>10.2}{:>9.2}{:>8.2}{:>9.1}{:>11.0}{:>11.0}\n",
            c.structure,
            c.op,
            c.opt,
            if c.backup { "yes" } else { "no" },
            c.engine,
            c.us_per_tx,
            c.speedup_vs_mprotect,
            c.pages_per_tx,
            c.writes_per_tx,
            c.written_bytes_per_tx,
            c.shipped_bytes_per_tx
        );
    }
    s
}

/// Bytes shipped against bytes written, per engine with a backup.
pub fn goals(cells: &[DsCell]) -> Vec<String> {
    let mut engines: Vec<&str> = cells.iter().map(|c| c.engine.as_str()).collect();
    engines.sort_unstable();
    engines.dedup();
    let mut out = Vec::new();
    for e in engines {
        let with: Vec<&DsCell> = cells.iter().filter(|c| c.backup && c.engine == e).collect();
        if with.is_empty() {
            continue;
        }
        let shipped: f64 = with
            .iter()
            .map(|c| c.shipped_bytes_per_tx * c.txs as f64)
            .sum();
        let written: f64 = with
            .iter()
            .map(|c| c.written_bytes_per_tx * c.txs as f64)
            .sum();
        let worst = with
            .iter()
            .max_by(|a, b| {
                ratio(a.shipped_bytes_per_tx, a.written_bytes_per_tx)
                    .total_cmp(&ratio(b.shipped_bytes_per_tx, b.written_bytes_per_tx))
            })
            .expect("non-empty");
        let wr = ratio(worst.shipped_bytes_per_tx, worst.written_bytes_per_tx);
        let all = ratio(shipped, written);
        out.push(crate::report::verdict(
            all <= 2.0,
            &format!("ds suite, {e}: bytes shipped / bytes written = {all:.2} summed over all runs with a backup (goal <= 2)"),
        ));
        out.push(crate::report::verdict(
            wr <= 2.0,
            &format!(
                "ds suite, {e}: worst run {wr:.2}: {} {} opt {} (goal <= 2 in every run)",
                worst.structure, worst.op, worst.opt
            ),
        ));
    }
    out
}
