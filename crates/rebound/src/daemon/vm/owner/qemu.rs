//! A QEMU's life under its owner: resolved and spawned (or re-attached after a
//! daemon restart), its QMP session and agent link taken over, reaped, and the VM
//! marked stopped when it is gone.

use std::sync::Arc;
use std::time::Duration;

use rebound_api::spec::BootSource;
use rebound_api::{EventData, ReadySpec, VmSpec, VmStatus};
use rebound_vmm::agent::AgentLink;
use rebound_vmm::console::{ConsoleLink, ConsolePaths};
use rebound_vmm::events::{mono_ns, wall_now};
use rebound_vmm::process;
use rebound_vmm::qmp::{Qmp, QmpEvent};
use rebound_vmm::record::VmRecord;
use rebound_vmm::resolve::{self, Resolved};
use tokio::sync::mpsc::UnboundedReceiver;

use super::Owner;
use crate::daemon::error::OpError;
use crate::daemon::fault;
use crate::daemon::vm::machine::{next, Trigger};
use crate::daemon::vm::qemu_error::QemuError;

/// How long QEMU gets to create its QMP socket.
const QMP_WAIT: Duration = Duration::from_secs(15);

impl Owner {
    // ---- start and re-attach ----

    /// Resolves and spawns QEMU for `spec` (a recovery VM with `recovery`), and takes
    /// over its QMP session and agent link.
    pub(in crate::daemon::vm) async fn start(
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
        .map_err(|e| OpError::Broken(Box::new(e)))??;
        self.prepare_run_dir()?;
        self.spawn_resolved(&spec, res, recovering, true).await
    }

    /// Resolves `spec` as a fresh start (or, with `recovery`, a recovery VM) would.
    pub(in crate::daemon::vm) async fn resolve_spec(
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
        .map_err(|e| OpError::Broken(Box::new(e)))??)
    }

    /// An empty run dir (RAM file, sockets) for a new QEMU, whose boot starts a new
    /// serial log (the last one, a crash's trace say, becomes `serial.log.1`).
    pub(in crate::daemon::vm) fn prepare_run_dir(&self) -> Result<(), OpError> {
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
    pub(in crate::daemon::vm) async fn spawn_resolved(
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
                return Err(OpError::QemuFailed(e.into()));
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
            Err(e) => {
                process::sigkill(pid);
                self.reap(pid).await;
                self.finish(EventData::Exited {
                    exit_code: None,
                    error: Some(rebound_errors::chain(&e)),
                });
                return Err(OpError::QemuFailed(e));
            }
        };
        if run_after {
            if let Err(e) = qmp.execute("cont", None).await {
                process::sigkill(pid);
                self.reap(pid).await;
                let e = QemuError::Cont(e);
                self.finish(EventData::Exited {
                    exit_code: None,
                    error: Some(rebound_errors::chain(&e)),
                });
                return Err(OpError::QemuFailed(e));
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
    pub(in crate::daemon::vm) fn qemu_group(
        &self,
        recovering: bool,
    ) -> Option<rebound_vmm::cgroup::Group> {
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
            tracing::warn!(vm = %name, "QEMU runs outside a memory group: {}", rebound_errors::chain(&e));
        })
        .ok()
    }

    /// Waits for QEMU `pid`'s QMP socket `sock` and connects; on failure explains why
    /// (QEMU's last line in `log`).
    pub(in crate::daemon::vm) async fn connect_qmp(
        sock: &std::path::Path,
        log: &std::path::Path,
        pid: u32,
    ) -> Result<rebound_vmm::qmp::QmpSession, QemuError> {
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
                    QemuError::NoQmp(why)
                } else {
                    QemuError::Exited(why)
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Takes the connections over; the agent link starts for guests that have one.
    pub(in crate::daemon::vm) fn attach(
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

    pub(super) async fn reattach(&mut self) -> Result<(), QemuError> {
        let rec = self.vm.record();
        let pid = rec.qemu_pid.ok_or(QemuError::NoPid)?;
        if !process::is_ours(pid, &rec.run_dir) {
            return Err(QemuError::Gone(pid));
        }
        let (qmp, events) =
            tokio::time::timeout(Duration::from_secs(5), Qmp::connect(&self.vm.run.qmp()))
                .await
                .map_err(|_| QemuError::Silent)??;
        let st = qmp.run_state().await?;
        // A settle cut short by the daemon's death may have handed this QEMU's host
        // ports to a QEMU since killed: it gets back the ones it lost.
        let forwards = rebound_vmm::resolve::host_forwards(&rec.forwards);
        match rebound_vmm::usernet::restore(&*qmp, &forwards).await {
            Ok(back) if !back.is_empty() => tracing::warn!(
                "VM {:?}: host ports {:?} put back on its QEMU (a settle was cut short)",
                self.vm.name,
                back.iter().map(|f| f.host).collect::<Vec<_>>()
            ),
            Ok(_) => {}
            Err(e) => tracing::warn!(
                "VM {:?}: its host ports could not be put back: {}",
                self.vm.name,
                rebound_errors::chain(&e)
            ),
        }
        self.apply(Trigger::QemuStatus(&st));
        self.event(EventData::Reattached {
            pid,
            qemu_status: st,
        });
        let ready: ReadySpec = match &rec.spec.ready {
            Some(r) => r.parse()?,
            None => ReadySpec::Agent,
        };
        self.metrics.reattaches.inc();
        self.attach(qmp, events, ready);
        Ok(())
    }

    // ---- the end of a QEMU ----

    /// Waits for `pid` to be gone and reaps it if it is our child (no zombie stays);
    /// returns its exit code when known.
    pub(in crate::daemon::vm) async fn reap(&mut self, pid: u32) -> Option<i32> {
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
    pub(in crate::daemon::vm) fn set_child(&mut self, child: tokio::process::Child) {
        self.child = Some(child);
    }

    /// Stops listening to QEMU and the agent (the QMP client stays for a last command).
    pub(in crate::daemon::vm) fn disconnect(&mut self) {
        self.qmp_events = None;
        self.agent = None;
        self.agent_msgs = None;
        self.console = None;
    }

    /// Removes the run dir (RAM, sockets); the logs stay with the record.
    pub(in crate::daemon::vm) fn cleanup_run_dir(&self) {
        let _ = std::fs::remove_dir_all(self.vm.run.path());
    }

    /// Drops the connections, removes the run dir (RAM,
    /// sockets), marks the VM stopped and logs why.
    pub(super) fn finish(&mut self, data: EventData) {
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
