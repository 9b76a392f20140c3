//! `rebound-ha`: run a heap backup, show its state, promote it, dump its replica, and
//! measure the replication link.

mod bench_link;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use hareplica::store::Store;
use hareplica::{BackupConfig, BackupServer, ClusterToken, Endpoint, Spin, StatusInfo};

#[derive(Parser)]
#[command(
    name = "rebound-ha",
    about = "Backup for Rebound's highly available heap",
    version
)]
struct Cli {
    /// Log more (repeat for debug output).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Hold a replica: apply primaries' commits, serve takeover.
    Backup {
        /// unix:PATH (the socket is made mode 0600: only this user connects), or
        /// tcp:HOST:PORT, which needs --token-file.
        #[arg(long)]
        listen: Endpoint,
        /// The token a TCP peer must prove it holds (a file of at least 32 random bytes,
        /// owned by this user, mode 0600, as `rebound-ha token` makes; primaries
        /// name the same file in REBOUND_HA_TOKEN_FILE).
        #[arg(long)]
        token_file: Option<PathBuf>,
        /// Drop a connection that has not said hello (or attached) this many
        /// milliseconds after it was accepted, token handshake included.
        #[arg(long, default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(1..))]
        hello_timeout_ms: u64,
        /// Directory for the replica image and its write-ahead log.
        #[arg(long)]
        dir: PathBuf,
        /// fsync each commit before acknowledging it (survives power loss).
        #[arg(long)]
        durable: bool,
        /// Let a primary announcing a fresh heap replace a replica holding transactions.
        #[arg(long)]
        allow_reset: bool,
        /// Checkpoint the image once the log exceeds this many KiB
        /// (default: the larger of 64 MiB and the heap size).
        #[arg(long)]
        checkpoint_kb: Option<u64>,
        /// Drop a peer that stalls inside a frame for this many milliseconds.
        #[arg(long, default_value_t = 30_000)]
        frame_timeout_ms: u64,
        /// Busy-poll this many µs for the next frame before blocking, always (0: never).
        /// Default: adaptive, up to 500 µs while the primary commits at least that often
        /// (saves an idle CPU's wake-up per commit; costs the backup up to a CPU meanwhile).
        #[arg(long, value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
        spin_us: Option<u64>,
    },
    /// Show a backup's state, from its directory or by asking it.
    Status {
        /// A backup's directory, read without disturbing a backup running on it (the
        /// replica image and the log as on disk).
        #[arg(long, conflicts_with = "connect", required_unless_present = "connect")]
        dir: Option<PathBuf>,
        /// A running backup's endpoint (tcp:HOST:PORT or unix:PATH): its live state, the
        /// connected primary and the lag.
        #[arg(long)]
        connect: Option<Endpoint>,
        /// The token file of a TCP backup (default: $REBOUND_HA_TOKEN_FILE).
        #[arg(long, requires = "connect")]
        token_file: Option<PathBuf>,
        /// Print one JSON object instead of lines.
        #[arg(long)]
        json: bool,
    },
    /// Bump the backup's epoch: the current primary is fenced, a new one may attach.
    Promote {
        /// The backup's endpoint (tcp:HOST:PORT or unix:PATH).
        #[arg(long)]
        connect: Endpoint,
        /// The token file of a TCP backup (default: $REBOUND_HA_TOKEN_FILE).
        #[arg(long)]
        token_file: Option<PathBuf>,
        /// Print one JSON object instead of lines.
        #[arg(long)]
        json: bool,
    },
    /// Make a new token file for TCP backups and their primaries: 32 random bytes
    /// as 64 hex digits, mode 0600 (an existing file is never overwritten).
    Token {
        /// Where to write it.
        file: PathBuf,
    },
    /// Write the replica's heap image (log replayed) to a file.
    Dump {
        /// The backup's directory.
        #[arg(long)]
        dir: PathBuf,
        /// The file to write (the heap's bytes, nothing else).
        #[arg(long)]
        out: PathBuf,
    },
    /// Measure commit round trips over loopback TCP and a unix socket.
    BenchLink(bench_link::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let level = match cli.verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    // RUST_LOG (an env filter) overrides -v.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match run(cli.cmd) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rebound-ha: {}", rebound_errors::chain(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}

const ADMIN_TIMEOUT: Duration = Duration::from_secs(5);

fn run(cmd: Cmd) -> Result<()> {
    match cmd {
        Cmd::Backup {
            listen,
            dir,
            durable,
            allow_reset,
            checkpoint_kb,
            frame_timeout_ms,
            spin_us,
            token_file,
            hello_timeout_ms,
        } => {
            let cfg = BackupConfig {
                durable,
                allow_reset,
                checkpoint_bytes: checkpoint_kb.unwrap_or(0) << 10,
                frame_timeout: Duration::from_millis(frame_timeout_ms),
                spin: match spin_us {
                    None => Spin::BACKUP,
                    Some(0) => Spin::Off,
                    Some(us) => Spin::Fixed(Duration::from_micros(us)),
                },
                token: read_token(token_file.as_deref())?,
                hello_timeout: Duration::from_millis(hello_timeout_ms),
                ..BackupConfig::new(listen, &dir)
            };
            let (server, report) =
                BackupServer::bind(cfg).with_context(|| format!("backup on {}", dir.display()))?;
            let st = server.status();
            if report.torn_tail_bytes > 0 {
                tracing::warn!(
                    "cut a torn log tail of {} bytes (a crash mid-write)",
                    report.torn_tail_bytes
                );
            }
            tracing::info!(
                "listening on {} (heap {} bytes, tx {}, epoch {}, {} log records replayed{})",
                server.local_endpoint(),
                st.heap_size,
                st.last_tx,
                st.epoch,
                report.records_replayed,
                if durable { ", durable" } else { "" }
            );
            server.serve().context("backup stopped")
        }
        Cmd::Status {
            dir: Some(dir),
            json,
            ..
        } => status_dir(&dir, json),
        Cmd::Status {
            connect: Some(ep),
            json,
            token_file,
            ..
        } => {
            let st = hareplica::query_status_with(&ep, admin_options(token_file.as_deref())?)
                .context("status")?;
            if json {
                println!("{}", serde_json::to_string_pretty(&st)?);
            } else {
                print_status(&st);
            }
            Ok(())
        }
        Cmd::Status { .. } => bail!("give --dir or --connect"),
        Cmd::Promote {
            connect,
            token_file,
            json,
        } => {
            let (epoch, last_tx) =
                hareplica::promote_with(&connect, admin_options(token_file.as_deref())?)
                    .context("promote")?;
            if json {
                println!(
                    "{}",
                    serde_json::json!({ "epoch": epoch, "last_tx": last_tx })
                );
            } else {
                println!("promoted: epoch {epoch}, last tx {last_tx}; the old primary is fenced");
            }
            Ok(())
        }
        Cmd::Token { file } => {
            ClusterToken::create_file(&file).context("token")?;
            println!("token written to {} (mode 0600)", file.display());
            Ok(())
        }
        Cmd::Dump { dir, out } => dump(&dir, &out),
        Cmd::BenchLink(args) => bench_link::run(args),
    }
}

fn read_token(path: Option<&Path>) -> Result<Option<ClusterToken>> {
    path.map(|p| ClusterToken::from_file(p).context("token"))
        .transpose()
}

/// An operator request's options: bounded by [`ADMIN_TIMEOUT`], with the token given.
fn admin_options(token_file: Option<&Path>) -> Result<hareplica::ClientOptions> {
    let mut opts = hareplica::admin_options(ADMIN_TIMEOUT);
    opts.token = read_token(token_file)?;
    Ok(opts)
}

fn status_dir(dir: &Path, json: bool) -> Result<()> {
    let (st, report) =
        Store::load_readonly(dir).with_context(|| format!("replica in {}", dir.display()))?;
    if !report.image_found {
        bail!("{} holds no replica image", dir.display());
    }
    if json {
        let v = serde_json::json!({
            "dir": dir, "last_tx": st.last_tx, "epoch": st.epoch, "heap_size": st.heap_size,
            "wal_bytes": report.wal_bytes, "wal_records": report.records_replayed,
            "torn_tail_bytes": report.torn_tail_bytes, "primary": null,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!("replica    {}", dir.display());
        println!("heap       {} bytes", st.heap_size);
        println!("last tx    {}", st.last_tx);
        println!("epoch      {}", st.epoch);
        println!(
            "log        {} bytes, {} records since the checkpoint{}",
            report.wal_bytes,
            report.records_replayed,
            if report.torn_tail_bytes > 0 {
                format!(", torn tail of {} bytes", report.torn_tail_bytes)
            } else {
                String::new()
            }
        );
        println!("primary    not known from the directory (use --connect)");
    }
    Ok(())
}

fn print_status(st: &StatusInfo) {
    println!("heap       {} bytes", st.heap_size);
    println!("last tx    {}", st.last_tx);
    println!("epoch      {}", st.epoch);
    println!(
        "applied    {} txs, {} bytes since start",
        st.txs_applied, st.bytes_applied
    );
    println!(
        "log        {} bytes since the checkpoint{}",
        st.wal_bytes,
        if st.durable { ", durable" } else { "" }
    );
    match st.ms_since_commit {
        Some(ms) => println!("lag        {ms} ms since the last commit"),
        None => println!("lag        no commit since start"),
    }
    match &st.primary {
        Some(p) => println!(
            "primary    {} epoch {} {:?}{}",
            p.peer,
            p.epoch,
            p.mode,
            if p.current { "" } else { " (fenced)" }
        ),
        None => println!("primary    none connected"),
    }
}

fn dump(dir: &Path, out: &Path) -> Result<()> {
    for f in ["replica.img", "replica.wal"] {
        let own = dir.join(f);
        if let (Ok(a), Ok(b)) = (own.canonicalize(), out.canonicalize()) {
            if a == b {
                bail!("refusing to overwrite the replica's own {f}");
            }
        }
    }
    let (st, report) =
        Store::load_readonly(dir).with_context(|| format!("replica in {}", dir.display()))?;
    if !report.image_found {
        bail!("{} holds no replica image", dir.display());
    }
    hareplica::store::dump_raw(&st, out).with_context(|| format!("dump to {}", out.display()))?;
    println!(
        "wrote {} bytes (tx {}, epoch {}) to {}",
        st.heap_size,
        st.last_tx,
        st.epoch,
        out.display()
    );
    Ok(())
}
