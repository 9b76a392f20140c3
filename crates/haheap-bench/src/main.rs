//! `rebound-ha-bench`: the hypervisor-assisted checkpointing talk's benchmarks for
//! haheap (microbenchmark, data-structure suite, write profile) and the fault-injection
//! harness (SIGKILL of the primary or the backup, takeover, invariants, exact replay).
//! Every run uses fixed seeds and prints the machine's facts with its results.

mod backup;
mod dsbench;
mod faults;
mod heapmem;
mod machine;
mod micro;
mod plot;
mod primary;
mod report;
mod workload;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use haheap::{EngineKind, Spin};
use haheap_ds::Ds;
use serde_json::json;

use backup::BackupKind;
use machine::Machine;

#[derive(Parser)]
#[command(
    name = "rebound-ha-bench",
    version,
    about = "Benchmarks and fault injection for Rebound's HA heap"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// The talk's microbenchmark: pages per transaction x writes per page, every engine.
    Micro(MicroCli),
    /// The data-structure suite on a heap: insert and delete, every engine.
    Ds(DsCli),
    /// Writes and pages per operation of each structure (the talk's table; no heap).
    DsWrites(DsWritesCli),
    /// Fault injection: SIGKILL the primary (and the backup), take over, verify.
    Faults(FaultsCli),
    /// Draws the SVG figure of a `micro` or `ds` result (a `--json`/`--json-out` file).
    Plot(PlotCli),
    /// (internal) The primary of a fault trial.
    #[command(hide = true)]
    Primary(PrimaryCli),
    /// (internal) A backup process running hareplica's server (same flags as `rebound-ha backup`).
    #[command(hide = true)]
    Backup(BackupCli),
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
enum WithBackup {
    Both,
    Yes,
    No,
}

impl WithBackup {
    fn list(self) -> Vec<bool> {
        match self {
            WithBackup::Both => vec![false, true],
            WithBackup::Yes => vec![true],
            WithBackup::No => vec![false],
        }
    }
}

#[derive(Args)]
struct Common {
    /// Engines to run, comma-separated (mprotect first: it is the baseline).
    #[arg(long, value_delimiter = ',', default_value = "mprotect,uffd,scan,log")]
    engines: Vec<String>,
    /// Run without a backup, with one, or both.
    #[arg(long, value_enum, default_value = "both")]
    backup: WithBackup,
    /// Run the backup as a separate process of this binary (`backup` mode) instead of a
    /// thread; with a path, run that `rebound-ha` binary instead.
    #[arg(long, num_args = 0..=1, default_missing_value = "self")]
    backup_process: Option<String>,
    /// Seed of every random choice.
    #[arg(long, default_value_t = 2009)]
    seed: u64,
    /// Print one JSON document on stdout instead of tables.
    #[arg(long)]
    json: bool,
    /// Also write the JSON document to this file.
    #[arg(long)]
    json_out: Option<PathBuf>,
    /// Also draw the results as an SVG figure in this file.
    #[arg(long)]
    svg: Option<PathBuf>,
}

impl Common {
    fn out(&self) -> Out<'_> {
        Out {
            json: self.json,
            json_out: self.json_out.as_ref(),
            svg: self.svg.as_ref(),
        }
    }
}

#[derive(Args)]
struct MicroCli {
    #[command(flatten)]
    common: Common,
    /// Transactions per cell and engine.
    #[arg(long, default_value_t = 10_000)]
    txs: usize,
    /// Heap size in MB.
    #[arg(long, default_value_t = 10)]
    heap_mb: usize,
    /// Pages per transaction.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32")]
    ppt: Vec<usize>,
    /// Writes per page.
    #[arg(long, value_delimiter = ',', default_value = "4,8,16")]
    wpp: Vec<usize>,
    /// Runs per cell, engines interleaved; the median is reported.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    repeat: u32,
    /// How the primary (for an Ack; the uffd handler for faults) and the backup (for the
    /// next frame) wait, comma-separated configurations run side by side: "auto" (the
    /// default of both: adaptive), 0 (never busy-poll), or µs to busy-poll always.
    #[arg(long, value_delimiter = ',', default_value = "auto", value_parser = parse_spin)]
    spin_us: Vec<Spin>,
}

