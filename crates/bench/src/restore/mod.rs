//! `rebound bench restore`: one snapshot per workload, restored every way side by side
//! in one run, cold each time, on the real disk and on an emulated slow disk (issue 11,
//! item 8).
//!
//! Workloads: `idle` (the agent alone), `kv` (keys loaded, then a host client keeps
//! reading them through the snapshot and the restores), `memfill` (touches `--touch`
//! of memory, re-verified every second) and `mixed` (memfill and the web service at
//! once, CPU, memory and file reads; booted as a user kernel with its own readiness
//! probe, so this is also the restore of a guest without our VM spec's workload).
//!
//! Modes: `stock` (QEMU's full migration stream into fresh RAM), `eager` (our image
//! copied whole before the start), `lazy`, `working-set`, `elastic` and `elastic-file`
//! (elastic whose background loader reads the rest in file order, as QEMU's newer
//! on-demand snapshot load does), each on the page cache; `ps-lazy`, `ps-working-set`,
//! `ps-elastic` and `ps-eager` restore a copy of the snapshot on the page server
//! (their ratios against its own eager and lazy; their hit rates against the next
//! `ps-lazy` restore's exact first touches, [`exact`]).
//!
//! Cold: every file of the snapshot is dropped from the page cache before each
//! restore. The emulated disk is a blkio (cgroup v1) read limit on the snapshot's
//! block device, holding the daemon for the leg; QEMU and every reader it starts
//! inherit it. A `dd` with O_DIRECT in the same group shows the limit holds.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Args;
use rebound_api::{
    Forward, LoadPath, RamCheck, RestOrder, RestoreMode, RestoreReport, RestoreRequest,
    SnapshotRequest, SnapshotResult, StockSave, VmSpec, VmStatus, Workload,
};
use rebound_vmm::paths::Paths;
use serde::Serialize;
use serde_json::json;

mod cells;
mod exact;
mod kv;
mod report;

use crate::guest::{boot_filled, create, get, post, remove};
use crate::host::{drop_cache, host_cpus, host_kernel, load_average};
use crate::slowdisk::{DiskCheck, SlowDisk};
use cells::{Cell, Failure};
use kv::{kv_fill, KvLoad};
use rebound_client::{connect, Client, ClientError};
use report::{draw, print_text};

