//! One VM in the daemon: a handle others read and send jobs to, and the owner task
//! (`owner.rs`) that alone holds its QEMU process, QMP session and agent link, runs
//! one job at a time and makes every state change (`machine.rs`).
//!
//! Reading a VM (status, events, waiting for a state) never goes through the owner,
//! so it answers at once even while a long job runs.

mod blk;
pub(crate) mod context;
mod crash;
mod crash_actions;
mod crash_state;
mod crash_takeover;
pub(crate) mod dump;
pub use dump::DumpError;
mod dump_now;
pub mod evict;
pub mod machine;
mod memory;
pub use memory::MemoryRequest;
mod owner;
pub mod qemu_error;
mod ram_check;
mod reboot;
mod recover_restore;
pub mod replay;
pub mod restore;
mod restore_guard;
mod settle;
pub(crate) mod snapshot;
mod trace_task;

use std::sync::{Arc, Mutex};

use rebound_api::{MarkerReply, VmStatus};
use rebound_vmm::events::EventLog;
use rebound_vmm::paths::{Paths, RunDir, VmDir};
use rebound_vmm::record::VmRecord;
use tokio::sync::{mpsc, oneshot, watch};

pub use owner::{start_owner, Init, StartJob};

use super::error::OpError;

/// A job the owner runs for a request.
#[derive(Debug)]
pub enum Job {
    /// Graceful stop: guest poweroff, then `quit`, then SIGKILL.
    Stop,
    /// SIGKILL at once.
    Kill,
    /// Make the guest kernel panic (`hang: false`), or make it look hung by starving
    /// its watchdog (`hang: true`).
    Crash { hang: bool },
    /// Have the agent write these bytes (hex) into guest RAM.
    Marker(String),
    /// Dump the VM's memory now.
    Dump(Box<rebound_api::DumpRequest>),
    /// Snapshot the VM into a directory.
    Snapshot(Box<rebound_api::SnapshotRequest>),
    /// Run a paused VM's vCPUs (and start a restore held ready).
    Resume,
    /// Stop a running VM's vCPUs.
    Pause,
    /// Move a restored guest from its snapshot image onto shared RAM.
    Settle,
    /// Reboot the guest, cold or warm.
    Reboot(rebound_api::RebootRequest),
    /// Set the VM's allocation and how much of it is its disks' exclusive host caches.
    Memory(memory::MemoryRequest),
}

impl Job {
    pub fn name(&self) -> &'static str {
        match self {
            Job::Stop => "stop",
            Job::Kill => "kill",
            Job::Crash { .. } => "crash",
            Job::Marker(_) => "marker",
            Job::Dump(_) => "dump",
            Job::Snapshot(_) => "snapshot",
            Job::Resume => "resume",
            Job::Pause => "pause",
            Job::Settle => "settle",
            Job::Reboot(_) => "reboot",
            Job::Memory(_) => "memory",
        }
    }
}

/// What a job answers.
#[derive(Debug)]
pub enum Done {
    Status(Box<VmStatus>),
    Marker(MarkerReply),
    Dump(Box<rebound_api::DumpResult>),
    Snapshot(Box<rebound_api::SnapshotResult>),
    Reboot(Box<rebound_api::RebootReport>),
    HostCache(Box<rebound_api::HostCacheReport>),
}

type Request = (Job, oneshot::Sender<Result<Done, OpError>>);

/// What the owner publishes: the record and the job under way.
struct Shared {
    rec: VmRecord,
    job: Option<&'static str>,
    progress: Option<(u64, u64)>,
    /// The report of the restore this VM came from.
    restore: Option<rebound_api::RestoreReport>,
}

/// One VM as the rest of the daemon sees it.
pub struct VmHandle {
    pub name: String,
    pub dir: VmDir,
    pub run: RunDir,
    pub events: EventLog,
    shared: Mutex<Shared>,
    /// Bumped on every change; waiters watch it.
    changed: watch::Sender<u64>,
    jobs: mpsc::UnboundedSender<Request>,
    /// A snapshot holding the guest paused for a cluster's coordinated snapshot waits
    /// on this; `resume` fires it (the owner is busy with that snapshot meanwhile).
    hold: Mutex<Option<oneshot::Sender<()>>>,
    /// The eviction-notice forwarder (`evict.rs`).
    evict: Mutex<evict::EvictSlot>,
}

impl VmHandle {
    /// A handle and the receiving end of its job queue, for its owner.
    pub fn new(
        paths: &Paths,
        rec: VmRecord,
        events_cap: u64,
    ) -> (Arc<VmHandle>, mpsc::UnboundedReceiver<Request>) {
        let name = rec.spec.name.clone();
        let dir = paths.vm(&name);
        let (jobs, rx) = mpsc::unbounded_channel();
        let h = Arc::new(VmHandle {
            events: EventLog::with_cap(&dir.events(), events_cap),
            run: paths.run_dir(&name),
            dir,
            name,
            shared: Mutex::new(Shared {
                rec,
                job: None,
                progress: None,
                restore: None,
            }),
            changed: watch::channel(0).0,
            jobs,
            hold: Mutex::new(None),
            evict: Mutex::new(evict::EvictSlot::new()),
        });
        (h, rx)
    }