/// `--spin-us`: "auto", or µs up to a second (0: off).
fn parse_spin(s: &str) -> Result<Spin, String> {
    if s == "auto" {
        return Ok(Spin::PRIMARY);
    }
    match s.parse::<u64>() {
        Ok(0) => Ok(Spin::Off),
        Ok(us) if us <= 1_000_000 => Ok(Spin::Fixed(Duration::from_micros(us))),
        _ => Err(format!("{s:?} is neither auto nor 0..=1000000 µs")),
    }
}

/// A `--spin-us` value as given.
pub fn spin_name(s: Spin) -> String {
    match s {
        Spin::Adaptive { .. } => "auto".into(),
        Spin::Off => "0".into(),
        Spin::Fixed(d) => d.as_micros().to_string(),
    }
}

#[derive(Args)]
struct DsCli {
    #[command(flatten)]
    common: Common,
    /// Operations per phase (insert, then delete).
    #[arg(long, default_value_t = 10_000)]
    ops: usize,
    /// Heap size in MB.
    #[arg(long, default_value_t = 10)]
    heap_mb: usize,
    /// Operations per transaction.
    #[arg(long, value_delimiter = ',', default_value = "1,5")]
    opt: Vec<usize>,
    /// Structures, comma-separated, or "all".
    #[arg(long, value_delimiter = ',', default_value = "all")]
    structures: Vec<String>,
    /// How the primary and the backup wait: "auto" (adaptive, the default), 0 (never
    /// busy-poll) or µs to busy-poll always.
    #[arg(long, default_value = "auto", value_parser = parse_spin)]
    spin_us: Spin,
}

#[derive(Args)]
struct DsWritesCli {
    /// Inserts, then as many deletes, per structure.
    #[arg(long, default_value_t = 10_000)]
    ops: usize,
    /// Seed of every random choice.
    #[arg(long, default_value_t = 2009)]
    seed: u64,
    /// Print one JSON document on stdout instead of tables.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct FaultsCli {
    /// SIGKILL trials per engine.
    #[arg(long, default_value_t = 20)]
    trials: usize,
    /// Engines to test, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "mprotect,uffd,scan,log")]
    engines: Vec<String>,
    /// Structures the trials cycle through, comma-separated, or "all".
    #[arg(long, value_delimiter = ',', default_value = "all")]
    structures: Vec<String>,
    /// Seed of every random choice (kill times, operations).
    #[arg(long, default_value_t = 2009)]
    seed: u64,
    /// Operations per transaction.
    #[arg(long, default_value_t = 3)]
    opt: usize,
    /// Heap size in KiB.
    #[arg(long, default_value_t = 1024)]
    heap_kb: usize,
    /// The kill comes a random time in [min-ms, max-ms) after the first acknowledgement.
    #[arg(long, default_value_t = 10)]
    min_ms: u64,
    #[arg(long, default_value_t = 400)]
    max_ms: u64,
    /// Replicate asynchronously (at most N unacknowledged transactions) instead of
    /// synchronously: the replica may then lag the primary's commits by up to N.
    #[arg(long)]
    max_lag: Option<u32>,
    /// Skip the backup kill-and-restart scenarios (fail-and-retry and blocking).
    #[arg(long)]
    no_backup_restart: bool,
    /// Run this `rebound-ha` binary as the backup instead of this binary's `backup` mode.
    #[arg(long)]
    rebound_ha: Option<PathBuf>,
    /// Print one JSON document on stdout instead of tables.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct PrimaryCli {
    #[arg(long)]
    engine: String,
    #[arg(long)]
    backup: String,
    #[arg(long)]
    structure: String,
    #[arg(long)]
    seed: u64,
    #[arg(long, default_value_t = 3)]
    opt: usize,
    #[arg(long, default_value_t = 1024)]
    heap_kb: usize,
    #[arg(long, default_value_t = u64::MAX)]
    max_tx: u64,
    /// Report replication failures and retry instead of exiting.
    #[arg(long)]
    retry: bool,
    /// Replicate asynchronously with at most this many unacknowledged transactions.
    #[arg(long)]
    max_lag: Option<u32>,
    /// While the backup is gone, block in tend for up to this many seconds (the heap's
    /// `BackupFailure::Block`) instead of failing at once.
    #[arg(long)]
    block_secs: Option<u64>,
}

#[derive(Args)]
struct PlotCli {
    /// A result document written by `micro` or `ds` with `--json` or `--json-out`.
    json: PathBuf,
    /// The SVG file to write.
    #[arg(long, short)]
    out: PathBuf,
}