/// Why the restore benchmark, or one of its snapshots or restores, failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("unknown {what} {bad:?}: expected {expected}")]
    Unknown {
        what: String,
        bad: String,
        expected: String,
    },
    #[error(
        "--touch {touch} MiB needs at least 128 MiB more guest memory than --memory {memory} MiB"
    )]
    Touch { touch: u64, memory: u64 },
    #[error("--runs must be at least 1")]
    NoRuns,
    #[error("--watch-s and --trace-s must be positive")]
    Times,
    #[error("the default image is not usable (run `rebound image build`)")]
    Image(#[source] rebound_vmm::images::ImagesError),
    #[error(transparent)]
    Scratch(#[from] crate::out::ScratchError),
    #[error("no daemon to run the guests")]
    Connect(#[source] ClientError),
    #[error("no free port for the host client")]
    Port(#[source] rebound_vmm::process::ProcessError),
    #[error(transparent)]
    Guest(#[from] crate::guest::Error),
    #[error("cannot copy the image's disk {} to {}", .from.display(), .to.display())]
    CopyDisk {
        from: PathBuf,
        to: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the snapshot request does not encode as JSON")]
    Request(#[source] serde_json::Error),
    #[error("cannot connect to the kv service")]
    KvConnect(#[source] std::io::Error),
    #[error("cannot write the kv keys")]
    KvWrite(#[source] std::io::Error),
    #[error("the kv writer stopped")]
    KvTask(#[source] tokio::task::JoinError),
    #[error("kv closed the connection after {got} of {keys} keys")]
    KvClosed { got: u64, keys: u64 },
    #[error("kv refused key {key}: {answer}")]
    KvRefused { key: u64, answer: String },
    #[error("the snapshot cannot be restored cold")]
    Cold(#[source] crate::host::CacheError),
    #[error("{name}: the restore failed: {why}")]
    Failed { name: String, why: String },
    #[error("{0}: the restore report was not done after 300 s")]
    NotDone(String),
    #[error("cannot emulate the slow disk")]
    SlowDisk(#[source] crate::slowdisk::Error),
    #[error("cannot write {}", .0.display())]
    Svg(PathBuf, #[source] std::io::Error),
    #[error("cannot encode the results as JSON")]
    Json(#[source] serde_json::Error),
    #[error("{0}")]
    Incomplete(Incomplete),
}

const MIB: f64 = (1u64 << 20) as f64;
const WORKLOADS: [&str; 4] = ["idle", "kv", "memfill", "mixed"];
const MODES: [&str; 13] = [
    "stock",
    "eager",
    "lazy",
    "working-set",
    "elastic",
    "elastic-file",
    // The same restores with the RAM image unchecked, or checked whole before the
    // start: what the check costs (not in the default list).
    "lazy-unchecked",
    "elastic-unchecked",
    "lazy-full",
    // The page server (`--path page-server`): Rebound as QEMU's postcopy source.
    // They restore a copy of the snapshot, whose trace their requests replace (lazy)
    // or grow (the others), so the page-cache modes keep the post-snapshot trace.
    "ps-lazy",
    "ps-working-set",
    "ps-elastic",
    "ps-eager",
];
/// The size of each kv value (a line holds at most 4 KiB).
const KV_VALUE: u64 = 4000;
/// The kv and web workloads' default guest ports.
const KV_PORT: u16 = 7070;
const WEB_PORT: u16 = 8080;

#[derive(Args, Debug)]
pub struct RestoreArgs {
    /// Guest memory, e.g. 512M, 1G (a bare number is MiB).
    #[arg(long, default_value = "1G", value_parser = rebound_api::spec::parse_memory_mib)]
    memory: u64,
    /// Memory the memfill and mixed workloads touch (and re-verify every second).
    #[arg(long, default_value = "800M", value_parser = rebound_api::spec::parse_memory_mib)]
    touch: u64,
    /// Data the kv guest holds (values of 4000 bytes, written before the snapshot).
    #[arg(long, default_value = "700M", value_parser = rebound_api::spec::parse_memory_mib)]
    kv_data: u64,
    /// Percent of the kv keys the host client reads (spread over all of them): the
    /// guest's working set is a small part of the memory it has touched.
    #[arg(long, default_value_t = 1)]
    kv_hot: u32,
    /// Workloads: idle, kv, memfill, mixed.
    #[arg(long, default_value = "idle,kv,memfill,mixed")]
    workloads: String,
    /// Modes: stock, eager, lazy, working-set, elastic, elastic-file; lazy-unchecked,
    /// elastic-unchecked (`--ram-check off`) and lazy-full (`--ram-check full`) show
    /// what checking the RAM image costs; ps-lazy, ps-working-set, ps-elastic and
    /// ps-eager restore through the page server (on a copy of the snapshot).
    #[arg(
        long,
        default_value = "stock,eager,lazy,working-set,elastic,elastic-file,ps-lazy,ps-working-set,ps-elastic,ps-eager"
    )]
    modes: String,
    /// Disks: real, emulated (a read limit of --disk-mbps on the snapshot's device).
    #[arg(long, default_value = "real,emulated")]
    disks: String,
    /// The emulated disk's read rate, MB/s.
    #[arg(long, default_value_t = 200)]
    disk_mbps: u32,
    /// Seconds each restored guest is watched (faults, reads, pages touched).
    #[arg(long, default_value_t = 10.0)]
    watch_s: f64,
    /// Seconds of post-snapshot working-set trace.
    #[arg(long, default_value_t = 8.0)]
    trace_s: f64,
    /// Restores per workload, disk and mode (each cold, modes interleaved): every
    /// figure is the median over them, times with their min and max.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Elastic working-set pages (default: the daemon's, half the estimated WSS).
    #[arg(long)]
    ws_pages: Option<u64>,
    #[command(flatten)]
    out: crate::out::BenchOut,
}

/// One restore's figures: the keys of the restore report, and where it ran.
#[derive(Debug, Clone, Serialize)]
struct Record {
    workload: String,
    disk: String,
    mode: String,
    /// Which run of the cell (0-based); 0 in a cell's medians.
    round: usize,
    time_to_running_s: Option<f64>,
    time_to_responsive_s: Option<f64>,
    responsive_after_start_s: Option<f64>,
    pages_loaded_before_start: u64,
    bytes_loaded_before_start: u64,
    load_before_start_s: f64,
    major_faults_after_start: Option<u64>,
    bytes_read_after_start: Option<u64>,
    working_set_pages: u64,
    hit_rate: Option<f64>,
    accuracy: Option<f64>,
    pages_touched_after_start: u64,
    background_pages: u64,
    background_s: Option<f64>,
    /// kv: answers the host client got in the watch window after the restore request.
    client_answers: Option<u64>,
    /// The page server: requests after the start, their service time (µs).
    page_requests_after_start: Option<u64>,
    request_service_p50_us: Option<f64>,
    request_service_p99_us: Option<f64>,
    /// From the request to every page of guest memory in place.
    memory_loaded_s: Option<f64>,
    /// ps-lazy: the exact trace it recorded, the snapshot's pagemap trace, and the
    /// share of the exact trace's pages the pagemap trace also holds ([`exact`]).
    exact_trace_pages: Option<u64>,
    pagemap_trace_pages: Option<u64>,
    exact_in_pagemap: Option<f64>,
    notes: Vec<String>,
}

/// One workload's snapshot.
#[derive(Debug, Clone, Serialize)]
struct Snap {
    workload: String,
    pause_ms: f64,
    seconds: f64,
    ram_data_bytes: u64,
    trace_pages: u64,
    stock: Option<StockSave>,
}

#[derive(Debug, Serialize)]
struct Meta {
    date: String,
    accel: String,
    host_cpus: usize,
    host_kernel: String,
    memory_mib: u64,
    touch_mib: u64,
    kv_data_mib: u64,
    kv_hot_percent: u32,
    disk_mbps: u32,
    watch_s: f64,
    trace_s: f64,
    load_before: String,
    load_after: String,
}

fn pick<'a>(list: &'a str, all: &[&'a str], what: &str) -> Result<Vec<&'a str>, Error> {
    let v: Vec<&str> = list.split(',').map(str::trim).collect();
    if let Some(bad) = v.iter().find(|x| !all.contains(x)) {
        return Err(Error::Unknown {
            what: what.to_string(),
            bad: bad.to_string(),
            expected: all.join(", "),
        });
    }
    Ok(v)
}

/// The workload's VM boots a kernel the user names (the image's files, with its own
/// command line), not the image by name.
fn own_kernel(workload: &str) -> bool {
    !matches!(workload, "idle" | "kv" | "memfill")
}

fn mode_of(id: &str) -> (RestoreMode, RestOrder, RamCheck, LoadPath) {
    let (id, path) = match id.strip_prefix("ps-") {
        Some(rest) => (rest, LoadPath::PageServer),
        None => (id, LoadPath::PageCache),
    };
    let (base, check) = match id.split_once('-') {
        Some((b, "unchecked")) => (b, RamCheck::Off),
        Some((b, "full")) => (b, RamCheck::Full),
        _ => (id, RamCheck::Auto),
    };
    match base {
        "elastic-file" => (RestoreMode::Elastic, RestOrder::FileOrder, check, path),
        other => (
            other.parse().expect("mode ids are checked"),
            RestOrder::Fafl,
            check,
            path,
        ),
    }
}

/// The copy of a workload's snapshot the page-server modes restore.
fn ps_copy(snap: &Path) -> PathBuf {
    let mut s = snap.as_os_str().to_owned();
    s.push("-ps");
    PathBuf::from(s)
}

struct Bench {
    c: Client,
    args: RestoreArgs,
    dir: PathBuf,
    port: u16,
    progress: bool,
    img: rebound_vmm::images::ImageBoot,
}

impl Bench {
    fn say(&self, m: &str) {
        if self.progress {
            eprintln!("bench restore: {m}");
        }
    }

    fn kv_keys(&self) -> u64 {
        (self.args.kv_data << 20) / KV_VALUE
    }

    fn kv_load(&self) -> KvLoad {
        KvLoad::start(
            self.port,
            self.kv_keys(),
            (100 / self.args.kv_hot.max(1)).max(1) as u64,
        )
    }

    /// The source VM of a workload; every restore of its snapshot keeps this
    /// forward, so the host client finds the service on the same port. Workloads
    /// but the image's own boot as a user brings a kernel ([`own_kernel`]).
    fn spec(&self, workload: &str, name: &str) -> Result<VmSpec, Error> {
        let mut s = VmSpec::new(name);
        s.memory_mib = self.args.memory;
        let touch = (self.args.touch << 20).to_string();
        match workload {
            "idle" => {}
            "kv" => {
                s.workload = Some(Workload::Kv);
                s.forwards = vec![Forward {
                    host: self.port,
                    guest: KV_PORT,
                }];
            }
            "memfill" => {
                s.workload = Some(Workload::Memfill);
                s.workload_args.insert("memfill".into(), touch);
            }
            w => {
                debug_assert!(own_kernel(w));
                // As a user brings a kernel: the image's kernel and disk, its own
                // command line with two workloads, readiness by HTTP.
                let disk = self.dir.join(format!("{name}.ext4"));
                std::fs::copy(&self.img.disk, &disk).map_err(|source| Error::CopyDisk {
                    from: self.img.disk.clone(),
                    to: disk.clone(),
                    source,
                })?;
                s.kernel = Some(self.img.kernel.display().to_string());
                s.initrd = Some(self.img.initrd.display().to_string());
                s.append = Some(format!(
                    "{} rebound.workload=memfill,web rebound.memfill={touch}",
                    self.img.append
                ));
                s.disks = vec![rebound_api::disk::entry(&disk.display().to_string())];
                s.ready = Some("http:8080/".into());
                s.forwards = vec![Forward {
                    host: self.port,
                    guest: WEB_PORT,
                }];
            }
        }
        Ok(s)
    }

    /// Boots the workload's guest, loads it, snapshots it (with QEMU's stock stream
    /// and a post-snapshot trace) and removes it.
    async fn snapshot(&self, workload: &str, tag: &str) -> Result<(PathBuf, Snap, String), Error> {
        let name = format!("{tag}-{workload}");
        let spec = self.spec(workload, &name)?;
        self.say(&format!("{workload}: booting {name}"));
        let st: VmStatus = if matches!(workload, "memfill" | "mixed") {
            boot_filled(&self.c, &spec, self.args.touch).await?
        } else {
            create(&self.c, &spec).await?;
            post(
                &self.c,
                &format!("/v1/vms/{name}/wait?for=ready&timeout_ms=600000"),
                None,
            )
            .await?
        };
        if workload == "kv" {
            self.say(&format!(
                "kv: writing {} keys ({} MiB)",
                self.kv_keys(),
                self.args.kv_data
            ));
            kv_fill(self.port, self.kv_keys()).await?;
        }
        let load = (workload == "kv").then(|| self.kv_load());
        let out = self.dir.join(format!("snap-{workload}"));
        self.say(&format!(
            "{workload}: snapshot with QEMU's stock stream and a {} s trace",
            self.args.trace_s
        ));
        let req = SnapshotRequest {
            out: out.display().to_string(),
            trace_s: self.args.trace_s,
            stock: true,
            hold: false,
            netdump: false,
            stop_at_unix_ns: None,
        };
        let r: SnapshotResult = post(
            &self.c,
            &format!("/v1/vms/{name}/snapshot"),
            Some(&serde_json::to_value(&req).map_err(Error::Request)?),
        )
        .await?;
        drop(load);
        remove(&self.c, &name).await;
        let snap = Snap {
            workload: workload.into(),
            pause_ms: r.pause_ms,
            seconds: r.seconds,
            ram_data_bytes: r.ram_data_bytes,
            trace_pages: r.trace_pages,
            stock: r.stock,
        };
        Ok((out, snap, st.accel.as_str().to_string()))
    }

    /// The emulated slow disk under `snap` for the daemon (and the QEMUs it starts),
    /// checked with a direct read through it.
    fn emulated_disk(&self, snap: &Path, daemon_pid: u32) -> Result<(SlowDisk, DiskCheck), Error> {
        let s = SlowDisk::new(
            &format!("rebound-bench-{}", std::process::id()),
            snap,
            self.args.disk_mbps as u64 * 1_000_000,
            0,
        )
        .map_err(Error::SlowDisk)?;
        s.add(daemon_pid).map_err(Error::SlowDisk)?;
        let chk = s
            .check(&self.dir, self.args.disk_mbps)
            .map_err(Error::SlowDisk)?;
        self.say(&format!(
            "emulated disk: {} limited to {} MB/s; dd O_DIRECT read {:.0} MB/s",
            chk.device, chk.limit_mbps, chk.dd_mbps
        ));
        Ok((s, chk))
    }

    /// One cold restore of `snap` in `mode`, watched to the end of its report.
    async fn restore(
        &self,
        workload: &str,
        disk: &str,
        mode_id: &str,
        snap: &Path,
        name: &str,
    ) -> Result<Record, Error> {
        let (mode, rest_order, ram_check, path) = mode_of(mode_id);
        let copy = ps_copy(snap);
        let snap = match path {
            LoadPath::PageServer => copy.as_path(),
            _ => snap,
        };
        drop_cache(snap).map_err(Error::Cold)?;
        let req = RestoreRequest {
            dir: snap.display().to_string(),
            name: name.into(),
            mode,
            ws_pages: self.args.ws_pages,
            paused: false,
            rest_order,
            path,
            ram_check,
            watch_s: self.args.watch_s,
            // The host client's port.
            forwards: Some(
                service_port(workload)
                    .map(|guest| Forward {
                        host: self.port,
                        guest,
                    })
                    .into_iter()
                    .collect(),
            ),
            replay: None,
            // A snapshot's host paths are never opened on its say-so: the user names
            // the kernel they booted again, as `spec` does for these workloads.
            kernel: own_kernel(workload).then(|| self.img.kernel.display().to_string()),
            initrd: own_kernel(workload).then(|| self.img.initrd.display().to_string()),
            pmem: Vec::new(),
        };
        let load = (workload == "kv").then(|| self.kv_load());
        let t0 = Instant::now();
        let body = serde_json::to_value(&req).map_err(Error::Request)?;
        let _: RestoreReport = post(&self.c, "/v1/restore", Some(&body)).await?;
        let rep = loop {
            let r: RestoreReport = get(&self.c, &format!("/v1/vms/{name}/restore")).await?;
            if r.phase == "failed" {
                return Err(Error::Failed {
                    name: name.to_string(),
                    why: r.error.unwrap_or_default(),
                });
            }
            // The page server's figures come when it ends (a lazy restore's after
            // its quiet window, as long as the watch).
            let served = r.path == Some(LoadPath::PageServer);
            if r.phase == "done" && (!served || r.memory_loaded_s.is_some()) {
                break r;
            }
            if t0.elapsed() > Duration::from_secs(300) {
                return Err(Error::NotDone(name.to_string()));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let answers = load.map(|l| l.answers_within(t0, self.args.watch_s));
        remove(&self.c, name).await;
        Ok(Record {
            round: 0,
            workload: workload.into(),
            disk: disk.into(),
            mode: mode_id.into(),
            time_to_running_s: rep.time_to_running_s,
            time_to_responsive_s: rep.time_to_responsive_s,
            responsive_after_start_s: rep.responsive_after_start_s,
            pages_loaded_before_start: rep.pages_loaded_before_start,
            bytes_loaded_before_start: rep.bytes_loaded_before_start,
            load_before_start_s: rep.load_before_start_s,
            major_faults_after_start: rep.major_faults_after_start,
            bytes_read_after_start: rep.bytes_read_after_start,
            working_set_pages: rep.working_set_pages,
            hit_rate: rep.hit_rate,
            accuracy: rep.accuracy,
            pages_touched_after_start: rep.pages_touched_after_start,
            background_pages: rep.background_pages,
            background_s: rep.background_s,
            client_answers: answers,
            page_requests_after_start: rep.page_requests_after_start,
            request_service_p50_us: rep.request_service_p50_us,
            request_service_p99_us: rep.request_service_p99_us,
            memory_loaded_s: rep.memory_loaded_s,
            exact_trace_pages: None,
            pagemap_trace_pages: None,
            exact_in_pagemap: None,
            notes: rep.notes,
        })
    }
}

/// The guest port a workload's host client uses.
fn service_port(workload: &str) -> Option<u16> {
    match workload {
        "kv" => Some(KV_PORT),
        "mixed" => Some(WEB_PORT),
        _ => None,
    }
}

pub async fn run(paths: &Paths, args: RestoreArgs) -> Result<(), Error> {
    let (w, m, d) = (
        args.workloads.clone(),
        args.modes.clone(),
        args.disks.clone(),
    );
    let workloads = pick(&w, &WORKLOADS, "workload")?;
    let modes = pick(&m, &MODES, "mode")?;
    let disks = pick(&d, &["real", "emulated"], "disk")?;
    if matches!(args.touch.checked_add(128), Some(t) if t > args.memory) {
        return Err(Error::Touch {
            touch: args.touch,
            memory: args.memory,
        });
    }
    if args.runs == 0 {
        return Err(Error::NoRuns);
    }
    if args.watch_s <= 0.0 || args.trace_s <= 0.0 {
        return Err(Error::Times);
    }
    let img = rebound_vmm::images::open(&paths.home, "default").map_err(Error::Image)?;
    let dir = args.out.scratch("restore")?;
    let c = connect(paths).await.map_err(Error::Connect)?;
    let daemon_pid = get::<rebound_api::Health>(&c, "/v1/health").await?.pid;
    let keep_dir = args.out.dir.is_some();
    let b = Bench {
        c,
        dir: dir.clone(),
        port: rebound_vmm::process::free_port().map_err(Error::Port)?,
        progress: std::io::stderr().is_terminal(),
        img,
        args,
    };
    let load_before = load_average();
    let date = rebound_vmm::events::wall_now();
    let tag = format!("br{}", std::process::id());
    // Every restore tried, measured or failed: one failure is reported with the rest
    // and the run goes on.
    let mut tried: Vec<Result<Record, Failure>> = Vec::new();
    let mut snaps = Vec::new();
    let mut checks = Vec::new();
    let mut accel = String::new();
    let failure = |w: &str, d: Option<&str>, m: Option<&str>, round: Option<usize>, e: Error| {
        let f = Failure {
            workload: w.into(),
            disk: d.map(Into::into),
            mode: m.map(Into::into),
            round,
            error: rebound_errors::chain(&e),
        };
        eprintln!("bench restore: {} failed: {}", f.place(), f.error);
        f
    };
    for w in &workloads {
        let (snap, s, a) = match b.snapshot(w, &tag).await {
            Ok(x) => x,
            Err(e) => {
                remove(&b.c, &format!("{tag}-{w}")).await;
                let _ = std::fs::remove_dir_all(b.dir.join(format!("snap-{w}")));
                tried.push(Err(failure(w, None, None, None, e)));
                continue;
            }
        };
        accel = a;
        snaps.push(s);
        let copy = ps_copy(&snap);
        let mut ex = exact::Exact::new(&snap);
        if modes.iter().any(|m| m.starts_with("ps-")) {
            let _ = std::fs::remove_dir_all(&copy);
            let ok = std::process::Command::new("cp")
                .args(["-a", "--sparse=always"])
                .arg(&snap)
                .arg(&copy)
                .status()
                .is_ok_and(|st| st.success());
            if !ok {
                let e = Error::CopyDisk {
                    from: snap.clone(),
                    to: copy,
                    source: std::io::Error::other("cp failed"),
                };
                tried.push(Err(failure(w, None, None, None, e)));
                continue;
            }
        }
        for d in &disks {
            let slow = match *d {
                "emulated" => match b.emulated_disk(&snap, daemon_pid) {
                    Ok((s, chk)) => {
                        checks.push(chk);
                        Some(s)
                    }
                    Err(e) => {
                        tried.push(Err(failure(w, Some(d), None, None, e)));
                        continue;
                    }
                },
                _ => None,
            };
            for round in 0..b.args.runs {
                for m in &modes {
                    let name = format!("{tag}-{w}-{m}-{d}-{round}");
                    b.say(&format!(
                        "{w}: {m} restore, {d} disk, cold (run {} of {})",
                        round + 1,
                        b.args.runs
                    ));
                    let before = m
                        .starts_with("ps-")
                        .then(|| exact::trace_of(&copy))
                        .flatten();
                    match b.restore(w, d, m, &snap, &name).await {
                        Ok(mut rec) => {
                            rec.round = round;
                            b.say(&format!(
                                "{w}/{d}/{m}: running after {}, responsive after {}",
                                secs(rec.time_to_running_s),
                                secs(rec.time_to_responsive_s)
                            ));
                            let done = ex.after(&mut rec, tried.len(), before, &copy);
                            apply(&mut tried, done);
                            tried.push(Ok(rec));
                        }
                        Err(e) => {
                            remove(&b.c, &name).await;
                            tried.push(Err(failure(w, Some(d), Some(m), Some(round), e)));
                        }
                    }
                }
            }
            // The last working sets sent ahead are measured against one more lazy
            // restore's first touches (on this disk, so the cgroup still holds).
            if ex.waiting() {
                let name = format!("{tag}-{w}-ps-lazy-{d}-next");
                b.say(&format!(
                    "{w}: ps-lazy restore, {d} disk, for the hit rates before it"
                ));
                match b.restore(w, d, "ps-lazy", &snap, &name).await {
                    Ok(_) => {
                        let touched = exact::trace_of(&copy).unwrap_or_default();
                        let done = ex.resolve(&touched);
                        apply(&mut tried, done);
                    }
                    Err(e) => {
                        remove(&b.c, &name).await;
                        tried.push(Err(failure(w, Some(d), Some("ps-lazy"), None, e)));
                    }
                }
            }
            drop(slow);
        }
        let _ = std::fs::remove_dir_all(&snap);
        let _ = std::fs::remove_dir_all(&copy);
    }
    if !keep_dir {
        let _ = std::fs::remove_dir_all(&dir);
    }
    let meta = Meta {
        date,
        accel,
        host_cpus: host_cpus(),
        host_kernel: host_kernel(),
        memory_mib: b.args.memory,
        touch_mib: b.args.touch,
        kv_data_mib: b.args.kv_data,
        kv_hot_percent: b.args.kv_hot,
        disk_mbps: b.args.disk_mbps,
        watch_s: b.args.watch_s,
        trace_s: b.args.trace_s,
        load_before,
        load_after: load_average(),
    };
    let cells = cells::cells(&tried);
    let medians: Vec<Record> = cells.iter().filter_map(|c| c.median.clone()).collect();
    let ratios = ratios(&medians);
    let (records, failures): (Vec<_>, Vec<_>) = tried.into_iter().partition(Result::is_ok);
    let records: Vec<Record> = records.into_iter().flatten().collect();
    let failures: Vec<Failure> = failures.into_iter().filter_map(Result::err).collect();
    if let Some(svg) = &b.args.out.svg {
        std::fs::write(svg, draw(&meta, &cells, &failures))
            .map_err(|e| Error::Svg(svg.clone(), e))?;
    }
    if b.args.out.json {
        let measured: Vec<&Cell> = cells.iter().filter(|c| c.median.is_some()).collect();
        let v = json!({"meta": meta, "snapshots": snaps, "emulated_disk": checks,
            "records": records, "failures": failures, "medians": measured, "ratios": ratios});
        println!("{}", serde_json::to_string_pretty(&v).map_err(Error::Json)?);
    } else {
        print_text(&meta, &snaps, &checks, &cells, &ratios, &failures);
    }
    match Incomplete::of(&failures, records.len()) {
        Some(e) => Err(Error::Incomplete(e)),
        None => Ok(()),
    }
}

/// Hit rates and accuracies measured after their restores ([`exact`]) put into
/// those restores' records.
fn apply(tried: &mut [Result<Record, Failure>], done: Vec<exact::Measured>) {
    for (i, got) in done {
        let Some(Ok(r)) = tried.get_mut(i) else {
            continue;
        };
        match got {
            Ok((h, a)) => (r.hit_rate, r.accuracy) = (Some(h), Some(a)),
            Err(why) => r.notes.push(why),
        }
    }
}

/// What failed of a run, for its exit: how many restores of how many tried, and how
/// many snapshots or emulated disks (each one's restores were not tried).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Incomplete {
    pub restores_failed: usize,
    pub restores_tried: usize,
    pub setups_failed: usize,
}

impl Incomplete {
    /// `None` when nothing failed.
    fn of(failures: &[Failure], measured: usize) -> Option<Incomplete> {
        let restores_failed = failures.iter().filter(|f| f.is_restore()).count();
        let i = Incomplete {
            restores_failed,
            restores_tried: measured + restores_failed,
            setups_failed: failures.len() - restores_failed,
        };
        (!failures.is_empty()).then_some(i)
    }
}

impl std::fmt::Display for Incomplete {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} of {} restores failed",
            self.restores_failed, self.restores_tried
        )?;
        if self.setups_failed > 0 {
            let (n, s) = (
                self.setups_failed,
                if self.setups_failed == 1 { "" } else { "s" },
            );
            write!(
                f,
                " and {n} snapshot{s} or emulated disk{s} could not be made (their restores were not tried)"
            )?;
        }
        write!(
            f,
            "; the report above has each error and the medians of the rest"
        )
    }
}

fn secs(v: Option<f64>) -> String {
    v.map(|x| format!("{x:.2} s")).unwrap_or_else(|| "-".into())
}

/// Per workload and disk, each mode against the baselines: time to running and to
/// responsive against the faster eager path (QEMU's stock stream or our eager copy),
/// faults and bytes read after the start against lazy.
#[derive(Debug, Clone, Serialize)]
struct Ratio {
    workload: String,
    disk: String,
    mode: String,
    /// Which of stock and eager was faster to running (the baseline).
    eager_baseline: Option<String>,
    running_vs_eager: Option<f64>,
    responsive_vs_eager: Option<f64>,
    responsive_vs_lazy: Option<f64>,
    faults_vs_lazy: Option<f64>,
    bytes_read_vs_lazy: Option<f64>,
}

fn ratios(records: &[Record]) -> Vec<Ratio> {
    let div = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    };
    let mut out = Vec::new();
    for r in records {
        let same = |m: &str| {
            records
                .iter()
                .find(|x| x.workload == r.workload && x.disk == r.disk && x.mode == m)
        };
        // A page-server row is set against the page server's own eager and lazy.
        let ps = r.mode.starts_with("ps-");
        let (eager, lazy_id) = match ps {
            true => ("ps-eager", "ps-lazy"),
            false => ("eager", "lazy"),
        };
        let base = ["stock", eager]
            .into_iter()
            .filter_map(same)
            .filter(|x| x.time_to_running_s.is_some())
            .min_by(|a, b| {
                let t = |x: &Record| x.time_to_running_s.unwrap_or(f64::MAX);
                t(a).total_cmp(&t(b))
            });
        let lazy = same(lazy_id);
        let f = |x: Option<u64>| x.map(|v| v as f64);
        out.push(Ratio {
            workload: r.workload.clone(),
            disk: r.disk.clone(),
            mode: r.mode.clone(),
            eager_baseline: base.map(|b| b.mode.clone()),
            running_vs_eager: div(r.time_to_running_s, base.and_then(|b| b.time_to_running_s)),
            responsive_vs_eager: div(
                r.time_to_responsive_s,
                base.and_then(|b| b.time_to_responsive_s),
            ),
            responsive_vs_lazy: div(
                r.time_to_responsive_s,
                lazy.and_then(|l| l.time_to_responsive_s),
            ),
            faults_vs_lazy: div(
                f(r.major_faults_after_start),
                lazy.and_then(|l| f(l.major_faults_after_start)),
            ),
            bytes_read_vs_lazy: div(
                f(r.bytes_read_after_start),
                lazy.and_then(|l| f(l.bytes_read_after_start)),
            ),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn rec(w: &str, d: &str, m: &str, run: f64, resp: f64, faults: u64) -> Record {
        Record {
            round: 0,
            workload: w.into(),
            disk: d.into(),
            mode: m.into(),
            time_to_running_s: Some(run),
            time_to_responsive_s: Some(resp),
            responsive_after_start_s: None,
            pages_loaded_before_start: 0,
            bytes_loaded_before_start: 0,
            load_before_start_s: 0.0,
            major_faults_after_start: Some(faults),
            bytes_read_after_start: Some(faults * 4096),
            working_set_pages: 0,
            hit_rate: None,
            accuracy: None,
            pages_touched_after_start: 0,
            background_pages: 0,
            background_s: None,
            client_answers: None,
            page_requests_after_start: None,
            request_service_p50_us: None,
            request_service_p99_us: None,
            memory_loaded_s: None,
            exact_trace_pages: None,
            pagemap_trace_pages: None,
            exact_in_pagemap: None,
            notes: vec![],
        }
    }

    #[test]
    fn ratios_take_the_faster_eager_path_and_lazy_of_the_same_disk() {
        let r = vec![
            rec("kv", "real", "stock", 4.0, 5.0, 0),
            rec("kv", "real", "eager", 2.0, 3.0, 0),
            rec("kv", "real", "lazy", 0.2, 6.0, 1000),
            rec("kv", "real", "elastic", 0.5, 1.5, 10),
            rec("kv", "emulated", "lazy", 0.2, 9.0, 50),
            rec("kv", "emulated", "elastic", 0.4, 2.0, 5),
        ];
        let q = ratios(&r);
        assert_eq!(q[3].eager_baseline.as_deref(), Some("eager"));
        assert_eq!(q[3].running_vs_eager, Some(0.25));
        assert_eq!(q[3].responsive_vs_eager, Some(0.5));
        assert_eq!(q[3].responsive_vs_lazy, Some(0.25));
        assert_eq!(q[3].faults_vs_lazy, Some(0.01));
        // No eager path measured on the emulated disk: no ratio against it.
        assert_eq!(q[5].running_vs_eager, None);
        assert_eq!(q[5].faults_vs_lazy, Some(0.1));
    }

    fn meta() -> Meta {
        Meta {
            date: "2026-11-28".into(),
            accel: "tcg".into(),
            host_cpus: 2,
            host_kernel: "6.18".into(),
            memory_mib: 1024,
            touch_mib: 800,
            kv_data_mib: 700,
            kv_hot_percent: 1,
            disk_mbps: 200,
            watch_s: 10.0,
            trace_s: 8.0,
            load_before: String::new(),
            load_after: String::new(),
        }
    }

    #[test]
    fn a_run_with_failures_says_what_failed_and_fails_at_the_end() {
        let fail = |d: Option<&str>, m: Option<&str>, round: Option<usize>| Failure {
            workload: "kv".into(),
            disk: d.map(Into::into),
            mode: m.map(Into::into),
            round,
            error: "the restore failed".into(),
        };
        let tried = vec![
            Ok(rec("kv", "real", "elastic", 0.5, 1.5, 10)),
            Err(fail(Some("real"), Some("elastic"), Some(1))),
            Ok(rec("kv", "real", "elastic", 0.7, 1.9, 10)),
            Err(fail(Some("real"), Some("lazy"), Some(0))),
            Err(fail(Some("emulated"), None, None)),
        ];
        let failures: Vec<Failure> = tried.iter().filter_map(|t| t.clone().err()).collect();
        let e = Error::Incomplete(Incomplete::of(&failures, 2).expect("failures"));
        assert_eq!(
            e.to_string(),
            "2 of 4 restores failed and 1 snapshot or emulated disk could not be made (their restores were not tried); the report above has each error and the medians of the rest"
        );
        assert_eq!(Incomplete::of(&[], 5), None);
        let svg = draw(&meta(), &cells::cells(&tried), &failures);
        assert!(svg.contains("1 of 3 failed"), "{svg}");
        assert!(svg.contains("failed: all 1 runs (no figures)"), "{svg}");
        assert!(
            svg.contains("kv/emulated (the emulated disk) failed"),
            "{svg}"
        );
    }

    #[test]
    fn modes_and_lists_are_checked() {
        assert_eq!(
            mode_of("elastic-file"),
            (
                RestoreMode::Elastic,
                RestOrder::FileOrder,
                RamCheck::Auto,
                LoadPath::PageCache
            )
        );
        assert_eq!(
            mode_of("ps-working-set"),
            (
                RestoreMode::WorkingSet,
                RestOrder::Fafl,
                RamCheck::Auto,
                LoadPath::PageServer
            )
        );
        assert_eq!(
            mode_of("stock"),
            (
                RestoreMode::Stock,
                RestOrder::Fafl,
                RamCheck::Auto,
                LoadPath::PageCache
            )
        );
        assert_eq!(
            mode_of("working-set"),
            (
                RestoreMode::WorkingSet,
                RestOrder::Fafl,
                RamCheck::Auto,
                LoadPath::PageCache
            )
        );
        assert_eq!(
            mode_of("lazy-unchecked"),
            (
                RestoreMode::Lazy,
                RestOrder::Fafl,
                RamCheck::Off,
                LoadPath::PageCache
            )
        );
        assert_eq!(
            mode_of("lazy-full"),
            (
                RestoreMode::Lazy,
                RestOrder::Fafl,
                RamCheck::Full,
                LoadPath::PageCache
            )
        );
        assert!(pick("idle,bogus", &WORKLOADS, "workload").is_err());
        assert_eq!(pick("kv", &WORKLOADS, "workload").unwrap(), ["kv"]);
    }
}
