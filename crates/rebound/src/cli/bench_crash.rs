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
//!   and boot a fresh VM on the same disk and port. QEMU's dump cannot be held to a
//!   rate, so its time at the emulated disk's rate is `bytes / rate` (when the real
//!   disk is faster) and the downtime at that rate is scaled accordingly.
//! - `b` dump-then-recover, `c` dump-and-recover, `d` dump-and-recover with the zero and
//!   free pages filtered: each with the dump held to `--disk-mbps` by the dump writer's
//!   token bucket (I/O policy `D:R`), then again unthrottled (`fair`) on the real disk.
//! - `e` the I/O policies `fair`, `dump-first`, `recovery-first` and `auto` on the real
//!   disk, with the service made disk-bound: it reads `--disk-io` of its data disk
//!   with `O_DIRECT` before it is ready, at boot and again in the recovery VM (the
//!   paper's recovery that copies a file while it boots); and on the emulated disk with
//!   each named policy as its split of the disk's rate (`fair` 50:50, `dump-first`
//!   90:10, `recovery-first` 10:90 at 100 MB/s).
//! - `s` one more crashed guest kept paused, dumped several ways on the same memory:
//!   QEMU's ELF and ours (throughput, durable), ours filtered against `makedumpfile -d
//!   31` of our unfiltered ELF, QEMU's kdump-zlib against ours in zlib and zstd.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use hyper::Method;
use rebound_api::{
    CrashPhase, CrashPolicy, CrashReport, DumpResult, Forward, IoPolicy, OnCrash, PageClass,
    VmSpec, VmStatus,
};
use rebound_vmm::paths::Paths;
use serde::Serialize;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::connect;
use crate::client::Client;

const MB: f64 = 1e6;
const MIB: f64 = (1u64 << 20) as f64;
/// The recovery VM's disk rate under `D:R`: high enough never to bind here.
const RECOVERY_MBPS: u32 = 1000;
const PROBE_EVERY: Duration = Duration::from_millis(100);
const PROBE_TIMEOUT: Duration = Duration::from_millis(1000);

#[derive(Args, Debug)]
pub struct CrashArgs {
    /// Guest memory, e.g. 512M, 1G (a bare number is MiB).
    #[arg(long, default_value = "512M", value_parser = super::parse_memory)]
    memory: u64,
    /// Memory the guest's memfill workload fills before the crash.
    #[arg(long, default_value = "400M", value_parser = super::parse_memory)]
    fill: u64,
    /// Rounds over the variants (interleaved); medians are printed.
    #[arg(long, default_value_t = 1)]
    runs: usize,
    /// Variants to run: a (stock), b, c, d, e (I/O policies), s (same-memory dumps).
    #[arg(long, default_value = "a,b,c,d,e,s")]
    variants: String,
    /// What the service reads from its data disk (O_DIRECT) before it is ready in the
    /// I/O-policy variants (e): a disk-bound service, as the paper's boot-time copy.
    #[arg(long, default_value = "256M", value_parser = super::parse_memory)]
    disk_io: u64,
    /// The emulated disk's rate for the dump, MB/s.
    #[arg(long, default_value_t = 100)]
    disk_mbps: u32,
    /// Chunk size of the dump and the memory handover.
    #[arg(long, default_value = "64M", value_parser = super::parse_memory)]
    chunk: u64,
    /// Memory the recovery VM starts with (the default image's guest, root in RAM,
    /// panicked "deadlocked on memory" when booted with 146 MiB).
    #[arg(long, default_value = "256M", value_parser = super::parse_memory)]
    min_memory: u64,
    /// Where dumps are written (default: /var/tmp/rebound-bench-crash-PID); removed after.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    /// Also draw the downtimes and the longest client gaps to this SVG file.
    #[arg(long)]
    svg: Option<PathBuf>,
}

/// One way of handling the crash.
#[derive(Debug, Clone, Serialize)]
struct Case {
    id: String,
    what: String,
    on_crash: OnCrash,
    filter: Vec<PageClass>,
    io_policy: IoPolicy,
    /// The dump is held to the emulated disk's rate.
    throttled: bool,
    /// MiB the service reads from its disk before it is ready (0: none).
    disk_io_mib: u64,
}

