//! The primary of a fault trial (a child process): runs the workload's transactions on a
//! replicated heap and prints `ack N` after transaction N's `tend` returned, i.e. after
//! the backup acknowledged it (asynchronous mode: once at most `max_lag` transactions
//! were unacknowledged). With `retry`, replication failures are printed as
//! `fail N: ...` and the transaction is retried until the backup is back.

use std::io::Write;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use haheap::{EngineKind, Error, Heap, HeapConfig, ReplError, ReplMode};
use haheap_ds::Ds;

use crate::heapmem::HeapMem;
use crate::workload::apply;

pub struct PrimaryArgs {
    pub engine: EngineKind,
    pub backup: String,
    pub ds: Ds,
    pub seed: u64,
    pub opt: usize,
    pub heap_kb: usize,
    pub max_tx: u64,
    pub retry: bool,
    /// Asynchronous replication with this many unacknowledged transactions at most.
    pub max_lag: Option<u32>,
}

/// One transaction: start, apply, commit.
fn run_tx(heap: &mut Heap, a: &PrimaryArgs, tx: u64) -> Result<(), Error> {
    heap.tstart()?;
    let mut m = HeapMem::new(heap);
    if let Err(e) = apply(&mut m, a.ds, a.seed, tx, a.opt) {
        // The workload never fills the heap; this is a bug worth stopping for.
        eprintln!("primary: {e:#}");
        std::process::exit(3);
    }
    if let Some(e) = m.failed.take() {
        return Err(e);
    }
    heap.tend().map(|_| ())
}

pub fn run(a: &PrimaryArgs) -> Result<()> {
    let cfg = HeapConfig {
        size: a.heap_kb << 10,
        engine: a.engine,
        backup: Some(a.backup.clone()),
        mode: a
            .max_lag
            .map_or(ReplMode::Sync, |max_lag| ReplMode::Async { max_lag }),
    };
    let mut heap = Heap::create(cfg).context("creating the primary heap")?;
    let out = std::io::stdout();
    for tx in 1..=a.max_tx {
        loop {
            match run_tx(&mut heap, a, tx) {
                Ok(()) => break,
                Err(e) if a.retry => {
                    writeln!(out.lock(), "fail {tx}: {}", chain(&e))?;
                    if matches!(e, Error::Replication(ReplError::InDoubt { .. })) {
                        // Committed here and queued: wait for the backup's ack by calling
                        // tend again until it succeeds.
                        wait_for_ack(&mut heap, tx)?;
                        break;
                    }
                    // Rolled back (or refused before starting): redo the transaction.
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(anyhow!(e).context(format!("transaction {tx}"))),
            }
        }
        if heap.committed_tx_id() != tx {
            return Err(anyhow!(
                "heap says tx {} committed, expected {tx}",
                heap.committed_tx_id()
            ));
        }
        writeln!(out.lock(), "ack {tx}")?;
    }
    Ok(())
}

fn wait_for_ack(heap: &mut Heap, tx: u64) -> Result<()> {
    loop {
        std::thread::sleep(Duration::from_millis(20));
        match heap.tend() {
            Ok(_) => return Ok(()),
            Err(e) => writeln!(std::io::stdout().lock(), "fail {tx}: {}", chain(&e))?,
        }
    }
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s += ": ";
        s += &c.to_string();
        src = c.source();
    }
    s
}