#[derive(Args)]
struct BackupCli {
    #[arg(long)]
    listen: String,
    #[arg(long)]
    dir: PathBuf,
    #[arg(long)]
    durable: bool,
    /// "auto" (adaptive, the default), 0 (never busy-poll) or µs to busy-poll always.
    #[arg(long, default_value = "auto", value_parser = parse_spin)]
    spin_us: Spin,
}

fn engines(names: &[String]) -> Result<Vec<EngineKind>> {
    names
        .iter()
        .map(|n| match n.parse::<EngineKind>()? {
            EngineKind::Auto => Err(anyhow!(
                "name engines explicitly; auto is not a benchmark column"
            )),
            e => Ok(e),
        })
        .collect()
}

fn structures(names: &[String]) -> Result<Vec<Ds>> {
    if names.iter().any(|n| n == "all") {
        return Ok(haheap_ds::all().to_vec());
    }
    names
        .iter()
        .map(|n| {
            haheap_ds::by_name(n).ok_or_else(|| {
                let known: Vec<&str> = haheap_ds::all().iter().map(|d| d.name).collect();
                anyhow!("unknown structure {n:?} (known: {})", known.join(", "))
            })
        })
        .collect()
}

fn backup_kind(c: &Common) -> Result<BackupKind> {
    Ok(match c.backup_process.as_deref() {
        None => BackupKind::Thread,
        Some("self") => BackupKind::Process(std::env::current_exe()?),
        Some(p) => BackupKind::Process(PathBuf::from(p)),
    })
}

/// Where results go besides the terminal.
struct Out<'a> {
    /// JSON on stdout instead of tables.
    json: bool,
    /// JSON also to this file.
    json_out: Option<&'a PathBuf>,
    /// The figure to this SVG file.
    svg: Option<&'a PathBuf>,
}