/// What one case measured.
#[derive(Debug, Clone, Serialize, Default)]
struct Outcome {
    case: String,
    /// Crash request to the first answer the client got after it (client side).
    downtime_s: f64,
    /// The daemon's downtime: panic to the recovery VM passing readiness (b–e).
    daemon_downtime_s: Option<f64>,
    /// The longest time between two answers the client saw.
    longest_gap_s: f64,
    dump_s: f64,
    dump_bytes: u64,
    dump_io_bytes: u64,
    recovery_s: Option<f64>,
    pages_written: u64,
    pages_skipped: std::collections::BTreeMap<String, u64>,
    notes: Vec<String>,
    /// For `a`: QEMU's dump time at the emulated disk's rate, and the downtime with it.
    scaled_dump_s: Option<f64>,
    scaled_downtime_s: Option<f64>,
    /// For `a`: the reboot alone (panic seen, kill, boot, service answers), no dump.
    reboot_only_s: Option<f64>,
}

/// The same-memory dump comparison (`s`).
#[derive(Debug, Clone, Serialize, Default)]
struct Sizes {
    guest_bytes: u64,
    qemu_elf: Option<DumpResult>,
    ours_elf: Option<DumpResult>,
    ours_zero_free: Option<DumpResult>,
    ours_all_classes: Option<DumpResult>,
    makedumpfile_d31_elf_bytes: Option<u64>,
    makedumpfile_d31_s: Option<f64>,
    qemu_kdump_zlib: Option<DumpResult>,
    ours_kdump_zlib: Option<DumpResult>,
    ours_kdump_zstd: Option<DumpResult>,
    notes: Vec<String>,
}

fn cases(args: &CrashArgs) -> anyhow::Result<Vec<Case>> {
    let want: Vec<&str> = args.variants.split(',').map(str::trim).collect();
    if let Some(bad) = want
        .iter()
        .find(|v| !["a", "b", "c", "d", "e", "s"].contains(v))
    {
        anyhow::bail!("unknown variant {bad:?}: expected a, b, c, d, e or s");
    }
    let rate = IoPolicy::Rates {
        dump_mbps: args.disk_mbps,
        recovery_mbps: RECOVERY_MBPS,
    };
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
        })
    };
    use OnCrash::*;
    let zf = [PageClass::Zero, PageClass::Free];
    if want.contains(&"a") {
        add(
            "a",
            "stock: QEMU ELF dump, reboot".into(),
            None,
            &[],
            IoPolicy::Fair,
            false,
        );
    }
    for (throttled, io, at) in [
        (true, rate, format!("@{r}")),
        (false, IoPolicy::Fair, "@disk".into()),
    ] {
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
    }
    if want.contains(&"e") {
        // The same service made disk-bound, each policy on the real disk.
        for io in [
            IoPolicy::Fair,
            IoPolicy::DumpFirst,
            IoPolicy::RecoveryFirst,
            IoPolicy::Auto,
        ] {
            add(
                &format!("e-{io}"),
                format!("dump-and-recover, disk-bound service, io {io}"),
                DumpAndRecover,
                &[],
                io,
                false,
            );
        }
        // And on the emulated disk, each policy as its split of the one disk's rate
        // (D:R: the dump writer's token bucket and QMP throttling of the recovery VM).
        let tenth = (r / 10).max(1);
        for (name, d, rr) in [
            ("fair", r / 2, r / 2),
            ("dump-first", r - tenth, tenth),
            ("recovery-first", tenth, r - tenth),
        ] {
            add(
                &format!("e-{name}@{r}"),
                format!("dump-and-recover, disk-bound service, {name} as {d}:{rr} MB/s"),
                DumpAndRecover,
                &[],
                IoPolicy::Rates {
                    dump_mbps: d,
                    recovery_mbps: rr,
                },
                true,
            );
        }
        for c in out.iter_mut().filter(|c| c.id.starts_with("e-")) {
            c.disk_io_mib = args.disk_io;
        }
    }
    Ok(out)
}

/// Where the default image's parts are, and the run's scratch directory.
struct Setup {
    kernel: String,
    initrd: String,
    append: String,
    disk: PathBuf,
    dir: PathBuf,
    port: u16,
    progress: bool,
}

