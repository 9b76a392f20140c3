//! The primary of a fault trial (a child process): runs the workload's transactions on a
//! replicated heap and prints `ack N T` after transaction N's `tend` returned (at T,
//! CLOCK_MONOTONIC ns), i.e. after the backup acknowledged it (asynchronous mode: once at most `max_lag` transactions
//! were unacknowledged). With `retry`, replication failures are printed as
//! `fail N: ...` and the transaction is retried until the backup is back. With
//! `block`, the heap itself waits for a missing backup (`BackupFailure::Block`), and a
//! transaction that took longer than [`SLOW`] is printed as `blocked N START END`
//! (CLOCK_MONOTONIC nanoseconds, comparable with [`mono_ns`] in the parent).

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use haheap::{BackupFailure, EngineKind, Error, Heap, HeapConfig, ReplError, ReplMode};
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
    /// Block in `tend` up to this long while the backup is gone (None: fail at once).
    pub block: Option<Duration>,
}

/// Transactions slower than this are reported as `blocked` lines.
pub const SLOW: Duration = Duration::from_millis(50);

/// CLOCK_MONOTONIC in nanoseconds: one clock for the primary process and its parent.
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC)");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// One transaction: start, apply, commit.
fn run_tx(heap: &mut Heap, a: &PrimaryArgs, tx: u64) -> Result<(), Error> {
    heap.tstart()?;
    let mut m = HeapMem::new(heap);
    if let Err(e) = apply(&mut m, a.ds, a.seed, tx, a.opt) {
        // The workload never fills the heap; this is a bug worth stopping for.
        eprintln!("primary: {}", rebound_errors::chain(e.as_ref()));
        std::process::exit(3);
    }
    if let Some(e) = m.failed.take() {
        return Err(e);
    }
    heap.tend().map(|_| ())
}

pub fn run(a: &PrimaryArgs) -> Result<()> {
    let cfg =
        HeapConfig {
            size: a.heap_kb << 10,
            engine: a.engine,
            backup: Some(a.backup.clone()),
            mode: a
                .max_lag
                .map_or(ReplMode::Sync, |max_lag| ReplMode::Async { max_lag }),
            on_backup_failure: a.block.map_or(BackupFailure::Fail, |timeout| {
                BackupFailure::Block { timeout }
            }),
            spin: haheap::Spin::PRIMARY,
        };
    let mut heap = Heap::create(cfg).context("creating the primary heap")?;
    let out = std::io::stdout();
    for tx in 1..=a.max_tx {
        loop {
            let (start, t0) = (mono_ns(), Instant::now());
            let res = run_tx(&mut heap, a, tx);
            if t0.elapsed() > SLOW {
                writeln!(out.lock(), "blocked {tx} {start} {}", mono_ns())?;
            }
            match res {
                Ok(()) => break,
                Err(e) if a.retry => {
                    writeln!(out.lock(), "fail {tx}: {}", rebound_errors::chain(&e))?;
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
        writeln!(out.lock(), "ack {tx} {}", mono_ns())?;
    }
    Ok(())
}

fn wait_for_ack(heap: &mut Heap, tx: u64) -> Result<()> {
    loop {
        std::thread::sleep(Duration::from_millis(20));
        match heap.tend() {
            Ok(_) => return Ok(()),
            Err(e) => writeln!(
                std::io::stdout().lock(),
                "fail {tx}: {}",
                rebound_errors::chain(&e)
            )?,
        }
    }
}
