//! `rebound vm restore`: a new VM from a snapshot directory.
//!
//! QEMU starts with `-incoming defer -S`; its RAM is the snapshot's image mapped
//! private (the kernel loads each page from the image's page cache on first
//! touch), or for `eager` a copy of the image in the run dir's shared RAM file,
//! or for `stock` fresh RAM filled by QEMU's own full migration stream. Before
//! the guest runs, the mode decides what is read into the page cache: nothing
//! (lazy), the whole recorded working set, or its first N pages in first-access
//! order, sorted by file offset and read in coalesced runs (elastic). Then the
//! device state is loaded and the vCPUs start, at once or when `vm resume` says
//! (a restore held ready, the hook a cluster restore uses). While the guest runs,
//! a background loader reads the rest, and a watcher records which pages the
//! guest touches, its faults, its reads and when its service first answers.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rebound_api::spec::BootSource;
use rebound_api::{
    ReadySpec, RestOrder, RestoreMode, RestoreReport, RestoreRequest, VmSpec, VmState, VmStatus,
    Workload,
};
use rebound_snapshot::{ImageFile, Loader, Snapshot, Trace, TracePage};
use rebound_vmm::agent::AgentMsg;
use rebound_vmm::qemu::{Incoming, MemoryBackend};

use super::machine::Trigger;
use super::owner::Owner;
use super::restore_guard::ImageStamp;
use super::snapshot::{arm_trace, shell_quote, wait_migration};
use crate::daemon::error::OpError;

/// How long a restored guest's service gets to answer before the report says it
/// did not.
const RESPONSIVE_WAIT: Duration = Duration::from_secs(60);
/// How long a restored recovery VM's settle waits for it to pass readiness.
const RECOVERY_READY_WAIT: Duration = Duration::from_secs(600);

/// What a restore needs.
pub struct RestoreJob {
    pub spec: VmSpec,
    pub boot: BootSource,
    pub ready: ReadySpec,
    pub req: RestoreRequest,
    pub snap: Snapshot,
    /// A crashed VM's recovery VM is restored (its host ports, its state machine).
    pub recovery: Option<rebound_vmm::resolve::Recovery>,
    /// The background loader waits until this is cleared (a crash's dump still
    /// holds the memory budget).
    pub hold_rest: bool,
    /// Frames to hand to the guest's bridge NICs before it runs (`req.replay`, read).
    pub replay: Vec<super::replay::ReplayFrames>,
    /// What of the snapshot's spec was not used, for the report.
    pub notes: Vec<String>,
}

/// Restores of this daemon reading what their guest needs before it may start (a
/// working set, or an eager copy). Background loaders give way to them: on a shared
/// disk a VM waiting to start goes first, and one already running (or held, loading
/// ahead of its start) only gains pages it would otherwise fault in.
static LOADING_BEFORE_START: AtomicUsize = AtomicUsize::new(0);

/// Whether a restore is loading before its start (background readers wait).
pub(super) fn loading_before_start() -> bool {
    LOADING_BEFORE_START.load(Ordering::Relaxed) > 0
}

/// Counts one restore in [`LOADING_BEFORE_START`] while it lives.
struct BeforeStart;

impl BeforeStart {
    fn enter() -> BeforeStart {
        LOADING_BEFORE_START.fetch_add(1, Ordering::Relaxed);
        BeforeStart
    }
}

impl Drop for BeforeStart {
    fn drop(&mut self) {
        LOADING_BEFORE_START.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A restore between its load and the end of its background loading.
pub(super) struct Restoring {
    pub(super) t0: Instant,
    req: RestoreRequest,
    snap: Arc<Snapshot>,
    /// The image QEMU maps (private), or the shared RAM file (eager, stock).
    ram: PathBuf,
    size: u64,
    loader: Option<Loader>,
    /// The working-set pages read before the start, in first-access order.
    loaded: Vec<TracePage>,
    had_trace: bool,
    /// Tells the background loader to stop (the VM stopped).
    pub(super) stop: Arc<AtomicBool>,
    /// While set, the background loader has not begun.
    pub(super) hold_rest: Arc<AtomicBool>,
    /// How QEMU was started, for the second QEMU a settle starts.
    pub(super) qemu: PathBuf,
    pub(super) command: rebound_vmm::qemu::QemuCommand,
    /// A held restore's trace, armed at its hold so that its start is a bare `cont`.
    armed: Option<ArmedTrace>,
    /// The background loader, once it runs: a held restore's from its hold on.
    background: Option<Background>,
}

/// The background loader of one restore.
struct Background {
    task: tokio::task::JoinHandle<Result<rebound_snapshot::LoadStats, rebound_snapshot::LoadError>>,
    /// Data bytes loaded so far, the working set's included, and when it began.
    done: Arc<AtomicU64>,
    base: u64,
}

impl Restoring {
    /// Starts the background loader: the rest of the trace in first-access order,
    /// then the rest of the image (after `hold_rest` clears).
    fn spawn_background(&self, mut loader: Loader, vm: Arc<super::VmHandle>) -> Background {
        let base = loader.loaded_bytes();
        let done = Arc::new(AtomicU64::new(base));
        let (stop, hold, order, bytes, t0) = (
            self.stop.clone(),
            self.hold_rest.clone(),
            self.req.rest_order,
            done.clone(),
            self.t0,
        );
        let rt = tokio::runtime::Handle::current();
        let task = tokio::task::spawn_blocking(move || {
            while hold.load(Ordering::Relaxed) && !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50));
            }
            let order = match order {
                RestOrder::Fafl => rebound_snapshot::RestOrder::Fafl,
                RestOrder::FileOrder => rebound_snapshot::RestOrder::FileOrder,
            };
            let mut show = |d: u64, _total: u64| {
                bytes.store(d, Ordering::Relaxed);
                while loading_before_start() && !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(10));
                }
            };
            let s = loader.load_rest(order, &stop, None, &mut show);
            let stopped = stop.load(Ordering::Relaxed);
            let (checked, _) = loader.chunks_checked();
            if checked > 0 {
                vm.update_restore_report(|rep| rep.ram_chunks_checked = checked);
            }
            match &s {
                Ok(s) => vm.update_restore_report(|rep| {
                    rep.background_pages = s.pages;
                    rep.background_s = Some(s.seconds);
                    if !stopped && rep.memory_loaded_s.is_none() {
                        rep.memory_loaded_s = Some(t0.elapsed().as_secs_f64());
                    }
                }),
                Err(e @ rebound_snapshot::LoadError::Check(_)) => {
                    rt.spawn(super::ram_check::stop_damaged(
                        vm.clone(),
                        crate::daemon::error::chain(e),
                    ));
                }
                Err(e) => {
                    let e = crate::daemon::error::chain(e);
                    tracing::warn!(vm = %vm.name, "the background loader failed: {e}");
                    vm.update_restore_report(|rep| rep.background_error = Some(e));
                }
            }
            s
        });
        Background { task, done, base }
    }
}

