//! `rebound bench disk`: guest I/O through Rebound's block backend against QEMU's own
//! virtio-blk on the same raw file, side by side in one run (issue 12, item 5).
//!
//! One raw file of `--size` is the guest's second disk (`/dev/vdb`, no filesystem).
//! The guest's `io` workload fills it in 1 MiB writes, then runs two passes, each in a
//! fresh VM: sequential writes and reads in 1 MiB requests, and random reads and
//! writes in 4 KiB requests for `--io-seconds` each, all `O_DIRECT` in the guest so
//! the guest's page cache is out of the measurement. Variants:
//!
//! - `qemu-none`: QEMU's virtio-blk with `O_DIRECT` on the file (cache=none);
//! - `qemu-writeback`: QEMU's virtio-blk through the host page cache (its default);
//! - `rebound`: our vhost-user-blk backend, `O_DIRECT` on the file, no host cache:
//!   every read is a miss, compared with `qemu-none` (the same caching);
//! - `rebound-cache`: our backend with a host cache as large as the disk: the fill
//!   admits every block, so every read after it is a hit, compared with `rebound`.

use std::time::{Duration, Instant};

use clap::Args;
use rebound_api::spec::DiskBackend;
use rebound_api::{IoReport, VmSpec, VmStatus, Workload};
use rebound_vmm::paths::Paths;
use serde::Serialize;
use serde_json::Value;

use crate::guest::{create, get, post, remove};
use crate::host::{host_cpus, host_kernel, load_average};
use rebound_blk::timing::{Phase, TimingReport};
use rebound_client::{connect, Client, ClientError};

