//! Settling a restored guest onto shared RAM: until then its memory is a private
//! mapping of the snapshot image (pages it wrote live only inside QEMU), so it can
//! be neither dumped from a file, snapshotted, nor reclaimed by the crash pipeline.
//!
//! A second QEMU with the same devices and a fresh shared RAM file in the run dir
//! waits for a local live migration; the restored QEMU sends it every page over a
//! unix socket while the guest keeps running, stops it for the last dirty pages and
//! quits. The new QEMU's control sockets are then moved to the run dir's usual
//! names, so everything else goes on talking to "the VM" as before.
//!
//! The host ports move before the migration starts, while the old guest still runs:
//! each forward is removed from the old QEMU and at once added to the new one (a
//! connection attempt in the gap of one monitor command is refused). Connections made
//! after that are accepted by the new QEMU's user network and wait there, queued for
//! the guest, until it runs; none is accepted by a QEMU whose guest will never answer
//! it. Connections the old QEMU accepted before the move are served by the old guest
//! until the migration stops it; one still open then is closed, since user-mode
//! networking keeps its TCP state inside the QEMU process (a tap NIC would keep it,
//! but a VM with one cannot settle).

use std::time::{Duration, Instant};

use rebound_api::{EventData, VmState, VmStatus};
use rebound_vmm::qemu::{Control, Incoming, MemoryBackend, NetBackend, QemuCommand, Serial};

use rebound_vmm::migration::wait_migration;
use rebound_vmm::port::Runtime;
use rebound_vmm::usernet;

use super::owner::Owner;
use crate::daemon::error::OpError;

