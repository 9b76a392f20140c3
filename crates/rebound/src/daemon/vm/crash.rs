//! What the owner does when its guest dies (panic or watchdog), by the VM's crash
//! policy (`rebound_api::CrashPolicy`):
//!
//! 1. the crashed QEMU's vCPU registers are saved (when dumping), its RAM file is moved
//!    out of the run directory (a rename on the same tmpfs), and the QEMU is told to
//!    quit, which flushes and releases its disks and forwarded ports (it will never run
//!    again, so no two QEMUs ever write one disk);
//! 2. the dump reads the moved RAM file chunk by chunk and punches each chunk out
//!    once it is durable, so host memory comes back at a steady rate;
//! 3. the recovery VM boots on the same disk copy and ports, with the memory the
//!    budget allows now, and is given the rest with virtio-mem as the dump frees it.
//!
//! A report (`vms/NAME/crashes/ID/report.json`) and the event log follow every step.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rebound_api::{
    CrashPhase, CrashPolicy, CrashReport, EventData, IoPolicy, MemorySample, OnCrash,
};
use rebound_vmm::events::{mono_ns, wall_now};
use rebound_vmm::resolve::{Recovery, VIRTIO_MEM_BLOCK_MIB};
use tokio::sync::mpsc::UnboundedReceiver;

use super::machine::Trigger;
use super::owner::Owner;

const MIB: u64 = 1 << 20;

/// What the dump task reports to the owner.
#[derive(Debug)]
pub enum DumpProgress {
    /// Guest memory covered so far (written or skipped) is durable, and the RAM file
    /// now holds this much.
    Chunk {
        dumped_bytes: u64,
        crashed_bytes: u64,
    },
    /// Finished: the dump's size, or why it failed.
    Done(Result<DumpDone, String>),
}

/// A finished dump.
#[derive(Debug)]
pub struct DumpDone {
    pub bytes: u64,
    pub io_bytes: u64,
    pub pages_written: u64,
    pub pages_skipped: std::collections::BTreeMap<String, u64>,
    pub notes: Vec<String>,
}

/// One crash being handled.
pub struct Handling {
    pub report: CrashReport,
    dir: PathBuf,
    crashed_ram: PathBuf,
    progress: Option<UnboundedReceiver<DumpProgress>>,
    dump_started_ns: Option<u64>,
    /// A recovery VM is due once the budget allows it.
    recovery_due: bool,
    recovery_spawned_ns: Option<u64>,
    /// What the recovery VM is configured with now (boot + plugged), MiB.
    recovery_mib: u64,
    boot_mib: u64,
    dumped_bytes: u64,
    /// The dump's rate, which the I/O policy changes as recovery advances.
    rate: super::dump::Rate,
    /// The recovery VM's disks are throttled while the dump runs.
    throttled: bool,
    /// The VM's memory group, limited to the budget while the crash is handled.
    group: Option<rebound_vmm::cgroup::Group>,
    /// Partial dumps of daemons that stopped mid-dump, newest first: the pages they
    /// hold are no longer in the RAM file.
    earlier: Vec<PathBuf>,
    /// The I/O policy in force: `auto` resolved to dump-first or recovery-first.
    io: IoPolicy,
    /// `auto`: the recovery VM's disk bytes at the last look, and when.
    disk_seen: Option<(u64, u64)>,
}

/// `dump-first` holds the recovery VM's disks, `recovery-first` the dump, to this.
const SLOW: u64 = 10_000_000;
/// `auto` calls a service disk-bound above this average rate, in bytes per second.
const DISK_BOUND: u64 = 5_000_000;

/// What the recovery QEMU itself may hold besides guest memory (TCG's code cache,
/// QEMU's heap, page tables), on top of the budget in the memory group's limit.
/// Measured here: a TCG QEMU of a 512 MiB guest holds ~80 MiB of anonymous memory
/// after boot, plus the page cache of what it reads (kernel, initrd, disk), which the
/// kernel reclaims at the limit rather than failing.
pub const QEMU_FOOTPRINT_MIB: u64 = 256;

/// While a dump and a recovery VM share the disk: the dump's rate and the recovery
/// VM's disk rate, in bytes per second (0: unlimited), as the I/O policy says.
/// `dump-first` holds the recovery VM's disks to 10 MB/s; `recovery-first` holds the
/// dump to 10 MB/s until the recovery VM is ready; `D:R` fixes both.
pub fn io_rates(p: IoPolicy, recovery_ready: bool) -> (u64, u64) {
    match p {
        IoPolicy::Fair => (0, 0),
        // Until `auto` is resolved, as dump-first.
        IoPolicy::DumpFirst | IoPolicy::Auto => (0, SLOW),
        IoPolicy::RecoveryFirst => (if recovery_ready { 0 } else { SLOW }, 0),
        IoPolicy::Rates {
            dump_mbps,
            recovery_mbps,
        } => (
            dump_mbps as u64 * 1_000_000,
            recovery_mbps as u64 * 1_000_000,
        ),
    }
}