impl Setup {
    fn spec(
        &self,
        args: &CrashArgs,
        name: &str,
        disk: &Path,
        crash: CrashPolicy,
        disk_io_mib: u64,
    ) -> VmSpec {
        let mut s = VmSpec::new(name);
        s.kernel = Some(self.kernel.clone());
        s.initrd = Some(self.initrd.clone());
        s.append = Some(format!(
            "{} unknown_nmi_panic rebound.workload=memfill,web rebound.memfill={} rebound.disk_io={}",
            self.append,
            args.fill << 20,
            disk_io_mib << 20
        ));
        s.disks = vec![disk.display().to_string()];
        s.memory_mib = args.memory;
        s.ready = Some("http:8080/".into());
        s.forwards = vec![Forward {
            host: self.port,
            guest: 8080,
        }];
        s.crash = crash;
        s
    }

    fn say(&self, m: &str) {
        if self.progress {
            eprintln!("bench crash: {m}");
        }
    }
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

    async fn wait_answer_after(&self, t: f64, limit: Duration) -> anyhow::Result<f64> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(x) = self.first_after(t) {
                return Ok(x);
            }
            if Instant::now() > deadline {
                anyhow::bail!("the service did not answer within {limit:?}");
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

pub(super) async fn post<T: serde::de::DeserializeOwned>(
    c: &Client,
    path: &str,
    body: Option<&Value>,
) -> anyhow::Result<T> {
    Ok(c.call(Method::POST, path, body).await?)
}

pub(super) async fn remove(c: &Client, name: &str) {
    let _ = c
        .call::<Value>(Method::POST, &format!("/v1/vms/{name}/kill"), None)
        .await;
    let _ = c
        .call::<Value>(Method::DELETE, &format!("/v1/vms/{name}"), None)
        .await;
}

/// Starts the guest, waits for the service and for memfill to have filled its memory:
/// the guest's RAM file holds at least the fill and has stopped growing. (A user
/// kernel has no agent link, so no memfill events: the host side is what we watch.)
pub(super) async fn boot_filled(c: &Client, s: &VmSpec, fill_mib: u64) -> anyhow::Result<VmStatus> {
    let _: VmStatus = post(c, "/v1/vms", Some(&serde_json::to_value(s)?)).await?;
    let n = &s.name;
    let st: VmStatus = post(
        c,
        &format!("/v1/vms/{n}/wait?for=ready&timeout_ms=600000"),
        None,
    )
    .await?;
    let ram = PathBuf::from(&st.ram_file);
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut last = 0;
    loop {
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let held = rebound_vmm::process::allocated_bytes(&ram).unwrap_or(0);
        if held >= fill_mib << 20 && held == last {
            return Ok(st);
        }
        last = held;
        if Instant::now() > deadline {
            anyhow::bail!(
                "{n}: the guest's RAM holds {} MiB, not the {fill_mib} MiB memfill should fill, after 180 s (too little guest memory? memfill needs the fill + 16 MiB free)",
                held >> 20
            );
        }
    }
}

fn policy(args: &CrashArgs, case: &Case, dir: &Path) -> CrashPolicy {
    CrashPolicy {
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

fn copy_disk(setup: &Setup, tag: &str) -> anyhow::Result<PathBuf> {
    let d = setup.dir.join(format!("{tag}.ext4"));
    std::fs::copy(&setup.disk, &d)?;
    Ok(d)
}

async fn run_case(
    c: &Client,
    args: &CrashArgs,
    setup: &Setup,
    case: &Case,
    name: &str,
) -> anyhow::Result<(Outcome, VmStatus)> {
    let disk = copy_disk(setup, name)?;
    let spec = setup.spec(
        args,
        name,
        &disk,
        policy(args, case, &setup.dir),
        case.disk_io_mib,
    );
    setup.say(&format!(
        "{}: booting {name} and filling {} MiB",
        case.id, args.fill
    ));
    let st = boot_filled(c, &spec, args.fill).await?;
    let probe = Prober::start(setup.port);
    tokio::time::sleep(Duration::from_secs(1)).await;
    if probe.answers().is_empty() {
        anyhow::bail!("{name}: the service does not answer the client before the crash");
    }
    setup.say(&format!("{}: crash", case.id));
    let t_crash = probe.now();
    let _: Value = post(c, &format!("/v1/vms/{name}/crash"), None).await?;
    let mut o = Outcome {
        case: case.id.clone(),
        ..Outcome::default()
    };
    if case.on_crash == OnCrash::None {
        let _: VmStatus = post(
            c,
            &format!("/v1/vms/{name}/wait?for=panicked&timeout_ms=60000"),
            None,
        )
        .await?;
        let t_panicked = probe.now();
        let out = setup.dir.join(format!("{name}.qemu.elf"));
        setup.say("a: QEMU's dump-guest-memory (ELF, then fsync)");
        let d: DumpResult = post(
            c,
            &format!("/v1/vms/{name}/dump"),
            Some(&json!({"out": out, "format": "elf", "engine": "qemu"})),
        )
        .await?;
        let _ = std::fs::remove_file(&out);
        setup.say("a: reboot: kill, boot a fresh VM on the same disk and port");
        let t_reboot = probe.now();
        remove(c, name).await;
        let mut fresh = spec.clone();
        fresh.crash = CrashPolicy::default();
        let _: VmStatus = post(c, "/v1/vms", Some(&serde_json::to_value(&fresh)?)).await?;
        let back = probe
            .wait_answer_after(t_reboot, Duration::from_secs(600))
            .await?;
        o.dump_s = d.seconds;
        o.dump_bytes = d.bytes;
        o.dump_io_bytes = d.io_bytes;
        o.notes = d.notes;
        let at_rate = d.bytes as f64 / (args.disk_mbps as f64 * MB);
        let scaled = d.seconds.max(at_rate);
        o.scaled_dump_s = Some(scaled);
        o.reboot_only_s = Some(t_panicked - t_crash + back - t_reboot);
    } else {
        let r = wait_report(c, name, setup, &case.id).await?;
        o.daemon_downtime_s = r.downtime_s;
        o.dump_s = r.dump_s.unwrap_or(0.0);
        o.dump_bytes = r.dump_bytes.unwrap_or(0);
        o.dump_io_bytes = r.dump_io_bytes.unwrap_or(0);
        o.recovery_s = r.recovery_s;
        o.pages_written = r.pages_written.unwrap_or(0);
        o.pages_skipped = r.pages_skipped.clone();
        o.notes = r.notes.clone();
        if let Some(p) = &r.dump_path {
            let _ = std::fs::remove_file(p);
        }
        if r.phase == CrashPhase::Failed {
            anyhow::bail!("{name}: crash handling failed: {}", r.notes.join("; "));
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
    if let Some(scaled) = o.scaled_dump_s {
        o.scaled_downtime_s = Some(o.downtime_s - o.dump_s + scaled);
    }
    drop(probe);
    remove(c, name).await;
    let _ = std::fs::remove_file(&disk);
    Ok((o, st))
}

/// Polls the VM's latest crash report until everything the policy asked is finished.
async fn wait_report(
    c: &Client,
    name: &str,
    setup: &Setup,
    id: &str,
) -> anyhow::Result<CrashReport> {
    let deadline = Instant::now() + Duration::from_secs(900);
    let mut said_back = false;
    let mut dumped_at: Option<Instant> = None;
    loop {
        if let Ok(r) = c
            .call::<CrashReport>(Method::GET, &format!("/v1/vms/{name}/crashes/latest"), None)
            .await
        {
            if matches!(r.phase, CrashPhase::Done | CrashPhase::Failed) {
                return Ok(r);
            }
            if r.dump_s.is_some() && r.downtime_s.is_none() {
                let t = *dumped_at.get_or_insert_with(Instant::now);
                if t.elapsed() > Duration::from_secs(180) {
                    anyhow::bail!(
                        "{name}: the recovery VM was not ready 180 s after the dump finished (see `rebound vm logs {name}`)"
                    );
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
            anyhow::bail!("{name}: the crash was not handled within 900 s");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// `s`: one crashed guest kept paused, dumped several ways over the same memory.
async fn run_sizes(
    c: &Client,
    args: &CrashArgs,
    setup: &Setup,
    name: &str,
) -> anyhow::Result<(Sizes, VmStatus)> {
    let disk = copy_disk(setup, name)?;
    let spec = setup.spec(args, name, &disk, CrashPolicy::default(), 0);
    setup.say(&format!("s: booting {name} and filling {} MiB", args.fill));
    let st = boot_filled(c, &spec, args.fill).await?;
    let _: Value = post(c, &format!("/v1/vms/{name}/crash"), None).await?;
    let _: VmStatus = post(
        c,
        &format!("/v1/vms/{name}/wait?for=panicked&timeout_ms=60000"),
        None,
    )
    .await?;
    let mut s = Sizes {
        guest_bytes: args.memory << 20,
        ..Sizes::default()
    };
    let dump = |file: &'static str, body: Value| dump_as(c, setup, name, file, body);
    let n = &mut s.notes;
    s.qemu_elf = keep(dump("qemu.elf", json!({"engine": "qemu"})).await, n);
    s.ours_elf = keep(dump("ours.elf", json!({})).await, n);
    let zf = json!({"filter": ["zero", "free"]});
    s.ours_zero_free = keep(dump("ours-zf.elf", zf).await, n);
    let all = json!({"filter": ["zero", "free", "cache", "user"]});
    s.ours_all_classes = keep(dump("ours-d31.elf", all).await, n);
    let ours = setup.dir.join(format!("{name}.ours.elf"));
    let mdf = setup.dir.join(format!("{name}.makedumpfile-d31.elf"));
    setup.say("s: makedumpfile -E -d 31 on our unfiltered ELF");
    let t = Instant::now();
    let ran = std::process::Command::new("makedumpfile")
        .args(["-E", "-d", "31"])
        .arg(&ours)
        .arg(&mdf)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
    match ran {
        Ok(st) if st.success() => {
            s.makedumpfile_d31_s = Some(t.elapsed().as_secs_f64());
            s.makedumpfile_d31_elf_bytes = std::fs::metadata(&mdf).ok().map(|m| m.len());
        }
        Ok(st) => s.notes.push(format!("makedumpfile -E -d 31 failed ({st})")),
        Err(e) => s.notes.push(format!("cannot run makedumpfile: {e}")),
    }
    let n = &mut s.notes;
    let zlib = json!({"engine": "qemu", "format": "kdump", "compress": "zlib"});
    s.qemu_kdump_zlib = keep(dump("qemu.kdump", zlib).await, n);
    let zlib = json!({"format": "kdump", "compress": "zlib"});
    s.ours_kdump_zlib = keep(dump("ours.kdump", zlib).await, n);
    let zstd = json!({"format": "kdump", "compress": "zstd"});
    s.ours_kdump_zstd = keep(dump("ours-zstd.kdump", zstd).await, n);
    for f in [
        "qemu.elf",
        "ours.elf",
        "ours-zf.elf",
        "ours-d31.elf",
        "makedumpfile-d31.elf",
        "qemu.kdump",
        "ours.kdump",
        "ours-zstd.kdump",
    ] {
        let _ = std::fs::remove_file(setup.dir.join(format!("{name}.{f}")));
    }
    remove(c, name).await;
    let _ = std::fs::remove_file(&disk);
    Ok((s, st))
}

/// One on-demand dump of the kept guest into the scratch directory.
async fn dump_as(
    c: &Client,
    setup: &Setup,
    name: &str,
    file: &str,
    mut body: Value,
) -> anyhow::Result<DumpResult> {
    body["out"] = json!(setup.dir.join(format!("{name}.{file}")));
    setup.say(&format!("s: dump {file}"));
    post(c, &format!("/v1/vms/{name}/dump"), Some(&body))
        .await
        .map_err(|e| anyhow::anyhow!("{file}: {e}"))
}

/// A dump's result, or `None` with why in `notes`: one failed dump of `s` does not
/// lose the run.
fn keep(r: anyhow::Result<DumpResult>, notes: &mut Vec<String>) -> Option<DumpResult> {
    r.map_err(|e| notes.push(format!("dump {e:#} (not counted)")))
        .ok()
}

/// The median outcome of a case over its runs (by client downtime).
fn pick_median(runs: &[Outcome]) -> Outcome {
    let mut v = runs.to_vec();
    v.sort_by(|a, b| a.downtime_s.total_cmp(&b.downtime_s));
    v[v.len() / 2].clone()
}

fn accel_of(st: &VmStatus) -> (String, String) {
    (
        st.accel.as_str().to_string(),
        st.accel_reason.clone().unwrap_or_default(),
    )
}

pub(super) fn host_cpus() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0)
}

pub(super) fn host_kernel() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string()
}

pub(super) fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

pub async fn run(paths: &Paths, args: CrashArgs) -> anyhow::Result<()> {
    if args.runs == 0 {
        anyhow::bail!("--runs must be at least 1");
    }
    if args.fill >= args.memory {
        anyhow::bail!(
            "--fill {} MiB must be below --memory {} MiB",
            args.fill,
            args.memory
        );
    }
    let cases = cases(&args)?;
    let want_sizes = args.variants.split(',').any(|v| v.trim() == "s");
    let img = rebound_vmm::images::open(&paths.home, "default")
        .map_err(|e| anyhow::anyhow!("the default image: {e} (run `rebound image build`)"))?;
    let dir = args.dir.clone().unwrap_or_else(|| {
        PathBuf::from(format!(
            "/var/tmp/rebound-bench-crash-{}",
            std::process::id()
        ))
    });
    std::fs::create_dir_all(&dir)?;
    let setup = Setup {
        kernel: img.kernel.display().to_string(),
        initrd: img.initrd.display().to_string(),
        append: img.append.clone(),
        disk: img.disk.clone(),
        dir: dir.clone(),
        port: rebound_vmm::process::free_port()?,
        progress: std::io::stderr().is_terminal(),
    };
    let c = connect(paths).await?;
    let load_before = load_average();
    let date = rebound_vmm::events::wall_now();
    let tag = format!("bc{}", std::process::id());
    let mut results: Vec<Vec<Outcome>> = vec![Vec::new(); cases.len()];
    let mut sizes = Vec::new();
    let mut accel = (String::new(), String::new());
    let r: anyhow::Result<()> = async {
        for round in 0..args.runs {
            for (i, case) in cases.iter().enumerate() {
                let name = format!("{tag}-{}-{round}", i);
                let r = run_case(&c, &args, &setup, case, &name).await;
                if r.is_err() {
                    remove(&c, &name).await;
                }
                let (o, st) = r?;
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
                let (sz, st) = r?;
                accel = accel_of(&st);
                sizes.push(sz);
            }
        }
        Ok(())
    }
    .await;
    if args.dir.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    r?;
    let load_after = load_average();
    let med: Vec<Outcome> = results.iter().map(|r| pick_median(r)).collect();
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
    };
    if let Some(svg) = &args.svg {
        std::fs::write(svg, draw(&meta, &med))?;
    }
    if args.json {
        let v =
            json!({"meta": meta, "cases": cases, "median": med, "runs": results, "sizes": sizes});
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print_text(&meta, &cases, &med, &sizes);
    }
    Ok(())
}

#[derive(Debug, Serialize)]
struct Meta {
    date: String,
    accel: String,
    accel_reason: String,
    host_cpus: usize,
    host_kernel: String,
    memory_mib: u64,
    fill_mib: u64,
    disk_mbps: u32,
    chunk_mib: u64,
    min_memory_mib: u64,
    runs: usize,
    load_before: String,
    load_after: String,
}

/// The stock baseline a case is compared with: `a` at the emulated disk's rate
/// (scaled) for throttled cases, `a` as measured on the real disk otherwise.
fn baseline(case: &Case, a: Option<&Outcome>) -> Option<f64> {
    let a = a?;
    if case.throttled {
        a.scaled_downtime_s
    } else {
        Some(a.downtime_s)
    }
}

fn print_text(meta: &Meta, cases: &[Case], med: &[Outcome], sizes: &[Sizes]) {
    println!(
        "rebound bench crash: {} MiB guest, {} MiB filled (memfill) + web, 1 vCPU; accel {} ({}); host {} CPUs, kernel {}; {}",
        meta.memory_mib, meta.fill_mib, meta.accel, meta.accel_reason, meta.host_cpus, meta.host_kernel, meta.date
    );
    println!(
        "dump held to {} MB/s by the dump writer's token bucket in @{} cases (@disk: unthrottled, real disk); chunk {} MiB, min-memory {} MiB, budget memory + min-memory; {} run(s), medians; load {} -> {}",
        meta.disk_mbps, meta.disk_mbps, meta.chunk_mib, meta.min_memory_mib, meta.runs, meta.load_before, meta.load_after
    );
    let guest = (meta.memory_mib << 20) as f64;
    let a = cases.iter().position(|c| c.id == "a").map(|i| &med[i]);
    // With `--variants s` alone there are only the same-memory dumps.
    if !cases.is_empty() {
        println!(
            "{:<22} {:>9} {:>9} {:>8} {:>8} {:>10} {:>10} {:>9} {:>9} {:>7}",
            "case",
            "downtime",
            "daemon",
            "gap",
            "dump_s",
            "covered/s",
            "dump MiB",
            "io MiB",
            "io MB/s",
            "vs a"
        );
    }
    let opt = |v: Option<f64>| v.map(|x| format!("{x:.2}")).unwrap_or_else(|| "-".into());
    for (case, o) in cases.iter().zip(med) {
        let ratio = baseline(case, a)
            .map(|b| format!("{:.2}x", o.downtime_s / b))
            .unwrap_or_default();
        let ratio = if case.id == "a" { String::new() } else { ratio };
        println!(
            "{:<22} {:>9.2} {:>9} {:>8.2} {:>8.2} {:>10.0} {:>10.1} {:>9.1} {:>9.1} {:>7}",
            case.id,
            o.downtime_s,
            opt(o.daemon_downtime_s),
            o.longest_gap_s,
            o.dump_s,
            guest / o.dump_s / MIB,
            o.dump_bytes as f64 / MIB,
            o.dump_io_bytes as f64 / MIB,
            o.dump_io_bytes as f64 / o.dump_s / MB,
            ratio
        );
    }
    if let Some(a) = a {
        println!(
            "a at {} MB/s (QEMU cannot be throttled: its dump time there is bytes / rate): dump {} s, downtime {} s; reboot alone (no dump) {} s",
            meta.disk_mbps,
            opt(a.scaled_dump_s),
            opt(a.scaled_downtime_s),
            opt(a.reboot_only_s)
        );
        if let Some(reboot) = a.reboot_only_s {
            for (case, o) in cases.iter().zip(med).filter(|(c, _)| c.id != "a") {
                println!(
                    "  {:<20} downtime / reboot alone {:.2}x",
                    case.id,
                    o.downtime_s / reboot
                );
            }
        }
    }
    for (case, o) in cases.iter().zip(med) {
        if !o.pages_skipped.is_empty() {
            println!(
                "{}: {} pages written, skipped {:?}",
                case.id, o.pages_written, o.pages_skipped
            );
        }
        for n in &o.notes {
            println!("{}: note: {n}", case.id);
        }
    }
    for s in sizes {
        print_sizes(s);
    }
}

fn print_sizes(s: &Sizes) {
    let g = s.guest_bytes as f64;
    println!("same memory, guest kept paused (s), real disk, every file durable:");
    let row = |label: &str, d: &Option<DumpResult>| {
        if let Some(d) = d {
            println!(
                "  {label:<34} {:>8.2} s {:>8.0} MiB/s covered {:>9.1} MiB file {:>9.1} MiB written",
                d.seconds,
                g / d.seconds / MIB,
                d.bytes as f64 / MIB,
                d.io_bytes as f64 / MIB
            );
        }
    };
    row("QEMU dump-guest-memory ELF", &s.qemu_elf);
    row("ours ELF", &s.ours_elf);
    row("ours ELF, filter zero,free", &s.ours_zero_free);
    row("ours ELF, filter zero,free,cache,user", &s.ours_all_classes);
    row("QEMU kdump-zlib", &s.qemu_kdump_zlib);
    row("ours kdump zlib", &s.ours_kdump_zlib);
    row("ours kdump zstd", &s.ours_kdump_zstd);
    let speed = |x: &Option<DumpResult>, y: &Option<DumpResult>| match (x, y) {
        (Some(x), Some(y)) => format!("{:.2}x", x.seconds / y.seconds),
        _ => "-".into(),
    };
    println!(
        "  throughput ours/QEMU: ELF {}, kdump-zlib {}, our kdump-zstd against QEMU's kdump-zlib {}",
        speed(&s.qemu_elf, &s.ours_elf),
        speed(&s.qemu_kdump_zlib, &s.ours_kdump_zlib),
        speed(&s.qemu_kdump_zlib, &s.ours_kdump_zstd)
    );
    if let (Some(m), Some(t)) = (s.makedumpfile_d31_elf_bytes, s.makedumpfile_d31_s) {
        let ours = s.ours_all_classes.as_ref().map(|d| d.bytes).unwrap_or(0);
        let zf = s.ours_zero_free.as_ref().map(|d| d.bytes).unwrap_or(0);
        println!(
            "  makedumpfile -E -d 31 of our unfiltered ELF: {:.1} MiB in {t:.2} s; ours with all four classes {:.1} MiB ({:.3}x), with zero,free {:.1} MiB",
            m as f64 / MIB,
            ours as f64 / MIB,
            ours as f64 / m as f64,
            zf as f64 / MIB
        );
    }
    for n in &s.notes {
        println!("  note: {n}");
    }
}

/// Downtime (bar) and the longest client gap (tick) per case, as an SVG.
fn draw(meta: &Meta, med: &[Outcome]) -> String {
    let w = 760.0;
    let left = 170.0;
    let row = 26.0;
    let top = 50.0;
    let h = top + row * med.len() as f64 + 40.0;
    let max = med
        .iter()
        .flat_map(|o| {
            [
                o.downtime_s,
                o.longest_gap_s,
                o.scaled_downtime_s.unwrap_or(0.0),
            ]
        })
        .fold(1.0, f64::max);
    let x = |v: f64| left + v / max * (w - left - 30.0);
    let mut s = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">
<text x="10" y="18" font-size="14">Crash to service answering: {} MiB guest, {} MiB filled, accel {}, {}</text>
<text x="10" y="36" fill="#555">bar: downtime seen by a client probing every 100 ms; black tick: its longest gap; dump held to {} MB/s in @{} cases</text>
"##,
        meta.memory_mib, meta.fill_mib, meta.accel, meta.date, meta.disk_mbps, meta.disk_mbps
    );
    for (i, o) in med.iter().enumerate() {
        let y = top + row * i as f64;
        let color = if o.case == "a" { "#c44" } else { "#48c" };
        s += &format!(
            "<text x=\"10\" y=\"{:.0}\">{}</text><rect x=\"{left}\" y=\"{y:.0}\" width=\"{:.1}\" height=\"18\" fill=\"{color}\"/><text x=\"{:.1}\" y=\"{:.0}\">{:.2} s</text><line x1=\"{:.1}\" x2=\"{:.1}\" y1=\"{:.0}\" y2=\"{:.0}\" stroke=\"black\" stroke-width=\"2\"/>\n",
            y + 13.0,
            o.case,
            x(o.downtime_s) - left,
            x(o.downtime_s) + 4.0,
            y + 13.0,
            o.downtime_s,
            x(o.longest_gap_s),
            x(o.longest_gap_s),
            y - 2.0,
            y + 20.0
        );
        if let Some(sc) = o.scaled_downtime_s {
            s += &format!(
                "<rect x=\"{left}\" y=\"{:.0}\" width=\"{:.1}\" height=\"4\" fill=\"#e99\"/>\n",
                y + 18.0,
                x(sc) - left
            );
        }
    }
    s += &format!(
        "<text x=\"{left}\" y=\"{:.0}\" fill=\"#555\">0 to {max:.1} s (thin red: a's downtime at {} MB/s, scaled)</text>\n</svg>\n",
        h - 12.0,
        meta.disk_mbps
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &str) -> CrashArgs {
        CrashArgs {
            memory: 512,
            fill: 400,
            runs: 1,
            variants: v.into(),
            disk_mbps: 100,
            disk_io: 256,
            chunk: 64,
            min_memory: 256,
            dir: None,
            json: false,
            svg: None,
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
                "a",
                "b@100",
                "c@100",
                "d@100",
                "b@disk",
                "c@disk",
                "d@disk",
                "e-fair",
                "e-dump-first",
                "e-recovery-first",
                "e-auto",
                "e-fair@100",
                "e-dump-first@100",
                "e-recovery-first@100"
            ]
        );
        let e = cases(&args("e")).unwrap();
        assert!(e.iter().all(|c| c.disk_io_mib == 256));
        assert_eq!(e.iter().filter(|c| c.throttled).count(), 3);
        assert_eq!(e[5].io_policy.to_string(), "90:10");
        assert!(cases(&args("a,x")).is_err());
        let c = cases(&args("d")).unwrap();
        assert_eq!(c[0].filter, [PageClass::Zero, PageClass::Free]);
        assert!(c[0].throttled && !c[1].throttled);
        let p = policy(&args("d"), &c[0], Path::new("/x"));
        assert_eq!(p.host_memory_budget_mib, Some(768));
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
    fn stock_baseline_is_scaled_only_for_throttled_cases() {
        let a = Outcome {
            downtime_s: 6.0,
            scaled_downtime_s: Some(10.0),
            ..Outcome::default()
        };
        let c = cases(&args("c")).unwrap();
        assert_eq!(baseline(&c[0], Some(&a)), Some(10.0));
        assert_eq!(baseline(&c[1], Some(&a)), Some(6.0));
    }
}
