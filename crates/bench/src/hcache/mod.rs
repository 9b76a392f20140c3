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
//! 2. **Curve** (`validate`), for every pattern: the curve traced in the pattern's run
//!    with the largest host cache (`vm mrc`) predicts the disk reads of a guest of each
//!    validation size; a run with that much memory, all in the guest, counts them. The
//!    sizes are even steps from the curve's start (that run's guest memory) to the
//!    allocation and one step beyond (`--validate-steps`, default 3: 128, 256, 384,
//!    512 and 640 MiB at the defaults); the allocation's own count is the settings'
//!    all-in-guest run, so each pattern costs four more runs. Below the allocation a
//!    validation guest is the traced VM resized (booted with the allocation and
//!    ballooned down). Each size reports the relative error and the error in miss
//!    ratio (over the 4 KiB blocks the requests read: the relative error explodes
//!    where a guest misses almost nothing). `prediction_error_max` is the worst
//!    relative error over every pattern and size, the curve's start included, and
//!    names where it was. The same runs log every access, and the curve algorithm is
//!    checked against a plain simulation of each log (`mrc_mae`: the worst pattern).
//! 3. **Allocation** (`alloc`): two VMs whose misses both fall with memory; the
//!    isolated-sharing plan moves memory between them and each VM's reads after the
//!    move, over `--allocation-rounds` rounds, are measured against the plan's
//!    prediction and its bound, with the noise the rounds' spread gives the change.
//!    `--allocation-only` runs this part alone.
//!
//! Duration at the defaults, on 2 CPUs under TCG with a quiet host: about 35 minutes.
//! An io run is a boot, the 8 s delay and 1,500 requests (about 15 s); a web run is
//! about 75 s (9,000 requests one at a time); the allocation's two VMs about 6 minutes
//! (19 rounds of 500 requests at about 20 s each: 4 warm-up, 7 baseline, the
//! transition, 7 outcome).
//! The settings are 25 runs, the validation 20 (four per pattern): the number of
//! sizes trades time for resolution, and three steps below the allocation plus one
//! above it put a point at the curve's start, at its end and every 128 MiB between for
//! about 10 minutes, a third of it the web pattern's. `--validate-steps 1` (the start,
//! the allocation and one size beyond) halves that.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Args;
use rebound_api::{MrcReport, VmStatus};
use rebound_vmm::paths::Paths;
use serde::Serialize;
use serde_json::{json, Value};

use crate::guest::{get, post, remove};
use crate::host::{host_cpus, host_kernel, load_average};
use rebound_client::{connect, Client, ClientError};
use setup::{backend, files_reports, io_spec, make_disk, IoRun};
use validate::{predicted, MrcCheck, Validation};
use web::Served;

mod alloc;
mod draw;
mod report;
mod setup;
mod validate;
mod web;

const MIB: u64 = 1 << 20;

