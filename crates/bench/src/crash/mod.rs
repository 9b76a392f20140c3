//! `rebound bench crash`: the same crashed guest handled the stock way and by each
//! crash policy, side by side in one run, with a client probing the service every
//! 100 ms (issue 10, item 8).
//!
//! The guest is the default image booted with the agent running two workloads at once,
//! `memfill,web` (the agent's comma list; a `VmSpec` names one workload, so the image's
//! kernel, initrd and data disk are given as a user kernel with that command line and
//! readiness `http:8080/`). memfill fills most of memory with a pattern; web is the
//! service. A user kernel gets no agent link from the daemon, so the crash is the
//! daemon's NMI, which `unknown_nmi_panic` on the command line turns into a panic, and
//! the dump finds VMCOREINFO by scanning guest memory. The recovery VM (and the stock
//! reboot) boots the same command line, so its memfill starts again once it has the
//! memory; the web service answers whether or not memfill runs. Variants:
//!
//! - `a` stock: policy none; crash; QEMU's `dump-guest-memory` (ELF) made durable; kill
//!   and boot a fresh VM on the same disk and port.
//! - `b` dump-then-recover, `c` dump-and-recover, `d` dump-and-recover with the zero and
//!   free pages filtered. Every case at the crash policy's default I/O policy.
//!
//! Each of `a` to `d` (and `r`) runs twice: `@RATE` on an emulated slow disk, one
//! device whose reads and writes together run at `--disk-mbps` (a file system on a
//! throttled device, [`crate::throttledfs`]) holding the dump, the guest's disk and
//! the snapshot `r` restores from, as one disk does on a real host; and `@disk` on the
//! real disk.
//! - `e` the I/O policies `fair`, `dump-first`, `recovery-first` and `auto`, with the
//!   service made disk-bound: it reads `--disk-io` of its data disk with `O_DIRECT`
//!   before it is ready, at boot and again in the recovery VM (the paper's recovery
//!   that copies a file while it boots); on the real disk and on the emulated one.
//! - `r` dump-and-recover as `c`, but the recovery VM is restored (elastic) from a
//!   post-boot snapshot instead of booted (`--recover-from`): the snapshot is taken
//!   once per run of a guest booted with the same command line, as soon as its service
//!   answers, with a working-set trace; its files are dropped from the page cache before
//!   each crash, so every restore reads cold. On the emulated disk and the real one, as `c`.
//!
//! Besides the downtime (the crash to the first answer), each case measures the
//! service's capacity before the crash and while the dump still runs once it is back
//! ([`capacity`]).
//! - `s` one more crashed guest kept paused, dumped several ways on the same memory:
//!   QEMU's ELF and ours (throughput, durable), ours filtered against `makedumpfile -d
//!   31` of our unfiltered ELF, QEMU's kdump-zlib against ours in zlib and zstd.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rebound_api::{
    CrashPhase, CrashPolicy, CrashReport, DumpResult, IoPolicy, OnCrash, PageClass, RestoreReport,
    SnapshotRequest, SnapshotResult, VmStatus,
};
use rebound_vmm::paths::Paths;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::guest::{boot_filled, create, get, post, remove};
use crate::host::{host_cpus, host_kernel, load_average};
use crate::rounds::Failure;
use crate::throttledfs::ThrottledFs;
pub use case::CrashArgs;
use case::{copy_disk, Case, Outcome, Setup};
use rebound_client::{connect, Client, ClientError};
use report::{draw, print_text, Meta};
use sizes::run_sizes;

mod capacity;
mod case;
mod report;
mod sizes;

