//! The owner of one VM: a task that holds its QEMU child, QMP session and agent link,
//! turns what they report into state changes and event-log lines, and runs the jobs
//! others queue, one at a time. It is the only writer of the VM's record.

use std::sync::Arc;
use std::time::Duration;

use rebound_api::spec::BootSource;
use rebound_api::{EventData, MarkerReply, ReadySpec, VmSpec, VmState, VmStatus};
use rebound_vmm::agent::{AgentLink, AgentMsg};
use rebound_vmm::console::{ConsoleLink, ConsolePaths};
use rebound_vmm::events::{mono_ns, wall_now};
use rebound_vmm::paths::Paths;
use rebound_vmm::process;
use rebound_vmm::qmp::{Qmp, QmpEvent};
use rebound_vmm::readiness;
use rebound_vmm::record::VmRecord;
use rebound_vmm::resolve::{self, Resolved};
use tokio::sync::mpsc::{Receiver, UnboundedReceiver};
use tokio::sync::oneshot;

use super::machine::{next, Trigger};
use super::{Done, Job, Request, VmHandle};
use crate::daemon::error::OpError;
use crate::daemon::fault;
use crate::daemon::metrics::Metrics;
use crate::daemon::state::Daemon;

/// How long a guest gets to power off before QEMU is told to quit.
const GRACE: Duration = Duration::from_secs(10);
/// How long QEMU gets to create its QMP socket.
const QMP_WAIT: Duration = Duration::from_secs(15);
/// Memfill progress is logged at most this often (plus whenever errors appear).
const MEMFILL_LOG_EVERY: Duration = Duration::from_secs(5);

/// How an owner begins.
pub enum Init {
    /// Spawn QEMU for a checked spec and answer `reply` once QMP is up.
    Start(Box<StartJob>),
    /// Take back a VM whose QEMU may still run (daemon restart); `done` is told once
    /// the VM is back or marked stopped, so the daemon serves only settled states.
    Reattach { done: oneshot::Sender<()> },
    /// A stopped VM found on disk: only wait for jobs.
    Idle,
    /// Restore a snapshot into this new VM and answer `reply` once it runs (or is
    /// held ready).
    Restore(
        Box<super::restore::RestoreJob>,
        oneshot::Sender<Result<rebound_api::RestoreReport, OpError>>,
    ),
}

/// What a start needs.
pub struct StartJob {
    pub spec: VmSpec,
    pub boot: BootSource,
    pub ready: ReadySpec,
    pub reply: oneshot::Sender<Result<VmStatus, OpError>>,
}

pub(super) struct Owner {
    pub(super) vm: Arc<VmHandle>,
    pub(super) paths: Paths,
    pub(super) host: rebound_vmm::accel::HostFacts,
    pub(super) metrics: Arc<Metrics>,
    pub(super) cgroups: Result<rebound_vmm::cgroup::MemoryCgroups, String>,
    pub(super) qmp: Option<Arc<Qmp>>,
    pub(super) qmp_events: Option<UnboundedReceiver<QmpEvent>>,
    pub(super) agent: Option<Arc<AgentLink>>,
    pub(super) agent_msgs: Option<Receiver<AgentMsg>>,
    /// The serial console's reader, which keeps the serial and QEMU logs.
    console: Option<ConsoleLink>,
    logs: crate::daemon::state::LogCaps,
    child: Option<tokio::process::Child>,
    pub(super) ready: ReadySpec,
    probe_port: Option<u16>,
    last_memfill: Option<(tokio::time::Instant, u64)>,
    /// A restore's wait for the agent's first sign of work after the start.
    pub(super) agent_wait: Option<super::restore::AgentWait>,
    /// A readiness probe in flight: it runs in its own task (an HTTP probe may wait
    /// seconds for a booting guest), so the owner keeps serving jobs, QMP events and
    /// the dump's progress meanwhile.
    /// The result comes with the pid of the QEMU it probed: a probe of a QEMU that
    /// has since crashed says nothing about its recovery VM.
    probe_rx: Option<oneshot::Receiver<(Option<u32>, bool)>>,
    /// The crash being handled, if any (its dump may outlive the recovery).
    pub(super) crash: Option<super::crash::Handling>,
    /// The restore this VM came from, until its background loading ends.
    pub(super) restore: Option<super::restore::Restoring>,
    /// A background listing of the guest's cache (`--on-crash ... --warm`).
    pub(super) warm_listing: Option<tokio::task::JoinHandle<()>>,
}