/// Why the host-cache benchmark failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("unknown pattern {0:?}: seq, random, zipf, class or web")]
    Pattern(String),
    #[error("{what}: {item:?} is not a non-negative number")]
    List { what: &'static str, item: String },
    #[error("--settings are percentages below 100")]
    Settings,
    #[error(
        "no curve to validate: --settings moves nothing to the host cache (or pass --no-validate)"
    )]
    NothingTraced,
    #[error("--validate-sizes: {size} MiB is below where the curves start ({start} MiB)")]
    BelowStart { size: u64, start: u64 },
    #[error("--files {files} MiB is not more than the {allocation} MiB allocation: nothing would ever miss")]
    FewFiles { files: u64, allocation: u64 },
    #[error("--web-files x --web-file-size is not more than the {0} MiB allocation: nothing would ever miss")]
    FewWebFiles(u64),
    #[error("--allocation-only and --no-allocation leave nothing to run")]
    NothingToRun,
    #[error(transparent)]
    Scratch(#[from] crate::out::ScratchError),
    #[error("no daemon to run the guests")]
    Connect(#[source] ClientError),
    #[error(transparent)]
    Setup(#[from] setup::Error),
    #[error(transparent)]
    WebSet(#[from] crate::webload::Error),
    #[error(transparent)]
    Guest(#[from] crate::guest::Error),
    #[error("the VM spec of {0} does not encode as JSON")]
    Spec(String, #[source] serde_json::Error),
    #[error("no file set was made for the {0} pattern")]
    NoSet(String),
    #[error("cannot copy the file set's image to {}", .0.display())]
    CopyDisk(PathBuf, #[source] std::io::Error),
    #[error("{}: cannot record the accesses", .0.display())]
    Record(PathBuf, #[source] std::io::Error),
    #[error("{}: cannot record the accesses: {answer}", .control.display())]
    RecordRefused { control: PathBuf, answer: Value },
    #[error(transparent)]
    Web(#[from] web::Error),
    #[error("{name}: the guest read wrong data: {first}")]
    WrongData { name: String, first: String },
    #[error("{0}: the workload began before the host cache was in place")]
    Early(String),
    #[error("{name}: {requests} requests not done after an hour")]
    NotDone { name: String, requests: u64 },
    #[error("the allocation between two VMs failed")]
    Alloc(#[from] alloc::Error),
    #[error("no curve of the {0} pattern to validate: --settings has no host cache")]
    NoCurve(String),
    #[error("{size} MiB is below where the {pattern} curve starts ({start} MiB)")]
    BelowCurve {
        size: u64,
        pattern: String,
        start: u64,
    },
    #[error(transparent)]
    Check(#[from] validate::Error),
    #[error("cannot write {}", .0.display())]
    Svg(PathBuf, #[source] std::io::Error),
    #[error(transparent)]
    Report(#[from] report::Error),
}

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
    /// Even steps from the curve's start (the guest's memory at the largest setting)
    /// to the allocation at which every pattern's curve is checked, plus one step
    /// beyond the allocation: each size but the allocation is one more run.
    #[arg(long, default_value_t = 3)]
    validate_steps: u64,
    /// Guest sizes the curves are checked at instead (MiB, comma-separated, none below
    /// the curve's start).
    #[arg(long)]
    validate_sizes: Option<String>,
    /// Skip the curve validation.
    #[arg(long)]
    no_validate: bool,
    /// Skip the allocation of memory between two VMs (`memory plan --apply`).
    #[arg(long)]
    no_allocation: bool,
    /// Run only the allocation of memory between two VMs (no settings, no curve
    /// validation).
    #[arg(long)]
    allocation_only: bool,
    /// The allocation's bound on each VM's loss (isolated sharing).
    #[arg(long, default_value_t = 0.05)]
    bound: f64,
    /// How far under the bound the plan stays (default: the daemon's, 0.03).
    #[arg(long)]
    margin: Option<f64>,
    /// Requests per round of the allocation's VMs.
    #[arg(long, default_value_t = 500)]
    allocation_requests: u64,
    /// Baseline rounds of the allocation's VMs, and as many after the move: more
    /// rounds, less noise in each VM's measured change (it falls as the square root).
    #[arg(long, default_value_t = 7)]
    allocation_rounds: u64,
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
    /// 4 KiB blocks the requests read (the guest's accesses, hits and misses).
    blocks_read: u64,
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

fn parse_list(s: &str, what: &'static str) -> Result<Vec<f64>, Error> {
    s.split(',')
        .map(|x| {
            x.trim()
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v >= 0.0)
                .ok_or_else(|| Error::List {
                    what,
                    item: x.to_string(),
                })
        })
        .collect()
}

/// The host cache of a setting: `percent` of the allocation, to the nearest MiB.
fn host_cache_mib(allocation: u64, percent: f64) -> u64 {
    (allocation as f64 * percent / 100.0).round() as u64
}

/// Starts (or with `None` stops) the backend's access log.
fn record_to(control: &Path, path: Option<&Path>) -> Result<(), Error> {
    let v = rebound_blk::serve::ask(control, &json!({"op": "record", "path": path}))
        .map_err(|e| Error::Record(control.into(), e))?;
    match v.get("error") {
        Some(e) => Err(Error::RecordRefused {
            control: control.into(),
            answer: e.clone(),
        }),
        None => Ok(()),
    }
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
    /// The setting whose runs' accesses are logged, and each pattern's log once
    /// written.
    record_setting: Option<f64>,
    /// Guests smaller than this boot with it and are ballooned down (validation).
    boot_floor: Option<u64>,
    traces: Vec<(String, PathBuf)>,
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
    ) -> Result<(Run, Option<MrcReport>), Error> {
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
            .ok_or_else(|| Error::NoSet(pattern.to_string()))?;
        std::fs::copy(base, &disk).map_err(|e| Error::CopyDisk(disk.clone(), e))?;
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
    ) -> Result<(Run, Option<MrcReport>), Error> {
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
        let spec = serde_json::to_value(&s).map_err(|e| Error::Spec(name.to_string(), e))?;
        let _: VmStatus = post(c, "/v1/vms", Some(&spec)).await?;
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
        // The runs whose curves are validated also log every access the curve is
        // traced from, to check the curve algorithm against a plain simulation of it.
        let record =
            (host_cache_mib > 0 && self.record_setting == Some(setting) && !self.args.no_validate)
                .then(|| {
                    (
                        control.clone(),
                        self.dir.join(format!("trace-{pattern}.csv")),
                    )
                });
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
            self.traces.push((pattern.to_string(), path.clone()));
        }
        let ev: Value = get(c, &format!("/v1/vms/{name}/evict")).await?;
        let curve = match host_cache_mib {
            0 => None,
            _ => Some(get(c, &format!("/v1/vms/{name}/mrc")).await?),
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
            blocks_read: last.bytes_read / 4096,
            host_cache_hits: n(&s1, "hits") - n(&s0, "hits"),
            backend_cpu_ms_per_request: cpu * 1000.0 / requests as f64,
            notices_admitted: s1["notices_admitted"].as_u64().unwrap_or(0),
            notices_refused: refused,
            notices_lost: ev["lost"].as_u64().unwrap_or(0),
            ring_polls: ev["polls"].as_u64().unwrap_or(0),
            errors: last.errors,
        };
        if last.errors > 0 {
            return Err(Error::WrongData {
                name: name.to_string(),
                first: last.first_error.unwrap_or_default(),
            });
        }
        Ok((run, curve))
    }

    /// Waits for the io workload's report of its last request.
    async fn io_requests(&self, name: &str) -> Result<Served, Error> {
        let c = self.c;
        if !files_reports(c, name).await?.is_empty() {
            return Err(Error::Early(name.to_string()));
        }
        let deadline = Instant::now() + Duration::from_secs(3600);
        loop {
            let r = files_reports(c, name).await?;
            if let Some(l) = r.into_iter().find(|r| r.requests >= self.args.requests) {
                return Ok(Served {
                    requests: l.requests,
                    bytes_read: l.bytes_read,
                    seconds: l.seconds,
                    errors: l.errors,
                    first_error: l.first_error,
                });
            }
            if Instant::now() > deadline {
                return Err(Error::NotDone {
                    name: name.to_string(),
                    requests: self.args.requests,
                });
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// What one invocation found, for the text, JSON and SVG reports.
struct Results {
    runs: Vec<Run>,
    /// Per pattern: the largest setting and the curve traced in its run.
    curves: BTreeMap<String, (f64, MrcReport)>,
    validation: Vec<Validation>,
    checks: Vec<MrcCheck>,
    alloc: Option<alloc::AllocOutcome>,
}

pub async fn run(paths: &Paths, mut args: HcacheArgs) -> Result<(), Error> {
    if args.allocation_only {
        if args.no_allocation {
            return Err(Error::NothingToRun);
        }
        // The allocation needs neither the settings' runs nor their file sets.
        args.no_validate = true;
    }
    let patterns: Vec<String> = match args.allocation_only {
        true => Vec::new(),
        false => args
            .patterns
            .split(',')
            .map(|p| p.trim().to_string())
            .collect(),
    };
    if let Some(p) = patterns
        .iter()
        .find(|p| !["seq", "random", "zipf", "class", "web"].contains(&p.as_str()))
    {
        return Err(Error::Pattern(p.clone()));
    }
    let settings = parse_list(&args.settings, "--settings")?;
    if settings.iter().any(|s| *s >= 100.0) {
        return Err(Error::Settings);
    }
    let explicit_sizes: Option<Vec<u64>> = match &args.validate_sizes {
        Some(s) => Some(
            parse_list(s, "--validate-sizes")?
                .iter()
                .map(|v| *v as u64)
                .collect(),
        ),
        None => None,
    };
    // Checked now rather than after the settings' runs: where the curves will start.
    if !args.no_validate {
        let Some(max) = settings
            .iter()
            .copied()
            .reduce(f64::max)
            .filter(|m| *m > 0.0)
        else {
            return Err(Error::NothingTraced);
        };
        let start = args.allocation - host_cache_mib(args.allocation, max);
        if let Some(&size) = explicit_sizes.iter().flatten().find(|m| **m < start) {
            return Err(Error::BelowStart { size, start });
        }
    }
    let (io, web) = (
        patterns.iter().any(|p| p != "web"),
        patterns.iter().any(|p| p == "web"),
    );
    if io && args.files * MIB <= args.allocation * MIB {
        return Err(Error::FewFiles {
            files: args.files,
            allocation: args.allocation,
        });
    }
    if web && args.web_files * args.web_file_size <= args.allocation * MIB {
        return Err(Error::FewWebFiles(args.allocation));
    }
    let dir = args.out.scratch("hcache")?;
    let c = connect(paths).await.map_err(Error::Connect)?;
    let (load_before, date) = (load_average(), rebound_vmm::events::wall_now());
    let started = Instant::now();
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
        traces: Vec::new(),
    };
    let mut res = Results {
        runs: Vec::new(),
        curves: BTreeMap::new(),
        validation: Vec::new(),
        checks: Vec::new(),
        alloc: None,
    };
    let r: Result<(), Error> = async {
        for p in &patterns {
            for &s in std::iter::once(&0.0).chain(&settings) {
                let y = host_cache_mib(args.allocation, s);
                let (run, c) = setup.run(p, s, args.allocation, y).await?;
                res.runs.push(run);
                if let Some(c) = c.filter(|_| setup.record_setting == Some(s)) {
                    res.curves.insert(p.clone(), (s, c));
                }
            }
        }
        if !args.no_allocation {
            let tag = setup.tag.clone();
            let a = alloc::AllocArgs {
                requests: args.allocation_requests,
                rounds: args.allocation_rounds,
                bound: args.bound,
                margin: args.margin,
                progress: setup.progress,
            };
            let out = alloc::run(&c, &dir, &tag, &a).await?;
            if setup.accel.is_empty() {
                // `--allocation-only` boots no other VM to name it.
                setup.accel = out.accel.clone();
            }
            res.alloc = Some(out);
        }
        if args.no_validate {
            return Ok(());
        }
        setup.boot_floor = Some(args.allocation);
        for p in &patterns {
            let Some((_, mrc)) = res.curves.get(p) else {
                return Err(Error::NoCurve(p.clone()));
            };
            let from = validate::start_mib(mrc);
            let sizes = explicit_sizes
                .clone()
                .unwrap_or_else(|| validate::sizes(from, args.allocation, args.validate_steps));
            for m in sizes {
                let pred = predicted(mrc, m * MIB).ok_or_else(|| Error::BelowCurve {
                    size: m,
                    pattern: p.clone(),
                    start: from,
                })?;
                // The allocation all in the guest is the settings' first run.
                let done = res
                    .runs
                    .iter()
                    .find(|r| &r.pattern == p && r.setting == 0.0 && r.guest_mib == m)
                    .cloned();
                let run = match done {
                    Some(r) => r,
                    None => {
                        let (r, _) = setup.run(p, 0.0, m, 0).await?;
                        res.runs.push(r.clone());
                        r
                    }
                };
                res.validation.push(Validation::new(
                    p,
                    m,
                    m == from,
                    pred,
                    run.disk_reads,
                    run.blocks_read,
                ));
            }
        }
        Ok(())
    }
    .await;
    // Up to twice the largest host cache, in 4 KiB blocks, at 64 sizes.
    let y = host_cache_mib(args.allocation, setup.record_setting.unwrap_or(0.0));
    let checks: Result<Vec<MrcCheck>, validate::Error> = match &r {
        Ok(()) => setup
            .traces
            .iter()
            .map(|(p, t)| validate::mrc_check(p, t, 2 * y * MIB / 4096, 64))
            .collect(),
        Err(_) => Ok(Vec::new()),
    };
    if args.out.dir.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    r?;
    res.checks = checks?;
    let meta = json!({
        "date": date, "accel": setup.accel, "host_cpus": host_cpus(), "host_kernel": host_kernel(),
        "allocation_mib": args.allocation, "files": args.files, "file_mib": 1,
        "requests": args.requests, "write_ratio": args.write_ratio,
        "web_files": args.web_files, "web_file_size": args.web_file_size,
        "web_requests": args.web_requests, "web_skew": web::SKEW,
        "validate_steps": args.validate_steps, "validate_sizes": explicit_sizes,
        "allocation_requests": args.allocation_requests, "allocation_rounds": args.allocation_rounds,
        "load_before": load_before, "load_after": load_average(),
        "seconds": started.elapsed().as_secs_f64(),
    });
    if let Some(svg) = &args.out.svg {
        std::fs::write(svg, draw::draw(&meta, &res)).map_err(|e| Error::Svg(svg.clone(), e))?;
    }
    Ok(report::print(&args, &meta, &res)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_are_non_negative_numbers() {
        assert_eq!(parse_list("12.5, 25", "x").unwrap(), vec![12.5, 25.0]);
        assert!(parse_list("12.5,-1", "x").is_err());
        assert!(parse_list("12.5,x", "x").is_err());
    }

    #[test]
    fn a_setting_is_a_share_of_the_allocation_to_the_mib() {
        assert_eq!(host_cache_mib(512, 75.0), 384);
        assert_eq!(host_cache_mib(512, 12.5), 64);
        assert_eq!(host_cache_mib(300, 12.5), 38);
        assert_eq!(host_cache_mib(512, 0.0), 0);
    }
}
