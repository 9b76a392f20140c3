//! Fault injection: a primary child process runs transactions against a backup process;
//! we SIGKILL the primary at a random moment, take over from the backup's replica in this
//! process, and require that the structure's invariants hold and that the replica equals
//! an exact replay of the acknowledged transactions (plus, possibly, the one in flight,
//! entirely). The taken-over heap must then go on committing. Two more scenarios SIGKILL
//! and restart the backup under a running primary: one whose heap fails at once
//! (`BackupFailure::Fail`) and retries, and one whose heap blocks in `tend` until the
//! backup is back (`BackupFailure::Block`).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use haheap::{BackupFailure, EngineKind, Heap, HeapConfig, ReplMode};
use haheap_ds::{Ds, SplitMix64};
use serde::Serialize;

use crate::backup::{Backup, BackupKind};
use crate::heapmem::{HeapMem, SliceMem};
use crate::primary::mono_ns;
use crate::workload::{apply, Replay};

#[derive(Debug, Clone)]
pub struct FaultArgs {
    pub trials: usize,
    pub engines: Vec<EngineKind>,
    pub structures: Vec<Ds>,
    pub seed: u64,
    pub opt: usize,
    pub heap_kb: usize,
    pub min_ms: u64,
    pub max_ms: u64,
    pub backup_restart: bool,
    pub backup_bin: PathBuf,
    /// Asynchronous replication with this lag bound (None: synchronous).
    pub max_lag: Option<u32>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Trial {
    pub scenario: &'static str,
    pub engine: String,
    pub structure: &'static str,
    pub seed: u64,
    pub killed_after_ms: u64,
    /// Last transaction the primary printed as acknowledged.
    pub acked: u64,
    /// Last transaction in the replica.
    pub replica_tx: u64,
    /// The in-flight transaction was in the replica (entirely).
    pub in_flight_present: bool,
    pub keys: usize,
    /// Failures the primary reported while the backup was down (restart scenarios).
    pub primary_failures: u64,
    /// Block scenario: how long the backup was dead, and how long the primary's
    /// transaction that spanned the restart took.
    pub down_ms: u64,
    pub blocked_ms: u64,
    pub ok: bool,
    pub error: Option<String>,
}

/// What the primary child does when its backup is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OnDown {
    /// Exit with the error.
    Exit,
    /// Print `fail` and retry (the heap fails at once).
    Retry,
    /// The heap blocks in `tend` (failures are still printed, and must not happen).
    Block,
}

/// How long a blocking primary may wait for its backup.
const BLOCK_SECS: u64 = 30;

/// Acknowledgements counted from a moment on, by the time the primary printed with each.
#[derive(Default)]
struct AckedAfter {
    since: Option<u64>,
    count: u64,
}

impl AckedAfter {
    fn saw(&mut self, at: u64) {
        if self.since.is_some_and(|t| at > t) {
            self.count += 1;
        }
    }
}

/// The primary child and the reader of its stdout.
struct Primary {
    child: Child,
    acked: Arc<AtomicU64>,
    /// How many transactions were acknowledged after a given moment (see
    /// `count_acks_after`).
    acked_after: Arc<Mutex<AckedAfter>>,
    fails: Arc<AtomicU64>,
    /// `blocked` lines: (tx, start, end) in CLOCK_MONOTONIC ns.
    blocked: Arc<Mutex<Vec<(u64, u64, u64)>>>,
    reader: Option<JoinHandle<()>>,
}