/// The RAM check done before the start, and what is left for the background.
struct CheckedBefore {
    /// Chunks checked before the start.
    before: u64,
    /// Seconds of a full check.
    full_s: Option<f64>,
    /// A lazy restore's checker, to run while the guest runs.
    lazy: Option<rebound_snapshot::ChunkChecker>,
}

/// Sets up the check of a restore that maps its image: a full one runs now (the
/// restore fails at a damaged chunk, before QEMU is given anything); a background
/// one goes with the loader (working-set, elastic: chunks checked as they are
/// loaded whole, those of the working set before the start) or, for a lazy restore,
/// is handed back to run beside the guest.
#[allow(clippy::too_many_arguments)]
fn check_before_start(
    loader: &mut Loader,
    image: &std::path::Path,
    size: u64,
    chunk: u64,
    checksums: &[String],
    mode: RestoreMode,
    check: rebound_snapshot::RamCheck,
    vm: &super::VmHandle,
) -> Result<CheckedBefore, OpError> {
    use rebound_snapshot::RamCheck as C;
    let input = |e: &(dyn std::error::Error + 'static)| {
        OpError::SnapshotInput(crate::daemon::error::chain(e))
    };
    let mut out = CheckedBefore {
        // An eager copy compares every chunk as it copies (or fails the restore).
        before: if mode == RestoreMode::Eager {
            checksums.len() as u64
        } else {
            0
        },
        full_s: None,
        lazy: None,
    };
    if matches!(mode, RestoreMode::Eager | RestoreMode::Stock) || check == C::Off {
        return Ok(out);
    }
    let mut c = rebound_snapshot::ChunkChecker::new(image, size, chunk, checksums)
        .map_err(|e| input(&e))?;
    match check {
        C::Full => {
            let t = Instant::now();
            let mut show = |d: u64, n: u64| vm.set_progress(Some((d * chunk, n * chunk)));
            let r = c.check_all(&AtomicBool::new(false), &mut show);
            vm.set_progress(None);
            r.map_err(|e| input(&e))?;
            out.before = c.checked();
            out.full_s = Some(t.elapsed().as_secs_f64());
        }
        C::Background if mode == RestoreMode::Lazy => out.lazy = Some(c),
        C::Background => loader.check_with(0, c).map_err(|e| input(&e))?,
        C::Off => {}
    }
    Ok(out)
}

/// A trace task armed before the guest's first instruction.
struct ArmedTrace {
    task: tokio::task::JoinHandle<Result<Trace, String>>,
    stop: Arc<AtomicBool>,
    /// Begins the trace's window (held restores only).
    go: Option<std::sync::mpsc::Sender<()>>,
}

impl ArmedTrace {
    async fn arm(pid: u32, ram: PathBuf, size: u64, watch_s: f64, held: bool) -> ArmedTrace {
        let stop = Arc::new(AtomicBool::new(false));
        let (go, rx) = match held {
            true => {
                let (tx, rx) = std::sync::mpsc::channel();
                (Some(tx), Some(rx))
            }
            false => (None, None),
        };
        let max = Duration::from_secs_f64(watch_s.max(0.1));
        let task = arm_trace(pid, ram, size, max, stop.clone(), false, rx).await;
        ArmedTrace { task, stop, go }
    }
}

