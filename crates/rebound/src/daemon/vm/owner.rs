//! The owner of one VM: a task that holds its QEMU child, QMP session and agent link,
//! turns what they report into state changes and event-log lines, and runs the jobs
//! others queue, one at a time. It is the only writer of the VM's record.
//!
//! Where `Owner`'s methods live:
//! - here: its fields, its start ([`start_owner`]), its loop (`run`), `apply`, `event`;
//! - [`qemu`]: a QEMU's life (start, resolve, spawn, attach, re-attach, reap, finish);
//! - [`events`]: QMP events, QEMU's end, agent messages, readiness probes;
//! - [`jobs`]: job dispatch and the lifecycle jobs (stop, kill, crash, marker,
//!   pause, resume);
//! - [`port`]: the runtime port ([`rebound_vmm::port::Runtime`]) over all this;
//! - capabilities, each in its file of `vm`: `restore` (and `restore/`),
//!   `snapshot`, `settle`, `ram_check`, `crash`, `dump`, `dump_now`,
//!   `recover_restore`, `reboot`, `memory`, `blk`, `evict`, `replay`.

mod events;
mod jobs;
mod port;
mod qemu;

use std::sync::Arc;
use std::time::Duration;

use rebound_api::spec::BootSource;
use rebound_api::{EventData, ReadySpec, VmSpec, VmState, VmStatus};
use rebound_vmm::agent::{AgentLink, AgentMsg};
use rebound_vmm::console::ConsoleLink;
use rebound_vmm::paths::Paths;
use rebound_vmm::process;
use rebound_vmm::qmp::{Qmp, QmpEvent};
use tokio::sync::mpsc::{Receiver, UnboundedReceiver};
use tokio::sync::oneshot;

use super::context::OwnerContext;
use super::machine::{next, Trigger};
use super::{Request, VmHandle};
use crate::daemon::error::OpError;
use crate::daemon::metrics::Metrics;

/// How often a VM started with `--on-crash ... --warm` has its cache listed.
pub(super) const WARM_LIST_EVERY: Duration = Duration::from_secs(10);

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
        Box<super::restore::state::RestoreJob>,
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
    pub(super) cgroups: Result<
        rebound_vmm::cgroup::MemoryCgroups,
        std::sync::Arc<rebound_vmm::cgroup::CgroupError>,
    >,
    pub(super) qmp: Option<Arc<Qmp>>,
    pub(super) qmp_events: Option<UnboundedReceiver<QmpEvent>>,
    pub(super) agent: Option<Arc<AgentLink>>,
    pub(super) agent_msgs: Option<Receiver<AgentMsg>>,
    /// The serial console's reader, which keeps the serial and QEMU logs.
    console: Option<ConsoleLink>,
    logs: super::context::LogCaps,
    child: Option<tokio::process::Child>,
    pub(super) ready: ReadySpec,
    probe_port: Option<u16>,
    last_memfill: Option<(tokio::time::Instant, u64)>,
    /// A restore's wait for the agent's first sign of work after the start.
    pub(super) agent_wait: Option<super::restore::agent_wait::AgentWait>,
    /// A readiness probe in flight: it runs in its own task (an HTTP probe may wait
    /// seconds for a booting guest), so the owner keeps serving jobs, QMP events and
    /// the dump's progress meanwhile.
    /// The result comes with the pid of the QEMU it probed: a probe of a QEMU that
    /// has since crashed says nothing about its recovery VM.
    probe_rx: Option<oneshot::Receiver<(Option<u32>, bool)>>,
    /// The crash being handled, if any (its dump may outlive the recovery).
    pub(super) crash: Option<super::crash_state::Handling>,
    /// The restore this VM came from, until its background loading ends.
    pub(super) restore: Option<super::restore::state::Restoring>,
    /// A background listing of the guest's cache (`--on-crash ... --warm`).
    pub(super) warm_listing: Option<tokio::task::JoinHandle<()>>,
}

/// Spawns the owner task of `vm`.
pub fn start_owner(
    d: OwnerContext,
    vm: Arc<VmHandle>,
    jobs: UnboundedReceiver<Request>,
    init: Init,
) {
    let owner = Owner {
        vm,
        paths: d.paths,
        host: d.host,
        metrics: d.metrics,
        cgroups: d.cgroups,
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
    Dump(Option<super::dump::DumpProgress>),
    WarmList,
    CrashTick,
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
                        rep.error = Some(rebound_errors::chain(e));
                    });
                    if let Some(pid) = self.vm.record().qemu_pid {
                        process::sigkill(pid);
                        self.reap(pid).await;
                    }
                    self.finish(EventData::Exited {
                        exit_code: None,
                        error: Some(rebound_errors::chain(e)),
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
                        if process::is_ours(pid, &rec.run_dir) {
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
                    match self.reattach().await {
                        Ok(()) => super::restore::resume::resume(&self.vm),
                        Err(why) => self.finish(EventData::Stopped {
                            how: None,
                            reason: Some(rebound_errors::chain(&why)),
                        }),
                    }
                }
                self.adopt_backends();
                self.take_over_crash().await;
                let _ = done.send(());
            }
        }
        let mut probe = tokio::time::interval(Duration::from_millis(250));
        probe.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut warm_list = tokio::time::interval(WARM_LIST_EVERY);
        warm_list.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut crash_tick = tokio::time::interval(Duration::from_secs(1));
        crash_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let ticking = self.crash.as_ref().is_some_and(|h| h.m.wants_ticks());
            let probing = !matches!(self.ready, ReadySpec::Agent)
                && self.qmp.is_some()
                && !self.vm.record().ready;
            let input = tokio::select! {
                j = jobs.recv() => Input::Job(j),
                e = recv_opt(&mut self.qmp_events) => Input::Qmp(e),
                m = recv_opt(&mut self.agent_msgs) => Input::Agent(m),
                _ = probe.tick(), if probing && self.probe_rx.is_none() => Input::Probe,
                (pid, ok) = probe_result(&mut self.probe_rx) => Input::Probed(pid, ok),
                p = super::crash_state::next_progress(&mut self.crash) => Input::Dump(p),
                _ = warm_list.tick() => Input::WarmList,
                _ = crash_tick.tick(), if ticking => Input::CrashTick,
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
                Input::CrashTick => self.on_crash_tick().await,
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
            tracing::error!(vm = %self.vm.name, "{}", rebound_errors::chain(&e));
        }
    }
}