/// Prints the results: JSON, or the machine line, the table and the goals.
fn emit(
    out: Out,
    command: &str,
    backup: &str,
    results: serde_json::Value,
    table: String,
    goals: &[String],
) -> Result<()> {
    let m = Machine::probe();
    let doc = json!({ "command": command, "machine": m, "backup": backup, "results": results, "goals": goals });
    if let Some(p) = out.json_out {
        std::fs::write(p, serde_json::to_string_pretty(&doc)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(p) = out.svg {
        plot::from_value("this run's results", doc.clone(), p)?;
    }
    if out.json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        println!("{}", m.line());
        println!("{command}");
        if !backup.is_empty() {
            println!("backup: {backup}");
        }
        print!("{table}");
        for g in goals {
            println!("{g}");
        }
    }
    Ok(())
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.cmd {
        Cmd::Micro(c) => {
            let kind = backup_kind(&c.common)?;
            let a = micro::MicroArgs {
                txs: c.txs,
                heap_mb: c.heap_mb,
                ppts: c.ppt,
                wpps: c.wpp,
                engines: engines(&c.common.engines)?,
                backup: c.common.backup.list(),
                seed: c.common.seed,
                repeat: c.repeat as usize,
                spins: c.spin_us,
            };
            eprintln!("{}", Machine::probe().line());
            let cells = micro::run(&a, &kind)?;
            let goals = micro::goals(&cells);
            let cmd = format!(
                "micro: {} tx, {} MB heap, seed {}, median of {} interleaved runs, spin {} us",
                a.txs,
                a.heap_mb,
                a.seed,
                a.repeat,
                a.spins
                    .iter()
                    .map(|&s| spin_name(s))
                    .collect::<Vec<_>>()
                    .join(",")
            );
            emit(
                c.common.out(),
                &cmd,
                &kind.describe(),
                serde_json::to_value(&cells)?,
                micro::table(&cells),
                &goals,
            )?;
        }
        Cmd::Ds(c) => {
            let kind = backup_kind(&c.common)?;
            let a = dsbench::DsArgs {
                ops: c.ops,
                heap_mb: c.heap_mb,
                opts: c.opt,
                engines: engines(&c.common.engines)?,
                structures: structures(&c.structures)?,
                backup: c.common.backup.list(),
                seed: c.common.seed,
                spin: c.spin_us,
            };
            eprintln!("{}", Machine::probe().line());
            let cells = dsbench::run(&a, &kind)?;
            let goals = dsbench::goals(&cells);
            let cmd = format!(
                "ds: {} ops per phase, {} MB heap, seed {}, spin {} us",
                a.ops,
                a.heap_mb,
                a.seed,
                spin_name(a.spin)
            );
            emit(
                c.common.out(),
                &cmd,
                &kind.describe(),
                serde_json::to_value(&cells)?,
                dsbench::table(&cells),
                &goals,
            )?;
        }
        Cmd::DsWrites(c) => {
            let mut profiles = Vec::new();
            for ds in haheap_ds::all() {
                profiles.push(
                    haheap_ds::stats::profile(ds, 16 << 20, c.ops, c.seed, 4096)
                        .map_err(|e| anyhow!("{}: {e}", ds.name))?,
                );
            }
            let results: Vec<serde_json::Value> = profiles
                .iter()
                .map(|p| {
                    let o = |x: &haheap_ds::stats::OpProfile| {
                        json!({"writes": {"avg": x.writes.avg, "min": x.writes.min, "max": x.writes.max},
                               "pages": {"avg": x.pages.avg, "min": x.pages.min, "max": x.pages.max},
                               "bytes_avg": x.bytes.avg})
                    };
                    json!({"structure": p.name, "insert": o(&p.insert), "delete": o(&p.delete)})
                })
                .collect();
            let cmd = format!(
                "ds-writes: {} inserts then {} deletes, seed {}, 4 KiB pages",
                c.ops, c.ops, c.seed
            );
            emit(
                Out {
                    json: c.json,
                    json_out: None,
                    svg: None,
                },
                &cmd,
                "",
                serde_json::Value::Array(results),
                haheap_ds::stats::table(&profiles),
                &[],
            )?;
        }
        Cmd::Plot(c) => {
            plot::from_file(&c.json, &c.out)?;
            eprintln!("wrote {}", c.out.display());
        }
        Cmd::Faults(c) => {
            let a = faults::FaultArgs {
                trials: c.trials,
                engines: engines(&c.engines)?,
                structures: structures(&c.structures)?,
                seed: c.seed,
                opt: c.opt,
                heap_kb: c.heap_kb,
                min_ms: c.min_ms,
                max_ms: c.max_ms,
                backup_restart: !c.no_backup_restart,
                max_lag: c.max_lag,
                backup_bin: match &c.rebound_ha {
                    Some(p) => p.clone(),
                    None => std::env::current_exe()?,
                },
            };
            eprintln!("{}", Machine::probe().line());
            let trials = faults::run(&a);
            let goals = faults::summary(&trials);
            let backup = BackupKind::Process(a.backup_bin.clone()).describe();
            let cmd = format!(
                "faults: {} kill trials per engine, seed {}, {}",
                a.trials,
                a.seed,
                a.max_lag
                    .map_or("sync replication".to_string(), |n| format!(
                        "async replication, max lag {n}"
                    ))
            );
            let failed = trials.iter().filter(|t| !t.ok).count();
            emit(
                Out {
                    json: c.json,
                    json_out: None,
                    svg: None,
                },
                &cmd,
                &backup,
                serde_json::to_value(&trials)?,
                String::new(),
                &goals,
            )?;
            if failed > 0 {
                eprintln!(
                    "rebound-ha-bench: {failed} of {} fault trials failed",
                    trials.len()
                );
                return Ok(ExitCode::from(1));
            }
        }
        Cmd::Primary(c) => {
            let ds = structures(std::slice::from_ref(&c.structure))?[0];
            primary::run(&primary::PrimaryArgs {
                engine: c.engine.parse()?,
                backup: c.backup,
                ds,
                seed: c.seed,
                opt: c.opt,
                heap_kb: c.heap_kb,
                max_tx: c.max_tx,
                retry: c.retry,
                max_lag: c.max_lag,
                block: c.block_secs.map(std::time::Duration::from_secs),
            })?;
        }
        Cmd::Backup(c) => {
            let ep: hareplica::Endpoint = c.listen.parse().context("--listen")?;
            let mut cfg = hareplica::BackupConfig::new(ep, &c.dir);
            cfg.durable = c.durable;
            cfg.spin = backup::backup_spin(c.spin_us);
            let (server, _report) =
                hareplica::BackupServer::bind(cfg).context("starting the backup")?;
            server.serve().context("serving")?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("rebound-ha-bench: {}", rebound_errors::chain(e.as_ref()));
            ExitCode::from(2)
        }
    }
}