/// Why the disk benchmark did not finish.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("unknown variant {bad:?}: expected {}", VARIANTS.join(", "))]
    Variant { bad: String },
    #[error("--runs must be at least 1 and --size at least 16M")]
    Args,
    #[error(transparent)]
    Scratch(#[from] crate::out::ScratchError),
    #[error("cannot make the disk file {}", .0.display())]
    DiskFile(std::path::PathBuf, #[source] std::io::Error),
    #[error("no daemon to run the guests")]
    Connect(#[source] ClientError),
    #[error("cannot time an eventfd round trip on this host")]
    Notify(#[source] std::io::Error),
    #[error("the eventfd round trip's thread failed")]
    NotifyTask(#[source] tokio::task::JoinError),
    #[error("{name}: the guest did not run its pass")]
    Guest {
        name: String,
        #[source]
        source: crate::guest::Error,
    },
    #[error("{name}: the io workload failed: {detail}")]
    Workload { name: String, detail: String },
    #[error("{name}: {got} of {want} io phases after 900 s")]
    Phases {
        name: String,
        got: usize,
        want: usize,
    },
    #[error("variant {variant}, round {round}, pass {pass:?}")]
    Pass {
        variant: String,
        round: usize,
        pass: String,
        #[source]
        source: Box<Error>,
    },
    #[error("cannot write {}", .0.display())]
    Svg(std::path::PathBuf, #[source] std::io::Error),
    #[error(transparent)]
    Incomplete(#[from] crate::rounds::Incomplete),
    #[error("cannot encode the results as JSON")]
    Json(#[source] serde_json::Error),
}

const MB: f64 = 1e6;

#[derive(Args, Debug)]
pub struct DiskArgs {
    /// Size of the disk the guest reads and writes (its second disk, /dev/vdb).
    #[arg(long, default_value = "256M", value_parser = rebound_api::spec::parse_memory_mib)]
    size: u64,
    /// Seconds each random phase runs.
    #[arg(long, default_value_t = 5)]
    io_seconds: u32,
    /// Rounds over the variants (interleaved); medians are printed.
    #[arg(long, default_value_t = 1)]
    runs: usize,
    /// Variants: qemu-none, qemu-writeback, rebound, rebound-cache.
    #[arg(long, default_value = "qemu-none,qemu-writeback,rebound,rebound-cache")]
    variants: String,
    #[command(flatten)]
    out: crate::out::BenchOut,
}

const VARIANTS: [&str; 4] = ["qemu-none", "qemu-writeback", "rebound", "rebound-cache"];
/// (phases, request size) of the two passes.
const PASSES: [(&str, u64); 2] = [("seqwrite,seqread", 1 << 20), ("randread,randwrite", 4096)];

/// One phase of one variant.
#[derive(Debug, Clone, Serialize)]
struct Row {
    variant: String,
    /// Which round over the variants (0-based): ratios are also given per round.
    round: usize,
    phase: String,
    bs: u64,
    mb_per_s: f64,
    iops: f64,
    p50_us: u64,
    p99_us: u64,
    ops: u64,
    seconds: f64,
    /// Our backend's own time per request of this phase's class, by phase.
    #[serde(skip_serializing_if = "Option::is_none")]
    backend: Option<BackendTime>,
}

/// Where a read's time went inside our backend (its `stats`' timing, the class of
/// reads the pass made: hits for `rebound-cache`, misses for `rebound`).
#[derive(Debug, Clone, Serialize, PartialEq)]
struct BackendTime {
    class: String,
    requests: u64,
    /// Microseconds per request inside the backend, and by phase.
    busy_us: f64,
    phases_us: Vec<(String, f64)>,
    /// Microseconds the backend's clock reads cost per request (inside `busy_us`).
    clock_us: f64,
    /// The backend's mean wait before a request: outside it, at queue depth 1.
    wait_us: f64,
}

impl BackendTime {
    /// The pass's reads: whichever of hits and misses it made most of.
    fn of(t: &TimingReport) -> Option<BackendTime> {
        let (class, c) = ["read_hit", "read_miss"]
            .iter()
            .filter_map(|k| Some((*k, t.classes.get(*k)?)))
            .max_by_key(|(_, c)| c.requests)
            .filter(|(_, c)| c.requests > 0)?;
        Some(BackendTime {
            class: class.into(),
            requests: c.requests,
            busy_us: c.busy_us(),
            phases_us: Phase::ALL
                .iter()
                .map(|&p| (p.name().to_string(), c.phase_us(p)))
                .collect(),
            clock_us: c.clock_us(t.clock_ns),
            wait_us: c.wait_us(),
        })
    }
}

impl Row {
    fn of(variant: &str, round: usize, r: &IoReport) -> Row {
        let s = r.seconds.max(1e-9);
        Row {
            variant: variant.into(),
            round,
            phase: r.phase.clone(),
            bs: r.bs,
            mb_per_s: r.bytes as f64 / s / MB,
            iops: r.ops as f64 / s,
            p50_us: r.p50_us,
            p99_us: r.p99_us,
            ops: r.ops,
            seconds: r.seconds,
            backend: None,
        }
    }

    /// Microseconds per request as the guest saw it: at queue depth 1, the mean
    /// round trip.
    fn guest_us(&self) -> f64 {
        match self.ops {
            0 => 0.0,
            n => self.seconds * 1e6 / n as f64,
        }
    }
}

fn spec(args: &DiskArgs, name: &str, variant: &str, disk: &str, pass: (&str, u64)) -> VmSpec {
    let mut s = VmSpec::new(name);
    s.memory_mib = 256;
    s.workload = Some(Workload::Io);
    for (k, v) in [
        ("io", pass.0.to_string()),
        ("io_target", "/dev/vdb".into()),
        ("io_size", (args.size << 20).to_string()),
        ("io_bs", pass.1.to_string()),
        ("io_seconds", args.io_seconds.to_string()),
        ("io_rounds", "1".into()),
    ] {
        s.workload_args.insert(k.into(), v);
    }
    s.disks = vec![rebound_api::disk::entry(disk)];
    match variant {
        "qemu-none" => s.disk_direct = true,
        "qemu-writeback" => {}
        v => {
            s.disk_backend = DiskBackend::Rebound;
            if v == "rebound-cache" {
                s.disk_cache_mib = args.size + 64;
            }
        }
    }
    s
}

/// Our backend's timing of the bench's disk (`disk`: the guest has other disks), from
/// its `stats` through the daemon; `None` for QEMU's own.
async fn backend_timing(
    c: &Client,
    name: &str,
    disk: &str,
) -> Result<Option<TimingReport>, crate::guest::Error> {
    let disks: Value = get(c, &format!("/v1/vms/{name}/disks")).await?;
    Ok(timing_of(&disks, disk))
}

/// The timing of the disk served from file `disk` by our backend, in a VM's disks.
fn timing_of(disks: &Value, disk: &str) -> Option<TimingReport> {
    let same = |f: &str| {
        f == disk
            || std::fs::canonicalize(f)
                .ok()
                .is_some_and(|a| std::fs::canonicalize(disk).ok().is_some_and(|b| a == b))
    };
    disks
        .as_array()?
        .iter()
        .filter(|d| d["backend"] == "rebound")
        .find(|d| d["file"].as_str().is_some_and(same))
        .and_then(|d| serde_json::from_value(d["stats"]["timing"].clone()).ok())
}

/// Boots one pass of one variant and returns its phases' reports (the read phase's
/// with our backend's time per request).
async fn run_pass(
    c: &Client,
    args: &DiskArgs,
    variant: &str,
    name: &str,
    disk: &str,
    pass: (&str, u64),
) -> Result<(Vec<IoReport>, VmStatus, Option<BackendTime>), Error> {
    let guest = |source| Error::Guest {
        name: name.to_string(),
        source,
    };
    let s = spec(args, name, variant, disk, pass);
    create(c, &s).await.map_err(guest)?;
    let st: VmStatus = post(
        c,
        &format!("/v1/vms/{name}/wait?for=ready&timeout_ms=600000"),
        None,
    )
    .await
    .map_err(guest)?;
    let want = pass.0.split(',').count();
    // The fill at TCG speeds, then the phases.
    let deadline = Instant::now() + Duration::from_secs(900);
    loop {
        let ev: Vec<Value> = get(c, &format!("/v1/vms/{name}/events"))
            .await
            .map_err(guest)?;
        if let Some(e) = ev.iter().find(|e| e["kind"] == "agent_error") {
            return Err(Error::Workload {
                name: name.to_string(),
                detail: e["detail"].to_string(),
            });
        }
        let io: Vec<IoReport> = ev
            .iter()
            .filter(|e| e["kind"] == "io")
            .filter_map(|e| serde_json::from_value(e["detail"].clone()).ok())
            .collect();
        if io.len() >= want {
            let t = backend_timing(c, name, disk).await.map_err(guest)?;
            return Ok((io, st, t.as_ref().and_then(BackendTime::of)));
        }
        if Instant::now() > deadline {
            return Err(Error::Phases {
                name: name.to_string(),
                got: io.len(),
                want,
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The median row by throughput of the rounds that measured; `None` when none did.
fn median(v: &[Row]) -> Option<Row> {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.mb_per_s.total_cmp(&b.mb_per_s));
    v.get(v.len() / 2).cloned()
}

/// Each variant's phases, each the median of the rounds that measured it (a phase
/// whose every pass failed has no row), with how many rounds that was.
fn medians(want: &[&str], rows: &[Row]) -> Vec<(Row, usize)> {
    want.iter()
        .flat_map(|v| {
            ["seqwrite", "seqread", "randread", "randwrite"].map(|p| {
                let of: Vec<Row> = rows
                    .iter()
                    .filter(|r| r.variant == *v && r.phase == p)
                    .cloned()
                    .collect();
                Some((median(&of)?, of.len()))
            })
        })
        .flatten()
        .collect()
}

pub async fn run(paths: &Paths, args: DiskArgs) -> Result<(), Error> {
    let want: Vec<&str> = args.variants.split(',').map(str::trim).collect();
    if let Some(bad) = want.iter().find(|v| !VARIANTS.contains(v)) {
        return Err(Error::Variant {
            bad: bad.to_string(),
        });
    }
    if args.runs == 0 || args.size < 16 {
        return Err(Error::Args);
    }
    let dir = args.out.scratch("disk")?;
    let disk = dir.join("disk.img");
    std::fs::File::create(&disk)
        .and_then(|f| f.set_len(args.size << 20))
        .map_err(|e| Error::DiskFile(disk.clone(), e))?;
    let c = connect(paths).await.map_err(Error::Connect)?;
    // Two wakes through eventfds on this host, no guest: the floor of a request's
    // kick and completion.
    let notify_us =
        tokio::task::spawn_blocking(|| rebound_blk::timing::notify_round_trip_us(5_000, 5))
            .await
            .map_err(Error::NotifyTask)?
            .map_err(Error::Notify)?;
    let (load_before, date) = (load_average(), rebound_vmm::events::wall_now());
    let tag = format!("bd{}", std::process::id());
    let progress = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let mut rows: Vec<Row> = Vec::new();
    let mut failures: Vec<crate::rounds::Failure> = Vec::new();
    let mut accel = String::new();
    let r: Result<(), Error> = async {
        for round in 0..args.runs {
            for v in &want {
                for (i, pass) in PASSES.iter().enumerate() {
                    let name = format!("{tag}-{v}-{i}-{round}");
                    if progress {
                        eprintln!("bench disk: {v}: {} in {} B requests", pass.0, pass.1);
                    }
                    let r = run_pass(&c, &args, v, &name, &disk.display().to_string(), *pass).await;
                    remove(&c, &name).await;
                    // A failed pass is recorded and left out; the next one is tried.
                    let (io, st, backend) = match r {
                        Ok(x) => x,
                        Err(e) => {
                            let e = Error::Pass {
                                variant: v.to_string(),
                                round: round + 1,
                                pass: pass.0.to_string(),
                                source: Box::new(e),
                            };
                            let f = crate::rounds::Failure::new("disk", round, &e);
                            eprintln!("{}", f.line());
                            failures.push(f);
                            continue;
                        }
                    };
                    accel = st.accel.as_str().to_string();
                    rows.extend(io.iter().map(|r| Row {
                        // The pass's one read phase is the class the backend timed.
                        backend: backend.clone().filter(|_| r.phase.ends_with("read")),
                        ..Row::of(v, round, r)
                    }));
                }
            }
        }
        Ok(())
    }
    .await;
    if args.out.dir.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    r?;
    let counted = medians(&want, &rows);
    let med: Vec<Row> = counted.iter().map(|(r, _)| r.clone()).collect();
    let tried = args.runs * want.len() * PASSES.len();
    let ratios = ratios(&med, &rows, args.runs);
    let meta = serde_json::json!({
        "date": date, "accel": accel, "host_cpus": host_cpus(), "host_kernel": host_kernel(),
        "size_mib": args.size, "io_seconds": args.io_seconds, "runs": args.runs,
        "load_before": load_before, "load_after": load_average(),
        "notify_round_trip_us": notify_us,
    });
    if let Some(svg) = &args.out.svg {
        std::fs::write(svg, draw(&meta, &med)).map_err(|e| Error::Svg(svg.clone(), e))?;
    }
    if args.out.json {
        let v = serde_json::json!({"meta": meta, "median": med, "runs": rows,
            "ratios": ratios.iter().map(|r| (r.name.clone(), serde_json::json!(r.of_medians))).collect::<serde_json::Map<_, _>>(),
            "ratios_per_round": ratios.iter().map(|r| (r.name.clone(), serde_json::json!(r.per_round))).collect::<serde_json::Map<_, _>>(),
            "failures": failures});
        println!("{}", serde_json::to_string_pretty(&v).map_err(Error::Json)?);
        return Ok(crate::rounds::Incomplete::check(&failures, tried)?);
    }
    println!(
        "rebound bench disk: {} MiB raw disk as /dev/vdb, guest O_DIRECT, 1 vCPU, 256 MiB; accel {}; {} run(s), medians; {}",
        args.size, meta["accel"].as_str().unwrap_or(""), args.runs, date
    );
    println!(
        "{:<16} {:<10} {:>8} {:>10} {:>10} {:>9} {:>9}",
        "variant", "phase", "bs", "MB/s", "IOPS", "p50 us", "p99 us"
    );
    for r in &med {
        println!(
            "{:<16} {:<10} {:>8} {:>10.1} {:>10.0} {:>9} {:>9}",
            r.variant, r.phase, r.bs, r.mb_per_s, r.iops, r.p50_us, r.p99_us
        );
    }
    for r in &ratios {
        let rounds: Vec<String> = r.per_round.iter().map(|x| format!("{x:.2}")).collect();
        println!(
            "{}: {:.2}x (ratio of medians; per round: {})",
            r.name,
            r.of_medians,
            rounds.join(", ")
        );
    }
    for l in where_time_goes(&med, notify_us) {
        println!("{l}");
    }
    for (r, n) in counted.iter().filter(|(_, n)| *n < args.runs) {
        println!(
            "{} {}: the median is of {n} of {} rounds (the others failed)",
            r.variant, r.phase, args.runs
        );
    }
    for f in &failures {
        println!("{}", f.line());
    }
    Ok(crate::rounds::Incomplete::check(&failures, tried)?)
}

/// For each read phase our backend served: the guest's time per request against the
/// backend's own, by phase, and the rest (the guest under its accelerator, and the
/// kick and completion through QEMU).
fn where_time_goes(med: &[Row], notify_us: f64) -> Vec<String> {
    let timed: Vec<&Row> = med.iter().filter(|r| r.backend.is_some()).collect();
    if timed.is_empty() {
        return Vec::new();
    }
    let mut out = vec![
        format!(
            "where a read's time goes, us per request (guest: the mean round trip at queue depth 1; backend: its own clock; host eventfd round trip, two wakes, no guest: {notify_us:.1} us):"
        ),
        format!(
            "{:<16} {:<10} {:>9} {:>8} {:>8} {:>9} {:>8}  backend by phase",
            "variant", "phase", "class", "guest", "backend", "outside", "b. wait"
        ),
    ];
    for r in timed {
        let b = r.backend.as_ref().expect("filtered");
        let phases: Vec<String> = b
            .phases_us
            .iter()
            .filter(|(_, us)| *us >= 0.005)
            .map(|(p, us)| format!("{p} {us:.2}"))
            .collect();
        let guest = r.guest_us();
        out.push(format!(
            "{:<16} {:<10} {:>9} {:>8.1} {:>8.2} {:>9.1} {:>8.1}  {} (clock reads {:.2}; {} requests)",
            r.variant,
            r.phase,
            b.class,
            guest,
            b.busy_us,
            guest - b.busy_us,
            b.wait_us,
            phases.join(", "),
            b.clock_us,
            b.requests
        ));
    }
    out
}

/// One comparison of two variants in one phase: the ratio of their medians and,
/// beside it, the ratio within each round (both measured in that round), which
/// shows how much the median hides.
#[derive(Debug, Clone, PartialEq)]
struct Ratio {
    name: String,
    of_medians: f64,
    per_round: Vec<f64>,
}

/// The comparisons the benchmark reports: Rebound's backend against QEMU's own
/// (`cache=none`), and its cache's hits against its misses.
fn ratios(med: &[Row], rows: &[Row], runs: usize) -> Vec<Ratio> {
    let pick = |set: &[Row], v: &str, p: &str, round: Option<usize>| {
        set.iter()
            .find(|r| r.variant == v && r.phase == p && round.is_none_or(|n| r.round == n))
            .map(|r| r.mb_per_s)
    };
    let mut out = Vec::new();
    for p in ["seqwrite", "seqread", "randread", "randwrite"] {
        for (a, b, what) in [
            ("rebound", "qemu-none", "rebound/qemu-none"),
            ("rebound-cache", "rebound", "hit/miss"),
        ] {
            let (Some(x), Some(y)) = (pick(med, a, p, None), pick(med, b, p, None)) else {
                continue;
            };
            let per_round = (0..runs)
                .filter_map(|n| Some(pick(rows, a, p, Some(n))? / pick(rows, b, p, Some(n))?))
                .collect();
            out.push(Ratio {
                name: format!("{what} {p}"),
                of_medians: x / y,
                per_round,
            });
        }
    }
    out
}

/// Throughput per phase and variant, as bars.
fn draw(meta: &Value, med: &[Row]) -> String {
    let (w, left, row, top) = (760.0, 190.0, 20.0, 50.0);
    let h = top + row * med.len() as f64 + 40.0;
    let max = med.iter().map(|r| r.mb_per_s).fold(1.0, f64::max);
    let x = |v: f64| v / max * (w - left - 90.0);
    let mut s = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">
<text x="10" y="18" font-size="14">Guest disk throughput, {} MiB raw disk, guest O_DIRECT, accel {}, {}</text>
<text x="10" y="36" fill="#555">sequential phases in 1 MiB requests, random in 4 KiB; label: MB/s and p99 latency</text>
"##,
        meta["size_mib"],
        meta["accel"].as_str().unwrap_or(""),
        meta["date"].as_str().unwrap_or("")
    );
    for (i, r) in med.iter().enumerate() {
        let y = top + row * i as f64;
        let color = match r.variant.as_str() {
            "qemu-none" => "#c44",
            "qemu-writeback" => "#e99",
            "rebound" => "#48c",
            _ => "#8bd",
        };
        s += &format!(
            "<text x=\"10\" y=\"{:.0}\">{} {}</text><rect x=\"{left}\" y=\"{y:.0}\" width=\"{:.1}\" height=\"14\" fill=\"{color}\"/><text x=\"{:.1}\" y=\"{:.0}\">{:.1} MB/s, p99 {} us</text>\n",
            y + 11.0,
            r.variant,
            r.phase,
            x(r.mb_per_s),
            left + x(r.mb_per_s) + 4.0,
            y + 11.0,
            r.mb_per_s,
            r.p99_us
        );
    }
    s += "</svg>\n";
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variants_choose_the_backend_and_caching() {
        let a = DiskArgs {
            size: 256,
            io_seconds: 5,
            runs: 1,
            variants: String::new(),
            out: Default::default(),
        };
        let s = |v| spec(&a, "x", v, "/d.img", PASSES[1]);
        assert!(s("qemu-none").disk_direct);
        assert_eq!(s("qemu-writeback").disk_backend, DiskBackend::Qemu);
        assert_eq!(s("rebound").disk_cache_mib, 0);
        assert_eq!(s("rebound-cache").disk_cache_mib, 320);
        let r = s("rebound");
        assert_eq!(r.workload_args["io_bs"], "4096");
        assert_eq!(r.workload_args["io_target"], "/dev/vdb");
        r.validate().unwrap();
    }

    /// A 1 MiB sequential-read row of `variant` in `round`.
    fn row(variant: &str, round: usize, mb_per_s: f64) -> Row {
        Row {
            variant: variant.into(),
            round,
            phase: "seqread".into(),
            bs: 1 << 20,
            mb_per_s,
            iops: 0.0,
            p50_us: 0,
            p99_us: 0,
            ops: 0,
            seconds: 1.0,
            backend: None,
        }
    }

    #[test]
    fn each_round_has_its_ratio_beside_the_ratio_of_medians() {
        // The figures of the issue: a median of 0.93x over rounds of 0.75, 1.06, 0.86.
        let rows = vec![
            row("rebound", 0, 75.0),
            row("qemu-none", 0, 100.0),
            row("rebound", 1, 106.0),
            row("qemu-none", 1, 100.0),
            row("rebound", 2, 86.0),
            row("qemu-none", 2, 100.0),
        ];
        let med = vec![row("rebound", 0, 86.0), row("qemu-none", 0, 100.0)];
        let r = ratios(&med, &rows, 3);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].name, "rebound/qemu-none seqread");
        assert!((r[0].of_medians - 0.86).abs() < 1e-9);
        let per: Vec<String> = r[0].per_round.iter().map(|x| format!("{x:.2}")).collect();
        assert_eq!(per, ["0.75", "1.06", "0.86"]);
    }

    #[test]
    fn a_failed_pass_leaves_its_round_out_of_the_median_and_the_ratios() {
        // rebound's seqread pass failed in round 2; qemu-none's every pass failed.
        let rows = vec![
            row("rebound", 0, 75.0),
            row("qemu-none", 0, 100.0),
            row("qemu-none", 1, 90.0),
            row("rebound", 2, 86.0),
            row("qemu-none", 2, 100.0),
        ];
        let m = medians(&["rebound", "qemu-none", "qemu-writeback"], &rows);
        let got: Vec<(&str, f64, usize)> = m
            .iter()
            .map(|(r, n)| (r.variant.as_str(), r.mb_per_s, *n))
            .collect();
        assert_eq!(got, [("rebound", 86.0, 2), ("qemu-none", 100.0, 3)]);
        let med: Vec<Row> = m.into_iter().map(|(r, _)| r).collect();
        let r = ratios(&med, &rows, 3);
        let per: Vec<String> = r[0].per_round.iter().map(|x| format!("{x:.2}")).collect();
        assert_eq!(per, ["0.75", "0.86"], "no ratio for the round that failed");
    }

    #[test]
    fn a_read_phase_shows_the_backends_time_against_the_guests() {
        use rebound_blk::timing::{ClassReport, TimingReport};
        let class = |requests: u64, cache_ns: u64, disk_ns: u64| ClassReport {
            requests,
            laps: requests * 10,
            ns: [
                ("cache".to_string(), cache_ns),
                ("disk".to_string(), disk_ns),
            ]
            .into_iter()
            .collect(),
            waits: requests,
            wait_ns: requests * 200_000,
            long_waits: 2,
        };
        let t = TimingReport {
            clock_ns: 20.0,
            classes: [
                ("read_hit".to_string(), class(1000, 5_000_000, 0)),
                ("read_miss".to_string(), class(40, 400_000, 3_200_000)),
            ]
            .into_iter()
            .collect(),
        };
        // The pass's reads are the class it made most of: hits here.
        let b = BackendTime::of(&t).unwrap();
        assert_eq!((b.class.as_str(), b.requests), ("read_hit", 1000));
        assert!((b.busy_us - 5.0).abs() < 1e-9);
        assert!((b.clock_us - 0.2).abs() < 1e-9);
        assert!((b.wait_us - 200.0).abs() < 1e-9);
        assert!(BackendTime::of(&TimingReport::default()).is_none());
        let row = Row {
            variant: "rebound-cache".into(),
            round: 0,
            phase: "randread".into(),
            bs: 4096,
            mb_per_s: 0.0,
            iops: 0.0,
            p50_us: 0,
            p99_us: 0,
            ops: 10_000,
            seconds: 2.0,
            backend: Some(b),
        };
        assert!((row.guest_us() - 200.0).abs() < 1e-9);
        let lines = where_time_goes(&[row], 30.0);
        assert_eq!(lines.len(), 3);
        assert!(lines[0].contains("30.0 us"), "{}", lines[0]);
        // 200 us in the guest's eyes, 5 in the backend: 195 outside it.
        assert!(
            lines[2].contains("  200.0     5.00     195.0"),
            "{}",
            lines[2]
        );
        assert!(lines[2].contains("cache 5.00"), "{}", lines[2]);
        assert!(where_time_goes(&[], 30.0).is_empty());
    }

    #[test]
    fn the_timing_is_the_bench_disks_not_another_of_the_guests() {
        let t = |n: u64| {
            serde_json::json!({"clock_ns": 20.0, "classes": {"read_hit": {
                "requests": n, "laps": 0, "ns": {}, "waits": 0, "wait_ns": 0, "long_waits": 0}}})
        };
        let disks = serde_json::json!([
            {"id": "disk0", "file": "/images/data.img", "backend": "rebound", "stats": {"timing": t(3)}},
            {"id": "disk1", "file": "/scratch/disk.img", "backend": "rebound", "stats": {"timing": t(20495)}},
        ]);
        let got = timing_of(&disks, "/scratch/disk.img").unwrap();
        assert_eq!(got.classes["read_hit"].requests, 20495);
        assert!(timing_of(&disks, "/elsewhere.img").is_none());
    }
}
