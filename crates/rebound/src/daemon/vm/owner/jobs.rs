//! The owner's lifecycle jobs: stop, kill, crash, marker, pause, resume; and the
//! dispatch of every queued job to the capability that runs it.

use std::time::Duration;

use rebound_api::{EventData, MarkerReply, VmState, VmStatus};
use rebound_vmm::process;

use super::Owner;
use crate::daemon::error::OpError;
use crate::daemon::vm::machine::Trigger;
use crate::daemon::vm::{Done, Job};

/// How long a guest gets to power off before QEMU is told to quit.
const GRACE: Duration = Duration::from_secs(10);

impl Owner {
    // ---- jobs ----

    pub(super) async fn job(&mut self, job: Job) -> Result<Done, OpError> {
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

    pub(in crate::daemon::vm) fn require_running(&self, why: &'static str) -> Result<(), OpError> {
        let st = self.vm.record().state;
        if st != VmState::Running {
            return Err(OpError::WrongState(self.vm.name.clone(), st, why));
        }
        Ok(())
    }

    pub(super) async fn stop(&mut self) -> Result<VmStatus, OpError> {
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
    pub(super) async fn poweroff_by_agent(&self, pid: u32) -> bool {
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

    pub(super) async fn kill(&mut self) -> Result<VmStatus, OpError> {
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
    pub(super) async fn crash(&mut self, hang: bool) -> Result<VmStatus, OpError> {
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

    pub(super) async fn marker(&mut self, hex: &str) -> Result<MarkerReply, OpError> {
        self.require_running("the agent runs only in a running guest")?;
        let agent = self
            .agent
            .clone()
            .ok_or(rebound_vmm::agent::AgentError::NotConnected)?;
        let (paddr, len) = agent.marker(hex).await?;
        self.event(EventData::Marker { paddr, len });
        Ok(MarkerReply { paddr, len })
    }

    /// Resumes a paused VM (`vm resume`); for a restore held ready, this is its start.
    pub(in crate::daemon::vm) async fn resume(&mut self) -> Result<VmStatus, OpError> {
        let st = self.vm.record().state;
        if st != VmState::Paused {
            return Err(OpError::WrongState(
                self.vm.name.clone(),
                st,
                "only a paused VM can be resumed",
            ));
        }
        let held = self.vm.restore_report().is_some_and(|r| r.phase == "held");
        if held && self.restore.is_some() {
            self.begin_restored_run().await?;
        } else {
            let q = self.qmp.clone().ok_or(OpError::NoQmp)?;
            let before = q.last_event_unix_ns("RESUME");
            q.execute("cont", None).await?;
            if self.apply(Trigger::Resumed) {
                self.event(rebound_api::EventData::Resumed);
            }
            if held {
                // Held by a daemon that restarted since: the start is a plain `cont`
                // (the watch did not carry on), stamped by QEMU as any start is.
                let after = q
                    .last_event_unix_ns("RESUME")
                    .filter(|a| Some(*a) != before);
                self.vm.update_restore_report(|r| {
                    r.phase = "done".into();
                    r.started_unix_ns = after;
                });
            }
        }
        Ok(self.vm.status())
    }

    /// Stops a running VM's vCPUs (`vm pause`); its QEMU, RAM and devices stay.
    pub(in crate::daemon::vm) async fn pause(&mut self) -> Result<VmStatus, OpError> {
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
}