impl Primary {
    fn spawn(
        a: &FaultArgs,
        engine: EngineKind,
        ds: Ds,
        seed: u64,
        ep: &str,
        on_down: OnDown,
        log: PathBuf,
    ) -> Result<Primary> {
        let exe = std::env::current_exe().context("locating this binary")?;
        let mut cmd = Command::new(exe);
        cmd.args([
            "primary",
            "--engine",
            engine.name(),
            "--backup",
            ep,
            "--structure",
            ds.name,
        ])
        .args(["--seed", &seed.to_string(), "--opt", &a.opt.to_string()])
        .args(["--heap-kb", &a.heap_kb.to_string()]);
        if on_down != OnDown::Exit {
            cmd.arg("--retry");
        }
        if on_down == OnDown::Block {
            cmd.args(["--block-secs", &BLOCK_SECS.to_string()]);
        }
        if let Some(n) = a.max_lag {
            cmd.args(["--max-lag", &n.to_string()]);
        }
        let stderr = std::fs::File::create(&log).context("primary log file")?;
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .context("spawning the primary")?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| anyhow!("primary stdout"))?;
        let (acked, fails) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let blocked = Arc::new(Mutex::new(Vec::new()));
        let acked_after = Arc::new(Mutex::new(AckedAfter::default()));
        let (a2, f2, b2) = (Arc::clone(&acked), Arc::clone(&fails), Arc::clone(&blocked));
        let aa2 = Arc::clone(&acked_after);
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(rest) = line.strip_prefix("ack ") {
                    let v: Vec<u64> = rest.split(' ').filter_map(|s| s.parse().ok()).collect();
                    if let [n, at] = v[..] {
                        a2.store(n, Ordering::SeqCst);
                        aa2.lock().unwrap_or_else(|e| e.into_inner()).saw(at);
                    }
                } else if line.starts_with("fail ") {
                    f2.fetch_add(1, Ordering::SeqCst);
                } else if let Some(rest) = line.strip_prefix("blocked ") {
                    let v: Vec<u64> = rest.split(' ').filter_map(|s| s.parse().ok()).collect();
                    if let [tx, start, end] = v[..] {
                        b2.lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push((tx, start, end));
                    }
                }
            }
        });
        Ok(Primary {
            child,
            acked,
            acked_after,
            fails,
            blocked,
            reader: Some(reader),
        })
    }

    fn acked(&self) -> u64 {
        self.acked.load(Ordering::SeqCst)
    }

    /// From now on, count the transactions acknowledged after `t` (CLOCK_MONOTONIC ns).
    /// Lines still in the pipe are judged by their own time, not by when they are read.
    fn count_acks_after(&self, t: u64) {
        *self.acked_after.lock().unwrap_or_else(|e| e.into_inner()) = AckedAfter {
            since: Some(t),
            count: 0,
        };
    }

    fn acks_after(&self) -> u64 {
        self.acked_after
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .count
    }

    /// Waits until the primary acknowledged `n` transactions.
    fn wait_acked(&mut self, n: u64, limit: Duration) -> Result<()> {
        let t0 = Instant::now();
        while self.acked() < n {
            if let Some(st) = self.child.try_wait()? {
                bail!(
                    "primary exited ({st}) after {} acknowledged transactions",
                    self.acked()
                );
            }
            if t0.elapsed() > limit {
                bail!(
                    "primary acknowledged only {} of {n} transactions in {limit:?}",
                    self.acked()
                );
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(())
    }

    /// SIGKILLs the primary (it must still be running) and returns the last ack it printed.
    fn kill(mut self) -> Result<u64> {
        if let Some(st) = self.child.try_wait()? {
            bail!("primary had already exited ({st}) before the kill");
        }
        self.child.kill().context("SIGKILL of the primary")?;
        self.child.wait().context("reaping the primary")?;
        if let Some(r) = self.reader.take() {
            r.join().map_err(|_| anyhow!("stdout reader panicked"))?;
        }
        Ok(self.acked())
    }
}

impl Drop for Primary {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Takes over from the backup (retrying while it still sees the dead primary's session),
/// checks invariants and replay equality, then commits a few more transactions.
fn take_over_and_verify(
    t: &mut Trial,
    a: &FaultArgs,
    engine: EngineKind,
    ds: Ds,
    ep: &str,
) -> Result<()> {
    let cfg = HeapConfig {
        size: 0,
        engine,
        backup: Some(ep.to_string()),
        mode: ReplMode::Sync,
        on_backup_failure: BackupFailure::Fail,
        spin: haheap::Spin::PRIMARY,
    };
    let t0 = Instant::now();
    let mut heap = loop {
        match Heap::takeover(cfg.clone()) {
            Ok(h) => break h,
            Err(e) if t0.elapsed() < Duration::from_secs(10) => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(anyhow!(e).context("takeover")),
        }
    };
    t.replica_tx = heap.committed_tx_id();
    if t.replica_tx != t.acked && t.replica_tx != t.acked + 1 {
        bail!(
            "replica holds {} transactions, primary acknowledged {}",
            t.replica_tx,
            t.acked
        );
    }
    t.in_flight_present = t.replica_tx == t.acked + 1;
    let keys =
        (ds.check)(&SliceMem(heap.as_slice())).map_err(|e| anyhow!("check after takeover: {e}"))?;
    t.keys = keys.len();
    let mut replay = Replay::new(ds, heap.len(), t.seed, a.opt);
    replay.advance_to(t.replica_tx)?;
    if replay.mem.0 != heap.as_slice() {
        let first = replay
            .mem
            .0
            .iter()
            .zip(heap.as_slice())
            .position(|(x, y)| x != y);
        bail!(
            "replica differs from a replay of its {} transactions at byte {first:?}",
            t.replica_tx
        );
    }
    // The new primary continues.
    for tx in t.replica_tx + 1..=t.replica_tx + 5 {
        heap.tstart()?;
        let mut m = HeapMem::new(&mut heap);
        apply(&mut m, ds, t.seed, tx, a.opt)?;
        if let Some(e) = m.failed.take() {
            return Err(anyhow!(e).context("store after takeover"));
        }
        heap.tend()
            .with_context(|| format!("commit of tx {tx} after takeover"))?;
    }
    replay.advance_to(t.replica_tx + 5)?;
    if replay.mem.0 != heap.as_slice() {
        bail!("after takeover, 5 more transactions do not match their replay");
    }
    (ds.check)(&SliceMem(heap.as_slice())).map_err(|e| anyhow!("check after continuing: {e}"))?;
    Ok(())
}

fn trial(a: &FaultArgs, scenario: &'static str, engine: EngineKind, ds: Ds, seed: u64) -> Trial {
    let mut t = Trial {
        scenario,
        engine: engine.to_string(),
        structure: ds.name,
        seed,
        killed_after_ms: 0,
        acked: 0,
        replica_tx: 0,
        in_flight_present: false,
        keys: 0,
        primary_failures: 0,
        down_ms: 0,
        blocked_ms: 0,
        ok: false,
        error: None,
    };
    let r = match scenario {
        "kill-primary" => kill_primary(&mut t, a, engine, ds),
        "restart-backup-block" => restart_backup(&mut t, a, engine, ds, OnDown::Block),
        _ => restart_backup(&mut t, a, engine, ds, OnDown::Retry),
    };
    match r {
        Ok(()) => t.ok = true,
        Err(e) => t.error = Some(rebound_errors::chain(e.as_ref())),
    }
    t
}

fn kill_primary(t: &mut Trial, a: &FaultArgs, engine: EngineKind, ds: Ds) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let backup = Backup::start(&BackupKind::Process(a.backup_bin.clone()), dir.path())?;
    let mut p = Primary::spawn(
        a,
        engine,
        ds,
        t.seed,
        backup.endpoint(),
        OnDown::Exit,
        dir.path().join("primary.log"),
    )?;
    p.wait_acked(1, Duration::from_secs(20))?;
    let mut rng = SplitMix64::new(t.seed);
    t.killed_after_ms = a.min_ms + rng.below(a.max_ms.saturating_sub(a.min_ms).max(1));
    std::thread::sleep(Duration::from_millis(t.killed_after_ms));
    t.acked = p.kill().inspect_err(|_| dump_log(dir.path()))?;
    take_over_and_verify(t, a, engine, ds, backup.endpoint())
}

/// SIGKILLs the backup under a running primary and restarts it 300 ms later. `Retry`: the
/// primary must report failures and get through after the restart. `Block`: it must
/// report none; one of its transactions must span the restart (it waited for the backup).
fn restart_backup(
    t: &mut Trial,
    a: &FaultArgs,
    engine: EngineKind,
    ds: Ds,
    on_down: OnDown,
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut backup = Backup::start(&BackupKind::Process(a.backup_bin.clone()), dir.path())?;
    let mut p = Primary::spawn(
        a,
        engine,
        ds,
        t.seed,
        backup.endpoint(),
        on_down,
        dir.path().join("primary.log"),
    )?;
    p.wait_acked(30, Duration::from_secs(20))?;
    backup.kill()?;
    let killed = mono_ns();
    p.count_acks_after(killed);
    std::thread::sleep(Duration::from_millis(300));
    // One transaction may have had its ack in hand when the backup died, and async mode
    // lets `max_lag` more through without one.
    let after = p.acks_after();
    if after > 1 + u64::from(a.max_lag.unwrap_or(0)) {
        bail!("the primary acknowledged {after} transactions while its backup was dead");
    }
    let during = p.acked();
    t.primary_failures = p.fails.load(Ordering::SeqCst);
    match on_down {
        OnDown::Block if t.primary_failures > 0 => bail!(
            "the blocking primary reported {} failures while its backup was dead",
            t.primary_failures
        ),
        OnDown::Retry if t.primary_failures == 0 => {
            bail!("the primary reported no failure while its backup was dead")
        }
        _ => {}
    }
    if let Some(st) = p.child.try_wait()? {
        bail!("the primary exited ({st}) while its backup was dead");
    }
    let restarted = mono_ns();
    backup.restart()?;
    p.wait_acked(during + 30, Duration::from_secs(30))
        .inspect_err(|_| dump_log(dir.path()))?;
    t.down_ms = (restarted - killed) / 1_000_000;
    if on_down == OnDown::Block {
        t.primary_failures = p.fails.load(Ordering::SeqCst);
        if t.primary_failures > 0 {
            bail!(
                "the blocking primary reported {} failures",
                t.primary_failures
            );
        }
        let blocked = p.blocked.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let (_, start, end) = blocked
            .iter()
            .copied()
            .find(|&(_, s, e)| s < restarted && e > restarted)
            .ok_or_else(|| {
                anyhow!(
                    "no transaction of the primary waited across the backup's restart (slow ones: {blocked:?})"
                )
            })?;
        t.blocked_ms = (end - start) / 1_000_000;
    }
    t.killed_after_ms = 0;
    t.acked = p.kill()?;
    take_over_and_verify(t, a, engine, ds, backup.endpoint())
}

fn dump_log(dir: &std::path::Path) {
    for f in ["primary.log", "backup.log"] {
        if let Ok(s) = std::fs::read_to_string(dir.join(f)) {
            eprintln!("--- {f}:\n{s}");
        }
    }
}

pub fn run(a: &FaultArgs) -> Vec<Trial> {
    let mut out = Vec::new();
    for (ei, &engine) in a.engines.iter().enumerate() {
        for i in 0..a.trials {
            let ds = a.structures[(ei * a.trials + i) % a.structures.len()];
            let seed =
                a.seed ^ ((ei as u64) << 40) ^ (i as u64).wrapping_mul(0x2545_f491_4f6c_dd1d);
            let t = trial(a, "kill-primary", engine, ds, seed);
            report(&t);
            out.push(t);
        }
        if a.backup_restart {
            for (k, sc) in ["restart-backup", "restart-backup-block"]
                .into_iter()
                .enumerate()
            {
                let ds = a.structures[(ei + k) % a.structures.len()];
                let seed = a.seed ^ 0xb00 ^ ei as u64 ^ ((k as u64) << 20);
                let t = trial(a, sc, engine, ds, seed);
                report(&t);
                out.push(t);
            }
        }
    }
    out
}

fn report(t: &Trial) {
    let when = match t.scenario {
        "kill-primary" => format!("killed after {:>4} ms", t.killed_after_ms),
        "restart-backup-block" => format!("blocked {:>4} ms of {:>3}", t.blocked_ms, t.down_ms),
        _ => format!("{:>3} primary failures", t.primary_failures),
    };
    eprintln!(
        "  {:<20} {:<8} {:<13} {when}: acked {:>5}, replica {:>5}{} {} keys, {}",
        t.scenario,
        t.engine,
        t.structure,
        t.acked,
        t.replica_tx,
        if t.in_flight_present {
            " (+in-flight)"
        } else {
            ""
        },
        t.keys,
        match &t.error {
            None => "ok".to_string(),
            Some(e) => format!("FAILED: {e}"),
        }
    );
}

pub fn summary(trials: &[Trial]) -> Vec<String> {
    let mut engines: Vec<&str> = trials.iter().map(|t| t.engine.as_str()).collect();
    engines.dedup();
    let mut out = Vec::new();
    for e in engines {
        for sc in ["kill-primary", "restart-backup", "restart-backup-block"] {
            let ts: Vec<&Trial> = trials
                .iter()
                .filter(|t| t.engine == e && t.scenario == sc)
                .collect();
            if ts.is_empty() {
                continue;
            }
            let ok = ts.iter().filter(|t| t.ok).count();
            let inflight = ts.iter().filter(|t| t.in_flight_present).count();
            let how = match sc {
                "restart-backup" => "tend failed cleanly while the backup was dead, retried; ",
                "restart-backup-block" => {
                    "tend blocked across the backup's restart, no failure reported; "
                }
                _ => "",
            };
            out.push(crate::report::verdict(
                ok == ts.len(),
                &format!(
                    "{e} {sc}: {ok}/{} trials: {how}invariants hold, replica == replay of acknowledged txs ({inflight} with the in-flight tx present entirely), takeover continues",
                    ts.len()
                ),
            ));
        }
    }
    out
}