impl Owner {
    pub(super) async fn settle(&mut self) -> Result<VmStatus, OpError> {
        let rec = self.vm.record();
        if !rec.ram_private {
            return Ok(self.vm.status());
        }
        let was_running = match rec.state {
            VmState::Running => true,
            VmState::Paused => false,
            st => {
                return Err(OpError::WrongState(
                    self.vm.name.clone(),
                    st,
                    "only a running or paused restored VM can settle",
                ))
            }
        };
        let (Some(src), Some(old_pid)) = (self.qmp.clone(), rec.qemu_pid) else {
            return Err(OpError::NoQmp);
        };
        let Some((qemu, command)) = self
            .restore
            .as_ref()
            .map(|r| (r.qemu.clone(), r.command.clone()))
        else {
            return Err(OpError::BadRequest(
                "this VM's restore is not known to this daemon (restarted since): stop and restore it again to settle".into(),
            ));
        };
        // A tap device has one owner: the second QEMU could not open it while the
        // first holds it (EBUSY), so do not start one to find out.
        if let Some(tap) = command.nics.iter().find_map(|n| match &n.backend {
            NetBackend::Tap { ifname } => Some(ifname.clone()),
            _ => None,
        }) {
            return Err(OpError::BadRequest(format!(
                "a VM with a tap NIC ({tap}) cannot settle: a second QEMU cannot open the tap while this one holds it; the guest stays on the snapshot image"
            )));
        }
        let t0 = Instant::now();
        let run = self.vm.run.clone();
        let side = run.path().join("settle");
        rebound_vmm::private::create_dir_all(&side)
            .map_err(|e| OpError::Io(format!("cannot create {}", side.display()), e))?;
        let mut dest: QemuCommand = command;
        dest.memory.backend = MemoryBackend::SharedFile(run.ram());
        dest.incoming = Some(Incoming::Defer);
        dest.paused = true;
        dest.control = Control {
            qmp: Some(side.join("qmp.sock")),
            hmp: None,
            agent: dest.control.agent.as_ref().map(|_| side.join("agent.sock")),
            serial: match &dest.control.serial {
                // Both QEMUs append to the one serial log.
                Serial::Socket { log, .. } => Serial::Socket {
                    socket: side.join("serial.sock"),
                    log: log.clone(),
                },
                other => other.clone(),
            },
            pidfile: Some(side.join("qemu.pid")),
        };
        // The old QEMU holds the host ports until they are handed over (a second
        // listener on one port would not bind): the new QEMU starts without them.
        let forwards: Vec<_> = dest
            .nics
            .iter()
            .flat_map(|n| match &n.backend {
                NetBackend::User { forwards } => forwards.clone(),
                _ => Vec::new(),
            })
            .collect();
        for n in &mut dest.nics {
            if let NetBackend::User { forwards } = &mut n.backend {
                forwards.clear();
            }
        }
        let args = dest.args()?;
        let group = self.qemu_group(false);
        // Both QEMUs append to the VM's one capped QEMU log, off the RAM tmpfs.
        let qemu_log = self.vm.dir.qemu_log();
        let child = rebound_vmm::process::spawn_qemu(&qemu, &args, &qemu_log, group.as_ref())
            .map_err(|e| OpError::QemuFailed(e.into()))?;
        let new_pid = child.id().unwrap_or(0);
        crate::daemon::fault::point("settle:spawned");
        let connected = Self::connect_qmp(&side.join("qmp.sock"), &qemu_log, new_pid).await;
        let (dq, devents) = match connected {
            Ok(q) => q,
            Err(why) => {
                rebound_vmm::process::sigkill(new_pid);
                return Err(OpError::QemuFailed(
                    crate::daemon::vm::qemu_error::QemuError::SettleTarget(Box::new(why)),
                ));
            }
        };
        if let Err(e) = usernet::hand_over(&*src, Some(old_pid), &*dq, &forwards).await {
            // The hand-over put back what it had moved.
            self.abandon(new_pid, None, &src, &forwards).await;
            let _ = std::fs::remove_dir_all(&side);
            return Err(e.into());
        }
        crate::daemon::fault::point("settle:ports");
        let sock = side.join("migrate.sock");
        let uri = format!("unix:{}", sock.display());
        let caps = serde_json::json!({"capabilities": [
            {"capability": "x-ignore-shared", "state": false}]});
        let r = async {
            dq.execute("migrate-set-capabilities", Some(caps.clone()))
                .await?;
            dq.execute("migrate-incoming", Some(serde_json::json!({ "uri": uri })))
                .await?;
            self.command("migrate-set-capabilities", Some(caps)).await?;
            self.command(
                "migrate-set-parameters",
                Some(serde_json::json!({"max-bandwidth": i64::MAX / 2})),
            )
            .await?;
            self.command("migrate", Some(serde_json::json!({ "uri": uri })))
                .await?;
            wait_migration(&*src, "the move onto shared RAM").await?;
            let info = self.command("query-migrate", None).await?;
            wait_migration(&*dq, "the move onto shared RAM (receiving side)").await?;
            Ok::<_, OpError>(info)
        }
        .await;
        let info = match r {
            Ok(i) => i,
            Err(e) => {
                self.abandon(new_pid, Some(&*dq), &src, &forwards).await;
                let _ = self.command("cont", None).await;
                let _ = std::fs::remove_dir_all(&side);
                return Err(e);
            }
        };
        // The old QEMU is done: stop listening to it before it quits.
        self.disconnect();
        let _ = src.execute("quit", None).await;
        let _ = rebound_vmm::process::wait_gone(old_pid, Duration::from_secs(10)).await;
        self.reap(old_pid).await;
        crate::daemon::fault::point("settle:migrated");
        for (from, to) in [
            ("qmp.sock", run.qmp()),
            ("agent.sock", run.agent()),
            ("serial.sock", run.serial_sock()),
            ("qemu.pid", run.pidfile()),
        ] {
            let from = side.join(from);
            if from.exists() {
                let _ = std::fs::rename(&from, &to);
            }
        }
        let _ = std::fs::remove_dir_all(&side);
        self.set_child(child);
        self.vm.update(|r| {
            r.qemu_pid = Some(new_pid);
            r.ram_file = run.ram();
            r.ram_private = false;
        });
        // Every page is now in the shared RAM file (a lazy restore's memory is
        // complete only from here on): the plan's `Event::Settled`, then the restore's
        // loader, if still reading, stops.
        if let Some(r) = self.restore.take() {
            let at = Instant::now();
            self.vm.update_restore_report(|rep| {
                r.machine
                    .on(rep, rebound_snapshot::restore_plan::Event::Settled { at });
            });
            r.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let ready = self.ready.clone();
        self.attach(dq, devents, ready);
        if was_running {
            self.command("cont", None).await?;
        }
        self.event(EventData::Settled {
            pid: new_pid,
            seconds: t0.elapsed().as_secs_f64(),
            downtime_ms: info["downtime"].as_u64(),
            ram_bytes: info["ram"]["transferred"].as_u64(),
        });
        Ok(self.vm.status())
    }

    /// The settle is given up: the QEMU to settle onto is killed, and the restored
    /// QEMU, which keeps the guest, gets back the host ports it handed over. While the
    /// new QEMU (`to`) still answers, they are handed back before it is killed, so a
    /// port is closed for one monitor command rather than for the kill.
    async fn abandon(
        &self,
        new_pid: u32,
        to: Option<&rebound_vmm::qmp::Qmp>,
        src: &rebound_vmm::qmp::Qmp,
        forwards: &[rebound_vmm::qemu::HostForward],
    ) {
        if let Some(to) = to {
            // What this misses, the restore below puts back.
            let _ = usernet::hand_over(to, Some(new_pid), src, forwards).await;
        }
        rebound_vmm::process::sigkill(new_pid);
        rebound_vmm::process::wait_gone(new_pid, Duration::from_secs(10)).await;
        if let Err(e) = usernet::restore(src, forwards).await {
            tracing::warn!(
                "VM {:?} keeps running without its host ports: {}",
                self.vm.name,
                rebound_errors::chain(&e)
            );
        }
    }
}
