//! What the owner holds of a restore: the job it was given and, between the load
//! and the end of background loading, the restore's state. Its own module, so the
//! owner can hold it without depending on the code that runs the restore.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rebound_api::spec::BootSource;
use rebound_api::{ReadySpec, RestoreRequest, VmSpec};
use rebound_snapshot::restore_plan::{Event, Restore};
use rebound_snapshot::{Loader, RestOrder, Snapshot, TracePage};

use crate::daemon::vm::replay::ReplayFrames;
use crate::daemon::vm::trace_task::{arm_trace, TraceTask};
use crate::daemon::vm::VmHandle;

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
    pub replay: Vec<ReplayFrames>,
    /// What of the snapshot's spec was not used, for the report.
    pub notes: Vec<String>,
}

/// A restore between its load and the end of its background loading.
pub(in crate::daemon::vm) struct Restoring {
    /// The plan's restore: what each of its events does to the report.
    pub(in crate::daemon::vm) machine: Restore,
    pub(super) watch_s: f64,
    pub(super) snap: Arc<Snapshot>,
    /// The image QEMU maps (private), or the shared RAM file (eager, stock).
    pub(super) ram: PathBuf,
    pub(super) size: u64,
    pub(super) loader: Option<Loader>,
    /// The working-set pages read before the start, in first-access order.
    pub(super) loaded: Vec<TracePage>,
    /// Tells the background loader to stop (the VM stopped).
    pub(in crate::daemon::vm) stop: Arc<AtomicBool>,
    /// While set, the background loader has not begun.
    pub(in crate::daemon::vm) hold_rest: Arc<AtomicBool>,
    /// How QEMU was started, for the second QEMU a settle starts.
    pub(in crate::daemon::vm) qemu: PathBuf,
    pub(in crate::daemon::vm) command: rebound_vmm::qemu::QemuCommand,
    /// A held restore's trace, armed at its hold so that its start is a bare `cont`.
    pub(super) armed: Option<ArmedTrace>,
    /// The background loader, once it runs: a held restore's from its hold on.
    pub(super) background: Option<Background>,
    /// Starts the page server's pushing and quiet window (the page-server path).
    pub(in crate::daemon::vm) server: Option<super::served::Go>,
}

/// The background loader of one restore.
pub(super) struct Background {
    pub(super) task:
        tokio::task::JoinHandle<Result<rebound_snapshot::LoadStats, rebound_snapshot::LoadError>>,
    /// Data bytes loaded so far, the working set's included, and when it began.
    pub(super) done: Arc<AtomicU64>,
    pub(super) base: u64,
}

impl Restoring {
    /// Starts the background loader: the rest of the trace (`order`), then the rest
    /// of the image (after `hold_rest` clears).
    pub(super) fn spawn_background(
        &self,
        mut loader: Loader,
        order: RestOrder,
        vm: Arc<VmHandle>,
    ) -> Background {
        let base = loader.loaded_bytes();
        let done = Arc::new(AtomicU64::new(base));
        let (stop, hold, bytes, machine) = (
            self.stop.clone(),
            self.hold_rest.clone(),
            done.clone(),
            self.machine.clone(),
        );
        let rt = tokio::runtime::Handle::current();
        let task = tokio::task::spawn_blocking(move || {
            while hold.load(Ordering::Relaxed) && !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50));
            }
            let mut show = |d: u64, _total: u64| {
                bytes.store(d, Ordering::Relaxed);
                while super::gate::loading_before_start() && !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(10));
                }
            };
            let s = loader.load_rest(order, &stop, None, &mut show);
            let stopped = stop.load(Ordering::Relaxed);
            let (checked, _) = loader.chunks_checked();
            let event = match &s {
                Ok(s) => Event::LoaderDone {
                    at: Instant::now(),
                    pages: s.pages,
                    seconds: s.seconds,
                    stopped,
                    chunks_checked: checked,
                },
                Err(e @ rebound_snapshot::LoadError::Check(_)) => {
                    if checked > 0 {
                        vm.update_restore_report(|rep| {
                            machine.on(rep, Event::ChunksChecked(checked));
                        });
                    }
                    rt.spawn(crate::daemon::vm::ram_check::stop_damaged(
                        vm.clone(),
                        rebound_errors::chain(e),
                    ));
                    return s;
                }
                Err(e) => {
                    let e = rebound_errors::chain(e);
                    tracing::warn!(vm = %vm.name, "the background loader failed: {e}");
                    Event::LoaderFailed {
                        error: e,
                        chunks_checked: checked,
                    }
                }
            };
            vm.update_restore_report(|rep| {
                machine.on(rep, event);
            });
            s
        });
        Background { task, done, base }
    }
}

/// A trace task armed before the guest's first instruction.
pub(super) struct ArmedTrace {
    pub(super) task: TraceTask,
    pub(super) stop: Arc<AtomicBool>,
    /// Begins the trace's window (held restores only).
    pub(super) go: Option<std::sync::mpsc::Sender<()>>,
}

impl ArmedTrace {
    pub(super) async fn arm(
        pid: u32,
        ram: PathBuf,
        size: u64,
        watch_s: f64,
        held: bool,
    ) -> ArmedTrace {
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
