//! `rebound bench hcache` (Hcache sections 6.3 and 6.4): the exclusive host cache
//! against all memory in the guest, side by side in one run, and the miss-ratio curve
//! against guests of other sizes.
//!
//! Every run boots a fresh VM with the allocation X+Y on its own copy of one data disk
//! holding a set of 1 MiB files larger than the allocation (made on the host,
//! `rebound_image::write_fileset`), served by Rebound's backend with no cache of its
//! own. The `io` workload's file-set mode runs the same request sequence (its seed is
//! fixed) in every run; the `web` pattern serves a set of smaller files over HTTP to a
//! host-side client instead (`web`).
//!
//! 1. **Settings**: for each access pattern, all memory in the guest, then 12.5%, 25%,
//!    50% and 75% of it moved to the exclusive host cache (`vm memory --host-cache`)
//!    before the first request: disk reads per request (4 KiB blocks the backend read
//!    from the file, cold start included), throughput, the backend's CPU per request,
//!    and the eviction notices admitted and refused by reason. `io_ratio` is the
//!    worst ratio of disk reads per request against all-in-guest.
//! 2. **Curve**: the curve traced in the run with the largest host cache (`vm mrc`)
//!    predicts the disk reads of a guest of each validation size; a run with that much
//!    memory, all in the guest, counts them. `prediction_error_max` is the worst
//!    relative difference.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Args;
use hyper::Method;
use rebound_api::{MrcReport, VmStatus};
use rebound_vmm::paths::Paths;
use serde::Serialize;
use serde_json::{json, Value};

use crate::guest::{post, remove};
use crate::host::{host_cpus, host_kernel, load_average};
use rebound_client::{connect, Client};
use setup::{backend, files_reports, io_spec, make_disk, IoRun};
use web::Served;

mod alloc;
mod setup;
mod web;

const MIB: u64 = 1 << 20;

#[derive(Args, Debug)]
pub struct HcacheArgs {
    /// The VM's allocation X+Y, the same in every setting (at 75% moved the guest keeps
    /// a quarter: a TCG guest booted with 384 MiB cannot go below about 98 MiB).
    #[arg(long, default_value = "512M", value_parser = rebound_api::spec::parse_memory_mib)]
    allocation: u64,
    /// Files of 1 MiB in the set (more than the allocation, so some must miss).
    #[arg(long, default_value_t = 640)]
    files: u64,
    /// Requests per run (each reads, or with --write-ratio writes, one whole file).
    #[arg(long, default_value_t = 1500)]
    requests: u64,
    /// Access patterns: seq, random, zipf, class (the io workload), web (the web
    /// workload and a host-side client).
    #[arg(long, default_value = "seq,random,zipf,class,web")]
    patterns: String,
    /// Shares of the allocation moved to the host cache, in percent (all in the guest
    /// is always run first).
    #[arg(long, default_value = "12.5,25,50,75")]
    settings: String,
    /// Files in the web pattern's set.
    #[arg(long, default_value_t = 3000)]
    web_files: u64,
    /// Size of each of them.
    #[arg(long, default_value = "200K", value_parser = rebound_blk::args::parse_bytes)]
    web_file_size: u64,
    /// Requests per web run (Zipf popularity, one at a time; several per file, so
    /// the run is past its cold start).
    #[arg(long, default_value_t = 9000)]
    web_requests: u64,
    /// Probability that a request overwrites its file (io patterns).
    #[arg(long, default_value_t = 0.0)]
    write_ratio: f64,
    /// The pattern whose curve is validated.
    #[arg(long, default_value = "zipf")]
    validate_pattern: String,
    /// Guest sizes the curve is checked at (MiB, comma-separated; default: five below
    /// the allocation, down to the curve's start, and five above).
    #[arg(long)]
    validate_sizes: Option<String>,
    /// Skip the curve validation.
    #[arg(long)]
    no_validate: bool,
    /// Skip the allocation of memory between three VMs (`memory plan --apply`).
    #[arg(long)]
    no_allocation: bool,
    /// The allocation's bound on each VM's loss (isolated sharing).
    #[arg(long, default_value_t = 0.05)]
    bound: f64,
    /// Requests per round of the allocation's VMs.
    #[arg(long, default_value_t = 500)]
    allocation_requests: u64,
    #[command(flatten)]
    out: crate::out::BenchOut,
}

