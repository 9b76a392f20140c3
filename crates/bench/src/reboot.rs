//! `rebound bench reboot`: what a reboot costs a web service, as CacheMind's figures
//! 3–5, for three variants side by side in one run (issue 12, item 5):
//!
//! - `normal`: QEMU's virtio-blk with `O_DIRECT` (cache=none): the guest's file cache
//!   is gone after the reboot and nothing on the host holds it;
//! - `normal-hostcache`: QEMU's virtio-blk through the host page cache (writeback):
//!   the guest's cache is gone, but its reads come from the host's memory (CacheMind's
//!   figure 4 case, with double caching);
//!   In the default set it gets equal host memory: its QEMU's memory group is limited
//!   to QEMU's own footprint plus the warm variant's host-cache size, so the kernel
//!   keeps at most that much of the image in the page cache ([`equalmem`]);
//!   `normal-hostcache-unlimited` is the same without the limit;
//! - `warm`: Rebound's backend with a host cache and `vm reboot --warm`: the guest's
//!   cached pages are listed before the reboot and read back after it through the
//!   backend's cache;
//! - `dax`: the file set on a virtio-pmem device, mounted with DAX: the guest has no
//!   file cache of its own to lose, it reads the host's page cache directly.
//!
//! Each variant boots a fresh VM whose `/data` is a file set made by
//! `rebound image webset`, then: three full reads of the set (first, second, third),
//! a reboot, three reads again; then a steady random load for `--seconds`, a reboot
//! under the load, and the load again until `--seconds` after the service is back,
//! with the throughput of every second recorded. Over the window before each reboot
//! the CPU of QEMU, the disk backends, the daemon and the load generator is counted
//! ([`steady`]). The whole set of variants runs `--runs` times, interleaved; the
//! report gives medians with min and max, and every variant's throughput after the
//! reboot against the best level before it of all variants in the same run.

mod draw;
mod equalmem;
mod report;
mod steady;

use std::time::Duration;

use clap::Args;
use rebound_api::spec::DiskBackend;
use rebound_api::{RebootReport, RebootRequest, VmSpec, VmStatus, Workload};
use rebound_vmm::paths::Paths;
use serde::Serialize;
use serde_json::{json, Value};

use crate::guest::{create, get, post, remove};
use crate::host::{host_cpus, host_kernel, load_average};
use crate::webload::{self, Load, Set};
use rebound_client::{connect, Client, ClientError};

