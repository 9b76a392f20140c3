//! `rebound-ha bench-link`: commit round-trip latency over loopback TCP and unix sockets.
//!
//! Each transaction writes 4 random 8-byte words into each of N random pages of a
//! 10 MiB heap, diffs those pages against the shadow and commits. Without `--connect`
//! a backup child process is started per transport (a real process, as deployed).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use hareplica::{diff_pages, ClientOptions, ClusterToken, DiffRun, Endpoint, Mode, ReplicaClient};
use serde::Serialize;

const PAGE: usize = 4096;
const WRITES_PER_PAGE: usize = 4;

#[derive(clap::Args)]
pub struct Args {
    /// Use this running backup (started with --allow-reset) instead of starting children.
    #[arg(long)]
    connect: Option<Endpoint>,
    /// Transactions per measurement.
    #[arg(long, default_value_t = 2000)]
    iters: usize,
    /// Pages written per transaction, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    pages: Vec<usize>,
    /// Heap size in MB.
    #[arg(long, default_value_t = 10)]
    heap_mb: usize,
    /// Unacknowledged transactions allowed in async mode.
    #[arg(long, default_value_t = 64)]
    max_lag: u32,
    /// Start the backup children with --durable (fsync per acknowledgement burst).
    #[arg(long)]
    durable: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Row {
    link: String,
    mode: String,
    pages: usize,
    iters: usize,
    diff_us: f64,
    commit_p50_us: f64,
    commit_p99_us: f64,
    commit_mean_us: f64,
    /// Wall time per transaction (writes, diff, commit, shadow update), the final
    /// flush included.
    per_tx_us: f64,
    bytes_written_per_tx: f64,
    bytes_shipped_per_tx: f64,
}

struct Backup {
    child: Child,
    ep: Endpoint,
    /// A TCP backup's token (its file in the scratch directory).
    token: Option<ClusterToken>,
    _dir: tempfile::TempDir,
}

impl Drop for Backup {
    fn drop(&mut self) {
        // Ours to stop; it may have exited already.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_backup(listen: &str, durable: bool) -> Result<Backup> {
    let dir = tempfile::tempdir()?;
    let listen = listen.replace("DIR", &dir.path().display().to_string());
    let exe = std::env::current_exe()?;
    let mut cmd = Command::new(exe);
    cmd.args(["backup", "--allow-reset", "--listen", &listen, "--dir"])
        .arg(dir.path().join("replica"))
        .stderr(Stdio::piped());
    let mut token = None;
    if listen.starts_with("tcp:") {
        let path = dir.path().join("token");
        token = Some(ClusterToken::create_file(&path)?);
        cmd.arg("--token-file").arg(&path);
    }
    if durable {
        cmd.arg("--durable");
    }
    let mut child = cmd.spawn().context("start the backup child")?;
    let stderr = child.stderr.take().expect("piped");
    let mut lines = BufReader::new(stderr).lines();
    let ep = loop {
        let Some(line) = lines.next() else {
            bail!("the backup child exited before listening")
        };
        let line = line?;
        if let Some(rest) = line.split("listening on ").nth(1) {
            break rest.split(' ').next().unwrap_or_default().to_string();
        }
    };
    // Keep draining its log so it never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    let ep = ep.parse()?;
    Ok(Backup {
        child,
        ep,
        token,
        _dir: dir,
    })
}

pub fn run(args: Args) -> Result<()> {
    let mut links: Vec<(String, Endpoint, Option<Backup>)> = Vec::new();
    match &args.connect {
        Some(ep) => links.push((ep.to_string(), ep.clone(), None)),
        None => {
            for (name, listen) in [("tcp", "tcp:127.0.0.1:0"), ("unix", "unix:DIR/ha.sock")] {
                let b = start_backup(listen, args.durable)?;
                links.push((name.to_string(), b.ep.clone(), Some(b)));
            }
        }
    }
    let mut rows = Vec::new();
    if !args.json {
        println!(
            "{:<6} {:<6} {:>5} {:>7} {:>8} {:>11} {:>11} {:>12} {:>11} {:>9} {:>9}",
            "link",
            "mode",
            "pages",
            "iters",
            "diff µs",
            "commit p50",
            "commit p99",
            "commit mean",
            "wall µs/tx",
            "B written",
            "B shipped"
        );
    }
    for (name, ep, backup) in &links {
        let token = backup.as_ref().and_then(|b| b.token.clone());
        for &pages in &args.pages {
            for mode in [
                Mode::Sync,
                Mode::Async {
                    max_lag: args.max_lag,
                },
            ] {
                let row = measure(name, ep, &token, mode, pages, &args)
                    .with_context(|| format!("{name} {mode:?} {pages} pages"))?;
                if !args.json {
                    println!(
                        "{:<6} {:<6} {:>5} {:>7} {:>8.2} {:>11.1} {:>11.1} {:>12.1} {:>11.1} {:>9.0} {:>9.0}",
                        row.link, row.mode, row.pages, row.iters, row.diff_us, row.commit_p50_us,
                        row.commit_p99_us, row.commit_mean_us, row.per_tx_us,
                        row.bytes_written_per_tx, row.bytes_shipped_per_tx
                    );
                }
                rows.push(row);
            }
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    }
    Ok(())
}

fn measure(
    name: &str,
    ep: &Endpoint,
    token: &Option<ClusterToken>,
    mode: Mode,
    pages: usize,
    args: &Args,
) -> Result<Row> {
    let heap_size = args.heap_mb << 20;
    let npages = heap_size / PAGE;
    if pages == 0 || pages > npages {
        bail!("pages per transaction must be in 1..={npages}");
    }
    let mut opts = ClientOptions::new(mode);
    // None: an outside backup's token comes from REBOUND_HA_TOKEN_FILE.
    opts.token = token.clone();
    let mut client = ReplicaClient::connect_with(ep, heap_size as u64, opts)?;
    let mut rng = fastrand::Rng::with_seed(42);
    let mut heap = vec![0u8; heap_size];
    let mut shadow = heap.clone();
    let (mut runs, mut dirty) = (Vec::<DiffRun>::new(), Vec::<usize>::new());
    let mut commit_ns = Vec::with_capacity(args.iters);
    let (mut diff_total, mut written, mut shipped) = (Duration::ZERO, 0u64, 0u64);
    let start = Instant::now();
    for tx in 1..=args.iters as u64 {
        dirty.clear();
        while dirty.len() < pages {
            let p = rng.usize(..npages);
            if !dirty.contains(&p) {
                dirty.push(p);
            }
        }
        dirty.sort_unstable();
        for &p in &dirty {
            for _ in 0..WRITES_PER_PAGE {
                let off = p * PAGE + rng.usize(..PAGE / 8) * 8;
                heap[off..off + 8].copy_from_slice(&rng.u64(..).to_le_bytes());
                written += 8;
            }
        }
        let t0 = Instant::now();
        runs.clear();
        diff_pages(&shadow, &heap, &dirty, PAGE, &mut runs);
        let t1 = Instant::now();
        shipped += client.commit(tx, &runs, &heap)?;
        commit_ns.push(t1.elapsed().as_nanos() as u64);
        diff_total += t1 - t0;
        for r in &runs {
            let (s, e) = (r.offset as usize, r.end() as usize);
            shadow[s..e].copy_from_slice(&heap[s..e]);
        }
    }
    client.flush()?;
    let total = start.elapsed();
    let commit_mean_us = commit_ns.iter().sum::<u64>() as f64 / 1000.0 / commit_ns.len() as f64;
    commit_ns.sort_unstable();
    let pct = |q: f64| commit_ns[((commit_ns.len() - 1) as f64 * q) as usize] as f64 / 1000.0;
    let n = args.iters as f64;
    Ok(Row {
        link: name.to_string(),
        mode: match mode {
            Mode::Sync => "sync".into(),
            Mode::Async { .. } => "async".into(),
        },
        pages,
        iters: args.iters,
        diff_us: diff_total.as_secs_f64() * 1e6 / n,
        commit_p50_us: pct(0.5),
        commit_p99_us: pct(0.99),
        commit_mean_us,
        per_tx_us: total.as_secs_f64() * 1e6 / n,
        bytes_written_per_tx: written as f64 / n,
        bytes_shipped_per_tx: shipped as f64 / n,
    })
}
