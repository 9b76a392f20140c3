//! Carrying out what a crash's state machine (`rebound_crash::Crash`) decides, with the
//! owner's QMP session, the VM's memory group, the dump task and the files.

use rebound_vmm::port::Runtime;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use rebound_crash::{Action, Event, Step};
use rebound_vmm::resolve::Recovery;

use super::machine::Trigger;
use super::owner::Owner;

/// An action carried out at once, with its answer, or one that must be awaited.
pub(super) enum Now {
    Done(Option<Event>),
    Later(Action),
}

impl Owner {
    /// Carries out an action that needs no waiting, and gives its answer.
    pub(super) fn act_now(&mut self, a: Action) -> Now {
        match a {
            Action::Emit(e) => self.event(e),
            Action::Transition(s) => {
                self.apply(match s {
                    Step::DumpBegins => Trigger::DumpBegins,
                    Step::Ready => Trigger::Ready,
                    Step::Gone => Trigger::Gone,
                });
            }
            Action::HoldBudget { limit_bytes, .. } => {
                return Now::Done(Some(self.hold_budget(limit_bytes)))
            }
            Action::ReleaseBudget => return Now::Done(self.release_budget()),
            Action::StartDump { out, rate } => self.start_dump(out, rate),
            Action::SetDumpRate(r) => {
                if let Some(h) = &self.crash {
                    h.rate.store(r, Relaxed);
                }
            }
            Action::DiscardCrashedRam => {
                if let Some(h) = &self.crash {
                    let _ = std::fs::remove_file(&h.crashed_ram);
                }
            }
            Action::DiscardDumped => {
                crate::daemon::fault::point("crash:after-report");
                if let Some(h) = self.crash.as_mut() {
                    let _ = std::fs::remove_file(&h.crashed_ram);
                    for p in h.earlier.drain(..) {
                        let _ = std::fs::remove_file(p);
                    }
                }
            }
            Action::ReleaseHeldLoader => {
                // The dump ended (or never ran): a restored recovery VM's background
                // loader may now read the rest of its image.
                if let Some(r) = &self.restore {
                    r.hold_rest.store(false, Relaxed);
                }
            }
            Action::StopBackends => self.stop_backends(),
            Action::WarmRecovery => self.warm_recovery(),
            Action::SaveReport => self.save_report(),
            Action::SetJob(j) => self.vm.set_job(j),
            Action::Finish => self.crash = None,
            Action::Then(n) => return Now::Done(Some(Event::Then(n))),
            a @ (Action::StartRecovery { .. }
            | Action::Plug { .. }
            | Action::ThrottleRecoveryDisks(_)) => return Now::Later(a),
        }
        Now::Done(None)
    }

    /// Carries out an action that waits (on QMP, or a QEMU's start), and gives its
    /// answer.
    pub(super) async fn act_later(&mut self, a: Action) -> Option<Event> {
        match a {
            Action::StartRecovery {
                boot_mib,
                free_mib,
                restore_from,
                dumping,
            } => Some(
                self.start_recovery(boot_mib, free_mib, restore_from, dumping)
                    .await,
            ),
            Action::Plug { plugged_bytes, mib } => {
                self.qmp.as_ref()?;
                match self.plug_memory(plugged_bytes).await {
                    Ok(()) => Some(Event::Plugged { mib }),
                    Err(e) => {
                        let e = rebound_errors::chain(&e);
                        tracing::warn!(vm = %self.vm.name, "cannot grow the recovery VM: {e}");
                        None
                    }
                }
            }
            Action::ThrottleRecoveryDisks(bps) => {
                self.throttle_disks(bps).await;
                None
            }
            a => match self.act_now(a) {
                Now::Done(answer) => answer,
                Now::Later(a) => unreachable!("{a:?} is carried out at once"),
            },
        }
    }