/// Why the reboot benchmark did not finish.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {}", .0.display())]
    ReadPlot(std::path::PathBuf, #[source] std::io::Error),
    #[error("{}: no variants of `bench reboot --json`", .0.display())]
    PlotJson(std::path::PathBuf, #[source] serde_json::Error),
    #[error(transparent)]
    Draw(#[from] draw::DrawError),
    #[error("unknown variant {bad:?}: expected {}", VARIANTS.join(", "))]
    Variant { bad: String },
    #[error("--seconds must be at least 12 and --files at least 1")]
    Args,
    #[error(transparent)]
    Scratch(#[from] crate::out::ScratchError),
    #[error(transparent)]
    Set(#[from] webload::Error),
    #[error("no daemon to run the guests")]
    Connect(#[source] ClientError),
    #[error("cannot drop the disk {} from the page cache", .0.display())]
    DropCache(std::path::PathBuf, #[source] rebound_snapshot::ImageError),
    #[error("cannot tell how much of the disk {} is in the page cache", .0.display())]
    Cached(std::path::PathBuf, #[source] rebound_snapshot::ImageError),
    #[error(transparent)]
    Guest(#[from] crate::guest::Error),
    #[error("{0}: the daemon reports no QEMU pid")]
    NoPid(String),
    #[error("{0}: no forward for the web service")]
    NoForward(String),
    #[error("cannot emulate the slow disk")]
    SlowDisk(#[source] crate::slowdisk::Error),
    #[error("{name}: equal host memory")]
    EqualMemory {
        name: String,
        #[source]
        source: equalmem::Error,
    },
    #[error("the reboot request does not encode as JSON")]
    Request(#[source] serde_json::Error),
    #[error("the file set's reads did not finish")]
    ReadTask(#[source] tokio::task::JoinError),
    #[error("the reads before the reboot")]
    ReadsBefore(#[source] webload::Error),
    #[error("the reads after the reboot")]
    ReadsAfter(#[source] webload::Error),
    #[error("{name}: the service did not come back within 300 s of the reboot ({ok} requests answered and {failed} failed since; the reboot answered {reboot:?})")]
    NotBack {
        name: String,
        ok: usize,
        failed: usize,
        reboot: Result<Option<u64>, String>,
    },
    #[error(transparent)]
    Incomplete(#[from] crate::rounds::Incomplete),
    #[error("cannot encode the results as JSON")]
    Json(#[source] serde_json::Error),
}

#[derive(Args, Debug)]
pub struct RebootArgs {
    /// Files in the set.
    #[arg(long, default_value_t = 1000)]
    files: u64,
    /// Size of each file.
    #[arg(long, default_value = "200K", value_parser = rebound_blk::args::parse_bytes)]
    file_size: u64,
    /// Guest memory, MiB (the set must fit in its page cache).
    #[arg(long, default_value_t = 512)]
    memory: u64,
    /// Parallel client connections.
    #[arg(long, default_value_t = 4)]
    conns: usize,
    /// Seconds of load before the reboot, and after the service is back.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// Reads from the disk holding the file set are limited to this many MB/s for
    /// the VM's processes (an emulated slow disk: the host page cache and Rebound's
    /// host cache are not limited); 0: the disk's own speed. The defaults, 12 MB/s
    /// and 75 IOPS, are a 100 GiB standard cloud persistent disk.
    #[arg(long, default_value_t = 12)]
    disk_read_mbps: u64,
    /// ... and to this many read requests per second (0: unlimited).
    #[arg(long, default_value_t = 75)]
    disk_read_iops: u64,
    /// Draw `--svg` from the JSON of an earlier run (`--json` output) instead of
    /// running.
    #[arg(long, requires = "svg")]
    plot_from: Option<std::path::PathBuf>,
    /// Reboots under load per variant, each with its own `--seconds` before and after
    /// (the figures are their means: one window of a network-bound service is noisy).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    reboots: u32,
    /// Variants: normal, normal-hostcache (equal host memory), warm, dax, and
    /// normal-hostcache-unlimited (the host page cache without a limit).
    #[arg(long, default_value = "normal,normal-hostcache,warm,dax")]
    variants: String,
    /// Runs of every variant (interleaved); the report gives medians, min and max.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=20))]
    runs: u32,
    #[command(flatten)]
    out: crate::out::BenchOut,
}

const VARIANTS: [&str; 5] = [
    "normal",
    "normal-hostcache",
    "normal-hostcache-unlimited",
    "warm",
    "dax",
];

/// One reboot under load.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
struct Round {
    reboot_at_s: f64,
    back_at_s: f64,
    reboot_s: f64,
    outage_s: f64,
    before_mb_s: f64,
    first10_mb_s: f64,
    drop_pct: f64,
    recovery_s: Option<f64>,
    /// CPU and backend work over the `--seconds` before the reboot.
    #[serde(default)]
    steady: steady::Steady,
}

/// One variant's results.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
struct Variant {
    variant: String,
    /// Which of the `--runs` (from 1).
    #[serde(default)]
    run: u32,
    /// Seconds for the first, second and third full read of the set before and after
    /// the reboot.
    reads_before_s: [f64; 3],
    reads_after_s: [f64; 3],
    /// Requests of the reads that stalled past the client's timeout and were sent again.
    read_retries: u64,
    /// From the reboot request to the service answering again.
    reboot_s: f64,
    /// From the last answer before the outage to the first after it: what clients saw
    /// (a warm reboot lists the cache first, while the service still answers).
    #[serde(default)]
    outage_s: f64,
    /// MB/s over the `--seconds` before the reboot.
    before_mb_s: f64,
    /// MB/s over the first 10 s after the service is back.
    first10_mb_s: f64,
    /// How far the first 10 s fall below the level before the reboot.
    drop_pct: f64,
    /// How far they fall below the best level before the reboot of all variants in
    /// the same run (the level the service could have kept).
    #[serde(default)]
    drop_vs_best_pct: f64,
    #[serde(default)]
    best_before_mb_s: f64,
    /// Seconds after the service is back until a 3-s mean reaches 95% of the level
    /// before; absent if it did not within the run.
    recovery_s: Option<f64>,
    /// MB/s per second of the load run; the reboot was asked at `reboot_at_s` and the
    /// service was back at `back_at_s`.
    series: Vec<f64>,
    reboot_at_s: f64,
    back_at_s: f64,
    /// The warm reboots' reports (what was listed and read back).
    reboots: Vec<RebootReport>,
    /// Each reboot under load (`--reboots`); the figures above are their means
    /// (`recovery_s`: the slowest, absent if one did not recover).
    #[serde(default)]
    rounds: Vec<Round>,
    /// The steady state before the reboots, all rounds' windows together.
    #[serde(default)]
    steady: steady::Steady,
    /// `normal-hostcache`: the memory limit and what held.
    #[serde(default)]
    equal_memory: Option<equalmem::EqualMemory>,
    /// At the end: the image's bytes in the host page cache, and what the backends'
    /// host caches held.
    #[serde(default)]
    image_cached_bytes: u64,
    #[serde(default)]
    blk_held_bytes: u64,
}

/// The warm variant's host cache in MiB: the whole set fits, plus the image's own
/// metadata and some room.
fn warm_cache_mib(args: &RebootArgs) -> u64 {
    ((args.files * args.file_size.div_ceil(4096) * 4096) >> 20) + 64
}

fn spec(args: &RebootArgs, name: &str, variant: &str, disk: &str) -> VmSpec {
    let mut s = VmSpec::new(name);
    s.memory_mib = args.memory;
    s.workload = Some(Workload::Web);
    s.workload_args.insert("data_disk".into(), "vdb".into());
    s.disks = vec![rebound_api::disk::entry(disk)];
    match variant {
        "normal" => s.disk_direct = true,
        "normal-hostcache" | "normal-hostcache-unlimited" => {}
        "dax" => {
            s.disks.clear();
            s.pmem = vec![disk.into()];
            s.workload_args.insert("data_disk".into(), "pmem0".into());
        }
        _ => {
            s.disk_backend = DiskBackend::Rebound;
            s.disk_cache_mib = warm_cache_mib(args);
        }
    }
    s
}

async fn reboot(c: &Client, name: &str, warm: bool) -> Result<RebootReport, Error> {
    let body = serde_json::to_value(RebootRequest { warm, hard: false }).map_err(Error::Request)?;
    Ok(post(c, &format!("/v1/vms/{name}/reboot"), Some(&body)).await?)
}

/// Three full reads of the set with `conns` clients; the seconds of each, and the
/// requests that timed out and were sent again.
async fn three_reads(
    set: Set,
    conns: usize,
    fail: fn(webload::Error) -> Error,
) -> Result<([f64; 3], u64), Error> {
    let mut r = [0.0; 3];
    let mut retries = 0;
    for x in &mut r {
        let (s, again) = tokio::task::spawn_blocking(move || set.pass(conns))
            .await
            .map_err(Error::ReadTask)?
            .map_err(fail)?;
        *x = s;
        retries += again;
    }
    Ok((r, retries))
}

async fn run_variant(
    c: &Client,
    args: &RebootArgs,
    variant: &str,
    name: &str,
    disk: &str,
    progress: bool,
) -> Result<(Variant, VmStatus), Error> {
    let say = |m: &str| {
        if progress {
            eprintln!("bench reboot: {variant}: {m}");
        }
    };
    let s = spec(args, name, variant, disk);
    // Each variant starts with the disk cold on the host.
    rebound_snapshot::drop_page_cache(std::path::Path::new(disk))
        .map_err(|e| Error::DropCache(disk.into(), e))?;
    create(c, &s).await?;
    let st: VmStatus = post(
        c,
        &format!("/v1/vms/{name}/wait?for=ready&timeout_ms=300000"),
        None,
    )
    .await?;
    let qemu = st.qemu_pid.ok_or_else(|| Error::NoPid(name.to_string()))?;
    let disks: Vec<Value> = get(c, &format!("/v1/vms/{name}/disks")).await?;
    let blk_pids: Vec<u32> = disks
        .iter()
        .filter_map(|d| d["pid"].as_u64().map(|p| p as u32))
        .collect();
    // QEMU and the disk backends read from the slow disk from now on (the boot
    // itself is not measured).
    let _slow = if args.disk_read_mbps > 0 || args.disk_read_iops > 0 {
        let g = crate::slowdisk::SlowDisk::new(
            name,
            std::path::Path::new(disk),
            args.disk_read_mbps * 1_000_000,
            args.disk_read_iops,
        )
        .map_err(Error::SlowDisk)?;
        for &pid in std::iter::once(&qemu).chain(&blk_pids) {
            g.add(pid).map_err(Error::SlowDisk)?;
        }
        Some(g)
    } else {
        None
    };
    // Equal host memory, set after the slow disk's group (on a unified hierarchy it is
    // QEMU's memory group too) and just before the workload.
    let mut limit = if variant == "normal-hostcache" {
        let l = equalmem::Limit::apply(
            qemu,
            std::path::Path::new(&st.ram_file),
            std::path::Path::new(disk),
            warm_cache_mib(args) << 20,
        )
        .map_err(|source| Error::EqualMemory {
            name: name.to_string(),
            source,
        })?;
        let f = &l.figures;
        eprintln!(
            "bench reboot: {variant}: memory group {} limited to {} MiB: QEMU's footprint {} MiB (guest RAM charged in full) + the warm cache's {} MiB, following the footprint",
            f.group.display(),
            f.limit_bytes >> 20,
            f.footprint_bytes >> 20,
            f.cache_bytes >> 20
        );
        Some(l)
    } else {
        None
    };
    let pids = steady::Pids {
        qemu,
        vcpus: st.cpus as usize,
        backends: blk_pids,
        daemon: steady::parent(qemu),
    };
    let port = st
        .forwards
        .iter()
        .find(|f| f.guest == 8080)
        .map(|f| f.host)
        .ok_or_else(|| Error::NoForward(name.to_string()))?;
    let set = Set {
        port,
        files: args.files,
        file_size: args.file_size,
    };
    let warm = variant == "warm";
    let mut reboots = Vec::new();

    say("three reads, reboot, three reads");
    let (reads_before_s, r1) = three_reads(set, args.conns, Error::ReadsBefore).await?;
    reboots.push(reboot(c, name, warm).await?);
    let (reads_after_s, r2) = three_reads(set, args.conns, Error::ReadsAfter).await?;

    say(&format!(
        "{} s of load, reboot under load, {} s after (x{})",
        args.seconds, args.seconds, args.reboots
    ));
    let load = Load::start(set, args.conns, 0x5eed);
    let mut times = Vec::new();
    let mut windows = Vec::new();
    for k in 0..args.reboots {
        // The window before each reboot is clean: the previous one's after-window
        // (with its recovery) is over before it starts.
        if k > 0 {
            tokio::time::sleep(Duration::from_secs(args.seconds)).await;
        }
        let a = steady::sample(c, name, &pids, load.now()).await;
        tokio::time::sleep(Duration::from_secs(args.seconds)).await;
        let b = steady::sample(c, name, &pids, load.now()).await;
        windows.push((a, b));
        let reboot_at_s = load.now();
        let r = reboot(c, name, warm).await;
        // The service is back at the first request answered after it went down (a
        // warm reboot lists the cache first, with the service still up).
        let back_at_s = loop {
            if let Some(t) = load.back_after(reboot_at_s) {
                break t;
            }
            if load.now() - reboot_at_s > 300.0 {
                let done = load.stop();
                let ok = done.iter().filter(|d| d.ok && d.t >= reboot_at_s).count();
                let failed = done.iter().filter(|d| !d.ok && d.t >= reboot_at_s).count();
                return Err(Error::NotBack {
                    name: name.to_string(),
                    ok,
                    failed,
                    reboot: r
                        .map(|r| r.reboot_ms)
                        .map_err(|e| rebound_errors::chain(&e)),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        reboots.push(r?);
        times.push((reboot_at_s, back_at_s));
        if args.reboots > 1 {
            say(&format!("reboot {} of {} done", k + 1, args.reboots));
        }
    }
    let end = times.last().expect("at least one reboot").1 + args.seconds as f64;
    tokio::time::sleep(Duration::from_secs_f64((end - load.now()).max(0.0) + 1.0)).await;
    let done = load.stop();
    let series = webload::per_second(&done, end.ceil());
    let rounds: Vec<Round> = times
        .iter()
        .zip(&windows)
        .map(|(&(reboot_at_s, back_at_s), (a, b))| {
            let before_mb_s =
                webload::mean(&series, reboot_at_s - args.seconds as f64, reboot_at_s);
            let first10_mb_s = webload::mean(&series, back_at_s.ceil(), back_at_s.ceil() + 10.0);
            Round {
                reboot_at_s,
                back_at_s,
                reboot_s: back_at_s - reboot_at_s,
                outage_s: back_at_s - webload::went_down(&done, reboot_at_s).unwrap_or(reboot_at_s),
                before_mb_s,
                first10_mb_s,
                drop_pct: if before_mb_s > 0.0 {
                    100.0 * (1.0 - first10_mb_s / before_mb_s)
                } else {
                    0.0
                },
                recovery_s: webload::recovery(&series, back_at_s, before_mb_s, 0.95),
                steady: steady::between(a, b, &pids, steady::served(&done, a.t, b.t), args.conns),
            }
        })
        .collect();
    let equal_memory = match &mut limit {
        Some(l) => {
            Some(
                l.check(std::path::Path::new(disk))
                    .map_err(|source| Error::EqualMemory {
                        name: name.to_string(),
                        source,
                    })?,
            )
        }
        None => None,
    };
    let disks: Vec<Value> = get(c, &format!("/v1/vms/{name}/disks")).await?;
    let blk_held_bytes = disks
        .iter()
        .filter_map(|d| d["stats"]["cache"]["held_bytes"].as_u64())
        .sum();
    let mean = |f: fn(&Round) -> f64| rounds.iter().map(f).sum::<f64>() / rounds.len() as f64;
    let recovery_s = rounds
        .iter()
        .map(|r| r.recovery_s)
        .collect::<Option<Vec<f64>>>()
        .map(|v| v.into_iter().fold(0.0, f64::max));
    Ok((
        Variant {
            variant: variant.into(),
            reads_before_s,
            reads_after_s,
            read_retries: r1 + r2,
            reboot_s: mean(|r| r.reboot_s),
            outage_s: mean(|r| r.outage_s),
            before_mb_s: mean(|r| r.before_mb_s),
            first10_mb_s: mean(|r| r.first10_mb_s),
            drop_pct: mean(|r| r.drop_pct),
            drop_vs_best_pct: 0.0,
            best_before_mb_s: 0.0,
            recovery_s,
            series,
            reboot_at_s: rounds[0].reboot_at_s,
            back_at_s: rounds[0].back_at_s,
            reboots,
            steady: steady::sum(&rounds.iter().map(|r| r.steady.clone()).collect::<Vec<_>>()),
            rounds,
            run: 0,
            equal_memory,
            image_cached_bytes: rebound_snapshot::cached_bytes(std::path::Path::new(disk))
                .map_err(|e| Error::Cached(disk.into(), e))?,
            blk_held_bytes,
        },
        st,
    ))
}

pub async fn run(paths: &Paths, args: RebootArgs) -> Result<(), Error> {
    if let (Some(from), Some(svg)) = (&args.plot_from, &args.out.svg) {
        let bytes = std::fs::read(from).map_err(|e| Error::ReadPlot(from.clone(), e))?;
        let json = |e| Error::PlotJson(from.clone(), e);
        let v: Value = serde_json::from_slice(&bytes).map_err(json)?;
        let rows: Vec<Variant> = serde_json::from_value(v["variants"].clone()).map_err(json)?;
        return Ok(draw::draw(&v["meta"], &rows, svg)?);
    }
    let want: Vec<&str> = args.variants.split(',').map(str::trim).collect();
    if let Some(bad) = want.iter().find(|v| !VARIANTS.contains(v)) {
        return Err(Error::Variant {
            bad: bad.to_string(),
        });
    }
    if args.seconds < 12 || args.files == 0 {
        return Err(Error::Args);
    }
    let dir = args.out.scratch("reboot")?;
    let disk = dir.join(webload::SET_IMAGE);
    let progress = std::io::IsTerminal::is_terminal(&std::io::stderr());
    if !disk.exists() {
        if progress {
            eprintln!(
                "bench reboot: making the file set ({} files of {} bytes)",
                args.files, args.file_size
            );
        }
        webload::make_set(&dir, args.files, args.file_size)?;
    }
    let c = connect(paths).await.map_err(Error::Connect)?;
    let (load_before, date) = (load_average(), rebound_vmm::events::wall_now());
    let tag = format!("br{}", std::process::id());
    let mut rows = Vec::new();
    let mut failures: Vec<crate::rounds::Failure> = Vec::new();
    let mut accel = String::new();
    let r: Result<(), Error> = async {
        // Run-major: every variant once, then again, so a drift of the machine
        // spreads over all variants.
        for run in 1..=args.runs {
            let mut this_run = Vec::new();
            for v in &want {
                if progress && args.runs > 1 {
                    eprintln!("bench reboot: run {run} of {}: {v}", args.runs);
                }
                let name = format!("{tag}-{v}");
                let r =
                    run_variant(&c, &args, v, &name, &disk.display().to_string(), progress).await;
                remove(&c, &name).await;
                // A failed run is recorded and left out of every figure (and of
                // its round's best level before the reboot); the next is tried.
                let (mut row, st) = match r {
                    Ok(x) => x,
                    Err(e) => {
                        let f = crate::rounds::Failure::new(*v, run as usize - 1, &e);
                        eprintln!("{}", f.line());
                        failures.push(f);
                        continue;
                    }
                };
                row.run = run;
                accel = st.accel.as_str().to_string();
                this_run.push(row);
            }
            report::against_best(&mut this_run);
            rows.extend(this_run);
        }
        Ok(())
    }
    .await;
    if args.out.dir.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    r?;
    let meta = json!({
        "date": date, "accel": accel, "host_cpus": host_cpus(), "host_kernel": host_kernel(),
        "files": args.files, "file_size": args.file_size, "memory_mib": args.memory,
        "conns": args.conns, "seconds": args.seconds, "reboots": args.reboots,
        "runs": args.runs, "warm_cache_mib": warm_cache_mib(&args),
        "disk_read_mbps": args.disk_read_mbps, "disk_read_iops": args.disk_read_iops,
        "load_before": load_before, "load_after": load_average(),
    });
    if let Some(svg) = &args.out.svg {
        draw::draw(&meta, &rows, svg)?;
    }
    let summary = report::summarize(&rows);
    let tried = args.runs as usize * want.len();
    if args.out.json {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &json!({"meta": meta, "summary": summary, "variants": rows, "failures": failures})
            )
            .map_err(Error::Json)?
        );
        return Ok(crate::rounds::Incomplete::check(&failures, tried)?);
    }
    println!(
        "rebound bench reboot: {} files of {} KiB ({:.0} MiB) on /data, guest {} MiB, {} clients, disk reads limited to {} MB/s and {} IOPS (0: none), warm host cache {} MiB; {} runs; accel {}; {}",
        args.files,
        args.file_size >> 10,
        (args.files * args.file_size) as f64 / 1048576.0,
        args.memory,
        args.conns,
        args.disk_read_mbps,
        args.disk_read_iops,
        warm_cache_mib(&args),
        args.runs,
        meta["accel"].as_str().unwrap_or(""),
        date
    );
    report::print(&rows, &summary);
    for s in summary.iter().filter(|s| s.runs < args.runs as usize) {
        println!(
            "{}: the figures are over {} of {} runs (the others failed)",
            s.variant, s.runs, args.runs
        );
    }
    for f in &failures {
        println!("{}", f.line());
    }
    Ok(crate::rounds::Incomplete::check(&failures, tried)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variants_choose_the_backend_and_caching() {
        let a = RebootArgs {
            files: 1000,
            file_size: 200 << 10,
            memory: 512,
            conns: 4,
            seconds: 30,
            disk_read_mbps: 0,
            disk_read_iops: 0,
            plot_from: None,
            reboots: 1,
            variants: String::new(),
            runs: 3,
            out: Default::default(),
        };
        let s = |v| spec(&a, "x", v, "/w.img");
        assert!(s("normal").disk_direct);
        for v in ["normal-hostcache", "normal-hostcache-unlimited"] {
            let hc = s(v);
            assert!(!hc.disk_direct && hc.disk_backend == DiskBackend::Qemu);
        }
        let w = s("warm");
        assert_eq!(w.disk_backend, DiskBackend::Rebound);
        assert_eq!(w.disk_cache_mib, 195 + 64);
        assert_eq!(w.workload_args["data_disk"], "vdb");
        w.validate().unwrap();
        let d = s("dax");
        assert!(d.disks.is_empty() && d.pmem == ["/w.img"]);
        assert_eq!(d.workload_args["data_disk"], "pmem0");
        d.validate().unwrap();
    }
}