/// One run: one pattern, one setting.
#[derive(Debug, Clone, Serialize)]
struct Run {
    pattern: String,
    /// Percent of the allocation in the host cache.
    setting: f64,
    guest_mib: u64,
    host_cache_mib: u64,
    requests: u64,
    seconds: f64,
    requests_per_s: f64,
    /// 4 KiB blocks read from the disk file, per request.
    disk_reads_per_request: f64,
    disk_reads: u64,
    host_cache_hits: u64,
    /// The backend's CPU time (user + system) per request, ms.
    backend_cpu_ms_per_request: f64,
    notices_admitted: u64,
    notices_refused: BTreeMap<String, u64>,
    /// Notices the guest overwrote in its ring before the daemon read them, and the
    /// daemon's reads of the ring.
    notices_lost: u64,
    ring_polls: u64,
    /// Blocks whose signature did not check in the guest (must be 0).
    errors: u64,
}

#[derive(Debug, Clone, Serialize)]
struct Validation {
    guest_mib: u64,
    predicted_disk_reads: f64,
    measured_disk_reads: u64,
    relative_error: f64,
    below_allocation: bool,
}

fn parse_list(s: &str, what: &str) -> anyhow::Result<Vec<f64>> {
    s.split(',')
        .map(|x| {
            x.trim()
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v >= 0.0)
                .ok_or_else(|| anyhow::anyhow!("{what}: {x:?} is not a non-negative number"))
        })
        .collect()
}

/// Starts (or with `None` stops) the backend's access log.
fn record_to(control: &Path, path: Option<&Path>) -> anyhow::Result<()> {
    let v = rebound_blk::serve::ask(control, &json!({"op": "record", "path": path}))?;
    match v.get("error") {
        Some(e) => anyhow::bail!("{}: cannot record: {e}", control.display()),
        None => Ok(()),
    }
}

/// The curve algorithm against a plain simulation of the exclusive cache, on the
/// access log of one run: the mean absolute difference in miss ratio over `sizes`
/// sizes up to `max_blocks`, exact (the tracer's default) and sampled.
#[derive(Debug, Clone, Serialize)]
struct MrcCheck {
    events: usize,
    misses: u64,
    sizes: usize,
    max_blocks: u64,
    mae_exact: f64,
    sampled_rate: f64,
    mae_sampled: f64,
}

/// The sampled tracer's rate in the check (SHARDS' fixed rate).
const CHECK_RATE: f64 = 0.1;

fn mrc_check(trace: &Path, max_blocks: u64, sizes: u64) -> anyhow::Result<MrcCheck> {
    use rebound_mrc::{ExclusiveTracer, GuestEvent, MissRatioCurve};
    let text = std::fs::read_to_string(trace)?;
    let mut events = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let mut f = line.split(',');
        let (_, block, kind) = (f.next(), f.next(), f.next());
        let block: u64 = block
            .and_then(|b| b.parse().ok())
            .ok_or_else(|| anyhow::anyhow!("{}:{}: not t,block,kind", trace.display(), i + 1))?;
        events.push(match kind {
            Some("h") | Some("m") => GuestEvent::Miss(block),
            Some("e") => GuestEvent::Evict(block),
            _ => GuestEvent::Returned(block),
        });
    }
    let misses = events
        .iter()
        .filter(|e| matches!(e, GuestEvent::Miss(_)))
        .count() as u64;
    let step = (max_blocks / sizes).max(1);
    let grid: Vec<u64> = (0..=sizes).map(|i| i * step).collect();
    let sim: Vec<f64> = grid
        .iter()
        .map(|&s| rebound_mrc::lru_sim::exclusive_misses(&events, s) as f64 / misses.max(1) as f64)
        .collect();
    let mae = |mut t: ExclusiveTracer| -> anyhow::Result<f64> {
        events.iter().for_each(|e| t.record(*e));
        let c = MissRatioCurve::from_histogram(&t.histogram(), max_blocks + step)?;
        let mut sum = 0.0;
        for (s, want) in grid.iter().zip(&sim) {
            sum += (c.miss_ratio(*s)? - want).abs();
        }
        Ok(sum / grid.len() as f64)
    };
    Ok(MrcCheck {
        events: events.len(),
        misses,
        sizes: grid.len(),
        max_blocks,
        mae_exact: mae(ExclusiveTracer::with_bucket_width(1))?,
        sampled_rate: CHECK_RATE,
        mae_sampled: mae(ExclusiveTracer::sampled(CHECK_RATE, 1)?)?,
    })
}