/// Spawns the owner task of `vm`.
pub fn start_owner(
    d: &Arc<Daemon>,
    vm: Arc<VmHandle>,
    jobs: UnboundedReceiver<Request>,
    init: Init,
) {
    let owner = Owner {
        vm,
        paths: d.paths.clone(),
        host: d.host.clone(),
        metrics: d.metrics.clone(),
        cgroups: d.cgroups.clone(),
        qmp: None,
        qmp_events: None,
        agent: None,
        agent_msgs: None,
        console: None,
        logs: d.logs,
        child: None,
        ready: ReadySpec::Agent,
        probe_port: None,
        last_memfill: None,
        agent_wait: None,
        probe_rx: None,
        crash: None,
        restore: None,
        warm_listing: None,
    };
    tokio::spawn(owner.run(jobs, init));
}

/// A channel's receiving end, bounded or not.
pub(super) trait Inbox {
    type Item;
    async fn next(&mut self) -> Option<Self::Item>;
}

impl<T> Inbox for UnboundedReceiver<T> {
    type Item = T;
    async fn next(&mut self) -> Option<T> {
        self.recv().await
    }
}

impl<T> Inbox for Receiver<T> {
    type Item = T;
    async fn next(&mut self) -> Option<T> {
        self.recv().await
    }
}

/// The next item of an optional channel; never, if there is none.
pub(super) async fn recv_opt<I: Inbox>(rx: &mut Option<I>) -> Option<I::Item> {
    match rx {
        Some(r) => r.next().await,
        None => std::future::pending().await,
    }
}

/// The result of the probe in flight, if any; never, otherwise.
async fn probe_result(
    rx: &mut Option<oneshot::Receiver<(Option<u32>, bool)>>,
) -> (Option<u32>, bool) {
    match rx {
        Some(r) => r.await.unwrap_or((None, false)),
        None => std::future::pending().await,
    }
}

enum Input {
    Job(Option<Request>),
    Qmp(Option<QmpEvent>),
    Agent(Option<AgentMsg>),
    Probe,
    Probed(Option<u32>, bool),
    Dump(Option<super::crash::DumpProgress>),
    WarmList,
}