impl Owner {
    pub(super) async fn restore(&mut self, job: RestoreJob) -> Result<RestoreReport, OpError> {
        let RestoreJob {
            spec,
            boot,
            ready,
            req,
            snap,
            recovery,
            hold_rest,
            replay,
            notes,
        } = job;
        let recovering = recovery.is_some();
        let t0 = Instant::now();
        // Disks served by Rebound's backend come back on it: their device state is
        // vhost-user-blk's, and the backend reaches guest RAM only when it is shared,
        // which a restore has only when it copies the image first (eager).
        let on_backend = spec.any_rebound_disk();
        if on_backend && recovering {
            return Err(OpError::SnapshotInput(
                "the snapshot's VM had disks served by Rebound's backend: a recovery VM cannot be restored from it yet (boot it: drop --recover-from)".into(),
            ));
        }
        let m = snap.manifest().clone();
        let [block] = m.ram_blocks.as_slice() else {
            return Err(OpError::SnapshotInput(format!(
                "the snapshot has {} RAM blocks; restores of guests with hot-plugged memory are not supported yet",
                m.ram_blocks.len()
            )));
        };
        let size = block.size;
        if spec.memory_mib.checked_mul(1 << 20) != Some(size) {
            return Err(OpError::SnapshotInput(format!(
                "the snapshot's RAM block {:?} is {} bytes but its VM spec says {} MiB of memory: the manifest does not fit together",
                block.id, size, spec.memory_mib
            )));
        }
        let image = snap.path_of(&block.file);
        let mut report = RestoreReport {
            vm: spec.name.clone(),
            snapshot: snap.path().display().to_string(),
            mode: req.mode,
            rest_order: req.rest_order,
            phase: "loading".into(),
            notes,
            ..Default::default()
        };
        let mut mode = req.mode;
        let trace = match &m.trace {
            Some(t) => {
                let path = snap.path_of(&t.file);
                let r = tokio::task::spawn_blocking(move || Trace::read(&path, size / 4096))
                    .await
                    .map_err(|e| OpError::Internal(e.to_string()))?;
                Some(r.map_err(|e| OpError::SnapshotInput(crate::daemon::error::chain(&e)))?)
            }
            None => None,
        };
        report.trace_source = m.trace.as_ref().map(|t| t.source.clone());
        if trace.is_none() && matches!(mode, RestoreMode::WorkingSet | RestoreMode::Elastic) {
            report.notes.push(format!(
                "the snapshot has no working-set trace: restored lazily instead of {}; this restore records one",
                mode.as_str()
            ));
            mode = RestoreMode::Lazy;
        }
        if on_backend && !matches!(mode, RestoreMode::Eager | RestoreMode::Stock) {
            report.notes.push(format!(
                "its disks are served by Rebound's backend, which needs the guest's RAM shared: restored eagerly instead of {}",
                mode.as_str()
            ));
            mode = RestoreMode::Eager;
        }
        // What the RAM image is checked against before and while the guest runs.
        let ram_check = super::ram_check::decide(&self.paths, &snap, &image, req.ram_check, mode)?;
        if ram_check.copy_instead {
            mode = RestoreMode::Eager;
        }
        report.notes.extend(ram_check.note.clone());
        if mode != RestoreMode::Stock {
            report.ram_check = Some(super::ram_check::as_api(ram_check.check));
            report.ram_chunks = block.checksums.len() as u64;
        }
        report.mode = mode;
        if mode == RestoreMode::Stock && !snap.path_of("stock.mig").is_file() {
            return Err(OpError::SnapshotInput(
                "the snapshot has no stock migration stream (stock.mig): take it with `rebound vm snapshot --stock`".into(),
            ));
        }
        let ws_n = match (&trace, mode) {
            (Some(t), RestoreMode::WorkingSet) => t.pages.len(),
            (Some(t), RestoreMode::Elastic) => {
                let info = m.trace.as_ref().expect("a trace has its info");
                let n = req.ws_pages.unwrap_or_else(|| info.default_elastic_pages());
                (n as usize).min(t.pages.len())
            }
            _ => 0,
        };
        report.working_set_pages = ws_n as u64;
        let loaded: Vec<TracePage> = trace
            .as_ref()
            .map(|t| t.pages[..ws_n].to_vec())
            .unwrap_or_default();
        let shared = matches!(mode, RestoreMode::Eager | RestoreMode::Stock);
        let ram = if shared {
            self.vm.run.ram()
        } else {
            image.clone()
        };
        // The image as it is now: the guest's memory comes from it until it settles.
        let stamp = if shared {
            None
        } else {
            let s = ImageStamp::take(&image);
            Some(s.map_err(|e| {
                OpError::SnapshotInput(format!("cannot open {}: {e}", image.display()))
            })?)
        };

        // The run dir first: an eager restore fills its RAM file.
        self.prepare_run_dir()?;
        let images = vec![ImageFile {
            block: 0,
            path: image.clone(),
            size,
        }];
        let (loader, before, checked) = {
            let (vm, trace, run_ram) = (self.vm.clone(), trace.clone(), self.vm.run.ram());
            let (image, checksums, chunk) =
                (image.clone(), block.checksums.clone(), block.chunk_bytes);
            let check = ram_check.check;
            tokio::task::spawn_blocking(move || -> Result<_, OpError> {
                let input = |e: &(dyn std::error::Error + 'static)| OpError::SnapshotInput(crate::daemon::error::chain(e));
                let mut loader = Loader::new(images, trace).map_err(|e| input(&e))?;
                let t = Instant::now();
                let _first = BeforeStart::enter();
                let checked = check_before_start(&mut loader, &image, size, chunk, &checksums, mode, check, &vm)?;
                let stats = match mode {
                    RestoreMode::Eager => {
                        let mut show = |d: u64, t: u64| vm.set_progress(Some((d, t)));
                        let copied = rebound_snapshot::copy_ram_image(&image, &run_ram, size, chunk, &mut show)
                            .map_err(|e| OpError::SnapshotInput(crate::daemon::error::chain(&e)))?;
                        vm.set_progress(None);
                        if let Some(i) = copied.checksums.iter().zip(&checksums).position(|(a, b)| a != b) {
                            return Err(OpError::SnapshotInput(format!(
                                "checksum mismatch in {} chunk {i} (bytes {}..{}): the image is damaged",
                                image.display(),
                                i as u64 * chunk,
                                ((i as u64 + 1) * chunk).min(size)
                            )));
                        }
                        Some((copied.data_bytes / 4096, copied.data_bytes))
                    }
                    RestoreMode::WorkingSet | RestoreMode::Elastic => {
                        let s = loader.load_first(ws_n).map_err(|e| OpError::SnapshotInput(crate::daemon::error::chain(&e)))?;
                        Some((s.pages, s.bytes))
                    }
                    RestoreMode::Lazy | RestoreMode::Stock => None,
                };
                let mut checked = checked;
                // The working set's chunks, checked as the loader completed them.
                checked.before = checked.before.max(loader.chunks_checked().0);
                Ok((loader, stats.map(|s| (s, t.elapsed().as_secs_f64())), checked))
            })
            .await
            .map_err(|e| OpError::Internal(e.to_string()))??
        };
        if mode != RestoreMode::Stock {
            report.ram_chunks_checked = checked.before;
            report.ram_chunks_checked_before_start = checked.before;
            report.ram_check_s = checked.full_s;
        }
        if let Some(((pages, bytes), secs)) = before {
            report.pages_loaded_before_start = pages;
            report.bytes_loaded_before_start = bytes;
            report.load_before_start_s = secs;
        }

        // Each disk as it was at the snapshot point, under a copy-on-write layer of
        // this VM's own: two restores of one snapshot never share a writable disk.
        // A fresh VM's resolve makes its image disk's overlay, which this replaces; a
        // recovery VM's resolve takes the overlay that is there, so it comes first.
        let layers = check_disk_layers(&snap, &self.paths)?;
        let snapshot_disks = || -> Result<Vec<_>, OpError> {
            let mut disks = Vec::new();
            for (i, (path, fmt)) in layers.iter().enumerate() {
                let overlay = self.vm.dir.disk_overlay(i);
                disks.push(
                    rebound_vmm::disks::create_overlay_as(path, *fmt, &overlay)
                        .map_err(|e| OpError::Boot(rebound_vmm::resolve::BootError::Disk(e)))?,
                );
            }
            Ok(disks)
        };
        let early = if recovering {
            Some(snapshot_disks()?)
        } else {
            None
        };
        let mut res = self
            .resolve_spec(&spec, boot, ready, recovery.as_ref())
            .await?;
        res.command.memory.backend = if shared {
            MemoryBackend::SharedFile(ram.clone())
        } else {
            MemoryBackend::PrivateImage(ram.clone())
        };
        res.command.incoming = Some(Incoming::Defer);
        res.command.paused = true;
        res.command.disks = match early {
            Some(d) => d,
            None if on_backend => self.backend_disks(&snap, &layers, &mut res)?,
            None => snapshot_disks()?,
        };

        let (qemu, command) = (res.qemu.clone(), res.command.clone());
        // A recovery VM's state moves by the crash's transitions (recovering, then
        // running when ready); RestoreBegins and Restored change nothing there.
        self.spawn_resolved(&spec, res, recovering, false).await?;
        self.apply(Trigger::RestoreBegins);
        self.vm.update(|r| {
            r.ram_file = ram.clone();
            r.ram_private = !shared;
        });
        let q = self.qmp.clone().ok_or(OpError::NoQmp)?;
        let here = self.machine_type(&q).await;
        if !m.machine.is_empty() && here != m.machine {
            return Err(OpError::SnapshotInput(format!(
                "the snapshot was made on machine type {} and this QEMU's pc is {here}",
                m.machine
            )));
        }
        q.execute(
            "migrate-set-capabilities",
            Some(serde_json::json!({"capabilities": [
                {"capability": "x-ignore-shared", "state": mode != RestoreMode::Stock}]})),
        )
        .await?;
        let stream = if mode == RestoreMode::Stock {
            snap.path_of("stock.mig")
        } else {
            self.checked_device_state(&snap).await?
        };
        q.execute(
            "migrate-incoming",
            Some(serde_json::json!({"uri": format!("exec:cat {}", shell_quote(&stream))})),
        )
        .await?;
        crate::daemon::fault::point("restore:loading");
        wait_migration(&q, "loading the device state").await?;
        if let Some(what) = stamp.as_ref().and_then(ImageStamp::change) {
            return Err(OpError::SnapshotInput(what));
        }
        // The guest's device state is loaded and it has not run: frames handed to its
        // NICs now are the first it receives when it does.
        for r in &replay {
            let done = super::replay::deliver(&q, self.vm.run.path(), r).await?;
            self.event(rebound_api::EventData::FramesReplayed {
                nic: done.nic,
                frames: done.frames,
                bytes: done.bytes,
            });
            report.replayed_frames.push(done);
        }
        self.apply(Trigger::Restored);
        let had_trace = trace.is_some();
        // Held: the trace is armed now, so that the start on a cluster's line is
        // `cont` alone (arming reads the whole page table: milliseconds per VM).
        let armed = match (req.paused, self.vm.record().qemu_pid) {
            (true, Some(pid)) => {
                Some(ArmedTrace::arm(pid, ram.clone(), size, req.watch_s, true).await)
            }
            _ => None,
        };
        let mut restoring = Restoring {
            t0,
            req: req.clone(),
            snap: Arc::new(snap),
            ram,
            size,
            loader: matches!(mode, RestoreMode::WorkingSet | RestoreMode::Elastic)
                .then_some(loader),
            loaded,
            had_trace,
            stop: Arc::new(AtomicBool::new(false)),
            hold_rest: Arc::new(AtomicBool::new(hold_rest)),
            qemu,
            command,
            armed,
            background: None,
        };
        // Held: the disk would sit idle until the start (on a cluster's line, until
        // the slowest VM of a ring is loaded), so the background loader begins now
        // and the guest starts with more of its trace in memory. It reads in small
        // pieces: another VM's guest may be running on the same disk.
        if req.paused {
            if let Some(l) = restoring.loader.take() {
                restoring.background = Some(restoring.spawn_background(l, self.vm.clone()));
            }
        }
        self.restore = Some(restoring);
        if let Some(c) = checked.lazy {
            super::ram_check::spawn_lazy_checker(self.vm.clone(), c, image.clone());
        }
        report.accel = Some(self.vm.record().accel.as_str().to_string());
        if req.paused {
            report.phase = "held".into();
        }
        self.vm.set_restore_report(Some(report.clone()));
        // From here on a change of the image fails the report and stops the guest.
        if let Some(stamp) = stamp {
            super::restore_guard::spawn(self.vm.clone(), stamp);
        }
        if req.paused {
            return Ok(report);
        }
        self.begin_restored_run().await
    }

    /// Starts the restored guest's vCPUs and the watcher.
    pub(super) async fn begin_restored_run(&mut self) -> Result<RestoreReport, OpError> {
        let q = self.qmp.clone().ok_or(OpError::NoQmp)?;
        let pid = self.vm.record().qemu_pid.ok_or(OpError::NoQmp)?;
        let Some(r) = self.restore.as_mut() else {
            return Err(OpError::Internal("no restore under way".into()));
        };
        let loader = r.loader.take();
        let r_background = r.background.take();
        let armed = r.armed.take();
        let r = Watch {
            t0: r.t0,
            req: r.req.clone(),
            snap: r.snap.clone(),
            ram: r.ram.clone(),
            size: r.size,
            loaded: r.loaded.clone(),
            had_trace: r.had_trace,
        };
        // Watch from before the first instruction (the tracer armed before `cont`):
        // the first touches are the ones the trace is for.
        let armed = match armed {
            Some(a) => a,
            None => ArmedTrace::arm(pid, r.ram.clone(), r.size, r.req.watch_s, false).await,
        };
        let (trace_task, tracing_stop) = (armed.task, armed.stop);
        let probe = self.responsive_probe();
        let before = proc_counters(pid);
        if let Some(go) = armed.go {
            let _ = go.send(());
        }
        let resumed_before = q.last_event_unix_ns("RESUME");
        q.execute("cont", None).await?;
        let started = Instant::now();
        let to_running = r.t0.elapsed().as_secs_f64();
        let after = q.last_event_unix_ns("RESUME");
        let resumed = after.filter(|_| after != resumed_before);
        // The owner applies the change before QMP's RESUME arrives, which then
        // changes nothing: the event is written here.
        if self.apply(Trigger::Resumed) {
            self.event(rebound_api::EventData::Resumed);
        }
        let mut report = self.vm.restore_report().unwrap_or_default();
        report.time_to_running_s = Some(to_running);
        report.started_unix_ns = resumed;
        report.phase = "watching".into();
        if matches!(report.mode, RestoreMode::Eager | RestoreMode::Stock) {
            // Every page was read before the start.
            report.memory_loaded_s = Some(to_running);
        }
        self.vm.set_restore_report(Some(report.clone()));

        // The background loader (a held restore's runs since its hold).
        let bg = match (r_background, loader) {
            (Some(b), _) => Some(b),
            (None, Some(l)) => self
                .restore
                .as_ref()
                .map(|rs| rs.spawn_background(l, self.vm.clone())),
            (None, None) => None,
        };
        // Bytes it loaded while the VM was held; the rest count as read after the start.
        let (loaded_bytes, at_start) = match &bg {
            Some(b) => {
                let n = b.done.load(Ordering::Relaxed);
                let held = n.saturating_sub(b.base);
                self.vm
                    .update_restore_report(|rep| rep.bytes_loaded_while_held = held);
                (Some(b.done.clone()), n)
            }
            None => (None, 0),
        };
        let bg = bg.map(|b| b.task);
        // Once everything is loaded (or, without a background loader, once the
        // watch window is over), the guest moves onto shared RAM.
        let private = self.vm.record().ram_private;
        {
            let vm = self.vm.clone();
            let window = Duration::from_secs_f64(r.req.watch_s.max(0.1));
            tokio::spawn(async move {
                match bg {
                    Some(h) => {
                        let _ = h.await;
                    }
                    None => tokio::time::sleep(window).await,
                }
                // The watch window ends first: settling moves every page, which
                // would blur what the window measures.
                tokio::time::sleep(window.saturating_sub(started.elapsed())).await;
                // A recovery VM settles once it serves (a settle needs a running VM).
                let end = Instant::now() + RECOVERY_READY_WAIT;
                while vm.record().state == VmState::Recovering && Instant::now() < end {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                if private && vm.record().ram_private {
                    if let Err(e) = vm.run(super::Job::Settle).await {
                        tracing::warn!(vm = %vm.name, "no settle onto shared RAM: {}", crate::daemon::error::chain(&e));
                    }
                }
            });
        }

        // The first service answer.
        let (vm, t0, snap, loaded, had_trace, watch_s) = (
            self.vm.clone(),
            r.t0,
            r.snap.clone(),
            r.loaded.clone(),
            r.had_trace,
            r.req.watch_s,
        );
        tokio::spawn(async move {
            // The counters and the trace end with the watch window, whenever the
            // first answer comes (a settle after the window replaces this QEMU).
            let window = Duration::from_secs_f64(watch_s.max(0.1));
            let counted = async {
                tokio::time::sleep(window.saturating_sub(started.elapsed())).await;
                let after = proc_counters(pid);
                tracing_stop.store(true, Ordering::Relaxed);
                (after, trace_task.await.ok().and_then(Result::ok))
            };
            let answer = async {
                match probe {
                    Some(p) => p.await,
                    None => None,
                }
            };
            let (answered, (after, touched)) = tokio::join!(answer, counted);
            let now_responsive = answered.map(|at: Instant| {
                (
                    at.duration_since(t0).as_secs_f64(),
                    at.duration_since(started).as_secs_f64(),
                )
            });
            let mut notes = Vec::new();
            if answered.is_none() {
                notes.push("no service answer to time (no service port or readiness probe, or none within 60 s)".to_string());
            }
            let recorded = match (&touched, had_trace) {
                (Some(t), false) if !t.pages.is_empty() => {
                    let (snap, t) = (snap.clone(), t.clone());
                    let info = rebound_snapshot::TraceInfo {
                        file: "trace.fafl".into(),
                        pages: t.pages.len() as u64,
                        source: "restore".into(),
                        wss_sample_pages: None,
                        wss_snapshot_pages: t.pages.len() as u64,
                    };
                    match tokio::task::spawn_blocking(move || snap.replace_trace(&t, info)).await {
                        Ok(Ok(())) => true,
                        Ok(Err(e)) => {
                            notes.push(format!(
                                "the trace could not be saved in the snapshot: {}",
                                crate::daemon::error::chain(&e)
                            ));
                            false
                        }
                        Err(_) => false,
                    }
                }
                _ => false,
            };
            vm.update_restore_report(|rep| {
                if let Some((total, after_start)) = now_responsive {
                    rep.time_to_responsive_s = Some(total);
                    rep.responsive_after_start_s = Some(after_start);
                }
                if let (Some(b), Some(a)) = (before, after) {
                    rep.major_faults_after_start = Some(a.0.saturating_sub(b.0));
                    let loader = loaded_bytes
                        .as_ref()
                        .map_or(0, |l| l.load(Ordering::Relaxed).saturating_sub(at_start));
                    rep.bytes_read_after_start = Some(a.1.saturating_sub(b.1) + loader);
                }
                if let Some(t) = &touched {
                    rep.pages_touched_after_start = t.pages.len() as u64;
                    if let Some((h, a)) = rebound_snapshot::hit_rate_accuracy(&loaded, &t.pages) {
                        rep.hit_rate = Some(h);
                        rep.accuracy = Some(a);
                    } else if !loaded.is_empty() {
                        rep.notes.push(format!(
                            "hit rate and accuracy need {} touched pages; the guest touched {} in {watch_s} s",
                            loaded.len(),
                            t.pages.len()
                        ));
                    }
                }
                rep.trace_recorded = recorded;
                rep.notes.extend(notes);
                rep.phase = "done".into();
            });
        });
        Ok(report)
    }

    /// Resumes a paused VM (`vm resume`); for a restore held ready, this is its start.
    pub(super) async fn resume(&mut self) -> Result<VmStatus, OpError> {
        let st = self.vm.record().state;
        if st != VmState::Paused {
            return Err(OpError::WrongState(
                self.vm.name.clone(),
                st,
                "only a paused VM can be resumed",
            ));
        }
        let held = self.vm.restore_report().is_some_and(|r| r.phase == "held");
        if held {
            self.begin_restored_run().await?;
        } else {
            let q = self.qmp.clone().ok_or(OpError::NoQmp)?;
            q.execute("cont", None).await?;
            if self.apply(Trigger::Resumed) {
                self.event(rebound_api::EventData::Resumed);
            }
        }
        Ok(self.vm.status())
    }

    /// Stops a running VM's vCPUs (`vm pause`); its QEMU, RAM and devices stay.
    pub(super) async fn pause(&mut self) -> Result<VmStatus, OpError> {
        let st = self.vm.record().state;
        if st != VmState::Running {
            return Err(OpError::WrongState(
                self.vm.name.clone(),
                st,
                "only a running VM can be paused",
            ));
        }
        let q = self.qmp.clone().ok_or(OpError::NoQmp)?;
        q.execute("stop", None).await?;
        if self.apply(Trigger::Stopped) {
            self.event(rebound_api::EventData::Paused);
        }
        Ok(self.vm.status())
    }

    /// A future that resolves when the restored guest first answers: its service
    /// (the readiness probe given, a web page, a kv request), or where the workload
    /// serves no port, the agent's first sign of that workload's work. Called before
    /// the vCPUs start, so an agent's answer cannot be missed.
    fn responsive_probe(
        &mut self,
    ) -> Option<std::pin::Pin<Box<dyn std::future::Future<Output = Option<Instant>> + Send>>> {
        let rec = self.vm.record();
        let given = match &rec.spec.ready {
            Some(r) => Some(r.parse::<ReadySpec>().ok()?),
            None => None,
        };
        let answer = match (given, rec.spec.workload, rec.spec.service_port()) {
            (Some(ReadySpec::Agent) | None, Some(Workload::Web), Some(port)) => {
                Answer::Probe(ReadySpec::Http {
                    port,
                    path: "/".into(),
                })
            }
            (Some(ReadySpec::Agent) | None, Some(Workload::Kv), Some(port)) => Answer::Kv(port),
            (Some(ReadySpec::Agent) | None, w, _) => {
                let (want, count) = match w {
                    // The report after the one that ends the round under way at the
                    // snapshot point: a whole round over its memory ran after the start.
                    Some(Workload::Memfill) => (AgentWant::Memfill, 2),
                    Some(Workload::Counter) => (AgentWant::Counter, 1),
                    // The agent answering the link's `hello`.
                    _ => (AgentWant::Ready, 1),
                };
                let (tx, rx) = tokio::sync::oneshot::channel();
                self.agent_wait = Some(AgentWait { want, count, tx });
                return Some(Box::pin(async move {
                    tokio::time::timeout(RESPONSIVE_WAIT, rx).await.ok()?.ok()
                }));
            }
            (Some(spec), _, _) => Answer::Probe(spec),
        };
        let guest = match &answer {
            Answer::Probe(spec) => spec.guest_port(),
            Answer::Kv(port) => Some(*port),
        };
        let host = guest.and_then(|g| rec.forwards.iter().find(|f| f.guest == g).map(|f| f.host));
        let (serial, qmp) = (self.vm.dir.serial_log(), self.qmp.clone());
        Some(Box::pin(async move {
            let end = Instant::now() + RESPONSIVE_WAIT;
            while Instant::now() < end {
                let ok = match &answer {
                    Answer::Probe(spec) => {
                        rebound_vmm::readiness::probe(spec, host, &serial, qmp.as_deref()).await
                    }
                    Answer::Kv(_) => match host {
                        Some(p) => kv_answers(p).await,
                        None => false,
                    },
                };
                if ok {
                    return Some(Instant::now());
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            None
        }))
    }
}

/// What counts as a restored guest answering.
enum Answer {
    Probe(ReadySpec),
    /// A kv request on this guest port answered.
    Kv(u16),
}

/// Which agent message a restore waits for.
#[derive(Debug, Clone, Copy)]
enum AgentWant {
    Ready,
    Counter,
    Memfill,
}

/// A restore waiting for the agent's `count`-th message of one kind after the start.
pub(super) struct AgentWait {
    want: AgentWant,
    count: u32,
    tx: tokio::sync::oneshot::Sender<Instant>,
}

impl AgentWait {
    /// Counts `m`; the wait, if it goes on.
    pub(super) fn saw(mut self, m: &AgentMsg) -> Option<AgentWait> {
        let hit = matches!(
            (self.want, m),
            (AgentWant::Ready, AgentMsg::Ready(_))
                | (AgentWant::Counter, AgentMsg::Counter { .. })
                | (AgentWant::Memfill, AgentMsg::Memfill { .. })
        );
        if hit {
            self.count -= 1;
            if self.count == 0 {
                let _ = self.tx.send(Instant::now());
                return None;
            }
        }
        Some(self)
    }
}

/// One `COUNT` request to a kv service: true when it answers with a line.
async fn kv_answers(port: u16) -> bool {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let ask = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        s.write_all(b"COUNT\n").await.ok()?;
        let mut line = String::new();
        tokio::io::BufReader::new(s)
            .read_line(&mut line)
            .await
            .ok()?;
        Some(!line.trim().is_empty() && !line.starts_with("ERR"))
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(1), ask).await,
        Ok(Some(true))
    )
}

/// What the watcher of a started restore needs of it.
struct Watch {
    t0: Instant,
    req: RestoreRequest,
    snap: Arc<Snapshot>,
    ram: PathBuf,
    size: u64,
    loaded: Vec<TracePage>,
    had_trace: bool,
}

/// The QEMU process's major faults and bytes read from storage so far.
fn proc_counters(pid: u32) -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces), from field 3 on.
    let rest = &stat[stat.rfind(')')? + 2..];
    let majflt: u64 = rest.split_whitespace().nth(9)?.parse().ok()?;
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
    let read = io
        .lines()
        .find_map(|l| l.strip_prefix("read_bytes: "))
        .and_then(|v| v.trim().parse().ok())?;
    Some((majflt, read))
}