/// User + system CPU seconds of a process.
fn cpu_s(pid: Option<u32>) -> f64 {
    let Some(pid) = pid else { return 0.0 };
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the command's closing parenthesis: utime and stime are 12 and 13.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // SAFETY: sysconf only reads a configuration value.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    (ticks(11) + ticks(12)) / hz
}

struct Setup<'a> {
    c: &'a Client,
    args: &'a HcacheArgs,
    /// The io patterns' set and the web pattern's, each when one of its patterns runs.
    base: Option<PathBuf>,
    web_base: Option<PathBuf>,
    dir: PathBuf,
    tag: String,
    progress: bool,
    accel: String,
    /// The setting whose run's accesses are logged, and the log once written.
    record_setting: Option<f64>,
    /// Guests smaller than this boot with it and are ballooned down (validation).
    boot_floor: Option<u64>,
    trace: Option<PathBuf>,
}

impl Setup<'_> {
    /// One run: boots `memory_mib`, moves `host_cache_mib` of it to the host cache,
    /// runs the requests; with a host cache, the curve it traced comes back too.
    async fn run(
        &mut self,
        pattern: &str,
        setting: f64,
        memory_mib: u64,
        host_cache_mib: u64,
    ) -> anyhow::Result<(Run, Option<MrcReport>)> {
        let name = format!(
            "{}-{pattern}-{}-{memory_mib}",
            self.tag,
            (setting * 10.0) as u64
        );
        if self.progress {
            eprintln!(
                "bench hcache: {pattern}, {memory_mib} MiB, {host_cache_mib} MiB of it host cache"
            );
        }
        let disk = self.dir.join(format!("{name}.ext4"));
        let base = match pattern {
            "web" => &self.web_base,
            _ => &self.base,
        };
        let base = base
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("no file set was made for the {pattern} pattern"))?;
        std::fs::copy(base, &disk)?;
        let r = self
            .run_vm(&name, &disk, pattern, setting, memory_mib, host_cache_mib)
            .await;
        remove(self.c, &name).await;
        let _ = std::fs::remove_file(&disk);
        r
    }

    async fn run_vm(
        &mut self,
        name: &str,
        disk: &Path,
        pattern: &str,
        setting: f64,
        memory_mib: u64,
        host_cache_mib: u64,
    ) -> anyhow::Result<(Run, Option<MrcReport>)> {
        let c = self.c;
        // A validation guest below the allocation is the VM the curve was traced in,
        // resized: booted with the allocation and ballooned down (a guest booted
        // smaller has more page cache at the same size: smaller kernel tables).
        let boot = self.boot_floor.map_or(memory_mib, |b| b.max(memory_mib));
        let run = IoRun {
            pattern,
            files: self.args.files,
            requests: self.args.requests,
            rounds: 1,
            write_ratio: self.args.write_ratio,
        };
        let s = match pattern {
            "web" => web::spec(name, disk, boot),
            _ => io_spec(name, disk, boot, &run),
        };
        let _: VmStatus = post(c, "/v1/vms", Some(&serde_json::to_value(&s)?)).await?;
        let st: VmStatus = post(
            c,
            &format!("/v1/vms/{name}/wait?for=ready&timeout_ms=600000"),
            None,
        )
        .await?;
        self.accel = st.accel.as_str().to_string();
        if boot > memory_mib {
            let _: Value = post(
                c,
                &format!("/v1/vms/{name}/memory"),
                Some(&json!({"allocation_bytes": memory_mib * MIB})),
            )
            .await?;
        }
        if host_cache_mib > 0 {
            let _: Value = post(
                c,
                &format!("/v1/vms/{name}/memory"),
                Some(&json!({"host_cache_bytes": host_cache_mib * MIB})),
            )
            .await?;
        }
        let (s0, pid, control) = backend(c, name).await?;
        let cpu0 = cpu_s(pid);
        // The run whose curve is validated also logs every access the curve is traced
        // from, to check the curve algorithm against a plain simulation of that log.
        let record = (host_cache_mib > 0
            && self.record_setting == Some(setting)
            && pattern == self.args.validate_pattern)
            .then(|| (control.clone(), self.dir.join("trace.csv")));
        if let Some((Some(ctl), path)) = &record {
            record_to(ctl, Some(path))?;
        }
        let last = match pattern {
            "web" => {
                let a = self.args;
                web::drive(&st, a.web_files, a.web_file_size, a.web_requests).await?
            }
            _ => self.io_requests(name).await?,
        };
        let (s1, _, _) = backend(c, name).await?;
        let cpu = cpu_s(pid) - cpu0;
        if let Some((Some(ctl), path)) = &record {
            record_to(ctl, None)?;
            self.trace = Some(path.clone());
        }
        let ev: Value = c
            .call(Method::GET, &format!("/v1/vms/{name}/evict"), None)
            .await?;
        let curve = match host_cache_mib {
            0 => None,
            _ => Some(
                c.call(Method::GET, &format!("/v1/vms/{name}/mrc"), None)
                    .await?,
            ),
        };
        let n = |s: &Value, k: &str| s["cache"][k].as_u64().unwrap_or(0);
        let disk_reads = n(&s1, "misses") - n(&s0, "misses");
        let requests = last.requests.max(1);
        let refused = s1["notices_refused"]
            .as_object()
            .map(|m| {
                m.iter()
                    .filter(|(_, v)| v.as_u64() != Some(0))
                    .map(|(k, v)| (k.clone(), v.as_u64().unwrap_or(0)))
                    .collect()
            })
            .unwrap_or_default();
        let run = Run {
            pattern: pattern.into(),
            setting,
            guest_mib: memory_mib - host_cache_mib,
            host_cache_mib,
            requests: last.requests,
            seconds: last.seconds,
            requests_per_s: last.requests as f64 / last.seconds.max(1e-9),
            disk_reads_per_request: disk_reads as f64 / requests as f64,
            disk_reads,
            host_cache_hits: n(&s1, "hits") - n(&s0, "hits"),
            backend_cpu_ms_per_request: cpu * 1000.0 / requests as f64,
            notices_admitted: s1["notices_admitted"].as_u64().unwrap_or(0),
            notices_refused: refused,
            notices_lost: ev["lost"].as_u64().unwrap_or(0),
            ring_polls: ev["polls"].as_u64().unwrap_or(0),
            errors: last.errors,
        };
        if last.errors > 0 {
            anyhow::bail!(
                "{name}: the guest read wrong data: {}",
                last.first_error.unwrap_or_default()
            );
        }
        Ok((run, curve))
    }

    /// Waits for the io workload's report of its last request.
    async fn io_requests(&self, name: &str) -> anyhow::Result<Served> {
        let c = self.c;
        if !files_reports(c, name).await?.is_empty() {
            anyhow::bail!("{name}: the workload began before the host cache was in place");
        }
        let deadline = Instant::now() + Duration::from_secs(3600);
        loop {
            let r = files_reports(c, name).await?;
            if let Some(l) = r.into_iter().find(|r| r.requests >= self.args.requests) {
                return Ok(Served {
                    requests: l.requests,
                    seconds: l.seconds,
                    errors: l.errors,
                    first_error: l.first_error,
                });
            }
            if Instant::now() > deadline {
                anyhow::bail!(
                    "{name}: {} requests not done after an hour",
                    self.args.requests
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// Misses a curve predicts for a guest of `bytes` (the last point at or below it).
fn predicted(curve: &MrcReport, bytes: u64) -> Option<f64> {
    let d = curve.disks.first()?;
    d.points
        .iter()
        .rfind(|p| p.bytes <= bytes)
        .map(|p| p.misses)
}

pub async fn run(paths: &Paths, args: HcacheArgs) -> anyhow::Result<()> {
    let patterns: Vec<String> = args
        .patterns
        .split(',')
        .map(|p| p.trim().to_string())
        .collect();
    // Every pattern that runs: the settings', and the validated one.
    let runs_of: Vec<&str> = patterns
        .iter()
        .map(String::as_str)
        .chain((!args.no_validate).then_some(args.validate_pattern.as_str()))
        .collect();
    if let Some(p) = runs_of
        .iter()
        .find(|p| !["seq", "random", "zipf", "class", "web"].contains(p))
    {
        anyhow::bail!("unknown pattern {p:?}: seq, random, zipf, class or web");
    }
    let settings = parse_list(&args.settings, "--settings")?;
    if settings.iter().any(|s| *s >= 100.0) {
        anyhow::bail!("--settings are percentages below 100");
    }
    let (io, web) = (
        runs_of.iter().any(|p| *p != "web"),
        runs_of.contains(&"web"),
    );
    if io && args.files * MIB <= args.allocation * MIB {
        anyhow::bail!(
            "--files {} MiB is not more than the {} MiB allocation: nothing would ever miss",
            args.files,
            args.allocation
        );
    }
    if web && args.web_files * args.web_file_size <= args.allocation * MIB {
        anyhow::bail!(
            "--web-files x --web-file-size is not more than the {} MiB allocation: nothing would ever miss",
            args.allocation
        );
    }
    let dir = args.out.scratch("hcache")?;
    let c = connect(paths).await?;
    let (load_before, date) = (load_average(), rebound_vmm::events::wall_now());
    let mut setup = Setup {
        c: &c,
        args: &args,
        base: match io {
            true => Some(make_disk(&dir, args.files)?),
            false => None,
        },
        web_base: match web {
            true => Some(crate::webload::make_set(
                &dir,
                args.web_files,
                args.web_file_size,
            )?),
            false => None,
        },
        dir: dir.clone(),
        tag: format!("bh{}", std::process::id()),
        progress: std::io::IsTerminal::is_terminal(&std::io::stderr()),
        accel: String::new(),
        record_setting: settings.iter().copied().reduce(f64::max),
        boot_floor: None,
        trace: None,
    };
    let mut runs: Vec<Run> = Vec::new();
    let mut curve: Option<(f64, MrcReport)> = None;
    let mut validation: Vec<Validation> = Vec::new();
    let mut alloc = None;
    let r: anyhow::Result<()> = async {
        for p in &patterns {
            for &s in std::iter::once(&0.0).chain(&settings) {
                let y = (args.allocation as f64 * s / 100.0).round() as u64;
                let (run, c) = setup.run(p, s, args.allocation, y).await?;
                runs.push(run);
                if *p == args.validate_pattern && curve.as_ref().is_none_or(|(b, _)| s > *b) {
                    curve = c.map(|c| (s, c));
                }
            }
        }
        if !args.no_allocation {
            let tag = setup.tag.clone();
            alloc = Some(
                alloc::run(
                    &c,
                    &dir,
                    &tag,
                    args.allocation_requests,
                    args.bound,
                    setup.progress,
                )
                .await?,
            );
        }
        if args.no_validate {
            return Ok(());
        }
        let Some((_, mrc)) = &curve else {
            anyhow::bail!(
                "no curve of the {} pattern to validate",
                args.validate_pattern
            );
        };
        let from = mrc.guest_bytes / MIB;
        let sizes = match &args.validate_sizes {
            Some(s) => parse_list(s, "--validate-sizes")?
                .iter()
                .map(|v| *v as u64)
                .collect(),
            None => {
                let a = args.allocation;
                let step = (a - from) / 5;
                let below = (0..5).map(|i| from + step / 2 + i * step);
                let above = (1..=5).map(|i| a + i * a / 5);
                below.chain(above).map(|m| m / 4 * 4).collect::<Vec<u64>>()
            }
        };
        setup.boot_floor = Some(args.allocation);
        for m in sizes {
            let (run, _) = setup.run(&args.validate_pattern, 0.0, m, 0).await?;
            let pred = predicted(mrc, m * MIB).ok_or_else(|| {
                anyhow::anyhow!("{m} MiB is below where the curve starts ({from} MiB)")
            })?;
            let meas = run.disk_reads;
            validation.push(Validation {
                guest_mib: m,
                predicted_disk_reads: pred,
                measured_disk_reads: meas,
                relative_error: (pred - meas as f64).abs() / (meas.max(1) as f64),
                below_allocation: m < args.allocation,
            });
            runs.push(run);
        }
        Ok(())
    }
    .await;
    // Up to twice the largest host cache, in 4 KiB blocks, at 64 sizes.
    let check = match (&r, &setup.trace) {
        (Ok(()), Some(t)) => {
            let y = (args.allocation as f64 * setup.record_setting.unwrap_or(0.0) / 100.0) as u64;
            Some(mrc_check(t, 2 * y * MIB / 4096, 64)?)
        }
        _ => None,
    };
    if args.out.dir.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    r?;
    let mrc_mae = check.as_ref().map(|c| c.mae_exact.max(c.mae_sampled));
    if let (Some(svg), Some((s, mrc))) = (&args.out.svg, &curve) {
        let measured: Vec<(f64, f64)> = validation
            .iter()
            .map(|v| (v.guest_mib as f64, v.measured_disk_reads as f64))
            .collect();
        let name = format!("{} at {s}% in the host cache", args.validate_pattern);
        rebound_plot::mrc(&name, mrc, &measured, svg)?;
    }
    let base = |p: &str| {
        runs.iter()
            .find(|r| r.pattern == p && r.setting == 0.0 && r.guest_mib == args.allocation)
            .map(|r| r.disk_reads_per_request)
    };
    let io_ratio = runs
        .iter()
        .filter(|r| r.setting > 0.0)
        .filter_map(|r| Some(r.disk_reads_per_request / base(&r.pattern)?.max(1e-9)))
        .fold(0.0, f64::max);
    let prediction_error_max = validation
        .iter()
        .map(|v| v.relative_error)
        .fold(0.0, f64::max);
    let meta = json!({
        "date": date, "accel": setup.accel, "host_cpus": host_cpus(), "host_kernel": host_kernel(),
        "allocation_mib": args.allocation, "files": args.files, "file_mib": 1,
        "requests": args.requests, "write_ratio": args.write_ratio,
        "web_files": args.web_files, "web_file_size": args.web_file_size,
        "web_requests": args.web_requests, "web_skew": web::SKEW,
        "load_before": load_before, "load_after": load_average(),
    });
    if args.out.json {
        let v = json!({"meta": meta, "io_ratio": io_ratio, "mrc_mae": mrc_mae, "mrc_check": check,
            "bound_violations": alloc.as_ref().map(|a: &alloc::AllocOutcome| a.bound_violations),
            "allocation": alloc,
            "prediction_error_max": if validation.is_empty() { Value::Null } else { json!(prediction_error_max) },
            "runs": runs, "validation": validation,
            "curve": curve.map(|(_, c)| c)});
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!(
        "rebound bench hcache: allocation {} MiB, {} files of 1 MiB, {} requests per run, write ratio {}; web: {} files of {} KiB, {} requests; accel {}; {}",
        args.allocation, args.files, args.requests, args.write_ratio, args.web_files,
        args.web_file_size >> 10, args.web_requests, setup.accel, date
    );
    println!(
        "{:<7} {:>6} {:>6} {:>6} {:>10} {:>8} {:>9} {:>8}  refused",
        "pattern", "cache%", "guest", "cache", "reads/req", "vs 0%", "req/s", "cpu ms"
    );
    for r in &runs {
        println!(
            "{:<7} {:>6} {:>6} {:>6} {:>10.1} {:>8} {:>9.2} {:>8.2}  {:?}",
            r.pattern,
            r.setting,
            r.guest_mib,
            r.host_cache_mib,
            r.disk_reads_per_request,
            base(&r.pattern)
                .filter(|_| r.guest_mib + r.host_cache_mib == args.allocation)
                .map(|b| format!("{:.3}", r.disk_reads_per_request / b.max(1e-9)))
                .unwrap_or_else(|| "-".into()),
            r.requests_per_s,
            r.backend_cpu_ms_per_request,
            r.notices_refused
        );
    }
    println!("io_ratio (worst, host cache against all in the guest): {io_ratio:.3}");
    for v in &validation {
        println!(
            "guest {:>5} MiB: predicted {:>9.0} disk reads, measured {:>9}, error {:.1}%",
            v.guest_mib,
            v.predicted_disk_reads,
            v.measured_disk_reads,
            v.relative_error * 100.0
        );
    }
    if !validation.is_empty() {
        println!("prediction_error_max: {:.1}%", prediction_error_max * 100.0);
    }
    if let Some(a) = &alloc {
        println!(
            "allocation ({}, bound {}): {} of {} VMs over the bound",
            a.policy,
            a.bound,
            a.bound_violations,
            a.vms.len()
        );
        for v in &a.vms {
            println!(
                "  {:<6} {:<5} {:>4} -> {:>4} MiB: reads/request {:.1} -> {:.1}, predicted x{:.3}, measured x{:.3}{}",
                v.role,
                v.pattern,
                v.baseline_mib,
                v.applied_mib.unwrap_or(v.baseline_mib),
                v.baseline_reads_per_request,
                v.outcome_reads_per_request,
                v.predicted_relative,
                v.measured_relative,
                v.error.as_ref().map(|e| format!(" ({e})")).unwrap_or_default()
            );
        }
    }
    if let Some(c) = &check {
        println!(
            "curve algorithm against a simulated exclusive LRU on the {} events of one run, {} sizes up to {} blocks: mean absolute error exact {:.4}, sampled at {} {:.4}",
            c.events, c.sizes, c.max_blocks, c.mae_exact, c.sampled_rate, c.mae_sampled
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rebound_api::{DiskMrc, MrcPoint};

    #[test]
    fn a_size_takes_the_last_point_at_or_below_it() {
        let point = |mib: u64, misses: f64| MrcPoint {
            bytes: mib * MIB,
            misses,
            vs_allocation: None,
        };
        let curve = MrcReport {
            guest_bytes: 96 * MIB,
            allocation_bytes: 192 * MIB,
            disks: vec![DiskMrc {
                id: "disk1".into(),
                host_cache_bytes: 96 * MIB,
                rate: 1.0,
                misses: 10,
                evicted_blocks: 0,
                inconsistent_blocks: 0,
                points: vec![point(96, 10.0), point(100, 7.0), point(768, 7.0)],
                detail: None,
            }],
        };
        assert_eq!(predicted(&curve, 96 * MIB), Some(10.0));
        assert_eq!(predicted(&curve, 99 * MIB), Some(10.0));
        assert_eq!(predicted(&curve, 300 * MIB), Some(7.0));
        assert_eq!(predicted(&curve, 64 * MIB), None);
        assert!(parse_list("12.5, 25", "x").is_ok());
        assert!(parse_list("12.5,-1", "x").is_err());
    }
}