/// The next dump progress message, if a dump runs; never, otherwise.
pub async fn next_progress(h: &mut Option<Handling>) -> Option<DumpProgress> {
    match h.as_mut().and_then(|h| h.progress.as_mut()) {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// A crash id: UTC time to the millisecond, sortable.
fn crash_id() -> String {
    chrono::Utc::now().format("%Y%m%dT%H%M%S%.3fZ").to_string()
}

/// Bytes a file holds on its filesystem (0 once it is gone).
fn held(path: &Path) -> u64 {
    rebound_vmm::process::allocated_bytes(path).unwrap_or(0)
}

impl Owner {
    /// Takes over a guest that just died, as its crash policy says.
    pub(super) async fn respond_to_crash(&mut self, cause: &'static str) {
        let rec = self.vm.record();
        let policy = rec.spec.crash.clone();
        if policy.on_crash == OnCrash::None {
            // Kept paused, as it is.
            return;
        }
        if let Some(h) = self.crash.as_mut() {
            if h.report.downtime_s.is_none() {
                // The recovery VM died before it was ready: that crash failed to recover.
                h.report.notes.push(format!(
                    "the recovery VM crashed too ({cause}) before it was ready"
                ));
                h.report.phase = CrashPhase::Failed;
                h.recovery_due = false;
            } else {
                h.report.notes.push(format!(
                    "the recovered VM crashed again ({cause}) while this dump ran"
                ));
            }
            let dumping = h.progress.is_some();
            self.save_report();
            if dumping {
                // The earlier dump still holds memory: keep this one for the operator.
                return;
            }
            self.crash = None;
        }
        let id = crash_id();
        let dir = self.vm.dir.crash_dir(&id);
        if let Err(e) = rebound_vmm::private::create_dir_all(&dir) {
            tracing::error!(vm = %self.vm.name, "cannot create {}: {e}; the guest stays paused", dir.display());
            return;
        }
        let now = mono_ns();
        let report = CrashReport {
            version: rebound_api::crash::CRASH_REPORT_VERSION,
            id: id.clone(),
            vm: self.vm.name.clone(),
            cause: cause.to_string(),
            policy: policy.clone(),
            crashed_at: wall_now(),
            crashed_mono_ns: now,
            phase: CrashPhase::Recovering,
            downtime_s: None,
            dump_s: None,
            recovery_s: None,
            dump_path: None,
            dump_bytes: None,
            dump_io_bytes: None,
            pages_written: None,
            pages_skipped: Default::default(),
            io_policy: policy.io_policy.to_string(),
            notes: Vec::new(),
            timeline: Vec::new(),
            memory_limit: None,
            recovered_from: None,
        };
        self.event(EventData::CrashHandling {
            id: id.clone(),
            cause: cause.to_string(),
            on_crash: policy.on_crash,
        });
        self.vm.set_job(Some("crash"));
        let crashed_ram = self.paths.crashed_ram(&self.vm.name, &id);
        let mut h = Handling {
            report,
            dir,
            crashed_ram: crashed_ram.clone(),
            progress: None,
            dump_started_ns: None,
            recovery_due: policy.on_crash.recovers(),
            recovery_spawned_ns: None,
            recovery_mib: 0,
            boot_mib: 0,
            dumped_bytes: 0,
            rate: Default::default(),
            throttled: false,
            group: None,
            earlier: Vec::new(),
            io: policy.io_policy,
            disk_seen: None,
        };
        if policy.io_policy == IoPolicy::Auto {
            self.resolve_auto_at_crash(&mut h).await;
        }
        let cpu_notes = if policy.on_crash.dumps() {
            self.save_cpu_notes(&h.dir).await
        } else {
            None
        };
        // The RAM stays on the same tmpfs under a name the run directory's cleanup
        // does not touch; QEMU's mapping follows the rename.
        let moved = std::fs::rename(self.vm.run.ram(), &crashed_ram);
        if let Err(e) = &moved {
            h.report
                .notes
                .push(format!("cannot move the crashed RAM aside: {e}"));
        }
        self.release_crashed_qemu().await;
        if policy.on_crash.recovers() {
            self.hold_budget(&mut h);
        }
        if policy.on_crash.dumps() && moved.is_ok() {
            h.report.phase = CrashPhase::Dumping;
            self.apply(Trigger::DumpBegins);
            self.start_dump(&mut h, &policy, cpu_notes);
        } else {
            let _ = std::fs::remove_file(&crashed_ram);
        }
        if policy.on_crash == OnCrash::DumpThenRecover {
            h.recovery_due = h.progress.is_none();
        }
        sample(&mut h, 0, Some("crash"));
        self.crash = Some(h);
        // Readable at once, also while a recovery VM is restored (which takes longer
        // than a spawn).
        self.save_report();
        self.maybe_start_recovery().await;
        self.settle_crash();
    }

    /// Limits the VM's memory group (the crashed RAM and the recovery QEMU, once it
    /// runs) to the budget plus the recovery QEMU's own footprint; where no group can
    /// be had, the budget is only accounted (the recovery VM is still sized and grown
    /// by it) and the report says why.
    fn hold_budget(&self, h: &mut Handling) {
        let rec = self.vm.record();
        let budget = rec.spec.crash.budget_mib(rec.spec.memory_mib) * MIB;
        let limit = budget + QEMU_FOOTPRINT_MIB * MIB;
        let held = self.cgroups.as_ref().map_err(String::clone).and_then(|cg| {
            let g = cg
                .vm(&self.vm.name)
                .map_err(|e| crate::daemon::error::chain(&e))?;
            let _ = g.reset_peak();
            g.set_limit(Some(limit))
                .map_err(|e| crate::daemon::error::chain(&e))?;
            Ok((cg.version(), g))
        });
        h.report.memory_limit = Some(match held {
            Ok((v, g)) => {
                let m = rebound_api::MemoryLimit {
                    enforced_by: v.to_string(),
                    budget_bytes: budget,
                    limit_bytes: Some(limit),
                    group: Some(g.path().display().to_string()),
                    peak_bytes: None,
                    why_not: None,
                };
                h.group = Some(g);
                m
            }
            Err(why) => {
                h.report.notes.push(format!(
                    "the memory budget is accounted, not enforced: {why}"
                ));
                rebound_api::MemoryLimit {
                    enforced_by: "accounted".into(),
                    budget_bytes: budget,
                    limit_bytes: None,
                    group: None,
                    peak_bytes: None,
                    why_not: Some(why),
                }
            }
        });
    }

    /// Lifts the crash's memory limit and records the group's peak.
    fn release_budget(h: &mut Handling) {
        let Some(g) = h.group.take() else { return };
        if let Some(m) = h.report.memory_limit.as_mut() {
            m.peak_bytes = g.peak().ok();
        }
        if let Err(e) = g.set_limit(None) {
            tracing::warn!(
                "cannot lift the memory limit of {}: {e}",
                g.path().display()
            );
        }
    }

    /// After a daemon restart: takes over the VM's latest crash that the previous
    /// daemon was still handling. An unfinished dump is resumed: its partial file is
    /// kept aside and read for the pages already punched out of the RAM file, the
    /// rest comes from the RAM file, so the finished dump is whole. Older open crashes,
    /// and one that cannot be resumed, are marked failed with where their memory is.
    pub(super) async fn take_over_crash(&mut self) {
        use crate::daemon::crashes;
        let name = self.vm.name.clone();
        let mut open: Vec<CrashReport> = crashes::list(&self.vm.dir.crash_dir(""))
            .into_iter()
            .filter(|r| matches!(r.phase, CrashPhase::Dumping | CrashPhase::Recovering))
            .collect();
        let Some(latest) = open.pop() else { return };
        for r in open {
            crashes::mark_interrupted(&self.paths, &name, r, "a later crash came first");
        }
        if let Err(why) = self.resume_crash(latest.clone()) {
            crashes::mark_interrupted(&self.paths, &name, latest, &why);
            return;
        }
        self.maybe_start_recovery().await;
        self.apply_io_policy().await;
        self.settle_crash();
    }

    fn resume_crash(&mut self, mut report: CrashReport) -> Result<(), String> {
        let rec = self.vm.record();
        let policy = report.policy.clone();
        let crashed_ram = self.paths.crashed_ram(&self.vm.name, &report.id);
        let mut dump_unfinished = report.dump_path.is_some() && report.dump_s.is_none();
        if dump_unfinished && finished_dump(&mut report)? {
            dump_unfinished = false;
        }
        if !dump_unfinished {
            if let Some(out) = &report.dump_path {
                // Finished: what an earlier daemon kept for it is no longer needed.
                let out = Path::new(out);
                let _ = std::fs::remove_file(&crashed_ram);
                let _ = std::fs::remove_file(rebound_dump::write::partial_path(out));
                let mut n = 1;
                while std::fs::remove_file(resume_path(out, n)).is_ok() {
                    n += 1;
                }
            }
        }
        if dump_unfinished && !crashed_ram.exists() {
            return Err(format!("its RAM file {} is gone", crashed_ram.display()));
        }
        let started = report
            .timeline
            .iter()
            .find(|s| s.event.as_deref() == Some("recovery started"))
            .cloned();
        if started.is_some() && report.downtime_s.is_none() && !rec.state.has_qemu() {
            return Err("its recovery VM is gone".into());
        }
        let last = report.timeline.last().cloned();
        report.notes.push(format!(
            "the daemon stopped at some point before {} while this crash was handled; the next daemon took it over{}",
            wall_now(),
            if dump_unfinished { " and resumed the dump" } else { "" }
        ));
        let group = report
            .memory_limit
            .as_ref()
            .and_then(|m| m.group.as_ref())
            .and_then(|_| self.cgroups.as_ref().ok()?.vm(&self.vm.name).ok());
        let dir = self.vm.dir.crash_dir(&report.id);
        let mut h = Handling {
            dir: dir.clone(),
            crashed_ram,
            progress: None,
            dump_started_ns: None,
            recovery_due: policy.on_crash.recovers()
                && (policy.on_crash != OnCrash::DumpThenRecover || !dump_unfinished),
            recovery_spawned_ns: started
                .as_ref()
                .map(|s| report.crashed_mono_ns + (s.t_s * 1e9) as u64),
            recovery_mib: last.as_ref().map_or(0, |s| s.recovery_bytes / MIB),
            boot_mib: started.as_ref().map_or(0, |s| s.recovery_bytes / MIB),
            dumped_bytes: 0,
            rate: Default::default(),
            throttled: false,
            group,
            earlier: Vec::new(),
            io: policy.io_policy,
            disk_seen: None,
            report,
        };
        if dump_unfinished {
            let out = PathBuf::from(h.report.dump_path.clone().expect("a dump path"));
            let partial = rebound_dump::write::partial_path(&out);
            let mut n = 1;
            while resume_path(&out, n).exists() {
                n += 1;
            }
            if partial.exists() {
                std::fs::rename(&partial, resume_path(&out, n)).map_err(|e| {
                    format!(
                        "its partial dump {} cannot be kept aside: {e}",
                        partial.display()
                    )
                })?;
                n += 1;
            }
            h.earlier = (1..n).rev().map(|i| resume_path(&out, i)).collect();
            let cpu = dir.join("cpu-notes.elf");
            self.start_dump(&mut h, &policy, cpu.exists().then_some(cpu));
            // dump_s counts from the crash: the time no daemon ran is part of it.
            h.dump_started_ns = Some(h.report.crashed_mono_ns);
        }
        self.vm.set_job(Some("crash"));
        self.crash = Some(h);
        Ok(())
    }

    /// QEMU's own per-vCPU register notes: a tiny ELF of the first page, whose notes
    /// are NT_PRSTATUS and QEMU's CPU state.
    pub(super) async fn save_cpu_notes(&self, dir: &Path) -> Option<PathBuf> {
        let q = self.qmp.as_ref()?;
        let path = dir.join("cpu-notes.elf");
        let args = serde_json::json!({"paging": false, "protocol": format!("file:{}", path.display()),
            "format": "elf", "begin": 0, "length": 4096});
        match q.execute("dump-guest-memory", Some(args)).await {
            Ok(_) => Some(path),
            Err(e) => {
                tracing::warn!(vm = %self.vm.name, "no vCPU registers for the dump: {e}");
                None
            }
        }
    }

    /// Quits the crashed QEMU (flushing and releasing its disks and ports) and
    /// removes its run directory; the VM keeps its state (panicked or dumping).
    pub(super) async fn release_crashed_qemu(&mut self) {
        if let Some(r) = self.restore.take() {
            // A restored guest's background loader has nothing left to load for.
            r.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let pid = self.vm.record().qemu_pid;
        self.disconnect();
        if let Some(pid) = pid {
            if let Some(q) = &self.qmp {
                let _ = q.execute("quit", None).await;
            }
            if !rebound_vmm::process::wait_gone(pid, Duration::from_secs(5)).await {
                rebound_vmm::process::sigkill(pid);
            }
            self.reap(pid).await;
        }
        self.qmp = None;
        self.cleanup_run_dir();
        self.vm.update(|r| r.qemu_pid = None);
    }

    fn start_dump(&mut self, h: &mut Handling, policy: &CrashPolicy, cpu_notes: Option<PathBuf>) {
        let out = match &policy.dump_dir {
            Some(d) => PathBuf::from(d).join(format!("{}-{}.vmcore", self.vm.name, h.report.id)),
            None => h.dir.join("vmcore"),
        };
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        h.progress = Some(rx);
        h.dump_started_ns = Some(mono_ns());
        h.report.dump_path = Some(out.display().to_string());
        self.event(EventData::DumpStarted {
            id: h.report.id.clone(),
            path: out.display().to_string(),
        });
        let (dump_rate, _) = io_rates(h.io, false);
        h.rate
            .store(dump_rate, std::sync::atomic::Ordering::Relaxed);
        let job = super::dump::DumpJob {
            earlier: h.earlier.clone(),
            rate: h.rate.clone(),
            ram: h.crashed_ram.clone(),
            memory_mib: self.vm.record().spec.memory_mib,
            out,
            cpu_notes,
            format: policy.dump_format,
            compress: policy.compress,
            filter: policy.filter.clone(),
            chunk_mib: policy.chunk_mib,
            vmcoreinfo: self.vm.record().vmcoreinfo,
            release: true,
        };
        tokio::task::spawn_blocking(move || super::dump::run(job, tx));
    }

    /// Starts the recovery VM if one is due and the budget has room for its boot
    /// memory; otherwise it starts at a later chunk. With `recover_from` it is
    /// restored from that snapshot instead of booted (`recover_restore.rs`).
    async fn maybe_start_recovery(&mut self) {
        let Some(h) = self.crash.as_mut() else { return };
        if !h.recovery_due || h.recovery_spawned_ns.is_some() {
            return;
        }
        let rec = self.vm.record();
        let mem = rec.spec.memory_mib;
        let budget = rec.spec.crash.budget_mib(mem);
        let free_mib = budget.saturating_sub(held(&h.crashed_ram).div_ceil(MIB));
        if free_mib < rec.spec.crash.min_memory_mib {
            return;
        }
        let restore_from = rec.spec.crash.recover_from.clone();
        let boot = if free_mib >= mem || restore_from.is_some() {
            // A restored VM has all its memory configured from the start (it holds
            // what it touches) and never grows.
            None
        } else {
            Some(round_block(free_mib).max(rec.spec.crash.min_memory_mib))
        };
        let forwards = rec.forwards.clone();
        h.recovery_spawned_ns = Some(mono_ns());
        h.boot_mib = boot.unwrap_or(mem);
        h.recovery_mib = h.boot_mib;
        let id = h.report.id.clone();
        let spec = rec.spec.clone();
        let r = match &restore_from {
            Some(dir) => {
                h.report.recovered_from = Some(dir.clone());
                let (dumping, kept) = (h.progress.is_some(), h.dir.join("disk0.qcow2"));
                self.recovery_restore(&spec, dir, free_mib, dumping, &kept)
                    .await
                    .map(Some)
            }
            None => match spec.validate() {
                Ok((boot_src, ready)) => self
                    .start(
                        spec.clone(),
                        boot_src,
                        ready,
                        Some(Recovery {
                            forwards,
                            boot_memory_mib: boot,
                        }),
                    )
                    .await
                    .map(|_| None),
                Err(e) => Err(e.into()),
            },
        };
        let boot_memory_mib = self.crash.as_ref().map_or(0, |h| h.boot_mib);
        match r {
            Ok(note) => {
                self.event(EventData::RecoveryStarted {
                    id,
                    pid: self.vm.record().qemu_pid.unwrap_or(0),
                    boot_memory_mib,
                });
                let h = self.crash.as_mut().expect("crash handling");
                h.report.notes.extend(note);
                let d = h.dumped_bytes;
                sample(h, d, Some("recovery started"));
                self.apply_io_policy().await;
            }
            Err(e) => {
                let how = match &restore_from {
                    Some(dir) => format!("could not be restored from {dir}"),
                    None => "failed to start".into(),
                };
                let h = self.crash.as_mut().expect("crash handling");
                h.report.notes.push(format!(
                    "the recovery VM {how}: {}",
                    crate::daemon::error::chain(&e)
                ));
                h.recovery_due = false;
                h.report.phase = rebound_api::CrashPhase::Failed;
                self.metrics.start_failures.inc();
                if restore_from.is_some() && self.vm.record().qemu_pid.is_some() {
                    // A restore that failed after its QEMU came up.
                    self.release_crashed_qemu().await;
                    self.apply(Trigger::Gone);
                }
            }
        }
        self.save_report();
    }

    /// The dump ended (or never ran): a restored recovery VM's background loader may
    /// now read the rest of its image.
    fn release_held_loader(&self) {
        if let Some(r) = &self.restore {
            r.hold_rest
                .store(false, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Grows the recovery VM into memory the dump gave back (virtio-mem).
    async fn grow_recovery(&mut self) {
        let Some(h) = self.crash.as_mut() else { return };
        if h.recovery_spawned_ns.is_none() {
            return;
        }
        let rec = self.vm.record();
        let mem = rec.spec.memory_mib;
        if h.recovery_mib >= mem {
            return;
        }
        let budget = rec.spec.crash.budget_mib(mem);
        let free = budget.saturating_sub(held(&h.crashed_ram).div_ceil(MIB));
        let target = round_block(free.min(mem));
        if target <= h.recovery_mib {
            return;
        }
        let plug = target - h.boot_mib;
        let Some(q) = self.qmp.clone() else { return };
        let args = serde_json::json!({"path": "/machine/peripheral/vmem0",
            "property": "requested-size", "value": plug * MIB});
        match q.execute("qom-set", Some(args)).await {
            Ok(_) => {
                let h = self.crash.as_mut().expect("crash handling");
                h.recovery_mib = target;
            }
            Err(e) => tracing::warn!(vm = %self.vm.name, "cannot grow the recovery VM: {e}"),
        }
    }

    /// A message from the dump task.
    pub(super) async fn on_dump_progress(&mut self, p: Option<DumpProgress>) {
        let Some(h) = self.crash.as_mut() else { return };
        let done = match p {
            Some(DumpProgress::Chunk {
                dumped_bytes,
                crashed_bytes,
            }) => {
                h.dumped_bytes = dumped_bytes;
                let id = h.report.id.clone();
                self.watch_recovery_disks().await;
                self.grow_recovery().await;
                self.maybe_start_recovery().await;
                let h = self.crash.as_mut().expect("crash handling");
                sample(h, dumped_bytes, None);
                let recovery_bytes = h.recovery_mib * MIB;
                self.event(EventData::ChunkReclaimed {
                    id,
                    dumped_bytes,
                    crashed_bytes,
                    recovery_bytes,
                });
                return;
            }
            Some(DumpProgress::Done(r)) => r,
            None => Err("the dump task ended without reporting".to_string()),
        };
        if done.is_ok() {
            crate::daemon::fault::point("crash:after-rename");
        }
        h.progress = None;
        self.release_held_loader();
        let h = self.crash.as_mut().expect("crash handling");
        let secs = h
            .dump_started_ns
            .map(|t| mono_ns().saturating_sub(t) as f64 / 1e9)
            .unwrap_or(0.0);
        h.report.dump_s = Some(secs);
        let (bytes, error) = match done {
            Ok(d) => {
                h.report.dump_bytes = Some(d.bytes);
                h.report.dump_io_bytes = Some(d.io_bytes);
                h.report.pages_written = Some(d.pages_written);
                h.report.pages_skipped = d.pages_skipped;
                h.report.notes.extend(d.notes);
                (Some(d.bytes), None)
            }
            Err(e) => {
                // What was not dumped stays in the RAM file: nothing is lost.
                h.report.notes.push(format!(
                    "dump failed: {e}; the memory not yet dumped stays in {}",
                    h.crashed_ram.display()
                ));
                h.report.phase = CrashPhase::Failed;
                (None, Some(e))
            }
        };
        let id = h.report.id.clone();
        let d = h.dumped_bytes;
        sample(h, d, Some("dump finished"));
        if bytes.is_some() {
            // Everything is in the dump: once the report says so, the crashed
            // memory and the partial dumps of earlier daemons go.
            self.save_report();
            crate::daemon::fault::point("crash:after-report");
            discard_dumped(self.crash.as_mut().expect("crash handling"));
        }
        self.event(EventData::DumpFinished {
            id,
            bytes,
            seconds: secs,
            error,
        });
        let policy = self.vm.record().spec.crash.on_crash;
        match policy {
            OnCrash::DumpThenRecover => {
                let h = self.crash.as_mut().expect("crash handling");
                h.recovery_due = true;
            }
            OnCrash::Dump => {
                // Nothing runs any more for this VM.
                self.stop_backends();
                self.apply(Trigger::Gone);
            }
            _ => {}
        }
        self.maybe_start_recovery().await;
        self.grow_recovery().await;
        self.apply_io_policy().await;
        self.settle_crash();
    }

    /// Sets the dump's rate and the recovery VM's disk throttling for where the crash
    /// stands: limits only while both run, cleared when the dump ends.
    async fn apply_io_policy(&mut self) {
        let Some(h) = self.crash.as_mut() else { return };
        let dumping = h.progress.is_some();
        let ready = h.report.downtime_s.is_some();
        let (dump_rate, rec_rate) = if dumping {
            io_rates(h.io, ready)
        } else {
            (0, 0)
        };
        h.rate
            .store(dump_rate, std::sync::atomic::Ordering::Relaxed);
        let running = h.recovery_spawned_ns.is_some();
        let want = running && rec_rate > 0;
        if want == h.throttled || !running {
            return;
        }
        h.throttled = want;
        let Some(q) = self.qmp.clone() else { return };
        let disks =
            self.vm.record().spec.disks.len() + usize::from(self.vm.record().spec.kernel.is_none());
        for i in 0..disks {
            let args = serde_json::json!({
                "id": format!("/machine/peripheral/disk{i}/virtio-backend"),
                "bps": rec_rate, "bps_rd": 0, "bps_wr": 0,
                "iops": 0, "iops_rd": 0, "iops_wr": 0});
            if let Err(e) = q.execute("block_set_io_throttle", Some(args)).await {
                tracing::warn!(vm = %self.vm.name, "cannot set disk{i}'s I/O limit: {e}");
            }
        }
    }

    /// `auto` at the crash, as the Vicover paper advises: a recovery that is
    /// memory-critical (the budget lets the recovery VM start with less than the VM's
    /// memory) gets the dump first, since the dump is what gives it memory; one that is
    /// not gets the disk first if the service is disk-bound (its disks moved
    /// `DISK_BOUND` or more on average since the VM started). Otherwise the choice
    /// waits for what the recovery VM does (`watch_recovery_disks`).
    async fn resolve_auto_at_crash(&self, h: &mut Handling) {
        let rec = self.vm.record();
        let mem = rec.spec.memory_mib;
        let budget = rec.spec.crash.budget_mib(mem);
        let free = budget.saturating_sub(held(&self.vm.run.ram()).div_ceil(MIB));
        if free < mem {
            decide(
                h,
                IoPolicy::DumpFirst,
                format!(
                    "the recovery is memory-critical: the budget lets the recovery VM start with {free} of its {mem} MiB"
                ),
            );
            return;
        }
        let (Some(q), Some(t0)) = (&self.qmp, rec.started_mono_ns) else {
            return;
        };
        let Some(bytes) = disk_bytes(q).await else {
            return;
        };
        let secs = (mono_ns().saturating_sub(t0) as f64 / 1e9).max(1.0);
        let rate = bytes as f64 / secs;
        if rate >= DISK_BOUND as f64 {
            decide(
                h,
                IoPolicy::RecoveryFirst,
                format!(
                    "the crashed VM's disks moved {:.1} MB/s on average over {secs:.0} s, and the recovery VM starts with all its memory",
                    rate / 1e6
                ),
            );
        }
    }

    /// `auto` while the dump runs and the recovery VM is not ready yet: a recovery VM
    /// that keeps its throttled disks at 80% of the cap or more is disk-bound, so the
    /// policy turns to recovery-first.
    async fn watch_recovery_disks(&mut self) {
        let Some(h) = self.crash.as_ref() else { return };
        if h.report.policy.io_policy != IoPolicy::Auto
            || h.io != IoPolicy::Auto
            || h.recovery_spawned_ns.is_none()
            || h.report.downtime_s.is_some()
        {
            return;
        }
        let Some(q) = self.qmp.clone() else { return };
        let Some(bytes) = disk_bytes(&q).await else {
            return;
        };
        let now = mono_ns();
        let h = self.crash.as_mut().expect("crash handling");
        let Some((b0, t0)) = h.disk_seen.replace((bytes, now)) else {
            return;
        };
        let secs = now.saturating_sub(t0) as f64 / 1e9;
        if secs < 0.5 {
            h.disk_seen = Some((b0, t0));
            return;
        }
        let rate = bytes.saturating_sub(b0) as f64 / secs;
        if rate >= 0.8 * SLOW as f64 {
            decide(
                h,
                IoPolicy::RecoveryFirst,
                format!(
                    "the recovery VM kept its disks at {:.1} MB/s while held to {} MB/s",
                    rate / 1e6,
                    SLOW / 1_000_000
                ),
            );
            self.apply_io_policy().await;
        }
    }

    /// The recovery VM passed its readiness condition: the service is back.
    pub(super) fn on_recovered(&mut self) {
        let Some(h) = self.crash.as_mut() else { return };
        let Some(spawned) = h.recovery_spawned_ns else {
            return;
        };
        if h.report.downtime_s.is_some() {
            return;
        }
        let now = mono_ns();
        let downtime = now.saturating_sub(h.report.crashed_mono_ns);
        h.report.downtime_s = Some(downtime as f64 / 1e9);
        if h.io == IoPolicy::Auto {
            decide(
                h,
                IoPolicy::DumpFirst,
                "the service was not disk-bound before the crash nor while it recovered".into(),
            );
        }
        if h.progress.is_some() {
            let (dump_rate, _) = io_rates(h.io, true);
            h.rate
                .store(dump_rate, std::sync::atomic::Ordering::Relaxed);
        }
        h.report.recovery_s = Some(now.saturating_sub(spawned) as f64 / 1e9);
        let id = h.report.id.clone();
        let d = h.dumped_bytes;
        sample(h, d, Some("service ready"));
        self.apply(Trigger::Ready);
        self.event(EventData::Recovered {
            id,
            downtime_ms: downtime / 1_000_000,
        });
        self.warm_recovery();
        self.settle_crash();
    }

    /// Marks the crash done once nothing of it runs any more, and saves the report.
    fn settle_crash(&mut self) {
        let Some(h) = self.crash.as_mut() else { return };
        let dumping = h.progress.is_some();
        let recovering = h.recovery_due && h.report.downtime_s.is_none();
        // A failure stays the crash's outcome, whatever finishes after it.
        if h.report.phase != CrashPhase::Failed {
            if !dumping && !recovering {
                h.report.phase = CrashPhase::Done;
            } else if !dumping {
                h.report.phase = CrashPhase::Recovering;
            }
        }
        let finished = !dumping && !recovering;
        if finished {
            Self::release_budget(h);
        }
        self.save_report();
        if finished {
            self.vm.set_job(None);
            self.crash = None;
        } else if !dumping {
            self.vm.set_job(None);
        } else {
            self.vm.set_job(Some("dump"));
        }
    }

    /// Writes the report next to the dump (atomically, private).
    pub(super) fn save_report(&self) {
        let Some(h) = &self.crash else { return };
        let data = serde_json::to_vec_pretty(&h.report).expect("reports serialize");
        if let Err(e) = rebound_vmm::private::write_atomic(&h.dir.join("report.json"), &data) {
            tracing::error!(vm = %self.vm.name, "cannot save the crash report: {e}");
        }
    }
}

/// A dump the report says is unfinished may have been finished by the daemon that
/// stopped (renamed into place, not yet reported): the file at the dump's path says
/// so, since a dump is only ever renamed there whole and flushed. `Ok(true)`: it is
/// finished, and the report now says what the file holds; `Ok(false)`: nothing is
/// there, resume it; `Err`: something that is not a whole dump is there, which is
/// never replaced.
fn finished_dump(report: &mut CrashReport) -> Result<bool, String> {
    let Some(out) = report.dump_path.clone() else {
        return Ok(false);
    };
    if std::fs::symlink_metadata(&out).is_err() {
        return Ok(false);
    }
    let info = rebound_dump::inspect(&out).map_err(|e| {
        format!(
            "{out} is there but is no dump ({}); it is kept as it is",
            crate::daemon::error::chain(&e)
        )
    })?;
    if !info.complete {
        return Err(format!(
            "its dump {out} is there but damaged ({}); it is kept as it is",
            info.problems.join("; ")
        ));
    }
    // dump_s counts from the crash: when it finished is not known, only that it
    // had by now.
    report.dump_s = Some(mono_ns().saturating_sub(report.crashed_mono_ns) as f64 / 1e9);
    report.dump_bytes = Some(info.file_bytes);
    report.pages_written = Some(info.pages_dumped);
    report
        .notes
        .push("the dump was finished before the daemon stopped: recognised from the file".into());
    Ok(true)
}

/// Removes what a finished dump holds: the crashed RAM and the partial dumps of
/// earlier daemons.
fn discard_dumped(h: &mut Handling) {
    let _ = std::fs::remove_file(&h.crashed_ram);
    for p in h.earlier.drain(..) {
        let _ = std::fs::remove_file(p);
    }
}

/// Where the `n`th partial dump of stopped daemons is kept (`n` = 1 is the oldest).
fn resume_path(out: &Path, n: usize) -> PathBuf {
    let mut name = out.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".resume.{n}"));
    out.with_file_name(name)
}

/// Resolves `auto` and says why in the report.
fn decide(h: &mut Handling, to: IoPolicy, why: String) {
    h.io = to;
    h.report.io_policy = format!("auto: {to}");
    h.report
        .notes
        .push(format!("I/O policy auto chose {to}: {why}"));
}

/// Bytes read and written by all of a QEMU's block devices since it started.
async fn disk_bytes(q: &rebound_vmm::qmp::Qmp) -> Option<u64> {
    let v = q.execute("query-blockstats", None).await.ok()?;
    Some(
        v.as_array()?
            .iter()
            .map(|d| {
                let s = &d["stats"];
                s["rd_bytes"].as_u64().unwrap_or(0) + s["wr_bytes"].as_u64().unwrap_or(0)
            })
            .sum(),
    )
}

/// Rounds down to the virtio-mem block size.
fn round_block(mib: u64) -> u64 {
    mib / VIRTIO_MEM_BLOCK_MIB * VIRTIO_MEM_BLOCK_MIB
}

/// Adds a point to the memory timeline.
fn sample(h: &mut Handling, dumped_bytes: u64, event: Option<&str>) {
    let t_s = (mono_ns().saturating_sub(h.report.crashed_mono_ns)) as f64 / 1e9;
    h.report.timeline.push(MemorySample {
        t_s,
        crashed_bytes: held(&h.crashed_ram),
        recovery_bytes: h.recovery_mib * MIB,
        dumped_bytes,
        charged_bytes: h.group.as_ref().and_then(|g| g.usage().ok()),
        event: event.map(str::to_string),
    });
}