impl Owner {
    /// A copy of the snapshot's device state in the run dir, checked against the
    /// manifest's checksum while copied: QEMU reads the bytes that were checked,
    /// whatever happens to the snapshot's file meanwhile.
    async fn checked_device_state(&self, snap: &Snapshot) -> Result<PathBuf, OpError> {
        let e = snap.manifest().device_state.clone();
        let (from, to) = (
            snap.path_of(&e.file),
            self.vm.run.path().join("device.state"),
        );
        let dst = to.clone();
        let h = tokio::task::spawn_blocking(move || {
            let _ = std::fs::remove_file(&dst);
            rebound_snapshot::copy_file(&from, &dst)
        })
        .await
        .map_err(|err| OpError::Internal(err.to_string()))?
        .map_err(|err| OpError::SnapshotInput(crate::daemon::error::chain(&err)))?;
        if h.checksum != e.checksum || h.size != e.size {
            let _ = std::fs::remove_file(&to);
            return Err(OpError::SnapshotInput(format!(
                "{}: checksum mismatch: the device state is damaged, QEMU was not given it",
                e.file
            )));
        }
        Ok(to)
    }
}

/// The snapshot's disks as QEMU may open them: each of the format its manifest
/// declares (never probed from content a guest wrote), raw or a qcow2 whose backing
/// chain stays inside the snapshot and the daemon's images, but for the bases the
/// daemon recorded in its catalog when it wrote this very snapshot (a snapshot of a
/// restored VM keeps its disk's base, the earlier snapshot's copy, by reference).
fn check_disk_layers(
    snap: &Snapshot,
    paths: &rebound_vmm::paths::Paths,
) -> Result<Vec<(PathBuf, rebound_vmm::qemu::DiskFormat)>, OpError> {
    use rebound_snapshot::Listing;
    use rebound_vmm::qemu::DiskFormat;
    let listing = rebound_snapshot::Catalog::new(paths.snapshot_catalog())
        .listing(snap.path())
        .map_err(|e| OpError::Internal(crate::daemon::error::chain(&e)))?;
    let (bases, unrecorded) = match listing {
        Listing::NotListed => (Vec::new(), "and this daemon did not write the snapshot (only a snapshot it wrote may read through a base it recorded then)".to_string()),
        Listing::WithoutBases => (Vec::new(), "and the snapshot catalog lists this snapshot from an older Rebound, which recorded no bases: it can no longer read through files outside (restore the snapshot it came from, or take it again)".to_string()),
        Listing::Bases(b) => (
            b.into_iter()
                .filter_map(|b| Some((PathBuf::from(b.file), DiskFormat::parse(&b.format)?)))
                .collect(),
            "and is not a base this daemon recorded for this snapshot when it wrote it".to_string(),
        ),
    };
    let roots = rebound_vmm::disks::LayerRoots {
        snapshot: snap.path().to_path_buf(),
        images: paths.home.join("images"),
        bases,
        unrecorded,
    };
    let mut out = Vec::new();
    for d in &snap.manifest().disks {
        let Some(fmt) = DiskFormat::parse(&d.format) else {
            return Err(OpError::SnapshotInput(format!(
                "disk {:?} has format {:?}: a snapshot's disks are raw or qcow2",
                d.id, d.format
            )));
        };
        let path = snap.path_of(&d.file);
        rebound_vmm::disks::check_layer(&path, fmt, &roots)
            .map_err(|e| OpError::SnapshotInput(crate::daemon::error::chain(&e)))?;
        out.push((path, fmt));
    }
    Ok(out)
}