    /// A copy of the record.
    pub fn record(&self) -> VmRecord {
        self.shared.lock().expect("vm lock").rec.clone()
    }

    pub fn status(&self) -> VmStatus {
        let s = self.shared.lock().expect("vm lock");
        let mut st = s.rec.status(s.job);
        st.progress = s
            .progress
            .map(|(done, total)| rebound_api::status::JobProgress { done, total });
        st
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Queues `job` for the owner and waits for its answer.
    pub async fn run(&self, job: Job) -> Result<Done, OpError> {
        let (tx, rx) = oneshot::channel();
        self.jobs
            .send((job, tx))
            .map_err(|_| OpError::OwnerGone(self.name.clone()))?;
        rx.await
            .map_err(|_| OpError::OwnerGone(self.name.clone()))?
    }

    /// Lets a snapshot that holds the guest paused go on; false if none does.
    pub fn release_hold(&self) -> bool {
        let tx = self.hold.lock().expect("hold lock").take();
        tx.is_some_and(|tx| tx.send(()).is_ok())
    }

    /// Registers the wait of a holding snapshot (owner only).
    pub(super) fn hold_until_released(&self) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        *self.hold.lock().expect("hold lock") = Some(tx);
        rx
    }

    /// Runs a job that answers with a status.
    pub async fn run_for_status(&self, job: Job) -> Result<VmStatus, OpError> {
        match self.run(job).await? {
            Done::Status(s) => Ok(*s),
            Done::Marker(_)
            | Done::Dump(_)
            | Done::Snapshot(_)
            | Done::Reboot(_)
            | Done::HostCache(_) => Ok(self.status()),
        }
    }

    /// Changes the record and persists it (owner only); wakes waiters.
    fn update<R>(&self, f: impl FnOnce(&mut VmRecord) -> R) -> R {
        let (r, snapshot) = {
            let mut s = self.shared.lock().expect("vm lock");
            let r = f(&mut s.rec);
            (r, s.rec.clone())
        };
        if let Err(e) = snapshot.save(&self.dir.record()) {
            tracing::error!(vm = %self.name, "{}", rebound_errors::chain(&e));
        }
        self.changed.send_modify(|v| *v += 1);
        r
    }

    /// How far the job under way is (done, total), for a progress bar.
    pub(super) fn set_progress(&self, p: Option<(u64, u64)>) {
        self.shared.lock().expect("vm lock").progress = p;
        self.changed.send_modify(|v| *v += 1);
    }

    /// The report of the restore this VM came from, if any.
    pub fn restore_report(&self) -> Option<rebound_api::RestoreReport> {
        self.shared.lock().expect("vm lock").restore.clone()
    }

    /// Replaces the restore report and keeps it with the VM's record.
    pub(super) fn set_restore_report(&self, r: Option<rebound_api::RestoreReport>) {
        self.change_restore_report(|cur| *cur = r);
    }

    /// Changes the restore report, if there is one.
    pub(super) fn update_restore_report(&self, f: impl FnOnce(&mut rebound_api::RestoreReport)) {
        self.change_restore_report(|cur| {
            if let Some(r) = cur {
                f(r)
            }
        });
    }

    /// Changes the restore report in one step and keeps it with the VM's record. A
    /// failed restore stays failed with its error: a watcher that finishes later
    /// does not turn it done.
    fn change_restore_report(&self, f: impl FnOnce(&mut Option<rebound_api::RestoreReport>)) {
        let saved = {
            let mut s = self.shared.lock().expect("vm lock");
            let failed = s.restore.as_ref().filter(|r| r.phase == "failed");
            let error = failed.map(|r| r.error.clone());
            f(&mut s.restore);
            if let (Some(error), Some(r)) = (error, s.restore.as_mut()) {
                r.phase = "failed".into();
                r.error = error.or(r.error.take());
            }
            s.restore.clone()
        };
        if let Some(rep) = &saved {
            let data = serde_json::to_vec_pretty(rep).expect("report serializes");
            let path = self.dir.path().join("restore.json");
            if let Err(e) = rebound_vmm::private::write_atomic(&path, &data) {
                tracing::warn!(vm = %self.name, "cannot save {}: {e}", path.display());
            }
        }
        self.changed.send_modify(|v| *v += 1);
    }

    pub(super) fn set_job(&self, job: Option<&'static str>) {
        self.shared.lock().expect("vm lock").job = job;
        self.changed.send_modify(|v| *v += 1);
    }
}

pub use recover_restore::check as check_recover_from;