impl Owner {
    async fn run(mut self, mut jobs: UnboundedReceiver<Request>, init: Init) {
        match init {
            Init::Start(job) => {
                let StartJob {
                    spec,
                    boot,
                    ready,
                    reply,
                } = *job;
                self.vm.set_job(Some("start"));
                let r = self.start(spec, boot, ready, None).await;
                self.vm.set_job(None);
                let failed = r.is_err();
                if failed {
                    self.metrics.start_failures.inc();
                } else {
                    self.metrics.starts.inc();
                }
                let _ = reply.send(r);
                if failed {
                    // Nothing of the VM runs: its (empty) memory groups go too.
                    if let Ok(cg) = &self.cgroups {
                        cg.remove_vm(&self.vm.name);
                    }
                    return;
                }
            }
            Init::Idle => self.take_over_crash().await,
            Init::Restore(job, reply) => {
                self.vm.set_job(Some("restore"));
                let r = self.restore(*job).await;
                self.vm.set_job(None);
                if let Err(e) = &r {
                    self.metrics.start_failures.inc();
                    self.vm.update_restore_report(|rep| {
                        rep.phase = "failed".into();
                        rep.error = Some(crate::daemon::error::chain(e));
                    });
                    if let Some(pid) = self.vm.record().qemu_pid {
                        process::sigkill(pid);
                        self.reap(pid).await;
                    }
                    self.finish(EventData::Exited {
                        exit_code: None,
                        error: Some(crate::daemon::error::chain(e)),
                    });
                    let _ = reply.send(r);
                    if let Ok(cg) = &self.cgroups {
                        cg.remove_vm(&self.vm.name);
                    }
                    return;
                }
                self.metrics.restores.inc();
                let _ = reply.send(r);
            }
            Init::Reattach { done } => {
                let rec = self.vm.record();
                // A crash whose dump ran with no QEMU left (dump-then-recover): only
                // the crash is taken over.
                let dumping_only = rec.state == VmState::Dumping && rec.qemu_pid.is_none();
                // A start or restore that never answered: its QEMU (paused before
                // its first instruction, or still loading) goes, the VM is stopped.
                let unfinished = matches!(rec.state, VmState::Starting | VmState::Restoring);
                if unfinished {
                    if let Some(pid) = rec.qemu_pid {
                        if process::is_our_qemu(pid, &rec.run_dir) {
                            process::sigkill(pid);
                            process::wait_gone(pid, Duration::from_secs(10)).await;
                        }
                    }
                    self.finish(EventData::Stopped {
                        how: Some("sigkill".into()),
                        reason: Some(format!(
                            "the daemon stopped while this VM was {}; the next daemon ended it",
                            if rec.state == VmState::Starting {
                                "starting"
                            } else {
                                "restoring"
                            }
                        )),
                    });
                } else if !dumping_only {
                    if let Err(why) = self.reattach().await {
                        self.finish(EventData::Stopped {
                            how: None,
                            reason: Some(why),
                        });
                    }
                }
                self.adopt_backends();
                self.take_over_crash().await;
                let _ = done.send(());
            }
        }
        let mut probe = tokio::time::interval(Duration::from_millis(250));
        probe.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut warm_list = tokio::time::interval(super::reboot::WARM_LIST_EVERY);
        warm_list.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let probing = !matches!(self.ready, ReadySpec::Agent)
                && self.qmp.is_some()
                && !self.vm.record().ready;
            let input = tokio::select! {
                j = jobs.recv() => Input::Job(j),
                e = recv_opt(&mut self.qmp_events) => Input::Qmp(e),
                m = recv_opt(&mut self.agent_msgs) => Input::Agent(m),
                _ = probe.tick(), if probing && self.probe_rx.is_none() => Input::Probe,
                (pid, ok) = probe_result(&mut self.probe_rx) => Input::Probed(pid, ok),
                p = super::crash::next_progress(&mut self.crash) => Input::Dump(p),
                _ = warm_list.tick() => Input::WarmList,
            };
            match input {
                // The daemon dropped the handle (a new start replaced it, or the VM
                // was removed): the QEMU, if any, is no longer ours to watch.
                Input::Job(None) => return,
                Input::Job(Some((job, reply))) => {
                    self.vm.set_job(Some(job.name()));
                    let r = self.job(job).await;
                    self.vm.set_job(None);
                    let _ = reply.send(r);
                }
                Input::Qmp(Some(ev)) => {
                    if let Some(cause) = self.on_qmp(ev) {
                        self.respond_to_crash(cause).await;
                    }
                }
                Input::Dump(p) => self.on_dump_progress(p).await,
                Input::Qmp(None) => self.on_qemu_gone().await,
                Input::Agent(Some(m)) => self.on_agent(m),
                Input::Agent(None) => self.agent_msgs = None,
                Input::Probe => self.probe(),
                Input::WarmList => self.refresh_warm_list(),
                Input::Probed(pid, ok) => {
                    self.probe_rx = None;
                    let rec = self.vm.record();
                    let live = matches!(rec.state, VmState::Running | VmState::Recovering);
                    if ok && live && pid.is_some() && pid == rec.qemu_pid {
                        self.mark_ready(self.ready.to_string());
                    }
                }
            }
        }
    }

    /// Moves the state by `t` through the one transition table.
    pub(super) fn apply(&self, t: Trigger<'_>) -> bool {
        self.vm.update(|r| match next(r.state, t) {
            Some(to) => {
                r.state = to;
                if matches!(to, VmState::Panicked | VmState::Stopping | VmState::Stopped) {
                    r.ready = false;
                }
                true
            }
            None => false,
        })
    }

    pub(super) fn event(&self, data: EventData) {
        if let Err(e) = self.vm.events.append(data) {
            tracing::error!(vm = %self.vm.name, "{}", crate::daemon::error::chain(&e));
        }
    }

    // ---- start and re-attach ----

    /// Resolves and spawns QEMU for `spec` (a recovery VM with `recovery`), and takes
    /// over its QMP session and agent link.
    pub(super) async fn start(
        &mut self,
        spec: VmSpec,
        boot: BootSource,
        ready: ReadySpec,
        recovery: Option<resolve::Recovery>,
    ) -> Result<VmStatus, OpError> {
        let recovering = recovery.is_some();
        let (p, h, s) = (self.paths.clone(), self.host.clone(), spec.clone());
        let res: Resolved = tokio::task::spawn_blocking(move || {
            resolve::resolve(&p, &h, &s, boot, ready, recovery.as_ref())
        })
        .await
        .map_err(|e| OpError::Internal(e.to_string()))??;
        self.prepare_run_dir()?;
        self.spawn_resolved(&spec, res, recovering, true).await
    }

    /// Resolves `spec` as a fresh start (or, with `recovery`, a recovery VM) would.
    pub(super) async fn resolve_spec(
        &self,
        spec: &VmSpec,
        boot: BootSource,
        ready: ReadySpec,
        recovery: Option<&resolve::Recovery>,
    ) -> Result<Resolved, OpError> {
        let (p, h, s, r) = (
            self.paths.clone(),
            self.host.clone(),
            spec.clone(),
            recovery.cloned(),
        );
        Ok(tokio::task::spawn_blocking(move || {
            resolve::resolve(&p, &h, &s, boot, ready, r.as_ref())
        })
        .await
        .map_err(|e| OpError::Internal(e.to_string()))??)
    }

    /// An empty run dir (RAM file, sockets) for a new QEMU, whose boot starts a new
    /// serial log (the last one, a crash's trace say, becomes `serial.log.1`).
    pub(super) fn prepare_run_dir(&self) -> Result<(), OpError> {
        let serial = self.vm.dir.serial_log();
        let _ = rebound_vmm::logcap::RotatingFile::new(&serial, self.logs.serial).rotate();
        let run = &self.vm.run;
        let _ = std::fs::remove_dir_all(run.path());
        rebound_vmm::private::create_dir_all(run.path())
            .map_err(|e| OpError::Io(format!("cannot create {}", run.path().display()), e))
    }

    /// Spawns QEMU as `res` says, records it and takes over its QMP session and
    /// agent link (`query_state`: apply QEMU's run state at once; a restore moves
    /// its state itself). QEMU always starts with its vCPUs stopped (`-S`) and runs
    /// guest code only once its pid is in the record (a `cont` here, or the
    /// restore's own start): a daemon that dies in between leaves a QEMU that the
    /// next daemon finds, by the record or the run dir's pidfile, before it ran.
    pub(super) async fn spawn_resolved(
        &mut self,
        spec: &VmSpec,
        mut res: Resolved,
        recovering: bool,
        query_state: bool,
    ) -> Result<VmStatus, OpError> {
        let run = self.vm.run.clone();
        let restore = res.command.incoming.is_some();
        let run_after = !res.command.paused;
        res.command.paused = true;
        let args = res.command.args()?;
        let blk = self.ensure_backends(&res.backends).await?;
        let group = self.qemu_group(recovering);
        let qemu_log = self.vm.dir.qemu_log();
        let child = match process::spawn_qemu(&res.qemu, &args, &qemu_log, group.as_ref()) {
            Ok(c) => c,
            Err(e) => {
                if !recovering {
                    self.stop_backends();
                }
                return Err(OpError::QemuFailed(crate::daemon::error::chain(&e)));
            }
        };
        let pid = child.id().unwrap_or(0);
        self.child = Some(child);
        fault::point(if restore {
            "restore:spawned"
        } else {
            "start:spawned"
        });
        let t0 = mono_ns();
        let prev_state = self.vm.record().state;
        self.vm.update(|r| {
            *r = VmRecord::new(spec, &run);
            if recovering {
                // A crashed VM's state moves on only by its transitions, below.
                r.state = prev_state;
            }
            r.accel = res.accel.accel;
            r.accel_reason = res.accel.reason.clone();
            r.qemu_pid = Some(pid);
            r.forwards = res.forwards.clone();
            r.started_at = Some(wall_now());
            r.started_mono_ns = Some(t0);
            r.service_port = spec.service_port();
            r.disk_files = res
                .command
                .disks
                .iter()
                .filter_map(|d| match &d.backend {
                    rebound_vmm::qemu::BlockBackend::File { path, .. } => Some(path.clone()),
                    rebound_vmm::qemu::BlockBackend::VhostUser { socket } => blk
                        .iter()
                        .find(|p| &p.serve.socket == socket)
                        .map(|p| p.serve.disk.clone()),
                    _ => None,
                })
                .collect();
            r.blk = blk.clone();
            // A new QEMU has all the memory it boots with.
            r.allocation_mib = None;
        });
        fault::point(if restore {
            "restore:recorded"
        } else {
            "start:recorded"
        });
        if recovering {
            self.apply(Trigger::RecoveryBegins);
        }
        self.event(EventData::Started {
            pid,
            accel: res.accel.accel,
            accel_reason: res.accel.reason.clone(),
            qemu: res.qemu.display().to_string(),
            argv: args,
        });
        let connected = Self::connect_qmp(&self.vm.run.qmp(), &qemu_log, pid).await;
        let (qmp, events) = match connected {
            Ok(q) => q,
            Err(msg) => {
                process::sigkill(pid);
                self.reap(pid).await;
                self.finish(EventData::Exited {
                    exit_code: None,
                    error: Some(msg.clone()),
                });
                return Err(OpError::QemuFailed(msg));
            }
        };
        if run_after {
            if let Err(e) = qmp.execute("cont", None).await {
                process::sigkill(pid);
                self.reap(pid).await;
                let msg = format!("QEMU did not start its vCPUs: {e}");
                self.finish(EventData::Exited {
                    exit_code: None,
                    error: Some(msg.clone()),
                });
                return Err(OpError::QemuFailed(msg));
            }
        }
        if query_state {
            let st = qmp.run_state().await.unwrap_or_else(|_| "running".into());
            self.apply(Trigger::QemuStatus(&st));
        }
        self.attach(qmp, events, res.ready);
        Ok(self.vm.status())
    }

    /// A new memory group for the QEMU about to start, under the VM's group (whose
    /// limit, set only while a crash is handled, is lifted for a normal start).
    /// Without one the QEMU runs where the daemon runs and its memory is only
    /// accounted.
    pub(super) fn qemu_group(&self, recovering: bool) -> Option<rebound_vmm::cgroup::Group> {
        let cg = self.cgroups.as_ref().ok()?;
        let name = &self.vm.name;
        let r = (|| {
            let vm = cg.vm(name)?;
            if !recovering {
                vm.set_limit(None)?;
            }
            cg.prune(name);
            cg.instance(name, &format!("qemu-{}", mono_ns()))
        })();
        r.map_err(|e| {
            tracing::warn!(vm = %name, "QEMU runs outside a memory group: {}", crate::daemon::error::chain(&e));
        })
        .ok()
    }

    /// Waits for QEMU `pid`'s QMP socket `sock` and connects; on failure explains why
    /// (QEMU's last line in `log`).
    pub(super) async fn connect_qmp(
        sock: &std::path::Path,
        log: &std::path::Path,
        pid: u32,
    ) -> Result<rebound_vmm::qmp::QmpSession, String> {
        let deadline = tokio::time::Instant::now() + QMP_WAIT;
        loop {
            if sock.exists() {
                if let Ok(q) = Qmp::connect(sock).await {
                    return Ok(q);
                }
            }
            if !process::is_alive(pid) || tokio::time::Instant::now() >= deadline {
                let why =
                    process::last_log_line(log).unwrap_or_else(|| "no QMP socket appeared".into());
                return Err(if process::is_alive(pid) {
                    format!("QMP did not answer: {why}")
                } else {
                    format!("QEMU exited: {why}")
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Takes the connections over; the agent link starts for guests that have one.
    pub(super) fn attach(
        &mut self,
        qmp: Arc<Qmp>,
        events: UnboundedReceiver<QmpEvent>,
        ready: ReadySpec,
    ) {
        let rec = self.vm.record();
        let (run, dir) = (&self.vm.run, &self.vm.dir);
        self.console = Some(ConsoleLink::start(ConsolePaths {
            serial: run.serial_sock(),
            attach: run.console_sock(),
            log: dir.serial_log(),
            log_cap: self.logs.serial,
            qemu_log: dir.qemu_log(),
            qemu_log_cap: self.logs.qemu,
        }));
        if matches!(ready, ReadySpec::Agent) || rec.spec.kernel.is_none() {
            let (tx, rx) = rebound_vmm::agent::channel();
            self.agent = Some(Arc::new(AgentLink::start(&self.vm.run.agent(), tx)));
            self.agent_msgs = Some(rx);
        }
        self.probe_port = ready
            .guest_port()
            .and_then(|g| rec.forwards.iter().find(|f| f.guest == g).map(|f| f.host));
        self.ready = ready;
        self.qmp = Some(qmp);
        self.qmp_events = Some(events);
    }

    async fn reattach(&mut self) -> Result<(), String> {
        let rec = self.vm.record();
        let pid = rec.qemu_pid.ok_or("no QEMU pid recorded")?;
        if !process::is_our_qemu(pid, &rec.run_dir) {
            return Err(format!("QEMU (pid {pid}) is gone"));
        }
        let (qmp, events) =
            tokio::time::timeout(Duration::from_secs(5), Qmp::connect(&self.vm.run.qmp()))
                .await
                .map_err(|_| "QMP did not answer".to_string())?
                .map_err(|e| e.to_string())?;
        let st = qmp.run_state().await.map_err(|e| e.to_string())?;
        self.apply(Trigger::QemuStatus(&st));
        self.event(EventData::Reattached {
            pid,
            qemu_status: st,
        });
        let ready: ReadySpec = match &rec.spec.ready {
            Some(r) => r
                .parse()
                .map_err(|e: rebound_api::SpecError| e.to_string())?,
            None => ReadySpec::Agent,
        };
        self.metrics.reattaches.inc();
        self.attach(qmp, events, ready);
        Ok(())
    }

    // ---- what QEMU and the guest report ----

    /// Applies a QMP event; returns the crash's cause when the guest just died.
    pub(super) fn on_qmp(&mut self, ev: QmpEvent) -> Option<&'static str> {
        let data = EventData::from_qmp(&ev.event, &ev.data)?;
        let mut died = None;
        let changed = match &data {
            EventData::Panicked { .. } => {
                let c = self.apply(Trigger::Panicked);
                if c {
                    self.metrics.panics.inc();
                    died = Some("panic");
                }
                c
            }
            EventData::Watchdog { .. } => {
                if self.apply(Trigger::Panicked) {
                    self.metrics.watchdog_expiries.inc();
                    died = Some("watchdog");
                }
                true
            }
            EventData::Paused => self.apply(Trigger::Stopped),
            EventData::Resumed => self.apply(Trigger::Resumed),
            // Shutdown and balloon are facts, not state changes.
            _ => true,
        };
        if changed {
            self.event(data);
        }
        died
    }

    pub(super) async fn on_qemu_gone(&mut self) {
        let pid = self.vm.record().qemu_pid;
        let code = match pid {
            Some(pid) => self.reap(pid).await,
            None => None,
        };
        self.metrics.exits.inc();
        self.finish(EventData::Exited {
            exit_code: code,
            error: None,
        });
    }

    pub(super) fn on_agent(&mut self, m: AgentMsg) {
        if let Some(w) = self.agent_wait.take() {
            self.agent_wait = w.saw(&m);
        }
        match m {
            AgentMsg::Ready(info) => {
                self.vm.evict_ring(info.evict_ring);
                let first = self.vm.update(|r| {
                    let first = r.kernel_release.is_none();
                    r.kernel_release = Some(info.kernel_release.clone());
                    r.vmcoreinfo = info.vmcoreinfo;
                    if info.service_port.is_some() {
                        r.service_port = info.service_port;
                    }
                    first
                });
                self.event(if first {
                    EventData::AgentReady(info)
                } else {
                    EventData::AgentHello(info)
                });
                if matches!(self.ready, ReadySpec::Agent)
                    && matches!(
                        self.vm.record().state,
                        VmState::Running | VmState::Recovering
                    )
                {
                    self.mark_ready("agent".into());
                }
            }
            AgentMsg::Memfill {
                filled_kib,
                rounds,
                errors,
            } => {
                let now = tokio::time::Instant::now();
                let due = match self.last_memfill {
                    None => true,
                    Some((t, e)) => now.duration_since(t) >= MEMFILL_LOG_EVERY || errors != e,
                };
                if due {
                    self.last_memfill = Some((now, errors));
                    self.event(EventData::Memfill {
                        filled_kib,
                        rounds,
                        errors,
                    });
                }
            }
            AgentMsg::Error { message } => self.event(EventData::AgentError { message }),
            AgentMsg::Throttled { dropped } => self.event(EventData::AgentThrottled { dropped }),
            AgentMsg::Io(r) => self.event(EventData::Io(r)),
            AgentMsg::Files(r) => self.event(EventData::Files(r)),
            AgentMsg::PeerEvent(p) => self.event(EventData::Peer(p)),
            // A prefetch whose reboot stopped waiting still says what it read.
            AgentMsg::Prefetch(p) => self.event(EventData::Prefetched(p.report)),
            // Pieces of a list nobody waits for any more.
            AgentMsg::Cachelist { .. } | AgentMsg::Rebooting => {}
            // Ticks and heartbeats are frequent; the counter also goes to the serial log.
            AgentMsg::Heartbeat { .. }
            | AgentMsg::Counter { .. }
            | AgentMsg::Marker { .. }
            | AgentMsg::Peer(_) => {}
        }
    }

    /// Starts a readiness probe in its own task; its answer comes back as an input.
    fn probe(&mut self) {
        if !matches!(
            self.vm.record().state,
            VmState::Running | VmState::Recovering
        ) {
            return;
        }
        let (tx, rx) = oneshot::channel();
        let pid = self.vm.record().qemu_pid;
        let (ready, port, serial, qmp) = (
            self.ready.clone(),
            self.probe_port,
            self.vm.dir.serial_log(),
            self.qmp.clone(),
        );
        tokio::spawn(async move {
            let ok = readiness::probe(&ready, port, &serial, qmp.as_deref()).await;
            let _ = tx.send((pid, ok));
        });
        self.probe_rx = Some(rx);
    }

    pub(super) fn mark_ready(&mut self, probe: String) {
        let first = self.vm.update(|r| {
            if r.ready {
                return None;
            }
            r.ready = true;
            let ms = r
                .started_mono_ns
                .map(|t0| mono_ns().saturating_sub(t0) / 1_000_000);
            if r.ready_after_ms.is_none() {
                r.ready_after_ms = ms;
            }
            Some(r.ready_after_ms)
        });
        if let Some(ms) = first {
            if let Some(ms) = ms {
                self.metrics.ready_seconds.observe(ms as f64 / 1000.0);
            }
            self.event(EventData::Ready {
                ready_after_ms: ms,
                probe,
            });
            self.on_recovered();
        }
    }

    // ---- jobs ----

    async fn job(&mut self, job: Job) -> Result<Done, OpError> {
        match job {
            Job::Stop => self.stop().await.map(|s| Done::Status(Box::new(s))),
            Job::Kill => self.kill().await.map(|s| Done::Status(Box::new(s))),
            Job::Crash { hang } => self.crash(hang).await.map(|s| Done::Status(Box::new(s))),
            Job::Marker(hex) => self.marker(&hex).await.map(Done::Marker),
            Job::Dump(req) => self.dump_now(*req).await.map(|r| Done::Dump(Box::new(r))),
            Job::Snapshot(req) => {
                let r = self.snapshot_now(*req).await;
                if r.is_ok() {
                    self.metrics.snapshots.inc();
                }
                r.map(|r| Done::Snapshot(Box::new(r)))
            }
            Job::Resume => self.resume().await.map(|s| Done::Status(Box::new(s))),
            Job::Pause => self.pause().await.map(|s| Done::Status(Box::new(s))),
            Job::Settle => self.settle().await.map(|s| Done::Status(Box::new(s))),
            Job::Reboot(req) => self.reboot(req).await.map(|r| Done::Reboot(Box::new(r))),
            Job::Memory(req) => self.memory(req).await.map(|r| Done::HostCache(Box::new(r))),
        }
    }

    pub(super) fn require_running(&self, why: &'static str) -> Result<(), OpError> {
        let st = self.vm.record().state;
        if st != VmState::Running {
            return Err(OpError::WrongState(self.vm.name.clone(), st, why));
        }
        Ok(())
    }

    async fn stop(&mut self) -> Result<VmStatus, OpError> {
        let rec = self.vm.record();
        let Some(pid) = rec.qemu_pid.filter(|_| rec.state.has_qemu()) else {
            return Ok(self.vm.status());
        };
        self.apply(Trigger::TearDown);
        let mut how = "guest poweroff";
        let mut gone = !process::is_alive(pid);
        if !gone && rec.state == VmState::Running {
            if let Some(q) = &self.qmp {
                let _ = q.execute("system_powerdown", None).await;
            }
            gone = self.poweroff_by_agent(pid).await;
        }
        if !gone {
            how = "quit";
            if let Some(q) = &self.qmp {
                let _ = q.execute("quit", None).await;
            }
            gone = process::wait_gone(pid, Duration::from_secs(5)).await;
        }
        if !gone {
            how = "sigkill";
            process::sigkill(pid);
        }
        self.reap(pid).await;
        self.metrics.stops.inc();
        self.finish(EventData::Stopped {
            how: Some(how.into()),
            reason: None,
        });
        Ok(self.vm.status())
    }

    /// Asks the agent to power the guest off until QEMU is gone or [`GRACE`] runs out.
    /// The request is repeated every second: a just re-attached agent link may not be
    /// up yet, and a link that drops loses what it was sending.
    async fn poweroff_by_agent(&self, pid: u32) -> bool {
        let deadline = tokio::time::Instant::now() + GRACE;
        loop {
            if let Some(a) = &self.agent {
                let _ = a.poweroff();
            }
            let next = (tokio::time::Instant::now() + Duration::from_secs(1)).min(deadline);
            let left = next.saturating_duration_since(tokio::time::Instant::now());
            if process::wait_gone(pid, left).await {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
        }
    }

    async fn kill(&mut self) -> Result<VmStatus, OpError> {
        let rec = self.vm.record();
        if let Some(pid) = rec.qemu_pid.filter(|_| rec.state.has_qemu()) {
            self.apply(Trigger::TearDown);
            process::sigkill(pid);
            self.reap(pid).await;
            self.metrics.kills.inc();
            self.finish(EventData::Killed { pid });
        }
        Ok(self.vm.status())
    }

    /// Panics the guest kernel: through the agent when it is up, else with an NMI.
    /// With `hang`, the agent stops feeding the watchdog instead.
    async fn crash(&mut self, hang: bool) -> Result<VmStatus, OpError> {
        self.require_running("only a running guest can be crashed")?;
        if hang {
            let agent = self
                .agent
                .as_ref()
                .ok_or(rebound_vmm::agent::AgentError::NotConnected)?;
            agent.watchdog_stop()?;
            self.event(EventData::CrashRequested {
                via: "watchdog".into(),
            });
            return Ok(self.vm.status());
        }
        let via_agent = match (&self.agent, self.vm.record().kernel_release.is_some()) {
            (Some(a), true) => a.crash().is_ok(),
            _ => false,
        };
        if !via_agent {
            let q = self.qmp.as_ref().ok_or(OpError::NoQmp)?;
            q.execute("inject-nmi", None).await?;
        }
        self.event(EventData::CrashRequested {
            via: if via_agent { "agent" } else { "nmi" }.into(),
        });
        Ok(self.vm.status())
    }

    async fn marker(&mut self, hex: &str) -> Result<MarkerReply, OpError> {
        self.require_running("the agent runs only in a running guest")?;
        let agent = self
            .agent
            .clone()
            .ok_or(rebound_vmm::agent::AgentError::NotConnected)?;
        let (paddr, len) = agent.marker(hex).await?;
        self.event(EventData::Marker { paddr, len });
        Ok(MarkerReply { paddr, len })
    }

    // ---- the end of a QEMU ----

    /// Waits for `pid` to be gone and reaps it if it is our child (no zombie stays);
    /// returns its exit code when known.
    pub(super) async fn reap(&mut self, pid: u32) -> Option<i32> {
        match self.child.take() {
            Some(mut c) => match tokio::time::timeout(Duration::from_secs(10), c.wait()).await {
                Ok(Ok(st)) => st.code(),
                _ => None,
            },
            None => {
                process::wait_gone(pid, Duration::from_secs(10)).await;
                None
            }
        }
    }

    /// The QEMU child this owner waits for (a settle replaces it).
    pub(super) fn set_child(&mut self, child: tokio::process::Child) {
        self.child = Some(child);
    }

    /// Stops listening to QEMU and the agent (the QMP client stays for a last command).
    pub(super) fn disconnect(&mut self) {
        self.qmp_events = None;
        self.agent = None;
        self.agent_msgs = None;
        self.console = None;
    }

    /// Removes the run dir (RAM, sockets); the logs stay with the record.
    pub(super) fn cleanup_run_dir(&self) {
        let _ = std::fs::remove_dir_all(self.vm.run.path());
    }

    /// Drops the connections, removes the run dir (RAM,
    /// sockets), marks the VM stopped and logs why.
    fn finish(&mut self, data: EventData) {
        if let Some(r) = self.restore.take() {
            r.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        self.stop_backends();
        self.disconnect();
        self.qmp = None;
        self.cleanup_run_dir();
        // QEMU is gone, so its taps are free; any still held belong to another QEMU.
        let nics = self.vm.record().spec.nics.len();
        rebound_vmm::net::unplug_all(&self.vm.name, nics);
        self.vm.update(|r| {
            if let Some(to) = next(r.state, Trigger::Gone) {
                r.state = to;
            }
            r.ready = false;
            r.qemu_pid = None;
        });
        self.event(data);
    }
}