/// Why the crash benchmark (or one of its cases) did not finish.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("unknown variant {0:?}: expected a, b, c, d, e, r or s")]
    Variant(String),
    #[error("--runs must be at least 1")]
    NoRuns,
    #[error("--fill {fill} MiB must be below --memory {memory} MiB")]
    Fill { fill: u64, memory: u64 },
    #[error("the default image is not usable (run `rebound image build`)")]
    Image(#[source] rebound_vmm::images::ImagesError),
    #[error(transparent)]
    Scratch(#[from] crate::out::ScratchError),
    #[error("no free port for the service")]
    Port(#[source] rebound_vmm::process::ProcessError),
    #[error("no daemon to run the guests")]
    Connect(#[source] ClientError),
    #[error("cannot set up the emulated disk")]
    SlowDisk(#[source] crate::throttledfs::Error),
    #[error("cannot copy {} to {}", .from.display(), .to.display())]
    Copy {
        from: PathBuf,
        to: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Guest(#[from] crate::guest::Error),
    #[error("the snapshot cannot be read cold")]
    Cold(#[source] crate::host::CacheError),
    #[error("{0}: the service does not answer the client before the crash")]
    NoAnswerBefore(String),
    #[error("the service did not answer within {0:?}")]
    NoAnswer(Duration),
    #[error("{name}: crash handling failed: {notes}")]
    Failed { name: String, notes: String },
    #[error("{0}: the recovery VM was not ready 180 s after the dump finished (see `rebound vm logs {0}`)")]
    RecoveryNotReady(String),
    #[error("{0}: the crash was not handled within 900 s")]
    NotHandled(String),
    #[error("the snapshot request does not encode as JSON")]
    Request(#[source] serde_json::Error),
    #[error("dump {0}")]
    Dump(String, #[source] crate::guest::Error),
    #[error(transparent)]
    Interrupted(#[from] crate::host::Interrupted),
    #[error(transparent)]
    Incomplete(#[from] crate::rounds::Incomplete),
    #[error("cannot write {}", .0.display())]
    Svg(PathBuf, #[source] std::io::Error),
    #[error("cannot encode the results as JSON")]
    Json(#[source] serde_json::Error),
}

const PROBE_EVERY: Duration = Duration::from_millis(100);
const PROBE_TIMEOUT: Duration = Duration::from_millis(1000);

fn cases(args: &CrashArgs) -> Result<Vec<Case>, Error> {
    let want: Vec<&str> = args.variants.split(',').map(str::trim).collect();
    if let Some(bad) = want
        .iter()
        .find(|v| !["a", "b", "c", "d", "e", "r", "s"].contains(v))
    {
        return Err(Error::Variant(bad.to_string()));
    }
    let r = args.disk_mbps;
    let mut out = Vec::new();
    let mut add = |id: &str, what: String, on_crash, filter: &[PageClass], io, throttled| {
        out.push(Case {
            id: id.into(),
            what,
            on_crash,
            filter: filter.to_vec(),
            io_policy: io,
            throttled,
            disk_io_mib: 0,
            recover_from: false,
        })
    };
    use OnCrash::*;
    let zf = [PageClass::Zero, PageClass::Free];
    let io = CrashPolicy::default().io_policy;
    for (throttled, at) in [(true, format!("@{r}")), (false, "@disk".into())] {
        if want.contains(&"a") {
            add(
                &format!("a{at}"),
                "stock: QEMU ELF dump, reboot".into(),
                None,
                &[],
                io,
                throttled,
            );
        }
        if want.contains(&"b") {
            add(
                &format!("b{at}"),
                "dump-then-recover".into(),
                DumpThenRecover,
                &[],
                io,
                throttled,
            );
        }
        if want.contains(&"c") {
            add(
                &format!("c{at}"),
                "dump-and-recover".into(),
                DumpAndRecover,
                &[],
                io,
                throttled,
            );
        }
        if want.contains(&"d") {
            add(
                &format!("d{at}"),
                "dump-and-recover, filter zero,free".into(),
                DumpAndRecover,
                &zf,
                io,
                throttled,
            );
        }
        if want.contains(&"r") {
            add(
                &format!("r{at}"),
                "dump-and-recover, recovery VM restored from a post-boot snapshot".into(),
                DumpAndRecover,
                &[],
                io,
                throttled,
            );
        }
    }
    if want.contains(&"e") {
        // The same service made disk-bound, each policy on the real disk and on the
        // emulated one.
        for (throttled, at) in [(false, String::new()), (true, format!("@{r}"))] {
            for io in [
                IoPolicy::Fair,
                IoPolicy::DumpFirst,
                IoPolicy::RecoveryFirst,
                IoPolicy::Auto,
            ] {
                add(
                    &format!("e-{io}{at}"),
                    format!("dump-and-recover, disk-bound service, io {io}"),
                    DumpAndRecover,
                    &[],
                    io,
                    throttled,
                );
            }
        }
        for c in out.iter_mut().filter(|c| c.id.starts_with("e-")) {
            c.disk_io_mib = args.disk_io;
        }
    }
    for c in out.iter_mut().filter(|c| c.id.starts_with('r')) {
        c.recover_from = true;
    }
    Ok(out)
}

/// Successful answers of the service, in seconds since `t0`.
struct Prober {
    t0: Instant,
    answers: Arc<Mutex<Vec<f64>>>,
    stop: tokio::sync::watch::Sender<bool>,
}

impl Prober {
    fn start(port: u16) -> Prober {
        let t0 = Instant::now();
        let answers = Arc::new(Mutex::new(Vec::new()));
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let a = answers.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(PROBE_EVERY);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stopped.changed() => return,
                }
                let a = a.clone();
                // Each probe on its own: a hung probe does not delay the next.
                tokio::spawn(async move {
                    if let Ok(true) = tokio::time::timeout(PROBE_TIMEOUT, probe(port)).await {
                        a.lock().unwrap().push(t0.elapsed().as_secs_f64());
                    }
                });
            }
        });
        Prober { t0, answers, stop }
    }

    fn now(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }

    fn answers(&self) -> Vec<f64> {
        let mut v = self.answers.lock().unwrap().clone();
        v.sort_by(f64::total_cmp);
        v
    }

    /// The first answer after `t`.
    fn first_after(&self, t: f64) -> Option<f64> {
        self.answers().into_iter().find(|&x| x > t)
    }

    /// The outage that began at or after `t` (an answer still in flight when the crash
    /// was asked for does not end it): the longest gap between two answers from the
    /// last one before `t` on, as (its length, the first answer after it).
    fn outage_after(&self, t: f64) -> (f64, f64) {
        outage(&self.answers(), t)
    }

    async fn wait_answer_after(&self, t: f64, limit: Duration) -> Result<f64, Error> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(x) = self.first_after(t) {
                return Ok(x);
            }
            if Instant::now() > deadline {
                return Err(Error::NoAnswer(limit));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

/// [`Prober::outage_after`] over sorted answer times.
fn outage(v: &[f64], t: f64) -> (f64, f64) {
    let start = v.iter().rposition(|&x| x <= t).unwrap_or(0);
    v[start..]
        .windows(2)
        .map(|w| (w[1] - w[0], w[1]))
        .fold((0.0, t), |a, b| if b.0 > a.0 { b } else { a })
}

/// One HTTP GET of `/`: true on a 200 answer.
async fn probe(port: u16) -> bool {
    let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return false;
    };
    if s.write_all(b"GET / HTTP/1.0\r\nHost: bench\r\n\r\n")
        .await
        .is_err()
    {
        return false;
    }
    let mut buf = [0u8; 16];
    let mut n = 0;
    while n < buf.len() {
        match s.read(&mut buf[n..]).await {
            Ok(0) | Err(_) => break,
            Ok(k) => n += k,
        }
    }
    buf[..n].starts_with(b"HTTP/1.") && buf[..n].windows(3).any(|w| w == b"200")
}

fn policy(args: &CrashArgs, case: &Case, dir: &Path, snapshot: Option<&Path>) -> CrashPolicy {
    CrashPolicy {
        recover_from: snapshot
            .filter(|_| case.recover_from)
            .map(|p| p.display().to_string()),
        on_crash: case.on_crash,
        dump_dir: case.on_crash.dumps().then(|| dir.display().to_string()),
        filter: case.filter.clone(),
        chunk_mib: args.chunk,
        min_memory_mib: args.min_memory,
        io_policy: case.io_policy,
        host_memory_budget_mib: Some(args.memory + args.min_memory),
        ..CrashPolicy::default()
    }
}

async fn run_case(
    c: &Client,
    args: &CrashArgs,
    setup: &Setup,
    case: &Case,
    name: &str,
) -> Result<(Outcome, VmStatus), Error> {
    // Where the case's dump, disk and snapshot are: the emulated disk or the real one.
    let (dir, snapshot) = setup.place(case.throttled);
    let disk = copy_disk(setup, name, case.throttled)?;
    let spec = setup.spec(
        args,
        name,
        &disk,
        policy(args, case, dir, snapshot),
        case.disk_io_mib,
    );
    setup.say(&format!(
        "{}: booting {name} and filling {} MiB",
        case.id, args.fill
    ));
    let st = boot_filled(c, &spec, args.fill).await?;
    if let (true, Some(snap)) = (case.recover_from, snapshot) {
        // The snapshot was written long before a real crash: restore it cold.
        crate::host::drop_cache(snap).map_err(Error::Cold)?;
    }
    if let (true, Some(fs)) = (case.throttled, &setup.slow) {
        // Nothing the emulated disk holds is read from memory that a real disk's
        // host would not have cached either.
        fs.drop_device_cache().map_err(Error::SlowDisk)?;
    }
    let probe = Prober::start(setup.port);
    tokio::time::sleep(Duration::from_secs(1)).await;
    if probe.answers().is_empty() {
        return Err(Error::NoAnswerBefore(name.to_string()));
    }
    let load = capacity::Load::start(setup.port, probe.t0);
    tokio::time::sleep(capacity::BEFORE).await;
    let t_load = load.now();
    let before = load
        .stop()
        .rate(t_load - capacity::BEFORE.as_secs_f64(), t_load);
    tokio::time::sleep(Duration::from_millis(500)).await;
    setup.say(&format!("{}: crash", case.id));
    let t_crash = probe.now();
    let _: Value = post(c, &format!("/v1/vms/{name}/crash"), None).await?;
    let mut o = Outcome {
        case: case.id.clone(),
        ..Outcome::default()
    };
    o.capacity.before_rps = before;
    let dump_file: Option<PathBuf>;
    if case.on_crash == OnCrash::None {
        let _: VmStatus = post(
            c,
            &format!("/v1/vms/{name}/wait?for=panicked&timeout_ms=60000"),
            None,
        )
        .await?;
        let t_panicked = probe.now();
        let out = dir.join(format!("{name}.qemu.elf"));
        setup.say(&format!(
            "{}: QEMU's dump-guest-memory (ELF, then fsync)",
            case.id
        ));
        let d: DumpResult = post(
            c,
            &format!("/v1/vms/{name}/dump"),
            Some(&json!({"out": out, "format": "elf", "engine": "qemu"})),
        )
        .await?;
        // Deleted once the service is back: not part of the downtime.
        dump_file = Some(out);
        setup.say(&format!(
            "{}: reboot: kill, boot a fresh VM on the same disk and port",
            case.id
        ));
        let t_reboot = probe.now();
        remove(c, name).await;
        let mut fresh = spec.clone();
        fresh.crash = CrashPolicy::default();
        create(c, &fresh).await?;
        let back = probe
            .wait_answer_after(t_reboot, Duration::from_secs(600))
            .await?;
        o.dump_s = d.seconds;
        o.dump_bytes = d.bytes;
        o.dump_io_bytes = d.io_bytes;
        o.notes = d.notes;
        o.reboot_only_s = Some(t_panicked - t_crash + back - t_reboot);
    } else {
        // Once the recovery VM answers, clients ask as fast as it answers until the
        // dump is over: its capacity while the dump runs.
        let back = probe
            .wait_answer_after(t_crash, Duration::from_secs(900))
            .await?;
        let load = capacity::Load::start(setup.port, probe.t0);
        let r = wait_report(c, name, setup, &case.id).await;
        let answers = load.stop();
        let r = r?;
        // The daemon's clock starts at the panic it saw, a few ms after the request.
        let dump_end = r
            .timeline
            .iter()
            .find(|s| s.event.as_deref() == Some("dump finished"))
            .map(|s| t_crash + s.t_s);
        if let Some(end) = dump_end.filter(|&e| e > back) {
            // A rate over less than a second says little (the clients' first
            // connections alone take part of it).
            if end - back >= capacity::MIN_WINDOW_S {
                o.capacity.during_dump_rps = answers.rate(back, end);
            }
            o.capacity.window_s = Some(end - back);
        }
        o.daemon_downtime_s = r.downtime_s;
        o.dump_s = r.dump_s.unwrap_or(0.0);
        o.dump_bytes = r.dump_bytes.unwrap_or(0);
        o.dump_io_bytes = r.dump_io_bytes.unwrap_or(0);
        o.recovery_s = r.recovery_s;
        o.pages_written = r.pages_written.unwrap_or(0);
        o.pages_skipped = r.pages_skipped.clone();
        o.notes = r.notes.clone();
        dump_file = r.dump_path.as_ref().map(PathBuf::from);
        if case.recover_from {
            let rr: RestoreReport = get(c, &format!("/v1/vms/{name}/restore")).await?;
            o.restore_running_s = rr.time_to_running_s;
            o.restore_pages_before_start = Some(rr.pages_loaded_before_start);
        }
        if r.phase == CrashPhase::Failed {
            return Err(Error::Failed {
                name: name.to_string(),
                notes: r.notes.join("; "),
            });
        }
    }
    // The service is back (for b-e before the dump ended); a short look after it, so
    // gaps while the dump still ran count too.
    probe
        .wait_answer_after(t_crash, Duration::from_secs(60))
        .await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (gap, back) = probe.outage_after(t_crash);
    o.longest_gap_s = gap;
    o.downtime_s = back - t_crash;
    drop(probe);
    remove(c, name).await;
    if let Some(f) = dump_file {
        let _ = std::fs::remove_file(f);
    }
    let _ = std::fs::remove_file(&disk);
    Ok((o, st))
}

/// `r`: a guest booted as the cases boot theirs, snapshotted as soon as its service
/// answers (with a working-set trace), then removed: the snapshot every `r` case's
/// recovery VM is restored from.
async fn post_boot_snapshot(
    c: &Client,
    args: &CrashArgs,
    setup: &Setup,
    name: &str,
) -> Result<(PathBuf, SnapshotResult), Error> {
    let disk = copy_disk(setup, name, false)?;
    let spec = setup.spec(args, name, &disk, CrashPolicy::default(), 0);
    setup.say(&format!("r: booting {name} for the post-boot snapshot"));
    create(c, &spec).await?;
    let _: VmStatus = post(
        c,
        &format!("/v1/vms/{name}/wait?for=ready&timeout_ms=600000"),
        None,
    )
    .await?;
    let out = setup.dir.join("post-boot-snapshot");
    setup.say(&format!(
        "r: snapshot of {name} with a {} s working-set trace",
        args.trace_s
    ));
    let req = SnapshotRequest {
        out: out.display().to_string(),
        trace_s: args.trace_s,
        stock: false,
        hold: false,
        netdump: false,
        stop_at_unix_ns: None,
    };
    let r: SnapshotResult = post(
        c,
        &format!("/v1/vms/{name}/snapshot"),
        Some(&serde_json::to_value(&req).map_err(Error::Request)?),
    )
    .await?;
    remove(c, name).await;
    let _ = std::fs::remove_file(&disk);
    Ok((out, r))
}

/// Copies the files of `from` (a snapshot directory, one level of subdirectories
/// at most) into `to`, flushed.
fn copy_tree(from: &Path, to: &Path) -> Result<(), Error> {
    let copy = |source| Error::Copy {
        from: from.to_path_buf(),
        to: to.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(to).map_err(copy)?;
    for e in std::fs::read_dir(from).map_err(copy)? {
        let e = e.map_err(copy)?;
        let (src, dst) = (e.path(), to.join(e.file_name()));
        if e.file_type().map_err(copy)?.is_dir() {
            copy_tree(&src, &dst)?;
        } else {
            std::fs::copy(&src, &dst)
                .and_then(|_| std::fs::File::open(&dst)?.sync_all())
                .map_err(|source| Error::Copy {
                    from: src,
                    to: dst,
                    source,
                })?;
        }
    }
    Ok(())
}

/// Polls the VM's latest crash report until everything the policy asked is finished.
async fn wait_report(
    c: &Client,
    name: &str,
    setup: &Setup,
    id: &str,
) -> Result<CrashReport, Error> {
    let deadline = Instant::now() + Duration::from_secs(900);
    let mut said_back = false;
    let mut dumped_at: Option<Instant> = None;
    loop {
        if let Ok(r) = get::<CrashReport>(c, &format!("/v1/vms/{name}/crashes/latest")).await {
            if matches!(r.phase, CrashPhase::Done | CrashPhase::Failed) {
                return Ok(r);
            }
            if r.dump_s.is_some() && r.downtime_s.is_none() {
                let t = *dumped_at.get_or_insert_with(Instant::now);
                if t.elapsed() > Duration::from_secs(180) {
                    return Err(Error::RecoveryNotReady(name.to_string()));
                }
            }
            if let (Some(d), false) = (r.downtime_s, said_back) {
                setup.say(&format!(
                    "{id}: service back after {d:.2} s, dump still running"
                ));
                said_back = true;
            }
        }
        if Instant::now() > deadline {
            return Err(Error::NotHandled(name.to_string()));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The median outcome of a case over the runs that succeeded (by client downtime);
/// `None` when none did.
fn pick_median(runs: &[Outcome]) -> Option<Outcome> {
    let mut v = runs.to_vec();
    v.sort_by(|a, b| a.downtime_s.total_cmp(&b.downtime_s));
    v.get(v.len() / 2).cloned()
}

/// The cases at least one run measured, each with its median outcome: a case whose
/// every run failed has no figures (its failures are listed).
fn measured(cases: &[Case], results: &[Vec<Outcome>]) -> (Vec<Case>, Vec<Outcome>) {
    cases
        .iter()
        .zip(results)
        .filter_map(|(c, r)| Some((c.clone(), pick_median(r)?)))
        .unzip()
}

fn accel_of(st: &VmStatus) -> (String, String) {
    (
        st.accel.as_str().to_string(),
        st.accel_reason.clone().unwrap_or_default(),
    )
}

pub async fn run(paths: &Paths, args: CrashArgs) -> Result<(), Error> {
    if args.runs == 0 {
        return Err(Error::NoRuns);
    }
    if args.fill >= args.memory {
        return Err(Error::Fill {
            fill: args.fill,
            memory: args.memory,
        });
    }
    let cases = cases(&args)?;
    let want_sizes = args.variants.split(',').any(|v| v.trim() == "s");
    let img = rebound_vmm::images::open(&paths.home, "default").map_err(Error::Image)?;
    let dir = args.out.scratch("crash")?;
    let mut setup = Setup {
        kernel: img.kernel.display().to_string(),
        initrd: img.initrd.display().to_string(),
        append: img.append.clone(),
        disk: img.disk.clone(),
        dir: dir.clone(),
        port: rebound_vmm::process::free_port().map_err(Error::Port)?,
        progress: std::io::stderr().is_terminal(),
        snapshot: None,
        slow: None,
        slow_snapshot: None,
    };
    let mut slow_check = None;
    let c = connect(paths).await.map_err(Error::Connect)?;
    let load_before = load_average();
    let date = rebound_vmm::events::wall_now();
    let tag = format!("bc{}", std::process::id());
    let mut results: Vec<Vec<Outcome>> = vec![Vec::new(); cases.len()];
    let mut sizes = Vec::new();
    let mut accel = (String::new(), String::new());
    let mut snapshot = None;
    let mut failures: Vec<Failure> = Vec::new();
    let work = async {
        if cases.iter().any(|c| c.throttled) {
            // Room for a dump, the guest's disk and the snapshot, twice over; sparse.
            let size = (args.memory * 4 + 4096) << 20;
            let fs = ThrottledFs::new(&dir.join("slow-disk"), size, args.disk_mbps)
                .map_err(Error::SlowDisk)?;
            setup.slow = Some(fs);
            let check = setup
                .slow
                .as_ref()
                .map(|fs| fs.check(args.disk_mbps))
                .transpose()
                .map_err(Error::SlowDisk)?;
            if let Some(c) = &check {
                setup.say(&format!(
                    "emulated disk: {} MB/s for reads and writes together; a flushed write ran at {:.0} MB/s, a cold read at {:.0}",
                    args.disk_mbps, c.write_mbps, c.read_mbps
                ));
            }
            slow_check = check;
        }
        if cases.iter().any(|c| c.recover_from) {
            let name = format!("{tag}-snap");
            let r = post_boot_snapshot(&c, &args, &setup, &name).await;
            if r.is_err() {
                remove(&c, &name).await;
            }
            let (dir, res) = r?;
            if let Some(fs) = &setup.slow {
                let copy = fs.mount.join("post-boot-snapshot");
                setup.say("r: copying the snapshot onto the emulated disk");
                copy_tree(&dir, &copy)?;
                setup.slow_snapshot = Some(copy);
            }
            setup.snapshot = Some(dir);
            snapshot = Some(res);
        }
        for round in 0..args.runs {
            for (i, case) in cases.iter().enumerate() {
                let name = format!("{tag}-{}-{round}", i);
                let r = run_case(&c, &args, &setup, case, &name).await;
                if r.is_err() {
                    remove(&c, &name).await;
                }
                // A failed run is recorded and left out; the next one is tried.
                let (o, st) = match r {
                    Ok(x) => x,
                    Err(e) => {
                        let f = Failure::new(case.id.clone(), round, &e);
                        setup.say(&f.line());
                        failures.push(f);
                        continue;
                    }
                };
                accel = accel_of(&st);
                setup.say(&format!(
                    "{}: client saw the service back after {:.2} s (longest gap {:.2} s)",
                    case.id, o.downtime_s, o.longest_gap_s
                ));
                results[i].push(o);
            }
            if want_sizes {
                let name = format!("{tag}-s-{round}");
                let r = run_sizes(&c, &args, &setup, &name).await;
                if r.is_err() {
                    remove(&c, &name).await;
                }
                let (sz, st) = match r {
                    Ok(x) => x,
                    Err(e) => {
                        let f = Failure::new("s", round, &e);
                        setup.say(&f.line());
                        failures.push(f);
                        continue;
                    }
                };
                accel = accel_of(&st);
                sizes.push(sz);
            }
        }
        Ok::<(), Error>(())
    };
    // Interrupted, the run still unmounts its emulated disk and removes its guests'
    // files on the way out.
    let r = crate::host::until_interrupted(work).await;
    if r.is_err() {
        // A guest the run was measuring when it stopped holds files on the
        // emulated disk: gone before it is unmounted.
        crate::guest::remove_tagged(&c, &tag).await;
    }
    // Unmounted before the scratch directory goes.
    drop(setup.slow.take());
    if args.out.dir.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    r?;
    let load_after = load_average();
    let (shown, med) = measured(&cases, &results);
    let meta = Meta {
        date,
        accel: accel.0,
        accel_reason: accel.1,
        host_cpus: host_cpus(),
        host_kernel: host_kernel(),
        memory_mib: args.memory,
        fill_mib: args.fill,
        disk_mbps: args.disk_mbps,
        chunk_mib: args.chunk,
        min_memory_mib: args.min_memory,
        runs: args.runs,
        load_before,
        load_after,
        snapshot,
        slow_disk: slow_check,
    };
    if let Some(svg) = &args.out.svg {
        std::fs::write(svg, draw(&meta, &med)).map_err(|e| Error::Svg(svg.clone(), e))?;
    }
    if args.out.json {
        // "median" holds the cases in "measured" (a case every run of failed has none).
        let ids: Vec<&str> = shown.iter().map(|c| c.id.as_str()).collect();
        let v = json!({"meta": meta, "cases": cases, "measured": ids, "median": med,
            "runs": results, "sizes": sizes, "failures": failures});
        println!("{}", serde_json::to_string_pretty(&v).map_err(Error::Json)?);
    } else {
        print_text(&meta, &shown, &med, &sizes);
        for (case, r) in cases.iter().zip(&results) {
            if r.len() < args.runs {
                println!(
                    "{}: the median is of {} of {} runs (the others failed)",
                    case.id,
                    r.len(),
                    args.runs
                );
            }
        }
        for f in &failures {
            println!("{}", f.line());
        }
    }
    let tried = args.runs * (cases.len() + usize::from(want_sizes));
    crate::rounds::Incomplete::check(&failures, tried)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::report::baseline;
    use super::*;

    fn args(v: &str) -> CrashArgs {
        CrashArgs {
            memory: 512,
            fill: 384,
            runs: 1,
            variants: v.into(),
            trace_s: 8.0,
            disk_mbps: 100,
            disk_io: 256,
            chunk: 64,
            min_memory: 256,
            out: Default::default(),
        }
    }

    #[test]
    fn variants_expand() {
        let ids: Vec<String> = cases(&args("a,b,c,d,e"))
            .unwrap()
            .into_iter()
            .map(|c| c.id)
            .collect();
        assert_eq!(
            ids,
            [
                "a@100",
                "b@100",
                "c@100",
                "d@100",
                "a@disk",
                "b@disk",
                "c@disk",
                "d@disk",
                "e-fair",
                "e-dump-first",
                "e-recovery-first",
                "e-auto",
                "e-fair@100",
                "e-dump-first@100",
                "e-recovery-first@100",
                "e-auto@100"
            ]
        );
        let e = cases(&args("e")).unwrap();
        assert!(e.iter().all(|c| c.disk_io_mib == 256));
        assert_eq!(e.iter().filter(|c| c.throttled).count(), 4);
        assert_eq!(e[5].io_policy, IoPolicy::DumpFirst);
        assert!(cases(&args("a,x")).is_err());
        let c = cases(&args("d")).unwrap();
        assert_eq!(c[0].filter, [PageClass::Zero, PageClass::Free]);
        assert!(c[0].throttled && !c[1].throttled);
        // The crash policy's defaults, not a rate picked for the benchmark.
        assert_eq!(c[0].io_policy, CrashPolicy::default().io_policy);
        let p = policy(&args("d"), &c[0], Path::new("/x"), Some(Path::new("/s")));
        assert_eq!(p.host_memory_budget_mib, Some(768));
        assert_eq!(p.recover_from, None);
        p.validate(512).unwrap();
        let r = cases(&args("r")).unwrap();
        assert_eq!(
            r.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(),
            ["r@100", "r@disk"]
        );
        let p = policy(&args("r"), &r[0], Path::new("/x"), Some(Path::new("/s")));
        assert_eq!(p.recover_from.as_deref(), Some("/s"));
        p.validate(512).unwrap();
    }

    #[test]
    fn outage_ignores_answers_in_flight_at_the_crash() {
        // Crash asked at 0.25; one answer still came at 0.3; back at 3.0.
        let v = [0.1, 0.2, 0.3, 3.0, 3.1, 3.2];
        assert_eq!(outage(&v, 0.25), (3.0 - 0.3, 3.0));
        assert_eq!(outage(&[], 1.0), (0.0, 1.0));
    }

    #[test]
    fn each_case_is_compared_with_stock_on_the_same_disk() {
        let c = cases(&args("a,c")).unwrap();
        let med: Vec<Outcome> = [10.0, 4.0, 6.0, 2.0]
            .into_iter()
            .map(|d| Outcome {
                downtime_s: d,
                ..Outcome::default()
            })
            .collect();
        assert_eq!(c[1].id, "c@100");
        assert_eq!(baseline(&c[1], &c, &med).unwrap().downtime_s, 10.0);
        assert_eq!(c[3].id, "c@disk");
        assert_eq!(baseline(&c[3], &c, &med).unwrap().downtime_s, 6.0);
        assert!(baseline(&c[1], &c[1..2], &med).is_none());
    }

    #[test]
    fn a_case_is_the_median_of_its_runs_that_succeeded() {
        let c = cases(&args("a,c")).unwrap();
        let o = |d: f64| Outcome {
            downtime_s: d,
            ..Outcome::default()
        };
        // a@100: three runs; c@100: one of three failed; a@disk: every run failed.
        let results = vec![
            vec![o(12.0), o(10.0), o(11.0)],
            vec![o(4.0), o(9.0)],
            vec![],
            vec![o(2.0)],
        ];
        let (shown, med) = measured(&c, &results);
        let ids: Vec<&str> = shown.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids, ["a@100", "c@100", "c@disk"]);
        let d: Vec<f64> = med.iter().map(|o| o.downtime_s).collect();
        assert_eq!(d, [11.0, 9.0, 2.0]);
        // c@disk's stock baseline failed in every run: no ratio against nothing.
        assert!(baseline(&shown[2], &shown, &med).is_none());
        assert_eq!(
            baseline(&shown[1], &shown, &med).map(|o| o.downtime_s),
            Some(11.0)
        );
    }
}