impl Owner {
    /// The disks of a restore whose VM had some served by Rebound's backend: those get
    /// a raw copy of the snapshot's disk in the VM's directory (reflinked or sparse),
    /// which their backend serves; the others a copy-on-write overlay, as always.
    fn backend_disks(
        &self,
        snap: &Snapshot,
        layers: &[(PathBuf, rebound_vmm::qemu::DiskFormat)],
        res: &mut rebound_vmm::resolve::Resolved,
    ) -> Result<Vec<rebound_vmm::qemu::Disk>, OpError> {
        use rebound_vmm::qemu::BlockBackend;
        let m = snap.manifest();
        if m.disks.len() != res.command.disks.len() {
            return Err(OpError::SnapshotInput(format!(
                "the snapshot has {} disks but its VM spec gives {}: the manifest does not fit together",
                m.disks.len(),
                res.command.disks.len()
            )));
        }
        let boot = |e| OpError::Boot(rebound_vmm::resolve::BootError::Disk(e));
        let mut out = Vec::new();
        for (i, (d, (from, fmt))) in res.command.disks.iter().zip(layers).enumerate() {
            match &d.backend {
                BlockBackend::VhostUser { socket } => {
                    let copy = self.vm.dir.disk_raw(i);
                    if *fmt != rebound_vmm::qemu::DiskFormat::Raw {
                        return Err(boot(rebound_vmm::disks::DiskError::NotRaw(from.clone())));
                    }
                    rebound_vmm::disks::raw_copy(from, &copy).map_err(boot)?;
                    if let Some(b) = res.backends.iter_mut().find(|b| &b.socket == socket) {
                        b.disk = copy;
                    }
                    out.push(d.clone());
                }
                _ => out.push(
                    rebound_vmm::disks::create_overlay_as(from, *fmt, &self.vm.dir.disk_overlay(i))
                        .map_err(boot)?,
                ),
            }
        }
        Ok(out)
    }
}