    /// Limits the VM's memory group (the crashed RAM and the recovery QEMU, once it
    /// runs) to the budget plus the recovery QEMU's own footprint; where no group can
    /// be had, the budget is only accounted (the recovery VM is still sized and grown
    /// by it) and the report says why.
    fn hold_budget(&mut self, limit: u64) -> Event {
        let held = self
            .cgroups
            .as_ref()
            .map_err(|e| rebound_errors::chain(&**e))
            .and_then(|cg| {
                let g = cg
                    .vm(&self.vm.name)
                    .map_err(|e| rebound_errors::chain(&e))?;
                let _ = g.reset_peak();
                g.set_limit(Some(limit))
                    .map_err(|e| rebound_errors::chain(&e))?;
                Ok((cg.version(), g))
            });
        match held {
            Ok((v, g)) => {
                let group = g.path().display().to_string();
                if let Some(h) = self.crash.as_mut() {
                    h.group = Some(g);
                }
                Event::BudgetHeld {
                    enforced_by: v.to_string(),
                    group,
                }
            }
            Err(why) => Event::BudgetAccounted { why },
        }
    }

    /// Lifts the crash's memory limit and tells the group's peak.
    fn release_budget(&mut self) -> Option<Event> {
        let g = self.crash.as_mut()?.group.take()?;
        let peak_bytes = g.peak().ok();
        if let Err(e) = g.set_limit(None) {
            tracing::warn!(
                "cannot lift the memory limit of {}: {e}",
                g.path().display()
            );
        }
        Some(Event::BudgetReleased { peak_bytes })
    }

    fn start_dump(&mut self, out: PathBuf, rate: u64) {
        let rec = self.vm.record();
        let Some(h) = self.crash.as_mut() else { return };
        let policy = &h.m.report().policy;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        h.progress = Some(rx);
        h.rate.store(rate, Relaxed);
        let job = super::dump::DumpJob {
            earlier: h.earlier.clone(),
            rate: h.rate.clone(),
            ram: h.crashed_ram.clone(),
            memory_mib: rec.spec.memory_mib,
            out,
            cpu_notes: h.cpu_notes.clone(),
            format: policy.dump_format,
            compress: policy.compress,
            filter: policy.filter.clone(),
            chunk_mib: policy.chunk_mib,
            vmcoreinfo: rec.vmcoreinfo,
            release: true,
        };
        tokio::task::spawn_blocking(move || super::dump::run(job, tx));
    }

    /// Starts the recovery VM: booted with `boot_mib` (all its memory if `None`), or
    /// restored from a snapshot (`recover_restore.rs`).
    async fn start_recovery(
        &mut self,
        boot_mib: Option<u64>,
        free_mib: u64,
        restore_from: Option<String>,
        dumping: bool,
    ) -> Event {
        let rec = self.vm.record();
        let spec = rec.spec.clone();
        let r = match &restore_from {
            Some(dir) => {
                let kept = match &self.crash {
                    Some(h) => h.dir.join("disk0.qcow2"),
                    None => PathBuf::new(),
                };
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
                            forwards: rec.forwards.clone(),
                            boot_memory_mib: boot_mib,
                        }),
                    )
                    .await
                    .map(|_| None),
                Err(e) => Err(e.into()),
            },
        };
        match r {
            Ok(note) => Event::RecoveryStarted {
                pid: self.vm.record().qemu_pid.unwrap_or(0),
                note,
            },
            Err(e) => {
                self.metrics.start_failures.inc();
                if restore_from.is_some() && self.vm.record().qemu_pid.is_some() {
                    // A restore that failed after its QEMU came up.
                    self.release_crashed_qemu().await;
                    self.apply(Trigger::Gone);
                }
                Event::RecoveryFailed {
                    why: rebound_errors::chain(&e),
                }
            }
        }
    }

    /// Limits each of the recovery VM's disks to `bps` (0: no limit).
    async fn throttle_disks(&self, bps: u64) {
        if self.qmp.is_none() {
            return;
        }
        let spec = self.vm.record().spec;
        let disks = spec.disks.len() + usize::from(spec.kernel.is_none());
        for i in 0..disks {
            if let Err(e) = self.throttle_disk(&format!("disk{i}"), bps).await {
                let e = rebound_errors::chain(&e);
                tracing::warn!(vm = %self.vm.name, "cannot set disk{i}'s I/O limit: {e}");
            }
        }
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
            r.stop.store(true, Relaxed);
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
}

/// Bytes read and written by all of a QEMU's block devices since it started.
pub(super) async fn disk_bytes(q: &rebound_vmm::qmp::Qmp) -> Option<u64> {
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
